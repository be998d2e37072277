/*-------------------------------------------------------------------------
 * qb_clock.h
 *	  The clocks (qb_clock.c), the only ones in src/: the monotonic clock
 *	  for deadlines and timings anywhere in the core (the engines,
 *	  publishers and consumers read the same one), and the wall clock for
 *	  times shown or exported (the overview, spans, rates).  clock_gettime
 *	  elsewhere only makes pthread's absolute deadlines or seeds the RNG.
 *-------------------------------------------------------------------------
 */
#ifndef QB_CLOCK_H
#define QB_CLOCK_H

#include <stdint.h>

/* Milliseconds on the monotonic clock: deadlines and timings. */
extern long qb_now_ms(void);
/* The same clock in ns: stamps that must order events milliseconds apart. */
extern int64_t qb_now_ns(void);

/* The wall clock since the epoch, in ms and in ns: times shown or exported. */
extern int64_t qb_wall_ms(void);
extern int64_t qb_wall_ns(void);

#endif							/* QB_CLOCK_H */
