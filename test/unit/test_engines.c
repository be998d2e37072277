/*
 * test_engines.c
 *	  cmocka tests of the engine registry (src/common/engine/qb_engines.c):
 *	  its table and the publisher, consumer, host and store tables are
 *	  complete and a hole in any is named (qb_ops.h), the names the hosts give their workers and
 *	  roles, how many of each engine the settings want, and the stop lines,
 *	  word for word (the TAP tests grep them in both hosts' logs).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "ops_holes.h"
#include "qb_engines.h"
#include "qb_pub_amqp.h"
#include "qb_pub_http.h"
#include "qb_pub_kafka.h"
#include "qb_pub_nats.h"
#include "qb_src_amqp.h"
#include "qb_src_kafka.h"
#include "qb_src_nats.h"

static void
test_complete(void **state)
{
	char		err[256] = "";

	assert_int_equal(qb_engines_check(err, sizeof(err)), 0);
	assert_string_equal(err, "");
	for (int k = 0; k < QB_ENGINE_NKINDS; k++)
		assert_int_equal(qb_engine((QbEngineKind) k)->kind, k);
}

/* a hole is named, with the engine it is in */
static void
test_hole(void **state)
{
	QbEngine	t[QB_ENGINE_NKINDS];
	char		err[256];

	memcpy(t, qb_engine(0), sizeof(t));
	assert_int_equal(qb_engines_check_table(t, QB_ENGINE_NKINDS, err, sizeof(err)), 0);
	t[QB_ENGINE_RELAY].run = NULL;
	assert_int_equal(qb_engines_check_table(t, QB_ENGINE_NKINDS, err, sizeof(err)), -1);
	assert_string_equal(err, "engine 'relay' lacks 'run'");

	memcpy(t, qb_engine(0), sizeof(t));
	t[QB_ENGINE_CONSUMER].name = NULL;
	assert_int_equal(qb_engines_check_table(t, QB_ENGINE_NKINDS, err, sizeof(err)), -1);
	assert_string_equal(err, "engine entry 3 (unnamed) has no name");

	/* an entry in the wrong place */
	memcpy(t, qb_engine(0), sizeof(t));
	t[QB_ENGINE_INGRESS] = *qb_engine(QB_ENGINE_OUTBOX);
	assert_int_equal(qb_engines_check_table(t, QB_ENGINE_NKINDS, err, sizeof(err)), -1);
	assert_string_equal(err, "engine entry 2 (outbox) has a kind that is not its index");
}

static int
publisher_check(const void *table, char *err, size_t errlen)
{
	return qb_publisher_check(table, err, errlen);
}

static int
consumer_check(const void *table, char *err, size_t errlen)
{
	return qb_consumer_check(table, err, errlen);
}

static int
engine_check(const void *table, char *err, size_t errlen)
{
	return qb_engines_check_table(table, 1, err, errlen);
}

/* the host table, with a complete store */
static int
host_check(const void *table, char *err, size_t errlen)
{
	static const QbOpsField store_fields[] = {QB_STORE_OPS(QB_OPS_FIELD, QbStore)};
	QbStore		store = {0};

	ops_fill(&store, store_fields, sizeof(store_fields) / sizeof(store_fields[0]));
	return qb_engine_tables_check(table, &store, "relay", err, errlen);
}

#define NFIELDS(f) ((int) (sizeof(f) / sizeof((f)[0])))

/*
 * Every real publisher, consumer and engine table is complete, and each
 * required field left out is named with its table; prune, the host's
 * config_loaded, late_floor and polled may be NULL.
 */
static void
test_ops_holes(void **state)
{
	static const QbOpsField pub[] = {QB_PUBLISHER_OPS(QB_OPS_FIELD, QbPublisherOps)};
	static const QbOpsField con[] = {QB_CONSUMER_OPS(QB_OPS_FIELD, QbConsumerOps)};
	static const QbOpsField eng[] = {QB_ENGINE_OPS(QB_OPS_FIELD, QbEngine)};
	static const QbOpsField hst[] = {QB_HOST_OPS(QB_OPS_FIELD, QbHost)};
	const QbPublisherOps *const pubs[] = {&qb_http_publisher, &qb_amqp_publisher,
	&qb_kafka_publisher, &qb_nats_publisher};
	const QbConsumerOps *const cons[] = {&qb_amqp_consumer, &qb_kafka_consumer,
	&qb_nats_consumer};
	const char *const con_names[] = {"rabbitmq", "kafka", "nats"};
	char		want[64];
	QbHost		host = {0};

	for (size_t i = 0; i < sizeof(pubs) / sizeof(pubs[0]); i++)
	{
		snprintf(want, sizeof(want), "publisher ops '%s'", qb_dest_type_name(pubs[i]->type));
		ops_expect_holes(pubs[i], sizeof(QbPublisherOps), pub, NFIELDS(pub), publisher_check, want);
	}
	for (size_t i = 0; i < sizeof(cons) / sizeof(cons[0]); i++)
	{
		snprintf(want, sizeof(want), "consumer ops '%s'", con_names[i]);
		ops_expect_holes(cons[i], sizeof(QbConsumerOps), con, NFIELDS(con), consumer_check, want);
	}
	/* the first entry alone: the others' kinds are not index 0 */
	ops_expect_holes(qb_engine(0), sizeof(QbEngine), eng, NFIELDS(eng), engine_check,
					 "engine 'outbox'");

	ops_fill(&host, hst, NFIELDS(hst));
	ops_expect_holes(&host, sizeof(host), hst, NFIELDS(hst), host_check, "host ops of 'relay'");
}

static void
test_names(void **state)
{
	char		name[64];

	qb_engine_name(QB_ENGINE_OUTBOX, 3, name, sizeof(name));
	assert_string_equal(name, "outbox 3");
	qb_engine_name(QB_ENGINE_RELAY, 0, name, sizeof(name));
	assert_string_equal(name, "relay");
	qb_engine_name(QB_ENGINE_INGRESS, 0, name, sizeof(name));
	assert_string_equal(name, "ingress");
	qb_engine_name(QB_ENGINE_CONSUMER, 1, name, sizeof(name));
	assert_string_equal(name, "consumer 1");
}

static int
wanted(QbEngineKind kind, QbEngineWant w)
{
	return qb_engine(kind)->wanted(&w);
}

static void
test_wanted(void **state)
{
	QbEngineWant w = {.outbox_workers = 3, .relay = true, .ingress = false,
	.broker_sources = 2, .max_consumers = 8};

	assert_int_equal(wanted(QB_ENGINE_OUTBOX, w), 3);
	assert_int_equal(wanted(QB_ENGINE_RELAY, w), 1);
	assert_int_equal(wanted(QB_ENGINE_INGRESS, w), 0);
	/* one consumer per broker source */
	assert_int_equal(wanted(QB_ENGINE_CONSUMER, w), 2);
	/* up to the cap */
	w.max_consumers = 1;
	assert_int_equal(wanted(QB_ENGINE_CONSUMER, w), 1);
	w.max_consumers = 0;
	assert_int_equal(wanted(QB_ENGINE_CONSUMER, w), 0);
	/* not known yet: one, to load the configuration */
	w.max_consumers = 8;
	w.broker_sources = -1;
	assert_int_equal(wanted(QB_ENGINE_CONSUMER, w), 1);
	/* known to be none */
	w.broker_sources = 0;
	assert_int_equal(wanted(QB_ENGINE_CONSUMER, w), 0);
	w.relay = false;
	w.outbox_workers = 0;
	assert_int_equal(wanted(QB_ENGINE_RELAY, w), 0);
	assert_int_equal(wanted(QB_ENGINE_OUTBOX, w), 0);
}

static void
stop_line(QbEngineKind kind, const QbEngineStats *s, const char *line, const char *detail)
{
	char		l[256];
	char		d[256];

	qb_engine(kind)->stats(s, l, sizeof(l), d, sizeof(d));
	assert_string_equal(l, line);
	assert_string_equal(d, detail);
}

static void
test_stop_lines(void **state)
{
	QbEngineStats s;

	memset(&s, 0, sizeof(s));
	s.outbox = (QbOutboxStats) {.batches = 1, .sent = 2, .retried = 3, .dead = 4,
		.released = 5, .held = 6, .parked = 7, .claim_ms = 8, .publish_ms = 9, .settle_ms = 10};
	stop_line(QB_ENGINE_OUTBOX, &s,
			  "1 claims, 2 sent, 3 retried, 4 dead, 5 released, 6 held, 7 parked",
			  "Time spent: claim 8 ms (cycles that claimed, with their settles), waiting 9 ms, settle 10 ms (cycles that only settled).");

	memset(&s, 0, sizeof(s));
	s.relay = (QbRelayStats) {.batches = 1, .forwarded = 2, .dead = 3, .taken_over = 4};
	stop_line(QB_ENGINE_RELAY, &s, "1 batches, 2 forwarded, 3 dead, 4 taken over", "");

	memset(&s, 0, sizeof(s));
	s.ingress = (QbIngressStats) {.accepted = 1, .duplicates = 2, .refused = 3,
	.unavailable = 4, .batches = 5};
	stop_line(QB_ENGINE_INGRESS, &s,
			  "1 accepted, 2 duplicates, 3 refused, 4 unavailable in 5 store calls", "");

	memset(&s, 0, sizeof(s));
	s.consume = (QbConsumeStats) {.batches = 1, .stored = 2, .dead = 3, .duplicates = 4,
	.store_failures = 5};
	stop_line(QB_ENGINE_CONSUMER, &s,
			  "1 batches, 2 stored, 3 stored dead, 4 duplicates, 5 batches given back", "");
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_complete),
		cmocka_unit_test(test_hole),
		cmocka_unit_test(test_ops_holes),
		cmocka_unit_test(test_names),
		cmocka_unit_test(test_wanted),
		cmocka_unit_test(test_stop_lines),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
