/*-------------------------------------------------------------------------
 * qb_ratelimit.h
 *	  A destination's rate limit (rateLimit: { perSecond, burst }) as a
 *	  token bucket: the arithmetic only, no lock and no clock of its own.
 *
 * Wording:
 *	- A bucket holds up to burst tokens and gains perSecond of them each
 *	  second; a publish spends one.  A bucket never used is full.
 *	- Whole tokens: what a caller may take now is the floor of what the
 *	  bucket holds (with a nanotoken of slack for the arithmetic).
 *	- A token reserved is taken now and spent later (a claim's, spent when
 *	  its row's publish starts); until then it is out.  The bucket refills
 *	  only up to burst minus what is out, so a token spent late counts as
 *	  taken when it is spent: however late reserved tokens go out, no
 *	  stretch of time holds more than burst + perSecond per second of
 *	  spent tokens (a claim that waited a second would otherwise send its
 *	  burst beside the second's refill that others took meanwhile).
 *	  qb_ratelimit_take spends at once.
 *	- Times are the monotonic clock in ns (qb_now_ns), the same in every
 *	  process of one machine, so a bucket in shared memory is refilled
 *	  correctly by whichever process takes from it.
 *
 * The caller serialises every call on one bucket (qb_limits.c holds its
 * slot's lock around them).
 *-------------------------------------------------------------------------
 */
#ifndef QB_RATELIMIT_H
#define QB_RATELIMIT_H

#include <stdint.h>

/* A limit as configured: per_sec 0 is none. */
typedef struct QbRateLimit
{
	double		per_sec;		/* tokens gained each second, > 0 */
	int			burst;			/* most tokens held, >= 1 */
} QbRateLimit;

typedef struct QbRateBucket
{
	double		tokens;
	int64_t		at_ns;			/* when tokens was right; 0: never used (full) */
	int32_t		out;			/* reserved and not spent nor given back yet */
} QbRateBucket;

/*
 * What a destination allows (rateLimit and maxConcurrent): rate.per_sec 0
 * and max_concurrent 0 are none.  The places of maxConcurrent are counted
 * by qb_limits.c.
 */
typedef struct QbLimitSpec
{
	QbRateLimit rate;
	int			max_concurrent;
} QbLimitSpec;

/* The burst a limit has when the document gives none: perSecond's ceiling, at least 1. */
extern int	qb_ratelimit_default_burst(double per_sec);

/* Bring b up to now_ns under l (tokens capped at l->burst - b->out). */
extern void qb_ratelimit_refill(QbRateBucket *b, const QbRateLimit *l, int64_t now_ns);

/* The whole tokens b holds at now_ns (b refilled). */
extern int	qb_ratelimit_available(QbRateBucket *b, const QbRateLimit *l, int64_t now_ns);

/* Take and spend up to want whole tokens at now_ns; returns how many. */
extern int	qb_ratelimit_take(QbRateBucket *b, const QbRateLimit *l, int64_t now_ns, int want);

/* Reserve up to want whole tokens at now_ns (they are out); returns how many. */
extern int	qb_ratelimit_reserve(QbRateBucket *b, const QbRateLimit *l, int64_t now_ns, int want);

/* n reserved tokens were spent at now_ns (at most what is out). */
extern void qb_ratelimit_spend(QbRateBucket *b, const QbRateLimit *l, int64_t now_ns, int n);

/* Give back n reserved tokens not spent, at now_ns (capped at l->burst - b->out). */
extern void qb_ratelimit_give(QbRateBucket *b, const QbRateLimit *l, int64_t now_ns, int n);

/*
 * In how many ms (rounded up) b holds n whole tokens (n capped at
 * l->burst); 0 when it does now.
 */
extern long qb_ratelimit_wait_ms(QbRateBucket *b, const QbRateLimit *l, int64_t now_ns, int n);

#endif							/* QB_RATELIMIT_H */
