/*-------------------------------------------------------------------------
 * test_ratelimit.c
 *	  Unit tests of qb_ratelimit.c, the token bucket of a destination's
 *	  rateLimit: a full start, refill at perSecond up to burst, whole
 *	  tokens only, give-back, the wait for n tokens, a lowered burst, and
 *	  the count over 20 s that TAP 066 judges from the sink's side.
 *-------------------------------------------------------------------------
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "qb_ratelimit.h"

#define MS	1000000LL			/* ns */
#define T0	(1000 * 1000 * MS)	/* any monotonic start */

static void
test_default_burst(void **state)
{
	(void) state;
	assert_int_equal(qb_ratelimit_default_burst(50), 50);
	assert_int_equal(qb_ratelimit_default_burst(2.5), 3);
	assert_int_equal(qb_ratelimit_default_burst(0.001), 1);
	assert_int_equal(qb_ratelimit_default_burst(1000000), 1000000);
}

static void
test_full_then_refill(void **state)
{
	QbRateLimit l = {50, 50};
	QbRateBucket b = {0};

	(void) state;
	/* never used: full */
	assert_int_equal(qb_ratelimit_take(&b, &l, T0, 80), 50);
	assert_int_equal(qb_ratelimit_take(&b, &l, T0, 1), 0);
	/* 50/s: one token each 20 ms, none before */
	assert_int_equal(qb_ratelimit_take(&b, &l, T0 + 19 * MS, 1), 0);
	assert_int_equal(qb_ratelimit_take(&b, &l, T0 + 20 * MS, 5), 1);
	assert_int_equal(qb_ratelimit_take(&b, &l, T0 + 120 * MS, 10), 5);
	/* a long idle fills it to burst, not beyond */
	assert_int_equal(qb_ratelimit_available(&b, &l, T0 + 3600 * 1000 * MS), 50);
}

static void
test_fractional_rate(void **state)
{
	QbRateLimit l = {0.5, 1};
	QbRateBucket b = {0};

	(void) state;
	assert_int_equal(qb_ratelimit_take(&b, &l, T0, 1), 1);
	assert_int_equal(qb_ratelimit_take(&b, &l, T0 + 1999 * MS, 1), 0);
	assert_int_equal(qb_ratelimit_take(&b, &l, T0 + 2000 * MS, 1), 1);
	/* a third of a token each: 3 * (1/3) is one whole token, not 0.999... */
	l.per_sec = 1;
	l.burst = 3;
	b.tokens = 0;
	b.at_ns = T0;
	for (int i = 1; i <= 2; i++)
		qb_ratelimit_refill(&b, &l, T0 + i * 333333333LL);
	assert_int_equal(qb_ratelimit_available(&b, &l, T0 + 999999000LL), 0);
	assert_int_equal(qb_ratelimit_available(&b, &l, T0 + 999999999LL), 1);
}

static void
test_give_back(void **state)
{
	QbRateLimit l = {10, 10};
	QbRateBucket b = {0};

	(void) state;
	assert_int_equal(qb_ratelimit_reserve(&b, &l, T0, 8), 8);
	qb_ratelimit_give(&b, &l, T0, 5);
	assert_int_equal(qb_ratelimit_available(&b, &l, T0), 7);
	/* never above burst */
	qb_ratelimit_give(&b, &l, T0, 100);
	assert_int_equal(qb_ratelimit_available(&b, &l, T0), 10);
	qb_ratelimit_give(&b, &l, T0, -3);
	assert_int_equal(qb_ratelimit_available(&b, &l, T0), 10);
}

/* tokens reserved are out: the bucket refills up to burst less them */
static void
test_out_caps_refill(void **state)
{
	QbRateLimit l = {50, 50};
	QbRateBucket b = {0};

	(void) state;
	assert_int_equal(qb_ratelimit_reserve(&b, &l, T0, 50), 50);
	/* a second later the claim that reserved them has not sent: nothing more */
	assert_int_equal(qb_ratelimit_available(&b, &l, T0 + 1000 * MS), 0);
	/* 30 are spent, 20 still out: the bucket may refill up to 30 */
	qb_ratelimit_spend(&b, &l, T0 + 1000 * MS, 30);
	assert_int_equal(qb_ratelimit_available(&b, &l, T0 + 1000 * MS), 0);
	assert_int_equal(qb_ratelimit_available(&b, &l, T0 + 1200 * MS), 10);
	assert_int_equal(qb_ratelimit_available(&b, &l, T0 + 2000 * MS), 30);
	/* more spent than is out: what is out, no more */
	qb_ratelimit_spend(&b, &l, T0 + 2000 * MS, 100);
	assert_int_equal(b.out, 0);
	assert_int_equal(qb_ratelimit_available(&b, &l, T0 + 2200 * MS), 40);
	/* given back: in the bucket again, at once */
	assert_int_equal(qb_ratelimit_reserve(&b, &l, T0 + 2200 * MS, 40), 40);
	qb_ratelimit_give(&b, &l, T0 + 2200 * MS, 15);
	assert_int_equal(b.out, 25);
	assert_int_equal(qb_ratelimit_available(&b, &l, T0 + 2200 * MS), 15);
	assert_int_equal(qb_ratelimit_available(&b, &l, T0 + 5000 * MS), 25);
}

/*
 * spent: the times (ms from T0) of n spent tokens in order; no stretch of
 * time from one to another holds more than burst + perSecond a second.
 */
static void
assert_spends_held(const int64_t *spent, int n, const QbRateLimit *l)
{
	for (int i = 0; i < n; i++)
		for (int j = i; j < n; j++)
			assert_true(j - i + 1 <= l->burst + l->per_sec * (spent[j] - spent[i]) / 1000.0 + 1e-6);
}

/*
 * 20 s of two takers on one bucket: each second one reserves at 0 ms and
 * spends what it got at 900 ms (a slow claim); the other takes 3 every
 * 13 ms from 900 ms to the second's end, when the first's tokens go out.
 * Without the cap the second would take, beside the first's 50, the 45
 * the bucket gained meanwhile.
 */
static void
test_late_spends_held(void **state)
{
	QbRateLimit l = {50, 50};
	QbRateBucket b = {0};
	static int64_t spent[2000];
	int			pending = 0;
	int			n = 0;

	(void) state;
	for (int64_t t = 0; t <= 20000; t++)
	{
		int			k;

		if (t % 1000 == 900)
		{
			qb_ratelimit_spend(&b, &l, T0 + t * MS, pending);
			for (k = pending; k > 0 && n < 2000; k--)
				spent[n++] = t;
		}
		if (t % 1000 == 0)
			pending = qb_ratelimit_reserve(&b, &l, T0 + t * MS, 100);
		if (t % 1000 >= 900 && t % 13 == 0)
			for (k = qb_ratelimit_take(&b, &l, T0 + t * MS, 3); k > 0 && n < 2000; k--)
				spent[n++] = t;
	}
	assert_true(n > 20 * 20 && n < 2000);
	assert_spends_held(spent, n, &l);
}

static void
test_wait(void **state)
{
	QbRateLimit l = {50, 50};
	QbRateBucket b = {0};

	(void) state;
	assert_int_equal(qb_ratelimit_wait_ms(&b, &l, T0, 1), 0);
	assert_int_equal(qb_ratelimit_take(&b, &l, T0, 50), 50);
	assert_int_equal(qb_ratelimit_wait_ms(&b, &l, T0, 1), 20);
	assert_int_equal(qb_ratelimit_wait_ms(&b, &l, T0, 10), 200);
	assert_int_equal(qb_ratelimit_wait_ms(&b, &l, T0 + 5 * MS, 1), 15);
	assert_int_equal(qb_ratelimit_wait_ms(&b, &l, T0 + 5 * MS, 10), 195);
	/* more than burst waits for burst */
	assert_int_equal(qb_ratelimit_wait_ms(&b, &l, T0 + 5 * MS, 500), 995);
}

static void
test_lowered_burst_and_clock(void **state)
{
	QbRateLimit l = {100, 100};
	QbRateLimit low = {100, 10};
	QbRateBucket b = {0};

	(void) state;
	assert_int_equal(qb_ratelimit_available(&b, &l, T0), 100);
	/* a reload lowers the burst: the tokens above it are dropped */
	assert_int_equal(qb_ratelimit_available(&b, &low, T0), 10);
	assert_int_equal(qb_ratelimit_take(&b, &low, T0, 10), 10);
	/* another process's earlier clock read adds nothing and takes no time back */
	assert_int_equal(qb_ratelimit_available(&b, &low, T0 - 500 * MS), 0);
	assert_int_equal(qb_ratelimit_available(&b, &low, T0 + 10 * MS), 1);
}

/* 2 takers polling every 7 and 13 ms for 20 s: burst + 20 s of perSecond, no more */
static void
test_twenty_seconds(void **state)
{
	QbRateLimit l = {50, 50};
	QbRateBucket b = {0};
	long		n = 0;

	(void) state;
	for (int64_t t = 0; t <= 20000; t++)
	{
		if (t % 7 == 0)
			n += qb_ratelimit_take(&b, &l, T0 + t * MS, 100);
		if (t % 13 == 0 || t == 20000)
			n += qb_ratelimit_take(&b, &l, T0 + t * MS, 3);
	}
	assert_int_equal(n, 50 + 50 * 20);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_default_burst),
		cmocka_unit_test(test_full_then_refill),
		cmocka_unit_test(test_fractional_rate),
		cmocka_unit_test(test_give_back),
		cmocka_unit_test(test_out_caps_refill),
		cmocka_unit_test(test_late_spends_held),
		cmocka_unit_test(test_wait),
		cmocka_unit_test(test_lowered_burst_and_clock),
		cmocka_unit_test(test_twenty_seconds),
	};

	return cmocka_run_group_tests_name("qb_ratelimit", tests, NULL, NULL);
}
