/*-------------------------------------------------------------------------
 * qb_outbox.c
 *	  The outbox engine loop.  Its chores between cycles (reclaim, unpark,
 *	  sweep, retention) are qb_outbox_housekeeping.c's; the state both
 *	  work on is qb_outbox_int.h's.
 *
 * Wording (docs/design/claim.md):
 *	- A slot holds one claimed row from its claim until its settle is
 *	  written: queued (routed, waiting for room at its destination), sending
 *	  (a publish in flight), or done (its settle outcome is known).
 *	- A cycle is one store transaction: settle the done slots, count their
 *	  attempts into the circuit breakers, promote the next row of each key
 *	  that ended, and claim again.  A settle never waits for another row.
 *	- A destination takes rows when its circuit is closed and no Retry-After
 *	  pauses it; at most maxInFlight of its rows send at once, as many more
 *	  plus a batch wait queued, and the rest go back routed.  Rows of one
 *	  that takes none are held without spending an attempt (but the probe
 *	  row of a half-open one).
 *	- Rows not routed yet are routed here (qbo_size_claim sizes their claim);
 *	  new rows are claimed above intake floors (qbo_lower_floors).
 *	- A limited destination (rateLimit, maxConcurrent) is asked by a claim
 *	  for no more rows than its limit reserved, and a row starts only with
 *	  its token and place (qb_outbox_limits.c, shared by the server's
 *	  workers through the host).
 *
 * Transaction rules: each cycle is one short transaction, none open while
 * requests are in flight; a cycle not written leaves its rows processing
 * until their leases end: at least once, never lost.  Waking: claims go on
 * while they bring rows and there is room, else a wake or the poll.
 *-------------------------------------------------------------------------
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "qb_backoff.h"
#include "qb_publish.h"
#include "qb_otlp.h"
#include "qb_trace.h"
#include "qb_outbox_int.h"
#include "qb_transform.h"

#define QBO_FULL_SCAN_MS		1000
#define QBO_SETTLE_DELAY_MS		5	/* the longest a done row waits for company */
#define QBO_CYCLE_RETRY_MS		200
#define QBO_SHARE_MIN			0.05	/* a share below this counts as none */
#define QBO_STATES_MS			250 /* the oldest view of the circuits a claim may keep */


/* ---------------------------------------------------------------------
 * Slots
 * ---------------------------------------------------------------------
 */

static QboSlot *
qbo_slot_new(QboEngine *e, int *index)
{
	for (int i = 0; i < e->nslots; i++)
		if (e->slots[i].st == QBO_FREE)
		{
			*index = i;
			e->nactive++;
			return &e->slots[i];
		}
	{
		int			n = e->nslots ? e->nslots * 2 : 256;
		QboSlot    *s = realloc(e->slots, n * sizeof(QboSlot));

		if (s == NULL)
			return NULL;
		memset(s + e->nslots, 0, (n - e->nslots) * sizeof(QboSlot));
		*index = e->nslots;
		e->slots = s;
		e->nslots = n;
		e->nactive++;
		return &e->slots[*index];
	}
}

static void
qbo_slot_free(QboEngine *e, QboSlot *s)
{
	qb_outbox_rows_free_one(&s->row);
	free(s->error);
	free(s->trace_state);
	memset(s, 0, sizeof(*s));
	e->nactive--;
}

static QboDest *
qbo_dest(QboEngine *e, const QboSlot *s)
{
	return s->dest >= 0 ? &e->dests[s->dest] : NULL;
}

/* qbo_dest_index: the index in cfg->destinations of a name, or -1. */
static int
qbo_dest_index(const QboEngine *e, const char *name)
{
	const QbDestination *d = name != NULL ? qb_config_destination(e->cfg, name) : NULL;

	return d != NULL ? (int) (d - e->cfg->destinations) : -1;
}

static const char *
qbo_dest_name(QboEngine *e, const QboSlot *s)
{
	return s->dest >= 0 ? e->cfg->destinations[s->dest].name : NULL;
}

/*
 * qbo_on_dead: what a dead row of slot s does to its key: its route's
 * onDead, else its destination's (release when it has neither: no route).
 */
static QbOnDead
qbo_on_dead(QboEngine *e, const QboSlot *s)
{
	if (s->route >= 0 && e->cfg->routes[s->route].on_dead != QB_ON_DEAD_UNSET)
		return e->cfg->routes[s->route].on_dead;
	if (s->dest >= 0)
		return e->cfg->destinations[s->dest].on_dead;
	return QB_ON_DEAD_RELEASE;
}

/* qbo_done gives a slot its settle outcome, copying the error text. */
static void
qbo_done(QboEngine *e, QboSlot *s, QbSettleKind kind, int attempt, long delay_ms,
		 const char *error)
{
	QboDest    *d = qbo_dest(e, s);

	if (kind == QB_SETTLE_DEAD && qbo_on_dead(e, s) == QB_ON_DEAD_HOLD_KEY)
		kind = QB_SETTLE_DEAD_HOLD;		/* the settle keeps its key (claim.md) */
	if (d != NULL && s->st == QBO_SENDING)
	{
		d->sending--;
		qbo_limit_done(e, s);	/* its maxConcurrent place, if it held one */
	}
	if (d != NULL && s->st == QBO_QUEUED)
		d->queued--;
	free(s->error);
	s->error = error ? strdup(error) : NULL;
	s->settle.id = s->row.id;
	s->settle.token = NULL;		/* the slot's own: set when gathered (qbo_gather_done) */
	s->settle.kind = kind;
	s->settle.attempt = attempt;
	s->settle.delay_ms = delay_ms;
	s->settle.error = s->error;
	s->settle.destination = qbo_dest_name(e, s);
	s->settle.unrouted = s->row.destination == NULL;
	s->settle.fanout = s->settle.unrouted && s->row.not_due;
	/* a fan-out row is copied when its first destination is recorded */
	s->settle.copies = s->settle.unrouted && s->dest >= 0 && s->route >= 0 ?
		e->cfg->routes[s->route].copies : NULL;
	s->st = QBO_DONE;
	s->done_at = qb_now_ms();
}

/*
 * qbo_failed records a failed attempt: retry with backoff (at least the
 * Retry-After the destination asked for, capped by backoff.maxMs), or dead
 * when this attempt was the row's last.
 */
static void
qbo_failed(QboEngine *e, QboSlot *s, const char *why, long retry_after_ms)
{
	QbOutboxRow *row = &s->row;
	int			attempt = row->attempt + 1;
	char		msg[QB_ERRLEN + 256];

	if (attempt >= row->max_attempts)
	{
		snprintf(msg, sizeof(msg), "attempt %d of %d failed, none remain: %s",
				 attempt, row->max_attempts, why);
		qbo_done(e, s, QB_SETTLE_DEAD, attempt, 0, msg);
		e->stats->dead++;
	}
	else
	{
		const QbBackoff *b = &e->cfg->outbox.backoff;
		long		delay = qb_backoff_delay_ms(b, attempt, qb_random_unit());

		if (retry_after_ms > delay)
			delay = retry_after_ms < b->max_ms ? retry_after_ms : b->max_ms;
		snprintf(msg, sizeof(msg), "attempt %d of %d failed, retry in %ld ms: %s",
				 attempt, row->max_attempts, delay, why);
		qbo_done(e, s, QB_SETTLE_RETRY, attempt, delay, msg);
		e->stats->retried++;
	}
}

/* qbo_hold parks a row until its destination takes rows again. */
static void
qbo_hold(QboEngine *e, QboSlot *s, int attempt, const char *why)
{
	char		msg[QB_ERRLEN + 256];

	snprintf(msg, sizeof(msg), "held, no attempt spent: destination %s %s; delivered once it takes rows again",
			 qbo_dest_name(e, s), why);
	qbo_done(e, s, QB_SETTLE_HOLD, attempt, 0, msg);
	e->stats->held++;
}

/* qbo_hold_reason: why destination d takes no rows now, or NULL when it does. */
const char *
qbo_hold_reason(const QboDest *d)
{
	switch (d->state)
	{
		case QB_CIRCUIT_DISABLED:
			return "is disabled (it answered 410 Gone; queuebox.resume_destination() enables it)";
		case QB_CIRCUIT_OPEN:
			return "has an open circuit (consecutive failures)";
		case QB_CIRCUIT_HALF_OPEN:
			return "is half-open (one probe row is being tried)";
		case QB_CIRCUIT_CLOSED:
			break;
	}
	return d->paused ? "is paused (it answered Retry-After)" : NULL;
}

/* ---------------------------------------------------------------------
 * Publishing
 * ---------------------------------------------------------------------
 */

static void
qbo_publish_done(void *arg, int tag, const QbPubOutcome *out)
{
	QboEngine  *e = arg;
	QboSlot    *s;
	QboDest    *d;
	bool		gone = out->gone;
	long		ra = out->retry_after_ms;	/* -1: none (only a 429 or 503 has one) */

	if (tag < 0 || tag >= e->nslots || e->slots[tag].st != QBO_SENDING)
		return;
	s = &e->slots[tag];
	d = qbo_dest(e, s);
	s->attempted = true;
	s->attempt_ok = out->ok;
	s->status = out->status;
	if (s->spanned)
		s->span.end_ns = qb_otlp_now_ns();
	s->gone = gone;
	/* the destination's pause, as the row's retry, is capped by backoff.maxMs */
	s->retry_after_ms = ra <= 0 ? 0 : ra < e->cfg->outbox.backoff.max_ms ? ra :
		e->cfg->outbox.backoff.max_ms;
	if (out->ok)
	{
		qbo_done(e, s, QB_SETTLE_SENT, s->row.attempt + 1, 0, NULL);
		e->stats->sent++;
	}
	else if (gone)
	{
		char		msg[QB_ERRLEN + 256];

		snprintf(msg, sizeof(msg), "attempt %d answered 410 Gone: %s",
				 s->row.attempt + 1, out->error);
		d->state = QB_CIRCUIT_DISABLED;
		qbo_hold(e, s, s->row.attempt + 1, "was disabled by this answer");
		free(s->error);
		s->error = strdup(msg);
		s->settle.error = s->error;
	}
	else if (out->permanent)
	{
		char		msg[QB_ERRLEN + 256];

		/* the row's fault, not the destination's: the breaker is not told */
		s->attempted = false;
		snprintf(msg, sizeof(msg), "attempt %d refused for good: %s",
				 s->row.attempt + 1, out->error);
		qbo_done(e, s, QB_SETTLE_DEAD, s->row.attempt + 1, 0, msg);
		e->stats->dead++;
	}
	else
	{
		if (ra > 0)
			d->paused = true;
		qbo_failed(e, s, out->error, ra);
	}
}

/*
 * qbo_transform runs the route's transform, then the destination's, on a
 * routed row (one helper run for both) and puts the result in the row's
 * payload.  Returns false when the row got its outcome: dead for a
 * rejection, a failed attempt when the helper could not run.
 */
static bool
qbo_transform(QboEngine *e, QboSlot *s)
{
	QbOutboxRow *row = &s->row;
	const QbDestination *dest = &e->cfg->destinations[s->dest];
	const QbTransform *chain[2];
	char		place[160];
	char		err[QB_ERRLEN];
	char		msg[QB_ERRLEN + 256];
	QbTransformVars vars = {row->topic, row->key, row->headers, NULL, NULL};
	char	   *out;
	size_t		outlen;
	int			n = 0;
	int			at;
	bool		routed = e->cfg->routes[s->route].transform != NULL;

	if (routed)
		chain[n++] = e->cfg->routes[s->route].transform;
	if (dest->transform != NULL)
		chain[n++] = dest->transform;
	if (n == 0)
		return true;
	switch (qb_transform_run_chain(qb_host_jq(e->host), chain, n, row->payload, row->payload_len,
								   &vars, NULL, &out, &outlen, &at, err, sizeof(err)))
	{
		case QB_TRANSFORM_OK:
			free(row->payload);
			row->payload = out;
			row->payload_len = outlen;
			return true;
		case QB_TRANSFORM_REJECTED:
			/* at < 0: the payload itself (not JSON), before any transform */
			if (routed && (at <= 0 || at >= n))
				snprintf(place, sizeof(place), "route routes[%d]", s->route);
			else
				snprintf(place, sizeof(place), "destination %s", dest->name);
			snprintf(msg, sizeof(msg), "%s transform rejected the message: %s", place, err);
			qbo_done(e, s, QB_SETTLE_DEAD, row->attempt, 0, msg);
			e->stats->dead++;
			return false;
		case QB_TRANSFORM_FAILED:
			qbo_failed(e, s, err, 0);
			return false;
	}
	return true;
}

/*
 * qbo_span_start: the attempt's span, when spans are exported: the child
 * the publish carries (its parent the row's context, with the row's
 * tracestate), or the root of a new trace for a row that has none.
 */
static void
qbo_span_start(QboEngine *e, QboSlot *s, const QbTraceContext *parent,
			   const QbTraceContext *child, const char *tracestate)
{
	const QbDestination *d = &e->cfg->destinations[s->dest];

	s->spanned = qb_span_start(&s->span, d->name,
							   d->type == QB_DEST_HTTP ? QB_SPAN_CLIENT : QB_SPAN_PRODUCER, parent);
	if (!s->spanned)
		return;
	if (child != NULL)
		s->span.ctx = *child;
	/* the row's headers are gone when the span ends: a copy of its own */
	free(s->trace_state);
	s->trace_state = tracestate != NULL ? strdup(tracestate) : NULL;
	qb_span_tracestate(&s->span, s->trace_state);
	/* the name: the operation and the destination, as OpenTelemetry's messaging spans */
	snprintf(s->span_name, sizeof(s->span_name), "deliver %s", d->name);
	qb_span_str(&s->span, "queuebox.destination", d->name);
	qb_span_str(&s->span, "queuebox.destination.type", qb_dest_type_name(d->type));
	qb_span_int(&s->span, "queuebox.outbox.id", s->row.id);
	qb_span_str(&s->span, "queuebox.topic", s->row.topic);
	qb_span_int(&s->span, "queuebox.attempt", s->row.attempt + 1);
}

/*
 * qbo_span_end: the settle of a spanned attempt is written: its outcome,
 * and the span goes to the exporter.
 */
static void
qbo_span_end(QboEngine *e, QboSlot *s)
{
	const char *outcome;

	if (!s->spanned)
		return;
	s->spanned = false;
	switch (s->settle.kind)
	{
		case QB_SETTLE_SENT:
			outcome = "delivered";
			break;
		case QB_SETTLE_DEAD:
		case QB_SETTLE_DEAD_HOLD:
			outcome = "dead";
			break;
		case QB_SETTLE_HOLD:
			outcome = s->attempted ? "failed" : "held";
			break;
		case QB_SETTLE_RELEASE:
			outcome = "released";	/* stopped mid-attempt: it is tried again */
			break;
		default:
			outcome = "failed";
			break;
	}
	qb_span_str(&s->span, "queuebox.outcome", outcome);
	if (s->status > 0)
		qb_span_int(&s->span, "http.response.status_code", s->status);
	s->span.error = s->settle.kind != QB_SETTLE_SENT;
	s->span.message = s->span.error ? s->error : NULL;
	/*
	 * what lies in the slot itself is pointed at only now: the slots may
	 * have moved since the start (qbo_slot_new grows them by realloc)
	 */
	s->span.name = s->span_name;
	qb_span_str(&s->span, "messaging.message.id", s->row.message_id);
	qb_otlp_emit(qb_host_otlp(e->host), &s->span);
}

/* qbo_start publishes a queued row; it may get its outcome at once. */
static void
qbo_start(QboEngine *e, QboSlot *s, int tag)
{
	QboDest    *d = qbo_dest(e, s);
	char		err[QB_ERRLEN];
	QbMessage	m;
	json_t	   *headers = NULL;
	QbPubStart	r;
	QbTraceContext parent;
	QbTraceContext span;
	bool		traced;

	if (!qbo_limit_take(e, s))
	{
		/* its limit has no token or place now: back to the table, routed */
		qbo_done(e, s, QB_SETTLE_ROUTE, s->row.attempt, 0, NULL);
		return;
	}
	d->queued--;
	s->st = QBO_SENDING;
	d->sending++;
	if (!qbo_transform(e, s))
		return;
	m.message_id = s->row.message_id;
	m.topic = s->row.topic;
	m.key = s->row.key;
	m.body = s->row.payload;
	m.body_len = s->row.payload_len;
	/* parsed here, once, for whichever publisher takes the message */
	r = qb_message_headers(s->row.headers, &headers, err, sizeof(err)) ?
		QB_PUB_STARTED : QB_PUB_ROW_INVALID;
	/* each attempt is a span of its own: a child of the row's context */
	traced = r == QB_PUB_STARTED && qb_trace_publish(headers, &parent, &span);
	if (qb_otlp_on(qb_host_otlp(e->host)))
		qbo_span_start(e, s, traced ? &parent : NULL, traced ? &span : NULL,
					   traced ? qb_trace_state(headers) : NULL);
	m.headers = headers;
	s->sent_ns = qb_now_ns();
	if (r == QB_PUB_STARTED)
		r = qb_pubset_start(e->pub, &e->cfg->destinations[s->dest], &m, tag, err, sizeof(err));
	json_decref(headers);
	switch (r)
	{
		case QB_PUB_STARTED:
			break;
		case QB_PUB_ROW_INVALID:
			/* a row (or a destination type) that can never be sent as it is */
			qbo_done(e, s, QB_SETTLE_DEAD, s->row.attempt, 0, err);
			e->stats->dead++;
			break;
		case QB_PUB_NOT_STARTED:
			s->attempted = true;
			qbo_failed(e, s, err, 0);
			break;
	}
}

/*
 * qbo_start_queued starts queued rows, oldest claim first within each
 * destination's room; rows of a destination that stopped taking rows are
 * held instead.
 */
static void
qbo_start_queued(QboEngine *e)
{
	for (int i = 0; i < e->nslots; i++)
	{
		QboSlot    *s = &e->slots[i];
		QboDest    *d;
		const char *why;

		if (s->st != QBO_QUEUED)
			continue;
		d = qbo_dest(e, s);
		if ((why = qbo_hold_reason(d)) != NULL)
			qbo_hold(e, s, s->row.attempt, why);
		else if (d->sending < e->cfg->destinations[s->dest].max_in_flight)
			qbo_start(e, s, i);
	}
}

/*
 * qbo_dispatch routes one claimed row: it is queued for its destination,
 * or gets its outcome at once (no route, held, not due, no room).
 */
static void
qbo_dispatch(QboEngine *e, QbOutboxRow *row, const char *token)
{
	int			tag;
	QboSlot    *s;
	QboDest    *d;
	const QbDestination *dest;
	const char *why;
	char		msg[QB_ERRLEN + 256];

	if (!row->claimed)
	{
		/* parked behind its key or moved to ready: nothing to do */
		e->stats->parked++;
		qb_outbox_rows_free_one(row);
		return;
	}
	if ((s = qbo_slot_new(e, &tag)) == NULL)
	{
		/* left to its lease: nothing was published */
		qb_log(e->host, QB_LOG_WARNING, "out of memory for a claimed row; it returns to pending when its lease expires");
		qb_outbox_rows_free_one(row);
		return;
	}
	s->row = *row;
	memset(row, 0, sizeof(*row));
	strcpy(s->token, token);
	s->dest = -1;
	s->route = qb_config_route_find(e->cfg, s->row.topic);
	s->st = QBO_QUEUED;
	if (s->route < 0)
	{
		snprintf(msg, sizeof(msg),
				 "no route matches topic \"%.200s\"; add a route for it, then requeue the row (queuebox.requeue_outbox)",
				 s->row.topic);
		qbo_done(e, s, QB_SETTLE_DEAD, s->row.attempt, 0, msg);
		e->stats->dead++;
		return;
	}
	/* a row keeps the destination it was first routed to (claim.md) */
	s->dest = qbo_dest_index(e, s->row.destination);
	if (s->dest < 0)
		s->dest = e->cfg->routes[s->route].dest_index;
	dest = &e->cfg->destinations[s->dest];
	d = &e->dests[s->dest];
	d->claimed_now++;
	if (s->row.destination == NULL)
		d->unrouted_now++;		/* routed here: for the next claims' size */
	d->queued++;
	if (s->row.destination == NULL && e->cfg->routes[s->route].ndests > 1)
	{
		/*
		 * Fan-out: the row goes back routed to its first destination, and
		 * the settle copies it to the others; each is then claimed at its
		 * own destination, in its key's order there (claim.md).
		 */
		qbo_done(e, s, QB_SETTLE_ROUTE, s->row.attempt, 0, NULL);
		return;
	}
	if (s->row.probe && d->probe)
	{
		/*
		 * The one row a half-open destination is tried with, due or not: a
		 * held row waited for its destination, not for its own backoff (as
		 * at the unpark); a routed probe may be a retry waiting out its
		 * backoff, which must not keep the circuit from closing.
		 */
		d->probe = false;
		qb_log(e->host, QB_LOG_INFO, "destination %s is half-open: trying row %lld as its probe",
			   dest->name, (long long) s->row.id);
		qbo_start(e, s, tag);
	}
	else if (s->row.not_due)
		qbo_done(e, s, QB_SETTLE_ROUTE, s->row.attempt, 0, NULL);
	else if ((why = qbo_hold_reason(d)) != NULL)
		qbo_hold(e, s, s->row.attempt, why);
	else if (d->queued > dest->max_in_flight + e->cfg->outbox.batch_size)
		/* more than it can take soon: back to the table, routed */
		qbo_done(e, s, QB_SETTLE_ROUTE, s->row.attempt, 0, NULL);
	else if (d->sending < dest->max_in_flight)
		qbo_start(e, s, tag);
}

/* ---------------------------------------------------------------------
 * Cycles
 * ---------------------------------------------------------------------
 */

/*
 * qbo_count adds settled rows to the shared metrics: what a destination
 * acknowledged (with the time since the row was created), what failed and
 * what went dead.  Counted once the settle is written, so a settle that is
 * lost (and delivered again) is not counted twice.
 */
static void
qbo_count(QboEngine *e, const QboSlot *s, double now)
{
	const char *d = s->dest >= 0 ? e->cfg->destinations[s->dest].name : "_unrouted";

	if (e->host->metrics == NULL)
		return;
	switch (s->settle.kind)
	{
		case QB_SETTLE_SENT:
			qb_metrics_delivery(e->host->metrics, d, QB_DELIVERED, now - s->row.created_epoch);
			break;
		case QB_SETTLE_RETRY:
			qb_metrics_delivery(e->host->metrics, d, QB_FAILED, -1);
			break;
		case QB_SETTLE_DEAD:
		case QB_SETTLE_DEAD_HOLD:
			qb_metrics_delivery(e->host->metrics, d, QB_DEAD, -1);
			break;
		case QB_SETTLE_HOLD:
			if (s->attempted)
				qb_metrics_delivery(e->host->metrics, d, QB_FAILED, -1);
			break;
		case QB_SETTLE_RELEASE:
		case QB_SETTLE_ROUTE:
			break;
	}
}

/*
 * qbo_tally adds a done slot's attempt to its destination's tally, with
 * how long ago its latest success was sent: the store closes an open
 * circuit only for a success sent after the circuit opened (the probe), so
 * a request answered before a partition and settled late does not close it
 * mid-partition.  A duration, not a time: the store subtracts it from its
 * own clock at the start of the cycle's transaction, so no worker's clock
 * is compared with the database's; the estimate is late by at most the
 * time from here to that start.
 */
static void
qbo_tally(QboEngine *e, const QboSlot *s, QbDestTally *t, int *nt)
{
	const QbDestination *dest;
	QbDestTally *x = NULL;

	if (!s->attempted || s->dest < 0)
		return;
	dest = &e->cfg->destinations[s->dest];
	for (int i = 0; i < *nt; i++)
		if (strcmp(t[i].destination, dest->name) == 0)
			x = &t[i];
	if (x == NULL)
	{
		x = &t[(*nt)++];
		memset(x, 0, sizeof(*x));
		x->destination = dest->name;
		x->threshold = dest->breaker_failures;
		x->cooldown_ms = dest->breaker_cooldown_ms;
	}
	if (s->attempt_ok)
	{
		int64_t		ago = (qb_now_ns() - s->sent_ns) / 1000;

		if (x->ok++ == 0 || ago < x->ok_sent_ago_us)
			x->ok_sent_ago_us = ago;
	}
	else
	{
		x->failed++;
		x->error = s->error;
	}
	/*
	 * A row that failed before (here or at another worker) may have left
	 * a failure counted that this worker's view, read up to QBO_STATES_MS
	 * ago, does not show: its success must reach the breaker to reset it.
	 */
	if (s->attempt_ok && s->row.attempt > 0 && e->dests[s->dest].failures == 0)
		e->dests[s->dest].failures = 1;
	x->gone |= s->gone;
	if (s->retry_after_ms > x->retry_after_ms)
		x->retry_after_ms = s->retry_after_ms;
}

static int
qbo_tally_cmp(const void *a, const void *b)
{
	return strcmp(((const QbDestTally *) a)->destination, ((const QbDestTally *) b)->destination);
}

/*
 * qbo_dest_clear: as this worker sees destination d, its circuit is closed,
 * unpaused, with no failure counted and no probe of ours pending.
 */
static bool
qbo_dest_clear(const QboDest *d)
{
	return qbo_hold_reason(d) == NULL && d->failures == 0 && !d->probe;
}

/*
 * qbo_tally_needed: a destination's successes change nothing the breaker
 * keeps when it is closed, unpaused and has no failures counted (as the
 * last claim saw it, and our own tallies since): then the cycle need not
 * lock its row.  With failures counted a success must reach the row, for
 * it resets the count; skipped, the count of an endpoint that fails now
 * and then would only grow until the circuit opened.
 */
static bool
qbo_tally_needed(QboEngine *e, const QbDestTally *t)
{
	int			i = qbo_dest_index(e, t->destination);

	if (t->failed > 0 || t->gone || t->retry_after_ms > 0 || i < 0)
		return true;
	return !qbo_dest_clear(&e->dests[i]);
}

/*
 * qbo_apply_tallies: what the breaker statement did to the count, as the
 * tallies it was given say (its rule: a success resets, else failures
 * add), so a settle with no claim after it leaves the view right for the
 * next one.  A success sent before its circuit opened resets nothing
 * there; the circuit's new state (qbo_apply_changes) then shows it open,
 * so the view is not clear either way.  A claim's states, read after,
 * replace it.
 */
static void
qbo_apply_tallies(QboEngine *e, const QbDestTally *t, int n)
{
	for (int k = 0; k < n; k++)
	{
		int			i = qbo_dest_index(e, t[k].destination);

		if (i < 0)
			continue;
		if (t[k].ok > 0 && !t[k].gone)
			e->dests[i].failures = 0;
		else
			e->dests[i].failures += t[k].failed;
	}
}

/*
 * qbo_states_due: the claim reads the circuits (QB_PG_OUTBOX_STATES) when
 * this worker's view of one is not "closed, no failures", or when it was
 * read more than QBO_STATES_MS ago.  A claim itself takes no row of a
 * destination whose stored circuit is not closed or that is paused (the
 * store's claim asks), so a clear view that is stale only lets rows this
 * worker routes itself (unrouted, ready) go to a destination another worker
 * opened or an operator paused within that time, as a view read at the
 * claim does for the length of a request.  Reading them at every claim
 * took a quarter of a claim's time at a low rate (bench/RESULTS.md, issue
 * 37).
 */
static bool
qbo_states_due(const QboEngine *e, long now)
{
	if (now - e->states_at >= QBO_STATES_MS)
		return true;
	for (int i = 0; i < e->cfg->ndestinations; i++)
		if (!qbo_dest_clear(&e->dests[i]))
			return true;
	return false;
}

/*
 * qbo_apply_changes logs each circuit that a cycle moved, once per move;
 * the rows of a destination that closed are unparked by the housekeeping
 * of the next pass, which it schedules at once.
 */
static void
qbo_apply_changes(QboEngine *e, const QbCycleOut *out)
{
	for (int i = 0; i < out->nchanges; i++)
	{
		const QbDestChange *c = &out->changes[i];
		int			j = qbo_dest_index(e, c->destination);

		if (j >= 0)
		{
			e->dests[j].state = c->new_state;
			e->dests[j].paused = c->paused;
		}
		if (c->old_state == c->new_state)
			continue;
		qb_log(e->host, c->new_state == QB_CIRCUIT_CLOSED ? QB_LOG_INFO : QB_LOG_WARNING,
			   "destination %s: circuit %s -> %s%s", c->destination,
			   qb_circuit_name(c->old_state), qb_circuit_name(c->new_state),
			   c->new_state == QB_CIRCUIT_OPEN ? "; its rows are held, no attempt spent, until a probe succeeds" :
			   c->new_state == QB_CIRCUIT_DISABLED ? "; it answered 410 Gone: its rows are held until queuebox.resume_destination() or POST /admin/destinations/{name}/resume" :
			   c->new_state == QB_CIRCUIT_CLOSED ? "; its held rows are delivered again" : "");
		if (c->new_state == QB_CIRCUIT_CLOSED)
			e->next_unpark = 0;
	}
}

/*
 * qbo_update_shares: after a claim's rows are dispatched, each
 * destination's share of the rows that were not routed yet decays by a
 * quarter and takes a quarter of what it got now (a claim that brought none
 * changes nothing).
 */
static void
qbo_update_shares(QboEngine *e)
{
	int			total = 0;

	for (int i = 0; i < e->cfg->ndestinations; i++)
		total += e->dests[i].unrouted_now;
	for (int i = 0; i < e->cfg->ndestinations && total > 0; i++)
		e->dests[i].unrouted_share = 0.75 * e->dests[i].unrouted_share +
			0.25 * e->dests[i].unrouted_now;
	for (int i = 0; i < e->cfg->ndestinations; i++)
		e->dests[i].unrouted_now = 0;
}

/* qbo_room: routed rows destination i may be given by a claim now. */
static int
qbo_room(QboEngine *e, int i)
{
	const QbDestination *dest = &e->cfg->destinations[i];
	QboDest    *d = &e->dests[i];
	int			room = 2 * dest->max_in_flight - d->sending - d->queued;

	if (qbo_hold_reason(d) != NULL)
		return 0;
	if (room > e->cfg->outbox.batch_size)
		room = e->cfg->outbox.batch_size;
	return room > 0 ? room : 0;
}

/*
 * qbo_want_claim: rows may be waiting, and a destination has room for half
 * of what it may be given at once (claims of a few rows each would cost a
 * transaction per few rows), or nothing at all is in flight.  A
 * destination that takes no rows (open, half-open, disabled, paused) also
 * wants a claim, one per poll interval: the claim reads the circuits and
 * moves one whose cooldown is over to half-open, and with no other
 * destination taking rows no claim would come at all.  promoting: the
 * cycle settles rows of keys, whose next rows its promotion claims when it
 * claims (or leaves for a later claim, after an idle one: a wake or the
 * poll, one row of a key per poll): it claims even after an empty claim.
 */
static bool
qbo_want_claim(QboEngine *e, bool promoting)
{
	if (e->reload_pending || (e->claim_idle && !promoting) ||
		e->host->should_stop(e->host->ctx))
		return false;
	for (int i = 0; i < e->cfg->ndestinations; i++)
	{
		int			most = 2 * e->cfg->destinations[i].max_in_flight;
		int			room = qbo_room(e, i);

		if (most > e->cfg->outbox.batch_size)
			most = e->cfg->outbox.batch_size;
		if (room > 0 && qbo_limit_want(e, i, qb_now_ms()) &&
			(room * 2 >= most || e->nactive == 0))
			return true;
		if (qbo_hold_reason(&e->dests[i]) != NULL &&
			qb_now_ms() - e->states_at >= e->cfg->outbox.poll_interval_ms)
			return true;
	}
	/* no destination at all: rows still need their "no route" outcome */
	return e->cfg->ndestinations == 0;
}

/*
 * qbo_rows_claimable: rows a commit inserts now could be claimed before
 * the next poll: some destination takes rows (none at all: they need their
 * "no route" outcome).  False when every destination holds its rows (open,
 * half-open, disabled, paused): the poll's claim finds them, and a wake per
 * commit would only cost a loop.
 */
static bool
qbo_rows_claimable(QboEngine *e)
{
	if (e->cfg->ndestinations == 0)
		return true;
	for (int i = 0; i < e->cfg->ndestinations; i++)
		if (qbo_hold_reason(&e->dests[i]) == NULL)
			return true;
	return false;
}

/*
 * What one cycle works on.  The arrays are carved from one allocation,
 * sized by the slots in use and the configuration's destinations; the
 * pointer-aligned ones first, so each part starts aligned.
 */
typedef struct QboCycle
{
	void	   *block;			/* the one allocation behind the arrays */
	QbSettle   *settles;		/* the done slots' settles ... */
	int		   *which;			/* ... and their slot numbers */
	int			ns;
	QbDestTally *tallies;		/* the breaker's, those that may change it */
	int			nkept;
	bool		claim;
	QbClaimReq	req;			/* when claim: its dests, limits, floors below */
	const char **dests;
	int		   *limits;
	int64_t    *floors;
	char		token[QB_UUID_LEN + 1];
	QbCycleOut	out;
} QboCycle;

/* qbo_cycle_alloc: c's arrays in one block; false when out of memory. */
static bool
qbo_cycle_alloc(QboEngine *e, QboCycle *c)
{
	size_t		nset = (size_t) e->nactive + 1;
	size_t		ndest = (size_t) e->cfg->ndestinations + 1;
	char	   *p = malloc(nset * sizeof(QbSettle) + ndest * sizeof(QbDestTally) +
						   ndest * sizeof(char *) + ndest * sizeof(int64_t) +
						   ndest * sizeof(int) + nset * sizeof(int));

	if ((c->block = p) == NULL)
		return false;
	c->settles = (QbSettle *) p;
	p += nset * sizeof(QbSettle);
	c->tallies = (QbDestTally *) p;
	p += ndest * sizeof(QbDestTally);
	c->dests = (const char **) p;
	p += ndest * sizeof(char *);
	c->floors = (int64_t *) p;
	p += ndest * sizeof(int64_t);
	c->limits = (int *) p;
	p += ndest * sizeof(int);
	c->which = (int *) p;
	return true;
}

/*
 * qbo_gather_done: the done slots' settles and their attempts' tallies;
 * only the tallies that may change something lock a breaker row, in name
 * order.
 */
static void
qbo_gather_done(QboEngine *e, QboCycle *c)
{
	int			nt = 0;

	for (int i = 0; i < e->nslots; i++)
		if (e->slots[i].st == QBO_DONE)
		{
			c->which[c->ns] = i;
			c->settles[c->ns] = e->slots[i].settle;
			/*
			 * what lies in the slot itself is pointed at only now: a slot
			 * done at its dispatch (a fan-out row, no route, not due) saw
			 * the slots grow by realloc after it (qbo_slot_new)
			 */
			c->settles[c->ns++].token = e->slots[i].token;
			qbo_tally(e, &e->slots[i], c->tallies, &nt);
		}
	for (int i = 0; i < nt; i++)
		if (qbo_tally_needed(e, &c->tallies[i]))
			c->tallies[c->nkept++] = c->tallies[i];
	qsort(c->tallies, c->nkept, sizeof(QbDestTally), qbo_tally_cmp);
}

/* qbo_lower_floors_to: every floor at most `to`. */
static void
qbo_lower_floors_to(QboEngine *e, int64_t to)
{
	if (to < e->floor)
		e->floor = to;
	for (int i = 0; i < e->cfg->ndestinations; i++)
		if (to < e->dests[i].floor)
			e->dests[i].floor = to;
}

/*
 * qbo_lower_floors: new rows are claimed in id order above a floor, one per
 * destination (rows routed at insert) and one for rows not routed yet, so a
 * claim does not walk the index entries of rows already delivered (a held
 * snapshot keeps them).  The host's late floor (what commits since the last
 * call reported: their new rows are above it), or 0 every QBO_FULL_SCAN_MS
 * and whenever the host cannot report, lowers every floor.  A report is
 * logged at debug level, once a cycle at most (TAP 024 reads it: a wrong
 * report is otherwise seen only as a longer wait).
 */
static void
qbo_lower_floors(QboEngine *e)
{
	int64_t		late = e->host->late_floor ? e->host->late_floor(e->host->ctx) : -1;
	long		now = qb_now_ms();

	if (late >= 0)
	{
		qb_log(e->host, QB_LOG_DEBUG, "commits reported new rows above id %lld", (long long) late);
		qbo_lower_floors_to(e, late);
	}
	if (now >= e->next_full_scan)
	{
		e->next_full_scan = now + QBO_FULL_SCAN_MS;
		qbo_lower_floors_to(e, 0);
	}
}

/*
 * qbo_size_claim: the claim request.  Each destination with room is asked
 * for its room above its floor.  Rows not routed yet (the daemon's new
 * rows, or the extension's before its routes are published) are routed
 * here, so their claim cannot ask each destination: it is the room of those
 * that got such rows lately (a decaying share), plus at most a tenth of a
 * batch for the others, so an idle destination's room does not claim rows
 * a busy one must write back, and one with no share yet still gets some.
 */
static void
qbo_size_claim(QboEngine *e, QboCycle *c)
{
	const QbOutboxConf *oc = &e->cfg->outbox;
	QbClaimReq *req = &c->req;
	int			shared = 0;		/* room of the destinations unrouted rows go to */
	int			other = 0;
	int			tenth = oc->batch_size / 10 + 1;
	bool		history = false;
	long		now = qb_now_ms();

	qbo_lower_floors(e);
	if (!qb_uuid_v4(c->token))
	{
		qb_log(e->host, QB_LOG_WARNING, "no random bytes for a claim token");
		c->claim = false;
	}
	req->lease_ms = oc->claim_timeout_ms;
	req->default_max_attempts = oc->max_attempts;
	req->token = c->token;
	req->floor = e->floor;
	req->probe_ms = oc->claim_timeout_ms;
	req->read_states = qbo_states_due(e, now);
	/* an idle engine claims only because the cycle settles keyed rows */
	req->promoted_only = e->claim_idle;
	req->dests = c->dests;
	req->limits = c->limits;
	req->floors = c->floors;
	for (int i = 0; i < e->cfg->ndestinations; i++)
	{
		history |= e->dests[i].unrouted_share >= QBO_SHARE_MIN;
		qbo_limit_allow(e, i, qbo_room(e, i), now);
	}
	/* across replicas: what the server's limits gave, asked of the database */
	qbo_limits_take_shared(e, QBO_TAKE_CLAIM, now);
	for (int i = 0; i < e->cfg->ndestinations; i++)
		if ((c->limits[req->ndests] = e->dests[i].allowed) > 0)
		{
			if (!history || e->dests[i].unrouted_share >= QBO_SHARE_MIN)
				shared += c->limits[req->ndests];
			else
				other += c->limits[req->ndests];
			c->floors[req->ndests] = e->dests[i].floor;
			c->dests[req->ndests++] = e->cfg->destinations[i].name;
		}
	req->batch_size = shared + (other < tenth ? other : tenth);
	if (req->batch_size > oc->batch_size || e->cfg->ndestinations == 0)
		req->batch_size = oc->batch_size;
}

/*
 * qbo_settled: the settles were written; count them and free their slots.
 * Fewer rows changed than were settled when leases had run out.
 */
static void
qbo_settled(QboEngine *e, QboCycle *c)
{
	double		now = qb_wall_ns() / 1e9;

	if (c->ns == 0)
		return;
	for (int i = 0; i < c->ns; i++)
	{
		qbo_count(e, &e->slots[c->which[i]], now);
		qbo_span_end(e, &e->slots[c->which[i]]);
		qbo_slot_free(e, &e->slots[c->which[i]]);
	}
	if (c->out.nsettled != c->ns)
		qb_log(e->host, QB_LOG_INFO,
			   "settled %d of %d rows; the others' leases had expired and were taken over",
			   c->out.nsettled, c->ns);
}

/*
 * qbo_apply_states takes the destination states a claim read, when it
 * asked for them (a store may read them anyway: the SQL Server procedure
 * does; the view then stays as the last asked-for read left it).
 */
static void
qbo_apply_states(QboEngine *e, const QboCycle *c)
{
	const QbCycleOut *out = &c->out;

	if (!c->req.read_states || c->req.promoted_only)
		return;
	e->states_at = qb_now_ms();
	/* a destination the claim did not list simply takes rows */
	for (int i = 0; i < e->cfg->ndestinations; i++)
	{
		e->dests[i].state = QB_CIRCUIT_CLOSED;
		e->dests[i].failures = 0;
		e->dests[i].paused = false;
		e->dests[i].probe = false;
	}
	for (int j = 0; j < out->nstates; j++)
	{
		int			i = qbo_dest_index(e, out->states[j].destination);

		if (i < 0)
			continue;
		e->dests[i].state = out->states[j].state;
		e->dests[i].failures = out->states[j].failures;
		e->dests[i].paused = out->states[j].paused;
		e->dests[i].probe = out->states[j].probe;
	}
}

/*
 * qbo_claim_drained: the claim read every place it asked to its end (rows
 * other claims hold aside): it returned fewer rows than the least it asked
 * of any place.  On a host woken at commit, a row that commits later wakes
 * a worker (one that runs its loop first), so the next claim can wait for
 * that wake or the poll: claiming again after each settle found nothing
 * but cost a transaction per row at single-row commits.  A host with no
 * wake at commit (the daemon) claims until a claim finds nothing.
 */
static bool
qbo_claim_drained(const QboEngine *e, const QboCycle *c)
{
	int			least = c->req.batch_size;

	if (e->host->rows_wake == NULL)
		return false;
	for (int i = 0; i < c->req.ndests; i++)
		if (c->req.limits[i] < least)
			least = c->req.limits[i];
	return c->out.nrows < least;
}

/*
 * qbo_dispatch_claimed: the claim's rows to their slots, raising the
 * intake floors past the intake rows read; returns the rows claimed.
 */
static int
qbo_dispatch_claimed(QboEngine *e, QboCycle *c)
{
	QbCycleOut *out = &c->out;
	int			claimed = 0;

	e->stats->batches++;
	e->last_claim = qb_now_ms();
	qbo_apply_states(e, c);
	for (int i = 0; i < out->nrows; i++)
	{
		if (out->rows[i].in_intake)
		{
			const char *dn = out->rows[i].destination;
			int			j = dn ? qbo_dest_index(e, dn) : -1;
			int64_t    *f = dn == NULL ? &e->floor : j >= 0 ? &e->dests[j].floor : NULL;

			if (f != NULL && out->rows[i].id > *f)
				*f = out->rows[i].id;
		}
		claimed++;
		qbo_dispatch(e, &out->rows[i], c->token);
	}
	qbo_update_shares(e);
	e->claim_idle = claimed == 0 || qbo_claim_drained(e, c);
	if (e->host->polled)
		e->host->polled(e->host->ctx, claimed > 0);
	return claimed;
}

/*
 * qbo_settles_claimable: a settle with no claim in its cycle leaves rows
 * claimable now that only a claim statement takes: rows written back
 * ('route', 'release') and the next rows of the keys whose rows ended (the
 * promotion releases them, unclaimed).  The engine then claims at its next
 * cycle with room, not at a wake or the poll, even after a claim that
 * drained every place.
 */
static bool
qbo_settles_claimable(const QboEngine *e, const QboCycle *c)
{
	for (int i = 0; i < c->ns; i++)
	{
		QbSettleKind k = c->settles[i].kind;

		if (k == QB_SETTLE_ROUTE || k == QB_SETTLE_RELEASE)
			return true;
		if (k != QB_SETTLE_RETRY && k != QB_SETTLE_HOLD &&
			e->slots[c->which[i]].row.key != NULL)
			return true;
	}
	return false;
}

/*
 * qbo_cycle settles the done slots and, when claim is set, claims again,
 * in one store transaction.  Returns the rows claimed (parked ones count:
 * the claim made progress), 0 for an empty claim or none, -1 when the
 * store failed (the done slots stay done and are tried again).
 */
static int
qbo_cycle(QboEngine *e, bool claim)
{
	QboCycle	c = {.claim = claim};
	char		err[QB_ERRLEN];
	long		t0 = qb_now_ms();
	int			rc = -1;

	if (!qbo_cycle_alloc(e, &c))
	{
		qb_log(e->host, QB_LOG_WARNING, "out of memory for a settle");
		goto done;
	}
	qbo_gather_done(e, &c);
	if (c.claim)
		qbo_size_claim(e, &c);
	if (c.ns == 0 && !c.claim)
	{
		rc = 0;
		goto done;
	}
	if (e->store->outbox_cycle(e->store->ctx, c.tallies, c.nkept, c.settles, c.ns,
							   c.claim ? &c.req : NULL, &c.out, err, sizeof(err)) != 0)
	{
		qb_log(e->host, QB_LOG_WARNING, "%s failed: %s%s", c.claim ? "claim" : "settle", err,
			   c.ns > 0 ? "; the finished rows are settled at the next try, or return to pending when their lease expires" : "");
		e->next_cycle_try = qb_now_ms() + QBO_CYCLE_RETRY_MS;
		goto done;
	}
	if (!c.claim && qbo_settles_claimable(e, &c))
		e->claim_idle = false;
	qbo_settled(e, &c);
	/* a cycle's time: claim_ms when it claimed (with its settles), else settle_ms */
	if (c.claim)
		e->stats->claim_ms += qb_now_ms() - t0;
	else
		e->stats->settle_ms += qb_now_ms() - t0;
	qbo_apply_tallies(e, c.tallies, c.nkept);
	qbo_apply_changes(e, &c.out);
	rc = c.claim ? qbo_dispatch_claimed(e, &c) : 0;

done:
	qbo_limits_after_claim(e, c.claim && rc >= 0);
	qbo_limits_give_unused(e);	/* what the claim reserved and no row uses */
	if (c.claim)
		qbo_limits_give_now(e);	/* ... there too, at once */
	qb_cycle_out_free(&c.out);
	free(c.block);
	return rc;
}

/* ---------------------------------------------------------------------
 * Reload, stop (housekeeping: qb_outbox_housekeeping.c)
 * ---------------------------------------------------------------------
 */

/* qbo_reload swaps the engine's config for the stored one (qb_reload_config). */
static void
qbo_reload(QboEngine *e)
{
	QboDest    *d;

	e->reload_pending = false;
	qbo_limits_give_unused(e);	/* none is queued: every reservation */
	qbo_limits_take_shared(e, QBO_TAKE_SYNC, qb_now_ms());	/* and the database's */
	if (!qb_reload_config(e->host, e->store, &e->cfg, &e->warned_no_config, "outbox rows"))
		return;
	d = calloc(e->cfg->ndestinations + 1, sizeof(QboDest));
	if (d == NULL)
	{
		qb_log(e->host, QB_LOG_WARNING, "out of memory for the destinations; claiming nothing");
		qb_config_free(e->cfg);
		e->cfg = NULL;
		return;
	}
	free(e->dests);
	e->dests = d;
	/* what the database counts as ours is not known: the first take says */
	for (int i = 0; i < e->cfg->ndestinations; i++)
	{
		d[i].db_held = -1;
		d[i].db_out = -1;
	}
	e->claim_idle = false;
	e->floor = 0;
	/* a new retention period takes effect now, not at the old schedule */
	e->next_retention = 0;
	e->next_unpark = 0;
	qb_store_takeover(e->host, e->store, e->cfg->outbox.takeover);
	qb_log(e->host, QB_LOG_INFO, "configuration loaded: %d destination%s, %d route%s",
		   e->cfg->ndestinations, e->cfg->ndestinations == 1 ? "" : "s",
		   e->cfg->nroutes, e->cfg->nroutes == 1 ? "" : "s");
	/* nothing is in flight: drop what no destination uses */
	qb_pubset_prune(e->pub, e->cfg);
	if (e->worker_index == 0)
	{
		/* rows routed to a destination that is gone are routed again */
		const char **names = malloc(sizeof(char *) * (e->cfg->ndestinations + 1));
		char		err[QB_ERRLEN];
		int			n = 0;

		for (int i = 0; names != NULL && i < e->cfg->ndestinations; i++)
			names[i] = e->cfg->destinations[i].name;
		if (names == NULL ||
			e->store->outbox_unroute(e->store->ctx, names, e->cfg->ndestinations, &n,
									 err, sizeof(err)) != 0)
			qb_log(e->host, QB_LOG_WARNING, "routing the rows of removed destinations again failed: %s",
				   names ? err : "out of memory");
		else if (n > 0)
			qb_log(e->host, QB_LOG_INFO, "%d rows of removed destinations are routed again", n);
		free(names);
	}
}

/*
 * qbo_stop: the host asks to stop.  Rows not yet answered are released
 * (back to pending, no attempt spent) so another worker delivers them at
 * once; the done ones are settled.
 */
static void
qbo_stop(QboEngine *e)
{
	qb_pubset_abort_all(e->pub);
	for (int i = 0; i < e->nslots; i++)
	{
		QboSlot    *s = &e->slots[i];

		if (s->st == QBO_QUEUED || s->st == QBO_SENDING)
		{
			qbo_done(e, s, QB_SETTLE_RELEASE, s->row.attempt, 0,
					 "released: the worker stopped before the destination answered");
			e->stats->released++;
		}
	}
	for (int tries = 0; tries < 3 && e->nactive > 0; tries++)
		if (qbo_cycle(e, false) < 0)
			e->host->wait(e->host->ctx, -1, 200 * (tries + 1));
	if (e->nactive > 0)
		qb_log(e->host, QB_LOG_WARNING,
			   "could not settle %d rows at stop; they return to pending when their lease expires",
			   e->nactive);
}

/* qbo_count_state: slots in state st. */
static int
qbo_count_state(const QboEngine *e, QboSlotState st, long *oldest_done)
{
	int			n = 0;

	for (int i = 0; i < e->nslots; i++)
		if (e->slots[i].st == st)
		{
			if (oldest_done && (n == 0 || e->slots[i].done_at < *oldest_done))
				*oldest_done = e->slots[i].done_at;
			n++;
		}
	return n;
}

/*
 * qbo_settle_in: in how many ms the done rows are to be settled (0: now):
 * at once when none is busy, half a batch is done or a reload waits for
 * them, else when the oldest has waited QBO_SETTLE_DELAY_MS for company;
 * -1 when no row is done.
 */
static long
qbo_settle_in(QboEngine *e, long now)
{
	long		oldest_done = 0;
	int			ndone = qbo_count_state(e, QBO_DONE, &oldest_done);
	long		left = QBO_SETTLE_DELAY_MS - (now - oldest_done);

	if (ndone == 0)
		return -1;
	if (ndone == e->nactive || ndone >= e->cfg->outbox.batch_size / 2 || e->reload_pending)
		return 0;
	return left > 0 ? left : 0;
}

/* qbo_done_keyed: a done row has a key (its settle may promote the next) */
static bool
qbo_done_keyed(const QboEngine *e)
{
	for (int i = 0; i < e->nslots; i++)
		if (e->slots[i].st == QBO_DONE && e->slots[i].row.key != NULL)
			return true;
	return false;
}

/*
 * qbo_cycle_due: a cycle, when one is due and a failed one's retry is not
 * ahead: to claim, or to settle the done rows (qbo_settle_in).  What
 * qbo_cycle answered (> 0: rows moved), or 0.
 */
static int
qbo_cycle_due(QboEngine *e, long now)
{
	bool		settle = qbo_settle_in(e, now) == 0;
	bool		claim;
	int			cycled;
	long		limit_in;

	/* a limited destination's rows wait in the table: claim when it gives */
	if (qbo_limits_due(e, now, &limit_in))
		e->claim_idle = false;
	claim = qbo_want_claim(e, settle && qbo_done_keyed(e));

	/* places and tokens the database counts and we do not use: given back */
	if (qbo_limits_sync_in(e, now) == 0 && (!claim || now < e->next_cycle_try))
		qbo_limits_take_shared(e, QBO_TAKE_SYNC, now);
	if (!(claim || settle) || now < e->next_cycle_try)
		return 0;
	qb_host_doing(e->host, QB_W_CLAIMING);
	cycled = qbo_cycle(e, claim);
	if (cycled >= 0)
		qb_host_cycle(e->host);
	return cycled;
}

/*
 * qbo_wait_ms: how long the engine may wait: a settle that is due, the
 * answers in flight (at most a second), the poll (*poll set); never past a
 * failed cycle's retry.
 */
static long
qbo_wait_ms(QboEngine *e, long now, bool *poll)
{
	/* an answer read since the loop's cycle may have made a settle due */
	long		settle = qbo_settle_in(e, qb_now_ms());
	long		timeout;
	long		limit_in;

	if (settle >= 0)
		timeout = settle;
	else if (qb_pubset_in_flight(e->pub) > 0)
	{
		timeout = qb_pubset_timeout_ms(e->pub);
		if (timeout < 0 || timeout > 1000)
			timeout = 1000;
	}
	else
		timeout = e->claim_idle ? e->cfg->outbox.poll_interval_ms : QBO_CYCLE_RETRY_MS;
	/* a limited destination's backlog: when its limit gives again */
	qbo_limits_due(e, qb_now_ms(), &limit_in);
	if (limit_in > 0 && limit_in < timeout)
		timeout = limit_in;
	if ((limit_in = qbo_limits_sync_in(e, qb_now_ms())) >= 0 && limit_in < timeout)
		timeout = limit_in;
	*poll = settle < 0 && qb_pubset_in_flight(e->pub) == 0 && e->claim_idle;
	if (e->next_cycle_try > now && (settle >= 0 || e->next_cycle_try - now < timeout))
		timeout = e->next_cycle_try - now;	/* a failed cycle: not before its retry */
	return timeout;
}

/*
 * qbo_wait: for an answer, a wake, a settle that is due, or the poll
 * (qbo_wait_ms); a wake or the poll makes the engine claim again.
 */
static void
qbo_wait(QboEngine *e, long now)
{
	const QbHost *host = e->host;
	bool		poll;
	long		timeout = qbo_wait_ms(e, now, &poll);
	long		w0;
	int			woke;

	qb_host_doing(host, e->next_cycle_try > now ? QB_W_BACKING_OFF :
				  e->nactive > 0 ? QB_W_DELIVERING : QB_W_IDLE);
	w0 = qb_now_ms();
	if (host->rows_wake)
		host->rows_wake(host->ctx, qbo_rows_claimable(e));
	qb_otlp_log_errors(host);
	woke = host->wait(host->ctx, qb_pubset_in_flight(e->pub) > 0 ? qb_pubset_fd(e->pub) : -1,
					  timeout);
	/* waiting for answers (or for work, when none is in flight) */
	e->stats->publish_ms += qb_now_ms() - w0;
	if (woke & QB_WAIT_WOKEN)
		e->claim_idle = false;
	else if (woke == QB_WAIT_TIMEOUT && poll)
	{
		/* the poll: due retries, and rows the floor could not know of */
		e->claim_idle = false;
		if (e->host->late_floor == NULL)
			e->next_full_scan = 0;
	}
}

/* qbo_end: the rows in hand settled or released (qbo_stop), then the engine freed. */
static void
qbo_end(QboEngine *e)
{
	if (e->cfg != NULL)
		qbo_stop(e);
	for (int i = 0; i < e->nslots; i++)
		if (e->slots[i].st != QBO_FREE)
			qbo_slot_free(e, &e->slots[i]);
	qbo_limits_give_unused(e);
	qbo_limits_take_shared(e, QBO_TAKE_SYNC, qb_now_ms());	/* our places in the database back */
	free(e->slots);
	free(e->dests);
	free(e->sweep_after);
	qb_pubset_free(e->pub);
	qb_config_free(e->cfg);
	qbo_limits_end(e);
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
	if (!qbo_limits_start(&e))
	{
		snprintf(err, errlen, "out of memory for the destinations' limits");
		qb_pubset_free(e.pub);
		return -1;
	}

	while (!host->should_stop(host->ctx))
	{
		long		now = qb_now_ms();

		if (host->config_changed(host->ctx))
			e.reload_pending = true;
		if ((e.reload_pending || e.cfg == NULL) && e.nactive == 0)
			qbo_reload(&e);
		if (e.cfg == NULL)
		{
			/* with no usable config, look again after every wait */
			qb_host_doing(host, QB_W_IDLE);
			if (host->rows_wake)
				host->rows_wake(host->ctx, false);
			host->wait(host->ctx, -1, 5000);
			continue;
		}
		qbo_housekeeping(&e, now);
		qbo_start_queued(&e);
		/* the requests just started go out now, not after the next claim */
		qb_pubset_perform(e.pub, qbo_publish_done, &e);
		if (qbo_cycle_due(&e, now) > 0)
		{
			qb_pubset_perform(e.pub, qbo_publish_done, &e);
			continue;			/* drain: claim again before sleeping */
		}
		qb_pubset_perform(e.pub, qbo_publish_done, &e);
		qbo_wait(&e, now);
		qb_pubset_perform(e.pub, qbo_publish_done, &e);
	}
	qbo_end(&e);
	return 0;
}
