/*-------------------------------------------------------------------------
 * test_config_value.c
 *	  Unit tests of qb_config_value.c, the validator's pieces: scalar forms
 *	  (durations, quoted numbers), unknown keys and their hints, duplicate
 *	  and missing keys, and each wrong type or range with its key path,
 *	  line and column.
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
		   "destinations.bus.baseUrl: unknown key for a rabbitmq destination (allowed: type, url, exchange, routingKey, persistent, mandatory, transform, maxInFlight, circuitBreaker, onDead, rateLimit, maxConcurrent)",
		   "(line 2, column 56)", NULL);
	refuse("destinations:\n  p: { type: http, baseUrl: \"http://h\", filter: x }\n",
		   "destinations.p.filter: unknown key for an http destination (allowed: type, baseUrl, path, headers, timeoutMs, transform, signing, maxInFlight, circuitBreaker, onDead, rateLimit, maxConcurrent)",
		   NULL);
	refuse("destinations:\n  k: { type: kafka, brokers: h, subject: s }\n",
		   "destinations.k.subject: unknown key for a kafka destination (allowed: type, brokers, topic, config, transform, maxInFlight, circuitBreaker, onDead, rateLimit, maxConcurrent)", NULL);
	refuse("destinations:\n  n: { type: nats, url: \"nats://h\", topic: s }\n",
		   "destinations.n.topic: unknown key for a nats destination (allowed: type, url, subject, jetstream, createStream, transform, maxInFlight, circuitBreaker, onDead, rateLimit, maxConcurrent)", NULL);
	refuse("destinations: { p: { type: http, baseUrl: \"http://h\" } }\nroutes:\n  - topicPattern: a\n    destination: p\n    priority: 1\n",
		   "routes[0].priority: unknown key (allowed: topicPattern, destination, destinations, transform, onDead)", "(line 5, column 5)", NULL);
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

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_scalar_forms),
		cmocka_unit_test(test_unknown_keys),
		cmocka_unit_test(test_duplicate_keys),
		cmocka_unit_test(test_required_keys),
		cmocka_unit_test(test_wrong_types),
	};

	return cmocka_run_group_tests_name("qb_config_value", tests, NULL, NULL);
}
