/*-------------------------------------------------------------------------
 * qb_relay.c
 *	  The relay engine loop: push inbox rows into the outbox.
 *
 * Wording:
 *	- A batch is the push rows of one relay claim.  Every row of a batch
 *	  ends in one forward: processed (an outbox row was written from it) or
 *	  dead (its topic rendered empty, so no route could ever take it).
 *	  A dead row of a source with onDead: holdKey keeps its aggregate's
 *	  later rows behind it until an operator requeues or skips it
 *	  (docs/delivery.md); the engine says which rows do, per row.
 *	- The topic is rendered here, in C, from the row's source's template in
 *	  the current configuration (names "source" and "eventType"); the
 *	  database never sees a template.
 *
 * Transaction rules: the claim and the forward are each one short
 * transaction in the store.  The forward writes the outbox rows and settles
 * the inbox rows in one statement, so a row is forwarded exactly once: a
 * crash before its commit leaves the inbox row processing (back to
 * claimable when the lease expires) and no outbox row; a crash after leaves
 * both.  If the forward cannot be written, the rows wait for their lease.
 *
 * Waking: a batch that came back full is followed by another claim at
 * once; otherwise the engine waits inbox.relay.pollIntervalMs or until the
 * host wakes it (an inbox insert or a configuration change committed).
 * With inbox.relay.enabled false it claims nothing and waits for a change.
 *
 * Also here: the inbox replay (qb_replay_*), an operator's copy of inbox
 * rows into new outbox rows, whose topics are rendered as the relay renders
 * them (qb_relay_topic); both hosts' replay calls run it.
 *-------------------------------------------------------------------------
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qb_extract.h"
#include "qb_otlp.h"
#include "qb_relay.h"

#define QBR_FORWARD_TRIES	3
#define QBR_IDLE_WAIT_MS	5000

typedef struct QbrEngine
{
	const QbHost *host;
	const QbStore *store;
	QbConfig   *cfg;			/* NULL until a valid document is stored */
	bool		warned_no_config;
	bool		warned_disabled;
	bool		warned_unknown; /* a row of a source not in cfg was seen */
	QbRelayStats *stats;
} QbrEngine;

static const char *const qbr_names[] = {"source", "eventType", NULL};

char *
qb_relay_topic(const QbConfig *cfg, const char *source, const char *event_type,
			   bool *known)
{
	const QbSource *src = qb_config_source(cfg, source);
	const char *tmpl = src && src->topic ? src->topic : QB_RELAY_DEFAULT_TOPIC;
	const char *values[] = {source, event_type, NULL};

	*known = src != NULL;
	return qb_template_render(tmpl, qbr_names, values);
}

bool
qb_replay_render(const QbConfig *cfg, const int64_t *ids, const char *const *sources,
				 const char *const *event_types, int nrows, QbReplay *r)
{
	memset(r, 0, sizeof(*r));
	r->skipped = -1;
	r->nrows = nrows;
	if (nrows == 0)
		return true;
	r->ids = malloc(sizeof(int64_t) * nrows);
	r->topics = calloc(nrows, sizeof(char *));
	if (r->ids == NULL || r->topics == NULL)
		goto oom;
	for (int i = 0; i < nrows; i++)
	{
		bool		known;
		char	   *topic = qb_relay_topic(cfg, sources[i], event_types[i], &known);

		if (topic == NULL)
			goto oom;
		if (topic[0] == '\0')
		{
			r->nskipped++;
			r->skipped = i;
			free(topic);
			continue;
		}
		r->ids[r->n] = ids[i];
		r->topics[r->n++] = topic;
	}
	return true;

oom:
	qb_replay_free(r);
	return false;
}

void
qb_replay_free(QbReplay *r)
{
	for (int i = 0; i < r->n; i++)
		free(r->topics[i]);
	free(r->ids);
	free(r->topics);
	memset(r, 0, sizeof(*r));
	r->skipped = -1;
}

/* qb_replay_answer: *out = the JSON answer, spaced as json_build_object prints it. */
static int
qb_replay_answer(char **out, const char *name, bool null, long long v, const char *oom,
				 char *err, size_t errlen)
{
	char		buf[64];

	if (null)
		snprintf(buf, sizeof(buf), "{\"%s\" : null}", name);
	else
		snprintf(buf, sizeof(buf), "{\"%s\" : %lld}", name, v);
	if ((*out = strdup(buf)) == NULL)
	{
		snprintf(err, errlen, "%s", oom);
		return -1;
	}
	return 0;
}

int
qb_replay_run(const QbConfig *cfg, bool single, const char *const *params,
			  const QbReplayCalls *calls, void *ctx, char **out, char *err, size_t errlen)
{
	const char *v[5];
	const int64_t *ids = NULL;
	const char *const *sources = NULL;
	const char *const *types = NULL;
	QbReplay	r = {.skipped = -1};
	long long	nrows = 0;
	long long	first_id = 0;
	bool		first_null = true;
	int			n = 0;
	int			rc = -1;

	if (cfg == NULL)
	{
		snprintf(err, errlen,
				 "no queuebox configuration is in force: a replayed inbox row takes its topic from its source's template");
		return -1;
	}
	if (single && params[0] == NULL)	/* STRICT, as the SQL function */
		return qb_replay_answer(out, "id", true, 0, calls->oom, err, errlen);
	v[0] = single ? params[0] : NULL;
	for (int i = 0; i < 4; i++)
		v[i + 1] = single ? NULL : params[i];
	if (calls->select(ctx, v, &ids, &sources, &types, &n, err, errlen) != 0)
		return -1;
	if (!qb_replay_render(cfg, ids, sources, types, n, &r))
	{
		snprintf(err, errlen, "%s", calls->oom);
		return -1;
	}
	if (single && r.nrows == 0)
	{
		snprintf(err, errlen, QB_REPLAY_MISSING_FMT, strtoll(params[0], NULL, 10));
		rc = QB_QUERY_NOT_FOUND;
		goto done;
	}
	if (single && r.nskipped > 0)
	{
		char		detail[300];

		snprintf(detail, sizeof(detail), QB_REPLAY_EMPTY_DETAIL_FMT, sources[r.skipped]);
		snprintf(err, errlen, QB_REPLAY_EMPTY_FMT ": %s %s", (long long) ids[r.skipped],
				 detail, QB_REPLAY_EMPTY_HINT);
		rc = QB_QUERY_BAD_INPUT;
		goto done;
	}
	if (r.n > 0 &&
		calls->insert(ctx, &r, qb_config_relay_max_attempts(cfg), &nrows, &first_null,
					  &first_id, err, errlen) != 0)
		goto done;
	if (single)
		rc = qb_replay_answer(out, "id", first_null, first_id, calls->oom, err, errlen);
	else
		rc = qb_replay_answer(out, "replayed", false, nrows, calls->oom, err, errlen);
done:
	qb_replay_free(&r);
	return rc;
}

/* qbr_reload swaps the engine's config for the stored one (qb_reload_config). */
static void
qbr_reload(QbrEngine *e)
{
	if (!qb_reload_config(e->host, e->store, &e->cfg, &e->warned_no_config, "push inbox rows"))
		return;
	e->warned_disabled = false;
	e->warned_unknown = false;
	qb_store_takeover(e->host, e->store, e->cfg->inbox.relay.takeover);
	qb_log(e->host, QB_LOG_INFO, "configuration loaded: %d source%s, relay %s",
		   e->cfg->nsources, e->cfg->nsources == 1 ? "" : "s",
		   e->cfg->inbox.relay.enabled ? "enabled" : "disabled (inbox.relay.enabled: false)");
}

/*
 * qbr_spans: one span per forwarded row, when spans are exported: a child
 * of the row's traceparent (the outbox row it wrote carries that on), or
 * the root of a trace of its own when it has none.  No traceState: the
 * claim returns the row's traceparent, not its tracestate.
 */
static void
qbr_spans(QbrEngine *e, const QbRelayRow *rows, const char *const *topics, int n, int64_t t0)
{
	char		name[160];

	if (!qb_otlp_on(qb_host_otlp(e->host)))
		return;
	for (int i = 0; i < n; i++)
	{
		QbSpan		span;

		snprintf(name, sizeof(name), "forward %s", rows[i].source);
		if (!qb_span_start_tp(&span, name, QB_SPAN_INTERNAL, rows[i].traceparent, NULL))
			continue;			/* not sampled */
		span.start_ns = t0;
		qb_span_str(&span, "queuebox.source", rows[i].source);
		qb_span_int(&span, "queuebox.inbox.id", rows[i].id);
		qb_span_str(&span, "queuebox.topic", topics[i]);
		qb_span_str(&span, "queuebox.outcome", topics[i][0] != '\0' ? "forwarded" : "dead");
		span.error = topics[i][0] == '\0';
		qb_otlp_emit(qb_host_otlp(e->host), &span);
	}
	qb_otlp_log_errors(e->host);
}

/*
 * qbr_forward writes the batch, trying a few times: if the database is
 * briefly unavailable the lease still protects the rows, but forwarding now
 * spares them a wait of claimTimeoutMs.
 */
static int
qbr_forward(QbrEngine *e, const char *token, const int64_t *ids,
			const char *const *topics, const bool *holds, int n)
{
	char		err[QB_ERRLEN];
	int			settled = 0;
	int			inserted = 0;

	for (int tries = 1;; tries++)
	{
		if (e->store->relay_forward(e->store->ctx, token, ids, topics, holds, n,
									qb_config_relay_max_attempts(e->cfg),
									&settled, &inserted, err, sizeof(err)) == 0)
			break;
		if (tries >= QBR_FORWARD_TRIES)
		{
			qb_log(e->host, QB_LOG_WARNING,
				   "could not forward a batch of %d rows (%s); they are claimed again when their lease expires",
				   n, err);
			return -1;
		}
		e->host->wait(e->host->ctx, -1, 200 * tries);
	}
	e->stats->batches++;
	e->stats->forwarded += inserted;
	e->stats->dead += settled - inserted;
	if (e->host->metrics != NULL)
	{
		qb_metrics_add(&e->host->metrics->relay_forwarded, (uint64_t) inserted);
		qb_metrics_add(&e->host->metrics->relay_dead, (uint64_t) (settled - inserted));
	}
	e->stats->taken_over += n - settled;
	if (settled != n)
		qb_log(e->host, QB_LOG_INFO,
			   "forwarded %d of %d rows; the others' leases had expired and were taken over",
			   settled, n);
	if (settled > inserted)
	{
		int			held = 0;

		for (int i = 0; i < n; i++)
			held += holds[i] && topics[i][0] == '\0';
		qb_log(e->host, QB_LOG_WARNING,
			   "%d inbox rows went to dead: their topic template rendered empty (set eventTypePath or use {{ source }} in the topic, then requeue them)%s",
			   settled - inserted,
			   held > 0 ? "; those of a source with onDead: holdKey hold their aggregate's later rows until requeued or skipped" : "");
	}
	return 0;
}

/* qbr_round runs one claim and forward; rows claimed, or -1 on an error. */
static int
qbr_round(QbrEngine *e)
{
	int64_t		t0;
	const QbRelayConf *rc = &e->cfg->inbox.relay;
	char		token[QB_UUID_LEN + 1];
	char		err[QB_ERRLEN];
	QbRelayRow *rows = NULL;
	int			n = 0;
	int64_t    *ids = NULL;
	char	  **topics = NULL;
	bool	   *holds = NULL;
	int			result = -1;

	if (!qb_uuid_v4(token))
	{
		qb_log(e->host, QB_LOG_WARNING, "no random bytes for a claim token");
		return -1;
	}
	if (e->store->relay_claim(e->store->ctx, rc->batch_size, rc->claim_timeout_ms,
							  token, &rows, &n, err, sizeof(err)) != 0)
	{
		qb_log(e->host, QB_LOG_WARNING, "relay claim failed: %s", err);
		return -1;
	}
	if (n == 0)
	{
		qb_relay_rows_free(rows, 0);	/* a store may return an empty array */
		return 0;
	}

	ids = calloc(n, sizeof(int64_t));
	topics = calloc(n, sizeof(char *));
	holds = calloc(n, sizeof(bool));
	if (ids == NULL || topics == NULL || holds == NULL)
		goto err;
	for (int i = 0; i < n; i++)
	{
		const QbSource *src = qb_config_source(e->cfg, rows[i].source);
		bool		known;

		ids[i] = rows[i].id;
		/* a row of a source no longer configured releases, the default */
		holds[i] = src != NULL && src->on_dead == QB_ON_DEAD_HOLD_KEY;
		topics[i] = qb_relay_topic(e->cfg, rows[i].source, rows[i].event_type, &known);
		if (topics[i] == NULL)
			goto err;
		if (!known && !e->warned_unknown)
		{
			qb_log(e->host, QB_LOG_WARNING,
				   "inbox row %lld is of source \"%s\", which the configuration no longer has; its topic is rendered with the default template \"%s\" (further rows of unknown sources are not reported until the configuration changes)",
				   (long long) rows[i].id, rows[i].source, QB_RELAY_DEFAULT_TOPIC);
			e->warned_unknown = true;
		}
	}
	t0 = qb_otlp_now_ns();
	if (qbr_forward(e, token, ids, (const char *const *) topics, holds, n) != 0)
		goto done;
	qbr_spans(e, rows, (const char *const *) topics, n, t0);
	result = n;
	goto done;

err:
	/* the rows stay claimed and come back when their lease expires */
	qb_log(e->host, QB_LOG_WARNING, "out of memory for a relay batch of %d rows", n);
done:
	if (topics)
		for (int i = 0; i < n; i++)
			free(topics[i]);
	free(topics);
	free(ids);
	free(holds);
	qb_relay_rows_free(rows, n);
	return result;
}

int
qb_relay_run(const QbHost *host, const QbStore *store, QbRelayStats *stats,
			 char *err, size_t errlen)
{
	QbrEngine	e = {0};
	QbRelayStats local = {0};

	e.host = host;
	e.store = store;
	e.stats = stats ? stats : &local;

	while (!host->should_stop(host->ctx))
	{
		int			claimed;

		/* with no usable config, look again after every wait */
		if (host->config_changed(host->ctx) || e.cfg == NULL)
			qbr_reload(&e);
		if (e.cfg == NULL || !e.cfg->inbox.relay.enabled)
			qb_host_doing(host, QB_W_IDLE);
		if (e.cfg == NULL)
		{
			host->wait(host->ctx, -1, QBR_IDLE_WAIT_MS);
			continue;
		}
		if (!e.cfg->inbox.relay.enabled)
		{
			if (!e.warned_disabled)
				qb_log(host, QB_LOG_INFO,
					   "inbox.relay.enabled is false: push rows stay pending until it is turned on");
			e.warned_disabled = true;
			host->wait(host->ctx, -1, QBR_IDLE_WAIT_MS);
			continue;
		}
		qb_host_doing(host, QB_W_CLAIMING);
		claimed = qbr_round(&e);
		if (claimed >= 0)
			qb_host_cycle(host);
		if (host->polled && claimed >= 0)
			host->polled(host->ctx, claimed > 0);
		if (claimed >= e.cfg->inbox.relay.batch_size)
			continue;			/* a full batch: more may be waiting */
		qb_host_doing(host, claimed < 0 ? QB_W_BACKING_OFF : QB_W_IDLE);
		host->wait(host->ctx, -1,
				   claimed < 0 ? 1000 : e.cfg->inbox.relay.poll_interval_ms);
	}
	qb_config_free(e.cfg);
	return 0;
}
