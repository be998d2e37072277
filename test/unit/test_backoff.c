/*-------------------------------------------------------------------------
 * test_backoff.c
 *	  Unit tests of qb_backoff.c: delays, their bounds, the random draw.
 *
 * The policy used throughout is the default one unless a test says
 * otherwise: initialMs 1000, maxMs 3600000, multiplier 2, jitter 0.2.
 *-------------------------------------------------------------------------
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/wait.h>
#include <cmocka.h>

#include "qb_backoff.h"

static const QbBackoff dflt = {1000, 3600000, 2.0, 0.2};

/* the largest double below 1: the top of the draw's range */
#define R_TOP	0.99999999999999989

static void
test_no_jitter(void **state)
{
	QbBackoff	b = {1000, 3600000, 2.0, 0.0};
	long		want = 1000;
	int			n;

	for (n = 1; n <= 12; n++, want *= 2)
	{
		assert_int_equal(qb_backoff_delay_ms(&b, n, 0.0), want);
		assert_int_equal(qb_backoff_delay_ms(&b, n, 0.5), want);
		assert_int_equal(qb_backoff_delay_ms(&b, n, R_TOP), want);
	}
	/* 1000 * 2^12 = 4096000 > maxMs: capped from attempt 13 on */
	for (n = 13; n <= 200; n++)
		assert_int_equal(qb_backoff_delay_ms(&b, n, 0.5), 3600000);

	/* a multiplier of 1 keeps the delay constant; a fraction works */
	b.multiplier = 1.0;
	assert_int_equal(qb_backoff_delay_ms(&b, 1, 0.3), 1000);
	assert_int_equal(qb_backoff_delay_ms(&b, 1000000, 0.3), 1000);
	b.multiplier = 1.5;
	assert_int_equal(qb_backoff_delay_ms(&b, 3, 0.0), 2250);
}

static void
test_jitter_bounds(void **state)
{
	int			n;

	/* attempt 1 = initialMs +/- 20 % */
	assert_int_equal(qb_backoff_delay_ms(&dflt, 1, 0.0), 800);
	assert_int_equal(qb_backoff_delay_ms(&dflt, 1, 0.5), 1000);
	assert_int_equal(qb_backoff_delay_ms(&dflt, 1, R_TOP), 1200);
	assert_int_equal(qb_backoff_delay_ms(&dflt, 2, 0.0), 1600);
	assert_int_equal(qb_backoff_delay_ms(&dflt, 2, R_TOP), 2400);
	assert_int_equal(qb_backoff_delay_ms(&dflt, 3, 0.25), 3600);

	/* at the cap, jitter spreads below maxMs and never past it */
	for (n = 13; n < 40; n++)
	{
		assert_int_equal(qb_backoff_delay_ms(&dflt, n, 0.0), 2880000);
		assert_int_equal(qb_backoff_delay_ms(&dflt, n, 0.5), 3600000);
		assert_int_equal(qb_backoff_delay_ms(&dflt, n, 0.75), 3600000);
		assert_int_equal(qb_backoff_delay_ms(&dflt, n, R_TOP), 3600000);
	}

	/* jitter 1: from 0 to twice the base */
	{
		QbBackoff	b = {1000, 3600000, 2.0, 1.0};

		assert_int_equal(qb_backoff_delay_ms(&b, 1, 0.0), 0);
		assert_int_equal(qb_backoff_delay_ms(&b, 1, R_TOP), 2000);
	}
}

static void
test_random_draws(void **state)
{
	long		lo1 = LONG_MAX,
				hi1 = 0,
				locap = LONG_MAX,
				hicap = 0;
	double		rmin = 1,
				rmax = 0,
				sum = 0;
	int			i;
	int			buckets[10] = {0};

	for (i = 0; i < 200000; i++)
	{
		double		r = qb_random_unit();
		long		d1,
					dc;

		assert_true(r >= 0.0 && r < 1.0);
		rmin = fmin(rmin, r);
		rmax = fmax(rmax, r);
		sum += r;
		buckets[(int) (r * 10)]++;
		d1 = qb_backoff_delay_ms(&dflt, 1, r);
		dc = qb_backoff_delay_ms(&dflt, 30, r);
		lo1 = d1 < lo1 ? d1 : lo1;
		hi1 = d1 > hi1 ? d1 : hi1;
		locap = dc < locap ? dc : locap;
		hicap = dc > hicap ? dc : hicap;
	}
	assert_true(rmin < 0.001);
	assert_true(rmax > 0.999);
	assert_true(fabs(sum / 200000 - 0.5) < 0.01);
	for (i = 0; i < 10; i++)
		assert_true(buckets[i] > 18000 && buckets[i] < 22000);
	/* every delay inside the band, and the band is used to its edges */
	assert_true(lo1 >= 800 && lo1 <= 805);
	assert_true(hi1 <= 1200 && hi1 >= 1195);
	assert_true(locap >= 2880000 && locap <= 2881000);
	assert_int_equal(hicap, 3600000);
}

static void
test_no_overflow(void **state)
{
	QbBackoff	big = {LONG_MAX, LONG_MAX, 10.0, 0.2};
	QbBackoff	huge_mult = {1000, 3600000, 1e300, 0.0};
	QbBackoff	bad = {1000, 3600000, NAN, NAN};
	QbBackoff	neg = {-5, -7, -2.0, -1.0};
	QbBackoff	nojit = {1000, 3600000, 2.0, 0.0};
	long		d;

	assert_int_equal(qb_backoff_delay_ms(&nojit, INT_MAX, 0.5), 3600000);
	assert_int_equal(qb_backoff_delay_ms(&dflt, INT_MAX, 0.0), 2880000);
	assert_int_equal(qb_backoff_delay_ms(&dflt, INT_MAX, R_TOP), 3600000);
	assert_int_equal(qb_backoff_delay_ms(&huge_mult, 1, 0.5), 1000);
	assert_int_equal(qb_backoff_delay_ms(&huge_mult, 3, 0.5), 3600000);
	huge_mult.multiplier = INFINITY;
	assert_int_equal(qb_backoff_delay_ms(&huge_mult, 1, 0.5), 1000);
	assert_int_equal(qb_backoff_delay_ms(&huge_mult, 2, 0.5), 3600000);

	/* the largest bounds a long allows: no signed overflow, no UB cast */
	d = qb_backoff_delay_ms(&big, INT_MAX, R_TOP);
	assert_int_equal(d, LONG_MAX);
	d = qb_backoff_delay_ms(&big, INT_MAX, 0.0);
	assert_true(d > 0 && d < LONG_MAX);

	/* nonsense in, a sane delay out */
	d = qb_backoff_delay_ms(&bad, 5, 0.5);
	assert_int_equal(d, 1000);	/* multiplier NaN -> 1, jitter NaN -> 0 */
	assert_int_equal(qb_backoff_delay_ms(&neg, 3, 0.5), 0);
	neg.max_ms = 5000;			/* an initial delay of 0 stays 0 */
	assert_int_equal(qb_backoff_delay_ms(&neg, INT_MAX, 0.5), 0);
	assert_int_equal(qb_backoff_delay_ms(&dflt, 0, 0.0), 800);	/* as attempt 1 */
	assert_int_equal(qb_backoff_delay_ms(&dflt, -9, 0.0), 800);
	assert_int_equal(qb_backoff_delay_ms(&dflt, 1, NAN), 800);	/* as r = 0 */
	assert_int_equal(qb_backoff_delay_ms(&dflt, 1, -3.0), 800);
	assert_int_equal(qb_backoff_delay_ms(&dflt, 1, 1.0), 1200);	/* as r -> 1 */
	assert_int_equal(qb_backoff_delay_ms(&dflt, 1, 7.0), 1200);
	{
		QbBackoff	j = {1000, 3600000, 2.0, 5.0};	/* jitter clamped to 1 */

		assert_int_equal(qb_backoff_delay_ms(&j, 1, 0.0), 0);
		assert_int_equal(qb_backoff_delay_ms(&j, 1, 0.75), 1500);
	}
}

static void *
thread_draw(void *arg)
{
	*(double *) arg = qb_random_unit();
	return NULL;
}

/*
 * Two threads, and a parent and its forked child, must not share a
 * sequence: sibling workers would otherwise retry in lockstep.
 */
static void
test_random_independent(void **state)
{
	double		a,
				b;
	pthread_t	th;
	int			fds[2];
	pid_t		pid;
	int			status;

	(void) qb_random_unit();	/* seed this thread first */
	assert_int_equal(pthread_create(&th, NULL, thread_draw, &a), 0);
	pthread_join(th, NULL);
	assert_int_equal(pthread_create(&th, NULL, thread_draw, &b), 0);
	pthread_join(th, NULL);
	assert_true(a != b);

	assert_int_equal(pipe(fds), 0);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0)
	{
		double		c = qb_random_unit();

		if (write(fds[1], &c, sizeof(c)) != (ssize_t) sizeof(c))
			_exit(1);
		_exit(0);
	}
	close(fds[1]);
	assert_int_equal(read(fds[0], &b, sizeof(b)), (ssize_t) sizeof(b));
	close(fds[0]);
	waitpid(pid, &status, 0);
	assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	a = qb_random_unit();
	assert_true(a != b);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_no_jitter),
		cmocka_unit_test(test_jitter_bounds),
		cmocka_unit_test(test_random_draws),
		cmocka_unit_test(test_no_overflow),
		cmocka_unit_test(test_random_independent),
	};

	return cmocka_run_group_tests_name("qb_backoff", tests, NULL, NULL);
}
