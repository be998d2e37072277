/*-------------------------------------------------------------------------
 * test_config.c
 *	  Unit tests of the configuration (src/common/config, the qb_config_*
 *	  family): loading, ${NAME} expansion, QUEUEBOX_* overrides, validation,
 *	  URL checks, and the daemon's database: and daemon: keys.
 *
 * Wording: "accept" parses a document and returns the config, failing the
 * test with the parser's message if it is refused; "refuse" parses a
 * document and checks that the message holds each expected substring.
 * Every test sets and unsets its own environment variables.
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

/* what the host allows every parse here (a test that changes it puts it back) */
static QbConfigEnv test_env;

/* the secret-file directories: NULL, any file (the daemon's) */
static void
test_set_file_dirs(const char *dirs, const char *setting)
{
	test_env.file_dirs = dirs;
	test_env.file_setting = setting;
	test_env.files_anywhere = dirs == NULL;
}

/* accept: parse text, fail the test with the message when it is refused. */
static QbConfig *
accept(const char *text)
{
	QbConfig   *cfg = (QbConfig *) 0x1;
	char		err[QB_ERRLEN] = "";

	if (qb_config_parse(text, strlen(text), &test_env, &cfg, err, sizeof(err)) != 0)
		fail_msg("refused: %s\n--- document:\n%s", err, text);
	assert_non_null(cfg);
	return cfg;
}

/*
 * refuse: parse text, expect a refusal whose message holds every string of
 * the NULL-terminated list.
 */
static void
refuse(const char *text,...)
{
	QbConfig   *cfg = (QbConfig *) 0x1;
	char		err[QB_ERRLEN] = "";
	const char *want;
	va_list		ap;

	if (qb_config_parse(text, strlen(text), &test_env, &cfg, err, sizeof(err)) == 0)
	{
		qb_config_free(cfg);
		fail_msg("accepted, expected a refusal:\n%s", text);
	}
	assert_null(cfg);
	va_start(ap, text);
	while ((want = va_arg(ap, const char *)) != NULL)
		if (strstr(err, want) == NULL)
			fail_msg("message \"%s\"\n lacks \"%s\"", err, want);
	va_end(ap);
}

/* refused_message: the message of a refusal, for checks of what it lacks. */
static void
refused_message(const char *text, char *err, size_t errlen)
{
	QbConfig   *cfg = NULL;

	assert_int_equal(qb_config_parse(text, strlen(text), &test_env, &cfg, err, errlen), -1);
	assert_null(cfg);
}

static void
assert_defaults(const QbConfig *c)
{
	assert_int_equal(c->outbox.poll_interval_ms, 500);
	assert_int_equal(c->outbox.batch_size, 100);
	assert_int_equal(c->outbox.max_attempts, 10);
	assert_int_equal(c->outbox.claim_timeout_ms, 300000);
	assert_int_equal(c->outbox.backoff.initial_ms, 1000);
	assert_int_equal(c->outbox.backoff.max_ms, 3600000);
	assert_true(c->outbox.backoff.multiplier == 2.0);
	assert_true(c->outbox.backoff.jitter == 0.2);
	assert_int_equal(c->outbox.retention_sec, 7 * 86400);
	assert_int_equal(c->ndestinations, 0);
	assert_null(c->destinations);
	assert_int_equal(c->nroutes, 0);
	assert_null(c->routes);
}

static const char full_doc[] =
"outbox:\n"
"  pollIntervalMs: 250\n"
"  batchSize: 50\n"
"  maxAttempts: 7\n"
"  claimTimeoutMs: 60000\n"
"  backoff: { initialMs: 100, maxMs: 60000, multiplier: 1.5, jitter: 0.1 }\n"
"  retention: 12h\n"
"destinations:\n"
"  payments:\n"
"    type: http\n"
"    baseUrl: \"http://127.0.0.1:9000/\"\n"
"    path: /events\n"
"    headers: { X-Api-Key: \"${QB_T_API_KEY}\", X-Static: plain }\n"
"    timeoutMs: 2500\n"
"  bus:   { type: rabbitmq, url: \"amqp://guest:guest@127.0.0.1:5672/\", exchange: events, routingKey: \"{{ topic }}.x\", persistent: false, mandatory: true }\n"
"  log:   { type: kafka, brokers: \"127.0.0.1:9092,localhost:9093\", topic: \"x\", config: { \"linger.ms\": \"5\", acks: all } }\n"
"  fan:   { type: nats, url: \"nats://127.0.0.1:4222\", subject: \"y\", jetstream: true }\n"
"routes:\n"
"  - topicPattern: \"orders.**\"\n"
"    destination: payments\n"
"  - topicPattern: \"*.audit\"\n"
"    destination: log\n";

/* ---- defaults and the full model ---------------------------------- */

static void
test_empty_documents(void **state)
{
	static const char *const docs[] = {
		"", "\n\n", "# only a comment\n   # and another\n", "---\n", "--- # c\n...\n",
		"~\n", "outbox:\ndestinations:\nroutes:\n", "outbox: {}\ndestinations: {}\nroutes: []\n",
	};
	QbConfig	d;
	size_t		i;

	qb_config_defaults(&d);
	assert_defaults(&d);
	for (i = 0; i < sizeof(docs) / sizeof(docs[0]); i++)
	{
		QbConfig   *c = accept(docs[i]);

		assert_defaults(c);
		qb_config_free(c);
	}
	/* NULL text with length 0 is an empty document too */
	{
		QbConfig   *c = NULL;
		char		err[QB_ERRLEN];

		assert_int_equal(qb_config_parse(NULL, 0, &test_env, &c, err, sizeof(err)), 0);
		assert_defaults(c);
		qb_config_free(c);
	}
}

static void
test_full_document(void **state)
{
	QbConfig   *c;
	const QbDestination *d;

	setenv("QB_T_API_KEY", "k-123", 1);
	c = accept(full_doc);
	unsetenv("QB_T_API_KEY");

	assert_int_equal(c->outbox.poll_interval_ms, 250);
	assert_int_equal(c->outbox.batch_size, 50);
	assert_int_equal(c->outbox.max_attempts, 7);
	assert_int_equal(c->outbox.claim_timeout_ms, 60000);
	assert_int_equal(c->outbox.backoff.initial_ms, 100);
	assert_int_equal(c->outbox.backoff.max_ms, 60000);
	assert_true(c->outbox.backoff.multiplier == 1.5);
	assert_true(c->outbox.backoff.jitter == 0.1);
	assert_int_equal(c->outbox.retention_sec, 12 * 3600);
	assert_int_equal(c->ndestinations, 4);

	d = qb_config_destination(c, "payments");
	assert_non_null(d);
	assert_ptr_equal(d, &c->destinations[0]);
	assert_int_equal(d->type, QB_DEST_HTTP);
	assert_string_equal(d->base_url, "http://127.0.0.1:9000");	/* '/' dropped */
	assert_string_equal(d->path, "/events");
	assert_string_equal(d->url, "http://127.0.0.1:9000/events");
	assert_int_equal(d->nheaders, 2);
	assert_string_equal(d->headers[0].name, "X-Api-Key");
	assert_string_equal(d->headers[0].value, "k-123");
	assert_string_equal(d->headers[1].name, "X-Static");
	assert_string_equal(d->headers[1].value, "plain");
	assert_int_equal(d->timeout_ms, 2500);
	assert_null(d->broker_url);

	d = qb_config_destination(c, "bus");
	assert_int_equal(d->type, QB_DEST_RABBITMQ);
	assert_string_equal(d->broker_url, "amqp://guest:guest@127.0.0.1:5672/");
	assert_string_equal(d->target, "events");
	assert_string_equal(d->routing_key, "{{ topic }}.x");
	assert_false(d->persistent);
	assert_true(d->mandatory);
	assert_null(d->url);

	d = qb_config_destination(c, "log");
	assert_int_equal(d->type, QB_DEST_KAFKA);
	assert_string_equal(d->broker_url, "127.0.0.1:9092,localhost:9093");
	assert_string_equal(d->target, "x");
	assert_int_equal(d->nprops, 2);
	assert_string_equal(d->props[0].name, "linger.ms");
	assert_string_equal(d->props[0].value, "5");
	assert_string_equal(d->props[1].name, "acks");
	assert_string_equal(d->props[1].value, "all");

	d = qb_config_destination(c, "fan");
	assert_int_equal(d->type, QB_DEST_NATS);
	assert_string_equal(d->broker_url, "nats://127.0.0.1:4222");
	assert_string_equal(d->target, "y");
	assert_true(d->jetstream);

	assert_null(qb_config_destination(c, "nope"));
	assert_int_equal(c->nroutes, 2);
	assert_string_equal(c->routes[0].topic_pattern, "orders.**");
	assert_string_equal(c->routes[0].destination, "payments");
	assert_int_equal(c->routes[0].dest_index, 0);
	assert_int_equal(c->routes[1].dest_index, 2);
	qb_config_free(c);

	assert_string_equal(qb_dest_type_name(QB_DEST_HTTP), "http");
	assert_string_equal(qb_dest_type_name(QB_DEST_RABBITMQ), "rabbitmq");
	assert_string_equal(qb_dest_type_name(QB_DEST_KAFKA), "kafka");
	assert_string_equal(qb_dest_type_name(QB_DEST_NATS), "nats");
}

static void
test_partial_defaults(void **state)
{
	QbConfig   *c = accept("outbox:\n  batchSize: 5\n  backoff: { jitter: 0 }\n"
						   "destinations:\n"
						   "  h: { type: http, baseUrl: \"https://example.com/base\" }\n"
						   "  r: { type: rabbitmq, url: \"amqps://h\", exchange: \"\" }\n"
						   "  k: { type: kafka, brokers: h }\n"
						   "  n: { type: nats, url: \"tls://a:1,nats://u:p@b:2\" }\n");
	const QbDestination *d;

	assert_int_equal(c->outbox.batch_size, 5);
	assert_int_equal(c->outbox.poll_interval_ms, 500);
	assert_int_equal(c->outbox.max_attempts, 10);
	assert_int_equal(c->outbox.backoff.initial_ms, 1000);
	assert_int_equal(c->outbox.backoff.max_ms, 3600000);
	assert_true(c->outbox.backoff.multiplier == 2.0);
	assert_true(c->outbox.backoff.jitter == 0.0);
	assert_int_equal(c->outbox.retention_sec, 604800);

	d = &c->destinations[0];
	assert_string_equal(d->base_url, "https://example.com/base");
	assert_string_equal(d->path, "");
	assert_string_equal(d->url, "https://example.com/base");
	assert_int_equal(d->nheaders, 0);
	assert_int_equal(d->timeout_ms, 10000);
	d = &c->destinations[1];
	assert_string_equal(d->target, "");	/* AMQP's default exchange */
	assert_string_equal(d->routing_key, "{{ topic }}");
	assert_true(d->persistent);
	assert_true(d->mandatory);
	d = &c->destinations[2];
	assert_null(d->target);
	assert_int_equal(d->nprops, 0);
	d = &c->destinations[3];
	assert_null(d->target);
	assert_true(d->jetstream);	/* core NATS loses messages on a restart */
	qb_config_free(c);
}

static void
test_scalar_forms(void **state)
{
	static const struct
	{
		const char *retention;
		long		sec;
	}			r[] = {
		{"7d", 604800}, {"12h", 43200}, {"30m", 1800}, {"45s", 45},
		{"3600", 3600}, {"1", 1}, {"\"90\"", 90}, {"36500d", 36500L * 86400},
	};
	char		doc[128];
	size_t		i;
	QbConfig   *c;

	for (i = 0; i < sizeof(r) / sizeof(r[0]); i++)
	{
		snprintf(doc, sizeof(doc), "outbox:\n  retention: %s\n", r[i].retention);
		c = accept(doc);
		assert_int_equal(c->outbox.retention_sec, r[i].sec);
		qb_config_free(c);
	}
	/* quoted numbers are accepted, so ${} and overrides can supply them */
	c = accept("outbox: { batchSize: \"17\", backoff: { multiplier: \"1\", jitter: 1, initialMs: 5, maxMs: 5 } }\n");
	assert_int_equal(c->outbox.batch_size, 17);
	assert_true(c->outbox.backoff.multiplier == 1.0);
	assert_true(c->outbox.backoff.jitter == 1.0);
	qb_config_free(c);
	c = accept("outbox: { pollIntervalMs: 10, batchSize: 10000, maxAttempts: 1000000, claimTimeoutMs: 86400000, backoff: { multiplier: 2.5e0 } }\n");
	assert_int_equal(c->outbox.poll_interval_ms, 10);
	assert_int_equal(c->outbox.batch_size, 10000);
	assert_int_equal(c->outbox.max_attempts, 1000000);
	assert_int_equal(c->outbox.claim_timeout_ms, 86400000);
	assert_true(c->outbox.backoff.multiplier == 2.5);
	qb_config_free(c);
}

/* ---- refusals: keys ----------------------------------------------- */

static void
test_unknown_keys(void **state)
{
	refuse("outbox:\n  batchsize: 5\n",
		   "outbox.batchsize: unknown key (allowed: pollIntervalMs, batchSize, maxAttempts, claimTimeoutMs, takeover, backoff, retention)",
		   "did you mean batchSize?", "(line 2, column 3)", NULL);
	refuse("outbox: {}\nsinks:\n  a: {}\n",
		   "sinks: unknown key (allowed: outbox, destinations, routes, sources, inbox, http, admin, database, daemon, egress, telemetry)", "(line 2, column 1)", NULL);
	refuse("outbox:\n  backoff:\n    initial: 5\n",
		   "outbox.backoff.initial: unknown key (allowed: initialMs, maxMs, multiplier, jitter)",
		   "(line 3, column 5)", NULL);
	refuse("destinations:\n  bus: { type: rabbitmq, url: \"amqp://h\", exchange: e, baseUrl: \"http://h\" }\n",
		   "destinations.bus.baseUrl: unknown key for a rabbitmq destination (allowed: type, url, exchange, routingKey, persistent, mandatory, transform, maxInFlight, circuitBreaker, onDead)",
		   "(line 2, column 56)", NULL);
	refuse("destinations:\n  p: { type: http, baseUrl: \"http://h\", filter: x }\n",
		   "destinations.p.filter: unknown key for an http destination (allowed: type, baseUrl, path, headers, timeoutMs, transform, signing, maxInFlight, circuitBreaker, onDead)",
		   NULL);
	refuse("destinations:\n  k: { type: kafka, brokers: h, subject: s }\n",
		   "destinations.k.subject: unknown key for a kafka destination (allowed: type, brokers, topic, config, transform, maxInFlight, circuitBreaker, onDead)", NULL);
	refuse("destinations:\n  n: { type: nats, url: \"nats://h\", topic: s }\n",
		   "destinations.n.topic: unknown key for a nats destination (allowed: type, url, subject, jetstream, createStream, transform, maxInFlight, circuitBreaker, onDead)", NULL);
	refuse("destinations: { p: { type: http, baseUrl: \"http://h\" } }\nroutes:\n  - topicPattern: a\n    destination: p\n    priority: 1\n",
		   "routes[0].priority: unknown key (allowed: topicPattern, destination, transform, onDead)", "(line 5, column 5)", NULL);
	refuse("? [a, b]\n: 1\n", "a key must be a string", NULL);
}

static void
test_duplicate_keys(void **state)
{
	refuse("outbox:\n  batchSize: 1\n  batchSize: 2\n",
		   "outbox.batchSize: duplicate key (first at line 2, column 3)", "(line 3, column 3)", NULL);
	refuse("outbox: {}\noutbox: {}\n", "outbox: duplicate key (first at line 1, column 1)", NULL);
	refuse("destinations:\n  a: { type: nats, url: \"nats://h\" }\n  a: { type: nats, url: \"nats://h\" }\n",
		   "destinations.a: duplicate key (first at line 2, column 3)", NULL);
	refuse("destinations:\n  a: { type: http, baseUrl: \"http://h\", headers: { X-A: 1, X-A: 2 } }\n",
		   "destinations.a.headers.X-A: duplicate key", NULL);
	refuse("destinations:\n  a: { type: http, baseUrl: \"http://h\", headers: { X-A: 1, x-a: 2 } }\n",
		   "destinations.a.headers.x-a: the same header as at line 2", NULL);
}

static void
test_required_keys(void **state)
{
	refuse("destinations:\n  payments:\n    baseUrl: \"http://h\"\n",
		   "destinations.payments: missing required key type", "(line 3, column 5)", NULL);
	refuse("destinations:\n  payments: { type: http, path: /x }\n",
		   "destinations.payments: missing required key baseUrl", NULL);
	refuse("destinations:\n  bus: { type: rabbitmq, url: \"amqp://h\" }\n",
		   "destinations.bus: missing required key exchange", NULL);
	refuse("destinations:\n  bus: { type: rabbitmq, exchange: e }\n",
		   "destinations.bus: missing required key url", NULL);
	refuse("destinations:\n  log: { type: kafka, topic: t }\n",
		   "destinations.log: missing required key brokers", NULL);
	refuse("destinations:\n  fan: { type: nats }\n", "destinations.fan: missing required key url", NULL);
	refuse("destinations:\n  fan:\n", "destinations.fan: expected a mapping with at least type:", NULL);
	refuse("destinations: { p: { type: nats, url: \"nats://h\" } }\nroutes:\n  - destination: p\n",
		   "routes[0]: missing required key topicPattern", "(line 3, column 5)", NULL);
	refuse("destinations: { p: { type: nats, url: \"nats://h\" } }\nroutes:\n  - topicPattern: a\n",
		   "routes[0]: missing required key destination", NULL);
	refuse("routes:\n  -\n", "routes[0]: expected a mapping with topicPattern and destination", NULL);
}

/* ---- refusals: values --------------------------------------------- */

static void
test_wrong_types(void **state)
{
	refuse("outbox:\n  batchSize: many\n",
		   "outbox.batchSize: expected an integer from 1 to 10000, got \"many\" (line 2, column 14)", NULL);
	refuse("outbox:\n  pollIntervalMs: 500\n  batchSize: many\n",
		   "outbox.batchSize: expected an integer from 1 to 10000, got \"many\" (line 3, column 14)", NULL);
	refuse("outbox: { batchSize: 0 }\n", "outbox.batchSize: expected an integer from 1 to 10000, got \"0\"", NULL);
	refuse("outbox: { batchSize: 10001 }\n", "got \"10001\"", NULL);
	refuse("outbox: { batchSize: 1.5 }\n", "got \"1.5\"", NULL);
	refuse("outbox: { batchSize: 0x10 }\n", "got \"0x10\"", NULL);
	refuse("outbox: { batchSize: 99999999999999999999999 }\n", "outbox.batchSize: expected an integer", NULL);
	refuse("outbox: { batchSize: }\n", "outbox.batchSize: expected an integer from 1 to 10000, got an empty value", NULL);
	refuse("outbox: { batchSize: [1] }\n", "outbox.batchSize: expected an integer from 1 to 10000, got a sequence", NULL);
	refuse("outbox: { batchSize: \"a\\tb\" }\n", "got \"a\\x09b\"", NULL);
	refuse("outbox: { pollIntervalMs: 9 }\n", "outbox.pollIntervalMs: expected an integer from 10 to 3600000", NULL);
	refuse("outbox: { maxAttempts: 0 }\n", "outbox.maxAttempts: expected an integer from 1 to 1000000", NULL);
	refuse("outbox: { claimTimeoutMs: 999 }\n", "outbox.claimTimeoutMs: expected an integer from 1000 to 86400000", NULL);
	refuse("outbox: { backoff: { initialMs: 0 } }\n", "outbox.backoff.initialMs: expected an integer from 1", NULL);
	refuse("outbox: { backoff: { initialMs: 10, maxMs: 5 } }\n",
		   "outbox.backoff.maxMs: must be at least initialMs (10), got 5", NULL);
	refuse("outbox: { backoff: { initialMs: 4000000 } }\n",
		   "outbox.backoff.initialMs: is larger than maxMs (3600000, the default)", NULL);
	refuse("outbox: { backoff: { multiplier: 0.5 } }\n", "outbox.backoff.multiplier: expected a number >= 1", "got \"0.5\"", NULL);
	refuse("outbox: { backoff: { multiplier: .inf } }\n", "outbox.backoff.multiplier: expected a number", NULL);
	refuse("outbox: { backoff: { multiplier: nan } }\n", "got \"nan\"", NULL);
	refuse("outbox: { backoff: { multiplier: 1e999 } }\n", "got \"1e999\"", NULL);
	refuse("outbox: { backoff: { multiplier: 2x } }\n", "outbox.backoff.multiplier: expected a number >= 1", "got \"2x\"", NULL);
	refuse("outbox: { backoff: { jitter: 0.1.2 } }\n", "got \"0.1.2\"", NULL);
	refuse("outbox: { backoff: { multiplier: 0x2 } }\n", "got \"0x2\"", NULL);
	refuse("outbox: { backoff: { multiplier: 2e } }\n", "got \"2e\"", NULL);
	refuse("outbox: { backoff: { jitter: 1.5 } }\n", "outbox.backoff.jitter: expected a number from 0 to 1, got \"1.5\"", NULL);
	refuse("outbox: { backoff: { jitter: -0.1 } }\n", "outbox.backoff.jitter", NULL);
	refuse("outbox: { backoff: 5 }\n", "outbox.backoff: expected a mapping", NULL);
	refuse("outbox: [1]\n", "outbox: expected a mapping", "got a sequence (line 1, column 9)", NULL);
	refuse("routes: { a: 1 }\n", "routes: expected a sequence", NULL);
	refuse("destinations: [1]\n", "destinations: expected a mapping", NULL);

	refuse("outbox: { retention: 0 }\n", "outbox.retention: expected a duration", "got \"0\"", NULL);
	refuse("outbox: { retention: 7x }\n", "got \"7x\"", NULL);
	refuse("outbox: { retention: d }\n", "got \"d\"", NULL);
	refuse("outbox: { retention: -1 }\n", "got \"-1\"", NULL);
	refuse("outbox: { retention: 7 d }\n", "got \"7 d\"", NULL);
	refuse("outbox: { retention: 36501d }\n", "got \"36501d\"", NULL);
	refuse("outbox: { retention: 99999999999999999999999999d }\n", "outbox.retention: expected a duration", NULL);

	refuse("destinations:\n  bus: { type: rabbitmq, url: \"amqp://h\", exchange: e, persistent: yes }\n",
		   "destinations.bus.persistent: expected true or false, got \"yes\"", NULL);
	refuse("destinations:\n  n: { type: nats, url: \"nats://h\", subject: \"out.{{ nope }}\" }\n",
		   "destinations.n.subject:", "nope", NULL);
	refuse("destinations:\n  fan: { type: nats, url: \"nats://h\", jetstream: 1 }\n",
		   "destinations.fan.jetstream: expected true or false, got \"1\"", NULL);
	refuse("destinations:\n  p: { type: smtp }\n",
		   "destinations.p.type: expected one of http, rabbitmq, kafka, nats, got \"smtp\" (line 2, column 14)", NULL);
	refuse("destinations:\n  p: { type: http, baseUrl: \"http://h\", timeoutMs: 600001 }\n",
		   "destinations.p.timeoutMs: expected an integer from 1 to 600000", NULL);
	refuse("destinations:\n  p: { type: http, baseUrl: \"http://h\", path: events }\n",
		   "destinations.p.path: must start with '/'", NULL);
	refuse("destinations:\n  p: { type: http, baseUrl: \"http://h\", path: \"/a?b=1\" }\n",
		   "destinations.p.path: must not contain", NULL);
	refuse("destinations:\n  p: { type: http, baseUrl: \"http://h\", headers: [a] }\n",
		   "destinations.p.headers: expected a mapping", NULL);
	refuse("destinations:\n  p: { type: http, baseUrl: \"http://h\", headers: { \"X Key\": v } }\n",
		   "destinations.p.headers[\"X Key\"]: not a valid HTTP header name", NULL);
	refuse("destinations:\n  p: { type: http, baseUrl: \"http://h\", headers: { \"X:K\": v } }\n",
		   "not a valid HTTP header name", NULL);
	refuse("destinations:\n  p: { type: http, baseUrl: \"http://h\", headers: { X-K: \"a\\r\\nX-Evil: 1\" } }\n",
		   "destinations.p.headers.X-K: the header value contains a line break", NULL);
	refuse("destinations:\n  p: { type: http, baseUrl: \"http://h\", headers: { X-K: { a: 1 } } }\n",
		   "destinations.p.headers.X-K: expected a string, got a mapping", NULL);
	refuse("destinations:\n  log: { type: kafka, brokers: h, config: { \"linger.ms\": [5] } }\n",
		   "destinations.log.config[\"linger.ms\"]: expected a string", NULL);
	refuse("destinations:\n  log: { type: kafka, brokers: h, topic: \"\" }\n",
		   "destinations.log.topic: must not be empty", NULL);
	refuse("destinations:\n  \"pay ments\": { type: nats, url: \"nats://h\" }\n",
		   "destinations[\"pay ments\"]: a destination name may use only letters, digits, '_' and '-'", NULL);
	refuse("destinations:\n  \"a.b\": { type: nats, url: \"nats://h\" }\n",
		   "destinations[\"a.b\"]: a destination name", NULL);
	refuse("outbox: { batchSize: \"1\\02\" }\n", "outbox.batchSize: the value contains a NUL character", NULL);
}

static void
test_routes_validation(void **state)
{
	static const char *const bad[] = {"a..b", ".a", "a.", "a*", "*a", "**x", "a.***", "", "a b"};
	char		doc[256];
	size_t		i;

	refuse("destinations:\n  payments: { type: http, baseUrl: \"http://h\" }\n"
		   "  bus: { type: rabbitmq, url: \"amqp://h\", exchange: e }\n"
		   "routes:\n  - topicPattern: \"**\"\n    destination: nope\n",
		   "routes[0].destination: unknown destination \"nope\" (defined: payments, bus) (line 6, column 18)", NULL);
	refuse("routes:\n  - { topicPattern: a, destination: x }\n",
		   "routes[0].destination: unknown destination \"x\" (no destination is defined", NULL);
	for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
	{
		snprintf(doc, sizeof(doc),
				 "destinations: { p: { type: nats, url: \"nats://h\" } }\n"
				 "routes:\n  - { topicPattern: a, destination: p }\n"
				 "  - topicPattern: \"%s\"\n    destination: p\n", bad[i]);
		refuse(doc, "routes[1].topicPattern: ", "(line 4, column 19)", NULL);
	}
	refuse("destinations: { p: { type: nats, url: \"nats://h\" } }\nroutes:\n  - { topicPattern: \"a..b\", destination: p }\n",
		   "routes[0].topicPattern: segment 2 is empty", NULL);
	refuse("destinations: { p: { type: nats, url: \"nats://h\" } }\nroutes:\n  - { topicPattern: \"a.b*\", destination: p }\n",
		   "routes[0].topicPattern: segment 2 \"b*\" mixes '*' with other text", NULL);
}

/* ---- refusals: the YAML itself ------------------------------------ */

static void
test_yaml_errors(void **state)
{
	char		err[QB_ERRLEN];

	refuse("outbox: [1, 2\n", "YAML syntax error at line ", NULL);
	refuse("outbox:\n  batchSize: 1\n bad: 2\n", "YAML syntax error at line 3, column 2: ", NULL);
	refuse("a: b: c\n", "YAML syntax error at line 1, column 5: mapping values are not allowed in this context", NULL);
	refuse("outbox:\n\tbatchSize: 1\n", "YAML syntax error at line 2, column 1", NULL);
	/* invalid UTF-8: libyaml reports a byte offset; we report where */
	refuse("outbox:\n  retention: \"\xff\"\n",
		   "YAML syntax error at line 2, column 15: invalid leading UTF-8 octet (0xFF)",
		   "must be UTF-8", NULL);
	refuse("# caf\xc3\xa9\nroutes: \"\xc3\"\n", "YAML syntax error at line 2, column 11: invalid trailing UTF-8 octet (0x22)", NULL);
	refuse("outbox: \"\xc0\xaf\"\n", "YAML syntax error at line 1, column 10", NULL);
	/* columns count characters, not bytes */
	refuse("outbox: { retention: \"caf\xc3\xa9\xff\" }\n",
		   "YAML syntax error at line 1, column 27: invalid leading UTF-8 octet (0xFF)", NULL);
	refuse("outbox: \"a\x01\"\n", "YAML syntax error at line 1, column 11: control characters are not allowed", NULL);
	/* a UTF-16 byte order mark: the document must be UTF-8 */
	refuse("\xff\xfeo\0u\0", "YAML syntax error at line 1, column 1", NULL);
	/* a UTF-8 BOM is fine */
	qb_config_free(accept("\xef\xbb\xbfoutbox: { batchSize: 3 }\n"));

	refuse("- a\n- b\n", "the document must be a mapping with the keys outbox, destinations, routes, sources, inbox, http, admin, database, daemon, egress and telemetry, got a sequence (line 1, column 1)", NULL);
	refuse("hello\n", "the document must be a mapping", "got a scalar", NULL);
	refuse("outbox: {}\n---\nroutes: []\n", "a second YAML document starts at line 2", NULL);

	/* aliases are refused where they are written */
	refuse("outbox: &o { batchSize: 1 }\ndestinations: *o\n",
		   "YAML alias \"*o\" at line 2, column 15: aliases are not supported", NULL);
	refuse("a: &a [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n"
		   "b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\n"
		   "c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\n"
		   "d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]\n"
		   "e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]\n"
		   "f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]\n"
		   "g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]\n"
		   "outbox: *g\n",
		   "YAML alias \"*a\" at line 2, column 8", NULL);
	/* an anchor without an alias is harmless */
	qb_config_free(accept("outbox: &o { batchSize: 2 }\n"));

	/* nesting that no valid document has */
	{
		char		deep[400];
		int			i;

		for (i = 0; i < 150; i++)
			deep[i] = '[';
		for (; i < 300; i++)
			deep[i] = ']';
		deep[300] = '\0';
		refused_message(deep, err, sizeof(err));
		assert_non_null(strstr(err, "YAML nesting deeper than 64 levels"));
	}
}

/* ---- ${NAME} ------------------------------------------------------ */

static void
test_expand_env_direct(void **state)
{
	static const struct
	{
		const char *in;
		const char *out;
	}			ok[] = {
		{"", ""}, {"plain", "plain"}, {"${QB_T_A}", "alpha"}, {"x${QB_T_A}y${QB_T_A}z", "xalphayalphaz"},
		{"$${QB_T_A}", "${QB_T_A}"}, {"$$", "$$"}, {"$", "$"}, {"a$b", "a$b"}, {"$$${QB_T_A}", "$${QB_T_A}"},
		{"${QB_T_EMPTY}", ""}, {"${QB_T_REF}", "${QB_T_A}"},	/* one pass only */
		{"${_x1}", "u"}, {"}{", "}{"},
	};
	static const struct
	{
		const char *in;
		const char *msg;
	}			bad[] = {
		{"${QB_T_UNSET}", "environment variable QB_T_UNSET is not set"},
		{"${QB_T_A", "unterminated ${ reference"},
		{"abc ${", "unterminated ${ reference"},
		{"${}", "bad variable name in \"${}\""},
		{"${1A}", "bad variable name in \"${1A}\""},
		{"${A-B}", "bad variable name"},
		{"${A:-x}", "bad variable name"},
	};
	char		err[QB_ERRLEN];
	size_t		i;

	setenv("QB_T_A", "alpha", 1);
	setenv("QB_T_EMPTY", "", 1);
	setenv("QB_T_REF", "${QB_T_A}", 1);
	setenv("_x1", "u", 1);
	unsetenv("QB_T_UNSET");
	for (i = 0; i < sizeof(ok) / sizeof(ok[0]); i++)
	{
		char	   *s = qb_expand_env(ok[i].in, &test_env, err, sizeof(err));

		if (s == NULL)
			fail_msg("%s: %s", ok[i].in, err);
		assert_string_equal(s, ok[i].out);
		free(s);
	}
	for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
	{
		err[0] = '\0';
		assert_null(qb_expand_env(bad[i].in, &test_env, err, sizeof(err)));
		if (strstr(err, bad[i].msg) == NULL)
			fail_msg("%s: \"%s\" lacks \"%s\"", bad[i].in, err, bad[i].msg);
	}
	unsetenv("QB_T_A");
	unsetenv("QB_T_EMPTY");
	unsetenv("QB_T_REF");
	unsetenv("_x1");
}

static void
test_expand_env_in_document(void **state)
{
	QbConfig   *c;
	char		err[QB_ERRLEN];

	setenv("QB_T_BATCH", "42", 1);
	setenv("QB_T_HOST", "127.0.0.1:9000", 1);
	setenv("QB_T_KEY", "s3cr3t-value", 1);
	c = accept("outbox:\n  batchSize: ${QB_T_BATCH}\n"
			   "destinations:\n  payments:\n    type: http\n    baseUrl: \"http://${QB_T_HOST}\"\n"
			   "    path: /a/$${QB_T_BATCH}/b\n"
			   "    headers: { X-Api-Key: \"Bearer ${QB_T_KEY}\" }\n"
			   "  log: { type: kafka, brokers: h, config: { \"sasl.password\": \"${QB_T_KEY}\" } }\n");
	assert_int_equal(c->outbox.batch_size, 42);
	assert_string_equal(c->destinations[0].url, "http://127.0.0.1:9000/a/${QB_T_BATCH}/b");
	assert_string_equal(c->destinations[0].headers[0].value, "Bearer s3cr3t-value");
	assert_string_equal(c->destinations[1].props[0].value, "s3cr3t-value");
	qb_config_free(c);
	/* keys are not expanded: librdkafka is asked about the name as written */
	refuse("destinations:\n  log: { type: kafka, brokers: h, config: { \"${QB_T_KEY}\": x } }\n",
		   "destinations.log.config.${QB_T_KEY}: librdkafka refused it: No such configuration property", NULL);

	/* expansion happens before the type check */
	setenv("QB_T_BATCH", "lots", 1);
	refuse("outbox:\n  batchSize: ${QB_T_BATCH}\n",
		   "outbox.batchSize: expected an integer from 1 to 10000, got \"lots\" (line 2, column 14)", NULL);

	unsetenv("QB_T_UNSET");
	refuse("destinations:\n  payments:\n    type: http\n    baseUrl: \"http://h\"\n"
		   "    headers: { X-Api-Key: \"${QB_T_UNSET}\" }\n",
		   "destinations.payments.headers.X-Api-Key: environment variable QB_T_UNSET is not set",
		   "(line 5, column 27)", NULL);
	refuse("outbox:\n  retention: \"${QB_T_BATCH\"\n", "outbox.retention: unterminated ${ reference", NULL);

	/* a secret that makes the value invalid is not echoed */
	setenv("QB_T_KEY", "s3cr3t\r\nX-Evil: 1", 1);
	refused_message("destinations:\n  p: { type: http, baseUrl: \"http://h\", headers: { X-K: \"${QB_T_KEY}\" } }\n",
					err, sizeof(err));
	assert_non_null(strstr(err, "destinations.p.headers.X-K: the header value contains a line break"));
	assert_null(strstr(err, "s3cr3t"));
	setenv("QB_T_KEY", "http://user:s3cr3t@h", 1);
	refused_message("destinations:\n  p: { type: http, baseUrl: \"${QB_T_KEY}\" }\n", err, sizeof(err));
	assert_non_null(strstr(err, "destinations.p.baseUrl: user info"));
	assert_null(strstr(err, "s3cr3t"));

	unsetenv("QB_T_BATCH");
	unsetenv("QB_T_HOST");
	unsetenv("QB_T_KEY");
}

/* ---- ${file:PATH} ------------------------------------------------ */

/* a private directory of secret files: mkdtemp, removed at the end */
static char file_dir[64];
static char file_other[64];

static void
write_file(const char *dir, const char *name, const char *content, size_t len)
{
	char		path[256];
	FILE	   *f;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	f = fopen(path, "w");
	assert_non_null(f);
	assert_int_equal(fwrite(content, 1, len, f), len);
	fclose(f);
}

static void
expect_expand(const char *in, const char *out)
{
	char		err[QB_ERRLEN] = "";
	char	   *s = qb_expand_env(in, &test_env, err, sizeof(err));

	if (s == NULL)
		fail_msg("%s: %s", in, err);
	assert_string_equal(s, out);
	free(s);
}

/* expect_refused: refused with every string of the NULL-terminated list in the message */
static void
expect_refused(const char *in,...)
{
	char		err[QB_ERRLEN] = "";
	const char *want;
	va_list		ap;

	assert_null(qb_expand_env(in, &test_env, err, sizeof(err)));
	va_start(ap, in);
	while ((want = va_arg(ap, const char *)) != NULL)
		if (strstr(err, want) == NULL)
			fail_msg("%s: \"%s\" lacks \"%s\"", in, err, want);
	va_end(ap);
	/* no message repeats a file's content */
	assert_null(strstr(err, "s3cr3t"));
}

static void
test_expand_file(void **state)
{
	char		in[512];
	char		want[512];
	char		dirs[256];
	char		big[70000];

	strcpy(file_dir, "/tmp/qb-test-secrets-XXXXXX");
	strcpy(file_other, "/tmp/qb-test-other-XXXXXX");
	assert_non_null(mkdtemp(file_dir));
	assert_non_null(mkdtemp(file_other));
	write_file(file_dir, "github", "s3cr3t-gh\n", 10);
	write_file(file_dir, "crlf", "s3cr3t-w\r\n", 10);
	write_file(file_dir, "two", "s3cr3t-2\n\n", 10);
	write_file(file_dir, "bare", "s3cr3t-b", 8);
	write_file(file_dir, "empty", "", 0);
	write_file(file_dir, "nul", "s3cr3t\0x", 8);
	memset(big, 'a', sizeof(big));
	write_file(file_dir, "big", big, sizeof(big));
	write_file(file_other, "outside", "s3cr3t-out\n", 11);
	snprintf(in, sizeof(in), "%s/link", file_dir);
	snprintf(want, sizeof(want), "%s/outside", file_other);
	assert_int_equal(symlink(want, in), 0);
	snprintf(in, sizeof(in), "%s/inlink", file_dir);
	assert_int_equal(symlink("github", in), 0);

	/* the extension's setting: absolute directories only */
	assert_true(qb_config_file_dirs_valid(""));
	assert_true(qb_config_file_dirs_valid("/run/secrets, /etc/queuebox/,"));
	assert_false(qb_config_file_dirs_valid("/run/secrets,secrets"));

	/* the default allows no file, and says so without looking at it */
	test_set_file_dirs("", NULL);
	snprintf(in, sizeof(in), "${file:%s/github}", file_dir);
	expect_refused(in, "file reference ${file:", "/github}: file references are not allowed here", NULL);
	test_set_file_dirs("", "queuebox.secret_file_dirs");
	expect_refused(in, "no directory is allowed for secret files",
				   "a superuser sets queuebox.secret_file_dirs", NULL);

	/* allowed: one trailing newline goes, the rest stays */
	snprintf(dirs, sizeof(dirs), "/nonexistent/dir, %s/", file_dir);
	test_set_file_dirs(dirs, "queuebox.secret_file_dirs");
	expect_expand(in, "s3cr3t-gh");
	snprintf(in, sizeof(in), "Bearer ${file:%s/crlf}!", file_dir);
	expect_expand(in, "Bearer s3cr3t-w!");
	snprintf(in, sizeof(in), "${file:%s/two}", file_dir);
	expect_expand(in, "s3cr3t-2\n");
	snprintf(in, sizeof(in), "${file:%s/bare}${file:%s/empty}", file_dir, file_dir);
	expect_expand(in, "s3cr3t-b");
	snprintf(in, sizeof(in), "${file:%s/inlink}", file_dir);
	expect_expand(in, "s3cr3t-gh");
	/* $${file: stays literal; ${NAME} in the path is expanded first */
	expect_expand("$${file:/x}", "${file:/x}");
	setenv("QB_T_CREDS", file_dir, 1);
	expect_expand("${file:${QB_T_CREDS}/github}", "s3cr3t-gh");

	/* refused: outside (as written, through a symlink or ..), missing, not a file */
	snprintf(in, sizeof(in), "${file:%s/outside}", file_other);
	expect_refused(in, "/outside is outside the directories queuebox.secret_file_dirs allows", NULL);
	snprintf(in, sizeof(in), "${file:%s/link}", file_dir);
	snprintf(want, sizeof(want), "%s/outside is outside the directories", file_other);
	expect_refused(in, want, NULL);
	snprintf(in, sizeof(in), "${file:%s/../%s/outside}", file_dir, file_other + 5);
	expect_refused(in, "write an absolute path without \".\" or \"..\"", NULL);
	expect_refused("${file:relative/path}", "write an absolute path", NULL);
	expect_refused("${file:}", "write an absolute path", NULL);
	snprintf(in, sizeof(in), "${file:%s/missing}", file_dir);
	expect_refused(in, "/missing}: No such file or directory", NULL);
	snprintf(in, sizeof(in), "${file:%s}", file_dir);
	expect_refused(in, "is outside the directories", NULL);
	snprintf(in, sizeof(in), "${file:%s/nul}", file_dir);
	expect_refused(in, "the file contains a NUL byte", NULL);
	snprintf(in, sizeof(in), "${file:%s/big}", file_dir);
	expect_refused(in, "the file is larger than 65536 bytes", NULL);
	expect_refused("${file:/etc/passwd", "unterminated ${file: reference", NULL);
	expect_refused("${file:${file:/x}}", "a file reference cannot hold another one", NULL);
	unsetenv("QB_T_UNSET");
	expect_refused("${file:${QB_T_UNSET}/x}", "environment variable QB_T_UNSET is not set", NULL);
	/* a variable's value never shows: the reference is shown as written */
	setenv("QB_T_SECRETV", "s3cr3t-var", 1);
	expect_refused("${file:%s/../${QB_T_SECRETV}}", "${file:%s/../${QB_T_SECRETV}}: write an absolute path", NULL);
	expect_refused("${file:${QB_T_CREDS}/${QB_T_SECRETV}}",
				   "${file:${QB_T_CREDS}/${QB_T_SECRETV}}: No such file or directory", NULL);
	setenv("QB_T_SECRETV", file_other + 1, 1);	/* no leading '/': the path is /${...} */
	expect_refused("${file:/${QB_T_SECRETV}/outside}",
				   "${file:/${QB_T_SECRETV}/outside}: the file is outside the directories", NULL);
	{
		char		err[QB_ERRLEN] = "";

		assert_null(qb_expand_env("${file:/${QB_T_SECRETV}/outside}", &test_env, err, sizeof(err)));
		assert_null(strstr(err, file_other + 1));
	}
	unsetenv("QB_T_SECRETV");

	/* any path (the daemon) */
	test_set_file_dirs(NULL, NULL);
	snprintf(in, sizeof(in), "${file:%s/outside}", file_other);
	expect_expand(in, "s3cr3t-out");
	test_set_file_dirs("", NULL);
	unsetenv("QB_T_CREDS");
}

/*
 * refused_file_doc: the document fmt, its %s the directory of secret
 * files, is refused with want in the message and no file content.
 */
static void
refused_file_doc(const char *fmt, const char *want)
{
	char		doc[1024];
	char		err[QB_ERRLEN];

	snprintf(doc, sizeof(doc), fmt, file_dir);
	refused_message(doc, err, sizeof(err));
	if (strstr(err, want) == NULL)
		fail_msg("\"%s\" lacks \"%s\"", err, want);
	assert_null(strstr(err, "s3cr3t"));
}

static void
test_expand_file_in_document(void **state)
{
	char		doc[1024];
	QbConfig   *c;

	test_set_file_dirs(file_dir, "queuebox.secret_file_dirs");
	snprintf(doc, sizeof(doc),
			 "destinations:\n  p: { type: http, baseUrl: \"http://h\", headers: { X-K: \"${file:%s/github}\" } }\n",
			 file_dir);
	c = accept(doc);
	assert_string_equal(c->destinations[0].headers[0].value, "s3cr3t-gh");
	qb_config_free(c);
	/* the key path and the line, the file, never the content */
	snprintf(doc, sizeof(doc),
			 "destinations:\n  p: { type: http, baseUrl: \"http://h\", headers: { X-K: \"${file:%s/outside}\" } }\n",
			 file_other);
	refuse(doc, "destinations.p.headers.X-K: file reference ${file:", "/outside}: ", "(line 2", NULL);
	/* a value made invalid by the file: the message says what is wrong, no content */
	refused_file_doc("destinations:\n  p: { type: http, baseUrl: \"http://h\", headers: { X-K: \"${file:%s/crlf}x\\r\\n\" } }\n",
					 "destinations.p.headers.X-K: the header value contains a line break");
	/* a number or a name from a file is not echoed either (one from a variable is) */
	refused_file_doc("outbox:\n  batchSize: \"${file:%s/github}\"\n",
					 "outbox.batchSize: expected an integer from 1 to 10000, got the content of a file (not repeated");
	refused_file_doc("destinations:\n  p: { type: \"${file:%s/github}\" }\n", "destinations.p.type: expected");
	/* a check that would quote part of it (a URL's scheme) says so instead */
	refused_file_doc("destinations:\n  p: { type: http, baseUrl: \"${file:%s/github}://h\" }\n",
					 "destinations.p.baseUrl: the value, read from a file, is not valid here; the message is not shown");
	test_set_file_dirs("", NULL);
}

/* test_expand_file_cleanup: the files and directories of the two tests above */
static void
test_expand_file_cleanup(void **state)
{
	static const char *const names[] = {"github", "crlf", "two", "bare", "empty", "nul", "big", "link", "inlink"};
	char		path[256];

	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
	{
		snprintf(path, sizeof(path), "%s/%s", file_dir, names[i]);
		unlink(path);
	}
	snprintf(path, sizeof(path), "%s/outside", file_other);
	unlink(path);
	assert_int_equal(rmdir(file_dir), 0);
	assert_int_equal(rmdir(file_other), 0);
}

/* ---- QUEUEBOX_* overrides ----------------------------------------- */

static const char override_doc[] =
"outbox:\n"
"  batchSize: 100\n"
"destinations:\n"
"  payments:\n"
"    type: http\n"
"    baseUrl: \"http://127.0.0.1:9000\"\n"
"    headers: { X-Api-Key: doc-key }\n"
"  bus: { type: rabbitmq, url: \"amqp://h\", exchange: e }\n"
"  my-api: { type: http, baseUrl: \"http://h\" }\n"
"routes:\n"
"  - topicPattern: \"orders.**\"\n"
"    destination: payments\n";

static void
test_overrides_valid(void **state)
{
	QbConfig   *c;

	/* ignored: not a key, and the test settings */
	setenv("QUEUEBOX_TEST_SOMETHING", "x", 1);
	setenv("QUEUEBOX_NOPE", "x", 1);
	setenv("QUEUEBOX_OUTBOX_NOPE", "x", 1);
	setenv("QUEUEBOX_DESTINATIONS_GHOST_BASEURL", "x", 1);
	setenv("QUEUEBOX_ROUTES_7_DESTINATION", "x", 1);
	setenv("QUEUEBOX_OUTBOX", "x", 1);	/* a mapping, not a scalar */

	setenv("QUEUEBOX_OUTBOX_BATCHSIZE", "7", 1);
	setenv("QUEUEBOX_outbox_maxAttempts", "3", 1);	/* case is ignored */
	setenv("QUEUEBOX_OUTBOX_BACKOFF_INITIALMS", "250", 1);	/* backoff: created */
	setenv("QUEUEBOX_OUTBOX_RETENTION", "2h", 1);
	setenv("QUEUEBOX_DESTINATIONS_PAYMENTS_BASEURL", "https://example.com/base", 1);
	setenv("QUEUEBOX_DESTINATIONS_PAYMENTS_PATH", "/in", 1);
	setenv("QUEUEBOX_DESTINATIONS_PAYMENTS_HEADERS_X_API_KEY", "${NOT_EXPANDED}", 1);
	setenv("QUEUEBOX_DESTINATIONS_MY_API_TIMEOUTMS", "1234", 1);
	setenv("QUEUEBOX_DESTINATIONS_BUS_PERSISTENT", "false", 1);
	setenv("QUEUEBOX_ROUTES_0_DESTINATION", "bus", 1);
	setenv("QUEUEBOX_ROUTES_0_TOPICPATTERN", "**", 1);

	c = accept(override_doc);
	assert_int_equal(c->outbox.batch_size, 7);
	assert_int_equal(c->outbox.max_attempts, 3);
	assert_int_equal(c->outbox.backoff.initial_ms, 250);
	assert_int_equal(c->outbox.backoff.max_ms, 3600000);
	assert_int_equal(c->outbox.retention_sec, 7200);
	assert_string_equal(c->destinations[0].url, "https://example.com/base/in");
	assert_string_equal(c->destinations[0].headers[0].value, "${NOT_EXPANDED}");
	assert_int_equal(c->destinations[2].timeout_ms, 1234);
	assert_false(c->destinations[1].persistent);
	assert_string_equal(c->routes[0].destination, "bus");
	assert_int_equal(c->routes[0].dest_index, 1);
	assert_string_equal(c->routes[0].topic_pattern, "**");
	qb_config_free(c);

	/* an empty document takes outbox overrides too */
	c = accept("");
	assert_int_equal(c->outbox.batch_size, 7);
	assert_int_equal(c->outbox.backoff.initial_ms, 250);
	assert_int_equal(c->ndestinations, 0);
	qb_config_free(c);
	/* and so does a null outbox: */
	c = accept("outbox:\n");
	assert_int_equal(c->outbox.batch_size, 7);
	qb_config_free(c);

	unsetenv("QUEUEBOX_TEST_SOMETHING");
	unsetenv("QUEUEBOX_NOPE");
	unsetenv("QUEUEBOX_OUTBOX_NOPE");
	unsetenv("QUEUEBOX_DESTINATIONS_GHOST_BASEURL");
	unsetenv("QUEUEBOX_ROUTES_7_DESTINATION");
	unsetenv("QUEUEBOX_OUTBOX");
	unsetenv("QUEUEBOX_OUTBOX_BATCHSIZE");
	unsetenv("QUEUEBOX_outbox_maxAttempts");
	unsetenv("QUEUEBOX_OUTBOX_BACKOFF_INITIALMS");
	unsetenv("QUEUEBOX_OUTBOX_RETENTION");
	unsetenv("QUEUEBOX_DESTINATIONS_PAYMENTS_BASEURL");
	unsetenv("QUEUEBOX_DESTINATIONS_PAYMENTS_PATH");
	unsetenv("QUEUEBOX_DESTINATIONS_PAYMENTS_HEADERS_X_API_KEY");
	unsetenv("QUEUEBOX_DESTINATIONS_MY_API_TIMEOUTMS");
	unsetenv("QUEUEBOX_DESTINATIONS_BUS_PERSISTENT");
	unsetenv("QUEUEBOX_ROUTES_0_DESTINATION");
	unsetenv("QUEUEBOX_ROUTES_0_TOPICPATTERN");

	/* with the variables gone, the document's values are back */
	c = accept(override_doc);
	assert_int_equal(c->outbox.batch_size, 100);
	assert_string_equal(c->destinations[0].url, "http://127.0.0.1:9000");
	qb_config_free(c);
}

static void
test_overrides_invalid(void **state)
{
	char		err[QB_ERRLEN];

	setenv("QUEUEBOX_OUTBOX_BATCHSIZE", "many", 1);
	refuse(override_doc,
		   "QUEUEBOX_OUTBOX_BATCHSIZE (outbox.batchSize): expected an integer from 1 to 10000, got \"many\"", NULL);
	refuse("", "QUEUEBOX_OUTBOX_BATCHSIZE (outbox.batchSize): expected an integer", NULL);
	/* two variables for one key */
	setenv("QUEUEBOX_Outbox_BatchSize", "5", 1);
	refuse(override_doc, "both set outbox.batchSize: unset one of them", NULL);
	unsetenv("QUEUEBOX_Outbox_BatchSize");
	unsetenv("QUEUEBOX_OUTBOX_BATCHSIZE");

	setenv("QUEUEBOX_OUTBOX_BACKOFF_MAXMS", "10", 1);
	refuse(override_doc, "QUEUEBOX_OUTBOX_BACKOFF_MAXMS (outbox.backoff.maxMs): must be at least initialMs (1000), got 10", NULL);
	unsetenv("QUEUEBOX_OUTBOX_BACKOFF_MAXMS");

	setenv("QUEUEBOX_DESTINATIONS_PAYMENTS_BASEURL", "ftp://user:s3cr3t@x", 1);
	refused_message(override_doc, err, sizeof(err));
	assert_non_null(strstr(err, "QUEUEBOX_DESTINATIONS_PAYMENTS_BASEURL (destinations.payments.baseUrl): unsupported scheme \"ftp\""));
	assert_null(strstr(err, "s3cr3t"));
	unsetenv("QUEUEBOX_DESTINATIONS_PAYMENTS_BASEURL");

	/* a key of another destination type: a stale override is noticed */
	setenv("QUEUEBOX_DESTINATIONS_PAYMENTS_EXCHANGE", "e", 1);
	refuse(override_doc,
		   "QUEUEBOX_DESTINATIONS_PAYMENTS_EXCHANGE (destinations.payments.exchange): unknown key for an http destination",
		   NULL);
	unsetenv("QUEUEBOX_DESTINATIONS_PAYMENTS_EXCHANGE");

	setenv("QUEUEBOX_ROUTES_0_DESTINATION", "nope", 1);
	refuse(override_doc,
		   "QUEUEBOX_ROUTES_0_DESTINATION (routes[0].destination): unknown destination \"nope\" (defined: payments, bus, my-api)",
		   NULL);
	unsetenv("QUEUEBOX_ROUTES_0_DESTINATION");

	setenv("QUEUEBOX_DESTINATIONS_BUS_MANDATORY", "TRUE", 1);
	refuse(override_doc, "QUEUEBOX_DESTINATIONS_BUS_MANDATORY (destinations.bus.mandatory): expected true or false, got \"TRUE\"", NULL);
	unsetenv("QUEUEBOX_DESTINATIONS_BUS_MANDATORY");

	/* one name for two paths */
	setenv("QUEUEBOX_DESTINATIONS_A_B_TYPE", "nats", 1);
	refuse("destinations:\n  a-b: { type: nats, url: \"nats://h\" }\n  a_b: { type: nats, url: \"nats://h\" }\n",
		   "QUEUEBOX_DESTINATIONS_A_B_TYPE matches both destinations.a-b.type and destinations.a_b.type", NULL);
	unsetenv("QUEUEBOX_DESTINATIONS_A_B_TYPE");

	/* an override does not hide a document that is not a mapping */
	setenv("QUEUEBOX_OUTBOX_BATCHSIZE", "5", 1);
	refuse("- 1\n", "the document must be a mapping", NULL);
	refuse("outbox: 5\n", "outbox: expected a mapping", NULL);
	unsetenv("QUEUEBOX_OUTBOX_BATCHSIZE");
}

/* ---- URLs ------------------------------------------------------------ */

static void
test_url_check(void **state)
{
	static const char *const good[] = {
		"http://127.0.0.1:9000", "https://example.com/base", "HTTPS://Example.COM", "http://h:1",
		"http://h:65535/a/b/", "http://[::1]:8080/x", "http://[::1]", "http://my_host.local",
	};
	static const struct
	{
		const char *url;
		const char *msg;
	}			bad[] = {
		{"ftp://x", "unsupported scheme \"ftp\" (use http or https)"},
		{"http://", "no host after \"http://\""},
		{"http:///path", "no host"},
		{"http://host:0", "the port must be a number from 1 to 65535"},
		{"http://host:99999", "the port must be a number from 1 to 65535"},
		{"http://host:", "the port must be"},
		{"http://host:80x", "the port must be"},
		{"http://host:99999999999999999999", "the port must be"},
		{"http://user@host", "user info (user@ or user:password@) is not allowed"},
		{"http://user:pw@host", "user info"},
		{"http://h/p?q=1", "a query string (?...) is not allowed"},
		{"http://h?q", "a query string"},
		{"http://h/p#frag", "a fragment"},
		{"not a url", "not a URL"},
		{"not-a-url", "not a URL"},
		{"", "not a URL"},
		{"://h", "not a URL"},
		{"http://h h", "space"},
		{"http://h\n", "control character"},
		{"http://ho$t", "invalid character in the host name"},
		{"http://[::1", "closing ']'"},
		{"http://[zz]", "IPv6"},
		{"http://[::1]x", "after the IPv6 host"},
	};
	char		err[QB_ERRLEN];
	size_t		i;

	for (i = 0; i < sizeof(good) / sizeof(good[0]); i++)
		if (!qb_url_check(good[i], err, sizeof(err)))
			fail_msg("%s refused: %s", good[i], err);
	for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
	{
		err[0] = '\0';
		if (qb_url_check(bad[i].url, err, sizeof(err)))
			fail_msg("%s accepted", bad[i].url);
		if (strstr(err, bad[i].msg) == NULL)
			fail_msg("%s: \"%s\" lacks \"%s\"", bad[i].url, err, bad[i].msg);
	}

	/* the message never repeats the URL: it may hold a password */
	assert_false(qb_url_check("http://u:s3cr3t@h", err, sizeof(err)));
	assert_null(strstr(err, "s3cr3t"));

	/* the scheme-aware form */
	{
		static const char *const amqp[] = {"amqp", "amqps", NULL};

		assert_true(qb_url_check_scheme("amqp://guest:guest@127.0.0.1:5672/", amqp,
										QB_URL_USERINFO | QB_URL_QUERY, err, sizeof(err)));
		assert_true(qb_url_check_scheme("amqps://h/vhost?heartbeat=10", amqp,
										QB_URL_USERINFO | QB_URL_QUERY, err, sizeof(err)));
		assert_false(qb_url_check_scheme("amqp://u:p@h", amqp, 0, err, sizeof(err)));
		assert_non_null(strstr(err, "user info"));
		assert_false(qb_url_check_scheme("http://h", amqp, QB_URL_USERINFO, err, sizeof(err)));
		assert_non_null(strstr(err, "unsupported scheme \"http\" (use amqp or amqps)"));
		assert_false(qb_url_check_scheme("amqp://u:s3cr3t@h:0/", amqp, QB_URL_USERINFO, err, sizeof(err)));
		assert_non_null(strstr(err, "port"));
		assert_null(strstr(err, "s3cr3t"));
	}

	/* the same checks reached through a document */
	refuse("destinations:\n  p: { type: http, baseUrl: \"http://h/p?q=1\" }\n",
		   "destinations.p.baseUrl: a query string", "(line 2, column 29)", NULL);
	refuse("destinations:\n  p: { type: http, baseUrl: \"\" }\n", "destinations.p.baseUrl: not a URL", NULL);
	refuse("destinations:\n  b: { type: rabbitmq, url: \"http://h\", exchange: e }\n",
		   "destinations.b.url: unsupported scheme \"http\" (use amqp or amqps)", NULL);
	refuse("destinations:\n  n: { type: nats, url: \"amqp://h\" }\n",
		   "destinations.n.url: unsupported scheme \"amqp\" (use nats or tls)", NULL);
	refuse("destinations:\n  n: { type: nats, url: \"nats://a:1,\" }\n", "destinations.n.url: empty entry", NULL);
	refuse("destinations:\n  n: { type: nats, url: \"nats://a:1,nats://b:0\" }\n", "destinations.n.url: the port", NULL);
	refuse("destinations:\n  k: { type: kafka, brokers: \"a:9092,,b\" }\n", "destinations.k.brokers: empty entry", NULL);
	refuse("destinations:\n  k: { type: kafka, brokers: \"a:0\" }\n", "destinations.k.brokers: the port", NULL);
	refuse("destinations:\n  k: { type: kafka, brokers: \"\" }\n", "destinations.k.brokers: empty entry", NULL);
	refuse("destinations:\n  k: { type: kafka, brokers: \"a b\" }\n", "destinations.k.brokers: the broker list contains a space", NULL);
	qb_config_free(accept("destinations:\n  k: { type: kafka, brokers: \"SSL://a:9093,[::1]:9092,c\" }\n"));
}

/* A request must end before its lease: timeoutMs < claimTimeoutMs. */
static void
test_lease_outlasts_request(void **state)
{
	QbConfig   *c;

	refuse("destinations:\n  p: { type: http, baseUrl: \"http://h\", timeoutMs: 300000 }\n",
		   "destinations.p.timeoutMs:", "not less than outbox.claimTimeoutMs (300000 ms)",
		   "line 2", NULL);
	/* the default timeoutMs (10000) against a short lease points at the lease */
	refuse("outbox: { claimTimeoutMs: 5000 }\n"
		   "destinations:\n  p: { type: http, baseUrl: \"http://h\" }\n",
		   "outbox.claimTimeoutMs:", "waits up to 10000 ms", "line 1", NULL);
	c = accept("outbox: { claimTimeoutMs: 700000 }\n"
			   "destinations:\n  p: { type: http, baseUrl: \"http://h\", timeoutMs: 600000 }\n");
	assert_int_equal(c->destinations[0].timeout_ms, 600000);
	qb_config_free(c);
	/* brokers have no timeoutMs of this kind */
	c = accept("outbox: { claimTimeoutMs: 1000 }\n"
			   "destinations:\n  n: { type: nats, url: \"nats://127.0.0.1:4222\" }\n");
	qb_config_free(c);
	/* a nats subject is a template; jetstream can be turned off */
	c = accept("destinations:\n  n: { type: nats, url: \"nats://h\", jetstream: false,"
			   " subject: \"out.{{ topic }}.{{ key }}\" }\n");
	assert_string_equal(c->destinations[0].target, "out.{{ topic }}.{{ key }}");
	assert_false(c->destinations[0].jetstream);
	assert_false(c->destinations[0].create_stream);
	assert_null(c->destinations[0].stream);
	qb_config_free(c);
	/* createStream: the stream's name and subject from the destination's */
	c = accept("destinations:\n  ord-ers: { type: nats, url: \"nats://h\", createStream: true,"
			   " subject: \"shop.eu.{{ topic }}.x\" }\n"
			   "  fixed: { type: nats, url: \"nats://h\", createStream: \"true\", subject: audit.all }\n"
			   "  mid: { type: nats, url: \"nats://h\", createStream: true, subject: \"a.b-{{ key }}.c\" }\n");
	assert_true(c->destinations[0].create_stream);
	assert_string_equal(c->destinations[0].stream, "queuebox-ord-ers");
	assert_string_equal(c->destinations[0].stream_subject, "shop.eu.>");
	assert_string_equal(c->destinations[1].stream_subject, "audit.all");
	assert_string_equal(c->destinations[2].stream_subject, "a.>");
	qb_config_free(c);
	refuse("destinations:\n  n: { type: nats, url: \"nats://h\", createStream: true }\n",
		   "destinations.n.createStream: createStream needs a subject whose first token is literal",
		   "without subject the row's topic is the subject", NULL);
	refuse("destinations:\n  n: { type: nats, url: \"nats://h\", createStream: true, subject: \"x{{ topic }}.a\" }\n",
		   "destinations.n.createStream:", "this subject starts with a placeholder", NULL);
	refuse("destinations:\n  n: { type: nats, url: \"nats://h\", createStream: true, jetstream: false, subject: a }\n",
		   "destinations.n.createStream: createStream makes a JetStream stream", "jetstream: false", NULL);
	refuse("destinations:\n  n: { type: nats, url: \"nats://h\", createStream: true, subject: \"a..b.{{ topic }}\" }\n",
		   "destinations.n.createStream: createStream: the subject's literal part \"a..b.\" is not a valid NATS subject", NULL);
	refuse("destinations:\n  n: { type: nats, url: \"nats://h\", createStream: true, subject: \"a.*\" }\n",
		   "the subject's literal part \"a.*\" is not a valid NATS subject", NULL);
	refuse("destinations:\n  n: { type: nats, url: \"nats://h\", createStream: true, subject: \"a b.{{ topic }}\" }\n",
		   "has a space or control character", NULL);
	refuse("destinations:\n  n: { type: nats, url: \"nats://h\", createStream: yes, subject: a }\n",
		   "destinations.n.createStream: expected true or false, got \"yes\"", NULL);
	/* kafka: librdkafka's message.timeout.ms must end before the lease */
	refuse("outbox: {claimTimeoutMs: 20000}\ndestinations:\n  k: {type: kafka, brokers: \"h:9092\"}\n",
		   "outbox.claimTimeoutMs: destination k waits up to 30000 ms", "config[\"message.timeout.ms\"]", NULL);
	refuse("destinations:\n  k: {type: kafka, brokers: \"h:9092\", config: {message.timeout.ms: \"400000\"}}\n",
		   "destinations.k.config[\"message.timeout.ms\"]: destination k waits up to 400000 ms", NULL);
	c = accept("outbox: {claimTimeoutMs: 20000}\ndestinations:\n  k: {type: kafka, brokers: \"h:9092\","
			   " config: {message.timeout.ms: \"10000\"}}\n");
	qb_config_free(c);
}

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

#define SRC "sources:\n  s:\n    type: http\n    path: /s\n"

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

static void
test_inbox_http_admin_invalid(void **state)
{
	char		err[QB_ERRLEN];

	refuse("inbox: {basePath: inbox}\n", "inbox.basePath: must start with '/'", NULL);
	refuse("inbox: {relay: {batchSize: 0}}\n", "inbox.relay.batchSize: expected an integer from 1 to 10000", NULL);
	refuse("inbox: {relay: {enabled: maybe}}\n", "inbox.relay.enabled: expected true or false", NULL);
	refuse("inbox: {relay: {takeover: maybe}}\n", "inbox.relay.takeover: expected true or false, got \"maybe\"", NULL);
	refuse("outbox: {takeover: 1}\n", "outbox.takeover: expected true or false, got \"1\"", NULL);
	refuse("inbox: {relay: {pollMs: 1}}\n", "inbox.relay.pollMs: unknown key", NULL);
	refuse("inbox: {relay: {maxAttempts: 0}}\n", "inbox.relay.maxAttempts: expected an integer from 1 to 1000000", NULL);
	refuse("inbox: {relay: {claimTimeoutMs: 10}}\n", "inbox.relay.claimTimeoutMs", NULL);
	refuse("inbox: {queue: x}\n", "inbox.queue: unknown key (allowed: basePath, relay)", NULL);
	refuse("http: {listen: \"127.0.0.1\"}\n", "http.listen: expected host:port", NULL);
	refuse("http: {listen: \"127.0.0.1:0\"}\n", "http.listen:", "the port must be 1 to 65535", NULL);
	refuse("http: {listen: \"127.0.0.1:99999\"}\n", "the port must be 1 to 65535", NULL);
	refuse("http: {listen: \"example.com:80\"}\n", "http.listen:", "the host is not an IPv4 address", NULL);
	refuse("http: {listen: \"[::1:80\"}\n", "http.listen: expected host:port", NULL);
	refuse("http: {listen: \"[zz]:80\"}\n", "the part in brackets is not an IPv6 address", NULL);
	refuse("http: {maxConnections: 0}\n", "http.maxConnections: expected an integer from 1 to 10000", NULL);
	refuse("http: {connectionTimeoutMs: 5}\n", "http.connectionTimeoutMs", NULL);
	refuse("http: {port: 80}\n", "http.port: unknown key", NULL);
	refuse("admin: {token: short}\n", "admin.token: an admin token needs at least 16 characters", NULL);
	refuse("admin: {user: x}\n", "admin.user: unknown key (allowed: token)", NULL);

	/* secrets and tokens are never echoed */
	refused_message("admin: {token: s3cr3t}\n", err, sizeof(err));
	assert_null(strstr(err, "s3cr3t"));
	refused_message(SRC "    topic: t\n    auth: {type: standard-webhooks, secret: \"whsec_hunter2!!\"}\n",
					err, sizeof(err));
	assert_null(strstr(err, "hunter2"));
}

static void
test_overrides_inbox(void **state)
{
	QbConfig   *cfg;

	setenv("QUEUEBOX_HTTP_LISTEN", "127.0.0.1:18099", 1);
	setenv("QUEUEBOX_ADMIN_TOKEN", "from-the-environment-1234", 1);
	setenv("QUEUEBOX_INBOX_RELAY_BATCHSIZE", "7", 1);
	setenv("QUEUEBOX_SOURCES_GH_AUTH_SECRET", "rotated", 1);
	setenv("QUEUEBOX_SOURCES_GH_MAXBODYBYTES", "2048", 1);
	cfg = accept("sources:\n  gh:\n    type: http\n    path: /gh\n    idempotencyKeyHeader: X-GitHub-Delivery\n"
				 "    topic: gh\n    auth: {type: github, secret: old}\n");
	assert_string_equal(cfg->http.host, "127.0.0.1");
	assert_int_equal(cfg->http.port, 18099);
	assert_string_equal(cfg->admin_token, "from-the-environment-1234");
	assert_int_equal(cfg->inbox.relay.batch_size, 7);
	assert_string_equal(cfg->sources[0].auth.secrets[0], "rotated");
	assert_int_equal(cfg->sources[0].max_body_bytes, 2048);
	qb_config_free(cfg);
	setenv("QUEUEBOX_INBOX_RELAY_BATCHSIZE", "lots", 1);
	refuse("", "QUEUEBOX_INBOX_RELAY_BATCHSIZE (inbox.relay.batchSize): expected an integer", NULL);
	unsetenv("QUEUEBOX_HTTP_LISTEN");
	unsetenv("QUEUEBOX_ADMIN_TOKEN");
	unsetenv("QUEUEBOX_INBOX_RELAY_BATCHSIZE");
	unsetenv("QUEUEBOX_SOURCES_GH_AUTH_SECRET");
	unsetenv("QUEUEBOX_SOURCES_GH_MAXBODYBYTES");
}

/* kafka: config: is checked by librdkafka; QueueBox's own properties are refused. */
static void
test_kafka_destination(void **state)
{
	QbConfig   *c;

	c = accept("destinations:\n  k: { type: kafka, brokers: \"h:9092\", topic: \"events.{{ topic }}\",\n"
			   "       config: { \"linger.ms\": \"5\", acks: \"-1\", \"enable.idempotence\": \"true\" } }\n");
	assert_int_equal(c->destinations[0].timeout_ms, 30000);
	assert_string_equal(c->destinations[0].target, "events.{{ topic }}");
	qb_config_free(c);
	c = accept("destinations:\n  k: { type: kafka, brokers: h, config: { \"message.timeout.ms\": \"2000\" } }\n");
	assert_int_equal(c->destinations[0].timeout_ms, 2000);
	qb_config_free(c);
	refuse("destinations:\n  k: { type: kafka, brokers: h, topic: \"{{ subject }}\" }\n",
		   "destinations.k.topic: ", "subject", NULL);
	refuse("destinations:\n  k: { type: kafka, brokers: h, config: { \"linger.ms\": \"soon\" } }\n",
		   "destinations.k.config[\"linger.ms\"]: librdkafka refused it: ", NULL);
	refuse("destinations:\n  k: { type: kafka, brokers: h, config: { \"no.such.thing\": \"1\" } }\n",
		   "destinations.k.config[\"no.such.thing\"]: librdkafka refused it: No such configuration property", NULL);
	refuse("destinations:\n  k: { type: kafka, brokers: h, config: { \"enable.idempotence\": \"false\" } }\n",
		   "destinations.k.config[\"enable.idempotence\"]: QueueBox sets enable.idempotence itself to true", "remove it", NULL);
	refuse("destinations:\n  k: { type: kafka, brokers: h, config: { acks: \"1\" } }\n",
		   "destinations.k.config.acks: QueueBox sets acks itself to all", "in-sync replica", NULL);
	refuse("destinations:\n  k: { type: kafka, brokers: h, config: { \"bootstrap.servers\": \"x:1\" } }\n",
		   "write the servers under brokers:", NULL);
	refuse("destinations:\n  k: { type: kafka, brokers: h, config: { \"delivery.report.only.error\": \"true\" } }\n",
		   "a delivery report for every message", NULL);
	refuse("destinations:\n  k: { type: kafka, brokers: h, config: { \"message.timeout.ms\": \"0\" } }\n",
		   "destinations.k.config[\"message.timeout.ms\"]: 0 means retry forever", NULL);
}

/* ---- transforms: compiled at load, a compile error names the key ------ */

static void
test_transforms(void **state)
{
	QbConfig   *cfg;

	cfg = accept("destinations:\n  p: { type: http, baseUrl: \"http://h\", transform: '. + {via: \"p\"}' }\n"
				 "routes:\n  - { topicPattern: \"a.**\", destination: p, transform: '{id: .id, topic: $topic}' }\n"
				 "  - { topicPattern: \"**\", destination: p }\n"
				 "sources:\n  s:\n    type: http\n    path: /s\n    idempotencyKeyPath: $.id\n    topic: \"{{ source }}\"\n"
				 "    transform: |\n      def amount: .cents / 100;\n      {id, amount: amount, source: $source}\n");
	assert_non_null(cfg->routes[0].transform);
	assert_null(cfg->routes[1].transform);
	assert_non_null(cfg->destinations[0].transform);
	assert_non_null(cfg->sources[0].transform);
	assert_string_equal(qb_transform_text(cfg->routes[0].transform), "{id: .id, topic: $topic}");
	qb_config_free(cfg);

	/* an override replaces a program (not ${}-expanded: $topic stays) */
	setenv("QUEUEBOX_ROUTES_0_TRANSFORM", "{t: $topic}", 1);
	cfg = accept("destinations: { p: { type: http, baseUrl: \"http://h\" } }\n"
				 "routes:\n  - { topicPattern: a, destination: p, transform: . }\n");
	unsetenv("QUEUEBOX_ROUTES_0_TRANSFORM");
	assert_string_equal(qb_transform_text(cfg->routes[0].transform), "{t: $topic}");
	qb_config_free(cfg);

	refuse("destinations: { p: { type: http, baseUrl: \"http://h\" } }\n"
		   "routes:\n  - { topicPattern: a, destination: p, transform: '{a: }' }\n",
		   "routes[0].transform: not a valid jq program: syntax error", "(line 3, column", NULL);
	refuse("destinations:\n  p: { type: http, baseUrl: \"http://h\", transform: 'nope(1)' }\n",
		   "destinations.p.transform: not a valid jq program: nope/1 is not defined", NULL);
	refuse("destinations:\n  k: { type: kafka, brokers: h, transform: '$who' }\n",
		   "destinations.k.transform: not a valid jq program: $who is not defined", NULL);
	refuse("sources:\n  s: { type: http, path: /s, idempotencyKeyPath: $.id, topic: x, transform: '.a |||' }\n",
		   "sources.s.transform: not a valid jq program: syntax error", NULL);
	refuse("sources:\n  s: { type: http, path: /s, idempotencyKeyPath: $.id, topic: x, transform: '' }\n",
		   "sources.s.transform: must not be empty", NULL);
}

/* ---- broker sources: rabbitmq, kafka, nats ------------------------------ */
static void
test_broker_sources(void **state)
{
	QbConfig   *c;
	const QbSource *s;

	c = accept("sources:\n"
			   "  mq: { type: rabbitmq, url: \"amqp://u:p@h:5672/\", queue: orders, prefetch: 10,"
			   " eventTypeFromHeader: true, topic: \"mq.{{ eventType }}\" }\n"
			   "  k: { type: kafka, brokers: \"h:9092\", topics: [a, b], idempotencyKeyHeader: message-id,"
			   " config: { \"fetch.min.bytes\": \"1\" }, batchSize: 50 }\n"
			   "  n: { type: nats, url: \"nats://h:4222\", subject: \"orders.>\", stream: ORDERS,"
			   " consumption: pull }\n"
			   "  web: { type: http, path: /w, idempotencyKeyPath: $.id, topic: w }\n");
	s = qb_config_source(c, "mq");
	assert_int_equal(s->type, QB_SOURCE_RABBITMQ);
	assert_string_equal(s->queue, "orders");
	assert_int_equal(s->prefetch, 10);
	assert_true(s->event_type_from_header);
	assert_null(s->path);
	s = qb_config_source(c, "k");
	assert_int_equal(s->type, QB_SOURCE_KAFKA);
	assert_int_equal(s->ntopics, 2);
	assert_string_equal(s->topics[1], "b");
	assert_string_equal(s->group, "queuebox-k");
	assert_string_equal(s->topic, "{{ source }}");
	assert_int_equal(s->batch_size, 50);
	assert_int_equal(s->nprops, 1);
	s = qb_config_source(c, "n");
	assert_int_equal(s->type, QB_SOURCE_NATS);
	assert_string_equal(s->durable, "queuebox-n");
	assert_string_equal(s->stream, "ORDERS");
	assert_int_equal(s->batch_size, 100);
	qb_config_free(c);

	refuse("sources:\n  mq: { type: rabbitmq, url: \"amqp://h\" }\n", "sources.mq: missing required key queue", NULL);
	refuse("sources:\n  mq: { type: rabbitmq, url: \"http://h\", queue: q }\n", "sources.mq.url:", NULL);
	refuse("sources:\n  mq: { type: rabbitmq, url: \"amqp://h\", queue: q, path: /x }\n",
		   "sources.mq.path: unknown key for a rabbitmq source", NULL);
	/* the spec's rule: an AMQP template reading eventType needs a way to find one */
	refuse("sources:\n  mq: { type: rabbitmq, url: \"amqp://h\", queue: q, topic: \"x.{{ eventType }}\" }\n",
		   "sources.mq.topic: the template reads {{ eventType }}", "eventTypeFromHeader: true", NULL);
	refuse("sources:\n  k: { type: kafka, brokers: \"h:9092\" }\n", "sources.k: missing required key topics", NULL);
	refuse("sources:\n  k: { type: kafka, brokers: \"h:9092\", topics: [] }\n",
		   "sources.k.topics: expected a list of at least one topic", NULL);
	refuse("sources:\n  n: { type: nats, url: \"nats://h\", subject: a }\n", "sources.n: missing required key stream", NULL);
	/* a kafka source's config: is checked by librdkafka; offsets stay QueueBox's */
	qb_config_free(accept("sources:\n  k: { type: kafka, brokers: h, topics: [a],\n"
						  "       config: { \"auto.offset.reset\": latest, \"session.timeout.ms\": \"6000\" } }\n"));
	refuse("sources:\n  k: { type: kafka, brokers: h, topics: [a], config: { \"no.such.thing\": \"1\" } }\n",
		   "sources.k.config[\"no.such.thing\"]: librdkafka refused it: No such configuration property", NULL);
	refuse("sources:\n  k: { type: kafka, brokers: h, topics: [a], config: { \"fetch.wait.max.ms\": \"soon\" } }\n",
		   "sources.k.config[\"fetch.wait.max.ms\"]: librdkafka refused it: ", NULL);
	refuse("sources:\n  k: { type: kafka, brokers: h, topics: [a], config: { \"enable.auto.commit\": \"true\" } }\n",
		   "sources.k.config[\"enable.auto.commit\"]: QueueBox sets enable.auto.commit itself to false",
		   "only after its row is stored", NULL);
	refuse("sources:\n  k: { type: kafka, brokers: h, topics: [a], config: { \"group.id\": g } }\n",
		   "write the consumer group under group:", NULL);
	refuse("sources:\n  k: { type: kafka, brokers: h, topics: [a], config: { \"partition.assignment.strategy\": cooperative-sticky } }\n",
		   "sources.k.config[\"partition.assignment.strategy\"]: QueueBox consumes with an eager assignor", NULL);
	qb_config_free(accept("sources:\n  k: { type: kafka, brokers: h, topics: [a], config: { \"partition.assignment.strategy\": roundrobin } }\n"));
	refuse("sources:\n  n: { type: sqs }\n", "sources.n.type: expected one of http, rabbitmq, kafka, nats", NULL);
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

/* maxInFlight and circuitBreaker: defaults, values, errors, overrides */
static void
test_delivery_control(void **state)
{
	QbConfig   *c;

	c = accept("destinations:\n  a: {type: http, baseUrl: \"http://h\"}\n"
			   "  b: {type: nats, url: \"nats://h\", maxInFlight: 7,"
			   " circuitBreaker: {failures: 3, cooldownMs: 500}}\n");
	assert_int_equal(c->destinations[0].max_in_flight, 128);
	assert_int_equal(c->destinations[0].breaker_failures, 10);
	assert_int_equal(c->destinations[0].breaker_cooldown_ms, 30000);
	assert_int_equal(c->destinations[1].max_in_flight, 7);
	assert_int_equal(c->destinations[1].breaker_failures, 3);
	assert_int_equal(c->destinations[1].breaker_cooldown_ms, 500);
	qb_config_free(c);

	refuse("destinations:\n  a: {type: http, baseUrl: \"http://h\", maxInFlight: 0}\n",
		   "destinations.a.maxInFlight: expected an integer from 1 to 10000", NULL);
	refuse("destinations:\n  a: {type: http, baseUrl: \"http://h\", circuitBreaker: 5}\n",
		   "destinations.a.circuitBreaker: expected a mapping", NULL);
	refuse("destinations:\n  a: {type: http, baseUrl: \"http://h\", circuitBreaker: {failure: 5}}\n",
		   "destinations.a.circuitBreaker.failure: unknown key", "failures, cooldownMs", NULL);
	refuse("destinations:\n  a: {type: kafka, brokers: \"h:9092\", circuitBreaker: {cooldownMs: 10}}\n",
		   "destinations.a.circuitBreaker.cooldownMs: expected an integer from 100 to 86400000", NULL);

	setenv("QUEUEBOX_DESTINATIONS_A_MAXINFLIGHT", "9", 1);
	setenv("QUEUEBOX_DESTINATIONS_A_CIRCUITBREAKER_FAILURES", "4", 1);
	c = accept("destinations:\n  a: {type: http, baseUrl: \"http://h\", circuitBreaker: {cooldownMs: 200}}\n");
	assert_int_equal(c->destinations[0].max_in_flight, 9);
	assert_int_equal(c->destinations[0].breaker_failures, 4);
	assert_int_equal(c->destinations[0].breaker_cooldown_ms, 200);
	qb_config_free(c);
	unsetenv("QUEUEBOX_DESTINATIONS_A_MAXINFLIGHT");
	unsetenv("QUEUEBOX_DESTINATIONS_A_CIRCUITBREAKER_FAILURES");
}

/* onDead: release (default) or holdKey, on a destination and on a route */
static void
test_on_dead(void **state)
{
	QbConfig   *c;

	c = accept("destinations:\n  a: {type: http, baseUrl: \"http://h\"}\n"
			   "  b: {type: nats, url: \"nats://h\", onDead: holdKey}\n"
			   "routes:\n  - {topicPattern: \"x.**\", destination: a, onDead: holdKey}\n"
			   "  - {topicPattern: \"y.**\", destination: b, onDead: release}\n"
			   "  - {topicPattern: \"**\", destination: b}\n");
	assert_int_equal(c->destinations[0].on_dead, QB_ON_DEAD_RELEASE);
	assert_int_equal(c->destinations[1].on_dead, QB_ON_DEAD_HOLD_KEY);
	assert_int_equal(c->routes[0].on_dead, QB_ON_DEAD_HOLD_KEY);
	assert_int_equal(c->routes[1].on_dead, QB_ON_DEAD_RELEASE);
	assert_int_equal(c->routes[2].on_dead, QB_ON_DEAD_UNSET);
	qb_config_free(c);

	refuse("destinations:\n  a: {type: http, baseUrl: \"http://h\", onDead: hold}\n",
		   "destinations.a.onDead: expected release", "holdKey", "got \"hold\"", NULL);
	refuse("destinations:\n  a: {type: http, baseUrl: \"http://h\"}\n"
		   "routes:\n  - {topicPattern: \"**\", destination: a, onDead: 1}\n",
		   "routes[0].onDead: expected release", NULL);
	refuse("destinations:\n  a: {type: http, baseUrl: \"http://h\", onDead: [holdKey]}\n",
		   "destinations.a.onDead:", NULL);

	setenv("QUEUEBOX_DESTINATIONS_A_ONDEAD", "holdKey", 1);
	c = accept("destinations:\n  a: {type: http, baseUrl: \"http://h\"}\n");
	assert_int_equal(c->destinations[0].on_dead, QB_ON_DEAD_HOLD_KEY);
	qb_config_free(c);
	unsetenv("QUEUEBOX_DESTINATIONS_A_ONDEAD");
}

/* a source's onDead: its dead push rows hold their aggregate in the relay */
static void
test_source_on_dead(void **state)
{
	QbConfig   *c;

	c = accept("sources:\n"
			   "  a: {type: http, path: /a, idempotencyKeyPath: $.id, eventTypePath: $.t}\n"
			   "  b: {type: http, path: /b, idempotencyKeyPath: $.id, eventTypePath: $.t, onDead: holdKey}\n"
			   "  c: {type: kafka, brokers: \"k:9092\", topics: [t], idempotencyKeyPath: $.id,"
			   " eventTypePath: $.t, onDead: release}\n");
	assert_int_equal(c->sources[0].on_dead, QB_ON_DEAD_RELEASE);
	assert_int_equal(c->sources[1].on_dead, QB_ON_DEAD_HOLD_KEY);
	assert_int_equal(c->sources[2].on_dead, QB_ON_DEAD_RELEASE);
	qb_config_free(c);

	refuse("sources:\n  a: {type: http, path: /a, idempotencyKeyPath: $.id, eventTypePath: $.t,"
		   " onDead: holdAggregate}\n",
		   "sources.a.onDead: expected release (a dead row's aggregate goes on without it)",
		   "holdKey", "got \"holdAggregate\"", NULL);
	refuse("sources:\n  n: {type: nats, url: \"nats://h\", subject: s, stream: S, idempotencyKeyPath: $.id,"
		   " eventTypePath: $.t, onDead: true}\n",
		   "sources.n.onDead:", NULL);
}

/* ---- the daemon's keys: database:, daemon: ------------------------ */

/*
 * The extension accepts and ignores them; the daemon (queuebox-mssqld)
 * reads them.  A database url holds a password, which no message repeats.
 */
#define PASSWORD "Pa55-w0rd-never-shown"

/* refuse_hiding: refuse, and the message must not hold PASSWORD */
static void
refuse_hiding(const char *text, const char *want)
{
	char		err[QB_ERRLEN] = "";

	refused_message(text, err, sizeof(err));
	if (strstr(err, PASSWORD) != NULL)
		fail_msg("the message repeats the password: %s", err);
	if (strstr(err, want) == NULL)
		fail_msg("message \"%s\"\n lacks \"%s\"", err, want);
}

static void
test_daemon_defaults(void **state)
{
	QbConfig	d;
	QbConfig   *c = accept("");

	qb_config_defaults(&d);
	for (int i = 0; i < 2; i++)
	{
		const QbConfig *x = i == 0 ? &d : c;

		assert_null(x->database.url);
		assert_false(x->database.listen);
		assert_int_equal(x->database.statement_timeout_ms, 30000);
		assert_int_equal(x->database.connect_timeout_ms, 10000);
		assert_int_equal(x->database.idle_poll_max_ms, 2000);
		assert_int_equal(x->daemon.outbox_workers, 2);
		assert_int_equal(x->daemon.shutdown_grace_ms, 10000);
		assert_false(x->daemon.log_json);
	}
	qb_config_free(c);
	/* empty and null sections are absent */
	c = accept("database:\ndaemon: {}\n");
	assert_null(c->database.url);
	assert_int_equal(c->daemon.outbox_workers, 2);
	qb_config_free(c);
	c = accept("database: { url: }\n");
	assert_null(c->database.url);
	qb_config_free(c);
}

static void
test_daemon_every_key(void **state)
{
	QbConfig   *c;

	setenv("QBT_DB_PASSWORD", PASSWORD, 1);
	c = accept("database:\n"
			   "  url: \"postgresql://qb:${QBT_DB_PASSWORD}@db.internal:5432/app?sslmode=require\"\n"
			   "  listen: true\n"
			   "  statementTimeoutMs: 100\n"
			   "  connectTimeoutMs: 600000\n"
			   "  idlePollMaxMs: \"10\"\n"
			   "daemon: { outboxWorkers: 64, shutdownGraceMs: 0, logFormat: json }\n");
	assert_string_equal(c->database.url,
						"postgresql://qb:" PASSWORD "@db.internal:5432/app?sslmode=require");
	assert_true(c->database.listen);
	assert_int_equal(c->database.statement_timeout_ms, 100);
	assert_int_equal(c->database.connect_timeout_ms, 600000);
	assert_int_equal(c->database.idle_poll_max_ms, 10);
	assert_int_equal(c->daemon.outbox_workers, 64);
	assert_int_equal(c->daemon.shutdown_grace_ms, 0);
	assert_true(c->daemon.log_json);
	qb_config_free(c);
	unsetenv("QBT_DB_PASSWORD");

	c = accept("database: { url: \"postgres://h/app\", idlePollMaxMs: 3600000 }\n"
			   "daemon: { outboxWorkers: 1, shutdownGraceMs: 3600000, logFormat: text }\n");
	assert_string_equal(c->database.url, "postgres://h/app");
	assert_int_equal(c->daemon.outbox_workers, 1);
	qb_config_free(c);
	c = accept("database: { url: \"sqlserver://qb:secret@[::1]:1433?database=app\" }\n");
	assert_string_equal(c->database.url, "sqlserver://qb:secret@[::1]:1433?database=app");
	qb_config_free(c);
}

static void
test_daemon_ranges(void **state)
{
	refuse("database: { statementTimeoutMs: 99 }\n",
		   "database.statementTimeoutMs: expected an integer from 100 to 3600000, got \"99\"",
		   "(line 1, column 33)", NULL);
	refuse("database: { statementTimeoutMs: 3600001 }\n",
		   "database.statementTimeoutMs: expected an integer from 100 to 3600000", NULL);
	refuse("database: { connectTimeoutMs: 999 }\n",
		   "database.connectTimeoutMs: expected an integer from 1000 to 600000", NULL);
	refuse("database: { connectTimeoutMs: 600001 }\n",
		   "database.connectTimeoutMs: expected an integer from 1000 to 600000", NULL);
	refuse("database: { idlePollMaxMs: 9 }\n",
		   "database.idlePollMaxMs: expected an integer from 10 to 3600000", NULL);
	refuse("database: { listen: yes }\n",
		   "database.listen: expected true or false, got \"yes\"", NULL);
	refuse("daemon: { outboxWorkers: 0 }\n",
		   "daemon.outboxWorkers: expected an integer from 1 to 64, got \"0\"", NULL);
	refuse("daemon: { outboxWorkers: 65 }\n",
		   "daemon.outboxWorkers: expected an integer from 1 to 64", NULL);
	refuse("daemon: { shutdownGraceMs: -1 }\n",
		   "daemon.shutdownGraceMs: expected an integer from 0 to 3600000", NULL);
	refuse("daemon: { logFormat: xml }\n",
		   "daemon.logFormat: expected text or json, got \"xml\"", NULL);
	refuse("daemon: { logFormat: [json] }\n",
		   "daemon.logFormat: expected text or json, got a sequence", NULL);
	refuse("database: [url]\n", "database: expected a mapping", NULL);
	refuse("daemon: 4\n", "daemon: expected a mapping", NULL);
}

static void
test_daemon_unknown_keys(void **state)
{
	refuse("database: { url: \"postgres://h/app\", user: qb }\n",
		   "database.user: unknown key (allowed: url, listen, statementTimeoutMs, connectTimeoutMs, idlePollMaxMs)",
		   "(line 1, column 38)", NULL);
	refuse("database: { URL: \"postgres://h/app\" }\n",
		   "database.URL: unknown key", "did you mean url?", NULL);
	refuse("daemon: { workers: 4 }\n",
		   "daemon.workers: unknown key (allowed: outboxWorkers, shutdownGraceMs, logFormat)", NULL);
	refuse("database: { url: \"postgres://h/app\", url: \"postgres://h/b\" }\n",
		   "database.url: duplicate key", NULL);
}

/*
 * the extension reads a file the daemon reads too: its database: and
 * daemon: sections are the daemon's, their keys checked, nothing expanded
 */
static void
test_daemon_sections_ignored(void **state)
{
	static const char doc[] =
		"database: { url: \"postgres://queuebox:${QB_TEST_UNSET_PASSWORD}@db.internal/app\", listen: true }\n"
		"daemon: { outboxWorkers: \"${QB_TEST_UNSET_WORKERS}\" }\n";

	unsetenv("QB_TEST_UNSET_PASSWORD");
	refuse(doc, "database.url: environment variable QB_TEST_UNSET_PASSWORD is not set", NULL);
	test_env.daemon_sections_unread = true;
	qb_config_free(accept(doc));
	refuse("database: { urll: x }\n", "database.urll: unknown key", NULL);
	refuse("daemon: [1]\n", "daemon: expected a mapping", NULL);
	test_env.daemon_sections_unread = false;
}

/* the url: its schemes, and messages that never repeat it */
static void
test_daemon_url(void **state)
{
	refuse_hiding("database: { url: \"mysql://qb:" PASSWORD "@db/app\" }\n",
				  "database.url: unsupported scheme \"mysql\" (use postgres, postgresql or sqlserver) (line 1, column 18)");
	refuse_hiding("database: { url: \"http://qb:" PASSWORD "@db/app\" }\n",
				  "database.url: unsupported scheme \"http\"");
	refuse_hiding("database: { url: \"qb:" PASSWORD "@db/app\" }\n",
				  "database.url: not a URL: expected postgres://host[:port][/path]");
	refuse_hiding("database: { url: \"postgres://qb:" PASSWORD "@db host/app\" }\n",
				  "database.url: the URL contains a space");
	refuse_hiding("database: { url: \"postgres://qb:" PASSWORD "@db/app#x\" }\n",
				  "database.url: a fragment (#...) is not allowed");
	refuse("database: { url: \"\" }\n", "database.url: must not be empty", NULL);
	/*
	 * A postgres:// URL's hosts are libpq's to read, and the daemon's to
	 * check with libpq (test_daemon.c): a host list (a standby to fail over
	 * to), a Unix-socket directory in the query or %2F-encoded in the
	 * host's place, no host at all (libpq's default socket)
	 */
	{
		static const char *const libpq[] = {
			"postgres://qb:" PASSWORD "@db1:5432,db2,[::1]:5433/app?target_session_attrs=read-write",
			"postgres://postgres@/app?host=/var/run/postgresql",
			"postgres://postgres@%2Fvar%2Frun%2Fpostgresql/app",
			"postgresql:///app?host=/tmp&port=5433",
			"postgresql://",
		};

		for (size_t i = 0; i < sizeof(libpq) / sizeof(libpq[0]); i++)
		{
			char		doc[256];
			QbConfig   *c;

			snprintf(doc, sizeof(doc), "database: { url: \"%s\" }\n", libpq[i]);
			c = accept(doc);
			assert_string_equal(c->database.url, libpq[i]);
			qb_config_free(c);
		}
	}
	/* SQL Server takes one host, and needs it */
	refuse_hiding("database: { url: \"sqlserver://qb:" PASSWORD "@db1,db2:1433?database=app\" }\n",
				  "database.url: invalid character in the host name");
	refuse_hiding("database: { url: \"sqlserver://qb:" PASSWORD "@/app\" }\n",
				  "database.url: no host");
	/* a password from the environment is not repeated either */
	setenv("QBT_DB_URL", "mysql://qb:" PASSWORD "@db/app", 1);
	refuse_hiding("database: { url: \"${QBT_DB_URL}\" }\n",
				  "database.url: unsupported scheme \"mysql\"");
	unsetenv("QBT_DB_URL");
	refuse_hiding("database: { url: \"${QBT_DB_UNSET_URL}\" }\n",
				  "database.url: environment variable QBT_DB_UNSET_URL is not set");
}

/* telemetry.otlp: the traces URL, the defaults, and what is refused */
static void
test_telemetry(void **state)
{
	QbConfig   *c = accept("");

	assert_null(c->otlp.url);
	assert_string_equal(c->otlp.service_name, "queuebox");
	assert_int_equal(c->otlp.queue_size, 2048);
	qb_config_free(c);
	c = accept("telemetry:\n  otlp:\n    endpoint: http://127.0.0.1:4318\n"
			   "    headers: { x-api-key: k1 }\n    serviceName: billing-outbox\n"
			   "    batchSize: 10\n    queueSize: 100\n    flushIntervalMs: 50\n");
	assert_string_equal(c->otlp.url, "http://127.0.0.1:4318/v1/traces");
	assert_int_equal(c->otlp.nheaders, 1);
	assert_string_equal(c->otlp.headers[0].name, "x-api-key");
	assert_string_equal(c->otlp.headers[0].value, "k1");
	assert_string_equal(c->otlp.service_name, "billing-outbox");
	assert_int_equal(c->otlp.batch_size, 10);
	assert_int_equal(c->otlp.queue_size, 100);
	assert_int_equal(c->otlp.flush_interval_ms, 50);
	qb_config_free(c);
	/* a path is kept as written; a bare slash is no path */
	c = accept("telemetry: { otlp: { endpoint: \"https://otlp.example.com/custom/traces\" } }\n");
	assert_string_equal(c->otlp.url, "https://otlp.example.com/custom/traces");
	qb_config_free(c);
	c = accept("telemetry: { otlp: { endpoint: \"http://collector:4318/\" } }\n");
	assert_string_equal(c->otlp.url, "http://collector:4318/v1/traces");
	qb_config_free(c);

	refuse("telemetry: { otlp: { endpoint: \"grpc://collector:4317\" } }\n",
		   "telemetry.otlp.endpoint: ", "e.g. http://otel-collector:4318", NULL);
	refuse("telemetry: { otlp: { serviceName: x } }\n",
		   "telemetry.otlp.endpoint: required when telemetry.otlp is set", NULL);
	refuse("telemetry: { otlp: { endpoint: \"http://c:4318\", protocol: grpc } }\n",
		   "telemetry.otlp.protocol: unknown key", NULL);
	refuse("telemetry: { otlp: { endpoint: \"http://c:4318\", batchSize: 100, queueSize: 10 } }\n",
		   "telemetry.otlp.batchSize: a batch of 100 spans cannot be more than queueSize (10)", NULL);
	refuse("telemetry: { zipkin: {} }\n", "telemetry.zipkin: unknown key (allowed: otlp)", NULL);
	/* the egress rules judge the receiver as they judge destinations */
	refuse("telemetry: { otlp: { endpoint: \"http://169.254.169.254:4318\" } }\n",
		   "telemetry.otlp.endpoint: egress refused: 169.254.169.254 is a link-local or cloud metadata address", NULL);
}

static void
test_daemon_overrides(void **state)
{
	QbConfig   *c;

	setenv("QUEUEBOX_DATABASE_URL", "sqlserver://qb:" PASSWORD "@mssql:1433?database=app", 1);
	setenv("QUEUEBOX_DATABASE_LISTEN", "true", 1);
	setenv("QUEUEBOX_DAEMON_OUTBOXWORKERS", "8", 1);
	setenv("QUEUEBOX_DAEMON_LOGFORMAT", "json", 1);
	/* replaces the document's value, and adds the sections it lacks */
	c = accept("database: { url: \"postgres://h/app\" }\n");
	assert_string_equal(c->database.url, "sqlserver://qb:" PASSWORD "@mssql:1433?database=app");
	assert_true(c->database.listen);
	assert_int_equal(c->daemon.outbox_workers, 8);
	assert_true(c->daemon.log_json);
	qb_config_free(c);
	c = accept("");
	assert_string_equal(c->database.url, "sqlserver://qb:" PASSWORD "@mssql:1433?database=app");
	qb_config_free(c);
	unsetenv("QUEUEBOX_DATABASE_LISTEN");
	unsetenv("QUEUEBOX_DAEMON_OUTBOXWORKERS");
	unsetenv("QUEUEBOX_DAEMON_LOGFORMAT");

	/* an override's error names the variable and the key path */
	setenv("QUEUEBOX_DATABASE_URL", "mysql://qb:" PASSWORD "@db/app", 1);
	refuse_hiding("", "QUEUEBOX_DATABASE_URL (database.url): unsupported scheme \"mysql\"");
	unsetenv("QUEUEBOX_DATABASE_URL");
	setenv("QUEUEBOX_DATABASE_IDLEPOLLMAXMS", "5", 1);
	refuse("", "QUEUEBOX_DATABASE_IDLEPOLLMAXMS (database.idlePollMaxMs): expected an integer from 10 to 3600000, got \"5\"", NULL);
	unsetenv("QUEUEBOX_DATABASE_IDLEPOLLMAXMS");
	setenv("QUEUEBOX_DAEMON_SHUTDOWNGRACEMS", "soon", 1);
	refuse("", "QUEUEBOX_DAEMON_SHUTDOWNGRACEMS (daemon.shutdownGraceMs): expected an integer", NULL);
	unsetenv("QUEUEBOX_DAEMON_SHUTDOWNGRACEMS");
	/* a name that spells no key is ignored, as everywhere */
	setenv("QUEUEBOX_DATABASE_PASSWORD", "x", 1);
	qb_config_free(accept(""));
	unsetenv("QUEUEBOX_DATABASE_PASSWORD");
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_empty_documents),
		cmocka_unit_test(test_full_document),
		cmocka_unit_test(test_partial_defaults),
		cmocka_unit_test(test_scalar_forms),
		cmocka_unit_test(test_unknown_keys),
		cmocka_unit_test(test_duplicate_keys),
		cmocka_unit_test(test_required_keys),
		cmocka_unit_test(test_wrong_types),
		cmocka_unit_test(test_routes_validation),
		cmocka_unit_test(test_yaml_errors),
		cmocka_unit_test(test_expand_env_direct),
		cmocka_unit_test(test_expand_env_in_document),
		cmocka_unit_test(test_expand_file),
		cmocka_unit_test(test_expand_file_in_document),
		cmocka_unit_test(test_expand_file_cleanup),
		cmocka_unit_test(test_overrides_valid),
		cmocka_unit_test(test_delivery_control),
		cmocka_unit_test(test_on_dead),
		cmocka_unit_test(test_source_on_dead),
		cmocka_unit_test(test_overrides_invalid),
		cmocka_unit_test(test_url_check),
		cmocka_unit_test(test_lease_outlasts_request),
		cmocka_unit_test(test_sources_valid),
		cmocka_unit_test(test_sources_invalid),
		cmocka_unit_test(test_inbox_http_admin_invalid),
		cmocka_unit_test(test_overrides_inbox),
		cmocka_unit_test(test_kafka_destination),
		cmocka_unit_test(test_transforms),
		cmocka_unit_test(test_broker_sources),
		cmocka_unit_test(test_signing_valid),
		cmocka_unit_test(test_signing_invalid),
		cmocka_unit_test(test_daemon_defaults),
		cmocka_unit_test(test_daemon_every_key),
		cmocka_unit_test(test_daemon_ranges),
		cmocka_unit_test(test_daemon_unknown_keys),
		cmocka_unit_test(test_daemon_sections_ignored),
		cmocka_unit_test(test_daemon_url),
		cmocka_unit_test(test_daemon_overrides),
		cmocka_unit_test(test_telemetry),
	};

	return cmocka_run_group_tests_name("qb_config", tests, NULL, NULL);
}
