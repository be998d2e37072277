/*-------------------------------------------------------------------------
 * qb_consume.c
 *	  The consumer engine: broker messages into the inbox, acknowledged only
 *	  after they commit.
 *
 * Wording (see also qb_consume.h):
 *	- The slot is this worker's number; it serves the slot-th broker source
 *	  of the configuration, in document order (http sources not counted).
 *	- A round is fetch -> make rows -> store (one transaction) -> ack.
 *	- Making a row (spec, "The path of an inbox message"): extract the
 *	  idempotency key (path, header, else the broker's message id, else its
 *	  position), the event type and the aggregate id; apply the source's
 *	  transform; store pending, or dead with the reason when the body is not
 *	  JSON, the transform rejected it, or the key is unusable (then
 *	  acknowledged like the rest).  An unusable value (qbc_unusable: none,
 *	  over 1024 bytes, not UTF-8, a control character) is dropped for the
 *	  event type and aggregate id; for the key the row is dead under a
 *	  made-up key, "no-key:<position>" (or "no-key:<uuid>" without a
 *	  position), that says so.
 *
 * Transaction rules: the rows of a round are stored in one store call; the
 * round is acknowledged only after it returns 0.  When it fails the round
 * is released (the broker keeps the messages) and the engine backs off: a
 * database that is down stops the acks, never drops a message.  A crash
 * between commit and ack redelivers the round, whose rows are duplicates
 * of (source, idempotency key).
 *-------------------------------------------------------------------------
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <jansson.h>
#include <openssl/evp.h>

#include "qb_consume.h"
#include "qb_extract.h"
#include "qb_otlp.h"
#include "qb_transform.h"
#include "qb_utf8.h"

#define QBC_IDLE_WAIT_MS	1000
#define QBC_POLL_WAIT_MS	100
#define QBC_REOPEN_MIN_MS	1000
#define QBC_REOPEN_MAX_MS	30000

/* One delivery made into a row; the strings are owned here. */
typedef struct QbcRow
{
	char	   *key;
	char	   *event_type;
	char	   *aggregate_id;
	char	   *payload;
	char	   *dead_error;
} QbcRow;

static void
qbc_row_clear(QbcRow *r)
{
	free(r->key);
	free(r->event_type);
	free(r->aggregate_id);
	free(r->payload);
	free(r->dead_error);
	memset(r, 0, sizeof(*r));
}

typedef struct QbcEngine
{
	const QbHost *host;
	const QbStore *store;
	int			slot;
	QbConfig   *cfg;
	const QbSource *src;		/* in cfg, or NULL: no broker source for this slot */
	const QbConsumerOps *ops;
	void	   *c;				/* the open consumer, or NULL */
	long		reopen_at;
	long		reopen_wait;
	bool		warned_no_config;
	bool		warned_idle;
	QbConsumeStats *stats;
} QbcEngine;

/* qbc_pick: the slot-th broker source of cfg, or NULL. */
static const QbSource *
qbc_pick(const QbConfig *cfg, int slot)
{
	int			k = 0;

	for (int i = 0; cfg != NULL && i < cfg->nsources; i++)
		if (cfg->sources[i].type != QB_SOURCE_HTTP && k++ == slot)
			return &cfg->sources[i];
	return NULL;
}

static void
qbc_close(QbcEngine *e)
{
	if (e->c != NULL)
		e->ops->close(e->c);
	e->c = NULL;
}

/*
 * qbc_reload: a new configuration closes the consumer; the next round opens
 * one for whatever source this slot now has.
 */
static void
qbc_reload(QbcEngine *e)
{
	if (!qb_reload_config(e->host, e->store, &e->cfg, &e->warned_no_config, "broker messages"))
		return;
	qbc_close(e);
	e->reopen_at = 0;
	e->reopen_wait = QBC_REOPEN_MIN_MS;
	e->src = qbc_pick(e->cfg, e->slot);
	e->ops = e->src ? qb_consumer_ops(e->src->type) : NULL;
	e->warned_idle = false;
	if (e->src != NULL && e->ops == NULL)
		qb_log(e->host, QB_LOG_WARNING,
			   "source \"%s\" is of type %s, which this build of QueueBox cannot consume yet; its messages stay in the broker",
			   e->src->name, e->src->type == QB_SOURCE_RABBITMQ ? "rabbitmq" :
			   e->src->type == QB_SOURCE_KAFKA ? "kafka" : "nats");
	else if (e->src != NULL)
		qb_log(e->host, QB_LOG_INFO, "consuming source \"%s\"", e->src->name);
}

/*
 * qbc_payload_of: the stored payload of a body that is not JSON: a JSON
 * string of the body when it is UTF-8, else {"base64": ...}, so the dead
 * row keeps the message for an operator.
 */
static char *
qbc_payload_of(const QbDelivery *d)
{
	json_t	   *v;
	char	   *out;

	if (qb_utf8_invalid_at(d->body, d->len) < 0)
		v = json_stringn(d->body, d->len);
	else
	{
		char	   *b64 = malloc(4 * ((d->len + 2) / 3) + 1);

		if (b64 == NULL)
			return NULL;
		EVP_EncodeBlock((unsigned char *) b64, (const unsigned char *) d->body, (int) d->len);
		v = json_pack("{s:s}", "base64", b64);
		free(b64);
	}
	out = v ? json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
	json_decref(v);
	return out;
}

/* qbc_header: a header by name (any letter case) from the parsed headers, malloc'd. */
static char *
qbc_header(json_t *headers, const char *name)
{
	const char *k;
	json_t	   *v;

	json_object_foreach(headers, k, v)
	{
		if (strcasecmp(k, name) == 0 && json_is_string(v))
			return strdup(json_string_value(v));
	}
	return NULL;
}

/*
 * qbc_span: a stored message's receipt span (qb_otlp.h), a child of the
 * traceparent header it came with (and its tracestate).  Its start is the
 * fetch's.
 */
static void
qbc_span(QbcEngine *e, const QbSource *s, const QbDelivery *d, const char *key, int64_t id,
		 QbReceiveResult res, int64_t t0)
{
	json_t	   *headers;
	char	   *tp = NULL;
	char	   *ts = NULL;
	QbSpan		span;
	char		name[160];
	bool		ok;

	if (!qb_otlp_on(qb_host_otlp(e->host)))
		return;
	if ((headers = d->headers ? json_loads(d->headers, 0, NULL) : NULL) != NULL)
	{
		tp = qbc_header(headers, "traceparent");
		ts = qbc_header(headers, "tracestate");
	}
	json_decref(headers);
	snprintf(name, sizeof(name), "receive %s", s->name);
	ok = qb_span_start_tp(&span, name, QB_SPAN_CONSUMER, tp, ts);
	free(tp);
	if (!ok)
	{
		free(ts);
		return;
	}
	span.start_ns = t0;
	qb_span_str(&span, "queuebox.source", s->name);
	qb_span_str(&span, "queuebox.result", qb_receive_result_name(res));
	if (key != NULL)
		qb_span_str(&span, "messaging.message.id", key);
	if (id > 0)
		qb_span_int(&span, "queuebox.inbox.id", id);
	qb_otlp_emit(qb_host_otlp(e->host), &span);
	free(ts);
	qb_otlp_log_errors(e->host);
}

/*
 * qbc_unusable: why a key, type or aggregate id cannot be stored, or NULL
 * when it can (qb_value_fault: the ingress refuses the same with 400 or 422).
 */
static const char *
qbc_unusable(const char *v)
{
	long		at;

	if (v == NULL || v[0] == '\0')
		return "is missing (none at idempotencyKeyPath or idempotencyKeyHeader, and no broker message id)";
	switch (qb_value_fault(v, &at))
	{
		case QB_VALUE_TOO_LONG:
			return "is longer than 1024 bytes";
		case QB_VALUE_NOT_UTF8:
			return "is not valid UTF-8";
		case QB_VALUE_CONTROL:
			return "has a control character";
		case QB_VALUE_OK:
			break;
	}
	return NULL;
}

/*
 * qbc_extract: step 1's values into r: the key (path, header, the broker's
 * message id, its position), the event type and the aggregate id; an
 * unusable event type or aggregate id is left out (the key is checked by
 * qbc_key_or_made_up).  doc: the body parsed, NULL when it is not JSON.
 */
static void
qbc_extract(const QbSource *s, const QbDelivery *d, json_t *doc, QbcRow *r)
{
	/* parsed once, and only when the key or the event type comes from one */
	json_t	   *headers = d->headers && (s->idempotency_key_header || s->event_type_header) ?
		json_loads(d->headers, 0, NULL) : NULL;

	if (doc != NULL && s->idempotency_key_path != NULL)
		r->key = qb_jsonpath_text(doc, s->idempotency_key_path);
	else if (s->idempotency_key_header != NULL)
		r->key = qbc_header(headers, s->idempotency_key_header);
	else if (d->message_id != NULL && d->message_id[0] != '\0')
		r->key = strdup(d->message_id);
	else if (d->position != NULL)
		r->key = strdup(d->position);
	if (doc != NULL && s->event_type_path != NULL)
		r->event_type = qb_jsonpath_text(doc, s->event_type_path);
	else if (s->event_type_header != NULL)
		r->event_type = qbc_header(headers, s->event_type_header);
	else if (s->event_type_from_header && d->type != NULL)
		r->event_type = strdup(d->type);
	if (doc != NULL && s->aggregate_id_path != NULL)
		r->aggregate_id = qb_jsonpath_text(doc, s->aggregate_id_path);
	json_decref(headers);
	if (r->event_type != NULL && qbc_unusable(r->event_type) != NULL)
	{
		free(r->event_type);
		r->event_type = NULL;
	}
	if (r->aggregate_id != NULL && qbc_unusable(r->aggregate_id) != NULL)
	{
		free(r->aggregate_id);
		r->aggregate_id = NULL;
	}
}

/*
 * qbc_key_or_made_up: a dead row still needs a unique key: an unusable one
 * is replaced by a made-up one, and the row is dead saying so (unless it is
 * dead already).  The made-up key is "no-key:<position>" when the broker
 * gives one (kafka, nats): a redelivery, or a stream replayed from its
 * start, is then a duplicate of the row, not a second dead row.  Without a
 * position (rabbitmq) it is "no-key:<uuid>".  false when out of random
 * bytes or memory.
 */
static bool
qbc_key_or_made_up(const QbDelivery *d, QbcRow *r)
{
	char		msg[QB_ERRLEN + 128];
	char		uuid[QB_UUID_LEN + 1];
	const char *bad;
	const char *made;

	if ((bad = qbc_unusable(r->key)) == NULL)
		return true;
	free(r->key);
	r->key = NULL;
	if (d->position != NULL && qbc_unusable(d->position) == NULL)
		made = d->position;
	else if (qb_uuid_v4(uuid))
		made = uuid;
	else
		return false;
	if ((r->key = malloc(strlen(made) + 8)) == NULL)
		return false;
	snprintf(r->key, strlen(made) + 8, "no-key:%s", made);
	if (r->dead_error == NULL)
	{
		snprintf(msg, sizeof(msg),
				 "the message's idempotency key %s; it is kept dead under a made-up key: requeue it to deliver it anyway, and send later messages with a usable key (UTF-8, up to 1024 bytes, no control character)",
				 bad);
		r->dead_error = strdup(msg);
	}
	return true;
}

/*
 * qbc_transform_row: step 2, the source's transform on a row that is not
 * dead.  A rejection makes the row dead; false, with why, when the
 * transform could not run at all (not the message's fault).
 */
static bool
qbc_transform_row(QbTransformHelper *jq, const QbSource *s, const QbDelivery *d, QbcRow *r,
				  char *why, size_t whylen)
{
	QbTransformVars vars = {NULL, r->aggregate_id, d->headers, s->name, r->event_type};
	char		err[QB_ERRLEN];
	char		msg[QB_ERRLEN + 128];
	char	   *out = NULL;
	size_t		len = 0;

	switch (qb_transform_run(jq, s->transform, r->payload, strlen(r->payload), &vars, NULL,
							 &out, &len, err, sizeof(err)))
	{
		case QB_TRANSFORM_OK:
			free(r->payload);
			r->payload = out;
			break;
		case QB_TRANSFORM_REJECTED:
			snprintf(msg, sizeof(msg), "the source transform rejected the message: %s", err);
			r->dead_error = strdup(msg);
			break;
		case QB_TRANSFORM_FAILED:
			/* not the message's fault (no fork, the helper killed): later */
			snprintf(why, whylen, "the source transform could not run (%.400s)", err);
			return false;
	}
	return true;
}

/*
 * qbc_make_row: steps 1-2 of the banner.  Returns false, with why, only
 * when the message is not to blame (out of memory, a transform that could
 * not run at all): the batch then goes back to the broker.  A message that
 * cannot be stored pending becomes a dead row.
 */
static bool
qbc_make_row(QbTransformHelper *jq, const QbSource *s, const QbDelivery *d, QbcRow *r,
			 char *why, size_t whylen)
{
	char		msg[QB_ERRLEN + 128];
	json_error_t jerr;
	json_t	   *doc = json_loadb(d->body, d->len, JSON_DECODE_ANY, &jerr);

	memset(r, 0, sizeof(*r));
	/* 1. extract */
	qbc_extract(s, d, doc, r);
	if (doc == NULL)
	{
		snprintf(msg, sizeof(msg),
				 "the message body is not JSON (%s at byte %d); it is kept here as a JSON string (or base64) for an operator",
				 jerr.text, jerr.position);
		r->dead_error = strdup(msg);
		r->payload = qbc_payload_of(d);
	}
	else
	{
		json_decref(doc);
		r->payload = strndup(d->body, d->len);
	}
	if (!qbc_key_or_made_up(d, r))
		return false;

	/* 2. transform (only what is JSON: a dead row is kept as it came) */
	if (r->dead_error == NULL && s->transform != NULL && r->payload != NULL &&
		!qbc_transform_row(jq, s, d, r, why, whylen))
		return false;
	if (r->key == NULL || r->payload == NULL)
	{
		snprintf(why, whylen, "out of memory while reading a message");
		return false;
	}
	return true;
}

/*
 * qbc_give_back returns a batch to the broker and backs off: what stopped
 * it (the database, a transform that cannot run) is not over yet.
 */
static void
qbc_give_back(QbcEngine *e, QbDelivery *d, int n)
{
	e->ops->release(e->c, d, n, QBC_REOPEN_MIN_MS);
	e->host->wait(e->host->ctx, -1, QBC_REOPEN_MIN_MS);
}

/*
 * qbc_rows: a row made of each of the n deliveries, and in[i] what the
 * store is given of it (rows[i]'s strings).  false when one could not be
 * made: the round was given back to the broker rather than lose one.
 */
static bool
qbc_rows(QbcEngine *e, QbDelivery *d, int n, QbcRow *rows, QbInboxRow *in)
{
	const QbSource *s = e->src;
	char		err[QB_ERRLEN];

	for (int i = 0; i < n; i++)
	{
		if (!qbc_make_row(qb_host_jq(e->host), s, &d[i], &rows[i], err, sizeof(err)))
		{
			qb_log(e->host, QB_LOG_WARNING, "source \"%s\": %s; the batch goes back to the broker",
				   s->name, err);
			qbc_give_back(e, d, n);
			return false;
		}
		in[i].source = s->name;
		in[i].idempotency_key = rows[i].key;
		in[i].event_type = rows[i].event_type;
		in[i].aggregate_id = rows[i].aggregate_id;
		in[i].payload = rows[i].payload;
		in[i].headers = d[i].headers ? d[i].headers : "{}";
		in[i].pull = s->consumption == QB_CONSUME_PULL;
		in[i].dead_error = rows[i].dead_error;
	}
	return true;
}

/*
 * qbc_store: the round's rows in one store call, ids[i] each row's id (0:
 * a duplicate).  false when it failed: the round was given back.
 */
static bool
qbc_store(QbcEngine *e, QbDelivery *d, int n, const QbInboxRow *in, int64_t *ids)
{
	const QbSource *s = e->src;
	char		err[QB_ERRLEN];

	if (e->store->inbox_insert(e->store->ctx, in, n, e->cfg->http.store_timeout_ms, ids,
							   err, sizeof(err)) == 0)
		return true;
	e->stats->store_failures++;
	qb_log(e->host, QB_LOG_WARNING,
		   "source \"%s\": could not store %d message%s (%s); %s back to the broker and %s fetched again",
		   s->name, n, n == 1 ? "" : "s", err, n == 1 ? "it goes" : "they go", n == 1 ? "is" : "are");
	qbc_give_back(e, d, n);
	return false;
}

/* qbc_tally: each stored delivery counted (stored, duplicate, dead), in the metrics and its span. */
static void
qbc_tally(QbcEngine *e, const QbDelivery *d, int n, const QbcRow *rows, const int64_t *ids,
		  int64_t t0)
{
	e->stats->batches++;
	for (int i = 0; i < n; i++)
	{
		QbReceiveResult res = ids[i] == 0 ? QB_RX_DUPLICATE :
			rows[i].dead_error ? QB_RX_UNPROCESSABLE : QB_RX_ACCEPTED;

		if (ids[i] == 0)
			e->stats->duplicates++;
		else if (rows[i].dead_error)
			e->stats->dead++;
		else
			e->stats->stored++;
		qb_metrics_received(e->host->metrics, e->src->name, res);
		qbc_span(e, e->src, &d[i], rows[i].key, ids[i], res, t0);
	}
}

/* qbc_round: fetch, store, acknowledge.  Returns the deliveries handled. */
static int
qbc_round(QbcEngine *e)
{
	int64_t		t0;
	const QbSource *s = e->src;
	int			max = s->batch_size;
	QbDelivery *d = calloc(max, sizeof(QbDelivery));
	QbcRow	   *rows = calloc(max, sizeof(QbcRow));
	QbInboxRow *in = calloc(max, sizeof(QbInboxRow));
	int64_t    *ids = calloc(max, sizeof(int64_t));
	char		err[QB_ERRLEN];
	int			n = 0;

	if (d == NULL || rows == NULL || in == NULL || ids == NULL)
	{
		qb_log(e->host, QB_LOG_WARNING, "out of memory for a batch of %d messages", max);
		goto done;
	}
	t0 = qb_otlp_now_ns();
	n = e->ops->fetch(e->c, d, max, err, sizeof(err));
	if (n < 0)
	{
		qb_log(e->host, QB_LOG_WARNING, "source \"%s\": %s; reconnecting", s->name, err);
		qbc_close(e);
		e->reopen_at = qb_now_ms() + QBC_REOPEN_MIN_MS;
		n = 0;
		goto done;
	}
	if (n == 0 || !qbc_rows(e, d, n, rows, in) || !qbc_store(e, d, n, in, ids))
		goto done;
	qbc_tally(e, d, n, rows, ids, t0);
	if (e->ops->ack(e->c, d, n, err, sizeof(err)) != 0)
		qb_log(e->host, QB_LOG_WARNING,
			   "source \"%s\": stored %d message%s but could not acknowledge %s (%s); the broker will deliver %s again and %s counted as duplicates",
			   s->name, n, n == 1 ? "" : "s", n == 1 ? "it" : "them", err,
			   n == 1 ? "it" : "them", n == 1 ? "it will be" : "they will be");

done:
	for (int i = 0; rows != NULL && i < max; i++)
		qbc_row_clear(&rows[i]);
	qb_deliveries_clear(d, max);
	free(d);
	free(rows);
	free(in);
	free(ids);
	return n;
}

int
qb_consume_run(const QbHost *host, const QbStore *store, int slot, QbConsumeStats *stats,
			   char *err, size_t errlen)
{
	QbcEngine	e = {0};

	e.host = host;
	e.store = store;
	e.slot = slot;
	e.stats = stats;
	e.reopen_wait = QBC_REOPEN_MIN_MS;

	while (!host->should_stop(host->ctx))
	{
		long		now;

		if (host->config_changed(host->ctx))
			qbc_reload(&e);
		if (e.src == NULL || e.ops == NULL)
		{
			qb_host_doing(host, QB_W_IDLE);
			host->wait(host->ctx, -1, QBC_IDLE_WAIT_MS);
			continue;
		}
		now = qb_now_ms();
		if (e.c == NULL)
		{
			if (now < e.reopen_at)
			{
				qb_host_doing(host, QB_W_BACKING_OFF);
				host->wait(host->ctx, -1, e.reopen_at - now);
				continue;
			}
			if ((e.c = e.ops->open(e.src, err, errlen)) == NULL)
			{
				qb_log(host, QB_LOG_WARNING, "source \"%s\": could not connect (%s); retrying in %ld ms",
					   e.src->name, err, e.reopen_wait);
				e.reopen_at = now + e.reopen_wait;
				e.reopen_wait = e.reopen_wait * 2 > QBC_REOPEN_MAX_MS ? QBC_REOPEN_MAX_MS : e.reopen_wait * 2;
				continue;
			}
			e.reopen_wait = QBC_REOPEN_MIN_MS;
		}
		/* a full batch means more may be waiting: go again at once */
		qb_host_doing(host, QB_W_STORING);
		if (qbc_round(&e) < e.src->batch_size && e.c != NULL)
		{
			qb_host_cycle(host);
			qb_host_doing(host, QB_W_IDLE);
			host->wait(host->ctx, e.ops->fd(e.c), QBC_POLL_WAIT_MS);
		}
		else
			qb_host_cycle(host);
	}
	qbc_close(&e);
	qb_config_free(e.cfg);
	return 0;
}
