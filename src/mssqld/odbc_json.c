/*-------------------------------------------------------------------------
 * odbc_json.c
 *	  The arrays a store op hands a SQL Server procedure, as JSON text
 *	  (jansson), in the shapes sql/sqlserver/engine.sql reads with OPENJSON.
 *
 * One NVARCHAR(MAX) parameter per array: one round trip and one bound
 * value whatever the batch size, and no value ever in SQL text.  Keys are
 * short because a cycle's settles can be a thousand objects; engine.sql's
 * comments name them.  A NULL string is JSON null (SQL NULL after
 * OPENJSON).
 *-------------------------------------------------------------------------
 */
#include <stdlib.h>

#include <jansson.h>

#include "odbc_store.h"

static json_t *
qboj_str(const char *s)
{
	return s ? json_string(s) : json_null();
}

/* qboj_done: the text of a, or NULL (and *oom) when any piece failed. */
static char *
qboj_done(json_t *a, bool failed, bool *oom)
{
	char	   *text = NULL;

	if (!failed && a != NULL)
		text = json_dumps(a, JSON_COMPACT);
	json_decref(a);
	if (text == NULL)
		*oom = true;
	return text;
}

char *
qb_odbc_json_tallies(const QbDestTally *t, int n, bool *oom)
{
	json_t	   *a;
	bool		failed = false;

	if (n <= 0)
		return NULL;
	a = json_array();
	for (int i = 0; i < n && a != NULL; i++)
		failed |= json_array_append_new(a, json_pack("{s:o,s:i,s:i,s:b,s:I,s:o,s:i,s:I}",
													 "d", qboj_str(t[i].destination),
													 "ok", t[i].ok, "fail", t[i].failed,
													 "gone", t[i].gone,
													 "ra", (json_int_t) t[i].retry_after_ms,
													 "err", qboj_str(t[i].error),
													 "th", t[i].threshold,
													 "cd", (json_int_t) t[i].cooldown_ms)) != 0;
	return qboj_done(a, failed, oom);
}

char *
qb_odbc_json_settles(const QbSettle *s, int n, bool *oom)
{
	json_t	   *a;
	bool		failed = false;

	if (n <= 0)
		return NULL;
	a = json_array();
	for (int i = 0; i < n && a != NULL; i++)
		failed |= json_array_append_new(a, json_pack("{s:I,s:o,s:s,s:i,s:I,s:o,s:o}",
													 "id", (json_int_t) s[i].id,
													 "t", qboj_str(s[i].token),
													 "o", qb_settle_kind_name(s[i].kind),
													 "a", s[i].attempt,
													 "ms", (json_int_t) s[i].delay_ms,
													 "err", qboj_str(s[i].error),
													 "d", qboj_str(s[i].destination))) != 0;
	return qboj_done(a, failed, oom);
}

char *
qb_odbc_json_claim(const QbClaimReq *c, bool *oom)
{
	json_t	   *o;
	json_t	   *dests = json_array();
	bool		failed = dests == NULL;

	if (c == NULL)
	{
		json_decref(dests);
		return NULL;
	}
	for (int i = 0; i < c->ndests && !failed; i++)
		failed |= json_array_append_new(dests, json_pack("{s:s,s:i}", "n", c->dests[i],
														 "l", c->limits[i])) != 0;
	o = json_pack("{s:i,s:I,s:i,s:o,s:I,s:I,s:o}",
				  "batch", c->batch_size, "lease", (json_int_t) c->lease_ms,
				  "maxa", c->default_max_attempts, "token", qboj_str(c->token),
				  "floor", (json_int_t) c->floor, "probe", (json_int_t) c->probe_ms,
				  "dests", dests);
	return qboj_done(o, failed, oom);
}

char *
qb_odbc_json_inbox_rows(const QbInboxRow *rows, int n, bool *oom)
{
	json_t	   *a;
	bool		failed = false;

	if (n <= 0)
		return NULL;
	a = json_array();
	for (int i = 0; i < n && a != NULL; i++)
		failed |= json_array_append_new(a, json_pack("{s:o,s:o,s:o,s:o,s:o,s:o,s:s,s:o}",
													 "s", qboj_str(rows[i].source),
													 "k", qboj_str(rows[i].idempotency_key),
													 "e", qboj_str(rows[i].event_type),
													 "a", qboj_str(rows[i].aggregate_id),
													 "p", qboj_str(rows[i].payload),
													 "h", qboj_str(rows[i].headers),
													 "c", rows[i].pull ? "pull" : "push",
													 "err", qboj_str(rows[i].dead_error))) != 0;
	return qboj_done(a, failed, oom);
}

char *
qb_odbc_json_names(const char *const *names, int n, bool *oom)
{
	json_t	   *a = json_array();
	bool		failed = false;

	/* an empty list is "[]", not NULL: "no destination" is a value here */
	for (int i = 0; i < n && a != NULL; i++)
		failed |= json_array_append_new(a, qboj_str(names[i])) != 0;
	return qboj_done(a, failed, oom);
}

char *
qb_odbc_json_topics(const int64_t *ids, const char *const *topics, int n, bool *oom)
{
	json_t	   *a;
	bool		failed = false;

	if (n <= 0)
		return NULL;
	a = json_array();
	for (int i = 0; i < n && a != NULL; i++)
		failed |= json_array_append_new(a, json_pack("{s:I,s:o}", "id", (json_int_t) ids[i],
													 "t", qboj_str(topics[i]))) != 0;
	return qboj_done(a, failed, oom);
}
