/*-------------------------------------------------------------------------
 * qb_ingress.c
 *	  The HTTP ingress engine: webhooks into the inbox, and the listener
 *	  that serves them: libmicrohttpd in external epoll mode, one thread,
 *	  answering after the inbox rows commit.
 *
 * Wording:
 *	- The listener is one MHD daemon, built from http.listen and the http:
 *	  limits; rebuilt when those change, removed when listen is unset.  It
 *	  serves webhooks, /healthz, /readyz and /metrics (with the store's
 *	  gauges, qb_gauges.c), and hands every other path first to the host's
 *	  route family (QbHost.routes: the admin room's, admin/qb_admin_gate.c).
 *	- A request is one HTTP exchange (QbiRequest, its public part a
 *	  QbIngressRequest), answered at once (health, 4xx) or deferred:
 *	  suspended until the loop did its database work.
 *	- A batch is the inbox rows of every request deferred during one pass
 *	  of MHD_run: one store call, one transaction, one commit for all.
 *
 * A webhook (POST inbox.basePath + source.path): no source 404, not POST
 * 405, a Content-Length over maxBodyBytes 413 before the body is read; a
 * longer body is read and dropped past the limit (413), and one that goes
 * on QBI_DROP_MAX bytes past it is cut (the connection closed, no answer);
 * then authentication over the raw body 401, JSON or UTF-8 400, the key
 * 422 or 400 (qb_value_fault), the transform 422 (a refusal stores
 * nothing); then the batch is committed and each request answered 202
 * (new), 200 (duplicate) or 503.  Each is counted and has its receipt span
 * (qb_otlp_receipt).  Peers that close mid-request are found by a sweep
 * (qbi_sweep).
 *
 * Transaction rules: no database call inside an MHD callback, all in the
 * main loop between passes; a 202 only follows its row's commit.  Memory:
 * a request owns its buffers and holds the config it was routed with.
 *-------------------------------------------------------------------------
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <jansson.h>
#include <microhttpd.h>

#include "qb_answer.h"
#include "qb_clock.h"
#include "qb_config.h"
#include "qb_extract.h"
#include "qb_gauges.h"
#include "qb_ingress.h"
#include "qb_ingress_int.h"
#include "qb_otlp.h"
#include "qb_token.h"
#include "qb_transform.h"
#include "qb_utf8.h"

#define QBI_STOP_DRAIN_MS	1000
#define QBI_SWEEP_MS		100		/* the peer-close sweep, at most this often */
#define QBI_MAX_HEADER_NAME	255		/* an AMQP table key (a shortstr) holds no more */
#define QBI_DROP_MAX		(8 * 1024 * 1024)	/* bytes past a body's limit read and dropped */

typedef struct QbiConfigRef
{
	QbConfig   *cfg;
	int			refs;
} QbiConfigRef;

typedef enum QbiKind
{
	QBI_ANSWERED,				/* status and answer are set */
	QBI_INBOX,					/* a webhook for src */
	QBI_READY,
	QBI_METRICS,
	QBI_ROUTED					/* a request of QbHost.routes: x.next says what next */
} QbiKind;

typedef struct QbiEngine QbiEngine;

/*
 * A connection, from MHD's connect notice to its close notice.  waiting:
 * it waits for the peer's bytes (before a request, or inside one whose body
 * is not complete), so a peer's close ends it; false while an answer is
 * being made or sent.
 */
typedef struct QbiConn
{
	struct MHD_Connection *conn;
	int			fd;
	bool		waiting;
	int			requests;		/* that reached the ingress (qbi_access) */
	struct QbiConn *prev;
	struct QbiConn *next;
} QbiConn;

typedef struct QbiRequest
{
	QbIngressRequest x;			/* the request and its answer */
	QbiEngine  *e;
	QbiConfigRef *ref;
	const QbSource *src;		/* QBI_INBOX: in ref->cfg */
	QbiKind		kind;
	size_t		cap;
	bool		too_big;
	size_t		dropped;		/* bytes read and dropped past max */
	bool		deferred;		/* suspended, waiting for the main loop */
	/* QBI_INBOX, once checked */
	char	   *key;
	char	   *event_type;
	char	   *aggregate_id;
	char	   *headers;
	int64_t		t0_ns;			/* its arrival, for its span */
	struct QbiRequest *next;	/* the deferred list */
} QbiRequest;

struct QbiEngine
{
	const QbHost *host;
	const QbStore *store;
	QbMetrics  *metrics;
	QbIngressStats *stats;
	QbiConfigRef *ref;			/* the current config, NULL until one loads */
	struct MHD_Daemon *mhd;
	int			epoll_fd;
	char		listen_key[160];	/* what the daemon was built from */
	QbiRequest *deferred;		/* suspended requests, newest first */
	int			ndeferred;
	QbiConn    *conns;			/* every open connection */
	long		swept_ms;		/* the last peer-close sweep, monotonic */
	const QbIngressRoutes *routes;	/* QbHost.routes, or NULL */
	void	   *route_state;	/* routes->open's */
};

/* ---- small helpers -------------------------------------------------- */

static void
qbi_unref(QbiConfigRef *ref)
{
	if (ref != NULL && --ref->refs == 0)
	{
		qb_config_free(ref->cfg);
		free(ref);
	}
}

/* qb_ingress_answer: see qb_ingress.h. */
void
qb_ingress_answer(QbIngressRequest *req, int status, const char *word, const char *reason)
{
	req->status = status;
	free(req->answer);
	req->answer = qb_answer(word, reason);
	req->content_type = "application/json";
}

/* qbi_set: decide the answer; reason NULL for none. */
static void
qbi_set(QbiRequest *r, int status, const char *word, const char *reason)
{
	qb_ingress_answer(&r->x, status, word, reason);
	r->kind = QBI_ANSWERED;
}

/* ---- headers -------------------------------------------------------- */

/* Transport headers describe this hop, not the message: never stored. */
static bool
qbi_transport_header(const char *name)
{
	static const char *const hop[] = {"Host", "Content-Length", "Transfer-Encoding",
		"Connection", "Keep-Alive", "Expect", "TE", "Upgrade", "Proxy-Connection",
	"Trailer", NULL};

	for (int i = 0; hop[i] != NULL; i++)
		if (strcasecmp(hop[i], name) == 0)
			return true;
	return false;
}

/* qbi_header_take: see qb_ingress_int.h. */
bool
qbi_header_take(QbiHeaders *h, const char *name, const char *value)
{
	long		at;
	json_t	   *old;

	if (name == NULL || h->bad[0] != '\0')
		return true;
	if (value == NULL)
		value = "";
	/*
	 * A name that is not a token, or a value with a control character,
	 * could never be sent on: refused here, so that no stored row can die
	 * of a header it received.  (A NUL never gets here: libmicrohttpd
	 * 0.9.75 cuts a header line at it.)
	 */
	if ((at = qb_token_invalid_at(name)) >= 0)
	{
		char		shown[220];

		qb_token_printable(shown, sizeof(shown), name, 48);
		snprintf(h->bad, sizeof(h->bad),
				 "the header name \"%s\" is not an HTTP token (byte %ld is 0x%02x); "
				 "header names are letters, digits and !#$%%&'*+-.^_`|~ only", shown, at,
				 (unsigned char) name[at]);
		return true;
	}
	/* every destination type must be able to carry it: AMQP keys are shortstrs */
	if (strlen(name) > QBI_MAX_HEADER_NAME)
	{
		char		shown[220];

		qb_token_printable(shown, sizeof(shown), name, 48);
		snprintf(h->bad, sizeof(h->bad),
				 "the header name \"%s...\" is %zu bytes; header names are at most %d bytes "
				 "(a RabbitMQ destination could not carry it)", shown, strlen(name),
				 QBI_MAX_HEADER_NAME);
		return true;
	}
	if (qbi_transport_header(name) || qb_header_redacted(name, h->src->auth.header))
		return true;
	if ((at = qb_field_value_invalid_at(value)) >= 0)
	{
		snprintf(h->bad, sizeof(h->bad),
				 "the %.100s header has a control character in its value (byte %ld is 0x%02x); "
				 "send header values without control characters", name, at, (unsigned char) value[at]);
		return true;
	}
	if ((at = qb_utf8_invalid_at(value, strlen(value))) >= 0)
	{
		snprintf(h->bad, sizeof(h->bad),
				 "the %.100s header is not valid UTF-8 (byte %ld of its value); send header values as UTF-8 (or ASCII)",
				 name, at);
		return true;
	}
	/* a repeated header keeps every value, comma-separated (RFC 9110 5.3) */
	if ((old = json_object_get(h->obj, name)) != NULL)
	{
		const char *prev = json_string_value(old);
		size_t		n = strlen(prev) + strlen(value) + 3;
		char	   *joined = malloc(n);

		if (joined == NULL)
			return false;
		snprintf(joined, n, "%s, %s", prev, value);
		json_object_set_new(h->obj, name, json_string(joined));
		free(joined);
	}
	else
		json_object_set_new(h->obj, name, json_string(value));
	return true;
}

static enum MHD_Result
qbi_header_cb(void *cls, enum MHD_ValueKind kind, const char *name, const char *value)
{
	return qbi_header_take(cls, name, value) ? MHD_YES : MHD_NO;
}

/* for qb_auth_verify */
static const char *
qbi_header_get(void *ctx, const char *name)
{
	return MHD_lookup_connection_value((struct MHD_Connection *) ctx, MHD_HEADER_KIND, name);
}

/* ---- the webhook checks --------------------------------------------- */

/*
 * qbi_value: a key, event type or aggregate id from a header or a JSONPath.
 * Returns false with an answer set when a required value is missing or
 * unusable; *out NULL when an optional one is absent.
 */
static bool
qbi_value(QbiRequest *r, json_t *doc, const char *path, const char *header,
		  const char *what, bool required, char **out)
{
	char		reason[QB_ERRLEN];
	const char *v = NULL;
	char	   *owned = NULL;
	long		at;

	*out = NULL;
	if (header != NULL)
	{
		v = MHD_lookup_connection_value(r->x.conn, MHD_HEADER_KIND, header);
		if (v == NULL || v[0] == '\0')
		{
			if (!required)
				return true;
			snprintf(reason, sizeof(reason),
					 "the %s header is missing or empty; this source takes its %s from it, so send it", header, what);
			qbi_set(r, 422, "error", reason);
			return false;
		}
	}
	else if (path != NULL)
	{
		json_t	   *j = qb_jsonpath_get(doc, path);

		owned = qb_jsonpath_text(doc, path);
		if (owned == NULL || owned[0] == '\0')
		{
			free(owned);
			if (!required)
				return true;
			snprintf(reason, sizeof(reason),
					 j == NULL || json_is_null(j) ?
					 "the body has no value at %s, which this source reads its %s from; send it" :
					 "the value at %s, which this source reads its %s from, must be a non-empty string or an integer",
					 path, what);
			qbi_set(r, 422, "error", reason);
			return false;
		}
		v = owned;
	}
	else
		return true;
	switch (qb_value_fault(v, &at))
	{
		case QB_VALUE_OK:
			*out = owned ? owned : strdup(v);
			return true;
		case QB_VALUE_TOO_LONG:
			snprintf(reason, sizeof(reason), "the %s is longer than %d bytes; shorten it",
					 what, QB_VALUE_MAX_BYTES);
			break;
		case QB_VALUE_NOT_UTF8:
			snprintf(reason, sizeof(reason), "the %s (byte %ld) is not valid UTF-8", what, at);
			break;
		case QB_VALUE_CONTROL:
			snprintf(reason, sizeof(reason),
					 "the %s has a control character (byte %ld is 0x%02x); send it without one",
					 what, at, (unsigned char) v[at]);
			break;
	}
	free(owned);
	qbi_set(r, at >= 0 ? 400 : 422, "error", reason);
	return false;
}

/*
 * qbi_transform: the source's transform on the checked body, after the
 * values were extracted from it (spec: extract, then transform, then the
 * duplicate check).  The output replaces the body, so it is what is stored;
 * a rejection answers 422 and stores nothing.
 */
static bool
qbi_transform(QbiRequest *r)
{
	QbTransformVars vars = {NULL, r->aggregate_id, r->headers, r->src->name, r->event_type};
	char		err[QB_ERRLEN];
	char		reason[QB_ERRLEN + 64];
	char	   *out;
	size_t		len;

	switch (qb_transform_run(qb_host_jq(r->e->host), r->src->transform, r->x.body, r->x.len,
							 &vars, NULL, &out, &len, err, sizeof(err)))
	{
		case QB_TRANSFORM_OK:
			free(r->x.body);
			r->x.body = out;
			r->x.len = len;
			r->cap = len + 1;
			return true;
		case QB_TRANSFORM_REJECTED:
			snprintf(reason, sizeof(reason), "the source transform rejected the message: %s", err);
			qbi_set(r, 422, "error", reason);
			return false;
		case QB_TRANSFORM_FAILED:
			snprintf(reason, sizeof(reason), "the source transform could not run: %s; retry later",
					 err);
			qbi_set(r, 503, "unavailable", reason);
			return false;
	}
	return true;
}

/*
 * qbi_check_webhook: step 3 of the banner.  True when the request may be
 * stored (key and headers set); false with the answer set.
 */
static bool
qbi_check_webhook(QbiRequest *r)
{
	const QbSource *s = r->src;
	char		reason[QB_ERRLEN + 128];
	char		msg[QB_ERRLEN];
	json_error_t jerr;
	json_t	   *doc;
	QbiHeaders	h = {s, NULL, ""};
	bool		ok;

	if (s->auth.type != QB_AUTH_NONE &&
		!qb_auth_verify(&s->auth, qbi_header_get, r->x.conn, (const unsigned char *) r->x.body,
						r->x.len, time(NULL), msg, sizeof(msg)))
	{
		snprintf(reason, sizeof(reason), "authentication failed: %s", msg);
		qbi_set(r, 401, "error", reason);
		return false;
	}
	if (r->x.len == 0)
	{
		qbi_set(r, 400, "error", "the body is empty; send the event as JSON");
		return false;
	}
	doc = json_loadb(r->x.body, r->x.len, JSON_DECODE_ANY, &jerr);
	if (doc == NULL)
	{
		snprintf(reason, sizeof(reason),
				 "the body is not valid JSON: %s at line %d, column %d (byte %d); send UTF-8 JSON",
				 jerr.text, jerr.line, jerr.column, jerr.position);
		qbi_set(r, 400, "error", reason);
		return false;
	}
	ok = qbi_value(r, doc, s->idempotency_key_path, s->idempotency_key_header,
				   "idempotency key", true, &r->key) &&
		qbi_value(r, doc, s->event_type_path, s->event_type_header, "event type", false,
				  &r->event_type) &&
		qbi_value(r, doc, s->aggregate_id_path, NULL, "aggregate id", false, &r->aggregate_id);
	json_decref(doc);
	if (!ok)
		return false;

	h.obj = json_pack("{}");
	MHD_get_connection_values(r->x.conn, MHD_HEADER_KIND, qbi_header_cb, &h);
	if (h.bad[0] != '\0')
	{
		json_decref(h.obj);
		qbi_set(r, 400, "error", h.bad);
		return false;
	}
	r->headers = json_dumps(h.obj, JSON_COMPACT);
	json_decref(h.obj);
	if (r->headers == NULL)
	{
		qbi_set(r, 503, "unavailable", "out of memory; retry later");
		return false;
	}
	return s->transform == NULL || qbi_transform(r);
}

/* ---- routing ---------------------------------------------------------- */

/* qb_ingress_source_at: see qb_ingress.h. */
const QbSource *
qb_ingress_source_at(const QbConfig *cfg, const char *path)
{
	size_t		blen = strlen(cfg->inbox.base_path);

	if (strncmp(path, cfg->inbox.base_path, blen) != 0)
		return NULL;
	for (int i = 0; i < cfg->nsources; i++)
		if (cfg->sources[i].type == QB_SOURCE_HTTP && strcmp(path + blen, cfg->sources[i].path) == 0)
			return &cfg->sources[i];
	return NULL;
}

/*
 * qbi_route: the first look at a request, headers only.  Decides the
 * answer when it needs no body and no database.
 */
static void
qbi_route(QbiRequest *r)
{
	const QbConfig *cfg = r->ref->cfg;
	const char *cl;
	bool		get = strcmp(r->x.method, "GET") == 0 || strcmp(r->x.method, "HEAD") == 0;

	if (strcmp(r->x.path, "/healthz") == 0 || strcmp(r->x.path, "/readyz") == 0 ||
		strcmp(r->x.path, "/metrics") == 0)
	{
		if (!get)
		{
			qbi_set(r, 405, "error", "use GET");
			return;
		}
		if (r->x.path[1] == 'h')
			qbi_set(r, 200, "ok", NULL);
		else
			r->kind = r->x.path[1] == 'r' ? QBI_READY : QBI_METRICS;
		return;
	}
	if (r->e->routes != NULL && r->e->routes->route(r->e->route_state, &r->x, cfg, r->e->metrics))
	{
		if (r->x.status == 0)
			r->kind = QBI_ROUTED;
		return;
	}
	if ((r->src = qb_ingress_source_at(cfg, r->x.path)) == NULL)
	{
		qbi_set(r, 404, "error",
				"no source answers at this path; webhooks go to inbox.basePath followed by a source's path");
		if (r->e->metrics)
			qb_metrics_add(&r->e->metrics->http_not_found, 1);
		return;
	}
	if (strcmp(r->x.method, "POST") != 0)
	{
		qbi_set(r, 405, "error", "a source takes POST only");
		r->x.allow_post = true;
		if (r->e->metrics)
			qb_metrics_add(&r->e->metrics->http_not_found, 1);
		return;
	}
	r->kind = QBI_INBOX;
	r->x.max = (size_t) r->src->max_body_bytes;
	cl = MHD_lookup_connection_value(r->x.conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
	if (cl != NULL && strtoull(cl, NULL, 10) > r->x.max)
	{
		char		reason[QB_ERRLEN];

		snprintf(reason, sizeof(reason),
				 "the body (Content-Length %s) is over this source's maxBodyBytes (%ld); nothing was read or stored",
				 cl, r->src->max_body_bytes);
		qbi_set(r, 413, "error", reason);
	}
}

/* ---- MHD callbacks ----------------------------------------------------- */

/*
 * qbi_span: the receipt's span (qb_otlp.h), a child of the traceparent the
 * request came with (and its tracestate); a server error is its status's
 * error.
 */
static void
qbi_span(QbiRequest *r, QbReceiveResult res)
{
	QbReceipt	rc = {
		.source = r->src->name,
		.kind = QB_SPAN_SERVER,
		.traceparent = qbi_header_get(r->x.conn, "traceparent"),
		.tracestate = qbi_header_get(r->x.conn, "tracestate"),
		.start_ns = r->t0_ns,
		.result = res,
		.key = r->key,
		.http_status = r->x.status,
	};

	if (!qb_otlp_on(qb_host_otlp(r->e->host)))
		return;
	qb_otlp_receipt(qb_host_otlp(r->e->host), &rc);
	qb_otlp_log_errors(r->e->host);
}

static void
qbi_count(QbiRequest *r)
{
	QbiEngine  *e = r->e;
	QbReceiveResult res;

	if (r->src == NULL)
		return;
	switch (r->x.status)
	{
		case 202:
			res = QB_RX_ACCEPTED;
			e->stats->accepted++;
			break;
		case 200:
			res = QB_RX_DUPLICATE;
			e->stats->duplicates++;
			break;
		case 401:
			res = QB_RX_UNAUTHORIZED;
			break;
		case 413:
			res = QB_RX_TOO_LARGE;
			break;
		case 422:
			res = QB_RX_UNPROCESSABLE;
			break;
		case 503:
			res = QB_RX_UNAVAILABLE;
			e->stats->unavailable++;
			break;
		case 405:
			return;
		default:
			res = QB_RX_BAD_REQUEST;
			break;
	}
	if (r->x.status >= 400 && r->x.status < 500)
		e->stats->refused++;
	qb_metrics_received(e->metrics, r->src->name, res);
	qbi_span(r, res);
}

static enum MHD_Result
qbi_respond(QbiRequest *r)
{
	struct MHD_Response *resp;
	const char *text = r->x.answer ? r->x.answer : "";
	enum MHD_Result ret;

	qbi_count(r);
	resp = MHD_create_response_from_buffer(strlen(text), (void *) text, MHD_RESPMEM_MUST_COPY);
	if (resp == NULL)
		return MHD_NO;
	MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE,
							r->x.content_type ? r->x.content_type : "application/json");
	MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
	if (r->x.allow_post)
		MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, "POST");
	if (r->x.own_header != NULL)
		MHD_add_response_header(resp, r->x.own_header, r->x.own_value);
	for (int i = 0; r->x.headers != NULL && r->x.headers[i][0] != NULL; i++)
		MHD_add_response_header(resp, r->x.headers[i][0], r->x.headers[i][1]);
	if (r->x.set_cookie)
		MHD_add_response_header(resp, MHD_HTTP_HEADER_SET_COOKIE, r->x.set_cookie);
	if (r->x.retry_after > 0)
	{
		char		secs[24];

		snprintf(secs, sizeof(secs), "%ld", r->x.retry_after);
		MHD_add_response_header(resp, MHD_HTTP_HEADER_RETRY_AFTER, secs);
	}
	ret = MHD_queue_response(r->x.conn, (unsigned int) r->x.status, resp);
	MHD_destroy_response(resp);
	return ret;
}

static void
qbi_request_free(QbiRequest *r)
{
	qbi_unref(r->ref);
	free(r->x.method);
	free(r->x.path);
	if (r->x.route_data != NULL)
		r->e->routes->done(&r->x);
	free(r->x.body);
	free(r->x.answer);
	free(r->key);
	free(r->event_type);
	free(r->aggregate_id);
	free(r->headers);
	free(r->x.set_cookie);
	free(r);
}

/* ---- connections ------------------------------------------------------- */

static void
qbi_conn_notify(void *cls, struct MHD_Connection *conn, void **socket_context,
				enum MHD_ConnectionNotificationCode code)
{
	QbiEngine  *e = cls;
	QbiConn    *c = *socket_context;

	if (code == MHD_CONNECTION_NOTIFY_STARTED)
	{
		const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);

		/* untracked (out of memory): it is closed by the idle timeout, as before */
		if (ci == NULL || (c = calloc(1, sizeof(QbiConn))) == NULL)
			return;
		c->conn = conn;
		c->fd = ci->connect_fd;
		c->waiting = true;
		c->next = e->conns;
		if (e->conns)
			e->conns->prev = c;
		e->conns = c;
		*socket_context = c;
	}
	else if (c != NULL)
	{
		if (c->requests == 0 && e->metrics)
			qb_metrics_add(&e->metrics->http_no_request, 1);
		if (c->prev)
			c->prev->next = c->next;
		else
			e->conns = c->next;
		if (c->next)
			c->next->prev = c->prev;
		free(c);
		*socket_context = NULL;
	}
}

/* qbi_conn_of: the tracked connection of conn, NULL when untracked */
static QbiConn *
qbi_conn_of(struct MHD_Connection *conn)
{
	const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);

	return ci != NULL ? ci->socket_context : NULL;
}

/*
 * qbi_sweep: shut down every waiting connection (not answering, not
 * suspended) whose peer has closed.  libmicrohttpd 0.9.75 reads a
 * connection once per readiness edge and takes a short read for "no more
 * data", so a close that comes with the request's last bytes is never read
 * and the connection would sit in CLOSE-WAIT until connectionTimeoutMs; the
 * shutdown gives MHD the edge it needs.  A peek of 0 bytes is the peer's
 * close with nothing unread before it; data still unread, or none yet,
 * leaves it alone.
 */
static void
qbi_sweep(QbiEngine *e)
{
	long		now = qb_now_ms();

	if (now - e->swept_ms < QBI_SWEEP_MS)
		return;
	e->swept_ms = now;
	for (QbiConn *c = e->conns; c != NULL; c = c->next)
	{
		char		b;

		if (c->waiting && recv(c->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) == 0)
			shutdown(c->fd, SHUT_RDWR);
	}
}

static void
qbi_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
			  enum MHD_RequestTerminationCode toe)
{
	QbiEngine  *e = cls;
	QbiRequest *r = *con_cls;
	QbiConn    *c = qbi_conn_of(conn);

	/* answered (or failed): the connection waits for the next request */
	if (c != NULL)
		c->waiting = true;
	if (r == NULL)
		return;
	/* begun, never answered: the peer closed, went idle, or broke the protocol */
	if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK && r->x.status == 0 && e->metrics)
		qb_metrics_add(&e->metrics->http_incomplete, 1);
	/* a deferred request is never completed: MHD does not time out suspended ones */
	qbi_request_free(r);
	*con_cls = NULL;
}

/* qbi_defer: suspend the request until the main loop has served it. */
static enum MHD_Result
qbi_defer(QbiRequest *r)
{
	QbiEngine  *e = r->e;

	r->deferred = true;
	r->next = e->deferred;
	e->deferred = r;
	e->ndeferred++;
	MHD_suspend_connection(r->x.conn);
	return MHD_YES;
}

/* qbi_begin: a request's first call, headers only: route it, answer it if it can be */
static enum MHD_Result
qbi_begin(QbiEngine *e, struct MHD_Connection *conn, const char *url, const char *method,
		  void **con_cls)
{
	QbiRequest *r;
	QbiConn    *c = qbi_conn_of(conn);

	if ((r = calloc(1, sizeof(QbiRequest))) == NULL)
		return MHD_NO;
	r->t0_ns = qb_otlp_now_ns();
	r->e = e;
	r->x.conn = conn;
	if (c != NULL)
		c->requests++;
	r->ref = e->ref;
	r->ref->refs++;
	r->x.method = strdup(method);
	r->x.path = strdup(url);
	*con_cls = r;
	if (r->x.method == NULL || r->x.path == NULL)
		return MHD_NO;
	r->kind = QBI_ANSWERED;
	qbi_route(r);
	if (r->x.status == 0)
		return MHD_YES;
	if (c != NULL)
		c->waiting = false;
	return qbi_respond(r);
}

/*
 * qbi_upload: n more bytes of the body; past max they are read and
 * dropped (0.9.75 cannot answer mid-upload), and QBI_DROP_MAX past it the
 * connection is cut.
 */
static enum MHD_Result
qbi_upload(QbiRequest *r, const char *upload, size_t n)
{
	if (r->too_big)
	{
		r->dropped += n;
		return r->dropped > QBI_DROP_MAX ? MHD_NO : MHD_YES;
	}
	if (r->x.len + n > r->x.max)
	{
		r->too_big = true;
		r->dropped = r->x.len + n - r->x.max;
		free(r->x.body);
		r->x.body = NULL;
		return MHD_YES;
	}
	if (r->x.len + n + 1 > r->cap)
	{
		size_t		cap = r->cap ? r->cap : 4096;
		char	   *b;

		while (cap < r->x.len + n + 1)
			cap *= 2;
		if ((b = realloc(r->x.body, cap)) == NULL)
			return MHD_NO;
		r->x.body = b;
		r->cap = cap;
	}
	memcpy(r->x.body + r->x.len, upload, n);
	r->x.len += n;
	r->x.body[r->x.len] = '\0';
	return MHD_YES;
}

/* qbi_complete: the whole request is here: answer it now, or defer it to the main loop */
static enum MHD_Result
qbi_complete(QbiRequest *r)
{
	QbiEngine  *e = r->e;

	if (r->x.status != 0)
		return qbi_respond(r);
	if (r->deferred)
		return MHD_YES;			/* not possible: resumed requests have a status */
	if (r->too_big)
	{
		char		reason[QB_ERRLEN];

		snprintf(reason, sizeof(reason),
				 "the body is over %zu bytes (maxBodyBytes); nothing was stored", r->x.max);
		qbi_set(r, 413, "error", reason);
		return qbi_respond(r);
	}
	if (r->kind == QBI_INBOX && !qbi_check_webhook(r))
		return qbi_respond(r);
	if (r->kind == QBI_ROUTED && r->x.next == QB_INGRESS_BODY_ANSWER)
	{
		e->routes->body(e->route_state, &r->x, r->ref->cfg, e->metrics);
		if (r->x.status == 0)
			qbi_set(r, 503, "unavailable", "out of memory; retry later");
		return qbi_respond(r);
	}
	return qbi_defer(r);
}

static enum MHD_Result
qbi_access(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
		   const char *version, const char *upload, size_t *upload_size, void **con_cls)
{
	QbiRequest *r = *con_cls;
	QbiConn    *c;

	if (r == NULL)
		return qbi_begin(cls, conn, url, method, con_cls);
	if (*upload_size > 0)
	{
		size_t		n = *upload_size;

		*upload_size = 0;
		return qbi_upload(r, upload, n);
	}
	/* the whole request is here, or the main loop resumed it: its answer is being made */
	if ((c = qbi_conn_of(conn)) != NULL)
		c->waiting = false;
	return qbi_complete(r);
}

/* ---- the main loop's work ---------------------------------------------- */

static void
qbi_store_batch(QbiEngine *e)
{
	QbiRequest *r;
	QbInboxRow *rows;
	QbiRequest **reqs;
	int64_t    *ids;
	int			n = 0;
	char		err[QB_ERRLEN];
	int			rc = -1;

	for (r = e->deferred; r != NULL; r = r->next)
		if (r->kind == QBI_INBOX)
			n++;
	if (n == 0)
		return;
	rows = calloc(n, sizeof(QbInboxRow));
	reqs = calloc(n, sizeof(QbiRequest *));
	ids = calloc(n, sizeof(int64_t));
	if (rows != NULL && reqs != NULL && ids != NULL)
	{
		int			i = n;

		/* the list is newest first: store in arrival order */
		for (r = e->deferred; r != NULL; r = r->next)
		{
			if (r->kind != QBI_INBOX)
				continue;
			i--;
			reqs[i] = r;
			rows[i].source = r->src->name;
			rows[i].idempotency_key = r->key;
			rows[i].event_type = r->event_type;
			rows[i].aggregate_id = r->aggregate_id;
			rows[i].payload = r->x.body;
			rows[i].headers = r->headers;
			rows[i].pull = r->src->consumption == QB_CONSUME_PULL;
		}
		rc = e->store->inbox_insert(e->store->ctx, rows, n,
									e->ref->cfg->http.store_timeout_ms, ids, err, sizeof(err));
		e->stats->batches++;
	}
	else
		snprintf(err, sizeof(err), "out of memory");
	if (rc != 0)
		qb_log(e->host, QB_LOG_WARNING, "could not store %d received message%s, answered 503: %s",
			   n, n == 1 ? "" : "s", err);
	for (int i = 0; reqs != NULL && i < n; i++)
	{
		json_t	   *o;

		r = reqs[i];
		if (rc != 0)
		{
			char		reason[QB_ERRLEN + 64];

			snprintf(reason, sizeof(reason), "the database did not store the message (%s); retry later", err);
			qbi_set(r, 503, "unavailable", reason);
			continue;
		}
		o = ids[i] > 0 ?
			json_pack("{s:s,s:I,s:s,s:s}", "status", "accepted", "id", (json_int_t) ids[i],
					  "source", r->src->name, "idempotencyKey", r->key) :
			json_pack("{s:s,s:s,s:s}", "status", "duplicate", "source", r->src->name,
					  "idempotencyKey", r->key);
		r->x.status = ids[i] > 0 ? 202 : 200;
		free(r->x.answer);
		r->x.answer = o ? json_dumps(o, JSON_COMPACT) : NULL;
		r->x.content_type = "application/json";
		json_decref(o);
	}
	free(rows);
	free(reqs);
	free(ids);
}

/* qbi_serve_one: a deferred request other than a webhook. */
static void
qbi_serve_one(QbiEngine *e, QbiRequest *r)
{
	char		err[QB_ERRLEN];
	char	   *text = NULL;
	QbGauges	g;

	switch (r->kind)
	{
		case QBI_READY:
			if (e->store->query_text(e->store->ctx, QB_Q_READY, NULL,
									 r->ref->cfg->http.store_timeout_ms, &text, err,
									 sizeof(err)) != 0)
			{
				char		reason[QB_ERRLEN + 32];

				snprintf(reason, sizeof(reason), "database unavailable: %s", err);
				qbi_set(r, 503, "unavailable", reason);
			}
			else
				qbi_set(r, 200, "ready", NULL);
			free(text);
			break;
		case QBI_METRICS:
			qb_gauges_read(e->store, e->ref->cfg, &g);
			g.limits = e->host->limits;
			r->x.answer = qb_metrics_render(e->metrics, &g);
			qb_gauges_free(&g);
			r->x.status = r->x.answer ? 200 : 503;
			r->x.content_type = "text/plain; version=0.0.4; charset=utf-8";
			break;
		case QBI_ROUTED:
			e->routes->serve(e->host, e->store, &r->x, r->ref->cfg, e->metrics);
			break;
		default:
			break;
	}
}

/* qbi_serve: the database work of one pass, then resume every request. */
static void
qbi_serve(QbiEngine *e)
{
	QbiRequest *r;
	QbiRequest *next;

	if (e->deferred == NULL)
		return;
	qbi_store_batch(e);
	for (r = e->deferred; r != NULL; r = r->next)
		if (r->kind != QBI_INBOX && r->x.status == 0)
			qbi_serve_one(e, r);
	for (r = e->deferred; r != NULL; r = next)
	{
		next = r->next;
		r->next = NULL;
		r->deferred = false;
		if (r->x.status == 0)
			qbi_set(r, 503, "unavailable", "out of memory; retry later");
		MHD_resume_connection(r->x.conn);
	}
	e->deferred = NULL;
	e->ndeferred = 0;
}

/* ---- the listener ------------------------------------------------------ */

static void
qbi_mhd_log(void *cls, const char *fmt, va_list ap)
__attribute__((format(printf, 2, 0)));

static void
qbi_mhd_log(void *cls, const char *fmt, va_list ap)
{
	QbiEngine  *e = cls;
	char		msg[512];
	size_t		n;

	vsnprintf(msg, sizeof(msg), fmt, ap);
	n = strlen(msg);
	while (n > 0 && msg[n - 1] == '\n')
		msg[--n] = '\0';
	qb_log(e->host, QB_LOG_DEBUG, "http: %s", msg);
}

static void
qbi_stop_listener(QbiEngine *e)
{
	if (e->mhd == NULL)
		return;
	qbi_serve(e);				/* nothing may stay suspended */
	MHD_run(e->mhd);
	MHD_stop_daemon(e->mhd);
	e->mhd = NULL;
	e->epoll_fd = -1;
	e->listen_key[0] = '\0';
}

static int
qbi_start_listener(QbiEngine *e, const QbHttpConf *h, char *err, size_t errlen)
{
	struct sockaddr_storage ss;
	unsigned int timeout_s = (unsigned int) ((h->connection_timeout_ms + 999) / 1000);
	bool		v6 = strchr(h->host, ':') != NULL;
	const union MHD_DaemonInfo *info;

	memset(&ss, 0, sizeof(ss));
	if (v6)
	{
		struct sockaddr_in6 *a = (struct sockaddr_in6 *) &ss;

		a->sin6_family = AF_INET6;
		a->sin6_port = htons((uint16_t) h->port);
		inet_pton(AF_INET6, h->host, &a->sin6_addr);
	}
	else
	{
		struct sockaddr_in *a = (struct sockaddr_in *) &ss;

		a->sin_family = AF_INET;
		a->sin_port = htons((uint16_t) h->port);
		inet_pton(AF_INET, h->host, &a->sin_addr);
	}
	e->mhd = MHD_start_daemon(MHD_USE_ERROR_LOG | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_EPOLL |
							  (v6 ? MHD_USE_IPv6 : 0),
							  (uint16_t) h->port, NULL, NULL, qbi_access, e,
							  MHD_OPTION_EXTERNAL_LOGGER, qbi_mhd_log, e,
							  MHD_OPTION_SOCK_ADDR, (struct sockaddr *) &ss,
							  MHD_OPTION_CONNECTION_LIMIT, (unsigned int) h->max_connections,
							  MHD_OPTION_CONNECTION_TIMEOUT, timeout_s,
							  MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t) 65536,
							  MHD_OPTION_LISTEN_BACKLOG_SIZE, (unsigned int) 512,
							  MHD_OPTION_NOTIFY_COMPLETED, qbi_completed, e,
							  MHD_OPTION_NOTIFY_CONNECTION, qbi_conn_notify, e,
							  MHD_OPTION_END);
	if (e->mhd == NULL)
	{
		snprintf(err, errlen, "could not listen on %s:%d (%s); is the port in use?",
				 h->host, h->port, strerror(errno));
		return -1;
	}
	info = MHD_get_daemon_info(e->mhd, MHD_DAEMON_INFO_EPOLL_FD);
	e->epoll_fd = info ? info->epoll_fd : -1;
	return 0;
}

/*
 * qbi_reload: swap to the stored configuration and rebuild the listener if
 * its settings changed.  An invalid stored document keeps the previous one.
 */
static void
qbi_reload(QbiEngine *e)
{
	char		err[QB_ERRLEN];
	char		key[sizeof(e->listen_key)];
	char	   *text = NULL;
	QbConfig   *cfg = NULL;
	QbiConfigRef *ref;
	const QbHttpConf *h;

	if (e->store->config_load(e->store->ctx, &text, err, sizeof(err)) != 0)
	{
		qb_log(e->host, QB_LOG_WARNING, "could not read the configuration: %s", err);
		return;
	}
	if (qb_config_parse(text, text ? strlen(text) : 0, e->host->config_env, &cfg,
						err, sizeof(err)) != 0)
	{
		qb_log(e->host, QB_LOG_WARNING, "the stored configuration is not valid here (%s); keeping the previous one", err);
		free(text);
		return;
	}
	free(text);
	if ((ref = calloc(1, sizeof(QbiConfigRef))) == NULL)
	{
		qb_config_free(cfg);
		return;
	}
	ref->cfg = cfg;
	ref->refs = 1;
	qbi_unref(e->ref);
	e->ref = ref;
	/* the admin routes' store renders replayed topics with it */
	if (e->host->config_loaded)
		e->host->config_loaded(e->host->ctx, cfg);
	qb_telemetry_apply(e->host, cfg);

	h = &cfg->http;
	if (h->host != NULL)
		snprintf(key, sizeof(key), "%s|%d|%d|%ld", h->host, h->port, h->max_connections,
				 h->connection_timeout_ms);
	else
		key[0] = '\0';
	if (strcmp(key, e->listen_key) == 0)
		return;
	qbi_stop_listener(e);
	if (key[0] == '\0')
	{
		qb_log(e->host, QB_LOG_INFO, "not listening: http.listen is not set");
		return;
	}
	if (qbi_start_listener(e, h, err, sizeof(err)) != 0)
	{
		qb_log(e->host, QB_LOG_WARNING, "%s", err);
		return;
	}
	snprintf(e->listen_key, sizeof(e->listen_key), "%s", key);
	qb_log(e->host, QB_LOG_INFO, "listening on %s%s%s:%d", strchr(h->host, ':') ? "[" : "",
		   h->host, strchr(h->host, ':') ? "]" : "", h->port);
}

int
qb_ingress_run(const QbHost *host, const QbStore *store, QbMetrics *metrics,
			   QbIngressStats *stats, char *err, size_t errlen)
{
	QbiEngine	e;
	QbIngressStats local = {0};

	memset(&e, 0, sizeof(e));
	e.host = host;
	e.store = store;
	e.metrics = metrics;
	e.stats = stats ? stats : &local;
	e.epoll_fd = -1;
	e.routes = host->routes;
	if (e.routes != NULL && (e.route_state = e.routes->open()) == NULL)
	{
		snprintf(err, errlen, "out of memory");
		return -1;
	}

	while (!host->should_stop(host->ctx))
	{
		MHD_UNSIGNED_LONG_LONG mhd_ms;
		long		wait_ms = 1000;

		if (host->config_changed(host->ctx))
			qbi_reload(&e);
		if (e.mhd == NULL)
		{
			qb_host_doing(host, QB_W_IDLE);
			host->wait(host->ctx, -1, wait_ms);
			continue;
		}
		if (MHD_get_timeout(e.mhd, &mhd_ms) == MHD_YES && (long) mhd_ms < wait_ms)
			wait_ms = (long) mhd_ms;
		/* the sweep needs a pass at least every QBI_SWEEP_MS while connections wait */
		if (e.conns != NULL && wait_ms > QBI_SWEEP_MS)
			wait_ms = QBI_SWEEP_MS;
		qb_host_doing(host, QB_W_IDLE);
		host->wait(host->ctx, e.epoll_fd, wait_ms);
		MHD_run(e.mhd);
		/* answer what this pass deferred, then let MHD send it */
		while (e.deferred != NULL)
		{
			qb_host_doing(host, QB_W_SERVING);
			qbi_serve(&e);
			qb_host_cycle(host);
			MHD_run(e.mhd);
		}
		qbi_sweep(&e);
	}

	/* stop: take no new connection, answer what is in hand, then close */
	if (e.mhd != NULL)
	{
		long		waited = 0;
		MHD_socket lfd = MHD_quiesce_daemon(e.mhd);

		while (waited < QBI_STOP_DRAIN_MS)
		{
			const union MHD_DaemonInfo *info;

			qbi_serve(&e);
			MHD_run(e.mhd);
			info = MHD_get_daemon_info(e.mhd, MHD_DAEMON_INFO_CURRENT_CONNECTIONS);
			if (info == NULL || info->num_connections == 0)
				break;
			host->wait(host->ctx, e.epoll_fd, 50);
			waited += 50;
		}
		qbi_stop_listener(&e);
		/* a quiesced daemon leaves its listening socket to the caller */
		if (lfd != MHD_INVALID_SOCKET)
			close(lfd);
	}
	qbi_unref(e.ref);
	if (e.routes != NULL)
		e.routes->close(e.route_state);
	return 0;
}
