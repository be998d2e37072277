/*-------------------------------------------------------------------------
 * qb_clock.h
 *	  The monotonic clock (qb_clock.c), for deadlines and timings anywhere
 *	  in the core: the engines, publishers and consumers read the same one.
 *-------------------------------------------------------------------------
 */
#ifndef QB_CLOCK_H
#define QB_CLOCK_H

/* Milliseconds on the monotonic clock: deadlines and timings. */
extern long qb_now_ms(void);

#endif							/* QB_CLOCK_H */
