/*-------------------------------------------------------------------------
 * qb_clock.c
 *	  The monotonic clock and the wall clock (qb_clock.h).
 *-------------------------------------------------------------------------
 */
#include <time.h>

#include "qb_clock.h"

/* qb_now_ms: see qb_clock.h. */
long
qb_now_ms(void)
{
	return (long) (qb_now_ns() / 1000000);
}

/* qb_now_ns: see qb_clock.h. */
int64_t
qb_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t) ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* qb_wall_ms: see qb_clock.h. */
int64_t
qb_wall_ms(void)
{
	return qb_wall_ns() / 1000000;
}

/* qb_wall_ns: see qb_clock.h. */
int64_t
qb_wall_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t) ts.tv_sec * 1000000000 + ts.tv_nsec;
}
