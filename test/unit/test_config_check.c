/*-------------------------------------------------------------------------
 * test_config_check.c
 *	  Unit tests of qb_config_check.c, the document's validator: routes
 *	  (fan-out's destinations: among them),
 *	  the lease against a request's timeout (with the nats createStream
 *	  and kafka message.timeout.ms cases that meet it), the inbox, http and
 *	  admin sections, transforms, maxInFlight and circuitBreaker, onDead on
 *	  destinations, routes and sources, and the daemon's database: and
 *	  daemon: sections (defaults, ranges, unknown keys, the url's schemes,
 *	  ignored by the extension).
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
/*
 * Fan-out: destinations: [a, b] is two or more known names, each once, and
 * not beside destination:; the route keeps its first as its destination,
 * the others as the copies' JSON array, and all of them for route_of().
 */
static void
test_route_fanout(void **state)
{
	static const char *const dests =
		"destinations:\n  a: { type: http, baseUrl: \"http://h\" }\n"
		"  b: { type: nats, url: \"nats://h\" }\n  c-1: { type: http, baseUrl: \"http://h\" }\n";
	char		doc[512];
	QbConfig   *c;

	snprintf(doc, sizeof(doc), "%sroutes:\n  - { topicPattern: x, destinations: [b, a, c-1] }\n"
			 "  - { topicPattern: y, destination: a }\n", dests);
	c = accept(doc);
	assert_int_equal(c->routes[0].ndests, 3);
	assert_string_equal(c->routes[0].destination, "b");
	assert_int_equal(c->routes[0].dest_index, c->routes[0].dest_indexes[0]);
	assert_string_equal(c->routes[0].copies, "[\"a\",\"c-1\"]");
	assert_string_equal(c->routes[0].dest_list, "b, a, c-1");
	assert_int_equal(c->routes[1].ndests, 1);
	assert_null(c->routes[1].copies);
	assert_string_equal(c->routes[1].dest_list, "a");
	qb_config_free(c);

	snprintf(doc, sizeof(doc), "%sroutes:\n  - { topicPattern: x, destination: a, destinations: [a, b] }\n", dests);
	refuse(doc, "routes[0].destinations: a route has destination (one) or destinations", "not both", NULL);
	snprintf(doc, sizeof(doc), "%sroutes:\n  - { topicPattern: x, destinations: [a] }\n", dests);
	refuse(doc, "routes[0].destinations: expected a list of two or more destination names", NULL);
	snprintf(doc, sizeof(doc), "%sroutes:\n  - { topicPattern: x, destinations: a }\n", dests);
	refuse(doc, "routes[0].destinations: expected a list of two or more", NULL);
	snprintf(doc, sizeof(doc), "%sroutes:\n  - { topicPattern: x, destinations: [a, b, a] }\n", dests);
	refuse(doc, "routes[0].destinations[2]: destination a is listed twice", NULL);
	snprintf(doc, sizeof(doc), "%sroutes:\n  - { topicPattern: x, destinations: [a, nope] }\n", dests);
	refuse(doc, "routes[0].destinations[1]: unknown destination \"nope\"", NULL);
	snprintf(doc, sizeof(doc), "%sroutes:\n  - { topicPattern: x }\n", dests);
	refuse(doc, "routes[0]", "destination", NULL);
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
/* ---- transforms: compiled at load, a compile error names the key ------ */

/* the process's helper, as a host keeps it (QbRuntime.jq) */
static QbTransformHelper jq;

/* transformed: what t makes of payload for topic (asserted OK; freed by the caller) */
static char *
transformed(const QbTransform *t, const char *payload, const char *topic)
{
	QbTransformVars vars = {.topic = topic};
	char		err[QB_ERRLEN] = "";
	char	   *out = NULL;
	size_t		len = 0;

	if (qb_transform_run(&jq, t, payload, strlen(payload), &vars, NULL, &out, &len, err, sizeof(err)) !=
		QB_TRANSFORM_OK)
		fail_msg("%s: %s", payload, err);
	return out;
}

static void
test_transforms(void **state)
{
	QbConfig   *cfg;
	char	   *out;

	cfg = accept("destinations:\n  p: { type: http, baseUrl: \"http://h\", transform: '. + {via: \"p\"}' }\n"
				 "routes:\n  - { topicPattern: \"a.**\", destination: p, transform: '{id: .id, topic: $topic}' }\n"
				 "  - { topicPattern: \"**\", destination: p }\n"
				 "sources:\n  s:\n    type: http\n    path: /s\n    idempotencyKeyPath: $.id\n    topic: \"{{ source }}\"\n"
				 "    transform: |\n      def amount: .cents / 100;\n      {id, amount: amount, source: $source}\n");
	assert_non_null(cfg->routes[0].transform);
	assert_null(cfg->routes[1].transform);
	assert_non_null(cfg->destinations[0].transform);
	assert_non_null(cfg->sources[0].transform);
	out = transformed(cfg->routes[0].transform, "{\"id\": 1}", "a.b");
	assert_string_equal(out, "{\"id\":1,\"topic\":\"a.b\"}");
	free(out);
	qb_config_free(cfg);

	/* an override replaces a program (not ${}-expanded: $topic stays) */
	setenv("QUEUEBOX_ROUTES_0_TRANSFORM", "{t: $topic}", 1);
	cfg = accept("destinations: { p: { type: http, baseUrl: \"http://h\" } }\n"
				 "routes:\n  - { topicPattern: a, destination: p, transform: . }\n");
	unsetenv("QUEUEBOX_ROUTES_0_TRANSFORM");
	out = transformed(cfg->routes[0].transform, "{}", "a");
	assert_string_equal(out, "{\"t\":\"a\"}");
	free(out);
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
/* rateLimit and maxConcurrent: none by default, values, burst's default, errors, overrides */
static void
test_limits(void **state)
{
	QbConfig   *c;

	c = accept("destinations:\n  a: {type: http, baseUrl: \"http://h\"}\n"
			   "  b: {type: nats, url: \"nats://h\", rateLimit: {perSecond: 50, burst: 80}, maxConcurrent: 4}\n"
			   "  c: {type: kafka, brokers: \"h:9092\", rateLimit: {perSecond: 2.5}}\n"
			   "  d: {type: rabbitmq, url: \"amqp://h\", exchange: x, maxConcurrent: 1}\n");
	assert_true(c->destinations[0].limit.rate.per_sec == 0);
	assert_int_equal(c->destinations[0].limit.max_concurrent, 0);
	assert_true(c->destinations[1].limit.rate.per_sec == 50);
	assert_int_equal(c->destinations[1].limit.rate.burst, 80);
	assert_int_equal(c->destinations[1].limit.max_concurrent, 4);
	/* burst: perSecond's ceiling */
	assert_true(c->destinations[2].limit.rate.per_sec == 2.5);
	assert_int_equal(c->destinations[2].limit.rate.burst, 3);
	assert_int_equal(c->destinations[2].limit.max_concurrent, 0);
	assert_true(c->destinations[3].limit.rate.per_sec == 0);
	assert_int_equal(c->destinations[3].limit.max_concurrent, 1);
	qb_config_free(c);

	refuse("destinations:\n  a: {type: http, baseUrl: \"http://h\", maxconcurrent: 2}\n",
		   "destinations.a.maxconcurrent: unknown key for an http destination", "did you mean maxConcurrent?", NULL);
	refuse("destinations:\n  a: {type: http, baseUrl: \"http://h\", maxConcurrent: 0}\n",
		   "destinations.a.maxConcurrent: expected an integer from 1 to 10000", NULL);
	refuse("destinations:\n  a: {type: http, baseUrl: \"http://h\", rateLimit: 50}\n",
		   "destinations.a.rateLimit: expected a mapping such as { perSecond: 50, burst: 50 }", NULL);
	refuse("destinations:\n  a: {type: http, baseUrl: \"http://h\", rateLimit: {persecond: 50}}\n",
		   "destinations.a.rateLimit.persecond: unknown key in rateLimit", "did you mean perSecond?", NULL);
	refuse("destinations:\n  a: {type: http, baseUrl: \"http://h\", rateLimit: {burst: 5}}\n",
		   "destinations.a.rateLimit: missing required key perSecond", NULL);
	refuse("destinations:\n  a: {type: http, baseUrl: \"http://h\", rateLimit: {perSecond: 0}}\n",
		   "destinations.a.rateLimit.perSecond: expected a number of publishes a second from 0.001 to 1000000, got \"0\"", NULL);
	refuse("destinations:\n  a: {type: http, baseUrl: \"http://h\", rateLimit: {perSecond: 5, burst: 0.5}}\n",
		   "destinations.a.rateLimit.burst: expected an integer from 1 to 1000000", NULL);

	setenv("QUEUEBOX_DESTINATIONS_A_RATELIMIT_PERSECOND", "20", 1);
	setenv("QUEUEBOX_DESTINATIONS_A_MAXCONCURRENT", "3", 1);
	c = accept("destinations:\n  a: {type: http, baseUrl: \"http://h\", rateLimit: {perSecond: 5, burst: 7}}\n");
	assert_true(c->destinations[0].limit.rate.per_sec == 20);
	assert_int_equal(c->destinations[0].limit.rate.burst, 7);
	assert_int_equal(c->destinations[0].limit.max_concurrent, 3);
	qb_config_free(c);
	/* an override gives a destination a rateLimit the document lacks */
	c = accept("destinations:\n  a: {type: http, baseUrl: \"http://h\"}\n");
	assert_true(c->destinations[0].limit.rate.per_sec == 20);
	assert_int_equal(c->destinations[0].limit.rate.burst, 20);
	qb_config_free(c);
	unsetenv("QUEUEBOX_DESTINATIONS_A_RATELIMIT_PERSECOND");
	unsetenv("QUEUEBOX_DESTINATIONS_A_MAXCONCURRENT");
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
/* ---- the daemon's keys: database:, daemon: (PASSWORD: test_config.h) -- */

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

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_routes_validation),
		cmocka_unit_test(test_route_fanout),
		cmocka_unit_test(test_lease_outlasts_request),
		cmocka_unit_test(test_inbox_http_admin_invalid),
		cmocka_unit_test(test_transforms),
		cmocka_unit_test(test_delivery_control),
		cmocka_unit_test(test_limits),
		cmocka_unit_test(test_on_dead),
		cmocka_unit_test(test_source_on_dead),
		cmocka_unit_test(test_daemon_defaults),
		cmocka_unit_test(test_daemon_every_key),
		cmocka_unit_test(test_daemon_ranges),
		cmocka_unit_test(test_daemon_unknown_keys),
		cmocka_unit_test(test_daemon_sections_ignored),
		cmocka_unit_test(test_daemon_url),
	};

	return cmocka_run_group_tests_name("qb_config_check", tests, NULL, NULL);
}
