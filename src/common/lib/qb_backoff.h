/*-------------------------------------------------------------------------
 * qb_backoff.h
 *	  Retry delays: exponential backoff with symmetric jitter.
 *
 * For the n-th failed attempt (n >= 1) the base delay is
 *   base = min(maxMs, initialMs * multiplier^(n-1))
 * and the delay is base * (1 - jitter + 2 * jitter * r) for r uniform in
 * [0, 1), clamped to [0, maxMs].  So jitter 0.2 spreads retries over
 * +/- 20 % of the base and never past maxMs.
 *-------------------------------------------------------------------------
 */
#ifndef QB_BACKOFF_H
#define QB_BACKOFF_H

/*
 * A retry policy (the configuration's outbox.backoff; the defaults are
 * qb_config_defaults').
 */
typedef struct QbBackoff
{
	long		initial_ms;		/* default 1000 */
	long		max_ms;			/* default 3600000 */
	double		multiplier;		/* default 2 */
	double		jitter;			/* default 0.2, in [0, 1] */
} QbBackoff;

/* r in [0,1): the caller's random draw, so tests can pin it. */
extern long qb_backoff_delay_ms(const QbBackoff *b, int attempt, double r);

/* A uniform draw in [0,1) from a thread-local xorshift seeded at first use. */
extern double qb_random_unit(void);

#endif							/* QB_BACKOFF_H */
