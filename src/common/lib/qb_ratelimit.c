/*-------------------------------------------------------------------------
 * qb_ratelimit.c
 *	  The token bucket of a destination's rate limit (qb_ratelimit.h).
 *-------------------------------------------------------------------------
 */
#include <math.h>

#include "qb_ratelimit.h"

/* slack for the sums of fractions: 0.999999999... tokens count as 1 */
#define QB_RL_EPSILON	1e-9

int
qb_ratelimit_default_burst(double per_sec)
{
	double		c = ceil(per_sec);

	return c < 1 ? 1 : c > 1000000 ? 1000000 : (int) c;
}

/* qbrl_cap: the most tokens b may hold: burst less what is out, at least 0 */
static double
qbrl_cap(const QbRateBucket *b, const QbRateLimit *l)
{
	return b->out >= l->burst ? 0 : l->burst - (b->out > 0 ? b->out : 0);
}

void
qb_ratelimit_refill(QbRateBucket *b, const QbRateLimit *l, int64_t now_ns)
{
	double		cap = qbrl_cap(b, l);

	if (b->at_ns == 0)
		b->tokens = cap;		/* never used: full */
	else if (now_ns > b->at_ns)
		b->tokens += l->per_sec * (double) (now_ns - b->at_ns) / 1e9;
	if (b->tokens > cap)
		b->tokens = cap;		/* also when the burst was lowered */
	/* a clock read before the last one (another process's) adds nothing */
	if (now_ns > b->at_ns)
		b->at_ns = now_ns;
}

int
qb_ratelimit_available(QbRateBucket *b, const QbRateLimit *l, int64_t now_ns)
{
	qb_ratelimit_refill(b, l, now_ns);
	return b->tokens <= 0 ? 0 : (int) floor(b->tokens + QB_RL_EPSILON);
}

int
qb_ratelimit_take(QbRateBucket *b, const QbRateLimit *l, int64_t now_ns, int want)
{
	int			n = qb_ratelimit_available(b, l, now_ns);

	if (want < n)
		n = want < 0 ? 0 : want;
	b->tokens -= n;
	return n;
}

int
qb_ratelimit_reserve(QbRateBucket *b, const QbRateLimit *l, int64_t now_ns, int want)
{
	int			n = qb_ratelimit_take(b, l, now_ns, want);

	b->out += n;
	return n;
}

void
qb_ratelimit_spend(QbRateBucket *b, const QbRateLimit *l, int64_t now_ns, int n)
{
	qb_ratelimit_refill(b, l, now_ns);	/* up to now, under what was out */
	if (n > b->out)
		n = b->out;
	if (n > 0)
		b->out -= n;
}

void
qb_ratelimit_give(QbRateBucket *b, const QbRateLimit *l, int64_t now_ns, int n)
{
	double		cap;

	if (n <= 0)
		return;
	qb_ratelimit_spend(b, l, now_ns, n);	/* no longer out ... */
	cap = qbrl_cap(b, l);
	b->tokens += n;				/* ... but back in the bucket */
	if (b->tokens > cap)
		b->tokens = cap;
}

long
qb_ratelimit_wait_ms(QbRateBucket *b, const QbRateLimit *l, int64_t now_ns, int n)
{
	double		missing;

	if (n > l->burst)
		n = l->burst;
	if (qb_ratelimit_available(b, l, now_ns) >= n)
		return 0;
	missing = n - b->tokens - QB_RL_EPSILON;
	return (long) ceil(missing * 1000.0 / l->per_sec);
}
