/*-------------------------------------------------------------------------
 * qb_clock.c
 *	  The monotonic clock (qb_clock.h).
 *-------------------------------------------------------------------------
 */
#include <time.h>

#include "qb_clock.h"

/* qb_now_ms: see qb_clock.h. */
long
qb_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}
