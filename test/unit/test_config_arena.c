/*-------------------------------------------------------------------------
 * test_config_arena.c
 *	  Unit tests of the configuration's arena (qb_config_arena.c) and of
 *	  what it replaced, the field-by-field free: a config parsed and freed,
 *	  or refused at any step, leaves nothing behind.
 *
 * Wording: "leaves nothing" is what LeakSanitizer sees at exit, so these
 * tests say most under `make unit SANITIZE=1` (ASan runs LeakSanitizer);
 * without it they still check the arena's alignment, sizes and copies.
 *-------------------------------------------------------------------------
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "qb_config.h"
#include "qb_config_int.h"

/*
 * A document with every kind of allocation the validator makes: headers,
 * signing keys, kafka properties, topic lists, default names, auth secrets,
 * an override's nodes.
 */
static const char every_part[] =
"outbox: { batchSize: 5, backoff: { initialMs: 10 } }\n"
"destinations:\n"
"  p:\n"
"    type: http\n"
"    baseUrl: \"http://127.0.0.1:9000/\"\n"
"    path: /events\n"
"    headers: { X-Api-Key: k, X-Static: plain }\n"
"    signing: { type: standard-webhooks, secrets: [\"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\", \"whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD\"] }\n"
"  bus: { type: rabbitmq, url: \"amqp://guest:guest@127.0.0.1:5672/\", exchange: events }\n"
"  log: { type: kafka, brokers: \"h:9092\", config: { \"linger.ms\": \"5\" } }\n"
"  fan: { type: nats, url: \"nats://a:4222,nats://b:4222\", subject: \"x.{{ topic }}\" }\n"
"routes:\n"
"  - { topicPattern: \"orders.**\", destination: p }\n"
"  - { topicPattern: \"*.audit\", destination: log }\n"
"sources:\n"
"  stripe: { type: http, path: /stripe, idempotencyKeyPath: $.id, eventTypePath: $.type,\n"
"            auth: { type: stripe, secrets: [a, b] } }\n"
"  hooks: { type: http, path: /hooks, topic: hooks, auth: { type: standard-webhooks, secret: \"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\" } }\n"
"  q: { type: rabbitmq, url: \"amqp://h/\", queue: orders, idempotencyKeyPath: $.id }\n"
"  k: { type: kafka, brokers: h, topics: [a, b], idempotencyKeyPath: $.id, config: { \"fetch.min.bytes\": \"1\" } }\n"
"  n: { type: nats, url: \"nats://h:4222\", subject: \"o.>\", stream: O, idempotencyKeyPath: $.id }\n"
"inbox: { basePath: /in, relay: { batchSize: 3 } }\n"
"http: { listen: \"[::1]:9002\" }\n"
"admin: { token: 0123456789abcdef0123 }\n";

/* parse and free the same document many times: nothing may pile up */
static void
test_parse_free_many(void **state)
{
	char		err[QB_ERRLEN];

	setenv("QUEUEBOX_DESTINATIONS_P_TIMEOUTMS", "2500", 1);
	for (int i = 0; i < 1000; i++)
	{
		QbConfig   *cfg = NULL;

		if (qb_config_parse(every_part, strlen(every_part), NULL, &cfg, err, sizeof(err)) != 0)
			fail_msg("refused: %s", err);
		assert_int_equal(cfg->ndestinations, 4);
		assert_int_equal(cfg->nsources, 5);
		assert_int_equal(cfg->destinations[0].timeout_ms, 2500);
		assert_int_equal(cfg->destinations[0].signing.nkeys, 2);
		assert_string_equal(cfg->destinations[0].url, "http://127.0.0.1:9000/events");
		assert_string_equal(cfg->sources[3].group, "queuebox-k");
		assert_string_equal(cfg->sources[4].durable, "queuebox-n");
		qb_config_free(cfg);
	}
	unsetenv("QUEUEBOX_DESTINATIONS_P_TIMEOUTMS");
}

/* transforms are libjq's memory, owned by the arena: released with it */
static void
test_transforms_released(void **state)
{
	static const char doc[] =
		"destinations:\n  p: { type: http, baseUrl: \"http://h\", transform: '. + {via: \"p\"}' }\n"
		"routes:\n  - { topicPattern: a, destination: p, transform: '{id: .id}' }\n"
		"sources:\n  s: { type: http, path: /s, topic: s, idempotencyKeyPath: $.id, transform: '.' }\n";
	/* the last transform does not compile: the first two are released */
	static const char bad[] =
		"destinations:\n  p: { type: http, baseUrl: \"http://h\", transform: '.' }\n"
		"routes:\n  - { topicPattern: a, destination: p, transform: '.' }\n"
		"sources:\n  s: { type: http, path: /s, idempotencyKeyPath: $.id, transform: '{a: }' }\n";
	char		err[QB_ERRLEN];

	for (int i = 0; i < 10; i++)
	{
		QbConfig   *cfg = NULL;

		assert_int_equal(qb_config_parse(doc, strlen(doc), NULL, &cfg, err, sizeof(err)), 0);
		assert_non_null(cfg->destinations[0].transform);
		assert_non_null(cfg->routes[0].transform);
		assert_non_null(cfg->sources[0].transform);
		qb_config_free(cfg);
		assert_int_equal(qb_config_parse(bad, strlen(bad), NULL, &cfg, err, sizeof(err)), -1);
		assert_null(cfg);
		assert_non_null(strstr(err, "sources.s.transform"));
	}
}

/*
 * A document refused at each step (YAML, override, every section) frees
 * what it had built: the arena holds it all.
 */
static void
test_refused_frees(void **state)
{
	static const char *const docs[] = {
		"outbox: [\n",			/* YAML */
		"outbox: *x\n",			/* alias */
		"destinations:\n  p: { type: http, baseUrl: \"http://h\", headers: { A: b } }\nroutes:\n  - { topicPattern: a, destination: q }\n",
		"destinations:\n  p: { type: http, baseUrl: \"http://h\", signing: { type: hmac-sha256, secret: s, header: X-Sig, encoding: hexx } }\n",
		"sources:\n  k: { type: kafka, brokers: h, topics: [a, b], idempotencyKeyPath: $.id, config: { \"group.id\": x } }\n",
		"sources:\n  s: { type: http, path: /s, auth: { type: stripe, secrets: [a, \"\"] } }\n",
		"inbox: { basePath: /in }\nhttp: { listen: \"[::1]:0\" }\n",
		"admin: { token: short }\n",
	};
	char		err[QB_ERRLEN];

	for (size_t i = 0; i < sizeof(docs) / sizeof(docs[0]); i++)
	{
		QbConfig   *cfg = (QbConfig *) 0x1;

		if (qb_config_parse(docs[i], strlen(docs[i]), NULL, &cfg, err, sizeof(err)) == 0)
			fail_msg("accepted:\n%s", docs[i]);
		assert_null(cfg);
	}
	/* two overrides for one path: refused after the first was applied */
	setenv("QUEUEBOX_OUTBOX_BATCHSIZE", "5", 1);
	setenv("QUEUEBOX_outbox_batchsize", "6", 1);
	{
		QbConfig   *cfg = NULL;

		assert_int_equal(qb_config_parse("", 0, NULL, &cfg, err, sizeof(err)), -1);
		assert_non_null(strstr(err, "both set outbox.batchSize"));
	}
	unsetenv("QUEUEBOX_outbox_batchsize");
	unsetenv("QUEUEBOX_OUTBOX_BATCHSIZE");
}

/* the allocator itself: alignment, zeroing, chunks of every size, copies */
static void
test_arena(void **state)
{
	QbcfArena  *a = qbcf_arena_new();
	char	   *s;
	unsigned char *big;

	assert_non_null(a);
	for (size_t n = 0; n < 3000; n += 7)
	{
		unsigned char *p = qbcf_arena_alloc(a, n);

		assert_non_null(p);
		assert_int_equal((uintptr_t) p % _Alignof(max_align_t), 0);
		for (size_t i = 0; i < n; i++)
			assert_int_equal(p[i], 0);
		memset(p, 0xAB, n);
	}
	/* larger than any chunk: a chunk of its own; the head stays usable */
	big = qbcf_arena_alloc(a, 1 << 20);
	assert_non_null(big);
	big[(1 << 20) - 1] = 1;
	s = qbcf_arena_strndup(a, "abcdef", 3);
	assert_string_equal(s, "abc");
	assert_string_equal(qbcf_arena_strndup(a, "ab", 10), "ab");
	assert_string_equal(qbcf_arena_strdup(a, ""), "");
	assert_memory_equal(qbcf_arena_memdup(a, "x\0y", 3), "x\0y", 3);
	qbcf_arena_free(a);
	qbcf_arena_free(NULL);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_arena),
		cmocka_unit_test(test_parse_free_many),
		cmocka_unit_test(test_transforms_released),
		cmocka_unit_test(test_refused_frees),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
