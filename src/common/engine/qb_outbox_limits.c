/*-------------------------------------------------------------------------
 * qb_outbox_limits.c
 *	  The outbox engine's side of the destinations' limits: rateLimit (a
 *	  token bucket) and maxConcurrent (places), shared by every worker of
 *	  the server through the host (qb_limits.h; docs/delivery.md, "Limits").
 *
 * Wording (qb_outbox.c's, and):
 *	- A limited destination has a rateLimit, a maxConcurrent or both.
 *	- Its allowance is what its limit gives a claim: the claim reserves,
 *	  before it runs, up to the destination's room in tokens and places,
 *	  and asks the table for no more rows of it than that.  Its other rows
 *	  wait in the table, pending, unclaimed: nothing waits in memory but
 *	  the batch a limit gave.
 *	- A row claimed without a reservation (a key's next row that a settle
 *	  promoted, a ready or unrouted row routed here) takes its token and
 *	  place at its start; when the limit has none, it goes back to the
 *	  table routed, no attempt spent.
 *	- A token reserved is out until its row's publish starts, when it is
 *	  spent (qb_limits_spent): the bucket refills up to burst less the
 *	  tokens out, so a claim that took long sends no more beside the others
 *	  than the bucket allows (qb_ratelimit.h).
 *	- What a claim reserved and did not use (fewer rows came) is given
 *	  back at the end of the cycle; a place is given back when its publish
 *	  ends (qbo_done: an answer, a timeout, a failure to start, a stop).
 *	- A destination has a backlog when its last claim brought all its
 *	  allowance and the limit cut it: rows wait for the limit, so the
 *	  engine claims again when the limit gives (limit_at), even between
 *	  wakes and polls (a claim the limit gave nothing counts as one: rows
 *	  may wait).  Each claim that brought a whole allowance it was cut to,
 *	  and each row sent back for want of a token or place, adds one to the
 *	  destination's "waited for its limit" counter (qb_metrics.h,
 *	  QB_LIMITED).
 *
 *	- Across replicas (the daemon: QbStore.limits_take): what the server's
 *	  limits reserved is then asked of the database, every limited
 *	  destination of a claim in one take before it; what the database did
 *	  not give goes back to the server's limits at once.  The database
 *	  counts as ours the places our publishes hold and our reservations
 *	  (db_held); a place given back here (a publish ended) is given back
 *	  there at the next take: the claim's, else one of its own
 *	  QBO_LIMIT_SYNC_MS later (limits_sync_at).  So the database never
 *	  counts fewer places than are in use, and maxConcurrent holds across
 *	  replicas; a gone replica's places are not counted (its claimer is
 *	  gone).  Our tokens out the same way (db_out): spent here, they are
 *	  said spent there at the next take, at the latest
 *	  QBO_LIMIT_SPENT_SYNC_MS later (the database counts them out till
 *	  then: its bucket refills less, never more).  A destination with no
 *	  limit never takes part: it costs nothing.
 *	- What a claim took there and no row uses (fewer rows came) goes back
 *	  at once, in a take of its own after the claim (qbo_limits_give_now):
 *	  tokens kept out of the bucket until a later take are out of it while
 *	  it refills, and a role that gives back and takes again at each claim
 *	  keeps them out for good (two roles would hold a bucket's worth each:
 *	  a burst of twice the limit).  The tokens a claim uses are kept
 *	  however long the claim took: taken anew after a claim that waited
 *	  for another (Babelfish's do), they were forfeited so often that two
 *	  replicas sent half the limit.  They are out until spent, so the
 *	  refill others took meanwhile was less by them.
 *
 * One engine, one thread; the shared state is qb_limits.c's, under its
 * locks, and the database's, in its transactions.
 *-------------------------------------------------------------------------
 */
#include <stdlib.h>
#include <unistd.h>

#include "qb_limits.h"
#include "qb_outbox_int.h"

/* a claim waits for about this many ms of tokens, so claims stay few */
#define QBO_LIMIT_GATHER_MS		100
/* a destination waiting for a place looks at the places again after this */
#define QBO_LIMIT_PLACE_MS		10
/* ... after this when the database had none (a take is a round trip) */
#define QBO_LIMIT_DB_PLACE_MS	50
/* what the database counts and we do not use is given back within this */
#define QBO_LIMIT_SYNC_MS		10
/* ... tokens it counts out that we spent, within this: the next claim's take says it first */
#define QBO_LIMIT_SPENT_SYNC_MS	200
/* a take that failed is tried again after this */
#define QBO_LIMIT_DB_RETRY_MS	200

static const QbLimitSpec *
qbo_spec(const QboEngine *e, int i)
{
	return &e->cfg->destinations[i].limit;
}

/* qbo_limits_start: the host's shared limits, or limits of the engine's own. */
bool
qbo_limits_start(QboEngine *e)
{
	e->limits = e->host->limits;
	e->limit_holder = e->host->limit_holder;
	if (e->limits != NULL)
		return true;
	if ((e->own_limits = calloc(1, sizeof(QbLimits))) == NULL)
		return false;
	e->limits = e->own_limits;
	e->limit_holder = qb_limits_holder(e->limits, "engine", (int) getpid());
	return true;
}

void
qbo_limits_end(QboEngine *e)
{
	free(e->own_limits);
	e->own_limits = NULL;
	e->limits = NULL;
}

static void
qbo_limit_waited(QboEngine *e, int i)
{
	if (e->host->metrics != NULL)
		qb_metrics_delivery(e->host->metrics, e->cfg->destinations[i].name, QB_LIMITED, -1);
}

/*
 * qbo_limit_wait: in how many ms a limit that cut a claim may give rows:
 * when a token comes (wait_ms >= 0) and about QBO_LIMIT_GATHER_MS of
 * tokens more, so that it is not one claim per token; else (a place is
 * missing) place_ms.
 */
static long
qbo_limit_wait(const QbLimitSpec *spec, long wait_ms, long place_ms)
{
	double		want;

	if (spec->rate.per_sec <= 0 || wait_ms < 0)
		return place_ms;
	want = spec->rate.per_sec * QBO_LIMIT_GATHER_MS / 1000.0;
	if (want > spec->rate.burst)
		want = spec->rate.burst;
	return wait_ms + (want > 1 ? (long) ((want - 1) * 1000.0 / spec->rate.per_sec) : 0);
}

/*
 * qbo_limit_allow: what destination i's claim may ask of the table now,
 * given its room: its room when it has no limit, else what its limit gave
 * (reserved); when that is less, when to look again.
 */
int
qbo_limit_allow(QboEngine *e, int i, int room, long now)
{
	const QbLimitSpec *spec = qbo_spec(e, i);
	QboDest    *d = &e->dests[i];
	long		wait_ms;
	int			got;

	d->allowed = room;
	d->cut = false;
	d->claimed_now = 0;
	if (!qb_limits_set(spec) || room <= 0)
		return room;
	got = qb_limits_reserve(e->limits, e->limit_holder, e->cfg->destinations[i].name,
							spec, room, qb_now_ns(), &wait_ms);
	d->reserved += got;
	d->allowed = got;
	d->cut = got < room;
	if (d->cut)
		d->limit_at = now + qbo_limit_wait(spec, wait_ms, QBO_LIMIT_PLACE_MS);
	return got;
}

/*
 * qbo_limit_open: the limit that cut destination i's last claim may give
 * rows now: its time came, and a place is free (read without a lock: a
 * place taken meanwhile only makes the claim's reservation smaller).
 */
static bool
qbo_limit_open(const QboEngine *e, int i, long now)
{
	const QbLimitSpec *spec = qbo_spec(e, i);

	return now >= e->dests[i].limit_at &&
		(spec->max_concurrent <= 0 ||
		 qb_limits_in_use(e->limits, e->cfg->destinations[i].name) < spec->max_concurrent);
}

/* qbo_limit_want: destination i's limit may give a claim rows now. */
bool
qbo_limit_want(const QboEngine *e, int i, long now)
{
	return !qb_limits_set(qbo_spec(e, i)) || !e->dests[i].cut || qbo_limit_open(e, i, now);
}

/*
 * qbo_limits_due: a destination with a backlog may be given rows by its
 * limit now (true, *in_ms 0), or in *in_ms (-1: none waits).
 */
bool
qbo_limits_due(const QboEngine *e, long now, long *in_ms)
{
	*in_ms = -1;
	for (int i = 0; i < e->cfg->ndestinations; i++)
	{
		const QboDest *d = &e->dests[i];

		if (!d->backlog || !qb_limits_set(qbo_spec(e, i)) || qbo_hold_reason(d) != NULL)
			continue;
		if (qbo_limit_open(e, i, now))
		{
			*in_ms = 0;
			return true;
		}
		if (*in_ms < 0 || d->limit_at - now < *in_ms)
			*in_ms = d->limit_at > now ? d->limit_at - now : QBO_LIMIT_PLACE_MS;
	}
	return false;
}

/*
 * qbo_limits_sync_within: the database counts more than we use: a take is
 * due within ms (an earlier one due stays).
 */
static void
qbo_limits_sync_within(QboEngine *e, long ms)
{
	long		at = qb_now_ms() + ms;

	if (e->store->limits_take != NULL && (e->limits_sync_at == 0 || at < e->limits_sync_at))
		e->limits_sync_at = at;
}

/*
 * qbo_limit_take: slot s may start its publish: its destination has no
 * limit, or it uses a reservation, or its limit gives it a token and a
 * place now.  False: the limit has none (counted as a wait).
 */
bool
qbo_limit_take(QboEngine *e, QboSlot *s)
{
	const QbLimitSpec *spec = qbo_spec(e, s->dest);
	QboDest    *d = &e->dests[s->dest];
	long		wait_ms;

	if (!qb_limits_set(spec))
		return true;
	if (d->reserved > 0)
		d->reserved--;
	else if (e->store->limits_take != NULL ||	/* no take per row: the next claim's */
			 qb_limits_reserve(e->limits, e->limit_holder, e->cfg->destinations[s->dest].name,
							   spec, 1, qb_now_ns(), &wait_ms) != 1)
	{
		qbo_limit_waited(e, s->dest);
		return false;
	}
	if (spec->rate.per_sec > 0)
	{
		/* a place-only limit has no token out: no slot lock for nothing */
		qb_limits_spent(e->limits, e->limit_holder, e->cfg->destinations[s->dest].name, spec, 1,
						qb_now_ns());
		qbo_limits_sync_within(e, QBO_LIMIT_SPENT_SYNC_MS);	/* the database counts it out */
	}
	s->limit_held = spec->max_concurrent > 0;
	return true;
}

/* qbo_limit_done: slot s's publish ended: its place, if it held one, back. */
void
qbo_limit_done(QboEngine *e, QboSlot *s)
{
	if (!s->limit_held)
		return;
	s->limit_held = false;
	qb_limits_release(e->limits, e->limit_holder, e->cfg->destinations[s->dest].name);
	qbo_limits_sync_within(e, QBO_LIMIT_SYNC_MS);
}

/*
 * qbo_limits_after_claim: the claim's rows were dispatched (claimed: it
 * ran): which limited destinations have a backlog now.
 */
void
qbo_limits_after_claim(QboEngine *e, bool claimed)
{
	for (int i = 0; claimed && i < e->cfg->ndestinations; i++)
	{
		QboDest    *d = &e->dests[i];

		if (!qb_limits_set(qbo_spec(e, i)))
			continue;
		d->backlog = d->cut && d->claimed_now >= d->allowed;
		/* none given: its rows, if any, wait; counted when a claim meets them */
		if (d->backlog && d->allowed > 0)
			qbo_limit_waited(e, i);
	}
}

/*
 * qbo_limits_give_unused: reservations beyond the rows queued to use them
 * back to the shared limits (every one, when nothing is queued).
 */
void
qbo_limits_give_unused(QboEngine *e)
{
	for (int i = 0; e->cfg != NULL && i < e->cfg->ndestinations; i++)
	{
		QboDest    *d = &e->dests[i];
		int			unused = d->reserved - d->queued;

		if (unused <= 0)
			continue;
		qb_limits_give(e->limits, e->limit_holder, e->cfg->destinations[i].name,
					   qbo_spec(e, i), unused, qb_now_ns());
		d->reserved -= unused;
		d->db_give += unused;
		qbo_limits_sync_within(e, QBO_LIMIT_SYNC_MS);
	}
}

/*
 * qbo_limits_give_now: after a claim, what its take got and no row uses
 * goes back to the database at once (the banner says why); tokens spent
 * meanwhile are said with it, else at their own time.
 */
void
qbo_limits_give_now(QboEngine *e)
{
	for (int i = 0; e->store->limits_take != NULL && e->cfg != NULL &&
		 i < e->cfg->ndestinations; i++)
		if (e->dests[i].db_give > 0)
		{
			qbo_limits_take_shared(e, QBO_TAKE_SYNC, qb_now_ms());
			return;
		}
}

/* qbo_places: the places destination i's publishes hold now */
static int
qbo_places(const QboEngine *e, int i)
{
	int			n = 0;

	for (int k = 0; k < e->nslots; k++)
		if (e->slots[k].limit_held && e->slots[k].dest == i)
			n++;
	return n;
}

/*
 * qbo_limits_take_shared: the take of the database (QbStore.limits_take),
 * when the store has one and something is to be said.  QBO_TAKE_CLAIM:
 * each limited destination's reservation from the server's limits (its
 * allowed) is asked for; what the database did not give goes back to the
 * server's limits and the claim is cut to it.  In
 * every mode, each limited destination whose places or tokens not used
 * the database counts (db_held, db_give) gives them back.  On a failure
 * the claim gets none of it.
 */
void
qbo_limits_take_shared(QboEngine *e, QboTake mode, long now)
{
	QbLimitTake *t;
	int		   *which;
	int			n = 0;
	int			rc;
	char		err[QB_ERRLEN];

	if (e->store->limits_take == NULL || e->cfg == NULL)
		return;
	for (n = 0; n < e->cfg->ndestinations && !qb_limits_set(qbo_spec(e, n)); n++)
		;
	if (n == e->cfg->ndestinations)
		return;					/* no limit: nothing to take, nothing allocated */
	n = 0;
	t = calloc(e->cfg->ndestinations + 1, sizeof(QbLimitTake) + sizeof(int));
	if (t == NULL)
		return;					/* the claim keeps the server's part: tried again */
	which = (int *) (t + e->cfg->ndestinations + 1);
	for (int i = 0; i < e->cfg->ndestinations; i++)
	{
		const QbLimitSpec *spec = qbo_spec(e, i);
		QboDest    *d = &e->dests[i];
		int			want,
					held,
					out;

		if (!qb_limits_set(spec))
			continue;
		want = mode == QBO_TAKE_CLAIM ? d->allowed : 0;
		held = spec->max_concurrent > 0 ? qbo_places(e, i) + d->reserved - want : 0;
		out = spec->rate.per_sec > 0 ? d->reserved - want : 0;
		if (want == 0 && d->db_give == 0 && held == d->db_held && out == d->db_out)
			continue;
		/* the answer starts as none: got 0, wait_ms -1 */
		t[n] = (QbLimitTake) {
			.destination = e->cfg->destinations[i].name,
			.per_sec = spec->rate.per_sec, .burst = spec->rate.burst,
			.max_concurrent = spec->max_concurrent,
			.held = held, .out = out, .give = d->db_give, .want = want, .wait_ms = -1,
		};
		which[n++] = i;
	}
	rc = n == 0 ? 0 : e->store->limits_take(e->store->ctx, t, n, e->cfg->outbox.claim_timeout_ms,
											err, sizeof(err));
	if (rc != 0)
		qb_log(e->host, QB_LOG_WARNING,
			   "taking the destinations' limits in the database failed: %s; their rows wait", err);
	e->limits_sync_at = rc == 0 ? 0 : now + QBO_LIMIT_DB_RETRY_MS;
	for (int j = 0; j < n; j++)
	{
		const QbLimitSpec *spec = qbo_spec(e, which[j]);
		QboDest    *d = &e->dests[which[j]];
		int			got = rc == 0 ? t[j].got : 0;

		if (rc == 0)
		{
			d->db_give = 0;
			d->db_held = spec->max_concurrent > 0 ? t[j].held + got : 0;
			d->db_out = spec->rate.per_sec > 0 ? t[j].out + got : 0;
		}
		if (got >= t[j].want)
			continue;
		qb_limits_give(e->limits, e->limit_holder, t[j].destination, spec, t[j].want - got,
					   qb_now_ns());
		d->reserved -= t[j].want - got;
		d->allowed = got;
		d->cut = true;
		d->limit_at = now + (rc != 0 ? QBO_LIMIT_DB_RETRY_MS :
							 qbo_limit_wait(spec, t[j].wait_ms, QBO_LIMIT_DB_PLACE_MS));
	}
	free(t);
}

/* qbo_limits_sync_in: in how many ms a take of its own is due (0: now), -1: none */
long
qbo_limits_sync_in(const QboEngine *e, long now)
{
	if (e->limits_sync_at == 0)
		return -1;
	return e->limits_sync_at > now ? e->limits_sync_at - now : 0;
}
