/*-------------------------------------------------------------------------
 * qb_ingress.c
 *	  The HTTP ingress engine: libmicrohttpd in external epoll mode, one
 *	  thread, answering after the inbox rows commit.
 *
 * Wording:
 *	- The listener is one MHD daemon, built from http.listen and the http:
 *	  limits; rebuilt when those change, removed when listen is unset.
 *	- A request is one HTTP exchange (QbiRequest), answered at once (health,
 *	  4xx) or deferred: suspended until the loop did its database work.
 *	- A batch is the inbox rows of every request deferred during one pass
 *	  of MHD_run: one store call, one transaction, one commit for all.
 *
 * A webhook (POST inbox.basePath + source.path): no source 404, not POST
 * 405, a Content-Length over maxBodyBytes 413 before the body is read; a
 * longer body is read and dropped past the limit (413), and one that goes
 * on QBI_DROP_MAX bytes past it is cut (the connection closed, no answer);
 * then authentication over the raw body 401, JSON or UTF-8 400, the key
 * 422, the transform 422 (a refusal stores nothing); then the batch is
 * committed and each request answered 202 (new), 200 (duplicate) or 503.
 * Peers that close mid-request are found by a sweep (qbi_sweep).
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

#include "qb_admin.h"
#include "qb_answer.h"
#include "qb_config.h"
#include "qb_console.h"
#include "qb_extract.h"
#include "qb_ingress.h"
#include "qb_ingress_int.h"
#include "qb_otlp.h"
#include "qb_token.h"
#include "qb_transform.h"
#include "qb_utf8.h"

#define QBI_MAX_VALUE_BYTES	1024	/* idempotency key, event type, aggregate id */
#define QBI_ADMIN_MAX_BODY	65536
#define QBI_LOGIN_MAX_BODY	4096
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
	QBI_ADMIN,
	QBI_LOGIN					/* the console's login: the body, no database */
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
	QbiEngine  *e;
	struct MHD_Connection *conn;
	QbiConfigRef *ref;
	const QbSource *src;		/* QBI_INBOX: in ref->cfg */
	QbiKind		kind;
	char	   *method;
	char	   *path;
	/* QBI_ADMIN: the query string's parameters (strdup'd), the asker */
	QbAdminArg	args[QB_ADMIN_MAX_ARGS + 1];
	int			nargs;			/* QB_ADMIN_MAX_ARGS + 1: too many */
	char		actor[96];		/* "admin route from 127.0.0.1" */
	char		next_after[24]; /* a dead list's X-QueueBox-Next-After */
	char	   *body;
	size_t		len;
	size_t		cap;
	size_t		max;			/* body limit */
	bool		too_big;
	size_t		dropped;		/* bytes read and dropped past max */
	bool		deferred;		/* suspended, waiting for the main loop */
	int			status;			/* 0 until decided */
	char	   *answer;
	const char *content_type;
	bool		allow_post;		/* 405: Allow: POST */
	bool		console;		/* the console's security headers */
	char	   *set_cookie;		/* the console's login or logout */
	long		retry_after;	/* 429: seconds for Retry-After */
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
	QbConsoleLimit limit;		/* wrong admin tokens per peer */
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

/* qbi_set: decide the answer; reason NULL for none. */
static void
qbi_set(QbiRequest *r, int status, const char *word, const char *reason)
{
	r->status = status;
	free(r->answer);
	r->answer = qb_answer(word, reason);
	r->content_type = "application/json";
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

	*out = NULL;
	if (header != NULL)
	{
		v = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, header);
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
	if (strlen(v) > QBI_MAX_VALUE_BYTES)
	{
		snprintf(reason, sizeof(reason), "the %s is longer than %d bytes; shorten it",
				 what, QBI_MAX_VALUE_BYTES);
		free(owned);
		qbi_set(r, 422, "error", reason);
		return false;
	}
	if (qb_utf8_invalid_at(v, strlen(v)) >= 0)
	{
		snprintf(reason, sizeof(reason), "the %s (byte %ld) is not valid UTF-8",
				 what, qb_utf8_invalid_at(v, strlen(v)));
		free(owned);
		qbi_set(r, 400, "error", reason);
		return false;
	}
	/*
	 * the key travels on as the relayed row's x-idempotency-key header, the
	 * event type into its topic: a control character there would send the
	 * row dead at its first publish (fuzz_ingress)
	 */
	if (qb_field_value_invalid_at(v) >= 0)
	{
		long		at = qb_field_value_invalid_at(v);

		snprintf(reason, sizeof(reason),
				 "the %s has a control character (byte %ld is 0x%02x); send it without one",
				 what, at, (unsigned char) v[at]);
		free(owned);
		qbi_set(r, 400, "error", reason);
		return false;
	}
	*out = owned ? owned : strdup(v);
	return true;
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

	switch (qb_transform_run(r->src->transform, r->body, r->len, &vars, NULL, &out, &len,
							 err, sizeof(err)))
	{
		case QB_TRANSFORM_OK:
			free(r->body);
			r->body = out;
			r->len = len;
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
		!qb_auth_verify(&s->auth, qbi_header_get, r->conn, (const unsigned char *) r->body,
						r->len, time(NULL), msg, sizeof(msg)))
	{
		snprintf(reason, sizeof(reason), "authentication failed: %s", msg);
		qbi_set(r, 401, "error", reason);
		return false;
	}
	if (r->len == 0)
	{
		qbi_set(r, 400, "error", "the body is empty; send the event as JSON");
		return false;
	}
	doc = json_loadb(r->body, r->len, JSON_DECODE_ANY, &jerr);
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
	MHD_get_connection_values(r->conn, MHD_HEADER_KIND, qbi_header_cb, &h);
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

/* qbi_source_at: the source answering at path, or NULL. */
static const QbSource *
qbi_source_at(const QbConfig *cfg, const char *path)
{
	size_t		blen = strlen(cfg->inbox.base_path);

	if (strncmp(path, cfg->inbox.base_path, blen) != 0)
		return NULL;
	for (int i = 0; i < cfg->nsources; i++)
		if (cfg->sources[i].type == QB_SOURCE_HTTP && strcmp(path + blen, cfg->sources[i].path) == 0)
			return &cfg->sources[i];
	return NULL;
}

/* The request's headers, with Authorization replaced when bearer is set. */
typedef struct QbiAuthCtx
{
	struct MHD_Connection *conn;
	const char *bearer;			/* "Bearer <token>" from the console, or NULL */
} QbiAuthCtx;

static const char *
qbi_auth_get(void *ctx, const char *name)
{
	QbiAuthCtx *a = ctx;

	if (a->bearer != NULL && strcasecmp(name, "Authorization") == 0)
		return a->bearer;
	return qbi_header_get(a->conn, name);
}

/* qbi_peer: the request's peer address, NULL when unknown */
static const struct sockaddr *
qbi_peer(QbiRequest *r)
{
	const union MHD_ConnectionInfo *ci = MHD_get_connection_info(r->conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);

	return ci != NULL ? ci->client_addr : NULL;
}

static long
qbi_mono_sec(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long) ts.tv_sec;
}

/*
 * qbi_admin_auth: is token (NULL: the request's Authorization header) the
 * admin token?  The bearer check compares in constant time; a failure is
 * answered 401 and counted.  A token presented by a peer that sent too many
 * wrong ones lately is not checked: 429 with Retry-After (qb_console.h).
 */
static bool
qbi_admin_auth(QbiRequest *r, const QbConfig *cfg, const char *token)
{
	QbAuth		auth = {.type = QB_AUTH_BEARER, .token = cfg->admin_token};
	QbiAuthCtx	ctx = {.conn = r->conn};
	char	   *bearer = NULL;
	char		msg[QB_ERRLEN];
	bool		presented = token != NULL || qbi_header_get(r->conn, "Authorization") != NULL;
	long		now = qbi_mono_sec();
	long		wait;
	bool		ok;

	/* no credential (a page opened before login) is no guess: neither limited nor counted */
	if (presented && (wait = qb_console_limit_wait(&r->e->limit, qbi_peer(r), now)) > 0)
	{
		char		reason[QB_ERRLEN];

		snprintf(reason, sizeof(reason),
				 "too many wrong admin tokens from this address; retry in %ld s (Retry-After)", wait);
		qbi_set(r, 429, "error", reason);
		r->retry_after = wait;
		if (r->e->metrics)
			qb_metrics_add(&r->e->metrics->admin_unauthorized, 1);
		return false;
	}
	if (token != NULL && (bearer = malloc(strlen(token) + 8)) == NULL)
	{
		qbi_set(r, 503, "unavailable", "out of memory; retry later");
		return false;
	}
	if (bearer != NULL)
		sprintf(bearer, "Bearer %s", token);
	ctx.bearer = bearer;
	ok = qb_auth_verify(&auth, qbi_auth_get, &ctx, NULL, 0, time(NULL), msg, sizeof(msg));
	if (bearer != NULL)
		explicit_bzero(bearer, strlen(bearer));
	free(bearer);
	if (!ok)
	{
		char		reason[QB_ERRLEN + 64];

		if (token != NULL)
			snprintf(msg, sizeof(msg), "the token is not the configured admin.token");
		snprintf(reason, sizeof(reason), "admin authentication failed: %s", msg);
		qbi_set(r, 401, "error", reason);
		if (r->e->metrics)
			qb_metrics_add(&r->e->metrics->admin_unauthorized, 1);
		if (presented)
			qb_console_limit_fail(&r->e->limit, qbi_peer(r), now);
	}
	return ok;
}

/*
 * qbi_csrf: a console write carries X-QueueBox-CSRF, which no cross-site
 * form can send.  what: the request, as the refusal names it; fix: what to
 * do instead.
 */
static bool
qbi_csrf(QbiRequest *r, const char *what, const char *fix)
{
	char		msg[QB_ERRLEN];

	if (qbi_header_get(r->conn, QB_CONSOLE_CSRF_HEADER) != NULL)
		return true;
	snprintf(msg, sizeof(msg), "%s must carry the " QB_CONSOLE_CSRF_HEADER
			 " header (any value), which no cross-site form can send; %s", what, fix);
	qbi_set(r, 403, "error", msg);
	return false;
}

/* qbi_arg_cb: one query-string parameter of an admin request, copied. */
static enum MHD_Result
qbi_arg_cb(void *cls, enum MHD_ValueKind kind, const char *name, const char *value)
{
	QbiRequest *r = cls;
	QbAdminArg *a;

	if (r->nargs > QB_ADMIN_MAX_ARGS)
		return MHD_NO;			/* too many: the admin route says so */
	a = &r->args[r->nargs++];
	a->name = strdup(name ? name : "");
	a->value = value ? strdup(value) : NULL;
	return a->name != NULL && (value == NULL || a->value != NULL) ? MHD_YES : MHD_NO;
}

/*
 * qbi_actor: who asks, as the log and the audit rows name them: the route
 * and the peer's address (the admin token is shared; a proxy in front
 * shows as itself: X-Forwarded-For is not trusted).
 */
static void
qbi_actor(QbiRequest *r, bool by_cookie)
{
	const union MHD_ConnectionInfo *ci = MHD_get_connection_info(r->conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
	char		addr[INET6_ADDRSTRLEN] = "an unknown address";
	const struct sockaddr *sa = ci ? ci->client_addr : NULL;

	if (sa != NULL && sa->sa_family == AF_INET)
		inet_ntop(AF_INET, &((const struct sockaddr_in *) sa)->sin_addr, addr, sizeof(addr));
	else if (sa != NULL && sa->sa_family == AF_INET6)
		inet_ntop(AF_INET6, &((const struct sockaddr_in6 *) sa)->sin6_addr, addr, sizeof(addr));
	snprintf(r->actor, sizeof(r->actor), "%s from %s", by_cookie ? "console" : "admin route", addr);
}

static void
qbi_admin_route(QbiRequest *r, const QbConfig *cfg)
{
	const char *cookie = qbi_header_get(r->conn, "Cookie");
	char		token[1024];
	bool		by_cookie,
				ok;

	if (cfg->admin_token == NULL)
	{
		qbi_set(r, 404, "error", "the admin routes are off; set admin.token to turn them on");
		return;
	}
	r->console = true;
	/* the header wins; the console's cookie stands in for it */
	by_cookie = qbi_header_get(r->conn, "Authorization") == NULL &&
		qb_console_cookie_token(cookie, token, sizeof(token));
	ok = qbi_admin_auth(r, cfg, by_cookie ? token : NULL);
	explicit_bzero(token, sizeof(token));
	if (!ok)
		return;
	if (by_cookie && strcmp(r->method, "GET") != 0 && strcmp(r->method, "HEAD") != 0 &&
		!qbi_csrf(r, "a write with the console's cookie",
				  "send the admin token as Authorization: Bearer instead, or use the console"))
		return;
	r->kind = QBI_ADMIN;
	r->max = QBI_ADMIN_MAX_BODY;
	qbi_actor(r, by_cookie);
	MHD_get_connection_values(r->conn, MHD_GET_ARGUMENT_KIND, qbi_arg_cb, r);
}

/* qbi_behind_tls: a TLS-terminating proxy says so (the cookie is then Secure) */
static bool
qbi_behind_tls(QbiRequest *r)
{
	const char *proto = qbi_header_get(r->conn, "X-Forwarded-Proto");

	return proto != NULL && strcasecmp(proto, "https") == 0;
}

/*
 * qbi_console_route: the console's pages and its login and logout, when
 * admin.token is set (docs/console.md); without it, a 404 that says so.
 * False when path is not the console's.
 */
static bool
qbi_console_route(QbiRequest *r, const QbConfig *cfg)
{
	bool		get = strcmp(r->method, "GET") == 0 || strcmp(r->method, "HEAD") == 0;
	const QbConsoleAsset *a;

	if (strcmp(r->path, "/console") != 0 && strncmp(r->path, "/console/", 9) != 0)
		return false;
	if (cfg->admin_token == NULL)
	{
		if (qbi_source_at(cfg, r->path) != NULL)
			return false;		/* a source's path, when the console is off */
		qbi_set(r, 404, "error", "the console is off; set admin.token to turn it on (docs/console.md)");
		return true;
	}
	r->console = true;
	if (strcmp(r->path, "/console/login") == 0 || strcmp(r->path, "/console/logout") == 0)
	{
		if (strcmp(r->method, "POST") != 0)
		{
			qbi_set(r, 405, "error", "use POST");
			r->allow_post = true;
			return true;
		}
		if (!qbi_csrf(r, strcmp(r->path, "/console/login") == 0 ? "a console login" : "a console logout",
					  "the console's page sends it"))
			return true;
		if (strcmp(r->path, "/console/login") == 0)
		{
			r->kind = QBI_LOGIN;
			r->max = QBI_LOGIN_MAX_BODY;
			return true;
		}
		qbi_set(r, 200, "ok", NULL);
		r->set_cookie = qb_console_set_cookie(NULL, qbi_behind_tls(r));
		return true;
	}
	if ((a = qb_console_asset(r->path)) == NULL)
	{
		qbi_set(r, 404, "error", "no such console page; open /console");
		return true;
	}
	if (!get)
	{
		qbi_set(r, 405, "error", "use GET");
		return true;
	}
	r->status = 200;
	r->answer = strdup(a->body);
	r->content_type = a->content_type;
	return true;
}

/*
 * qbi_login: the console's login, once its body is here: the token of
 * {"token": ...} checked as a bearer token, then set as the session cookie.
 */
static void
qbi_login(QbiRequest *r)
{
	char		reason[QB_ERRLEN];
	char	   *token = qb_console_login_token(r->body, r->len, reason, sizeof(reason));

	if (token == NULL)
	{
		qbi_set(r, 400, "error", reason);
		return;
	}
	if (qbi_admin_auth(r, r->ref->cfg, token))
	{
		qbi_set(r, 200, "ok", NULL);
		r->set_cookie = qb_console_set_cookie(token, qbi_behind_tls(r));
		if (r->set_cookie == NULL)
			qbi_set(r, 503, "unavailable", "out of memory; retry later");
	}
	explicit_bzero(token, strlen(token));
	free(token);
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
	bool		get = strcmp(r->method, "GET") == 0 || strcmp(r->method, "HEAD") == 0;

	if (strcmp(r->path, "/healthz") == 0 || strcmp(r->path, "/readyz") == 0 ||
		strcmp(r->path, "/metrics") == 0)
	{
		if (!get)
		{
			qbi_set(r, 405, "error", "use GET");
			return;
		}
		if (r->path[1] == 'h')
			qbi_set(r, 200, "ok", NULL);
		else
			r->kind = r->path[1] == 'r' ? QBI_READY : QBI_METRICS;
		return;
	}
	if (strcmp(r->path, "/admin") == 0 || strncmp(r->path, "/admin/", 7) == 0)
	{
		qbi_admin_route(r, cfg);
		return;
	}
	if (qbi_console_route(r, cfg))
		return;
	if ((r->src = qbi_source_at(cfg, r->path)) == NULL)
	{
		qbi_set(r, 404, "error",
				"no source answers at this path; webhooks go to inbox.basePath followed by a source's path");
		if (r->e->metrics)
			qb_metrics_add(&r->e->metrics->http_not_found, 1);
		return;
	}
	if (strcmp(r->method, "POST") != 0)
	{
		qbi_set(r, 405, "error", "a source takes POST only");
		r->allow_post = true;
		if (r->e->metrics)
			qb_metrics_add(&r->e->metrics->http_not_found, 1);
		return;
	}
	r->kind = QBI_INBOX;
	r->max = (size_t) r->src->max_body_bytes;
	cl = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
	if (cl != NULL && strtoull(cl, NULL, 10) > r->max)
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
	QbSpan		span;
	char		name[160];

	if (!qb_otlp_on())
		return;
	snprintf(name, sizeof(name), "receive %s", r->src->name);
	if (!qb_span_start_tp(&span, name, QB_SPAN_SERVER,
						  MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, "traceparent"),
						  MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, "tracestate")))
		return;
	span.start_ns = r->t0_ns;
	qb_span_str(&span, "queuebox.source", r->src->name);
	qb_span_str(&span, "queuebox.result", qb_receive_result_name(res));
	qb_span_int(&span, "http.response.status_code", r->status);
	qb_span_str(&span, "http.request.method", "POST");
	if (r->key != NULL)
		qb_span_str(&span, "messaging.message.id", r->key);
	span.error = r->status >= 500;
	qb_otlp_emit(&span);
	qb_otlp_log_errors(r->e->host);
}

static void
qbi_count(QbiRequest *r)
{
	QbiEngine  *e = r->e;
	QbReceiveResult res;

	if (r->src == NULL)
		return;
	switch (r->status)
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
	if (r->status >= 400 && r->status < 500)
		e->stats->refused++;
	qb_metrics_received(e->metrics, r->src->name, res);
	qbi_span(r, res);
}

static enum MHD_Result
qbi_respond(QbiRequest *r)
{
	struct MHD_Response *resp;
	const char *text = r->answer ? r->answer : "";
	enum MHD_Result ret;

	qbi_count(r);
	resp = MHD_create_response_from_buffer(strlen(text), (void *) text, MHD_RESPMEM_MUST_COPY);
	if (resp == NULL)
		return MHD_NO;
	MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE,
							r->content_type ? r->content_type : "application/json");
	MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
	if (r->allow_post)
		MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, "POST");
	if (r->next_after[0] != '\0')
		MHD_add_response_header(resp, QB_ADMIN_NEXT_AFTER_HEADER, r->next_after);
	for (int i = 0; r->console && qb_console_headers[i][0] != NULL; i++)
		MHD_add_response_header(resp, qb_console_headers[i][0], qb_console_headers[i][1]);
	if (r->set_cookie)
		MHD_add_response_header(resp, MHD_HTTP_HEADER_SET_COOKIE, r->set_cookie);
	if (r->retry_after > 0)
	{
		char		secs[24];

		snprintf(secs, sizeof(secs), "%ld", r->retry_after);
		MHD_add_response_header(resp, MHD_HTTP_HEADER_RETRY_AFTER, secs);
	}
	ret = MHD_queue_response(r->conn, (unsigned int) r->status, resp);
	MHD_destroy_response(resp);
	return ret;
}

static void
qbi_request_free(QbiRequest *r)
{
	qbi_unref(r->ref);
	free(r->method);
	free(r->path);
	for (int i = 0; i < r->nargs; i++)
	{
		free((char *) r->args[i].name);
		free((char *) r->args[i].value);
	}
	free(r->body);
	free(r->answer);
	free(r->key);
	free(r->event_type);
	free(r->aggregate_id);
	free(r->headers);
	free(r->set_cookie);
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
	if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK && r->status == 0 && e->metrics)
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
	MHD_suspend_connection(r->conn);
	return MHD_YES;
}

static enum MHD_Result
qbi_access(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
		   const char *version, const char *upload, size_t *upload_size, void **con_cls)
{
	QbiEngine  *e = cls;
	QbiRequest *r = *con_cls;
	QbiConn    *c;

	if (r == NULL)
	{
		if ((r = calloc(1, sizeof(QbiRequest))) == NULL)
			return MHD_NO;
		r->t0_ns = qb_otlp_now_ns();
		r->e = e;
		r->conn = conn;
		if ((c = qbi_conn_of(conn)) != NULL)
			c->requests++;
		r->ref = e->ref;
		r->ref->refs++;
		r->method = strdup(method);
		r->path = strdup(url);
		*con_cls = r;
		if (r->method == NULL || r->path == NULL)
			return MHD_NO;
		r->kind = QBI_ANSWERED;
		qbi_route(r);
		if (r->status != 0)
		{
			if ((c = qbi_conn_of(conn)) != NULL)
				c->waiting = false;
			return qbi_respond(r);
		}
		return MHD_YES;
	}

	if (*upload_size > 0)
	{
		size_t		n = *upload_size;

		*upload_size = 0;
		if (r->too_big)
		{
			r->dropped += n;
			return r->dropped > QBI_DROP_MAX ? MHD_NO : MHD_YES;
		}
		if (r->len + n > r->max)
		{
			/* read and drop the rest: 0.9.75 cannot answer mid-upload */
			r->too_big = true;
			r->dropped = r->len + n - r->max;
			free(r->body);
			r->body = NULL;
			return MHD_YES;
		}
		if (r->len + n + 1 > r->cap)
		{
			size_t		cap = r->cap ? r->cap : 4096;
			char	   *b;

			while (cap < r->len + n + 1)
				cap *= 2;
			if ((b = realloc(r->body, cap)) == NULL)
				return MHD_NO;
			r->body = b;
			r->cap = cap;
		}
		memcpy(r->body + r->len, upload, n);
		r->len += n;
		r->body[r->len] = '\0';
		return MHD_YES;
	}

	/* the whole request is here, or the main loop resumed it: its answer is being made */
	if ((c = qbi_conn_of(conn)) != NULL)
		c->waiting = false;
	if (r->status != 0)
		return qbi_respond(r);
	if (r->deferred)
		return MHD_YES;			/* not possible: resumed requests have a status */
	if (r->too_big)
	{
		char		reason[QB_ERRLEN];

		snprintf(reason, sizeof(reason),
				 "the body is over %zu bytes (maxBodyBytes); nothing was stored", r->max);
		qbi_set(r, 413, "error", reason);
		return qbi_respond(r);
	}
	if (r->kind == QBI_INBOX && !qbi_check_webhook(r))
		return qbi_respond(r);
	if (r->kind == QBI_LOGIN)
	{
		qbi_login(r);
		return qbi_respond(r);
	}
	return qbi_defer(r);
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
			rows[i].payload = r->body;
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
		r->status = ids[i] > 0 ? 202 : 200;
		free(r->answer);
		r->answer = o ? json_dumps(o, JSON_COMPACT) : NULL;
		r->content_type = "application/json";
		json_decref(o);
	}
	free(rows);
	free(reqs);
	free(ids);
}

/*
 * qbi_gauges: the configured names, and the gauges read for /metrics;
 * database_up false (and no circuit) on failure.  The names point into the
 * configuration; qbi_gauges_free frees the arrays.
 */
static void
qbi_gauges(QbiEngine *e, QbGauges *g)
{
	const QbConfig *cfg = e->ref->cfg;
	char		err[QB_ERRLEN];
	char	   *text = NULL;
	json_t	   *o;
	const char **dests = calloc(cfg->ndestinations + 1, sizeof(char *));
	const char **sources = calloc(cfg->nsources + 1, sizeof(char *));

	memset(g, 0, sizeof(*g));
	g->outbox_pending = g->outbox_processing = g->outbox_oldest_pending_sec = -1;
	g->inbox_pending = g->inbox_processing = g->inbox_oldest_pending_sec = -1;
	/* out of memory: NULL names, every slot rendered as it is */
	if (dests != NULL && sources != NULL)
	{
		for (int i = 0; i < cfg->ndestinations; i++)
			dests[i] = cfg->destinations[i].name;
		for (int i = 0; i < cfg->nsources; i++)
			sources[i] = cfg->sources[i].name;
		g->ndests = cfg->ndestinations;
		g->dest_names = dests;
		g->nsources = cfg->nsources;
		g->source_names = sources;
	}
	else
	{
		free(dests);
		free(sources);
	}
	if (e->store->query_text(e->store->ctx, QB_Q_GAUGES, NULL,
							 cfg->http.store_timeout_ms, &text, err, sizeof(err)) != 0 ||
		text == NULL || (o = json_loads(text, 0, NULL)) == NULL)
	{
		free(text);
		return;
	}
	g->database_up = true;
	g->outbox_pending = json_number_value(json_object_get(o, "outbox_pending"));
	g->outbox_processing = json_number_value(json_object_get(o, "outbox_processing"));
	g->outbox_oldest_pending_sec = json_number_value(json_object_get(o, "outbox_oldest"));
	g->inbox_pending = json_number_value(json_object_get(o, "inbox_pending"));
	g->inbox_processing = json_number_value(json_object_get(o, "inbox_processing"));
	g->inbox_oldest_pending_sec = json_number_value(json_object_get(o, "inbox_oldest"));
	if (g->dest_names != NULL &&
		(g->dest_circuits = calloc(g->ndests + 1, sizeof(int))) != NULL)
		for (int i = 0; i < g->ndests; i++)
			g->dest_circuits[i] = qb_circuit_parse(json_string_value(
				json_object_get(json_object_get(o, "circuits"), g->dest_names[i])));
	json_decref(o);
	free(text);
}

static void
qbi_gauges_free(QbGauges *g)
{
	free(g->dest_circuits);
	free((void *) g->dest_names);
	free((void *) g->source_names);
}

/* qbi_serve_admin: an admin route, once its body is here (qb_admin.c). */
static void
qbi_serve_admin(QbiEngine *e, QbiRequest *r)
{
	QbAdminRequest req = {
		.method = r->method,
		.path = r->path + strlen("/admin"),
		.args = r->args,
		.nargs = r->nargs,
		.body = r->body,
		.body_len = r->len,
		.actor = r->actor,
	};
	QbAdminAnswer ans;

	qb_admin_handle(e->host, e->store, r->ref->cfg->http.store_timeout_ms, &req, &ans);
	r->status = ans.status;
	free(r->answer);
	r->answer = ans.body;
	memcpy(r->next_after, ans.next_after, sizeof(r->next_after));
	r->content_type = "application/json";
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
			qbi_gauges(e, &g);
			r->answer = qb_metrics_render(e->metrics, &g);
			qbi_gauges_free(&g);
			r->status = r->answer ? 200 : 503;
			r->content_type = "text/plain; version=0.0.4; charset=utf-8";
			break;
		case QBI_ADMIN:
			if (strcmp(r->path, "/admin/overview") == 0)
			{
				qb_admin_overview(e->store, r->ref->cfg->http.store_timeout_ms, r->method,
								  r->ref->cfg, e->metrics, &r->status, &r->answer);
				r->content_type = "application/json";
				break;
			}
			qbi_serve_admin(e, r);
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
		if (r->kind != QBI_INBOX && r->status == 0)
			qbi_serve_one(e, r);
	for (r = e->deferred; r != NULL; r = next)
	{
		next = r->next;
		r->next = NULL;
		r->deferred = false;
		if (r->status == 0)
			qbi_set(r, 503, "unavailable", "out of memory; retry later");
		MHD_resume_connection(r->conn);
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
	if (qb_config_parse(text, text ? strlen(text) : 0, &cfg, err, sizeof(err)) != 0)
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
	return 0;
}
