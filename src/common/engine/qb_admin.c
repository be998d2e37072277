/*-------------------------------------------------------------------------
 * qb_admin.c
 *	  The /admin/ routes: list dead rows, replay and requeue, one row or in
 *	  bulk, over the same SQL functions an operator can call by hand.
 *
 * Routes (after /admin; the caller has checked the bearer token):
 *	GET  /outbox/dead?limit=N			dead outbox rows, oldest id first
 *	GET  /inbox/dead?limit=N			dead inbox rows
 *	POST /outbox/{id}/replay			a new outbox row, new message_id
 *	POST /outbox/{id}/requeue			dead -> pending, attempts reset; with a
 *										body {"payload": ...} the payload is
 *										replaced (audited, onDead: holdKey)
 *	POST /outbox/{id}/skip				a dead row that holds its key lets it go
 *	GET  /outbox/held?limit=N			keys held by a dead or retrying head
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
 *	POST /destinations/{name}/resume	close a destination's circuit (after
 *										a 410 Gone); its held rows flow again
 *	GET  /overview						the console's overview (qb_admin_overview)
 * Bulk forms keep per-key order (the SQL functions work in id or
 * created_at order).  Answers are JSON; errors carry a reason.
 *
 * Transaction rules: each operation is one query_text call, so one
 * transaction of the store's.
 *-------------------------------------------------------------------------
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "qb_admin.h"
#include "qb_answer.h"

typedef struct QbaRoute
{
	const char *table;			/* "outbox" | "inbox" */
	const char *verb;			/* "replay" | "requeue" | "dead" */
	bool		by_id;
	QbQuery		query;
	const char *const keys[4];	/* bulk body keys, in parameter order */
} QbaRoute;

static const QbaRoute qba_routes[] = {
	{"outbox", "dead", false, QB_Q_DEAD_OUTBOX, {NULL}},
	{"outbox", "held", false, QB_Q_HELD_KEYS, {NULL}},
	{"outbox", "skip", true, QB_Q_SKIP_OUTBOX, {NULL}},
	{"inbox", "dead", false, QB_Q_DEAD_INBOX, {NULL}},
	{"inbox", "held", false, QB_Q_HELD_AGGREGATES, {NULL}},
	{"inbox", "skip", true, QB_Q_SKIP_INBOX, {NULL}},
	{"outbox", "replay", true, QB_Q_REPLAY_OUTBOX, {NULL}},
	{"outbox", "requeue", true, QB_Q_REQUEUE_OUTBOX, {NULL}},
	{"inbox", "replay", true, QB_Q_REPLAY_INBOX, {NULL}},
	{"inbox", "requeue", true, QB_Q_REQUEUE_INBOX, {NULL}},
	{"outbox", "replay", false, QB_Q_REPLAY_OUTBOX_BULK, {"state", "topicPattern", "since", "until"}},
	{"outbox", "requeue", false, QB_Q_REQUEUE_OUTBOX_BULK, {"topicPattern", "since", "until"}},
	{"inbox", "replay", false, QB_Q_REPLAY_INBOX_BULK, {"state", "source", "since", "until"}},
	{"inbox", "requeue", false, QB_Q_REQUEUE_INBOX_BULK, {"source", "since", "until"}},
	{"destinations", "resume", true, QB_Q_RESUME_DESTINATION, {NULL}},
};

static void
qba_error(int *status, char **answer, int code, const char *reason)
{
	*status = code;
	*answer = qb_answer("error", reason);
}

/* qba_digits: a positive decimal id of at most 18 digits. */
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

/*
 * qba_body_params: the bulk body's keys into params (NULL when absent).
 * Strings are borrowed from doc.  False with the answer set.
 */
static bool
qba_body_params(const QbaRoute *rt, json_t *doc, const char **params, int *status,
				char **answer)
{
	const char *key;
	json_t	   *v;
	char		reason[256];

	if (!json_is_object(doc))
	{
		qba_error(status, answer, 400, "the body must be a JSON object of filters, e.g. {\"source\": \"stripe\"}");
		return false;
	}
	json_object_foreach(doc, key, v)
	{
		int			k;

		for (k = 0; k < 4 && rt->keys[k] != NULL; k++)
			if (strcmp(rt->keys[k], key) == 0)
				break;
		if (k == 4 || rt->keys[k] == NULL)
		{
			snprintf(reason, sizeof(reason), "unknown key \"%.64s\"; this operation takes %s%s%s%s%s%s%s",
					 key, rt->keys[0], rt->keys[1] ? ", " : "", rt->keys[1] ? rt->keys[1] : "",
					 rt->keys[2] ? ", " : "", rt->keys[2] ? rt->keys[2] : "",
					 rt->keys[3] ? ", " : "", rt->keys[3] ? rt->keys[3] : "");
			qba_error(status, answer, 400, reason);
			return false;
		}
		if (!json_is_string(v) && !json_is_null(v))
		{
			snprintf(reason, sizeof(reason), "%s must be a string (timestamps as ISO 8601, e.g. \"2026-11-30T00:00:00Z\")", key);
			qba_error(status, answer, 400, reason);
			return false;
		}
		params[k] = json_string_value(v);
	}
	return true;
}

/*
 * qba_edited_payload: the body of an edited requeue, {"payload": <JSON>},
 * into *payload as compact JSON text (malloc'd).  False with the answer set.
 */
static bool
qba_edited_payload(const char *body, size_t body_len, char **payload, int *status, char **answer)
{
	json_error_t jerr;
	json_t	   *doc = json_loadb(body, body_len, JSON_DECODE_ANY, &jerr);
	json_t	   *p;
	const char *key;
	json_t	   *v;
	char		reason[300];

	*payload = NULL;
	if (doc == NULL)
	{
		snprintf(reason, sizeof(reason), "the body is not valid JSON: %s at line %d, column %d",
				 jerr.text, jerr.line, jerr.column);
		qba_error(status, answer, 400, reason);
		return false;
	}
	if (!json_is_object(doc) || (p = json_object_get(doc, "payload")) == NULL)
	{
		json_decref(doc);
		qba_error(status, answer, 400,
				  "the body must be {\"payload\": <the edited payload>}, or empty to requeue the row as it is");
		return false;
	}
	json_object_foreach(doc, key, v)
	{
		if (strcmp(key, "payload") != 0)
		{
			snprintf(reason, sizeof(reason), "unknown key \"%.64s\"; this operation takes payload", key);
			json_decref(doc);
			qba_error(status, answer, 400, reason);
			return false;
		}
	}
	*payload = json_dumps(p, JSON_COMPACT | JSON_ENCODE_ANY);
	json_decref(doc);
	if (*payload == NULL)
	{
		qba_error(status, answer, 503, "out of memory");
		return false;
	}
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

void
qb_admin_handle(const QbStore *store, long timeout_ms, const char *method, const char *path,
				const char *query_limit, const char *body, size_t body_len,
				int *status, char **answer)
{
	char		table[16] = "",
				verb[16] = "";
	const char *id = NULL;
	size_t		idlen = 0;
	const char *p = path;
	const char *slash;
	const QbaRoute *rt = NULL;
	const char *params[4] = {NULL, NULL, NULL, NULL};
	json_t	   *doc = NULL;
	char		err[512];
	char	   *out = NULL;
	char	   *edited = NULL;
	bool		get;
	int			rc;

	*status = 0;
	*answer = NULL;
	/* "/table/verb" or "/table/id/verb" */
	if (*p == '/' && (slash = strchr(p + 1, '/')) != NULL && (size_t) (slash - p - 1) < sizeof(table))
	{
		memcpy(table, p + 1, slash - p - 1);
		p = slash;
		if ((slash = strchr(p + 1, '/')) != NULL)
		{
			id = p + 1;
			idlen = slash - p - 1;
			p = slash;
		}
		if (strlen(p + 1) < sizeof(verb) && strchr(p + 1, '/') == NULL)
			strcpy(verb, p + 1);
	}
	for (size_t i = 0; i < sizeof(qba_routes) / sizeof(qba_routes[0]); i++)
		if (strcmp(qba_routes[i].table, table) == 0 && strcmp(qba_routes[i].verb, verb) == 0 &&
			qba_routes[i].by_id == (id != NULL))
			rt = &qba_routes[i];
	if (rt == NULL)
	{
		qba_error(status, answer, 404,
				  "no such admin route; see docs/http-api.md (outbox|inbox/dead, outbox|inbox/held, outbox|inbox/{id}/replay|requeue|skip, outbox|inbox/replay|requeue, destinations/{name}/resume, overview)");
		return;
	}
	get = rt->query == QB_Q_DEAD_OUTBOX || rt->query == QB_Q_DEAD_INBOX || rt->query == QB_Q_HELD_KEYS ||
		rt->query == QB_Q_HELD_AGGREGATES;
	if (strcmp(method, get ? "GET" : "POST") != 0)
	{
		qba_error(status, answer, 405, get ? "use GET" : "use POST");
		return;
	}
	if (rt->query == QB_Q_RESUME_DESTINATION)
	{
		char		name[201];

		if (!qba_name(id, idlen))
		{
			qba_error(status, answer, 400,
					  "the destination name in the path must be 1 to 200 letters, digits, '-', '_' or '.'");
			return;
		}
		memcpy(name, id, idlen);
		name[idlen] = '\0';
		params[0] = name;
		rc = store->query_text(store->ctx, rt->query, params, timeout_ms, &out, err, sizeof(err));
	}
	else if (rt->by_id)
	{
		char		idbuf[20];

		if (!qba_digits(id, idlen))
		{
			qba_error(status, answer, 400, "the id in the path must be a positive integer");
			return;
		}
		memcpy(idbuf, id, idlen);
		idbuf[idlen] = '\0';
		params[0] = idbuf;
		if ((rt->query == QB_Q_REQUEUE_OUTBOX || rt->query == QB_Q_REQUEUE_INBOX) && body_len > 0)
		{
			/* {"payload": <any JSON>}: an edited requeue */
			if (!qba_edited_payload(body, body_len, &edited, status, answer))
				return;
			params[1] = edited;
			rc = store->query_text(store->ctx, rt->query == QB_Q_REQUEUE_OUTBOX ?
								   QB_Q_REQUEUE_OUTBOX_EDITED : QB_Q_REQUEUE_INBOX_EDITED,
								   params, timeout_ms, &out, err, sizeof(err));
			free(edited);
		}
		else
			rc = store->query_text(store->ctx, rt->query, params, timeout_ms, &out, err, sizeof(err));
	}
	else if (rt->keys[0] == NULL)
	{
		if (query_limit != NULL && (!qba_digits(query_limit, strlen(query_limit)) ||
									atol(query_limit) < 1 || atol(query_limit) > 10000))
		{
			qba_error(status, answer, 400, "limit must be an integer from 1 to 10000");
			return;
		}
		params[0] = query_limit;
		rc = store->query_text(store->ctx, rt->query, params, timeout_ms, &out, err, sizeof(err));
	}
	else
	{
		json_error_t jerr;

		doc = body_len > 0 ? json_loadb(body, body_len, 0, &jerr) : json_pack("{}");
		if (doc == NULL)
		{
			char		reason[300];

			snprintf(reason, sizeof(reason), "the body is not valid JSON: %s at line %d, column %d",
					 jerr.text, jerr.line, jerr.column);
			qba_error(status, answer, 400, reason);
			return;
		}
		if (!qba_body_params(rt, doc, params, status, answer))
		{
			json_decref(doc);
			return;
		}
		rc = store->query_text(store->ctx, rt->query, params, timeout_ms, &out, err, sizeof(err));
		json_decref(doc);
	}

	if (rc == QB_QUERY_BAD_INPUT)
		qba_error(status, answer, 422, err);
	else if (rc == QB_QUERY_NOT_FOUND)
		qba_error(status, answer, 404, err);
	else if (rc != 0)
	{
		char		reason[600];

		snprintf(reason, sizeof(reason), "database unavailable: %s", err);
		*status = 503;
		*answer = qb_answer("unavailable", reason);
	}
	else if (out == NULL)
		qba_error(status, answer, 503, "the query returned nothing");
	else if (rt->by_id && qba_nothing(out))
	{
		qba_error(status, answer, 404,
				  rt->query == QB_Q_RESUME_DESTINATION ? "no destination of this name in the configuration" :
				  strcmp(verb, "requeue") == 0 ? "no dead row with this id (only dead rows can be requeued)" :
				  strcmp(verb, "skip") == 0 ?
				  (strcmp(table, "inbox") == 0 ?
				   "no dead row with this id that holds its aggregate (only such rows can be skipped)" :
				   "no dead row with this id that holds its key (only such rows can be skipped)")
				  : "no row with this id");
	}
	else
	{
		*status = 200;
		*answer = out;
		out = NULL;
	}
	free(out);
}

/* qba_count: a counter as a JSON integer (counters stay far below 2^63) */
static json_t *
qba_count(uint64_t n)
{
	return json_integer((json_int_t) n);
}

void
qb_admin_overview(const QbStore *store, long timeout_ms, const char *method,
				  const QbConfig *cfg, const QbMetrics *metrics, int *status, char **answer)
{
	char		err[512];
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
		qba_error(status, answer, 405, "use GET");
		return;
	}
	if (store->query_text(store->ctx, QB_Q_OVERVIEW, NULL, timeout_ms, &out, err, sizeof(err)) != 0 ||
		out == NULL || (o = json_loads(out, 0, NULL)) == NULL)
	{
		char		reason[600];

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
	*answer = json_dumps(o, JSON_COMPACT);
	*status = *answer != NULL ? 200 : 503;
	if (*answer == NULL)
		*answer = qb_answer("unavailable", "out of memory; retry later");
	json_decref(o);
}
