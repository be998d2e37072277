/*-------------------------------------------------------------------------
 * qb_outbox_housekeeping.c
 *	  The outbox engine's chores between cycles (qb_outbox_int.h): leases
 *	  that ran out are reclaimed, rows held for a destination that takes
 *	  rows again are unparked, and worker 0 sweeps parked rows whose key
 *	  ended and deletes sent rows past the retention.
 *
 * Each chore is one store op of its own, when its time is due; a failed one
 * is logged and tried again at its next time (the rows stay as they are:
 * nothing is lost, only later).
 *-------------------------------------------------------------------------
 */
#include <stdio.h>
#include <stdlib.h>

#include "qb_outbox_int.h"

#define QBO_RECLAIM_EVERY_MS	1000
#define QBO_UNPARK_EVERY_MS		1000
#define QBO_UNPARK_BATCH		1000
#define QBO_RETENTION_EVERY_MS	60000
#define QBO_RETENTION_BATCH		1000
#define QBO_SWEEP_EVERY_MS		1000	/* from one sweep to the next of a walk */
#define QBO_SWEEP_IDLE_MAX_MS	30000	/* the longest gap after walks that released nothing */
#define QBO_SWEEP_KEYS			1000	/* keys with parked rows looked at per sweep */

/*
 * qb_outbox_sweep_gap: how long after a sweep the next one comes.  Within
 * a walk over the keys, a sweep a second.  After a walk that released
 * nothing the gap before the next walk doubles, up to
 * QBO_SWEEP_IDLE_MAX_MS: on PostgreSQL the promotion releases every park
 * (the sweep finds only what an operator's UPDATE left), and a full walk
 * probes every key with parked rows, 1,000 keys costing a worker most of a
 * second on a busy machine.  A sweep that releases rows brings the gap
 * back to a second.  gap: the gap before this walk; released: rows the
 * walk released so far; walk_done: this sweep reached the last key.
 */
long
qb_outbox_sweep_gap(long gap, int released, bool walk_done)
{
	if (released > 0 || gap < QBO_SWEEP_EVERY_MS)
		return QBO_SWEEP_EVERY_MS;
	if (!walk_done)
		return gap;
	return gap * 2 > QBO_SWEEP_IDLE_MAX_MS ? QBO_SWEEP_IDLE_MAX_MS : gap * 2;
}

/*
 * qbo_sweep releases rows parked behind a key whose earlier rows have all
 * ended: their promotion was missed (an engine that ignores the share lock
 * a park relies on, or an operator's UPDATE).  Worker 0 walks the keys
 * that have parked rows, QBO_SWEEP_KEYS a second, and starts again at the
 * first key when the walk reaches the last, after qb_outbox_sweep_gap.
 */
static void
qbo_sweep(QboEngine *e, long now)
{
	char		err[QB_ERRLEN];
	char	   *next = NULL;
	int			n = 0;

	e->next_sweep = now + QBO_SWEEP_EVERY_MS;
	if (e->store->outbox_sweep(e->store->ctx, e->sweep_after ? e->sweep_after : "",
							   QBO_SWEEP_KEYS, &n, &next, err, sizeof(err)) != 0)
	{
		qb_log(e->host, QB_LOG_WARNING, "the sweep of parked rows failed: %s", err);
		return;
	}
	free(e->sweep_after);
	e->sweep_after = next;
	e->sweep_walk_released += n;
	e->sweep_gap = qb_outbox_sweep_gap(e->sweep_gap, e->sweep_walk_released, next == NULL);
	if (next == NULL)
	{
		e->next_sweep = now + e->sweep_gap;
		e->sweep_walk_released = 0;
	}
	if (n > 0)
	{
		e->claim_idle = false;
		qb_log(e->host, QB_LOG_INFO,
			   "released %d rows parked behind keys whose earlier rows had all ended", n);
	}
}

/*
 * qbo_retention: one retention run, batches of QBO_RETENTION_BATCH until a
 * batch deletes fewer.  Each batch starts after the highest id the one
 * before took (the floor): the old rows a batch kept (dead, pending) and
 * the index entries of the rows it deleted are not walked again by every
 * batch.  The floor lives for the run only: the next run starts from the
 * start, so a row kept now (a dead row requeued and sent later, its
 * created_at old) is deleted by a later run.
 */
static void
qbo_retention(QboEngine *e, long now)
{
	char		err[QB_ERRLEN];
	/* a tenth of the retention period, between 1 s and a minute */
	long		every = e->cfg->outbox.retention_sec * 100;
	int64_t		after = 0;
	int			n;

	e->next_retention = now + (every < 1000 ? 1000 :
							   every > QBO_RETENTION_EVERY_MS ? QBO_RETENTION_EVERY_MS : every);
	do
	{
		n = 0;
		if (e->store->outbox_retention(e->store->ctx, e->cfg->outbox.retention_sec,
									   QBO_RETENTION_BATCH, &after, &n, err, sizeof(err)) != 0)
		{
			qb_log(e->host, QB_LOG_WARNING, "retention failed: %s", err);
			break;
		}
		e->stats->deleted += n;
	} while (n == QBO_RETENTION_BATCH && !e->host->should_stop(e->host->ctx));
}

/* qbo_housekeeping returns expired leases, unparks, sweeps, trims old sent rows. */
void
qbo_housekeeping(QboEngine *e, long now)
{
	char		err[QB_ERRLEN];
	int			n = 0;

	if (now >= e->next_reclaim)
	{
		e->next_reclaim = now + QBO_RECLAIM_EVERY_MS;
		if (e->store->outbox_reclaim(e->store->ctx, 1000, &n, err, sizeof(err)) != 0)
			qb_log(e->host, QB_LOG_WARNING, "reclaim failed: %s", err);
		else if (n > 0)
		{
			e->stats->reclaimed += n;
			qb_log(e->host, QB_LOG_INFO, "returned %d rows to pending: expired leases, or claims of workers that are gone (takeover)", n);
		}
	}
	if (now >= e->next_unpark && e->cfg->ndestinations > 0)
	{
		/*
		 * Rows held for a destination that takes rows again (an operator
		 * resumed it, a pause ended, another worker closed it).
		 */
		const char **names = malloc(sizeof(char *) * e->cfg->ndestinations);
		int			k = 0;

		e->next_unpark = now + QBO_UNPARK_EVERY_MS;
		if (names != NULL)
		{
			for (int i = 0; i < e->cfg->ndestinations; i++)
				if (qbo_hold_reason(&e->dests[i]) == NULL)
					names[k++] = e->cfg->destinations[i].name;
			if (k > 0 && e->store->outbox_unpark(e->store->ctx, names, k, QBO_UNPARK_BATCH,
												 &n, err, sizeof(err)) != 0)
				qb_log(e->host, QB_LOG_WARNING, "unpark failed: %s", err);
			else if (k > 0 && n > 0)
			{
				e->claim_idle = false;
				if (n == QBO_UNPARK_BATCH)
					e->next_unpark = 0;
			}
			free(names);
		}
	}
	if (e->worker_index == 0 && now >= e->next_sweep)
		qbo_sweep(e, now);
	if (e->worker_index == 0 && now >= e->next_retention)
		qbo_retention(e, now);
}
