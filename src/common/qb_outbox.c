/*-------------------------------------------------------------------------
 * qb_outbox.c
 *	  The outbox engine loop.
 *
 * Wording:
 *	- A batch is the rows of one claim.  Every row of a batch ends in exactly
 *	  one settle outcome: sent, retry, dead or release.
 *	- A round is claim -> route -> transform -> publish concurrently ->
 *	  settle.  The route's transform runs before the destination's; a
 *	  rejection sends the row dead at once (docs/transforms.md).
 *
 * Transaction rules: the claim and the settle are each one short transaction
 * in the store; nothing is open while requests are in flight.  If the settle
 * cannot be written, the rows stay processing and come back to pending when
 * their lease expires: delivery is at least once, never lost.
 *
 * Waking: after a round that had rows the engine claims again at once; only
 * an empty claim lets it sleep.  Because the host clears its wake-up only
 * inside wait(), a commit that lands while a batch is in flight is seen by
 * that next claim (its snapshot is newer) or leaves the wake-up set.
 *-------------------------------------------------------------------------
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "qb_backoff.h"
#include "qb_publish.h"
#include "qb_outbox.h"
#include "qb_route.h"
#include "qb_transform.h"

#define QBO_RECLAIM_EVERY_MS	1000
#define QBO_RETENTION_EVERY_MS	60000
#define QBO_RETENTION_BATCH		1000
#define QBO_SETTLE_TRIES		3

typedef struct QboRound
{
	const QbConfig *cfg;
	QbOutboxRow *rows;
	int			nrows;
	QbSettle   *settles;
	char	  **errors;			/* owned strings behind settles[i].error */
	bool	   *done;
	const char **dest;			/* the destination each row was routed to, or NULL */
	QbOutboxStats *stats;
} QboRound;

typedef struct QboEngine
{
	const QbHost *host;
	const QbStore *store;
	int			worker_index;
	QbConfig   *cfg;			/* NULL until a valid document is stored */
	QbPubSet   *pub;			/* the publishers, one per destination type in use */
	long		next_reclaim;
	long		next_retention;
	bool		warned_no_config;
	QbOutboxStats *stats;
} QboEngine;

/* qbo_reload swaps the engine's config for the stored one (qb_reload_config). */
static void
qbo_reload(QboEngine *e)
{
	if (!qb_reload_config(e->host, e->store, &e->cfg, &e->warned_no_config, "outbox rows"))
		return;
	/* a new retention period takes effect now, not at the old schedule */
	e->next_retention = 0;
	qb_log(e->host, QB_LOG_INFO, "configuration loaded: %d destinations, %d routes",
		   e->cfg->ndestinations, e->cfg->nroutes);
	/* between batches: nothing is in flight; drop what no destination uses */
	qb_pubset_prune(e->pub, e->cfg);
}

/* qbo_set sets a row's outcome, copying the error text. */
static void
qbo_set(QboRound *r, int i, QbSettleKind kind, int attempt, long delay_ms, const char *error)
{
	r->settles[i].id = r->rows[i].id;
	r->settles[i].kind = kind;
	r->settles[i].attempt = attempt;
	r->settles[i].delay_ms = delay_ms;
	free(r->errors[i]);
	r->errors[i] = error ? strdup(error) : NULL;
	r->settles[i].error = r->errors[i];
	r->done[i] = true;
}

/*
 * qbo_failed records a failed attempt: retry with backoff, or dead when this
 * attempt was the row's last.
 */
static void
qbo_failed(QboRound *r, int i, const char *why)
{
	QbOutboxRow *row = &r->rows[i];
	int			attempt = row->attempt + 1;
	char		msg[768];

	if (attempt >= row->max_attempts)
	{
		snprintf(msg, sizeof(msg), "attempt %d of %d failed, none remain: %s",
				 attempt, row->max_attempts, why);
		qbo_set(r, i, QB_SETTLE_DEAD, attempt, 0, msg);
		r->stats->dead++;
	}
	else
	{
		long		delay = qb_backoff_delay_ms(&r->cfg->outbox.backoff, attempt,
											   qb_random_unit());

		snprintf(msg, sizeof(msg), "attempt %d of %d failed, retry in %ld ms: %s",
				 attempt, row->max_attempts, delay, why);
		qbo_set(r, i, QB_SETTLE_RETRY, attempt, delay, msg);
		r->stats->retried++;
	}
}

static void
qbo_publish_done(void *arg, int tag, const QbPubOutcome *out)
{
	QboRound   *r = arg;

	if (out->ok)
	{
		qbo_set(r, tag, QB_SETTLE_SENT, r->rows[tag].attempt + 1, 0, NULL);
		r->stats->sent++;
	}
	else if (out->permanent)
	{
		char		msg[768];

		snprintf(msg, sizeof(msg), "attempt %d refused for good: %s",
				 r->rows[tag].attempt + 1, out->error);
		qbo_set(r, tag, QB_SETTLE_DEAD, r->rows[tag].attempt + 1, 0, msg);
		r->stats->dead++;
	}
	else
		qbo_failed(r, tag, out->error);
}

/*
 * qbo_transform runs the route's transform, then the destination's, on a
 * routed row (one helper run for both) and puts the result in the row's
 * payload, so the round frees it.  Returns false when the row got its
 * outcome: dead for a rejection, a failed attempt when the helper could not
 * run.
 */
static bool
qbo_transform(QboRound *r, int i, int ri, const QbDestination *dest)
{
	QbOutboxRow *row = &r->rows[i];
	const QbTransform *chain[2];
	char		place[160];
	char		err[QB_ERRLEN];
	char		msg[768];
	QbTransformVars vars = {row->topic, row->key, row->headers, NULL, NULL};
	char	   *out;
	size_t		outlen;
	int			n = 0;
	int			at;

	bool		routed = r->cfg->routes[ri].transform != NULL;

	if (routed)
		chain[n++] = r->cfg->routes[ri].transform;
	if (dest->transform != NULL)
		chain[n++] = dest->transform;
	if (n == 0)
		return true;
	switch (qb_transform_run_chain(chain, n, row->payload, row->payload_len, &vars, NULL,
								   &out, &outlen, &at, err, sizeof(err)))
	{
		case QB_TRANSFORM_OK:
			free(row->payload);
			row->payload = out;
			row->payload_len = outlen;
			return true;
		case QB_TRANSFORM_REJECTED:
			/* at < 0: the payload itself (not JSON), before any transform */
			if (routed && (at <= 0 || at >= n))
				snprintf(place, sizeof(place), "route routes[%d]", ri);
			else
				snprintf(place, sizeof(place), "destination %s", dest->name);
			snprintf(msg, sizeof(msg), "%s transform rejected the message: %s", place, err);
			qbo_set(r, i, QB_SETTLE_DEAD, row->attempt, 0, msg);
			r->stats->dead++;
			return false;
		case QB_TRANSFORM_FAILED:
			qbo_failed(r, i, err);
			return false;
	}
	return true;
}

/*
 * qbo_dispatch routes every row and starts its publish; rows that cannot be
 * published (no route, a destination type this build cannot publish to, a
 * malformed row) get their outcome at once.
 */
static void
qbo_dispatch(QboEngine *e, QboRound *r)
{
	char		err[512];
	char		msg[768];
	QbMessage	m;

	for (int i = 0; i < r->nrows; i++)
	{
		QbOutboxRow *row = &r->rows[i];
		int			ri = qb_route_find(r->cfg, row->topic);
		const QbDestination *dest;

		if (ri < 0)
		{
			snprintf(msg, sizeof(msg),
					 "no route matches topic \"%.200s\"; add a route for it, then requeue the row (queuebox.requeue_outbox)",
					 row->topic);
			qbo_set(r, i, QB_SETTLE_DEAD, row->attempt, 0, msg);
			r->stats->dead++;
			continue;
		}
		dest = &r->cfg->destinations[r->cfg->routes[ri].dest_index];
		r->dest[i] = dest->name;
		if (!qbo_transform(r, i, ri, dest))
			continue;
		m.message_id = row->message_id;
		m.topic = row->topic;
		m.key = row->key;
		m.headers = row->headers;
		m.body = row->payload;
		m.body_len = row->payload_len;
		switch (qb_pubset_start(e->pub, dest, &m, i, err, sizeof(err)))
		{
			case QB_PUB_STARTED:
				break;
			case QB_PUB_ROW_INVALID:
				/* a row (or a destination type) that can never be sent as it is */
				qbo_set(r, i, QB_SETTLE_DEAD, row->attempt, 0, err);
				r->stats->dead++;
				break;
			case QB_PUB_NOT_STARTED:
				qbo_failed(r, i, err);
				break;
		}
	}
}

/*
 * qbo_publish drives the posts of a round until all have answered or the
 * host asks to stop; on a stop, unanswered rows are released (back to
 * pending, no attempt spent) so another worker delivers them at once.
 */
static void
qbo_publish(QboEngine *e, QboRound *r)
{
	qb_pubset_perform(e->pub, qbo_publish_done, r);
	while (qb_pubset_in_flight(e->pub) > 0)
	{
		long		timeout;

		if (e->host->should_stop(e->host->ctx))
		{
			qb_pubset_abort_all(e->pub);
			for (int i = 0; i < r->nrows; i++)
				if (!r->done[i])
				{
					qbo_set(r, i, QB_SETTLE_RELEASE, r->rows[i].attempt, 0,
							"released: the worker stopped before the destination answered");
					r->stats->released++;
				}
			return;
		}
		timeout = qb_pubset_timeout_ms(e->pub);
		if (timeout < 0 || timeout > 1000)
			timeout = 1000;
		if (timeout > 0)
			e->host->wait(e->host->ctx, qb_pubset_fd(e->pub), timeout);
		qb_pubset_perform(e->pub, qbo_publish_done, r);
	}
}

/*
 * qbo_count adds a settled round to the shared metrics: what a destination
 * acknowledged (with the time since the row was created), what failed and
 * what went dead.  Counted once the settle is written, so a round whose
 * settle is lost (and is delivered again) is not counted twice.
 */
static void
qbo_count(QboEngine *e, const QboRound *r)
{
	struct timespec now;
	double		t;

	if (e->host->metrics == NULL)
		return;
	clock_gettime(CLOCK_REALTIME, &now);
	t = now.tv_sec + now.tv_nsec / 1e9;
	for (int i = 0; i < r->nrows; i++)
	{
		const char *d = r->dest[i] ? r->dest[i] : "_unrouted";

		switch (r->settles[i].kind)
		{
			case QB_SETTLE_SENT:
				qb_metrics_delivery(e->host->metrics, d, QB_DELIVERED,
									t - r->rows[i].created_epoch);
				break;
			case QB_SETTLE_RETRY:
				qb_metrics_delivery(e->host->metrics, d, QB_FAILED, -1);
				break;
			case QB_SETTLE_DEAD:
				qb_metrics_delivery(e->host->metrics, d, QB_DEAD, -1);
				break;
			case QB_SETTLE_RELEASE:
				break;
		}
	}
}

/*
 * qbo_settle writes the round's outcomes in one statement, trying a few
 * times: if the database is briefly unavailable the lease still protects the
 * rows, but settling now avoids a duplicate delivery later.
 */
static void
qbo_settle(QboEngine *e, QboRound *r, const char *token)
{
	char		err[QB_ERRLEN];
	int			changed = 0;

	for (int tries = 1;; tries++)
	{
		if (e->store->outbox_settle(e->store->ctx, token, r->settles, r->nrows,
									&changed, err, sizeof(err)) == 0)
			break;
		if (tries >= QBO_SETTLE_TRIES)
		{
			qb_log(e->host, QB_LOG_WARNING,
				   "could not settle a batch of %d rows (%s); they return to pending when their lease expires",
				   r->nrows, err);
			return;
		}
		e->host->wait(e->host->ctx, -1, 200 * tries);
	}
	qbo_count(e, r);
	if (changed != r->nrows)
		qb_log(e->host, QB_LOG_INFO,
			   "settled %d of %d rows; the others' leases had expired and were taken over",
			   changed, r->nrows);
}

/* qbo_round runs one claim; returns rows claimed, or -1 on a claim error. */
static int
qbo_round(QboEngine *e)
{
	const QbOutboxConf *oc = &e->cfg->outbox;
	char		token[QB_UUID_LEN + 1];
	char		err[QB_ERRLEN];
	QboRound	r = {0};
	int			n = 0;
	long		t0 = qb_now_ms();
	long		t1,
				t2;

	/* a stop that landed after the loop's check must not claim a batch */
	if (e->host->should_stop(e->host->ctx))
		return 0;
	if (!qb_uuid_v4(token))
	{
		qb_log(e->host, QB_LOG_WARNING, "no random bytes for a claim token");
		return -1;
	}
	if (e->store->outbox_claim(e->store->ctx, oc->batch_size, oc->claim_timeout_ms,
							   oc->max_attempts, token, &r.rows, &r.nrows,
							   err, sizeof(err)) != 0)
	{
		qb_log(e->host, QB_LOG_WARNING, "claim failed: %s", err);
		return -1;
	}
	n = r.nrows;
	t1 = qb_now_ms();
	e->stats->claim_ms += t1 - t0;
	if (n == 0)
		return 0;

	r.cfg = e->cfg;
	r.stats = e->stats;
	r.settles = calloc(n, sizeof(QbSettle));
	r.errors = calloc(n, sizeof(char *));
	r.done = calloc(n, sizeof(bool));
	r.dest = calloc(n, sizeof(char *));
	if (r.settles == NULL || r.errors == NULL || r.done == NULL || r.dest == NULL)
	{
		/* Leave the rows to their lease; nothing was published. */
		qb_log(e->host, QB_LOG_WARNING, "out of memory for a batch of %d rows", n);
		goto done;
	}
	e->stats->batches++;
	if (e->host->should_stop(e->host->ctx))
	{
		/* stopped during the claim: hand the rows back unsent */
		for (int i = 0; i < n; i++)
			qbo_set(&r, i, QB_SETTLE_RELEASE, r.rows[i].attempt, 0,
					"released: the worker stopped before publishing");
		e->stats->released += n;
		qbo_settle(e, &r, token);
		goto done;
	}
	qbo_dispatch(e, &r);
	qbo_publish(e, &r);
	t2 = qb_now_ms();
	e->stats->publish_ms += t2 - t1;
	qbo_settle(e, &r, token);
	e->stats->settle_ms += qb_now_ms() - t2;

done:
	if (r.errors)
		for (int i = 0; i < n; i++)
			free(r.errors[i]);
	free(r.errors);
	free(r.settles);
	free(r.done);
	free(r.dest);
	qb_outbox_rows_free(r.rows, r.nrows);
	return n;
}

/* qbo_housekeeping returns expired leases and trims old sent rows. */
static void
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
			qb_log(e->host, QB_LOG_INFO, "returned %d rows with expired leases to pending", n);
		}
	}
	if (e->worker_index == 0 && now >= e->next_retention)
	{
		/* a tenth of the retention period, between 1 s and a minute */
		long		every = e->cfg->outbox.retention_sec * 100;

		e->next_retention = now + (every < 1000 ? 1000 :
								   every > QBO_RETENTION_EVERY_MS ? QBO_RETENTION_EVERY_MS : every);
		do
		{
			n = 0;
			if (e->store->outbox_retention(e->store->ctx, e->cfg->outbox.retention_sec,
										   QBO_RETENTION_BATCH, &n, err, sizeof(err)) != 0)
			{
				qb_log(e->host, QB_LOG_WARNING, "retention failed: %s", err);
				break;
			}
			e->stats->deleted += n;
		} while (n == QBO_RETENTION_BATCH && !e->host->should_stop(e->host->ctx));
	}
}

int
qb_outbox_run(const QbHost *host, const QbStore *store, int worker_index,
			  QbOutboxStats *stats, char *err, size_t errlen)
{
	QboEngine	e = {0};
	QbOutboxStats local = {0};

	e.host = host;
	e.store = store;
	e.worker_index = worker_index;
	e.stats = stats ? stats : &local;
	e.pub = qb_pubset_new(err, errlen);
	if (e.pub == NULL)
		return -1;

	while (!host->should_stop(host->ctx))
	{
		int			claimed;
		long		wait_ms;

		/* with no usable config, look again after every wait */
		if (host->config_changed(host->ctx) || e.cfg == NULL)
			qbo_reload(&e);
		if (e.cfg == NULL)
		{
			host->wait(host->ctx, -1, 5000);
			continue;
		}
		qbo_housekeeping(&e, qb_now_ms());
		claimed = qbo_round(&e);
		if (claimed > 0)
			continue;			/* drain: claim again before sleeping */
		wait_ms = claimed < 0 ? 1000 : e.cfg->outbox.poll_interval_ms;
		host->wait(host->ctx, -1, wait_ms);
	}
	qb_pubset_free(e.pub);
	qb_config_free(e.cfg);
	return 0;
}
