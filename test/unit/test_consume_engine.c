/*-------------------------------------------------------------------------
 * test_consume_engine.c
 *	  The consumer engine loop (qb_consume_run) against the fake store of
 *	  fake_store.h, the fake host of test_host.h and a fake consumer.
 *
 * The fake consumer stands behind qb_consumer_ops for kafka (the Makefile
 * links this test with --wrap=qb_consumer_ops): a queue of messages, each
 * handed out by fetch until it is acknowledged; release puts a batch back.
 * At each ack it looks in the fake store for the message's row, so an ack
 * before the commit is counted (acked_unstored), and at each release it
 * notes the rows stored.  So these tests pin down the engine's promise
 * (qb_consume.h): a batch is stored in one call and acknowledged only
 * after it committed; a store that fails gets the batch released, nothing
 * acknowledged nor stored, and it is stored when fetched again; a repeat
 * is acknowledged and counted, not stored twice; a message with no usable
 * key is stored dead under a made-up key, which a redelivery repeats when
 * the broker gives the message a position.  Rows are counted before and
 * after.  What the real consumers do with ack and release is tested
 * against real brokers (test/t/inbox/014_kafka_source.pl and the others).
 *-------------------------------------------------------------------------
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qb_consume.h"
#include "fake_store.h"
#include "test_host.h"

#define MAX_MSGS 16

/* ---- the fake consumer ------------------------------------------------- */

typedef struct FakeMsg
{
	const char *body;
	const char *message_id;
	const char *key;			/* its row's key; NULL: made up, found by payload */
	const char *position;		/* where the broker keeps it, or NULL */
	bool		in_flight;		/* fetched, not yet acked or released */
	int			acks;
	int			releases;
} FakeMsg;

typedef struct FakeConsumer
{
	FakeStore  *fs;
	FakeMsg		msgs[MAX_MSGS];
	int			nmsgs;
	int			opens;
	int			fetches;		/* that handed out messages */
	int			acked_unstored; /* acks of a message whose row was not stored */
	int			rows_at_release;	/* the store's rows at the last release */
} FakeConsumer;

static FakeConsumer fc;

static FakeMsg *
add_msg(const char *body, const char *message_id, const char *key)
{
	FakeMsg    *m = &fc.msgs[fc.nmsgs++];

	assert_true(fc.nmsgs <= MAX_MSGS);
	m->body = body;
	m->message_id = message_id;
	m->key = key;
	return m;
}

/* stored: the fake store holds m's row (by its key, or its payload). */
static bool
stored(const FakeMsg *m)
{
	bool		found = false;

	pthread_mutex_lock(&fc.fs->lock);
	for (int i = 0; i < fc.fs->nin && !found; i++)
		found = strcmp(fc.fs->in[i].source, "k") == 0 &&
			(m->key ? strcmp(fc.fs->in[i].key, m->key) == 0 :
			 strcmp(fc.fs->in[i].payload, m->body) == 0);
	pthread_mutex_unlock(&fc.fs->lock);
	return found;
}

static void *
fc_open(const QbSource *src, char *err, size_t errlen)
{
	fc.opens++;
	return &fc;
}

static void
fc_close(void *c)
{
}

static int
fc_fd(void *c)
{
	return -1;
}

static int
fc_fetch(void *c, QbDelivery *out, int max, char *err, size_t errlen)
{
	int			n = 0;

	for (int i = 0; i < fc.nmsgs && n < max; i++)
	{
		FakeMsg    *m = &fc.msgs[i];

		if (m->acks > 0 || m->in_flight)
			continue;
		m->in_flight = true;
		out[n].body = strdup(m->body);
		out[n].len = strlen(m->body);
		out[n].message_id = m->message_id ? strdup(m->message_id) : NULL;
		out[n].position = m->position ? strdup(m->position) : NULL;
		out[n].handle = (uint64_t) i;
		n++;
	}
	fc.fetches += n > 0;
	return n;
}

static int
fc_ack(void *c, const QbDelivery *d, int n, char *err, size_t errlen)
{
	for (int i = 0; i < n; i++)
	{
		FakeMsg    *m = &fc.msgs[d[i].handle];

		if (!stored(m))
			fc.acked_unstored++;
		m->in_flight = false;
		m->acks++;
	}
	return 0;
}

static void
fc_release(void *c, const QbDelivery *d, int n, long delay_ms)
{
	for (int i = 0; i < n; i++)
	{
		fc.msgs[d[i].handle].in_flight = false;
		fc.msgs[d[i].handle].releases++;
	}
	pthread_mutex_lock(&fc.fs->lock);
	fc.rows_at_release = fc.fs->nin;
	pthread_mutex_unlock(&fc.fs->lock);
}

static const QbConsumerOps fake_consumer = {
	.type = QB_SOURCE_KAFKA,
	.open = fc_open,
	.close = fc_close,
	.fd = fc_fd,
	.fetch = fc_fetch,
	.ack = fc_ack,
	.release = fc_release,
};

/* The engine finds the fake for kafka sources (linked with --wrap). */
const QbConsumerOps *__real_qb_consumer_ops(QbSourceType type);
const QbConsumerOps *__wrap_qb_consumer_ops(QbSourceType type);

const QbConsumerOps *
__wrap_qb_consumer_ops(QbSourceType type)
{
	return type == QB_SOURCE_KAFKA ? &fake_consumer : __real_qb_consumer_ops(type);
}

/* ---- the run ----------------------------------------------------------- */

static const char *const config =
	"http: { storeTimeoutMs: 1234 }\n"
	"sources:\n"
	"  web: { type: http, path: /w, idempotencyKeyPath: $.id, topic: w }\n"
	"  k: { type: kafka, brokers: \"127.0.0.1:9\", topics: [orders], idempotencyKeyPath: $.id,\n"
	"       batchSize: 4 }\n";

/* Done once every message is acknowledged. */
static bool
all_acked(void *arg)
{
	for (int i = 0; i < fc.nmsgs; i++)
		if (fc.msgs[i].acks == 0)
			return false;
	return true;
}

static FakeStore *
setup_fake(void)
{
	memset(&fc, 0, sizeof(fc));
	fc.fs = fake_store_new(config);
	fc.rows_at_release = -1;
	return fc.fs;
}

static void
run(QbConsumeStats *stats, TestHost *th)
{
	QbStore		store = fake_store_ops(fc.fs);
	char		err[256] = "";

	/* returns at once: a give-back's pause is only counted */
	test_host_init(th, all_acked, NULL, 10000, 0);
	th->quiet = true;
	assert_int_equal(qb_consume_run(&th->host, &store, 0, stats, err, sizeof(err)), 0);
	assert_false(th->timed_out);
}

/* ---- the tests --------------------------------------------------------- */

/*
 * Six messages in batches of four: each stored once, in one store call per
 * batch with http.storeTimeoutMs, and acknowledged once, after its row was
 * stored.
 */
static void
test_acked_after_commit(void **state)
{
	FakeStore  *fs = setup_fake();
	QbConsumeStats stats = {0};
	TestHost	th;
	static const char *const bodies[] = {
		"{\"id\": \"a\", \"n\": 1}", "{\"id\": \"b\", \"n\": 2}", "{\"id\": \"c\", \"n\": 3}",
		"{\"id\": \"d\", \"n\": 4}", "{\"id\": \"e\", \"n\": 5}", "{\"id\": \"f\", \"n\": 6}",
	};
	static const char *const keys[] = {"a", "b", "c", "d", "e", "f"};

	for (int i = 0; i < 6; i++)
		add_msg(bodies[i], NULL, keys[i]);
	assert_int_equal(fs->nin, 0);
	run(&stats, &th);
	assert_int_equal(fs->nin, 6);
	for (int i = 0; i < 6; i++)
	{
		FakeInRow  *r = fake_inbox_find(fs, "k", keys[i]);

		assert_non_null(r);
		assert_int_equal(r->state, ROW_PENDING);
		assert_string_equal(r->payload, bodies[i]);
		assert_int_equal(fc.msgs[i].acks, 1);
		assert_int_equal(fc.msgs[i].releases, 0);
	}
	assert_int_equal(fc.acked_unstored, 0);
	assert_int_equal(fs->ninserts, 2);
	assert_int_equal(fs->max_batch, 4);
	assert_int_equal(fs->insert_timeout_ms, 1234);
	assert_int_equal(fc.opens, 1);
	assert_int_equal(stats.batches, 2);
	assert_int_equal(stats.stored, 6);
	assert_int_equal(stats.duplicates, 0);
	assert_int_equal(stats.store_failures, 0);
	fake_store_free(fs);
}

/*
 * A store that fails: the batch is released, nothing acknowledged and no
 * row stored; fetched again, it is stored and acknowledged, each message
 * once.
 */
static void
test_store_failure_releases(void **state)
{
	FakeStore  *fs = setup_fake();
	QbConsumeStats stats = {0};
	TestHost	th;

	add_msg("{\"id\": \"x1\"}", NULL, "x1");
	add_msg("{\"id\": \"x2\"}", NULL, "x2");
	add_msg("{\"id\": \"x3\"}", NULL, "x3");
	fs->fail_inserts = 1;
	assert_int_equal(fs->nin, 0);
	run(&stats, &th);
	assert_int_equal(fc.rows_at_release, 0);	/* released with nothing stored */
	assert_int_equal(fs->nin, 3);
	for (int i = 0; i < 3; i++)
	{
		assert_int_equal(fc.msgs[i].releases, 1);
		assert_int_equal(fc.msgs[i].acks, 1);
	}
	assert_int_equal(fc.acked_unstored, 0);
	assert_int_equal(fs->ninserts, 2);
	assert_int_equal(fc.fetches, 2);
	assert_int_equal(stats.store_failures, 1);
	assert_int_equal(stats.batches, 1);
	assert_int_equal(stats.stored, 3);
	assert_true(th.nwaits >= 1);	/* it backed off before fetching again */
	assert_non_null(strstr(th.warned, "source \"k\": could not store 3 messages (the fake's insert failed); they go back to the broker"));
	fake_store_free(fs);
}

/*
 * Repeats: a key stored before and a key twice in one batch are each
 * acknowledged and counted as duplicates, not stored again.
 */
static void
test_duplicates_counted(void **state)
{
	FakeStore  *fs = setup_fake();
	QbConsumeStats stats = {0};
	TestHost	th;
	QbInboxRow	before = {.source = "k", .idempotency_key = "old", .payload = "{\"id\": \"old\"}"};
	int64_t		id;
	char		err[64];

	assert_int_equal(fake_inbox_insert(fs, &before, 1, 1000, &id, err, sizeof(err)), 0);
	add_msg("{\"id\": \"old\", \"again\": true}", NULL, "old");
	add_msg("{\"id\": \"new\"}", NULL, "new");
	add_msg("{\"id\": \"new\", \"again\": true}", NULL, "new");
	add_msg("{\"id\": \"other\"}", NULL, "other");
	assert_int_equal(fs->nin, 1);
	run(&stats, &th);
	assert_int_equal(fs->nin, 3);
	assert_string_equal(fake_inbox_find(fs, "k", "old")->payload, "{\"id\": \"old\"}");
	assert_string_equal(fake_inbox_find(fs, "k", "new")->payload, "{\"id\": \"new\"}");
	for (int i = 0; i < 4; i++)
		assert_int_equal(fc.msgs[i].acks, 1);
	assert_int_equal(fc.acked_unstored, 0);
	assert_int_equal(stats.duplicates, 2);
	assert_int_equal(stats.stored, 2);
	assert_int_equal(stats.batches, 1);
	fake_store_free(fs);
}

/*
 * A key with a control character is stored dead under no-key:<uuid>, with
 * the reason; a body that is not JSON is stored dead under its message id.
 * Both are acknowledged: the dead row keeps them.
 */
static void
test_unusable_stored_dead(void **state)
{
	FakeStore  *fs = setup_fake();
	QbConsumeStats stats = {0};
	TestHost	th;
	const char *ctl = "{\"id\": \"a\\u0001b\", \"n\": 1}";
	FakeInRow  *r = NULL;

	add_msg(ctl, NULL, NULL);
	add_msg("not json", "m-9", "m-9");
	add_msg("{\"id\": \"fine\"}", NULL, "fine");
	assert_int_equal(fs->nin, 0);
	run(&stats, &th);
	assert_int_equal(fs->nin, 3);
	for (int i = 0; i < fs->nin; i++)
		if (strcmp(fs->in[i].payload, ctl) == 0)
			r = &fs->in[i];
	assert_non_null(r);
	assert_int_equal(r->state, ROW_DEAD);
	assert_int_equal(strncmp(r->key, "no-key:", 7), 0);
	assert_int_equal(strlen(r->key), 7 + QB_UUID_LEN);
	assert_non_null(strstr(r->dead_error, "the message's idempotency key has a control character"));
	r = fake_inbox_find(fs, "k", "m-9");
	assert_non_null(r);
	assert_int_equal(r->state, ROW_DEAD);
	assert_string_equal(r->payload, "\"not json\"");
	assert_non_null(strstr(r->dead_error, "the message body is not JSON"));
	assert_int_equal(fake_inbox_find(fs, "k", "fine")->state, ROW_PENDING);
	for (int i = 0; i < 3; i++)
		assert_int_equal(fc.msgs[i].acks, 1);
	assert_int_equal(fc.acked_unstored, 0);
	assert_int_equal(stats.dead, 2);
	assert_int_equal(stats.stored, 1);
	fake_store_free(fs);
}

/*
 * A message with a position and an unusable key is dead under
 * no-key:<position>: delivered again (a replay from the broker's start),
 * it is a duplicate of that row, not a second dead row.
 */
static void
test_unusable_redelivered_once(void **state)
{
	FakeStore  *fs = setup_fake();
	QbConsumeStats stats = {0};
	TestHost	th;
	const char *ctl = "{\"id\": \"a\\u0001b\"}";

	add_msg(ctl, NULL, "no-key:t/0/7")->position = "t/0/7";
	add_msg(ctl, NULL, "no-key:t/0/7")->position = "t/0/7";
	run(&stats, &th);
	assert_int_equal(fs->nin, 1);
	assert_int_equal(fake_inbox_find(fs, "k", "no-key:t/0/7")->state, ROW_DEAD);
	for (int i = 0; i < 2; i++)
		assert_int_equal(fc.msgs[i].acks, 1);
	assert_int_equal(fc.acked_unstored, 0);
	assert_int_equal(stats.dead, 1);
	assert_int_equal(stats.duplicates, 1);
	fake_store_free(fs);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_acked_after_commit),
		cmocka_unit_test(test_store_failure_releases),
		cmocka_unit_test(test_duplicates_counted),
		cmocka_unit_test(test_unusable_stored_dead),
		cmocka_unit_test(test_unusable_redelivered_once),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
