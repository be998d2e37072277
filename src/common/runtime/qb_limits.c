/*-------------------------------------------------------------------------
 * qb_limits.c
 *	  The destinations' shared limits (qb_limits.h: the wording and the
 *	  locking protocol).
 *
 * A worker whose holder could not be had (more than QB_LIMITS_HOLDERS
 * workers) or a destination whose slot could not be had (more than
 * QB_LIMITS_SLOTS limited destinations used within a minute) is given
 * nothing: its limited destinations' rows wait in the table until a slot
 * is idle for a minute (docs/delivery.md, "Limits").  A limit is never
 * exceeded for want of room here.
 *-------------------------------------------------------------------------
 */
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include "qb_limits.h"
#include "qb_metrics.h"			/* QbSlotState */

#define QBLIM_SPINS_PER_CHECK	1000	/* about a millisecond with the yields */
#define QBLIM_IDLE_NS			(60 * 1000000000LL)

/* qblim_lock: take the lock word (qb_limits.h: a dead holder's is taken over). */
static void
qblim_lock(uint32_t *lock)
{
	uint32_t	me = (uint32_t) getpid();

	for (int spins = 0;; spins++)
	{
		uint32_t	seen = 0;

		if (__atomic_compare_exchange_n(lock, &seen, me, false,
										__ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
			return;
		if (spins % QBLIM_SPINS_PER_CHECK == QBLIM_SPINS_PER_CHECK - 1 && seen != me &&
			kill((pid_t) seen, 0) != 0 && errno == ESRCH &&
			__atomic_compare_exchange_n(lock, &seen, me, false,
										__ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
			return;				/* its holder died inside: ours now */
		sched_yield();
	}
}

static void
qblim_unlock(uint32_t *lock)
{
	__atomic_store_n(lock, 0, __ATOMIC_RELEASE);
}

void
qb_limits_init(QbLimits *l)
{
	memset(l, 0, sizeof(*l));
}

/*
 * qblim_count: the places in use, counted again from what each holder holds
 * (slot locked).  held[] is the truth and each change to it is one store;
 * in_use is its sum kept for the readers without a lock.  Counted, never
 * adjusted by a difference: a role killed -9 between the two stores of a
 * change would otherwise leave in_use a place above held[] for good (with
 * maxConcurrent 1, the destination would take no row until a restart);
 * the next change under the lock, the reap's at the latest, repairs it.
 */
static int32_t
qblim_count(QbLimitSlot *s)
{
	int32_t		n = 0;

	for (int h = 0; h < QB_LIMITS_HOLDERS; h++)
		n += s->held[h];
	__atomic_store_n(&s->in_use, n, __ATOMIC_RELAXED);
	return n;
}

/*
 * qblim_out: the tokens out, counted again from what each holder has out
 * (slot locked), into the bucket: counted, never adjusted, as qblim_count
 * says.
 */
static void
qblim_out(QbLimitSlot *s)
{
	int32_t		n = 0;

	for (int h = 0; h < QB_LIMITS_HOLDERS; h++)
		n += s->out[h];
	s->bucket.out = n;
}

/*
 * qblim_spend: up to n of holder's tokens out were spent at now_ns (slot
 * locked; rate: the limit in force, NULL when it has none).
 */
static void
qblim_spend(QbLimitSlot *s, int holder, const QbRateLimit *rate, int n, int64_t now_ns)
{
	if (n > s->out[holder])
		n = s->out[holder];
	if (n <= 0)
		return;
	qblim_out(s);
	if (rate != NULL)
		qb_ratelimit_spend(&s->bucket, rate, now_ns, n);
	s->out[holder] -= n;
	qblim_out(s);
}

/*
 * qblim_end_holder: holder's places back, in every slot, and its tokens
 * out spent (no lock held).  The bucket refills at the next take under the
 * limit in force; until then nothing else reads what is out.
 */
static void
qblim_end_holder(QbLimits *l, int holder)
{
	for (int i = 0; i < QB_LIMITS_SLOTS; i++)
	{
		QbLimitSlot *s = &l->slots[i];

		if (__atomic_load_n(&s->state, __ATOMIC_ACQUIRE) != QB_SLOT_IN_USE)
			continue;
		qblim_lock(&s->lock);
		s->held[holder] = 0;
		qblim_count(s);
		s->out[holder] = 0;
		qblim_out(s);
		qblim_unlock(&s->lock);
	}
}

int
qb_limits_holder(QbLimits *l, const char *name, int pid)
{
	int			found = -1;

	if (l == NULL)
		return -1;
	qblim_lock(&l->lock);
	for (int i = 0; i < QB_LIMITS_HOLDERS && found < 0; i++)
		if (l->holders[i].state == QB_SLOT_IN_USE &&
			strncmp(l->holders[i].name, name, QB_LIMITS_NAMELEN - 1) == 0)
			found = i;
	for (int i = 0; i < QB_LIMITS_HOLDERS && found < 0; i++)
		if (l->holders[i].state == QB_SLOT_FREE)
		{
			found = i;
			strncpy(l->holders[i].name, name, QB_LIMITS_NAMELEN - 1);
			l->holders[i].state = QB_SLOT_IN_USE;
		}
	if (found >= 0)
		l->holders[found].pid = pid;
	qblim_unlock(&l->lock);
	if (found >= 0)
		qblim_end_holder(l, found);	/* what its predecessor held */
	return found;
}

void
qb_limits_holder_end(QbLimits *l, int holder)
{
	if (l != NULL && holder >= 0 && holder < QB_LIMITS_HOLDERS)
		qblim_end_holder(l, holder);
}

void
qb_limits_pid_end(QbLimits *l, int pid)
{
	int			found = -1;

	if (l == NULL || pid <= 0)
		return;
	qblim_lock(&l->lock);
	for (int i = 0; i < QB_LIMITS_HOLDERS && found < 0; i++)
		if (l->holders[i].state == QB_SLOT_IN_USE && l->holders[i].pid == pid)
			found = i;
	qblim_unlock(&l->lock);
	if (found >= 0)
		qblim_end_holder(l, found);
}

/* qblim_find: the slot named name, or NULL */
static QbLimitSlot *
qblim_find(QbLimits *l, const char *name)
{
	for (int i = 0; i < QB_LIMITS_SLOTS; i++)
	{
		QbLimitSlot *s = &l->slots[i];

		if (__atomic_load_n(&s->state, __ATOMIC_ACQUIRE) == QB_SLOT_IN_USE &&
			strncmp(s->name, name, QB_LIMITS_NAMELEN - 1) == 0)
			return s;
	}
	return NULL;
}

/*
 * qblim_slot: the slot of name, taken when none has it: a free one, else one
 * idle for a minute (renamed under both locks, so no take sees it half
 * renamed: a reader that found it by its old name sees the new name once
 * it holds the slot's lock, and looks again).
 */
static QbLimitSlot *
qblim_slot(QbLimits *l, const char *name, int64_t now_ns)
{
	QbLimitSlot *s = qblim_find(l, name);
	QbLimitSlot *take = NULL;

	if (s != NULL)
		return s;
	qblim_lock(&l->lock);
	if ((s = qblim_find(l, name)) == NULL)
	{
		for (int i = 0; i < QB_LIMITS_SLOTS && take == NULL; i++)
			if (l->slots[i].state == QB_SLOT_FREE)
				take = &l->slots[i];
		for (int i = 0; i < QB_LIMITS_SLOTS && take == NULL; i++)
		{
			QbLimitSlot *o = &l->slots[i];

			qblim_lock(&o->lock);
			if (qblim_count(o) == 0 && now_ns - o->used_ns > QBLIM_IDLE_NS)
				take = o;
			else
				qblim_unlock(&o->lock);
		}
		if (take != NULL)
		{
			if (take->state == QB_SLOT_FREE)
				qblim_lock(&take->lock);
			memset(take->name, 0, sizeof(take->name));
			strncpy(take->name, name, QB_LIMITS_NAMELEN - 1);
			memset(&take->bucket, 0, sizeof(take->bucket));		/* full */
			memset(take->held, 0, sizeof(take->held));
			memset(take->out, 0, sizeof(take->out));
			take->in_use = 0;
			take->used_ns = now_ns;
			__atomic_store_n(&take->state, QB_SLOT_IN_USE, __ATOMIC_RELEASE);
			qblim_unlock(&take->lock);
			s = take;
		}
	}
	qblim_unlock(&l->lock);
	return s;
}

/* qblim_hold: slot of name, locked, its name checked; NULL: none */
static QbLimitSlot *
qblim_hold(QbLimits *l, const char *name, int64_t now_ns, bool create)
{
	for (int tries = 0; tries < 3; tries++)
	{
		QbLimitSlot *s = create ? qblim_slot(l, name, now_ns) : qblim_find(l, name);

		if (s == NULL)
			return NULL;
		qblim_lock(&s->lock);
		if (strncmp(s->name, name, QB_LIMITS_NAMELEN - 1) == 0)
			return s;
		qblim_unlock(&s->lock);	/* renamed meanwhile: look again */
	}
	return NULL;
}

int
qb_limits_reserve(QbLimits *l, int holder, const char *name, const QbLimitSpec *spec,
				  int want, int64_t now_ns, long *wait_ms)
{
	QbLimitSlot *s;
	int			n = want;
	int32_t		in_use;

	*wait_ms = -1;
	if (l == NULL || holder < 0 || holder >= QB_LIMITS_HOLDERS || want <= 0 ||
		(s = qblim_hold(l, name, now_ns, true)) == NULL)
		return 0;
	in_use = qblim_count(s);
	if (spec->max_concurrent > 0 && spec->max_concurrent - in_use < n)
		n = spec->max_concurrent - in_use;
	if (n < 0)
		n = 0;
	if (spec->rate.per_sec > 0)
	{
		qblim_out(s);
		n = qb_ratelimit_reserve(&s->bucket, &spec->rate, now_ns, n);
		s->out[holder] += n;
		qblim_out(s);
		/* when a token comes, if tokens are what is missing */
		if (n < want && (spec->max_concurrent <= 0 || in_use + n < spec->max_concurrent))
			*wait_ms = qb_ratelimit_wait_ms(&s->bucket, &spec->rate, now_ns, 1);
	}
	if (spec->max_concurrent > 0)
	{
		s->held[holder] += n;
		qblim_count(s);
	}
	if (n > 0)
		s->used_ns = now_ns;
	qblim_unlock(&s->lock);
	return n;
}

void
qb_limits_spent(QbLimits *l, int holder, const char *name, const QbLimitSpec *spec,
				int n, int64_t now_ns)
{
	QbLimitSlot *s;

	if (l == NULL || holder < 0 || holder >= QB_LIMITS_HOLDERS || n <= 0 ||
		(s = qblim_hold(l, name, 0, false)) == NULL)
		return;
	qblim_spend(s, holder, spec->rate.per_sec > 0 ? &spec->rate : NULL, n, now_ns);
	qblim_unlock(&s->lock);
}

void
qb_limits_give(QbLimits *l, int holder, const char *name, const QbLimitSpec *spec,
			   int n, int64_t now_ns)
{
	QbLimitSlot *s;

	if (l == NULL || holder < 0 || holder >= QB_LIMITS_HOLDERS || n <= 0 ||
		(s = qblim_hold(l, name, 0, false)) == NULL)
		return;
	if (spec->rate.per_sec > 0)
	{
		int			k = n < s->out[holder] ? n : s->out[holder];

		qblim_out(s);
		qb_ratelimit_give(&s->bucket, &spec->rate, now_ns, k);
		s->out[holder] -= k;
		qblim_out(s);
	}
	if (spec->max_concurrent > 0)
	{
		int			k = n < s->held[holder] ? n : s->held[holder];

		s->held[holder] -= k;
		qblim_count(s);
	}
	qblim_unlock(&s->lock);
}

void
qb_limits_release(QbLimits *l, int holder, const char *name)
{
	QbLimitSlot *s;

	if (l == NULL || holder < 0 || holder >= QB_LIMITS_HOLDERS ||
		(s = qblim_hold(l, name, 0, false)) == NULL)
		return;
	if (s->held[holder] > 0)
	{
		s->held[holder]--;
		qblim_count(s);
	}
	qblim_unlock(&s->lock);
}

int
qb_limits_in_use(const QbLimits *l, const char *name)
{
	if (l == NULL)
		return 0;
	for (int i = 0; i < QB_LIMITS_SLOTS; i++)
	{
		const QbLimitSlot *s = &l->slots[i];

		if (__atomic_load_n(&s->state, __ATOMIC_ACQUIRE) == QB_SLOT_IN_USE &&
			strncmp(s->name, name, QB_LIMITS_NAMELEN - 1) == 0)
			return __atomic_load_n(&s->in_use, __ATOMIC_RELAXED);
	}
	return 0;
}
