/*-------------------------------------------------------------------------
 * qb_admin.c
 *	  The /admin/ routes: dead rows by filter, one row, and the operations
 *	  on rows and destinations, over the same SQL functions an operator can
 *	  call by hand (docs/http-api.md, docs/operations.md).
 *
 * Routes (after /admin; qb_admin_gate.c has checked the bearer token or
 * the console's cookie):
 *	GET  /outbox/dead?destination=&topic=&key=&error=&since=&until=&after=&limit=
 *	GET  /inbox/dead?source=&event_type=&idempotency_key=&aggregate_id=&error=
 *					&since=&until=&after=&limit=
 *										a page of dead rows, id ascending; the
 *										next page's after= in the header
 *										X-QueueBox-Next-After (none: the end)
 *	GET  /outbox/held?limit=N			keys held by a dead or retrying head
 *	GET  /outbox/{id}, /inbox/{id}		the whole row (outbox: with its audit)
 *	GET  /inbox/lookup?source=&idempotency_key=
 *	POST /outbox/{id}/replay			a new outbox row, new message_id
 *	POST /outbox/{id}/requeue			dead -> pending, attempts reset; with a
 *										body {"payload": ...} the payload is
 *										replaced (audited, onDead: holdKey)
 *	POST /outbox/{id}/skip				a dead row that holds its key lets it go
 *	POST /inbox/{id}/replay				the inbox row into a new outbox row
 *	POST /inbox/{id}/requeue			dead -> pending; with {"payload": ...}
 *										replaced (audited, a source's onDead:
 *										holdKey)
 *	POST /inbox/{id}/skip				a dead row that holds its aggregate
 *										lets it go
 *	GET  /inbox/held?limit=N			aggregates held by a dead head
 *	POST /outbox/replay   {"state", "topicPattern", "since", "until"}
 *	POST /outbox/requeue  {"topicPattern", "since", "until"}
 *	POST /inbox/replay    {"state", "source", "since", "until"}
 *	POST /inbox/requeue   {"source", "since", "until"}
 *	POST /destinations/{name}/resume	close the circuit, clear failures and pause
 *	POST /destinations/{name}/pause		{"seconds": N}: nothing sent before then
 *	POST /destinations/{name}/reset		close the circuit, clear failures, keep a pause
 *	GET  /overview						the console's overview (qb_admin_overview)
 * Bulk forms keep per-key order (the SQL functions work in id or
 * created_at order).  Answers are JSON; errors carry a reason.  A query
 * parameter or body key a route does not take is a 400 that lists those it
 * takes; an empty query parameter is no filter.  Times are ISO 8601; one
 * without a zone is UTC, a date alone its midnight UTC.
 *
 * Every write is logged on the host (action, target, status, who: the
 * peer's address), and its query takes the actor as its last parameter,
 * which the store hands the database for the audit rows (qb_store.h).
 *
 * Transaction rules: each operation is one query_text call, so one
 * transaction of the store's.
 *-------------------------------------------------------------------------
 */
#include <ctype.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "qb_admin.h"
#include "qb_answer.h"

#define QBA_MAX_PARAMS	10
#define QBA_MAX_TEXT	400		/* a filter's bytes */

typedef enum QbaKind
{
	QBA_LIST,					/* GET: filters from the query string */
	QBA_ROW,					/* GET /table/{id} */
	QBA_LOOKUP,					/* GET: every query parameter required */
	QBA_BY_ID,					/* POST /table/{id}/verb */
	QBA_BULK,					/* POST /table/verb, a body of filters */
	QBA_DEST					/* POST /destinations/{name}/verb */
} QbaKind;

typedef struct QbaRoute
{
	const char *table;			/* "outbox" | "inbox" | "destinations" */
	const char *verb;			/* NULL: GET /table/{id} */
	bool		by_id;			/* an {id} or {name} in the path */
	QbaKind		kind;
	QbQuery		query;
	/* the query string's (GET) or the body's (POST) keys, in parameter order */
	const char *const *keys;
	long		max_limit;		/* QBA_LIST: the largest limit */
} QbaRoute;

static const char *const qba_none[] = {NULL};
static const char *const qba_dead_outbox_keys[] = {"destination", "topic", "key", "error", "since",
"until", "after", "limit", NULL};
static const char *const qba_dead_inbox_keys[] = {"source", "event_type", "idempotency_key",
"aggregate_id", "error", "since", "until", "after", "limit", NULL};
static const char *const qba_limit_keys[] = {"limit", NULL};
static const char *const qba_lookup_keys[] = {"source", "idempotency_key", NULL};
static const char *const qba_replay_outbox_keys[] = {"state", "topicPattern", "since", "until", NULL};
static const char *const qba_requeue_outbox_keys[] = {"topicPattern", "since", "until", NULL};
static const char *const qba_replay_inbox_keys[] = {"state", "source", "since", "until", NULL};
static const char *const qba_requeue_inbox_keys[] = {"source", "since", "until", NULL};
static const char *const qba_pause_keys[] = {"seconds", NULL};

static const QbaRoute qba_routes[] = {
	{.table = "outbox", .verb = "dead", .kind = QBA_LIST, .query = QB_Q_DEAD_OUTBOX,
	.keys = qba_dead_outbox_keys, .max_limit = 1000},
	{.table = "inbox", .verb = "dead", .kind = QBA_LIST, .query = QB_Q_DEAD_INBOX,
	.keys = qba_dead_inbox_keys, .max_limit = 1000},
	{.table = "outbox", .verb = "held", .kind = QBA_LIST, .query = QB_Q_HELD_KEYS,
	.keys = qba_limit_keys, .max_limit = 10000},
	{.table = "inbox", .verb = "held", .kind = QBA_LIST, .query = QB_Q_HELD_AGGREGATES,
	.keys = qba_limit_keys, .max_limit = 10000},
	{.table = "outbox", .by_id = true, .kind = QBA_ROW, .query = QB_Q_OUTBOX_ROW, .keys = qba_none},
	{.table = "inbox", .by_id = true, .kind = QBA_ROW, .query = QB_Q_INBOX_ROW, .keys = qba_none},
	{.table = "inbox", .verb = "lookup", .kind = QBA_LOOKUP, .query = QB_Q_INBOX_LOOKUP,
	.keys = qba_lookup_keys},
	{.table = "outbox", .verb = "replay", .by_id = true, .kind = QBA_BY_ID,
	.query = QB_Q_REPLAY_OUTBOX, .keys = qba_none},
	{.table = "outbox", .verb = "requeue", .by_id = true, .kind = QBA_BY_ID,
	.query = QB_Q_REQUEUE_OUTBOX, .keys = qba_none},
	{.table = "outbox", .verb = "skip", .by_id = true, .kind = QBA_BY_ID,
	.query = QB_Q_SKIP_OUTBOX, .keys = qba_none},
	{.table = "inbox", .verb = "replay", .by_id = true, .kind = QBA_BY_ID,
	.query = QB_Q_REPLAY_INBOX, .keys = qba_none},
	{.table = "inbox", .verb = "requeue", .by_id = true, .kind = QBA_BY_ID,
	.query = QB_Q_REQUEUE_INBOX, .keys = qba_none},
	{.table = "inbox", .verb = "skip", .by_id = true, .kind = QBA_BY_ID,
	.query = QB_Q_SKIP_INBOX, .keys = qba_none},
	{.table = "outbox", .verb = "replay", .kind = QBA_BULK, .query = QB_Q_REPLAY_OUTBOX_BULK,
	.keys = qba_replay_outbox_keys},
	{.table = "outbox", .verb = "requeue", .kind = QBA_BULK, .query = QB_Q_REQUEUE_OUTBOX_BULK,
	.keys = qba_requeue_outbox_keys},
	{.table = "inbox", .verb = "replay", .kind = QBA_BULK, .query = QB_Q_REPLAY_INBOX_BULK,
	.keys = qba_replay_inbox_keys},
	{.table = "inbox", .verb = "requeue", .kind = QBA_BULK, .query = QB_Q_REQUEUE_INBOX_BULK,
	.keys = qba_requeue_inbox_keys},
	{.table = "destinations", .verb = "resume", .by_id = true, .kind = QBA_DEST,
	.query = QB_Q_RESUME_DESTINATION, .keys = qba_none},
	{.table = "destinations", .verb = "pause", .by_id = true, .kind = QBA_DEST,
	.query = QB_Q_PAUSE_DESTINATION, .keys = qba_pause_keys},
	{.table = "destinations", .verb = "reset", .by_id = true, .kind = QBA_DEST,
	.query = QB_Q_RESET_DESTINATION, .keys = qba_none},
};

/* What one request carries through the handler: its route, path and parameters. */
typedef struct QbaCall
{
	const QbaRoute *rt;
	const QbAdminRequest *req;
	char		id[201];		/* the path's {id} or {name} */
	const char *params[QBA_MAX_PARAMS];
	char		bufs[QBA_MAX_PARAMS][64];	/* normalised ids, times, numbers */
	json_t	   *doc;			/* a POST body, when parsed */
	char	   *edited;			/* an edited requeue's payload */
	char		target[260];	/* for the log: "outbox row 42" */
} QbaCall;

static void
qba_error(QbAdminAnswer *ans, int code, const char *reason)
{
	ans->status = code;
	free(ans->body);
	ans->body = qb_answer("error", reason);
}

static bool
qba_get(const QbaRoute *rt)
{
	return rt->kind == QBA_LIST || rt->kind == QBA_ROW || rt->kind == QBA_LOOKUP;
}

/* qba_digits: a decimal of 1 to 18 digits. */
static bool
qba_digits(const char *s, size_t n)
{
	if (n == 0 || n > 18)
		return false;
	for (size_t i = 0; i < n; i++)
		if (!isdigit((unsigned char) s[i]))
			return false;
	return true;
}

/* qba_name: a destination name in a path: letters, digits, '-', '_', '.'. */
static bool
qba_name(const char *s, size_t n)
{
	if (n == 0 || n > 200)
		return false;
	for (size_t i = 0; i < n; i++)
		if (!isalnum((unsigned char) s[i]) && s[i] != '-' && s[i] != '_' && s[i] != '.')
			return false;
	return true;
}

/* qba_keys_list: "a, b, c" of a NULL-terminated key list. */
static void
qba_keys_list(const char *const *keys, char *out, size_t outlen)
{
	size_t		n = 0;

	out[0] = '\0';
	for (int k = 0; keys[k] != NULL && n < outlen; k++)
		n += snprintf(out + n, outlen - n, "%s%s", k > 0 ? ", " : "", keys[k]);
	if (keys[0] == NULL)
		snprintf(out, outlen, "none");
}

/* qba_key_index: key's place in rt->keys, or -1. */
static int
qba_key_index(const QbaRoute *rt, const char *key)
{
	for (int k = 0; rt->keys[k] != NULL; k++)
		if (strcmp(rt->keys[k], key) == 0)
			return k;
	return -1;
}

static void
qba_unknown_key(const QbaCall *c, const char *what, const char *key, QbAdminAnswer *ans)
{
	char		keys[200];
	char		reason[QB_ERRLEN];

	qba_keys_list(c->rt->keys, keys, sizeof(keys));
	snprintf(reason, sizeof(reason), "unknown %s \"%.64s\"; this route takes: %s", what, key, keys);
	qba_error(ans, 400, reason);
}

/*
 * qba_num2: n digits of s as a number from lo to hi, or -1.
 */
static int
qba_num2(const char *s, int n, int lo, int hi)
{
	int			v = 0;

	for (int i = 0; i < n; i++)
	{
		if (!isdigit((unsigned char) s[i]))
			return -1;
		v = v * 10 + (s[i] - '0');
	}
	return v < lo || v > hi ? -1 : v;
}

/*
 * qba_time: an ISO 8601 time (YYYY-MM-DD, then optionally T or space,
 * hh:mm, :ss, .fraction, and Z or a ±hh[:mm] offset) into out as the
 * stores take it: a date alone is its midnight, a time without a zone UTC.
 * False when s is not one.
 */
static bool
qba_time(const char *s, char *out, size_t outlen)
{
	const char *p = s;
	bool		zone = false;

	if (strlen(s) > 40 || qba_num2(p, 4, 1, 9999) < 0 || p[4] != '-' ||
		qba_num2(p + 5, 2, 1, 12) < 0 || p[7] != '-' || qba_num2(p + 8, 2, 1, 31) < 0)
		return false;
	p += 10;
	if (*p == '\0')
	{
		snprintf(out, outlen, "%.10sT00:00:00Z", s);
		return true;
	}
	if ((*p != 'T' && *p != 't' && *p != ' ') || qba_num2(p + 1, 2, 0, 23) < 0 || p[3] != ':' ||
		qba_num2(p + 4, 2, 0, 59) < 0)
		return false;
	p += 6;
	if (*p == ':')
	{
		if (qba_num2(p + 1, 2, 0, 60) < 0)
			return false;
		p += 3;
		if (*p == '.')
		{
			int			n = 0;

			for (p++; isdigit((unsigned char) *p); p++)
				n++;
			if (n == 0 || n > 9)
				return false;
		}
	}
	if (*p == 'Z' || *p == 'z')
	{
		zone = true;
		p++;
	}
	else if (*p == '+' || *p == '-')
	{
		if (qba_num2(p + 1, 2, 0, 23) < 0)
			return false;
		p += 3;
		if (*p == ':')
			p++;
		if (*p != '\0' && qba_num2(p, 2, 0, 59) < 0)
			return false;
		if (*p != '\0')
			p += 2;
		zone = true;
	}
	if (*p != '\0')
		return false;
	snprintf(out, outlen, "%s%s", s, zone ? "" : "Z");
	return true;
}

/*
 * qba_value: one parameter's value checked and normalised by its name
 * (limit, after, since, until, seconds; any other is a text filter); the
 * parameter is set to value or to the normalised copy in buf.  False with
 * the answer set.
 */
static bool
qba_value(const QbaCall *c, const char *name, const char *value, char *buf, size_t buflen,
		  const char **param, QbAdminAnswer *ans)
{
	char		reason[QB_ERRLEN];
	size_t		n = strlen(value);

	if (strcmp(name, "limit") == 0 || strcmp(name, "after") == 0 || strcmp(name, "seconds") == 0)
	{
		long		lo = strcmp(name, "after") == 0 ? 0 : 1;
		long		hi = strcmp(name, "limit") == 0 ? c->rt->max_limit :
			strcmp(name, "seconds") == 0 ? 31536000 : 999999999999999999L;

		if (!qba_digits(value, n) || atol(value) < lo || atol(value) > hi)
		{
			if (strcmp(name, "after") == 0)
				snprintf(reason, sizeof(reason), "after must be an id (a whole number from 0), the last id of the page before");
			else
				snprintf(reason, sizeof(reason), "%s must be a whole number from %ld to %ld", name, lo, hi);
			qba_error(ans, 400, reason);
			return false;
		}
		snprintf(buf, buflen, "%ld", atol(value));
		*param = buf;
		return true;
	}
	if (strcmp(name, "since") == 0 || strcmp(name, "until") == 0)
	{
		if (!qba_time(value, buf, buflen))
		{
			snprintf(reason, sizeof(reason),
					 "%s must be an ISO 8601 time, e.g. 2026-12-01T09:30:00Z or 2026-12-01 (UTC when no zone is given)",
					 name);
			qba_error(ans, 400, reason);
			return false;
		}
		*param = buf;
		return true;
	}
	if (n > QBA_MAX_TEXT)
	{
		snprintf(reason, sizeof(reason), "%s is longer than %d bytes", name, QBA_MAX_TEXT);
		qba_error(ans, 400, reason);
		return false;
	}
	*param = value;
	return true;
}

/*
 * qba_query_args: the query string's parameters into c->params, by
 * rt->keys' order.  An empty value is no filter; a key twice, or one the
 * route does not take, is a 400.
 */
static bool
qba_query_args(QbaCall *c, QbAdminAnswer *ans)
{
	const QbAdminRequest *req = c->req;
	char		reason[QB_ERRLEN];

	if (req->nargs > QB_ADMIN_MAX_ARGS)
	{
		snprintf(reason, sizeof(reason), "too many query parameters (at most %d)", QB_ADMIN_MAX_ARGS);
		qba_error(ans, 400, reason);
		return false;
	}
	for (int i = 0; i < req->nargs; i++)
	{
		const char *name = req->args[i].name;
		const char *value = req->args[i].value;
		int			k = qba_key_index(c->rt, name);

		if (k < 0)
		{
			qba_unknown_key(c, "query parameter", name, ans);
			return false;
		}
		for (int j = 0; j < i; j++)
			if (strcmp(req->args[j].name, name) == 0)
			{
				snprintf(reason, sizeof(reason), "query parameter \"%.64s\" is given twice", name);
				qba_error(ans, 400, reason);
				return false;
			}
		if (value == NULL || value[0] == '\0')
			continue;
		if (!qba_value(c, name, value, c->bufs[k], sizeof(c->bufs[k]), &c->params[k], ans))
			return false;
	}
	return true;
}

/*
 * qba_body_params: a POST body's keys into c->params (NULL when absent):
 * strings (the bulk filters) or, for "seconds", a whole number.  Strings
 * are borrowed from c->doc.  An empty body is no key.
 */
static bool
qba_body_params(QbaCall *c, QbAdminAnswer *ans)
{
	const QbAdminRequest *req = c->req;
	json_error_t jerr;
	const char *key;
	json_t	   *v;
	char		reason[QB_ERRLEN];

	/* json_pack, not json_object(): inside the server that name is PostgreSQL's */
	c->doc = req->body_len > 0 ? json_loadb(req->body, req->body_len, 0, &jerr) : json_pack("{}");
	if (c->doc == NULL)
	{
		snprintf(reason, sizeof(reason), "the body is not valid JSON: %s at line %d, column %d",
				 jerr.text, jerr.line, jerr.column);
		qba_error(ans, 400, reason);
		return false;
	}
	if (!json_is_object(c->doc))
	{
		qba_error(ans, 400, c->rt->kind == QBA_BULK ?
				  "the body must be a JSON object of filters, e.g. {\"source\": \"stripe\"}" :
				  "the body must be a JSON object, e.g. {\"seconds\": 600}");
		return false;
	}
	json_object_foreach(c->doc, key, v)
	{
		int			k = qba_key_index(c->rt, key);

		if (k < 0)
		{
			qba_unknown_key(c, "key", key, ans);
			return false;
		}
		if (strcmp(key, "seconds") == 0)
		{
			if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > 31536000)
			{
				qba_error(ans, 400, "seconds must be a whole number from 1 to 31536000 (a year)");
				return false;
			}
			snprintf(c->bufs[k], sizeof(c->bufs[k]), "%lld", (long long) json_integer_value(v));
			c->params[k] = c->bufs[k];
			continue;
		}
		if (!json_is_string(v) && !json_is_null(v))
		{
			snprintf(reason, sizeof(reason), "%s must be a string (timestamps as ISO 8601, e.g. \"2026-11-30T00:00:00Z\")", key);
			qba_error(ans, 400, reason);
			return false;
		}
		c->params[k] = json_string_value(v);
	}
	return true;
}

/*
 * qba_edited_payload: the body of an edited requeue, {"payload": <JSON>},
 * into c->edited as compact JSON text (malloc'd).  False with the answer set.
 */
static bool
qba_edited_payload(QbaCall *c, QbAdminAnswer *ans)
{
	json_error_t jerr;
	json_t	   *doc = json_loadb(c->req->body, c->req->body_len, JSON_DECODE_ANY, &jerr);
	json_t	   *p;
	const char *key;
	json_t	   *v;
	char		reason[QB_ERRLEN];

	if (doc == NULL)
	{
		snprintf(reason, sizeof(reason), "the body is not valid JSON: %s at line %d, column %d",
				 jerr.text, jerr.line, jerr.column);
		qba_error(ans, 400, reason);
		return false;
	}
	if (!json_is_object(doc) || (p = json_object_get(doc, "payload")) == NULL)
	{
		json_decref(doc);
		qba_error(ans, 400,
				  "the body must be {\"payload\": <the edited payload>}, or empty to requeue the row as it is");
		return false;
	}
	json_object_foreach(doc, key, v)
	{
		if (strcmp(key, "payload") != 0)
		{
			snprintf(reason, sizeof(reason), "unknown key \"%.64s\"; this operation takes payload", key);
			json_decref(doc);
			qba_error(ans, 400, reason);
			return false;
		}
	}
	c->edited = json_dumps(p, JSON_COMPACT | JSON_ENCODE_ANY);
	json_decref(doc);
	if (c->edited == NULL)
	{
		qba_error(ans, 503, "out of memory");
		return false;
	}
	return true;
}

/*
 * qba_route: the route of method and path ("/table/verb", "/table/{id}",
 * "/table/{id}/verb"), its {id} into c->id.  False with the answer set.
 */
static bool
qba_route(QbaCall *c, QbAdminAnswer *ans)
{
	const char *seg[3] = {NULL, NULL, NULL};
	size_t		len[3] = {0, 0, 0};
	int			nseg = 0;
	const char *verb;
	size_t		verblen;
	bool		by_id;

	/* the path's segments: "/a/b/c" has three; a fourth is no route */
	for (const char *p = c->req->path; *p == '/'; nseg++)
	{
		const char *end = strchr(p + 1, '/');

		if (nseg == 3)
		{
			nseg = 0;
			break;
		}
		seg[nseg] = p + 1;
		len[nseg] = end ? (size_t) (end - p - 1) : strlen(p + 1);
		p = seg[nseg] + len[nseg];
	}
	/* "/table/{id}" when the second segment is a number */
	by_id = nseg == 3 || (nseg == 2 && qba_digits(seg[1], len[1]));
	verb = nseg == 3 ? seg[2] : (nseg == 2 && !by_id ? seg[1] : NULL);
	verblen = nseg == 3 ? len[2] : len[1];
	c->rt = NULL;
	for (size_t i = 0; nseg >= 2 && nseg <= 3 && i < sizeof(qba_routes) / sizeof(qba_routes[0]); i++)
	{
		const QbaRoute *rt = &qba_routes[i];

		if (strlen(rt->table) == len[0] && strncmp(rt->table, seg[0], len[0]) == 0 &&
			rt->by_id == by_id &&
			(rt->verb == NULL ? verb == NULL :
			 verb != NULL && strlen(rt->verb) == verblen && strncmp(rt->verb, verb, verblen) == 0))
			c->rt = rt;
	}
	if (c->rt == NULL)
	{
		qba_error(ans, 404,
				  "no such admin route; see docs/http-api.md (outbox|inbox/dead, outbox|inbox/held, outbox|inbox/{id},"
				  " inbox/lookup, outbox|inbox/{id}/replay|requeue|skip, outbox|inbox/replay|requeue,"
				  " destinations/{name}/resume|pause|reset, overview)");
		return false;
	}
	if (strcmp(c->req->method, qba_get(c->rt) ? "GET" : "POST") != 0 &&
		!(qba_get(c->rt) && strcmp(c->req->method, "HEAD") == 0))
	{
		qba_error(ans, 405, qba_get(c->rt) ? "use GET" : "use POST");
		return false;
	}
	if (c->rt->by_id)
	{
		bool		dest = c->rt->kind == QBA_DEST;

		if (dest ? !qba_name(seg[1], len[1]) : !qba_digits(seg[1], len[1]))
		{
			qba_error(ans, 400, dest ?
					  "the destination name in the path must be 1 to 200 letters, digits, '-', '_' or '.'" :
					  "the id in the path must be a positive integer");
			return false;
		}
		memcpy(c->id, seg[1], len[1]);
		c->id[len[1]] = '\0';
		snprintf(c->target, sizeof(c->target), "%s %s", dest ? "destination" : c->rt->table, c->id);
	}
	else
		snprintf(c->target, sizeof(c->target), "%s rows", c->rt->table);
	return true;
}

/* qba_no_body: a body on a route that takes none: say so rather than act without it */
static void
qba_no_body(QbAdminAnswer *ans)
{
	qba_error(ans, 400, "this operation takes no body; only requeue ({\"payload\": ...}) and pause ({\"seconds\": N}) take one");
}

/* qba_params_list: a list's or a lookup's, from the query string */
static bool
qba_params_list(QbaCall *c, int nkeys, QbAdminAnswer *ans)
{
	if (!qba_query_args(c, ans))
		return false;
	for (int k = 0; c->rt->kind == QBA_LOOKUP && k < nkeys; k++)
		if (c->params[k] == NULL)
		{
			char		reason[QB_ERRLEN];

			snprintf(reason, sizeof(reason), "%s is required (this route takes source and idempotency_key)",
					 c->rt->keys[k]);
			qba_error(ans, 400, reason);
			return false;
		}
	return true;
}

/* qba_params_by_id: a row's id, the edited payload of a requeue, the actor */
static bool
qba_params_by_id(QbaCall *c, QbAdminAnswer *ans)
{
	int			next = 1;

	c->params[0] = c->id;
	if (c->req->body_len > 0 &&
		c->rt->query != QB_Q_REQUEUE_OUTBOX && c->rt->query != QB_Q_REQUEUE_INBOX)
	{
		qba_no_body(ans);
		return false;
	}
	if (c->req->body_len > 0)
	{
		/* {"payload": <any JSON>}: an edited requeue */
		if (!qba_edited_payload(c, ans))
			return false;
		c->params[next++] = c->edited;
	}
	c->params[next] = c->req->actor;
	return true;
}

/* qba_params_dest: a destination's name, its body's keys, the actor */
static bool
qba_params_dest(QbaCall *c, int nkeys, QbAdminAnswer *ans)
{
	c->params[0] = c->id;
	if (nkeys == 0 && c->req->body_len > 0)
	{
		qba_no_body(ans);
		return false;
	}
	if (nkeys > 0)
	{
		/* the body's keys (in params from 0), then moved after the name */
		c->params[0] = NULL;
		if (!qba_body_params(c, ans))
			return false;
		for (int k = nkeys; k > 0; k--)
			c->params[k] = c->params[k - 1];
		c->params[0] = c->id;
		if (c->params[1] == NULL)
		{
			qba_error(ans, 400, "the body must be {\"seconds\": N}, N from 1 to 31536000");
			return false;
		}
	}
	c->params[1 + nkeys] = c->req->actor;
	return true;
}

/* qba_params: the query's parameters from the path, query string and body. */
static bool
qba_params(QbaCall *c, QbAdminAnswer *ans)
{
	int			nkeys = 0;

	while (c->rt->keys[nkeys] != NULL)
		nkeys++;
	/* a POST takes no query parameter; a GET no body key */
	if (!qba_get(c->rt) && c->req->nargs > 0)
	{
		char		reason[QB_ERRLEN];

		snprintf(reason, sizeof(reason),
				 "unknown query parameter \"%.64s\"; a POST takes its parameters in its body",
				 c->req->args[0].name);
		qba_error(ans, 400, reason);
		return false;
	}
	switch (c->rt->kind)
	{
		case QBA_LIST:
		case QBA_LOOKUP:
			return qba_params_list(c, nkeys, ans);
		case QBA_ROW:
			if (c->req->nargs > 0)
			{
				qba_unknown_key(c, "query parameter", c->req->args[0].name, ans);
				return false;
			}
			c->params[0] = c->id;
			return true;
		case QBA_BY_ID:
			return qba_params_by_id(c, ans);
		case QBA_DEST:
			return qba_params_dest(c, nkeys, ans);
		case QBA_BULK:
			if (!qba_body_params(c, ans))
				return false;
			c->params[nkeys] = c->req->actor;
			return true;
	}
	return false;
}

/*
 * qba_nothing: a by-id answer that found nothing ({"id": null},
 * {"requeued": false}, or a destination the configuration does not have).
 */
static bool
qba_nothing(const char *out)
{
	json_t	   *o = json_loads(out, 0, NULL);
	bool		none;

	if (o == NULL)
		return false;
	none = json_is_null(json_object_get(o, "id")) || json_is_false(json_object_get(o, "requeued")) ||
		json_is_false(json_object_get(o, "known")) || json_is_false(json_object_get(o, "skipped"));
	json_decref(o);
	return none;
}

/* qba_not_found: the 404 reason of a route whose target is not there. */
static const char *
qba_not_found(const QbaCall *c, char *buf, size_t buflen)
{
	if (c->rt->kind == QBA_DEST)
		return "no destination of this name in the configuration";
	if (c->rt->kind == QBA_LOOKUP)
	{
		snprintf(buf, buflen, "no row from source %.200s with idempotency key %.200s: it did not arrive,"
				 " or retention has deleted it", c->params[0], c->params[1]);
		return buf;
	}
	if (c->rt->kind == QBA_ROW)
	{
		snprintf(buf, buflen, "no %s row with id %s", c->rt->table, c->id);
		return buf;
	}
	if (strcmp(c->rt->verb, "requeue") == 0)
		return "no dead row with this id (only dead rows can be requeued)";
	if (strcmp(c->rt->verb, "skip") == 0)
		return strcmp(c->rt->table, "inbox") == 0 ?
			"no dead row with this id that holds its aggregate (only such rows can be skipped)" :
			"no dead row with this id that holds its key (only such rows can be skipped)";
	return "no row with this id";
}

/*
 * qba_page: a dead list's {"rows": [...], "next_after": id} into the
 * answer: the array as the body, next_after as the header's value.
 */
static void
qba_page(char *out, QbAdminAnswer *ans)
{
	json_t	   *o = json_loads(out, 0, NULL);
	json_t	   *next = o ? json_object_get(o, "next_after") : NULL;

	if (o == NULL || !json_is_array(json_object_get(o, "rows")) ||
		(ans->body = json_dumps(json_object_get(o, "rows"), JSON_COMPACT)) == NULL)
	{
		json_decref(o);
		qba_error(ans, 503, "the dead rows' page is not JSON");
		return;
	}
	ans->status = 200;
	if (json_is_integer(next))
		snprintf(ans->next_after, sizeof(ans->next_after), "%lld", (long long) json_integer_value(next));
	json_decref(o);
}

/* qba_answer: the store's result into the answer. */
static void
qba_answer(const QbaCall *c, int rc, char *out, const char *err, QbAdminAnswer *ans)
{
	char		reason[QB_ERRLEN + 64];

	if (rc == QB_QUERY_BAD_INPUT)
		qba_error(ans, 422, err);
	else if (rc == QB_QUERY_NOT_FOUND)
		qba_error(ans, 404, c->rt->kind == QBA_DEST ? qba_not_found(c, reason, sizeof(reason)) : err);
	else if (rc != 0)
	{
		snprintf(reason, sizeof(reason), "database unavailable: %s", err);
		ans->status = 503;
		free(ans->body);
		ans->body = qb_answer("unavailable", reason);
	}
	else if (out == NULL && (c->rt->kind == QBA_ROW || c->rt->kind == QBA_LOOKUP))
		qba_error(ans, 404, qba_not_found(c, reason, sizeof(reason)));
	else if (out == NULL)
		qba_error(ans, 503, "the query returned nothing");
	else if (c->rt->query == QB_Q_DEAD_OUTBOX || c->rt->query == QB_Q_DEAD_INBOX)
		qba_page(out, ans);
	else if ((c->rt->kind == QBA_BY_ID || c->rt->kind == QBA_DEST) && qba_nothing(out))
		qba_error(ans, 404, qba_not_found(c, reason, sizeof(reason)));
	else
	{
		ans->status = 200;
		ans->body = strdup(out);
		if (ans->body == NULL)
			qba_error(ans, 503, "out of memory");
	}
}

/*
 * qba_log: one line per write: the action, its target, the status (and
 * the answer when it succeeded: a flag or a count, never a payload), who.
 */
static void
qba_log(const QbHost *host, const QbaCall *c, const QbAdminAnswer *ans)
{
	const char *detail = ans->status == 200 && ans->body != NULL && strlen(ans->body) < 120 ? ans->body : "";

	if (host == NULL)
		return;
	qb_log(host, ans->status == 200 ? QB_LOG_INFO : QB_LOG_WARNING,
		   "admin: %s %s%s%s%s: %d%s%s (%s)", c->rt->verb, c->target,
		   c->rt->query == QB_Q_PAUSE_DESTINATION && c->params[1] ? " for " : "",
		   c->rt->query == QB_Q_PAUSE_DESTINATION && c->params[1] ? c->params[1] : "",
		   c->rt->query == QB_Q_PAUSE_DESTINATION && c->params[1] ? " s" : "",
		   ans->status, detail[0] ? " " : "", detail, c->req->actor ? c->req->actor : "unknown peer");
}

void
qb_admin_handle(const QbHost *host, const QbStore *store, long timeout_ms,
				const QbAdminRequest *req, QbAdminAnswer *ans)
{
	QbaCall		c = {.req = req};
	char		err[QB_ERRLEN] = "";
	char	   *out = NULL;
	QbQuery		query;
	int			rc;

	ans->status = 0;
	ans->body = NULL;
	ans->next_after[0] = '\0';
	if (!qba_route(&c, ans))
		return;
	if (qba_params(&c, ans))
	{
		query = c.edited == NULL ? c.rt->query :
			c.rt->query == QB_Q_REQUEUE_OUTBOX ? QB_Q_REQUEUE_OUTBOX_EDITED : QB_Q_REQUEUE_INBOX_EDITED;
		rc = store->query_text(store->ctx, query, c.params, timeout_ms, &out, err, sizeof(err));
		qba_answer(&c, rc, out, err, ans);
		free(out);
	}
	if (!qba_get(c.rt))
		qba_log(host, &c, ans);
	free(c.edited);
	json_decref(c.doc);
}

/* qba_time_ms: ms since the epoch as ISO 8601 UTC text, JSON null for 0 */
static json_t *
qba_time_ms(int64_t ms)
{
	time_t		t = (time_t) (ms / 1000);
	struct tm	tm;
	char		buf[80];

	if (ms <= 0 || gmtime_r(&t, &tm) == NULL)
		return json_null();
	snprintf(buf, sizeof(buf), "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1,
			 tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, (int) (ms % 1000));
	return json_string(buf);
}

/*
 * qba_workers: every worker slot in use, in slot order: what each worker
 * is doing and since when.  A worker whose process is gone without
 * stopping cleanly (killed; its replacement takes the slot again when it
 * starts) shows as "gone".
 */
static json_t *
qba_workers(const QbMetrics *m)
{
	json_t	   *a = json_array();

	for (int i = 0; m != NULL && i < QB_METRICS_WORKERS; i++)
	{
		const QbActivitySlot *w = &m->workers[i];
		int			pid = __atomic_load_n(&w->pid, __ATOMIC_RELAXED);
		uint32_t	act = __atomic_load_n(&w->activity, __ATOMIC_RELAXED);
		bool		alive = pid > 0 && (kill(pid, 0) == 0 || errno == EPERM);

		if (__atomic_load_n(&w->state, __ATOMIC_ACQUIRE) != QB_SLOT_IN_USE)
			continue;
		json_array_append_new(a, json_pack("{s:s,s:i,s:s,s:o,s:o,s:o}",
										   "name", w->name, "pid", pid,
										   "state", !alive && act != QB_W_STOPPED ? "gone" :
										   qb_worker_activity_name((QbWorkerActivity) act),
										   "since", qba_time_ms(__atomic_load_n(&w->since_ms, __ATOMIC_RELAXED)),
										   "last_cycle", qba_time_ms(__atomic_load_n(&w->last_cycle_ms, __ATOMIC_RELAXED)),
										   "cycles", json_integer((json_int_t) __atomic_load_n(&w->cycles, __ATOMIC_RELAXED))));
	}
	return a;
}

/* qba_count: a counter as a JSON integer (counters stay far below 2^63) */
static json_t *
qba_count(uint64_t n)
{
	return json_integer((json_int_t) n);
}

/*
 * qba_limit: a destination's limits as the overview shows them, or null:
 * {"perSecond", "burst"} of its rateLimit, "maxConcurrent" and the places
 * "inUse" now (every worker of this server), each only when set.
 */
static json_t *
qba_limit(const QbConfig *cfg, const char *name, const QbLimits *limits)
{
	const QbDestination *d = name != NULL ? qb_config_destination(cfg, name) : NULL;
	json_t	   *o;

	/* json_pack, not json_object(): inside the server that name is PostgreSQL's */
	if (d == NULL || !qb_limits_set(&d->limit) || (o = json_pack("{}")) == NULL)
		return json_null();
	if (d->limit.rate.per_sec > 0)
	{
		double		ps = d->limit.rate.per_sec;

		/* 50, not 50.0: as the document says it */
		json_object_set_new(o, "perSecond", ps == (json_int_t) ps ?
							json_integer((json_int_t) ps) : json_real(ps));
		json_object_set_new(o, "burst", json_integer(d->limit.rate.burst));
	}
	if (d->limit.max_concurrent > 0)
	{
		json_object_set_new(o, "maxConcurrent", json_integer(d->limit.max_concurrent));
		json_object_set_new(o, "inUse", json_integer(qb_limits_in_use(limits, name)));
	}
	return o;
}

void
qb_admin_overview(const QbStore *store, long timeout_ms, const char *method,
				  const QbConfig *cfg, const QbMetrics *metrics, const QbLimits *limits,
				  int *status, char **answer)
{
	char		err[QB_ERRLEN];
	char	   *out = NULL;
	json_t	   *o,
			   *dests,
			   *sources,
			   *d;
	size_t		i;
	uint64_t	c[QB_NRESULTS];

	*status = 0;
	*answer = NULL;
	if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0)
	{
		*status = 405;
		*answer = qb_answer("error", "use GET");
		return;
	}
	if (store->query_text(store->ctx, QB_Q_OVERVIEW, NULL, timeout_ms, &out, err, sizeof(err)) != 0 ||
		out == NULL || (o = json_loads(out, 0, NULL)) == NULL)
	{
		char		reason[QB_ERRLEN + 64];

		snprintf(reason, sizeof(reason), "database unavailable: %s", out == NULL ? err : "the overview is not JSON");
		free(out);
		*status = 503;
		*answer = qb_answer("unavailable", reason);
		return;
	}
	free(out);
	dests = json_object_get(o, "destinations");
	json_array_foreach(dests, i, d)
	{
		const char *name = json_string_value(json_object_get(d, "destination"));

		qb_metrics_counts(metrics, false, name ? name : "", c);
		json_object_set_new(d, "delivered", qba_count(c[QB_DELIVERED]));
		json_object_set_new(d, "failed", qba_count(c[QB_FAILED]));
		json_object_set_new(d, "dead", qba_count(c[QB_DEAD]));
		json_object_set_new(d, "limit", qba_limit(cfg, name, limits));
		json_object_set_new(d, "limit_waits", qba_count(c[QB_LIMITED]));
	}
	sources = json_array();
	for (int k = 0; k < cfg->nsources; k++)
	{
		qb_metrics_counts(metrics, true, cfg->sources[k].name, c);
		json_array_append_new(sources, json_pack("{s:s,s:o,s:o,s:o,s:o}",
												 "name", cfg->sources[k].name,
												 "received", qba_count(c[QB_RX_ACCEPTED]),
												 "duplicates", qba_count(c[QB_RX_DUPLICATE]),
												 "refused", qba_count(c[QB_RX_BAD_REQUEST] + c[QB_RX_UNAUTHORIZED] +
																	  c[QB_RX_TOO_LARGE] + c[QB_RX_UNPROCESSABLE]),
												 "unavailable", qba_count(c[QB_RX_UNAVAILABLE])));
	}
	json_object_set_new(o, "sources", sources);
	json_object_set_new(o, "workers", qba_workers(metrics));
	*answer = json_dumps(o, JSON_COMPACT);
	*status = *answer != NULL ? 200 : 503;
	if (*answer == NULL)
		*answer = qb_answer("unavailable", "out of memory; retry later");
	json_decref(o);
}
