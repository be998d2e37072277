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
	assert_int_equal(qb_ratelimit_take(&b, &l, T0, 8), 8);
	qb_ratelimit_give(&b, &l, 5);
	assert_int_equal(qb_ratelimit_available(&b, &l, T0), 7);
	/* never above burst */
	qb_ratelimit_give(&b, &l, 100);
	assert_int_equal(qb_ratelimit_available(&b, &l, T0), 10);
	qb_ratelimit_give(&b, &l, -3);
	assert_int_equal(qb_ratelimit_available(&b, &l, T0), 10);
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
		cmocka_unit_test(test_wait),
		cmocka_unit_test(test_lowered_burst_and_clock),
		cmocka_unit_test(test_twenty_seconds),
	};

	return cmocka_run_group_tests_name("qb_ratelimit", tests, NULL, NULL);
}
