/*-------------------------------------------------------------------------
 * qb_backoff.c
 *	  Retry delays: exponential backoff with symmetric jitter.
 *
 * Wording:
 *	- base: the delay before jitter, initialMs * multiplier^(attempt-1),
 *	  capped at maxMs.
 *	- draw: a uniform number r in [0, 1) that places the delay inside
 *	  base * [1 - jitter, 1 + jitter).
 *
 * The arithmetic is done in double: multiplier^n overflows to +inf for a
 * large n, and min(maxMs, +inf) is maxMs, so nothing wraps around.  Inputs
 * are clamped rather than trusted, so a hand-built QbBackoff cannot produce
 * NaN or a negative delay either.
 *-------------------------------------------------------------------------
 */
#include <math.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>
#include <sys/random.h>

#include "qb_backoff.h"

/* qb_backoff_delay_ms: see qb_backoff.h. */
long
qb_backoff_delay_ms(const QbBackoff *b, int attempt, double r)
{
	double		initial = b->initial_ms > 0 ? (double) b->initial_ms : 0.0;
	double		max = b->max_ms > 0 ? (double) b->max_ms : 0.0;
	double		mult = b->multiplier >= 1.0 ? b->multiplier : 1.0;	/* NaN too */
	double		jitter = b->jitter > 0.0 ? b->jitter : 0.0;
	double		base;
	double		delay;

	if (jitter > 1.0)
		jitter = 1.0;
	if (!(r >= 0.0))			/* NaN too */
		r = 0.0;
	if (r >= 1.0)
		r = nextafter(1.0, 0.0);
	if (attempt < 1)
		attempt = 1;
	if (initial == 0.0)
		base = 0.0;				/* and not 0 * inf = NaN below */
	else if (isinf(mult))
		base = attempt == 1 ? initial : max;
	else
		base = initial * pow(mult, (double) (attempt - 1));
	if (!(base <= max))			/* +inf too */
		base = max;
	delay = base * (1.0 - jitter + 2.0 * jitter * r);
	delay = floor(delay + 0.5);
	if (!(delay >= 0.0))
		return 0;
	/* compare before converting: (long) of a too large double is undefined */
	if (delay >= max)
		return b->max_ms > 0 ? b->max_ms : 0;
	return (long) delay;
}

/*
 * The generator state, one per thread.  seed_pid makes a forked child (a
 * PostgreSQL background worker is forked from the postmaster) reseed rather
 * than replay its parent's sequence, which would put the retries of
 * sibling workers in lockstep.
 */
static __thread uint64_t rng_state;
static __thread pid_t rng_pid;

/* rng_seed: 64 bits from getrandom(), or from the clock and pid without it. */
static void
rng_seed(void)
{
	uint64_t	s = 0;

	if (getrandom(&s, sizeof(s), GRND_NONBLOCK) != (ssize_t) sizeof(s) || s == 0)
	{
		struct timespec ts;
		uint64_t	local = (uint64_t) (uintptr_t) &ts;	/* differs per thread */

		clock_gettime(CLOCK_REALTIME, &ts);
		s = ((uint64_t) ts.tv_sec * 1000000007ULL) ^ (uint64_t) ts.tv_nsec ^
			((uint64_t) getpid() << 32) ^ local;
		/* one splitmix64 step spreads the few changing bits over all 64 */
		s += 0x9E3779B97F4A7C15ULL;
		s = (s ^ (s >> 30)) * 0xBF58476D1CE4E5B9ULL;
		s = (s ^ (s >> 27)) * 0x94D049BB133111EBULL;
		s ^= s >> 31;
	}
	rng_state = s ? s : 0x9E3779B97F4A7C15ULL;	/* xorshift never leaves 0 */
	rng_pid = getpid();
}

/* qb_random_unit: xorshift64*, the top 53 bits as a double in [0, 1). */
double
qb_random_unit(void)
{
	uint64_t	x;

	if (rng_state == 0 || rng_pid != getpid())
		rng_seed();
	x = rng_state;
	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	rng_state = x;
	return (double) ((x * 0x2545F4914F6CDD1DULL) >> 11) * (1.0 / 9007199254740992.0);
}
