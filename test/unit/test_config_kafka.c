/*-------------------------------------------------------------------------
 * test_config_kafka.c
 *	  Unit tests of qb_config_kafka.c: a kafka destination's config: read
 *	  by librdkafka, the properties QueueBox sets itself refused; and the
 *	  broker sources, kafka's beside rabbitmq's and nats' (one document
 *	  holds the three: their required keys, and the kafka source's config:).
 *	  (qb_config_rabbitmq.c and qb_config_nats.c have no file of their own:
 *	  their destinations are in test_config.c's full document, their
 *	  sources here, nats' createStream in test_config_check.c.)
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

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_kafka_destination),
		cmocka_unit_test(test_broker_sources),
	};

	return cmocka_run_group_tests_name("qb_config_kafka", tests, NULL, NULL);
}
