/*-------------------------------------------------------------------------
 * test_relay_engine.c
 *	  The relay engine loop (qb_relay_run) against the fake store of
 *	  fake_store.h and the fake host of test_host.h.
 *
 * The fake store keeps push inbox rows in memory: a claim takes pending
 * rows (and processing ones whose lease ran out on the host's clock, the
 * time the engine asked to wait) in id order, up to the batch size, under
 * the claim's token; a forward settles only rows still holding that token
 * (processed with the topic it was given, or dead for ""), as the SQL
 * does.  It can fail its next calls (-1) and have other relays take rows
 * over between a claim and its forward.  So these tests pin down what the
 * engine asks of any store: the rendered topic of each row, each row
 * forwarded exactly once, the batch size, lease and maxAttempts it passes,
 * when it waits and when it claims again at once.  The SQL behind the same
 * calls is tested by pg_regress and the isolation specs.
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

#include "qb_relay.h"
#include "fake_store.h"
#include "test_host.h"

/* ---- the fake store (fake_store.h) and what a test adds to it ------- */

typedef struct Fake
{
	FakeStore	fs;				/* first: the store's ctx is the Fake; fs.th is th */
	const char *next_config;	/* after switch_after_waits waits, this one */
	int			switch_after_waits;
	int			stop_after_waits;	/* > 0: stop after this many waits */
	int			min_empty_claims;	/* done only after this many empty claims */
	TestHost	th;
} Fake;

/* The stored configuration, switched to next_config after enough waits. */
static int
relay_config_load(void *ctx, char **text, char *err, size_t errlen)
{
	Fake	   *f = ctx;		/* fs is its first member */

	if (f->next_config && f->th.nwaits >= f->switch_after_waits)
	{
		fake_store_set_config(&f->fs, f->next_config);
		f->next_config = NULL;
	}
	return fake_config_load(&f->fs, text, err, errlen);
}

/* Done: every row final and enough empty claims seen, or enough waits. */
static bool
fake_done(void *arg)
{
	Fake	   *f = arg;

	if (f->stop_after_waits > 0)
		return f->th.nwaits >= f->stop_after_waits;
	for (int i = 0; i < f->fs.nin; i++)
		if (f->fs.in[i].state == ROW_PENDING || f->fs.in[i].state == ROW_PROCESSING)
			return false;
	return f->fs.empty_claims >= f->min_empty_claims;
}

static const char *const base_config =
	"inbox:\n"
	"  relay: { batchSize: 4, pollIntervalMs: 50, claimTimeoutMs: 1000, maxAttempts: 7 }\n"
	"sources:\n"
	"  stripe: { type: http, path: /stripe, idempotencyKeyPath: $.id, eventTypePath: $.type,\n"
	"            topic: \"stripe.{{ eventType }}\" }\n"
	"  plain: { type: http, path: /plain, idempotencyKeyPath: $.id, topic: \"in.{{ source }}\" }\n"
	"  bare: { type: http, path: /bare, idempotencyKeyPath: $.id, eventTypePath: $.type }\n";

static Fake *
fake_new(const char *config)
{
	Fake	   *f = calloc(1, sizeof(Fake));

	fake_store_init(&f->fs, config);
	f->fs.th = &f->th;
	f->fs.next_in_id = 100;
	f->min_empty_claims = 1;
	/* returns at once: the time asked for is counted on th.clock_ms */
	test_host_init(&f->th, fake_done, f, 10000, 0);
	return f;
}

static void
fake_free(Fake *f)
{
	fake_store_destroy(&f->fs);
	free(f);
}

static FakeInRow *
add_row(Fake *f, const char *source, const char *event_type)
{
	FakeInRow  *r = fake_inbox_add(&f->fs, source, event_type);

	assert_non_null(r);
	return r;
}

static void
run(Fake *f, QbRelayStats *stats)
{
	QbStore		store = fake_store_ops(&f->fs);
	char		err[256] = "";

	store.config_load = relay_config_load;
	assert_int_equal(qb_relay_run(&f->th.host, &store, stats, err, sizeof(err)), 0);
	assert_false(f->th.timed_out);
}

/* ---- the tests --------------------------------------------------------- */

/*
 * Each row is forwarded once with its source's rendered topic; an empty
 * rendering is forwarded as "" (dead); a source the configuration no
 * longer has gets the default template.  A full batch is followed by a
 * claim at once, a short one by a wait of pollIntervalMs; polled hears
 * found true for each batch and false for the empty claim; the stats and
 * the metrics count it all.
 */
static void
test_forwards_rendered_topics(void **state)
{
	Fake	   *f = fake_new(base_config);
	QbRelayStats stats = {0};
	QbMetrics	metrics;
	FakeInRow  *charge = add_row(f, "stripe", "charge.ok");
	FakeInRow  *plain = add_row(f, "plain", NULL);
	FakeInRow  *plain_typed = add_row(f, "plain", "ignored");
	FakeInRow  *bare_empty = add_row(f, "bare", NULL);
	FakeInRow  *bare = add_row(f, "bare", "order.paid");
	FakeInRow  *gone = add_row(f, "gone", "legacy.event");
	FakeInRow  *gone_empty = add_row(f, "gone", NULL);

	f->th.quiet = true;
	qb_metrics_init(&metrics);
	f->th.host.metrics = &metrics;
	run(f, &stats);

	assert_string_equal(charge->topic, "stripe.charge.ok");
	assert_string_equal(plain->topic, "in.plain");
	assert_string_equal(plain_typed->topic, "in.plain");
	assert_string_equal(bare_empty->topic, "");
	assert_int_equal(bare_empty->state, ROW_DEAD);
	assert_string_equal(bare->topic, "order.paid");
	assert_string_equal(gone->topic, "legacy.event");
	assert_int_equal(gone->state, ROW_PROCESSED);
	assert_string_equal(gone_empty->topic, "");
	assert_int_equal(gone_empty->state, ROW_DEAD);
	for (int i = 0; i < f->fs.nin; i++)
		assert_int_equal(f->fs.in[i].forwards, 1);
	/* the unknown source said once, the dead rows once per batch */
	assert_int_equal(f->th.warnings, 3);
	assert_non_null(strstr(f->th.warned, "inbox row 105 is of source \"gone\", which the configuration no longer has"));
	assert_non_null(strstr(f->th.warned, "1 inbox rows went to dead"));

	/* 7 rows, batches of 4: full, then 3, then an empty claim */
	assert_int_equal(f->fs.nin_claims, 3);
	assert_int_equal(f->fs.in_claims[0].nrows, 4);
	assert_int_equal(f->fs.in_claims[1].nrows, 3);
	assert_int_equal(f->fs.in_claims[2].nrows, 0);
	assert_int_equal(f->fs.in_claims[1].waits_before, f->fs.in_claims[0].waits_before);	/* at once */
	assert_int_equal(f->fs.in_claims[2].waits_before, f->fs.in_claims[1].waits_before + 1);
	for (int c = 0; c < f->fs.nin_claims; c++)
	{
		assert_int_equal(f->fs.in_claims[c].batch_size, 4);
		assert_int_equal(f->fs.in_claims[c].lease_ms, 1000);
	}
	assert_int_equal(f->fs.max_attempts, 7);
	assert_int_equal(f->th.npolled, 3);
	assert_int_equal(f->th.nfound, 2);
	assert_int_equal(f->th.last_wait_ms, 50);	/* pollIntervalMs after the empty claim */
	assert_int_equal(f->th.nloaded, 1);

	assert_int_equal(stats.batches, 2);
	assert_int_equal(stats.forwarded, 5);
	assert_int_equal(stats.dead, 2);
	assert_int_equal(stats.taken_over, 0);
	assert_int_equal(metrics.relay_forwarded, 5);
	assert_int_equal(metrics.relay_dead, 2);
	fake_free(f);
}

/*
 * A source's onDead: holdKey: the forward says, per row, that a dead row
 * holds its aggregate; rows of other sources, of a source no longer
 * configured, and forwarded rows do not; the warning says so.
 */
static void
test_hold_key_per_source(void **state)
{
	Fake	   *f = fake_new("sources:\n"
							 "  held: { type: http, path: /h, idempotencyKeyPath: $.id, eventTypePath: $.type,\n"
							 "          onDead: holdKey }\n"
							 "  free: { type: http, path: /f, idempotencyKeyPath: $.id, eventTypePath: $.type }\n");
	QbRelayStats stats = {0};
	FakeInRow  *held_dead = add_row(f, "held", NULL);
	FakeInRow  *held_ok = add_row(f, "held", "a.b");
	FakeInRow  *free_dead = add_row(f, "free", NULL);
	FakeInRow  *gone_dead = add_row(f, "gone", NULL);

	f->th.quiet = true;
	run(f, &stats);
	assert_int_equal(held_dead->state, ROW_DEAD);
	assert_true(held_dead->held);
	assert_int_equal(held_ok->state, ROW_PROCESSED);
	assert_false(held_ok->held);
	assert_int_equal(free_dead->state, ROW_DEAD);
	assert_false(free_dead->held);
	assert_int_equal(gone_dead->state, ROW_DEAD);
	assert_false(gone_dead->held);
	assert_non_null(strstr(f->th.warned, "those of a source with onDead: holdKey hold their aggregate"));
	assert_int_equal(stats.dead, 3);
	fake_free(f);
}

/* A forward that settles fewer rows than were claimed counts them taken over. */
static void
test_taken_over_counted(void **state)
{
	Fake	   *f = fake_new(base_config);
	QbRelayStats stats = {0};

	for (int i = 0; i < 3; i++)
		add_row(f, "plain", NULL);
	f->fs.steal = 2;
	f->th.quiet = true;
	run(f, &stats);
	assert_int_equal(f->fs.in[0].state, ROW_TAKEN);
	assert_int_equal(f->fs.in[1].state, ROW_TAKEN);
	assert_int_equal(f->fs.in[2].state, ROW_PROCESSED);
	assert_int_equal(f->fs.in[2].forwards, 1);
	assert_int_equal(stats.batches, 1);
	assert_int_equal(stats.forwarded, 1);
	assert_int_equal(stats.dead, 0);
	assert_int_equal(stats.taken_over, 2);
	fake_free(f);
}

/*
 * A failing claim makes the engine wait (1 s) and claim again; a failing
 * forward is tried three times, then the rows wait for their lease and are
 * claimed and forwarded again: every row forwarded exactly once, none lost.
 * polled hears nothing of a round that failed.
 */
static void
test_store_failure_waits_and_retries(void **state)
{
	Fake	   *f = fake_new(base_config);
	QbRelayStats stats = {0};

	for (int i = 0; i < 3; i++)
		add_row(f, "stripe", "a.b");
	f->fs.fail_claims = 2;
	f->fs.fail_forwards = 3;
	f->th.quiet = true;
	run(f, &stats);
	for (int i = 0; i < f->fs.nin; i++)
	{
		assert_int_equal(f->fs.in[i].state, ROW_PROCESSED);
		assert_int_equal(f->fs.in[i].forwards, 1);
		assert_string_equal(f->fs.in[i].topic, "stripe.a.b");
	}
	/* 2 failed claims, 1 claim whose forward failed 3 times, 1 that forwarded, 1 empty */
	assert_int_equal(f->fs.nin_claims, 5);
	assert_int_equal(f->fs.nforwards, 4);
	assert_int_equal(f->fs.in_claims[1].waits_before, f->fs.in_claims[0].waits_before + 1);
	assert_int_equal(f->fs.in_claims[2].nrows, 3);
	assert_int_equal(f->fs.in_claims[3].nrows, 3);	/* the same rows, their lease over */
	assert_true(f->th.clock_ms >= 2 * 1000 + 200 + 400 + 1000);
	assert_int_equal(stats.batches, 1);
	assert_int_equal(stats.forwarded, 3);
	assert_int_equal(f->th.npolled, 2);
	assert_int_equal(f->th.nfound, 1);
	assert_non_null(strstr(f->th.warned, "could not forward a batch of 3 rows"));
	fake_free(f);
}

/*
 * inbox.relay.enabled false claims nothing, whatever waits; a change that
 * turns it on makes the rows flow.
 */
static void
test_disabled_claims_nothing(void **state)
{
	Fake	   *f = fake_new("inbox: { relay: { enabled: false } }\n"
							 "sources:\n"
							 "  plain: { type: http, path: /plain, idempotencyKeyPath: $.id, topic: x }\n");
	QbRelayStats stats = {0};

	add_row(f, "plain", NULL);
	f->stop_after_waits = 5;
	run(f, &stats);
	assert_int_equal(f->fs.nin_claims, 0);
	assert_int_equal(f->fs.in[0].state, ROW_PENDING);
	assert_int_equal(f->th.last_wait_ms, 5000);
	assert_int_equal(f->th.npolled, 0);
	assert_int_equal(stats.batches, 0);

	/* turned on: config_changed once more, the new document is loaded */
	f->next_config = base_config;
	f->switch_after_waits = 0;
	f->stop_after_waits = 0;
	f->th.deadline_ms = test_now_ms() + 10000;
	test_host_change(&f->th);
	run(f, &stats);
	assert_int_equal(f->fs.in[0].state, ROW_PROCESSED);
	assert_string_equal(f->fs.in[0].topic, "in.plain");
	assert_int_equal(stats.forwarded, 1);
	assert_int_equal(f->th.nloaded, 2);
	fake_free(f);
}

/*
 * With no configuration stored the relay claims nothing and looks again
 * after each wait, telling config_loaded of no configuration; once one is
 * stored it works without a change being reported.
 */
static void
test_no_config_waits(void **state)
{
	Fake	   *f = fake_new(NULL);
	QbRelayStats stats = {0};

	add_row(f, "plain", NULL);
	f->next_config = base_config;
	f->switch_after_waits = 3;
	run(f, &stats);
	assert_int_equal(f->fs.in[0].state, ROW_PROCESSED);
	assert_int_equal(f->fs.in_claims[0].waits_before, 3);
	assert_int_equal(f->th.nloaded_null, 3);
	assert_int_equal(f->th.nloaded, 4);
	assert_int_equal(stats.forwarded, 1);
	fake_free(f);
}

/* A stop asked before the first look ends the loop at once, cleanly. */
static bool
always(void *arg)
{
	return true;
}

static void
test_stop_ends_cleanly(void **state)
{
	Fake	   *f = fake_new(base_config);
	QbRelayStats stats = {0};

	add_row(f, "plain", NULL);
	f->th.done = always;
	run(f, &stats);
	assert_int_equal(f->fs.nin_claims, 0);
	assert_int_equal(f->th.nwaits, 0);
	assert_int_equal(f->fs.in[0].state, ROW_PENDING);
	/* and with stats NULL, stopped after a few rounds of an idle relay */
	f->th.done = fake_done;
	f->stop_after_waits = 3;
	f->fs.in[0].state = ROW_DEAD;
	run(f, NULL);
	assert_int_equal(f->fs.nin_claims, 3);
	fake_free(f);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_forwards_rendered_topics),
		cmocka_unit_test(test_taken_over_counted),
		cmocka_unit_test(test_hold_key_per_source),
		cmocka_unit_test(test_store_failure_waits_and_retries),
		cmocka_unit_test(test_disabled_claims_nothing),
		cmocka_unit_test(test_no_config_waits),
		cmocka_unit_test(test_stop_ends_cleanly),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
