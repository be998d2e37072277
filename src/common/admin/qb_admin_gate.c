/*-------------------------------------------------------------------------
 * qb_admin_gate.c
 *	  The admin room's door on the ingress's listener (qb_admin_routes, a
 *	  QbIngressRoutes): which requests are the admin API's and the
 *	  console's, who may come in, and the console's login and logout.
 *
 * Wording:
 *	- The admin routes are /admin and /admin/...: a bearer token
 *	  (Authorization) or the console's session cookie, compared with
 *	  admin.token in constant time; then qb_admin.c answers in the main loop.
 *	- The console is /console and /console/...: its pages (qb_console.c),
 *	  POST /console/login (the token in the body, checked like a bearer,
 *	  then set as the cookie) and POST /console/logout.
 *	- The rate limit: a peer that sent QB_CONSOLE_LIMIT_FAILS wrong tokens
 *	  within the window is answered 429 with Retry-After, its token not
 *	  checked (qb_console.h); one limit per listener (open/close).
 *	- CSRF: a write with the cookie, a login and a logout carry
 *	  X-QueueBox-CSRF, which no cross-site form can send; a bearer write
 *	  needs none (no browser sends the header by itself).
 *	- The actor of a write is the route and the peer's address ("admin route
 *	  from 127.0.0.1", "console from ..."): the token is shared, so that is
 *	  all the server knows; X-Forwarded-For is not trusted.
 *
 * Without admin.token both are a 404 that says how to turn them on (a
 * source's path under /console then stays the source's).  Every answer of
 * either carries the console's security headers.  Memory: the query
 * string's parameters and the actor are the request's route_data, freed by
 * qbag_done.  Threads: the ingress's only.
 *-------------------------------------------------------------------------
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <microhttpd.h>

#include "qb_admin.h"
#include "qb_admin_gate.h"
#include "qb_auth.h"
#include "qb_clock.h"
#include "qb_console.h"

#define QBAG_ADMIN_MAX_BODY	65536
#define QBAG_LOGIN_MAX_BODY	4096

/* one listener's: wrong admin tokens per peer */
typedef struct QbagState
{
	QbConsoleLimit limit;
} QbagState;

/* an admin request's route_data: the query string's parameters (strdup'd), the asker */
typedef struct QbagData
{
	QbAdminArg	args[QB_ADMIN_MAX_ARGS + 1];
	int			nargs;			/* QB_ADMIN_MAX_ARGS + 1: too many */
	char		actor[96];		/* "admin route from 127.0.0.1" */
} QbagData;

/* one request as the gate's steps see it */
typedef struct QbagReq
{
	QbIngressRequest *x;
	QbagState  *st;
	QbMetrics  *metrics;
	QbagData   *d;				/* an admin route's, else NULL */
} QbagReq;

static const char *
qbag_header_get(void *ctx, const char *name)
{
	return MHD_lookup_connection_value((struct MHD_Connection *) ctx, MHD_HEADER_KIND, name);
}

/* The request's headers, with Authorization replaced when bearer is set. */
typedef struct QbagAuthCtx
{
	struct MHD_Connection *conn;
	const char *bearer;			/* "Bearer <token>" from the console, or NULL */
} QbagAuthCtx;

static const char *
qbag_auth_get(void *ctx, const char *name)
{
	QbagAuthCtx *a = ctx;

	if (a->bearer != NULL && strcasecmp(name, "Authorization") == 0)
		return a->bearer;
	return qbag_header_get(a->conn, name);
}

/* qbag_peer: the request's peer address, NULL when unknown */
static const struct sockaddr *
qbag_peer(QbagReq *r)
{
	const union MHD_ConnectionInfo *ci = MHD_get_connection_info(r->x->conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);

	return ci != NULL ? ci->client_addr : NULL;
}

/*
 * qbag_admin_auth: is token (NULL: the request's Authorization header) the
 * admin token?  The bearer check compares in constant time; a failure is
 * answered 401 and counted.  A token presented by a peer that sent too many
 * wrong ones lately is not checked: 429 with Retry-After (qb_console.h).
 */
static bool
qbag_admin_auth(QbagReq *r, const QbConfig *cfg, const char *token)
{
	QbAuth		auth = {.type = QB_AUTH_BEARER, .token = cfg->admin_token};
	QbagAuthCtx	ctx = {.conn = r->x->conn};
	char	   *bearer = NULL;
	char		msg[QB_ERRLEN];
	bool		presented = token != NULL || qbag_header_get(r->x->conn, "Authorization") != NULL;
	long		now = qb_now_ms() / 1000;
	long		wait;
	bool		ok;

	/* no credential (a page opened before login) is no guess: neither limited nor counted */
	if (presented && (wait = qb_console_limit_wait(&r->st->limit, qbag_peer(r), now)) > 0)
	{
		char		reason[QB_ERRLEN];

		snprintf(reason, sizeof(reason),
				 "too many wrong admin tokens from this address; retry in %ld s (Retry-After)", wait);
		qb_ingress_answer(r->x, 429, "error", reason);
		r->x->retry_after = wait;
		if (r->metrics)
			qb_metrics_add(&r->metrics->admin_unauthorized, 1);
		return false;
	}
	if (token != NULL && (bearer = malloc(strlen(token) + 8)) == NULL)
	{
		qb_ingress_answer(r->x, 503, "unavailable", "out of memory; retry later");
		return false;
	}
	if (bearer != NULL)
		sprintf(bearer, "Bearer %s", token);
	ctx.bearer = bearer;
	ok = qb_auth_verify(&auth, qbag_auth_get, &ctx, NULL, 0, time(NULL), msg, sizeof(msg));
	if (bearer != NULL)
		explicit_bzero(bearer, strlen(bearer));
	free(bearer);
	if (!ok)
	{
		char		reason[QB_ERRLEN + 64];

		if (token != NULL)
			snprintf(msg, sizeof(msg), "the token is not the configured admin.token");
		snprintf(reason, sizeof(reason), "admin authentication failed: %s", msg);
		qb_ingress_answer(r->x, 401, "error", reason);
		if (r->metrics)
			qb_metrics_add(&r->metrics->admin_unauthorized, 1);
		if (presented)
			qb_console_limit_fail(&r->st->limit, qbag_peer(r), now);
	}
	return ok;
}

/*
 * qbag_csrf: a console write carries X-QueueBox-CSRF, which no cross-site
 * form can send.  what: the request, as the refusal names it; fix: what to
 * do instead.
 */
static bool
qbag_csrf(QbagReq *r, const char *what, const char *fix)
{
	char		msg[300];

	if (qbag_header_get(r->x->conn, QB_CONSOLE_CSRF_HEADER) != NULL)
		return true;
	snprintf(msg, sizeof(msg), "%s must carry the " QB_CONSOLE_CSRF_HEADER
			 " header (any value), which no cross-site form can send; %s", what, fix);
	qb_ingress_answer(r->x, 403, "error", msg);
	return false;
}

/* qbag_arg_cb: one query-string parameter of an admin request, copied. */
static enum MHD_Result
qbag_arg_cb(void *cls, enum MHD_ValueKind kind, const char *name, const char *value)
{
	QbagReq *r = cls;
	QbAdminArg *a;

	if (r->d->nargs > QB_ADMIN_MAX_ARGS)
		return MHD_NO;			/* too many: the admin route says so */
	a = &r->d->args[r->d->nargs++];
	a->name = strdup(name ? name : "");
	a->value = value ? strdup(value) : NULL;
	return a->name != NULL && (value == NULL || a->value != NULL) ? MHD_YES : MHD_NO;
}

/*
 * qbag_actor: who asks, as the log and the audit rows name them: the route
 * and the peer's address (the admin token is shared; a proxy in front
 * shows as itself: X-Forwarded-For is not trusted).
 */
static void
qbag_actor(QbagReq *r, bool by_cookie)
{
	const union MHD_ConnectionInfo *ci = MHD_get_connection_info(r->x->conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
	char		addr[INET6_ADDRSTRLEN] = "an unknown address";
	const struct sockaddr *sa = ci ? ci->client_addr : NULL;

	if (sa != NULL && sa->sa_family == AF_INET)
		inet_ntop(AF_INET, &((const struct sockaddr_in *) sa)->sin_addr, addr, sizeof(addr));
	else if (sa != NULL && sa->sa_family == AF_INET6)
		inet_ntop(AF_INET6, &((const struct sockaddr_in6 *) sa)->sin6_addr, addr, sizeof(addr));
	snprintf(r->d->actor, sizeof(r->d->actor), "%s from %s", by_cookie ? "console" : "admin route", addr);
}

static void
qbag_admin_route(QbagReq *r, const QbConfig *cfg)
{
	const char *cookie = qbag_header_get(r->x->conn, "Cookie");
	char		token[1024];
	bool		by_cookie,
				ok;

	if (cfg->admin_token == NULL)
	{
		qb_ingress_answer(r->x, 404, "error", "the admin routes are off; set admin.token to turn them on");
		return;
	}
	r->x->headers = qb_console_headers;
	/* the header wins; the console's cookie stands in for it */
	by_cookie = qbag_header_get(r->x->conn, "Authorization") == NULL &&
		qb_console_cookie_token(cookie, token, sizeof(token));
	ok = qbag_admin_auth(r, cfg, by_cookie ? token : NULL);
	explicit_bzero(token, sizeof(token));
	if (!ok)
		return;
	if (by_cookie && strcmp(r->x->method, "GET") != 0 && strcmp(r->x->method, "HEAD") != 0 &&
		!qbag_csrf(r, "a write with the console's cookie",
				  "send the admin token as Authorization: Bearer instead, or use the console"))
		return;
	r->x->next = QB_INGRESS_BODY_SERVE;
	r->x->max = QBAG_ADMIN_MAX_BODY;
	qbag_actor(r, by_cookie);
	MHD_get_connection_values(r->x->conn, MHD_GET_ARGUMENT_KIND, qbag_arg_cb, r);
}

/* qbag_behind_tls: a TLS-terminating proxy says so (the cookie is then Secure) */
static bool
qbag_behind_tls(QbagReq *r)
{
	const char *proto = qbag_header_get(r->x->conn, "X-Forwarded-Proto");

	return proto != NULL && strcasecmp(proto, "https") == 0;
}

/*
 * qbag_console_route: the console's pages and its login and logout, when
 * admin.token is set (docs/console.md); without it, a 404 that says so.
 * False when path is not the console's.
 */
static bool
qbag_console_route(QbagReq *r, const QbConfig *cfg)
{
	bool		get = strcmp(r->x->method, "GET") == 0 || strcmp(r->x->method, "HEAD") == 0;
	const QbConsoleAsset *a;

	if (strcmp(r->x->path, "/console") != 0 && strncmp(r->x->path, "/console/", 9) != 0)
		return false;
	if (cfg->admin_token == NULL)
	{
		if (qb_ingress_source_at(cfg, r->x->path) != NULL)
			return false;		/* a source's path, when the console is off */
		qb_ingress_answer(r->x, 404, "error", "the console is off; set admin.token to turn it on (docs/console.md)");
		return true;
	}
	r->x->headers = qb_console_headers;
	if (strcmp(r->x->path, "/console/login") == 0 || strcmp(r->x->path, "/console/logout") == 0)
	{
		if (strcmp(r->x->method, "POST") != 0)
		{
			qb_ingress_answer(r->x, 405, "error", "use POST");
			r->x->allow_post = true;
			return true;
		}
		if (!qbag_csrf(r, strcmp(r->x->path, "/console/login") == 0 ? "a console login" : "a console logout",
					  "the console's page sends it"))
			return true;
		if (strcmp(r->x->path, "/console/login") == 0)
		{
			r->x->next = QB_INGRESS_BODY_ANSWER;
			r->x->max = QBAG_LOGIN_MAX_BODY;
			return true;
		}
		qb_ingress_answer(r->x, 200, "ok", NULL);
		r->x->set_cookie = qb_console_set_cookie(NULL, qbag_behind_tls(r));
		return true;
	}
	if ((a = qb_console_asset(r->x->path)) == NULL)
	{
		qb_ingress_answer(r->x, 404, "error", "no such console page; open /console");
		return true;
	}
	if (!get)
	{
		qb_ingress_answer(r->x, 405, "error", "use GET");
		return true;
	}
	r->x->status = 200;
	r->x->answer = strdup(a->body);
	r->x->content_type = a->content_type;
	return true;
}

/*
 * qbag_login: the console's login, once its body is here: the token of
 * {"token": ...} checked as a bearer token, then set as the session cookie.
 */
static void
qbag_login(QbagReq *r, const QbConfig *cfg)
{
	char		reason[QB_ERRLEN];
	char	   *token = qb_console_login_token(r->x->body, r->x->len, reason, sizeof(reason));

	if (token == NULL)
	{
		qb_ingress_answer(r->x, 400, "error", reason);
		return;
	}
	if (qbag_admin_auth(r, cfg, token))
	{
		qb_ingress_answer(r->x, 200, "ok", NULL);
		r->x->set_cookie = qb_console_set_cookie(token, qbag_behind_tls(r));
		if (r->x->set_cookie == NULL)
			qb_ingress_answer(r->x, 503, "unavailable", "out of memory; retry later");
	}
	explicit_bzero(token, strlen(token));
	free(token);
}

/* ---- the routes table ------------------------------------------------- */

static void *
qbag_open(void)
{
	return calloc(1, sizeof(QbagState));
}

static void
qbag_close(void *state)
{
	free(state);
}

static bool
qbag_route(void *state, QbIngressRequest *req, const QbConfig *cfg, QbMetrics *metrics)
{
	QbagReq		r = {.x = req, .st = state, .metrics = metrics};

	if (strcmp(req->path, "/admin") != 0 && strncmp(req->path, "/admin/", 7) != 0)
		return qbag_console_route(&r, cfg);
	if ((r.d = req->route_data = calloc(1, sizeof(QbagData))) == NULL)
		qb_ingress_answer(req, 503, "unavailable", "out of memory; retry later");
	else
		qbag_admin_route(&r, cfg);
	return true;
}

static void
qbag_body(void *state, QbIngressRequest *req, const QbConfig *cfg, QbMetrics *metrics)
{
	QbagReq		r = {.x = req, .st = state, .metrics = metrics};

	qbag_login(&r, cfg);
}

/* qbag_serve: an admin route, once its body is here (qb_admin.c). */
static void
qbag_serve(const QbHost *host, const QbStore *store, QbIngressRequest *req,
		   const QbConfig *cfg, QbMetrics *metrics)
{
	QbagData   *d = req->route_data;
	QbAdminRequest ar = {
		.method = req->method,
		.path = req->path + strlen("/admin"),
		.args = d->args,
		.nargs = d->nargs,
		.body = req->body,
		.body_len = req->len,
		.actor = d->actor,
	};
	QbAdminAnswer ans;

	req->content_type = "application/json";
	if (strcmp(req->path, "/admin/overview") == 0)
	{
		qb_admin_overview(store, cfg->http.store_timeout_ms, req->method, cfg, metrics,
						  host->limits, &req->status, &req->answer);
		return;
	}
	qb_admin_handle(host, store, cfg->http.store_timeout_ms, &ar, &ans);
	req->status = ans.status;
	free(req->answer);
	req->answer = ans.body;
	if (ans.next_after[0] != '\0')
	{
		req->own_header = QB_ADMIN_NEXT_AFTER_HEADER;
		memcpy(req->own_value, ans.next_after, sizeof(req->own_value));
	}
}

static void
qbag_done(QbIngressRequest *req)
{
	QbagData   *d = req->route_data;

	for (int i = 0; i < d->nargs; i++)
	{
		free((char *) d->args[i].name);
		free((char *) d->args[i].value);
	}
	free(d);
	req->route_data = NULL;
}

const QbIngressRoutes qb_admin_routes = {
	.open = qbag_open,
	.close = qbag_close,
	.route = qbag_route,
	.body = qbag_body,
	.serve = qbag_serve,
	.done = qbag_done,
};
