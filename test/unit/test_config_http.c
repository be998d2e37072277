/*-------------------------------------------------------------------------
 * test_config_http.c
 *	  Unit tests of qb_config_http.c: http sources (a webhook's path, its
 *	  idempotency key and event type, auth: of each scheme, with the
 *	  inbox, http and admin sections they are read with) and an http
 *	  destination's signing: (both schemes, secrets never echoed).
 *-------------------------------------------------------------------------
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "qb_config.h"
#include "test_config.h"

/* ---- sources, inbox, http, admin ---------------------------------- */

static void
test_sources_valid(void **state)
{
	QbConfig   *cfg;
	const QbSource *s;

	setenv("QBT_STRIPE_SECRET", "whsec_stripe_one", 1);
	cfg = accept("sources:\n"
				 "  stripe:\n"
				 "    type: http\n"
				 "    path: /stripe\n"
				 "    idempotencyKeyPath: $.id\n"
				 "    eventTypePath: $.type\n"
				 "    aggregateIdPath: $.data.object.customer\n"
				 "    topic: \"stripe.{{ eventType }}\"\n"
				 "    auth: {type: stripe, secret: \"${QBT_STRIPE_SECRET}\", toleranceSec: 60}\n"
				 "  orders:\n"
				 "    type: http\n"
				 "    path: /orders\n"
				 "    idempotencyKeyHeader: Idempotency-Key\n"
				 "    consumption: pull\n"
				 "    maxBodyBytes: 4096\n"
				 "    auth: {type: bearer, token: orders-token}\n"
				 "  svix:\n"
				 "    type: http\n"
				 "    path: /svix\n"
				 "    eventTypeHeader: X-Event\n"
				 "    auth:\n"
				 "      type: standard-webhooks\n"
				 "      secrets: [\"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\", \"whsec_b2xkc2VjcmV0\"]\n"
				 "  gh:\n"
				 "    type: http\n"
				 "    path: /github\n"
				 "    idempotencyKeyHeader: X-GitHub-Delivery\n"
				 "    topic: \"github.{{ source }}\"\n"
				 "    auth: {type: github, secret: gh}\n"
				 "  custom:\n"
				 "    type: http\n"
				 "    path: /custom\n"
				 "    idempotencyKeyPath: \"$['event id']\"\n"
				 "    eventTypePath: $.kind\n"
				 "    auth: {type: hmac-sha256, secrets: [a, b], header: X-Sig, prefix: \"sha256=\", encoding: base64}\n"
				 "inbox:\n"
				 "  basePath: /hooks/\n"
				 "  relay: {enabled: false, pollIntervalMs: 50, batchSize: 10, claimTimeoutMs: 5000, maxAttempts: 3}\n"
				 "http: {listen: \"0.0.0.0:8443\", maxConnections: 10, connectionTimeoutMs: 2000, storeTimeoutMs: 300}\n"
				 "admin: {token: 0123456789abcdef}\n");
	assert_int_equal(cfg->nsources, 5);
	s = qb_config_source(cfg, "stripe");
	assert_non_null(s);
	assert_string_equal(s->path, "/stripe");
	assert_string_equal(s->idempotency_key_path, "$.id");
	assert_null(s->idempotency_key_header);
	assert_string_equal(s->event_type_path, "$.type");
	assert_string_equal(s->aggregate_id_path, "$.data.object.customer");
	assert_string_equal(s->topic, "stripe.{{ eventType }}");
	assert_int_equal(s->consumption, QB_CONSUME_PUSH);
	assert_int_equal(s->max_body_bytes, 1048576);
	assert_int_equal(s->auth.type, QB_AUTH_STRIPE);
	assert_int_equal(s->auth.nsecrets, 1);
	assert_string_equal(s->auth.secrets[0], "whsec_stripe_one");
	assert_int_equal(s->auth.tolerance_sec, 60);

	s = qb_config_source(cfg, "orders");
	assert_int_equal(s->consumption, QB_CONSUME_PULL);
	assert_string_equal(s->idempotency_key_header, "Idempotency-Key");
	assert_int_equal(s->max_body_bytes, 4096);
	assert_int_equal(s->auth.type, QB_AUTH_BEARER);
	assert_string_equal(s->auth.token, "orders-token");
	/* a pull source needs no event type for its (unused) default topic */
	assert_string_equal(s->topic, "{{ eventType }}");

	s = qb_config_source(cfg, "svix");
	assert_int_equal(s->auth.type, QB_AUTH_STANDARD_WEBHOOKS);
	assert_int_equal(s->auth.nsecrets, 2);
	assert_int_equal(s->auth.tolerance_sec, 300);
	/* standard webhooks: the idempotency key defaults to webhook-id */
	assert_string_equal(s->idempotency_key_header, "webhook-id");
	assert_string_equal(s->event_type_header, "X-Event");

	s = qb_config_source(cfg, "custom");
	assert_int_equal(s->auth.type, QB_AUTH_HMAC_SHA256);
	assert_string_equal(s->auth.header, "X-Sig");
	assert_string_equal(s->auth.prefix, "sha256=");
	assert_int_equal(s->auth.encoding, QB_SIG_BASE64);
	assert_int_equal(s->auth.nsecrets, 2);
	assert_null(qb_config_source(cfg, "nope"));

	assert_string_equal(cfg->inbox.base_path, "/hooks");
	assert_false(cfg->inbox.relay.enabled);
	assert_int_equal(cfg->inbox.relay.poll_interval_ms, 50);
	assert_int_equal(cfg->inbox.relay.batch_size, 10);
	assert_int_equal(cfg->inbox.relay.claim_timeout_ms, 5000);
	assert_int_equal(qb_config_relay_max_attempts(cfg), 3);
	assert_string_equal(cfg->http.host, "0.0.0.0");
	assert_int_equal(cfg->http.port, 8443);
	assert_int_equal(cfg->http.max_connections, 10);
	assert_int_equal(cfg->http.connection_timeout_ms, 2000);
	assert_int_equal(cfg->http.store_timeout_ms, 300);
	assert_string_equal(cfg->admin_token, "0123456789abcdef");
	qb_config_free(cfg);
	unsetenv("QBT_STRIPE_SECRET");

	/* defaults: basePath /inbox, relay on, no listener, no admin */
	cfg = accept("outbox: {maxAttempts: 7}\n");
	assert_string_equal(cfg->inbox.base_path, "/inbox");
	assert_true(cfg->inbox.relay.enabled);
	assert_int_equal(cfg->inbox.relay.poll_interval_ms, 100);
	assert_int_equal(cfg->inbox.relay.batch_size, 100);
	assert_int_equal(cfg->inbox.relay.claim_timeout_ms, 300000);
	assert_true(cfg->inbox.relay.takeover);
	assert_true(cfg->outbox.takeover);
	assert_int_equal(qb_config_relay_max_attempts(cfg), 7);
	assert_null(cfg->http.listen);
	assert_int_equal(cfg->http.max_connections, 256);
	assert_null(cfg->admin_token);
	assert_int_equal(cfg->nsources, 0);
	qb_config_free(cfg);
	cfg = accept("");
	assert_string_equal(cfg->inbox.base_path, "/inbox");
	qb_config_free(cfg);

	/* listen forms: a port alone binds loopback */
	cfg = accept("http: {listen: 8080}\ninbox: {basePath: /}\n");
	assert_string_equal(cfg->http.host, "127.0.0.1");
	assert_int_equal(cfg->http.port, 8080);
	assert_string_equal(cfg->inbox.base_path, "");
	qb_config_free(cfg);
	cfg = accept("http: {listen: \":9000\"}\n");
	assert_string_equal(cfg->http.host, "127.0.0.1");
	qb_config_free(cfg);
	cfg = accept("http: {listen: \"localhost:9001\"}\n");
	assert_string_equal(cfg->http.host, "127.0.0.1");
	qb_config_free(cfg);
	cfg = accept("http: {listen: \"[::1]:9002\"}\n");
	assert_string_equal(cfg->http.host, "::1");
	assert_int_equal(cfg->http.port, 9002);
	qb_config_free(cfg);
}
static void
test_sources_invalid(void **state)
{
	refuse("sources:\n  s: {}\n", "sources.s: missing required key type", NULL);
	refuse("sources:\n  s: {type: sqs}\n", "sources.s.type: expected one of http, rabbitmq, kafka, nats", "got \"sqs\"", NULL);
	refuse("sources:\n  \"a b\": {type: http}\n", "a source name may use only", NULL);
	refuse("sources:\n  s: {type: http, path: /s, idempotencyKeyPath: $.id, eventTypePath: $.t, fooBar: 1}\n",
		   "sources.s.fooBar: unknown key for an http source", NULL);
	refuse("sources:\n  s: {type: http, idempotencyKeyPath: $.id}\n",
		   "sources.s: missing required key path", NULL);
	refuse("sources:\n  s: {type: http, path: stripe, idempotencyKeyPath: $.id}\n",
		   "sources.s.path: must start with '/'", NULL);
	refuse("sources:\n  s: {type: http, path: /a/, idempotencyKeyPath: $.id}\n",
		   "sources.s.path: must name something after '/' and not end with '/'", NULL);
	refuse(SRC "    eventTypePath: $.t\n",
		   "sources.s: missing idempotencyKeyPath or idempotencyKeyHeader", NULL);
	refuse(SRC "    idempotencyKeyPath: $.id\n    idempotencyKeyHeader: X-Id\n    eventTypePath: $.t\n",
		   "sources.s.idempotencyKeyHeader: set idempotencyKeyPath or idempotencyKeyHeader, not both", NULL);
	refuse(SRC "    idempotencyKeyPath: id\n", "sources.s.idempotencyKeyPath:", "$", NULL);
	refuse(SRC "    idempotencyKeyPath: $.id\n    aggregateIdPath: \"$.a[\"\n", "sources.s.aggregateIdPath:", NULL);
	refuse(SRC "    idempotencyKeyHeader: \"X Id\"\n", "sources.s.idempotencyKeyHeader: not a valid HTTP header name", NULL);
	/* push with the default topic and no event type: every message would go dead */
	refuse(SRC "    idempotencyKeyPath: $.id\n",
		   "sources.s.topic: the default topic is {{ eventType }} but the source sets neither eventTypePath nor eventTypeHeader",
		   "(line 3, column 5)", NULL);
	refuse(SRC "    idempotencyKeyPath: $.id\n    topic: \"x.{{ eventType }}\"\n",
		   "sources.s.topic: the template reads {{ eventType }}", NULL);
	refuse(SRC "    idempotencyKeyPath: $.id\n    topic: \"{{ nope }}\"\n", "sources.s.topic:", "nope", NULL);
	refuse(SRC "    idempotencyKeyPath: $.id\n    topic: \"\"\n", "sources.s.topic: must not be empty", NULL);
	refuse(SRC "    idempotencyKeyPath: $.id\n    eventTypePath: $.t\n    consumption: later\n",
		   "sources.s.consumption: expected push", "got \"later\"", NULL);
	refuse(SRC "    idempotencyKeyPath: $.id\n    eventTypePath: $.t\n    maxBodyBytes: 0\n",
		   "sources.s.maxBodyBytes: expected an integer from 1 to 67108864", NULL);
	refuse("sources:\n  a: {type: http, path: /x, idempotencyKeyPath: $.id, topic: a}\n"
		   "  b: {type: http, path: /x, idempotencyKeyPath: $.id, topic: b}\n",
		   "sources.b.path: the same path as source a", NULL);

	/* auth */
	refuse(SRC "    idempotencyKeyPath: $.id\n    topic: t\n    auth:\n",
		   "sources.s.auth: expected a mapping with at least type:", NULL);
	refuse(SRC "    idempotencyKeyPath: $.id\n    topic: t\n    auth: {type: md5, secret: x}\n",
		   "sources.s.auth.type: expected one of hmac-sha256, github, stripe, standard-webhooks, bearer, got \"md5\"", NULL);
	refuse(SRC "    idempotencyKeyPath: $.id\n    topic: t\n    auth: {type: github}\n",
		   "sources.s.auth: missing required key secret", NULL);
	refuse(SRC "    idempotencyKeyPath: $.id\n    topic: t\n    auth: {type: github, secret: a, secrets: [b]}\n",
		   "sources.s.auth.secrets: set secret or secrets, not both", NULL);
	refuse(SRC "    idempotencyKeyPath: $.id\n    topic: t\n    auth: {type: github, secrets: []}\n",
		   "sources.s.auth.secrets: expected a list of at least one secret", NULL);
	refuse(SRC "    idempotencyKeyPath: $.id\n    topic: t\n    auth: {type: github, secrets: [a, \"\"]}\n",
		   "sources.s.auth.secrets[1]: must not be empty", NULL);
	refuse(SRC "    idempotencyKeyPath: $.id\n    topic: t\n    auth: {type: github, secret: a, header: X-Sig}\n",
		   "sources.s.auth.header: unknown key for auth type github", NULL);
	refuse(SRC "    idempotencyKeyPath: $.id\n    topic: t\n    auth: {type: hmac-sha256, secret: a}\n",
		   "sources.s.auth: missing required key header", NULL);
	refuse(SRC "    idempotencyKeyPath: $.id\n    topic: t\n    auth: {type: hmac-sha256, secret: a, header: X-S, encoding: hexa}\n",
		   "sources.s.auth.encoding: expected hex or base64, got \"hexa\"", NULL);
	refuse(SRC "    idempotencyKeyPath: $.id\n    topic: t\n    auth: {type: stripe, secret: a, toleranceSec: 0}\n",
		   "sources.s.auth.toleranceSec: expected an integer from 1 to 86400", NULL);
	refuse(SRC "    topic: t\n    auth: {type: standard-webhooks, secret: \"whsec_not base64!\"}\n",
		   "sources.s.auth.secret: a standard-webhooks secret is whsec_ followed by base64", NULL);
	refuse(SRC "    idempotencyKeyPath: $.id\n    topic: t\n    auth: {type: bearer}\n",
		   "sources.s.auth: missing required key token", NULL);
	refuse(SRC "    idempotencyKeyPath: $.id\n    topic: t\n    auth: {type: bearer, token: x, secret: y}\n",
		   "sources.s.auth.secret: unknown key for auth type bearer", NULL);
	refuse(SRC "    idempotencyKeyPath: $.id\n    topic: t\n    auth: {type: github, secret: \"${QBT_UNSET_SECRET}\"}\n",
		   "sources.s.auth.secret:", "QBT_UNSET_SECRET", NULL);
}
/* ---- signing: on http destinations ---------------------------------- */

#define SIGNED_DEST "destinations:\n  hooks:\n    type: http\n    baseUrl: \"http://127.0.0.1:9000\"\n"

static void
test_signing_valid(void **state)
{
	QbConfig   *c;
	const QbSigning *s;

	/* no signing: unsigned */
	c = accept(SIGNED_DEST);
	assert_int_equal(c->destinations[0].signing.type, QB_AUTH_NONE);
	assert_int_equal(c->destinations[0].signing.nkeys, 0);
	qb_config_free(c);

	/* standard-webhooks: whsec_ keys decoded once, here; bare base64 too */
	c = accept(SIGNED_DEST
			   "    signing:\n      type: standard-webhooks\n"
			   "      secrets: [\"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\", \"cXVldWVib3gtcm90YXRlZC1rZXktMDE=\"]\n");
	s = &c->destinations[0].signing;
	assert_int_equal(s->type, QB_AUTH_STANDARD_WEBHOOKS);
	assert_int_equal(s->nkeys, 2);
	assert_int_equal(s->keys[0].len, 24);
	assert_memory_equal(s->keys[0].bytes,
						"\x31\xf2\x90\xf6\xbf\x06\x29\x8a\xab\x4f\x08\xd4\x3c\x3f\x08\x2c\xf6\x48\xa3\x62\xda\x2d\xa4\xb0", 24);
	assert_int_equal(s->keys[1].len, 23);
	assert_memory_equal(s->keys[1].bytes, "queuebox-rotated-key-01", 23);
	assert_null(s->header);
	qb_config_free(c);

	/* hmac-sha256: defaults hex and no prefix; the secret's own bytes */
	c = accept(SIGNED_DEST "    signing: {type: hmac-sha256, header: X-Signature, secret: s3cret}\n");
	s = &c->destinations[0].signing;
	assert_int_equal(s->type, QB_AUTH_HMAC_SHA256);
	assert_string_equal(s->header, "X-Signature");
	assert_null(s->prefix);
	assert_int_equal(s->encoding, QB_SIG_HEX);
	assert_int_equal(s->nkeys, 1);
	assert_int_equal(s->keys[0].len, 6);
	assert_memory_equal(s->keys[0].bytes, "s3cret", 6);
	qb_config_free(c);

	c = accept(SIGNED_DEST "    headers: {X-Team: a}\n"
			   "    signing: {type: hmac-sha256, header: X-Hub-Signature-256, prefix: \"sha256=\", encoding: base64, secrets: [a, b]}\n");
	s = &c->destinations[0].signing;
	assert_string_equal(s->prefix, "sha256=");
	assert_int_equal(s->encoding, QB_SIG_BASE64);
	assert_int_equal(s->nkeys, 2);
	qb_config_free(c);

	/* overrides: the secret from the environment, as it is */
	setenv("QUEUEBOX_DESTINATIONS_HOOKS_SIGNING_SECRET", "from-env", 1);
	c = accept(SIGNED_DEST "    signing: {type: hmac-sha256, header: X-Sig, secret: in-doc}\n");
	s = &c->destinations[0].signing;
	assert_int_equal(s->keys[0].len, 8);
	assert_memory_equal(s->keys[0].bytes, "from-env", 8);
	qb_config_free(c);
	/* ... or the whole section from overrides */
	setenv("QUEUEBOX_DESTINATIONS_HOOKS_SIGNING_TYPE", "standard-webhooks", 1);
	setenv("QUEUEBOX_DESTINATIONS_HOOKS_SIGNING_SECRET", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", 1);
	c = accept(SIGNED_DEST);
	assert_int_equal(c->destinations[0].signing.type, QB_AUTH_STANDARD_WEBHOOKS);
	assert_int_equal(c->destinations[0].signing.keys[0].len, 24);
	qb_config_free(c);
	unsetenv("QUEUEBOX_DESTINATIONS_HOOKS_SIGNING_TYPE");
	unsetenv("QUEUEBOX_DESTINATIONS_HOOKS_SIGNING_SECRET");
}

static void
test_signing_invalid(void **state)
{
	char		err[QB_ERRLEN];

	refuse(SIGNED_DEST "    signing:\n",
		   "destinations.hooks.signing: expected a mapping with at least type:", NULL);
	refuse(SIGNED_DEST "    signing: {type: sha1, secret: x}\n",
		   "destinations.hooks.signing.type: expected one of standard-webhooks, hmac-sha256, got \"sha1\"", NULL);
	refuse(SIGNED_DEST "    signing: {secret: x}\n",
		   "destinations.hooks.signing: missing required key type", NULL);
	/* unknown keys, per scheme */
	refuse(SIGNED_DEST "    signing: {type: standard-webhooks, secret: \"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\", header: X-Sig}\n",
		   "destinations.hooks.signing.header: unknown key for signing type standard-webhooks (allowed: type, secret, secrets)", NULL);
	refuse(SIGNED_DEST "    signing: {type: hmac-sha256, header: X-Sig, secret: a, toleranceSec: 5}\n",
		   "destinations.hooks.signing.toleranceSec: unknown key for signing type hmac-sha256", NULL);
	/* secrets */
	refuse(SIGNED_DEST "    signing: {type: standard-webhooks}\n",
		   "destinations.hooks.signing: missing required key secret", "whsec_", NULL);
	refuse(SIGNED_DEST "    signing: {type: hmac-sha256, header: X-Sig}\n",
		   "destinations.hooks.signing: missing required key secret", NULL);
	refuse(SIGNED_DEST "    signing: {type: hmac-sha256, header: X-Sig, secret: a, secrets: [b]}\n",
		   "destinations.hooks.signing.secrets: set secret or secrets, not both", NULL);
	refuse(SIGNED_DEST "    signing: {type: hmac-sha256, header: X-Sig, secrets: [a, \"\"]}\n",
		   "destinations.hooks.signing.secrets[1]: must not be empty", NULL);
	refused_message(SIGNED_DEST "    signing: {type: standard-webhooks, secret: \"whsec_not*base64-TOPSECRET\"}\n",
					err, sizeof(err));
	assert_non_null(strstr(err, "destinations.hooks.signing.secret: a standard-webhooks secret is whsec_ followed by base64"));
	assert_null(strstr(err, "TOPSECRET"));
	refuse(SIGNED_DEST "    signing: {type: hmac-sha256, header: X-Sig, secrets: [a,b,c,d,e,f,g,h,i,j,k,l,m,n,o,p,q]}\n",
		   "destinations.hooks.signing.secrets: at most 16 secrets", NULL);
	/* the header */
	refuse(SIGNED_DEST "    signing: {type: hmac-sha256, secret: a}\n",
		   "destinations.hooks.signing: missing required key header", NULL);
	refuse(SIGNED_DEST "    signing: {type: hmac-sha256, header: \"\", secret: a}\n",
		   "destinations.hooks.signing.header: must not be empty", NULL);
	refuse(SIGNED_DEST "    signing: {type: hmac-sha256, header: \"X Sig\", secret: a}\n",
		   "destinations.hooks.signing.header: not a valid HTTP header name", NULL);
	refuse(SIGNED_DEST "    signing: {type: hmac-sha256, header: x-message-id, secret: a}\n",
		   "destinations.hooks.signing.header: QueueBox sets x-message-id itself on every request", NULL);
	refuse(SIGNED_DEST "    signing: {type: hmac-sha256, header: Content-Type, secret: a}\n",
		   "destinations.hooks.signing.header: QueueBox sets Content-Type itself", NULL);
	refuse(SIGNED_DEST "    headers: {x-sig: static}\n    signing: {type: hmac-sha256, header: X-Sig, secret: a}\n",
		   "destinations.hooks.headers.x-sig: signing: sets this header itself on every request; remove it from headers:", NULL);
	refuse(SIGNED_DEST "    headers: {Webhook-Timestamp: \"1\"}\n"
		   "    signing: {type: standard-webhooks, secret: \"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"}\n",
		   "destinations.hooks.headers.Webhook-Timestamp: signing: sets this header itself", NULL);
	refuse(SIGNED_DEST "    signing: {type: hmac-sha256, header: X-Sig, secret: a, encoding: hexa}\n",
		   "destinations.hooks.signing.encoding: expected hex or base64, got \"hexa\"", NULL);
	refuse(SIGNED_DEST "    signing: {type: hmac-sha256, header: X-Sig, secret: a, prefix: \"a\\nb\"}\n",
		   "destinations.hooks.signing.prefix: the prefix contains a line break", NULL);
	/* other destination types */
	refuse("destinations:\n  bus: {type: nats, url: \"nats://127.0.0.1:4222\", signing: {type: hmac-sha256}}\n",
		   "destinations.bus.signing: signing is for http destinations only", NULL);
	/* an override names its variable and never echoes the secret */
	setenv("QUEUEBOX_DESTINATIONS_HOOKS_SIGNING_SECRET", "whsec_%%TOPSECRET%%", 1);
	refused_message(SIGNED_DEST "    signing: {type: standard-webhooks, secret: x}\n", err, sizeof(err));
	assert_non_null(strstr(err, "QUEUEBOX_DESTINATIONS_HOOKS_SIGNING_SECRET (destinations.hooks.signing.secret): a standard-webhooks secret"));
	assert_null(strstr(err, "TOPSECRET"));
	/* a stale override on a destination that cannot sign is noticed */
	refuse("destinations:\n  hooks: {type: nats, url: \"nats://127.0.0.1:4222\"}\n",
		   "destinations.hooks.signing: signing is for http destinations only", NULL);
	unsetenv("QUEUEBOX_DESTINATIONS_HOOKS_SIGNING_SECRET");
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_sources_valid),
		cmocka_unit_test(test_sources_invalid),
		cmocka_unit_test(test_signing_valid),
		cmocka_unit_test(test_signing_invalid),
	};

	return cmocka_run_group_tests_name("qb_config_http", tests, NULL, NULL);
}
