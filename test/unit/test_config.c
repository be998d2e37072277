/*-------------------------------------------------------------------------
 * test_config.c
 *	  Unit tests of qb_config.c, the configuration's entry point: an empty
 *	  document and the defaults, a document with every destination type
 *	  read into the model, the lookups (qb_config_destination,
 *	  qb_dest_type_name), each type's defaults.
 *
 * The rest of the qb_config_* family has a test file each, named for its
 * file (test_config_<part>.c; test/README.md lists them); what they share
 * (accept, refuse) is test_config.h.
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

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_empty_documents),
		cmocka_unit_test(test_full_document),
		cmocka_unit_test(test_partial_defaults),
	};

	return cmocka_run_group_tests_name("qb_config", tests, NULL, NULL);
}
