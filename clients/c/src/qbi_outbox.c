/*-------------------------------------------------------------------------
 * qbi_outbox.c
 *	  qbi_enqueue: outbox rows written in the application's transaction.
 *
 * Wording: see "The outbox" in queuebox_inbox.h.  One statement per chunk:
 *
 *	INSERT INTO queuebox.outbox (...) SELECT ... FROM (VALUES
 *	  (0, $1::text, $2::text, $3::jsonb, jsonb_build_object($4::text, $5::text),
 *	   to_timestamp($6::float8), $7::int), (1, ...)) AS v(...) ORDER BY v.n RETURNING id
 *
 * Every value is bound (the statement's text holds only placeholders and
 * the row numbers), headers are built by the server's jsonb_build_object
 * from the pairs, so no JSON is written here.  ORDER BY v.n makes the ids
 * follow the order given; RETURNING's order is not promised, so the ids are
 * sorted.
 *
 * Threads: qbi_enqueue keeps no state; the trace hook is read, not written,
 * by it (qbi_set_trace_hook before threads enqueue).
 *-------------------------------------------------------------------------
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "queuebox_inbox.h"

/* PostgreSQL's limit of bound values in one statement */
#define QBO_MAXPARAMS 65535
#define QBO_TRACESTATE_MAX 512	/* characters, without the NUL */

static const char qbo_format[] =
	"00-<trace-id: 32 hex>-<parent-id: 16 hex>-<flags: 2 hex>, in small letters, the ids not all zeros";

static QbiTraceHook qbo_hook;
static void *qbo_hook_arg;

void
qbi_set_trace_hook(QbiTraceHook hook, void *arg)
{
	qbo_hook = hook;
	qbo_hook_arg = arg;
}

static bool
qbo_hex(const char *s, int n, bool *allzero)
{
	*allzero = true;
	for (int i = 0; i < n; i++)
	{
		if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
			return false;
		if (s[i] != '0')
			*allzero = false;
	}
	return true;
}

bool
qbi_traceparent_valid(const char *t)
{
	bool		zero,
				tz,
				sz;

	if (t == NULL || strlen(t) < QBI_TRACEPARENT_LEN || t[2] != '-' || t[35] != '-' || t[52] != '-')
		return false;
	if (!qbo_hex(t, 2, &zero) || strncmp(t, "ff", 2) == 0 || !qbo_hex(t + 3, 32, &tz) ||
		!qbo_hex(t + 36, 16, &sz) || !qbo_hex(t + 53, 2, &zero) || tz || sz)
		return false;
	/* version 00 is exactly 55 characters; a later one may go on after a '-' */
	if (strncmp(t, "00", 2) == 0)
		return t[QBI_TRACEPARENT_LEN] == '\0';
	return t[QBI_TRACEPARENT_LEN] == '\0' || t[QBI_TRACEPARENT_LEN] == '-';
}

/* a growing statement text */
typedef struct QboBuf
{
	char	   *s;
	size_t		len,
				cap;
	bool		oom;
} QboBuf;

static void
qbo_printf(QboBuf *b, const char *fmt,...)
{
	va_list		ap;
	int			n;

	if (b->oom)
		return;
	va_start(ap, fmt);
	n = vsnprintf(b->s + b->len, b->cap - b->len, fmt, ap);
	va_end(ap);
	if (n >= 0 && (size_t) n >= b->cap - b->len)
	{
		size_t		cap = (b->cap + (size_t) n + 1) * 2;
		char	   *s = realloc(b->s, cap);

		if (s == NULL)
		{
			b->oom = true;
			return;
		}
		b->s = s;
		b->cap = cap;
		va_start(ap, fmt);
		n = vsnprintf(b->s + b->len, b->cap - b->len, fmt, ap);
		va_end(ap);
	}
	if (n < 0)
		b->oom = true;
	else
		b->len += (size_t) n;
}

/* the current span's context, if the hook gives a valid one */
typedef struct QboTrace
{
	bool		set;
	char		parent[QBI_TRACEPARENT_LEN + 1];
	char		state[QBO_TRACESTATE_MAX + 1];
} QboTrace;

/*
 * Whether header h of m is left out: a caller's tracestate (any letter
 * case) when the span's context is added, its traceparent being the
 * span's, not the caller's.
 */
static bool
qbo_dropped(const QbiOutboxMessage *m, int h, const QboTrace *tr, bool own)
{
	return !own && tr->set && strcasecmp(m->header_names[h], "tracestate") == 0;
}

/* the bound values one message takes */
static int
qbo_nparams(const QbiOutboxMessage *m, const QboTrace *tr, bool *own)
{
	int			kept = 0;

	*own = false;
	for (int h = 0; h < m->nheaders; h++)
		if (strcasecmp(m->header_names[h], "traceparent") == 0)
			*own = true;
	for (int h = 0; h < m->nheaders; h++)
		kept += !qbo_dropped(m, h, tr, *own);
	return 5 + 2 * kept + (!*own && tr->set ? (tr->state[0] ? 4 : 2) : 0);
}

/* checks message i; 0, or -1 with err */
static int
qbo_check(const QbiOutboxMessage *m, int i, char *err, size_t errlen)
{
	if (m->topic == NULL || m->topic[0] == '\0')
		return snprintf(err, errlen, "qbi_enqueue: message %d: topic is empty", i), -1;
	if (m->payload_json == NULL)
		return snprintf(err, errlen, "qbi_enqueue: message %d: payload_json is NULL (JSON text: \"null\" for a null)", i), -1;
	if (m->nheaders < 0 || (m->nheaders > 0 && (m->header_names == NULL || m->header_values == NULL)))
		return snprintf(err, errlen, "qbi_enqueue: message %d: nheaders names and values are required", i), -1;
	if (m->max_attempts < 0)
		return snprintf(err, errlen, "qbi_enqueue: message %d: max_attempts is %d, must be 0 (the configuration's) or more",
						i, m->max_attempts), -1;
	for (int h = 0; h < m->nheaders; h++)
	{
		if (m->header_names[h] == NULL || m->header_values[h] == NULL)
			return snprintf(err, errlen, "qbi_enqueue: message %d: header %d is NULL", i, h), -1;
		if (strcasecmp(m->header_names[h], "traceparent") == 0 && !qbi_traceparent_valid(m->header_values[h]))
			return snprintf(err, errlen, "qbi_enqueue: message %d: the traceparent header \"%s\" is malformed: a traceparent is %s",
							i, m->header_values[h], qbo_format), -1;
	}
	return 0;
}

static int
qbo_cmp(const void *a, const void *b)
{
	int64_t		x = *(const int64_t *) a,
				y = *(const int64_t *) b;

	return x < y ? -1 : x > y;
}

/*
 * Message i's row of the VALUES list into b, its values into v from v[p]
 * (nums: two buffers of its own for the numbers); returns the next p.
 */
static int
qbo_row(QboBuf *b, const char **v, int p, const QbiOutboxMessage *m, int i, const QboTrace *tr, char nums[2][32])
{
	bool		own;
	int			kept = 0;

	qbo_nparams(m, tr, &own);
	v[p] = m->topic;
	v[p + 1] = m->key;
	v[p + 2] = m->payload_json;
	qbo_printf(b, "%s(%d, $%d::text, $%d::text, $%d::jsonb, jsonb_build_object(", i ? ", " : "", i, p + 1, p + 2, p + 3);
	p += 3;
	for (int h = 0; h < m->nheaders; h++)
	{
		if (qbo_dropped(m, h, tr, own))
			continue;
		v[p] = m->header_names[h];
		v[p + 1] = m->header_values[h];
		qbo_printf(b, "%s$%d::text, $%d::text", kept++ ? ", " : "", p + 1, p + 2);
		p += 2;
	}
	if (!own && tr->set)
	{
		v[p] = "traceparent";
		v[p + 1] = tr->parent;
		qbo_printf(b, "%s$%d::text, $%d::text", kept ? ", " : "", p + 1, p + 2);
		p += 2;
		if (tr->state[0])
		{
			v[p] = "tracestate";
			v[p + 1] = tr->state;
			qbo_printf(b, ", $%d::text, $%d::text", p + 1, p + 2);
			p += 2;
		}
	}
	if (m->scheduled_at != 0)
	{
		snprintf(nums[0], sizeof(nums[0]), "%lld", (long long) m->scheduled_at);
		v[p] = nums[0];
	}
	if (m->max_attempts > 0)
	{
		snprintf(nums[1], sizeof(nums[1]), "%d", m->max_attempts);
		v[p + 1] = nums[1];
	}
	qbo_printf(b, "), to_timestamp($%d::float8), $%d::int)", p + 1, p + 2);
	return p + 2;
}

/* one statement for msgs[0..n); their ids into ids (sorted); 0 or -1 with err */
static int
qbo_run(PGconn *conn, const QbiOutboxMessage *msgs, int n, const QboTrace *tr, int64_t *ids,
		char *err, size_t errlen)
{
	QboBuf		b = {0};
	const char **v = NULL;
	char	  (*nums)[2][32] = calloc((size_t) n, sizeof(*nums));
	int			p = 0,
				rc = -1,
				total = 0;
	bool		own;
	PGresult   *r = NULL;

	for (int i = 0; i < n; i++)
		total += qbo_nparams(&msgs[i], tr, &own);
	v = calloc((size_t) total, sizeof(*v));
	if (v == NULL || nums == NULL)
	{
		snprintf(err, errlen, "qbi_enqueue: out of memory");
		goto done;
	}
	qbo_printf(&b, "INSERT INTO queuebox.outbox (topic, key, payload, headers, scheduled_at, max_attempts)"
			   " SELECT v.topic, v.key, v.payload, v.headers, coalesce(v.at, now()), v.max_attempts FROM (VALUES ");
	for (int i = 0; i < n; i++)
		p = qbo_row(&b, v, p, &msgs[i], i, tr, nums[i]);
	qbo_printf(&b, ") AS v(n, topic, key, payload, headers, at, max_attempts) ORDER BY v.n RETURNING id");
	if (b.oom)
	{
		snprintf(err, errlen, "qbi_enqueue: out of memory");
		goto done;
	}
	r = PQexecParams(conn, b.s, p, NULL, v, NULL, NULL, 0);
	if (PQresultStatus(r) != PGRES_TUPLES_OK || PQntuples(r) != n)
	{
		/* no result (out of memory, connection lost): the connection's message */
		snprintf(err, errlen, "qbi_enqueue: %s", PQresultStatus(r) == PGRES_TUPLES_OK
				 ? "the insert returned another number of rows"
				 : r != NULL ? PQresultErrorMessage(r) : PQerrorMessage(conn));
		goto done;
	}
	if (ids != NULL)
	{
		for (int i = 0; i < n; i++)
			ids[i] = strtoll(PQgetvalue(r, i, 0), NULL, 10);
		qsort(ids, (size_t) n, sizeof(*ids), qbo_cmp);
	}
	rc = 0;
done:
	PQclear(r);
	free(b.s);
	free(v);
	free(nums);
	return rc;
}

/* a command of no result (the savepoint's); 0, or -1 with err */
static int
qbo_command(PGconn *conn, const char *sql, char *err, size_t errlen)
{
	PGresult   *r = PQexec(conn, sql);
	int			rc = PQresultStatus(r) == PGRES_COMMAND_OK ? 0 : -1;

	if (rc != 0)
		snprintf(err, errlen, "qbi_enqueue: %s: %s", sql, r != NULL ? PQresultErrorMessage(r) : PQerrorMessage(conn));
	PQclear(r);
	return rc;
}

/* refuses a connection outside an open transaction; 0, or -1 with err */
static int
qbo_in_transaction(PGconn *conn, char *err, size_t errlen)
{
	switch (PQtransactionStatus(conn))
	{
		case PQTRANS_INTRANS:
			return 0;
		case PQTRANS_IDLE:
			return snprintf(err, errlen, "qbi_enqueue: the connection is in no transaction: send BEGIN first"
							" (each row would otherwise commit on its own, apart from your writes)"), -1;
		case PQTRANS_INERROR:
			return snprintf(err, errlen, "qbi_enqueue: the connection's transaction is aborted by an earlier error:"
							" roll it back"), -1;
		default:
			return snprintf(err, errlen, "qbi_enqueue: the connection is busy or broken, not idle in a transaction: %s",
							PQerrorMessage(conn)), -1;
	}
}

/*
 * The statements, one per QBO_MAXPARAMS bound values; run (run true) or
 * only counted.  Their number, or -1 with err.
 */
static int
qbo_statements(PGconn *conn, const QbiOutboxMessage *msgs, int n, const QboTrace *tr, int64_t *ids,
			   bool run, char *err, size_t errlen)
{
	int			start = 0,
				params = 0,
				count = 0;
	bool		own;

	for (int i = 0; i <= n; i++)
	{
		int			k = i < n ? qbo_nparams(&msgs[i], tr, &own) : 0;

		if (i == n || (params + k > QBO_MAXPARAMS && i > start))
		{
			if (i > start && run && qbo_run(conn, msgs + start, i - start, tr, ids ? ids + start : NULL, err, errlen) != 0)
				return -1;
			count += i > start;
			start = i;
			params = 0;
		}
		params += k;
	}
	return count;
}

int
qbi_enqueue(PGconn *conn, const QbiOutboxMessage *msgs, int n, int64_t *ids, char *err, size_t errlen)
{
	QboTrace	tr = {0};
	bool		several;
	char		first[1024];

	if (conn == NULL || n < 0 || (n > 0 && msgs == NULL))
		return snprintf(err, errlen, "qbi_enqueue: pass a connection in a transaction and n messages"), -1;
	if (qbo_in_transaction(conn, err, errlen) != 0)
		return -1;
	if (qbo_hook != NULL && qbo_hook(qbo_hook_arg, tr.parent, tr.state, sizeof(tr.state)))
	{
		tr.parent[QBI_TRACEPARENT_LEN] = '\0';
		tr.state[sizeof(tr.state) - 1] = '\0';
		if (!qbi_traceparent_valid(tr.parent))
			return snprintf(err, errlen, "qbi_enqueue: the trace hook gave the traceparent \"%s\", which is malformed: a traceparent is %s",
							tr.parent, qbo_format), -1;
		tr.set = true;
	}
	for (int i = 0; i < n; i++)
		if (qbo_check(&msgs[i], i, err, errlen) != 0)
			return -1;

	/*
	 * More than one statement: under a savepoint, rolled back to when a
	 * later one fails, so that a failed call leaves none of its rows and the
	 * transaction usable.  One statement is all or nothing by itself.
	 */
	several = qbo_statements(conn, msgs, n, &tr, NULL, false, err, errlen) > 1;
	if (several && qbo_command(conn, "SAVEPOINT qbi_enqueue", err, errlen) != 0)
		return -1;
	if (qbo_statements(conn, msgs, n, &tr, ids, true, err, errlen) < 0)
	{
		if (several)
		{
			/* the statement's error is the one to report */
			snprintf(first, sizeof(first), "%s", err);
			if (qbo_command(conn, "ROLLBACK TO SAVEPOINT qbi_enqueue", err, errlen) == 0 &&
				qbo_command(conn, "RELEASE SAVEPOINT qbi_enqueue", err, errlen) == 0)
				snprintf(err, errlen, "%s", first);
		}
		return -1;
	}
	if (several && qbo_command(conn, "RELEASE SAVEPOINT qbi_enqueue", err, errlen) != 0)
		return -1;
	return 0;
}
