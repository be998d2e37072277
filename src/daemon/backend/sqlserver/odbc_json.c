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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
		failed |= json_array_append_new(a, json_pack("{s:o,s:i,s:I,s:i,s:b,s:I,s:o,s:i,s:I}",
													 "d", qboj_str(t[i].destination),
													 "ok", t[i].ok,
													 "ago", (json_int_t) t[i].ok_sent_ago_us,
													 "fail", t[i].failed,
													 "gone", t[i].gone,
													 "ra", (json_int_t) t[i].retry_after_ms,
													 "err", qboj_str(t[i].error),
													 "th", t[i].threshold,
													 "cd", (json_int_t) t[i].cooldown_ms)) != 0;
	return qboj_done(a, failed, oom);
}

/*
 * The settles: "u" the row had no destination at its claim (its promotion
 * looks at every destination of its key); "c", only on a fan-out row's
 * first settle, the destinations to copy it to, as the JSON array the
 * route holds (a JSON value, read AS JSON: never escaped twice).
 */
char *
qb_odbc_json_settles(const QbSettle *s, int n, bool *oom)
{
	json_t	   *a;
	bool		failed = false;

	if (n <= 0)
		return NULL;
	a = json_array();
	for (int i = 0; i < n && a != NULL; i++)
	{
		json_t	   *o = json_pack("{s:I,s:o,s:s,s:i,s:I,s:o,s:o,s:b}",
								  "id", (json_int_t) s[i].id,
								  "t", qboj_str(s[i].token),
								  "o", qb_settle_kind_name(s[i].kind),
								  "a", s[i].attempt,
								  "ms", (json_int_t) s[i].delay_ms,
								  "err", qboj_str(s[i].error),
								  "d", qboj_str(s[i].destination),
								  "u", s[i].unrouted);

		if (o != NULL && s[i].copies != NULL)
			failed |= json_object_set_new(o, "c", json_loads(s[i].copies, 0, NULL)) != 0;
		failed |= json_array_append_new(a, o) != 0;
	}
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

/* qboj_units: UTF-16 code units of UTF-8 text (a 4-byte sequence is two) */
static size_t
qboj_units(const char *s)
{
	size_t		n = 0;

	for (const unsigned char *p = (const unsigned char *) s; *p; p++)
		n += (*p & 0xC0) != 0x80 ? (*p >= 0xF0 ? 2 : 1) : 0;
	return n;
}

/* qb_odbc_check_lengths: see odbc_store.h. */
int
qb_odbc_check_lengths(const QbInboxRow *rows, int n, char *err, size_t errlen)
{
	for (int i = 0; i < n; i++)
	{
		const struct
		{
			const char *name;
			const char *value;
			size_t		max;
		}			f[] = {
			{"source", rows[i].source, 200},
			{"idempotency key", rows[i].idempotency_key, 400},
			{"event type", rows[i].event_type, 400},
			{"aggregate id", rows[i].aggregate_id, 400},
		};

		for (size_t k = 0; k < sizeof(f) / sizeof(f[0]); k++)
		{
			size_t		len = f[k].value ? qboj_units(f[k].value) : 0;

			if (len > f[k].max)
			{
				snprintf(err, errlen,
						 "the %s of a message of source \"%.60s\" is %zu characters long; SQL Server stores at most %zu "
						 "(docs/sqlserver.md); shorten it at the sender or with the source's transform",
						 f[k].name, rows[i].source ? rows[i].source : "", len, f[k].max);
				return -1;
			}
		}
	}
	return 0;
}

/* qboj_append: text onto a growing buffer; false when out of memory. */
static bool
qboj_append(char **buf, size_t *len, size_t *cap, const char *text)
{
	size_t		n = strlen(text);

	if (*len + n + 1 > *cap)
	{
		size_t		ncap = (*len + n + 1) * 2;
		char	   *nb = realloc(*buf, ncap);

		if (nb == NULL)
			return false;
		*buf = nb;
		*cap = ncap;
	}
	memcpy(*buf + *len, text, n + 1);
	*len += n;
	return true;
}

/* qboj_is_container: a JSON text whose value is an object or an array */
static bool
qboj_is_container(const char *text)
{
	text += strspn(text, " \t\r\n");
	return *text == '{' || *text == '[';
}

/*
 * The rows of an inbox insert.  The payload and the headers are JSON texts
 * already (the ingress and the consumers made or checked them): they go
 * into the document as JSON values, as they are, and the procedure reads
 * them AS JSON, so no character of them is escaped twice.  A payload that
 * is a JSON scalar goes inside brackets, with "ps": true.  A text that is
 * not JSON fails the call here, saying so.
 */
char *
qb_odbc_json_inbox_rows(const QbInboxRow *rows, int n, bool *oom)
{
	char	   *buf = NULL;
	size_t		len = 0;
	size_t		cap = 0;
	bool		ok = true;
	bool		bad = false;

	if (n <= 0)
		return NULL;
	ok = qboj_append(&buf, &len, &cap, "[");
	for (int i = 0; i < n && ok; i++)
	{
		const QbInboxRow *r = &rows[i];
		json_t	   *o = json_pack("{s:o,s:o,s:o,s:o,s:s,s:o,s:b}",
								  "s", qboj_str(r->source), "k", qboj_str(r->idempotency_key),
								  "e", qboj_str(r->event_type), "a", qboj_str(r->aggregate_id),
								  "c", r->pull ? "pull" : "push", "err", qboj_str(r->dead_error),
								  "ps", !qboj_is_container(r->payload ? r->payload : ""));
		char	   *head = o ? json_dumps(o, JSON_COMPACT) : NULL;
		json_t	   *check_p = json_loads(r->payload ? r->payload : "", JSON_DECODE_ANY | JSON_DECODE_INT_AS_REAL, NULL);
		json_t	   *check_h = json_loads(r->headers ? r->headers : "{}", JSON_DECODE_INT_AS_REAL, NULL);
		bool		scalar = !qboj_is_container(r->payload ? r->payload : "");

		bad = check_p == NULL || check_h == NULL || !json_is_object(check_h);
		/* head is {...}: drop its brace, splice the two JSON values after it */
		ok = head != NULL && !bad &&
			(i == 0 || qboj_append(&buf, &len, &cap, ",")) &&
			qboj_append(&buf, &len, &cap, "{\"p\":") &&
			(!scalar || qboj_append(&buf, &len, &cap, "[")) &&
			qboj_append(&buf, &len, &cap, r->payload) &&
			(!scalar || qboj_append(&buf, &len, &cap, "]")) &&
			qboj_append(&buf, &len, &cap, ",\"h\":") &&
			qboj_append(&buf, &len, &cap, r->headers ? r->headers : "{}") &&
			qboj_append(&buf, &len, &cap, ",") &&
			qboj_append(&buf, &len, &cap, head + 1);
		json_decref(o);
		json_decref(check_p);
		json_decref(check_h);
		free(head);
	}
	ok = ok && qboj_append(&buf, &len, &cap, "]");
	if (!ok)
	{
		free(buf);
		*oom = !bad;
		return NULL;
	}
	return buf;
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
qb_odbc_json_topics(const int64_t *ids, const char *const *topics, const bool *holds, int n,
					bool *oom)
{
	json_t	   *a;
	bool		failed = false;

	if (n <= 0)
		return NULL;
	a = json_array();
	/* "h": 1 only where a dead row holds its aggregate (onDead: holdKey) */
	for (int i = 0; i < n && a != NULL; i++)
		failed |= json_array_append_new(a, holds != NULL && holds[i] ?
										json_pack("{s:I,s:o,s:i}", "id", (json_int_t) ids[i],
												  "t", qboj_str(topics[i]), "h", 1) :
										json_pack("{s:I,s:o}", "id", (json_int_t) ids[i],
												  "t", qboj_str(topics[i]))) != 0;
	return qboj_done(a, failed, oom);
}

char *
qb_odbc_json_limits(const QbLimitTake *t, int n, bool *oom)
{
	json_t	   *a = json_array();
	bool		failed = false;

	for (int i = 0; i < n && a != NULL; i++)
		failed |= json_array_append_new(a, json_pack("{s:o,s:f,s:i,s:i,s:i,s:i,s:i,s:i}",
													 "n", qboj_str(t[i].destination),
													 "r", t[i].per_sec > 0 ? t[i].per_sec : 0.0,
													 "b", t[i].burst > 0 ? t[i].burst : 1,
													 "m", t[i].max_concurrent, "h", t[i].held,
													 "o", t[i].out, "g", t[i].give,
													 "w", t[i].want)) != 0;
	return qboj_done(a, failed, oom);
}
