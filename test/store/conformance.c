/*-------------------------------------------------------------------------
 * conformance.c
 *	  The store conformance suite: the same scenarios against any QbStore.
 *
 *	  conformance pq|spi      (QB_CONFORMANCE_DSN: a libpq connection string
 *	                           of a database with the queuebox extension;
 *	                           QB_CONFORMANCE_BAD_DSN: one whose password is
 *	                           wrong, for the pq store's failure scenario)
 *	  conformance odbc        (QB_CONFORMANCE_MSSQL_URL: a sqlserver:// URL of
 *	                           a database queuebox-mssqld --migrate made the
 *	                           schema in; QB_CONFORMANCE_BAD_MSSQL_URL: the
 *	                           same with a wrong password, optional)
 *
 * Wording:
 *	- The store under test: `pq` is the libpq store
 *	  (src/daemon/backend/postgresql/pq_store.c); `spi` is an adapter whose
 *	  ops call the extension's SQL-callable wrappers
 *	  (queuebox._outbox_claim() and friends, which run the SPI store's
 *	  statements through SPI), so the SPI side is held to the same
 *	  contract.  Three ops have no wrapper (the inbox insert, the unroute,
 *	  the sweep): the adapter runs the pq store's for them, saying so.  `odbc` is the
 *	  SQL Server store (src/daemon/backend/sqlserver/odbc_store.c), against
 *	  SQL Server or a TDS engine; its admin connection is ODBC too, and the
 *	  admin statements that differ between the dialects are written twice
 *	  (D()).
 *	- The admin connection is the suite's own: it sets rows up, counts them
 *	  before and after each step, and plays the other sessions (a lock
 *	  holder, pg_terminate_backend).  Every scenario starts from empty
 *	  tables.
 *
 * Every statement of the suite and the adapter is parameterised.
 *-------------------------------------------------------------------------
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>
#include <libpq-fe.h>

#include "odbc_store.h"
#include "pq_store.h"
#include "qb_config.h"
#include "qb_pg_array.h"
#include "qb_pg_stmt.h"
#include "qb_sql_pg.h"

#define APP_NAME "queuebox conformance"
#define CONFIG_DOC \
	"sources:\n" \
	"  web: { type: http, path: /web, idempotencyKeyPath: $.id, eventTypePath: $.type }\n" \
	"inbox: { relay: { maxAttempts: 6 } }\n"

static const char *dsn;
static bool kind_pq;
static bool mssql;				/* the odbc kind: T-SQL admin statements */
/*
 * The odbc kind against Babelfish (a TDS engine, not SQL Server): its JSON
 * functions hand back a string's escapes as they are (a\"b for a"b), so the
 * values with a quote or a backslash are not judged there
 * (docs/sqlserver.md, "Testing").
 */
static bool babelfish;
static PGconn *admin;
static QbOdbcConn *madmin;		/* the odbc kind's admin connection */
static QbOdbcStore *odbc;
static QbStore store;			/* the store under test */
static QbPqStore *pq;			/* the pq store (the spi adapter's fallback too) */
static QbConfig *cfg;
static char err[1024];

/* ---- the admin connection ------------------------------------------------- */

/* D: the admin statement of the dialect under test */
#define D(pg, ms) (mssql ? (ms) : (pg))

/* An admin result: every value as text (NULL for SQL NULL), row by row. */
typedef struct Res
{
	int			n;
	int			ncols;
	char	  **v;
} Res;

static const char *
rv(const Res *r, int row, int col)
{
	return row < r->n && col < r->ncols ? r->v[row * r->ncols + col] : NULL;
}

static void
rfree(Res *r)
{
	for (int i = 0; r && i < r->n * r->ncols; i++)
		free(r->v[i]);
	if (r)
		free(r->v);
	free(r);
}

static int
res_row(void *arg, int set, int ncols, char **values)
{
	Res		   *r = arg;

	if (set != 0)
		return 0;
	r->ncols = ncols;
	r->v = realloc(r->v, sizeof(char *) * (r->n + 1) * ncols);
	for (int i = 0; i < ncols; i++)
	{
		r->v[r->n * ncols + i] = values[i];
		values[i] = NULL;
	}
	r->n++;
	return 0;
}

/*
 * q: run sql with text params on the admin connection; the result, checked.
 * On SQL Server $n markers become ? (each used once, in order), and BEGIN,
 * COMMIT and ROLLBACK steer the connection's transaction.
 */
static Res *
q(const char *sql, int n, ...)
{
	const char *v[8];
	va_list		ap;
	Res		   *r = calloc(1, sizeof(Res));

	va_start(ap, n);
	for (int i = 0; i < n; i++)
		v[i] = va_arg(ap, const char *);
	va_end(ap);
	if (mssql)
	{
		QbOdbcParam p[8];
		QbOdbcClass cls;
		char		t[4096];
		char		e[1024];
		size_t		k = 0;

		if (strcmp(sql, "BEGIN") == 0 || strcmp(sql, "COMMIT") == 0 || strcmp(sql, "ROLLBACK") == 0)
		{
			int			rc = strcmp(sql, "BEGIN") == 0 ? qb_odbc_begin(madmin, e, sizeof(e)) :
				qb_odbc_end(madmin, strcmp(sql, "COMMIT") == 0, e, sizeof(e));

			if (rc != 0)
				fail_msg("admin %s failed: %s", sql, e);
			return r;
		}
		/* $1 .. $9 (not a JSON path's $) */
		for (const char *c = sql; *c && k + 1 < sizeof(t); c++)
		{
			bool		marker = c[0] == '$' && c[1] >= '1' && c[1] <= '9';

			t[k++] = marker ? '?' : *c;
			if (marker)
				while (c[1] >= '0' && c[1] <= '9')
					c++;
		}
		t[k] = '\0';
		for (int i = 0; i < n; i++)
			p[i] = (QbOdbcParam) {.type = QB_ODBC_T_TEXT, .text = v[i]};
		if (qb_odbc_exec(madmin, t, p, n, 30000, res_row, r, &cls, e, sizeof(e)) != 0)
		{
			char		e2[256];

			(void) qb_odbc_end(madmin, false, e2, sizeof(e2));
			fail_msg("admin statement failed: %s\n%s", e, t);
		}
		return r;
	}
	{
		PGresult   *res = PQexecParams(admin, sql, n, NULL, v, NULL, NULL, 0);

		if (PQresultStatus(res) != PGRES_TUPLES_OK && PQresultStatus(res) != PGRES_COMMAND_OK)
			fail_msg("admin statement failed: %s\n%s", PQresultErrorMessage(res), sql);
		r->n = PQntuples(res);
		r->ncols = PQnfields(res);
		r->v = calloc((size_t) r->n * r->ncols + 1, sizeof(char *));
		for (int i = 0; i < r->n; i++)
			for (int c = 0; c < r->ncols; c++)
				r->v[i * r->ncols + c] = PQgetisnull(res, i, c) ? NULL : strdup(PQgetvalue(res, i, c));
		PQclear(res);
	}
	return r;
}

/* qv: the first value of a one-row answer as a number (0 for NULL or none). */
static long long
qv(const char *sql, int n, const char *a, const char *b)
{
	Res		   *res = q(sql, n, a, b);
	long long	v = rv(res, 0, 0) ? strtoll(rv(res, 0, 0), NULL, 10) : 0;

	rfree(res);
	return v;
}

/* qs: the first value as text (static buffer; "" for NULL). */
static const char *
qs(const char *sql, const char *a)
{
	static char buf[2048];
	Res		   *res = q(sql, a ? 1 : 0, a);

	snprintf(buf, sizeof(buf), "%s", rv(res, 0, 0) ? rv(res, 0, 0) : "");
	rfree(res);
	return buf;
}

static const char *
num(long long v)
{
	static char b[4][24];
	static int	k;

	k = (k + 1) % 4;
	snprintf(b[k], sizeof(b[k]), "%lld", v);
	return b[k];
}

static long long
outbox_count(const char *state)
{
	return qv(D("SELECT count(*) FROM queuebox.outbox WHERE $1::text IS NULL OR state = $1",
				"DECLARE @s NVARCHAR(50) = ?; SELECT COUNT(*) FROM queuebox.outbox WHERE @s IS NULL OR state = @s"),
			  1, state, NULL);
}

static long long
inbox_count(const char *state)
{
	return qv(D("SELECT count(*) FROM queuebox.inbox WHERE $1::text IS NULL OR state = $1",
				"DECLARE @s NVARCHAR(50) = ?; SELECT COUNT(*) FROM queuebox.inbox WHERE @s IS NULL OR state = @s"),
			  1, state, NULL);
}

static int64_t
add_outbox(const char *topic, const char *key)
{
	return qv(D("INSERT INTO queuebox.outbox (topic, key, payload) VALUES ($1, $2, '{\"n\": 1}') RETURNING id",
				"INSERT INTO queuebox.outbox (topic, [key], payload) VALUES (?, ?, N'{\"n\": 1}');"
				" SELECT CAST(SCOPE_IDENTITY() AS BIGINT)"),
			  2, topic, key);
}

static const char *
outbox_state(int64_t id)
{
	return qs("SELECT state FROM queuebox.outbox WHERE id = $1", num(id));
}

/* ---- calls of the store under test ---------------------------------------- */

static char token_a[QB_UUID_LEN + 1];
static char token_b[QB_UUID_LEN + 1];
static char token_c[QB_UUID_LEN + 1];

/* cycle: one outbox_cycle, a claim of batch rows when batch > 0; fails the test on -1. */
static QbCycleOut
cycle(const QbDestTally *t, int nt, const QbSettle *st, int ns, int batch, long lease_ms,
	  const char *token, const char *const *dests, int ndests)
{
	static int	limits[8] = {5, 5, 5, 5, 5, 5, 5, 5};
	QbClaimReq	c = {.batch_size = batch, .lease_ms = lease_ms, .default_max_attempts = 5,
		.token = token, .floor = 0, .dests = dests, .limits = limits, .floors = NULL,
	.ndests = ndests, .probe_ms = 1000, .read_states = true};
	QbCycleOut	out;

	if (store.outbox_cycle(store.ctx, t, nt, st, ns, batch > 0 ? &c : NULL, &out, err,
						   sizeof(err)) != 0)
		fail_msg("outbox_cycle failed: %s", err);
	return out;
}

static QbCycleOut
claim(int batch, long lease_ms, const char *token)
{
	return cycle(NULL, 0, NULL, 0, batch, lease_ms, token, NULL, 0);
}

static int
nclaimed(const QbCycleOut *o)
{
	int			n = 0;

	for (int i = 0; i < o->nrows; i++)
		n += o->rows[i].claimed;
	return n;
}

static bool
claimed_id(const QbCycleOut *o, int64_t id)
{
	for (int i = 0; i < o->nrows; i++)
		if (o->rows[i].claimed && o->rows[i].id == id)
			return true;
	return false;
}

static int
settle(QbSettle *st, int n)
{
	QbCycleOut	o = cycle(NULL, 0, st, n, 0, 0, NULL, NULL, 0);
	int			settled = o.nsettled;

	qb_cycle_out_free(&o);
	return settled;
}

/* query: query_text's code; *out the answer (caller frees). */
static int
query(QbQuery qq, char **out, const char *p0, const char *p1, const char *p2, const char *p3)
{
	const char *params[10] = {p0, p1, p2, p3};

	return store.query_text(store.ctx, qq, params, 30000, out, err, sizeof(err));
}

/* ---- the spi adapter --------------------------------------------------------- */

/*
 * The adapter: each op is one transaction on its own connection, calling
 * the wrappers.  Results are read as the pq store reads them.
 */
static PGconn *spi_conn;

static bool
sa_ok(PGresult *res, const char *what, char *e, size_t elen)
{
	ExecStatusType st = PQresultStatus(res);

	if (st == PGRES_TUPLES_OK || st == PGRES_COMMAND_OK)
		return true;
	snprintf(e, elen, "%s: %s", what, PQresultErrorMessage(res));
	return false;
}

/* sa_exec: sql with text params; NULL (and e) on failure. */
static PGresult *
sa_exec(const char *sql, int n, const char *const *v, const char *what, char *e, size_t elen)
{
	PGresult   *res = PQexecParams(spi_conn, sql, n, NULL, v, NULL, NULL, 0);

	if (sa_ok(res, what, e, elen))
		return res;
	PQclear(res);
	return NULL;
}

static void
sa_simple(const char *sql)
{
	PQclear(PQexec(spi_conn, sql));
}

static int
sa_end(bool ok)
{
	sa_simple(ok ? "COMMIT" : "ROLLBACK");
	return ok ? 0 : -1;
}

static char *
sa_dup(const PGresult *r, int i, int c)
{
	return PQgetisnull(r, i, c) ? NULL : strdup(PQgetvalue(r, i, c));
}

static bool
sa_true(const PGresult *r, int i, int c)
{
	return !PQgetisnull(r, i, c) && PQgetvalue(r, i, c)[0] == 't';
}

static int
sa_cycle(void *ctx, const QbDestTally *t, int nt, const QbSettle *st, int ns,
		 const QbClaimReq *c, QbCycleOut *out, char *e, size_t elen)
{
	PGresult   *r = NULL;
	bool		ok = true;

	memset(out, 0, sizeof(*out));
	sa_simple("BEGIN");
	if (nt > 0)
	{
		QbPgArray	a[8] = {{0}};
		const char *v[8];

		for (int i = 0; i < nt; i++)
		{
			qb_pg_array_add(&a[0], t[i].destination);
			qb_pg_array_add_int(&a[1], t[i].ok);
			qb_pg_array_add_int(&a[2], t[i].failed);
			qb_pg_array_add_bool(&a[3], t[i].gone);
			qb_pg_array_add_int(&a[4], t[i].retry_after_ms);
			qb_pg_array_add(&a[5], t[i].error);
			qb_pg_array_add_int(&a[6], t[i].threshold);
			qb_pg_array_add_int(&a[7], t[i].cooldown_ms);
		}
		for (int i = 0; i < 8; i++)
			v[i] = qb_pg_array_text(&a[i]);
		r = sa_exec("SELECT destination, old_state, new_state, paused FROM queuebox._outbox_breaker("
					"$1::text[], $2::int[], $3::int[], $4::bool[], $5::bigint[], $6::text[],"
					" $7::int[], $8::bigint[])", 8, v, "_outbox_breaker", e, elen);
		for (int i = 0; i < 8; i++)
			qb_pg_array_free(&a[i]);
		if ((ok = r != NULL))
		{
			out->changes = calloc(PQntuples(r) + 1, sizeof(QbDestChange));
			for (int i = 0; i < PQntuples(r); i++)
			{
				QbDestChange *d = &out->changes[out->nchanges++];

				d->destination = sa_dup(r, i, 0);
				d->old_state = qb_circuit_parse(PQgetvalue(r, i, 1));
				d->new_state = qb_circuit_parse(PQgetvalue(r, i, 2));
				d->paused = sa_true(r, i, 3);
			}
			PQclear(r);
		}
	}
	/* _outbox_settle takes one token: a call per token */
	for (int i = 0; ok && i < ns; i++)
	{
		QbPgArray	a[7] = {{0}};
		const char *v[7] = {st[i].token};
		bool		seen = false;

		for (int j = 0; j < i; j++)
			seen |= strcmp(st[j].token, st[i].token) == 0;
		if (seen)
			continue;
		for (int j = i; j < ns; j++)
		{
			if (strcmp(st[j].token, st[i].token) != 0)
				continue;
			qb_pg_array_add_int(&a[1], st[j].id);
			qb_pg_array_add(&a[2], qb_settle_kind_name(st[j].kind));
			qb_pg_array_add_int(&a[3], st[j].attempt);
			qb_pg_array_add_int(&a[4], st[j].delay_ms);
			qb_pg_array_add(&a[5], st[j].error);
			qb_pg_array_add(&a[6], st[j].destination);
		}
		for (int k = 1; k < 7; k++)
			v[k] = qb_pg_array_text(&a[k]);
		r = sa_exec("SELECT queuebox._outbox_settle($1::uuid, $2::bigint[], $3::text[], $4::int[],"
					" $5::bigint[], $6::text[], $7::text[])", 7, v, "_outbox_settle", e, elen);
		for (int k = 0; k < 7; k++)
			qb_pg_array_free(&a[k]);
		if ((ok = r != NULL))
		{
			out->nsettled += atoi(PQgetvalue(r, 0, 0));
			PQclear(r);
		}
	}
	if (ok && c != NULL)
	{
		QbPgArray	probes = {0};
		QbPgArray	a[3] = {{0}};
		char		nb[5][24];
		const char *v[9];

		snprintf(nb[4], sizeof(nb[4]), "%ld", c->probe_ms);
		v[0] = nb[4];
		r = sa_exec("SELECT destination, state, failures, paused, probe FROM queuebox._outbox_states($1)",
					1, v, "_outbox_states", e, elen);
		if ((ok = r != NULL))
		{
			out->states = calloc(PQntuples(r) + 1, sizeof(QbDestState));
			for (int i = 0; i < PQntuples(r); i++)
			{
				QbDestState *d = &out->states[out->nstates++];

				d->destination = sa_dup(r, i, 0);
				d->state = qb_circuit_parse(PQgetvalue(r, i, 1));
				d->failures = atoi(PQgetvalue(r, i, 2));
				d->paused = sa_true(r, i, 3);
				d->probe = sa_true(r, i, 4);
				if (d->probe)
					qb_pg_array_add(&probes, d->destination);
			}
			PQclear(r);
		}
		for (int i = 0; i < c->ndests; i++)
		{
			qb_pg_array_add(&a[0], c->dests[i]);
			qb_pg_array_add_int(&a[1], c->limits[i]);
			qb_pg_array_add_int(&a[2], c->floors ? c->floors[i] : 0);
		}
		snprintf(nb[0], sizeof(nb[0]), "%d", c->batch_size);
		snprintf(nb[1], sizeof(nb[1]), "%ld", c->lease_ms);
		snprintf(nb[2], sizeof(nb[2]), "%d", c->default_max_attempts);
		snprintf(nb[3], sizeof(nb[3]), "%lld", (long long) c->floor);
		v[0] = nb[0];
		v[1] = nb[1];
		v[2] = nb[2];
		v[3] = c->token;
		v[4] = nb[3];
		v[5] = qb_pg_array_text(&a[0]);
		v[6] = qb_pg_array_text(&a[1]);
		v[7] = qb_pg_array_text(&probes);
		v[8] = qb_pg_array_text(&a[2]);
		if (ok)
			r = sa_exec("SELECT * FROM queuebox._outbox_claim($1, $2, $3, $4, $5, $6, $7, $8, $9)",
						9, v, "_outbox_claim", e, elen);
		if (ok && (ok = r != NULL))
		{
			out->rows = calloc(PQntuples(r) + 1, sizeof(QbOutboxRow));
			for (int i = 0; i < PQntuples(r); i++)
			{
				QbOutboxRow *o = &out->rows[out->nrows++];

				o->id = strtoll(PQgetvalue(r, i, 0), NULL, 10);
				snprintf(o->message_id, sizeof(o->message_id), "%s", PQgetvalue(r, i, 1));
				o->topic = sa_dup(r, i, 2);
				o->key = sa_dup(r, i, 3);
				o->payload = sa_dup(r, i, 4);
				o->headers = sa_dup(r, i, 5);
				o->attempt = atoi(PQgetvalue(r, i, 6));
				o->max_attempts = atoi(PQgetvalue(r, i, 7));
				o->claimed = sa_true(r, i, 9);
				o->destination = sa_dup(r, i, 10);
				o->in_intake = sa_true(r, i, 11);
				o->not_due = sa_true(r, i, 12);
				o->probe = sa_true(r, i, 13);
			}
			PQclear(r);
		}
		qb_pg_array_free(&probes);
		for (int i = 0; i < 3; i++)
			qb_pg_array_free(&a[i]);
	}
	if (!ok)
		qb_cycle_out_free(out);
	return sa_end(ok);
}

/* sa_count: one wrapper call returning a count, in a transaction. */
static int
sa_count(const char *sql, int n, const char *const *v, int *count, char *e, size_t elen)
{
	PGresult   *r;

	sa_simple("BEGIN");
	r = sa_exec(sql, n, v, sql, e, elen);
	*count = r ? atoi(PQgetvalue(r, 0, 0)) : 0;
	PQclear(r);
	return sa_end(r != NULL);
}

static int
sa_unpark(void *ctx, const char *const *dests, int n, int limit, int *nmoved, char *e, size_t elen)
{
	QbPgArray	a = {0};
	const char *v[2];
	int			rc;

	for (int i = 0; i < n; i++)
		qb_pg_array_add(&a, dests[i]);
	v[0] = qb_pg_array_text(&a);
	v[1] = num(limit);
	rc = sa_count("SELECT queuebox._outbox_unpark($1::text[], $2)", 2, v, nmoved, e, elen);
	qb_pg_array_free(&a);
	return rc;
}

static int
sa_reclaim(void *ctx, int limit, int *n, char *e, size_t elen)
{
	const char *v[1] = {num(limit)};

	return sa_count("SELECT queuebox._outbox_reclaim($1)", 1, v, n, e, elen);
}

/* _outbox_retention has no floor argument: it walks from the start, *after stays */
static int
sa_retention(void *ctx, long sec, int limit, int64_t *after, int *n, char *e, size_t elen)
{
	const char *v[2] = {num(sec), num(limit)};

	return sa_count("SELECT queuebox._outbox_retention($1, $2)", 2, v, n, e, elen);
}

static int
sa_relay_claim(void *ctx, int batch, long lease_ms, const char *token, QbRelayRow **rows,
			   int *nrows, char *e, size_t elen)
{
	const char *v[3] = {num(batch), num(lease_ms), token};
	PGresult   *r;

	*rows = NULL;
	*nrows = 0;
	sa_simple("BEGIN");
	if ((r = sa_exec("SELECT id, source, event_type, traceparent FROM queuebox._relay_claim($1, $2, $3)", 3, v,
					 "_relay_claim", e, elen)) == NULL)
		return sa_end(false);
	*rows = calloc(PQntuples(r) + 1, sizeof(QbRelayRow));
	for (int i = 0; i < PQntuples(r); i++)
	{
		QbRelayRow *o = &(*rows)[(*nrows)++];

		o->id = strtoll(PQgetvalue(r, i, 0), NULL, 10);
		o->source = sa_dup(r, i, 1);
		o->event_type = sa_dup(r, i, 2);
		o->traceparent = sa_dup(r, i, 3);
	}
	PQclear(r);
	return sa_end(true);
}

/* the wrapper answers the rows settled; the inserted ones are counted around it */
static int
sa_relay_forward(void *ctx, const char *token, const int64_t *ids, const char *const *topics,
				 const bool *holds, int n, int max_attempts, int *nsettled, int *ninserted, char *e, size_t elen)
{
	static const char *count_sql = "SELECT count(*) FROM queuebox.outbox";
	QbPgArray	a = {0};
	QbPgArray	b = {0};
	const char *v[4];
	PGresult   *r = NULL;
	PGresult   *before;
	PGresult   *after = NULL;

	for (int i = 0; i < n; i++)
	{
		qb_pg_array_add_int(&a, ids[i]);
		qb_pg_array_add(&b, topics[i]);
	}
	v[0] = token;
	v[1] = qb_pg_array_text(&a);
	v[2] = qb_pg_array_text(&b);
	v[3] = num(max_attempts);
	sa_simple("BEGIN");
	before = sa_exec(count_sql, 0, NULL, "counting", e, elen);
	if (before != NULL)
		r = sa_exec("SELECT queuebox._relay_forward($1, $2, $3, $4)", 4, v, "_relay_forward", e, elen);
	if (r != NULL)
		after = sa_exec(count_sql, 0, NULL, "counting", e, elen);
	*nsettled = after ? atoi(PQgetvalue(r, 0, 0)) : 0;
	*ninserted = after ? atoi(PQgetvalue(after, 0, 0)) - atoi(PQgetvalue(before, 0, 0)) : 0;
	PQclear(before);
	PQclear(r);
	PQclear(after);
	qb_pg_array_free(&a);
	qb_pg_array_free(&b);
	return sa_end(after != NULL);
}

/* query_text: the SPI store's texts (qb_pg_stmts), as it runs them */
static int
sa_query_text(void *ctx, QbQuery qq, const char *const *params, long timeout_ms, char **out,
			  char *e, size_t elen)
{
	const char *v[3] = {"statement_timeout", num(timeout_ms), "t"};
	PGresult   *r;
	int			rc;

	*out = NULL;
	sa_simple("BEGIN");
	PQclear(sa_exec("SELECT set_config($1, $2, $3::bool)", 3, v, "timeout", e, elen));
	r = PQexecParams(spi_conn, qb_pg_stmts[QB_PG_S_QUERY + qq].sql,
					 qb_pg_stmts[QB_PG_S_QUERY + qq].nparams, NULL, params, NULL, NULL, 0);
	if (PQresultStatus(r) == PGRES_TUPLES_OK)
	{
		if (PQntuples(r) > 0)
			*out = sa_dup(r, 0, 0);
		PQclear(r);
		return sa_end(true);
	}
	snprintf(e, elen, "%s", PQresultErrorMessage(r));
	rc = qb_query_failure(PQresultErrorField(r, PG_DIAG_SQLSTATE));
	PQclear(r);
	sa_end(false);
	return rc;
}

static void
sa_store(QbStore *s)
{
	QbStore		fallback;

	qb_pq_store_ops(pq, &fallback);
	*s = (QbStore) {
		/* the adapter's own ops use spi_conn; the fallback ones take the pq store */
		.ctx = pq,
		.config_load = fallback.config_load,
		.outbox_cycle = sa_cycle,
		.outbox_unpark = sa_unpark,
		/* no SQL-callable wrapper: the same statement text, through the pq store */
		.outbox_unroute = fallback.outbox_unroute,
		.outbox_sweep = fallback.outbox_sweep,
		.outbox_reclaim = sa_reclaim,
		.outbox_retention = sa_retention,
		.inbox_insert = fallback.inbox_insert,
		.query_text = sa_query_text,
		.relay_claim = sa_relay_claim,
		.relay_forward = sa_relay_forward,
	};
}

/* ---- fixtures ------------------------------------------------------------------ */

static int
clean(void **state)
{
	rfree(q(D("TRUNCATE queuebox.outbox, queuebox.inbox, queuebox.destination_state",
			  "TRUNCATE TABLE queuebox.outbox; TRUNCATE TABLE queuebox.inbox; TRUNCATE TABLE queuebox.destination_state"), 0));
	assert_int_equal(outbox_count(NULL), 0);
	assert_int_equal(inbox_count(NULL), 0);
	qb_uuid_v4(token_a);
	qb_uuid_v4(token_b);
	qb_uuid_v4(token_c);
	return 0;
}

/* ---- the scenarios ---------------------------------------------------------------- */

/* Pending due rows are claimed once: two claimers, two tokens, disjoint rows. */
static void
test_claim_once(void **state)
{
	QbCycleOut	a,
				b,
				c;

	for (int i = 0; i < 5; i++)
		add_outbox("t.claim", NULL);
	assert_int_equal(outbox_count("pending"), 5);
	a = claim(3, 30000, token_a);
	b = claim(10, 30000, token_b);
	c = claim(10, 30000, token_c);
	assert_int_equal(nclaimed(&a), 3);
	assert_int_equal(nclaimed(&b), 2);
	assert_int_equal(nclaimed(&c), 0);
	for (int i = 0; i < a.nrows; i++)
		assert_false(claimed_id(&b, a.rows[i].id));
	assert_int_equal(outbox_count("processing"), 5);
	assert_int_equal(qv("SELECT count(*) FROM queuebox.outbox WHERE claim_token = $1", 1, token_a, NULL), 3);
	assert_int_equal(qv("SELECT count(*) FROM queuebox.outbox WHERE claim_token = $1", 1, token_b, NULL), 2);
	assert_string_equal(a.rows[0].topic, "t.claim");
	assert_int_equal(a.rows[0].attempt, 0);
	assert_int_equal(a.rows[0].max_attempts, 5);
	qb_cycle_out_free(&a);
	qb_cycle_out_free(&b);
	qb_cycle_out_free(&c);
}

/* One row per key in flight: the second is claimed only after the first settled. */
static void
test_key_order(void **state)
{
	int64_t		first = add_outbox("t.key", "k1");
	int64_t		second = add_outbox("t.key", "k1");
	int64_t		other = add_outbox("t.key", "k2");
	QbCycleOut	a = claim(10, 30000, token_a);
	QbCycleOut	b = claim(10, 30000, token_b);
	QbSettle	sent = {.id = first, .token = token_a, .kind = QB_SETTLE_SENT, .attempt = 1};
	QbCycleOut	c;

	assert_true(claimed_id(&a, first));
	assert_true(claimed_id(&a, other));
	assert_false(claimed_id(&a, second));
	assert_int_equal(nclaimed(&b), 0);
	assert_string_equal(outbox_state(second), "pending");
	/* the settle of the first row, and a claim, in one cycle */
	c = cycle(NULL, 0, &sent, 1, 10, 30000, token_c, NULL, 0);
	assert_int_equal(c.nsettled, 1);
	assert_true(claimed_id(&c, second));
	assert_string_equal(outbox_state(first), "sent");
	assert_string_equal(outbox_state(second), "processing");
	assert_int_equal(qv("SELECT count(*) FROM queuebox.outbox WHERE id = $1 AND claim_token = $2", 2,
						num(second), token_c), 1);
	qb_cycle_out_free(&a);
	qb_cycle_out_free(&b);
	qb_cycle_out_free(&c);
}

/* Settles are fenced by the token: sent, retry with its delay, dead. */
static void
test_settle_fenced(void **state)
{
	int64_t		r1 = add_outbox("t.settle", NULL);
	int64_t		r2 = add_outbox("t.settle", NULL);
	int64_t		r3 = add_outbox("t.settle", NULL);
	QbCycleOut	a = claim(10, 30000, token_a);
	QbSettle	wrong = {.id = r1, .token = token_b, .kind = QB_SETTLE_SENT, .attempt = 1};
	QbSettle	st[3] = {
		{.id = r1, .token = token_a, .kind = QB_SETTLE_SENT, .attempt = 1},
		{.id = r2, .token = token_a, .kind = QB_SETTLE_RETRY, .attempt = 1, .delay_ms = 60000,
		.error = "boom"},
		{.id = r3, .token = token_a, .kind = QB_SETTLE_DEAD, .attempt = 1, .error = "bad \"row\""},
	};
	QbCycleOut	b;

	assert_int_equal(nclaimed(&a), 3);
	assert_int_equal(settle(&wrong, 1), 0);
	assert_int_equal(outbox_count("processing"), 3);
	assert_int_equal(settle(st, 3), 3);
	assert_string_equal(outbox_state(r1), "sent");
	assert_string_equal(outbox_state(r2), "pending");
	assert_string_equal(outbox_state(r3), "dead");
	assert_int_equal(qv(D("SELECT count(*) FROM queuebox.outbox WHERE id = $1 AND attempt = 1"
						  " AND last_error = 'boom' AND scheduled_at > now() + interval '50 s'",
						  "SELECT COUNT(*) FROM queuebox.outbox WHERE id = ? AND attempt = 1"
						  " AND last_error = N'boom' AND scheduled_at > DATEADD(second, 50, SYSUTCDATETIME())"),
						1, num(r2), NULL), 1);
	if (babelfish)
		print_message("babelfish: last_error \"bad \\\"row\\\"\" is not judged (escapes kept)\n");
	else
		assert_string_equal(qs("SELECT last_error FROM queuebox.outbox WHERE id = $1", num(r3)),
							"bad \"row\"");
	/* settled again with the same token: nothing left to change */
	assert_int_equal(settle(st, 3), 0);
	/* the retry is not due */
	b = claim(10, 30000, token_b);
	assert_int_equal(nclaimed(&b), 0);
	qb_cycle_out_free(&a);
	qb_cycle_out_free(&b);
}

/* A release puts the row back with its attempt and due time unchanged. */
static void
test_release_keeps_attempt(void **state)
{
	int64_t		id = add_outbox("t.release", NULL);
	QbCycleOut	a,
				b;
	QbSettle	rel = {.id = id, .token = token_a, .kind = QB_SETTLE_RELEASE, .attempt = 2};

	rfree(q("UPDATE queuebox.outbox SET attempt = 2 WHERE id = $1", 1, num(id)));
	a = claim(10, 30000, token_a);
	assert_int_equal(nclaimed(&a), 1);
	assert_int_equal(a.rows[0].attempt, 2);
	assert_int_equal(settle(&rel, 1), 1);
	assert_string_equal(outbox_state(id), "pending");
	assert_int_equal(qv("SELECT attempt FROM queuebox.outbox WHERE id = $1", 1, num(id), NULL), 2);
	b = claim(10, 30000, token_b);
	assert_true(claimed_id(&b, id));
	assert_int_equal(b.rows[0].attempt, 2);
	qb_cycle_out_free(&a);
	qb_cycle_out_free(&b);
}

/* An expired lease is reclaimed; the row is claimable again, under a new token. */
static void
test_lease_reclaim(void **state)
{
	int64_t		id = add_outbox("t.lease", NULL);
	QbCycleOut	a = claim(10, 1, token_a);
	QbCycleOut	b;
	QbSettle	stale = {.id = id, .token = token_a, .kind = QB_SETTLE_SENT, .attempt = 1};
	QbSettle	fresh = {.id = id, .token = token_b, .kind = QB_SETTLE_SENT, .attempt = 1};
	int			n = -1;

	assert_int_equal(nclaimed(&a), 1);
	usleep(30 * 1000);
	assert_int_equal(store.outbox_reclaim(store.ctx, 10, &n, err, sizeof(err)), 0);
	assert_int_equal(n, 1);
	assert_string_equal(outbox_state(id), "pending");
	assert_int_equal(qv("SELECT count(*) FROM queuebox.outbox WHERE id = $1 AND claim_token IS NULL"
						" AND last_error LIKE 'lease expired%'", 1, num(id), NULL), 1);
	b = claim(10, 30000, token_b);
	assert_true(claimed_id(&b, id));
	assert_int_equal(settle(&stale, 1), 0);
	assert_int_equal(settle(&fresh, 1), 1);
	assert_string_equal(outbox_state(id), "sent");
	qb_cycle_out_free(&a);
	qb_cycle_out_free(&b);
}

/* Retention deletes old sent rows only. */
static void
test_retention(void **state)
{
	int64_t		old_sent = add_outbox("t.ret", NULL);
	int64_t		new_sent = add_outbox("t.ret", NULL);
	int64_t		old_dead = add_outbox("t.ret", NULL);
	int64_t		after = 0;
	int			n = -1;

	rfree(q("UPDATE queuebox.outbox SET state = 'sent' WHERE id IN ($1, $2)", 2,
			  num(old_sent), num(new_sent)));
	rfree(q("UPDATE queuebox.outbox SET state = 'dead' WHERE id = $1", 1, num(old_dead)));
	rfree(q(D("UPDATE queuebox.outbox SET created_at = now() - interval '2 hours' WHERE id IN ($1, $2)",
			  "UPDATE queuebox.outbox SET created_at = DATEADD(hour, -2, SYSUTCDATETIME()) WHERE id IN (?, ?)"),
			2, num(old_sent), num(old_dead)));
	assert_int_equal(outbox_count(NULL), 3);
	assert_int_equal(store.outbox_retention(store.ctx, 3600, 100, &after, &n, err, sizeof(err)), 0);
	assert_int_equal(n, 1);
	assert_int_equal(outbox_count(NULL), 2);
	assert_int_equal(qv("SELECT count(*) FROM queuebox.outbox WHERE id = $1", 1, num(old_sent), NULL), 0);
	/* the walk took the old sent row and the young one; it passed the dead row */
	assert_int_equal(after, kind_pq ? new_sent : 0);
}

/*
 * Retention's floor: a batch walks the ids after it and answers the highest
 * it took.  The pq store honours it; the SQL function (two arguments) and
 * the odbc store, whose filtered index holds only the rows it deletes, walk
 * from the start and leave it as it is.
 */
static void
test_retention_floor(void **state)
{
	int64_t		a = add_outbox("t.ret", NULL);
	int64_t		b = add_outbox("t.ret", NULL);
	int64_t		c = add_outbox("t.ret", NULL);
	int64_t		d = add_outbox("t.ret", NULL);
	int64_t		after = c;
	int			n = -1;

	rfree(q("UPDATE queuebox.outbox SET state = 'sent' WHERE id IN ($1, $2, $3)", 3,
			num(a), num(c), num(d)));
	rfree(q("UPDATE queuebox.outbox SET state = 'dead' WHERE id = $1", 1, num(b)));
	rfree(q(D("UPDATE queuebox.outbox SET created_at = now() - interval '2 hours' WHERE id IN ($1, $2, $3)",
			  "UPDATE queuebox.outbox SET created_at = DATEADD(hour, -2, SYSUTCDATETIME()) WHERE id IN (?, ?, ?)"),
			3, num(a), num(b), num(c)));
	/* from c on: only the young d is past the floor */
	assert_int_equal(store.outbox_retention(store.ctx, 3600, 100, &after, &n, err, sizeof(err)), 0);
	assert_int_equal(n, kind_pq ? 0 : 2);
	assert_int_equal(after, kind_pq ? d : c);
	assert_int_equal(outbox_count(NULL), kind_pq ? 4 : 2);
	/* a new run, from the start: a and c go, the dead b and the young d stay */
	after = 0;
	assert_int_equal(store.outbox_retention(store.ctx, 3600, 100, &after, &n, err, sizeof(err)), 0);
	assert_int_equal(n, kind_pq ? 2 : 0);
	assert_int_equal(after, kind_pq ? d : 0);
	assert_int_equal(outbox_count(NULL), 2);
	assert_int_equal(qv("SELECT count(*) FROM queuebox.outbox WHERE id IN ($1, $2)", 2, num(b), num(d)), 2);
}

static void
insert_inbox(const QbInboxRow *rows, int n, int64_t *ids)
{
	/* generous: a TDS engine compiles a session's first call for seconds under load */
	if (store.inbox_insert(store.ctx, rows, n, 30000, ids, err, sizeof(err)) != 0)
		fail_msg("inbox_insert failed: %s", err);
}

/*
 * The relay: claim push rows, each with its traceparent header in any
 * letter case (NULL: none), forward them (the mapping; an empty topic is
 * dead).
 */
static void
test_relay(void **state)
{
	QbInboxRow	in[2] = {
		{.source = "web", .idempotency_key = "r1", .event_type = "order.created",
			.aggregate_id = "agg-1", .payload = "{\"id\": \"r1\"}",
			.headers = "{\"X-Correlation-Id\": \"c-9\", \"x-source\": \"forged\","
		" \"TraceParent\": \"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\"}"},
		{.source = "web", .idempotency_key = "r2", .payload = "{\"id\": \"r2\"}", .headers = "{}"},
	};
	int64_t		ids[2];
	QbRelayRow *rows = NULL;
	QbRelayRow *r1;
	int			nrows = 0;
	int64_t		fids[2];
	const char *topics[2];
	int			nsettled = -1,
				ninserted = -1;
	Res		   *res;

	insert_inbox(in, 2, ids);
	assert_int_equal(inbox_count("pending"), 2);
	assert_int_equal(store.relay_claim(store.ctx, 10, 30000, token_a, &rows, &nrows, err,
									   sizeof(err)), 0);
	assert_int_equal(nrows, 2);
	assert_int_equal(inbox_count("processing"), 2);
	for (int i = 0; i < 2; i++)
	{
		fids[i] = rows[i].id;
		topics[i] = rows[i].event_type ? "web.order.created" : "";
	}
	assert_string_equal(rows[0].source, "web");
	r1 = rows[0].id == ids[0] ? &rows[0] : &rows[1];
	assert_non_null(r1->traceparent);
	assert_string_equal(r1->traceparent, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
	assert_null(rows[r1 == &rows[0] ? 1 : 0].traceparent);
	assert_int_equal(store.relay_forward(store.ctx, token_b, fids, topics, NULL, 2, 7, &nsettled,
										 &ninserted, err, sizeof(err)), 0);
	assert_int_equal(nsettled, 0);	/* fenced */
	assert_int_equal(outbox_count(NULL), 0);
	assert_int_equal(store.relay_forward(store.ctx, token_a, fids, topics, NULL, 2, 7, &nsettled,
										 &ninserted, err, sizeof(err)), 0);
	assert_int_equal(nsettled, 2);
	assert_int_equal(ninserted, 1);
	assert_int_equal(inbox_count("processed"), 1);
	assert_int_equal(inbox_count("dead"), 1);
	assert_int_equal(qv("SELECT count(*) FROM queuebox.inbox WHERE idempotency_key = 'r2'"
						" AND last_error LIKE '%rendered empty%'", 0, NULL, NULL), 1);
	res = q(D("SELECT topic, key, max_attempts, headers->>'x-inbox-id', headers->>'x-source',"
			  " headers->>'x-idempotency-key', headers->>'X-Correlation-Id' FROM queuebox.outbox",
			  "SELECT topic, [key], max_attempts, JSON_VALUE(headers, '$.\"x-inbox-id\"'),"
			  " JSON_VALUE(headers, '$.\"x-source\"'), JSON_VALUE(headers, '$.\"x-idempotency-key\"'),"
			  " JSON_VALUE(headers, '$.\"X-Correlation-Id\"') FROM queuebox.outbox"), 0);
	assert_int_equal(res->n, 1);
	assert_string_equal(rv(res, 0, 0), "web.order.created");
	assert_string_equal(rv(res, 0, 1), "agg-1");
	assert_string_equal(rv(res, 0, 2), "7");
	assert_string_equal(rv(res, 0, 3), num(ids[0]));
	assert_string_equal(rv(res, 0, 4), "web");
	assert_string_equal(rv(res, 0, 5), "r1");
	assert_string_equal(rv(res, 0, 6), "c-9");
	rfree(res);
	qb_relay_rows_free(rows, nrows);
}

/* The inbox insert: new ids, duplicates 0 (also within one call), values kept as sent. */
static void
test_inbox_insert(void **state)
{
	const char *odd = babelfish ? "k'1,{x} NULL;" : "k\"1\\,{x} NULL";
	QbInboxRow	in[4] = {
		{.source = "web", .idempotency_key = "a", .payload = "{}", .headers = "{}"},
		{.source = "web", .idempotency_key = odd, .event_type = babelfish ? "e,'t'" : "e,\"t\"",
			.payload = babelfish ? "{\"s\": \"\xc3\xa9/\"}" : "{\"s\": \"\\u00e9\\\\\"}",
		.headers = "{\"h\": \"{v}\"}", .pull = true},
		{.source = "web", .idempotency_key = "a", .payload = "{}", .headers = "{}"},
		{.source = "web", .idempotency_key = "d", .payload = "{}", .headers = "{}",
		.dead_error = "not JSON"},
	};
	int64_t		ids[4];
	int64_t		again[1];

	insert_inbox(in, 4, ids);
	assert_true(ids[0] > 0);
	assert_true(ids[1] > 0);
	assert_int_equal(ids[2], 0);
	assert_true(ids[3] > 0);
	assert_int_equal(inbox_count(NULL), 3);
	assert_int_equal(inbox_count("dead"), 1);
	assert_string_equal(qs("SELECT idempotency_key FROM queuebox.inbox WHERE id = $1", num(ids[1])), odd);
	assert_string_equal(qs(D("SELECT event_type || '|' || consumption || '|' || (payload->>'s')"
							 " || '|' || (headers->>'h') FROM queuebox.inbox WHERE id = $1",
							 "SELECT CONCAT(event_type, N'|', consumption, N'|', JSON_VALUE(payload, '$.s'),"
							 " N'|', JSON_VALUE(headers, '$.h')) FROM queuebox.inbox WHERE id = ?"),
						   num(ids[1])), babelfish ? "e,'t'|pull|\xc3\xa9/|{v}" : "e,\"t\"|pull|\xc3\xa9\\|{v}");
	insert_inbox(in, 1, again);
	assert_int_equal(again[0], 0);
	assert_int_equal(inbox_count(NULL), 3);
}

/* The insert's timeout is honoured: a row lock held elsewhere, the call gives up. */
static void
test_inbox_insert_timeout(void **state)
{
	QbInboxRow	in = {.source = "web", .idempotency_key = "locked", .payload = "{}", .headers = "{}"};
	int64_t		id = -1;
	struct timespec t0,
				t1;
	long		ms;

	/* an uncommitted row of the same key: ON CONFLICT must wait for it */
	rfree(q("BEGIN", 0));
	rfree(q("INSERT INTO queuebox.inbox (source, idempotency_key, payload, headers, consumption)"
			  " VALUES ('web', 'locked', '{}', '{}', 'push')", 0));
	clock_gettime(CLOCK_MONOTONIC, &t0);
	assert_int_equal(store.inbox_insert(store.ctx, &in, 1, 300, &id, err, sizeof(err)), -1);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	ms = (t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000;
	assert_non_null(strstr(err, "statement timeout"));
	assert_int_equal(id, 0);
	/* it waited for the lock (no upper bound: returning at all is the timeout) */
	assert_true(ms >= 250);
	rfree(q("ROLLBACK", 0));
	assert_int_equal(inbox_count(NULL), 0);
	/* the store is usable at once: a timeout is not a lost connection */
	insert_inbox(&in, 1, &id);
	assert_true(id > 0);
}

/* query_text: gauges, dead rows, requeue, replay, and what failures mean. */
static void
test_query_text(void **state)
{
	int64_t		dead = add_outbox("t.q", NULL);
	QbInboxRow	in[2] = {
		{.source = "web", .idempotency_key = "q1", .event_type = "order.paid", .payload = "{}",
		.headers = "{}"},
		{.source = "web", .idempotency_key = "q2", .payload = "{}", .headers = "{}"},
	};
	int64_t		ids[2];
	char	   *out = NULL;
	json_t	   *j;
	char		want[64];
	long long	new_id;

	add_outbox("t.q", NULL);
	rfree(q("UPDATE queuebox.outbox SET state = 'dead', last_error = 'x' WHERE id = $1", 1, num(dead)));
	insert_inbox(in, 2, ids);

	assert_int_equal(query(QB_Q_READY, &out, NULL, NULL, NULL, NULL), 0);
	free(out);
	assert_int_equal(query(QB_Q_GAUGES, &out, NULL, NULL, NULL, NULL), 0);
	j = json_loads(out, 0, NULL);
	assert_non_null(j);
	assert_int_equal(json_integer_value(json_object_get(j, "outbox_pending")), 1);
	assert_int_equal(json_integer_value(json_object_get(j, "inbox_pending")), 2);
	assert_true(json_is_object(json_object_get(j, "circuits")));
	json_decref(j);
	free(out);

	/*
	 * the console's overview: the open and dead rows by table; a destination
	 * known by its state row, with one row parked behind its key and one
	 * retrying
	 */
	rfree(q(D("INSERT INTO queuebox.destination_state (destination, state) VALUES ('cx', 'open')",
			  "INSERT INTO queuebox.destination_state (destination, state) VALUES (N'cx', N'open')"), 0));
	rfree(q(D("INSERT INTO queuebox.outbox (topic, key, payload, destination, hold, attempt)"
			  " VALUES ('t.cx', 'k', '{}', 'cx', 'key', 0), ('t.cx', 'k2', '{}', 'cx', NULL, 2)",
			  "INSERT INTO queuebox.outbox (topic, [key], payload, destination, hold, attempt)"
			  " VALUES (N't.cx', N'k', N'{}', N'cx', N'key', 0), (N't.cx', N'k2', N'{}', N'cx', NULL, 2)"), 0));
	assert_int_equal(query(QB_Q_OVERVIEW, &out, NULL, NULL, NULL, NULL), 0);
	j = json_loads(out, 0, NULL);
	assert_non_null(j);
	{
		/*
		 * the list also names the configuration's destinations, which the
		 * daemon's migration records in config_destination on SQL Server
		 */
		json_t	   *d = NULL,
				   *e;
		size_t		i;

		json_array_foreach(json_object_get(j, "destinations"), i, e)
		{
			const char *n = json_string_value(json_object_get(e, "destination"));

			if (n != NULL && strcmp(n, "cx") == 0)
				d = e;
		}
		assert_non_null(d);
		assert_string_equal(json_string_value(json_object_get(d, "state")), "open");
		assert_int_equal(json_integer_value(json_object_get(d, "pending")), 2);
		assert_int_equal(json_integer_value(json_object_get(d, "intake")), 0);
		assert_int_equal(json_integer_value(json_object_get(d, "retrying")), 1);
		assert_int_equal(json_integer_value(json_object_get(d, "parked")), 1);
		assert_int_equal(json_integer_value(json_object_get(d, "held")), 0);
		assert_true(json_is_number(json_object_get(d, "oldest_pending_sec")));
	}
	assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "outbox"), "pending")), 3);
	assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "outbox"), "dead")), 1);
	assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "inbox"), "pending")), 2);
	assert_true(json_is_number(json_object_get(json_object_get(j, "inbox"), "oldest_pending_sec")));
	json_decref(j);
	free(out);
	rfree(q(D("DELETE FROM queuebox.outbox WHERE topic = 't.cx'", "DELETE FROM queuebox.outbox WHERE topic = N't.cx'"), 0));
	rfree(q(D("DELETE FROM queuebox.destination_state WHERE destination = 'cx'",
			  "DELETE FROM queuebox.destination_state WHERE destination = N'cx'"), 0));

	{
		/* the dead list's page: the limit is its eighth parameter */
		const char *dp[10] = {NULL, NULL, NULL, NULL, NULL, NULL, NULL, "10"};
		json_t	   *rows;

		assert_int_equal(store.query_text(store.ctx, QB_Q_DEAD_OUTBOX, dp, 10000, &out, err, sizeof(err)), 0);
		j = json_loads(out, 0, NULL);
		rows = json_object_get(j, "rows");
		assert_int_equal(json_array_size(rows), 1);
		assert_int_equal(json_integer_value(json_object_get(json_array_get(rows, 0), "id")), dead);
		assert_true(json_is_null(json_object_get(j, "next_after")));
		json_decref(j);
		free(out);
	}

	/* replay of an outbox row: a new row; requeue of the dead one */
	assert_int_equal(query(QB_Q_REPLAY_OUTBOX, &out, num(dead), NULL, NULL, NULL), 0);
	new_id = qv("SELECT max(id) FROM queuebox.outbox", 0, NULL, NULL);
	snprintf(want, sizeof(want), "{\"id\" : %lld}", new_id);
	assert_string_equal(out, want);
	free(out);
	assert_int_equal(query(QB_Q_REQUEUE_OUTBOX, &out, num(dead), NULL, NULL, NULL), 0);
	assert_string_equal(out, "{\"requeued\" : true}");
	free(out);
	assert_string_equal(outbox_state(dead), "pending");

	/* replay of an inbox row renders its topic ("{{ eventType }}") from the configuration */
	assert_int_equal(query(QB_Q_REPLAY_INBOX, &out, num(ids[0]), NULL, NULL, NULL), 0);
	new_id = qv("SELECT max(id) FROM queuebox.outbox", 0, NULL, NULL);
	snprintf(want, sizeof(want), "{\"id\" : %lld}", new_id);
	assert_string_equal(out, want);
	free(out);
	assert_string_equal(qs("SELECT topic FROM queuebox.outbox WHERE id = $1", num(new_id)),
						"order.paid");
	assert_int_equal(qv("SELECT max_attempts FROM queuebox.outbox WHERE id = $1", 1, num(new_id), NULL), 6);
	/* the bulk form skips the row whose topic renders empty */
	assert_int_equal(query(QB_Q_REPLAY_INBOX_BULK, &out, NULL, "web", NULL, NULL), 0);
	assert_string_equal(out, "{\"replayed\" : 1}");
	free(out);
	assert_int_equal(outbox_count(NULL), 5);

	/* failures: not found, an empty topic, a malformed timestamp */
	assert_int_equal(query(QB_Q_REPLAY_INBOX, &out, "999999", NULL, NULL, NULL), QB_QUERY_NOT_FOUND);
	assert_null(out);
	assert_non_null(strstr(err, "inbox row 999999 does not exist"));
	assert_int_equal(query(QB_Q_REPLAY_INBOX, &out, num(ids[1]), NULL, NULL, NULL), QB_QUERY_BAD_INPUT);
	assert_non_null(strstr(err, "renders empty"));
	assert_int_equal(query(QB_Q_REPLAY_OUTBOX_BULK, &out, "dead", NULL, "not a time", NULL),
					 QB_QUERY_BAD_INPUT);
	assert_int_equal(query(QB_Q_REPLAY_INBOX_BULK, &out, NULL, NULL, "not a time", NULL),
					 QB_QUERY_BAD_INPUT);
	assert_int_equal(query(QB_Q_REPLAY_INBOX, &out, "x1", NULL, NULL, NULL), QB_QUERY_BAD_INPUT);
	assert_int_equal(outbox_count(NULL), 5);
}

/* The destination breaker: failures at the threshold open the circuit; states show it. */
static void
test_breaker(void **state)
{
	QbDestTally t[2] = {
		{.destination = "d1", .failed = 3, .error = "HTTP 500", .threshold = 3, .cooldown_ms = 60000},
		{.destination = "d2", .failed = 1, .error = "HTTP 502", .threshold = 3, .cooldown_ms = 60000},
	};
	const char *dests[2] = {"d1", "d2"};
	int64_t		row = add_outbox("t.brk", NULL);
	QbCycleOut	o;
	bool		d1_open = false,
				d2_counted = false;
	char	   *out = NULL;
	json_t	   *j;

	rfree(q("UPDATE queuebox.outbox SET destination = 'd1', hold = NULL WHERE id = $1", 1, num(row)));
	o = cycle(t, 2, NULL, 0, 0, 0, NULL, NULL, 0);
	assert_int_equal(o.nchanges, 2);
	for (int i = 0; i < o.nchanges; i++)
		if (strcmp(o.changes[i].destination, "d1") == 0)
		{
			assert_int_equal(o.changes[i].old_state, QB_CIRCUIT_CLOSED);
			assert_int_equal(o.changes[i].new_state, QB_CIRCUIT_OPEN);
		}
		else
			assert_int_equal(o.changes[i].new_state, QB_CIRCUIT_CLOSED);
	qb_cycle_out_free(&o);
	/* the claim's states: d1 open, d2 with a failure counted; d1's row not claimed */
	o = cycle(NULL, 0, NULL, 0, 10, 30000, token_a, dests, 2);
	for (int i = 0; i < o.nstates; i++)
	{
		if (strcmp(o.states[i].destination, "d1") == 0)
			d1_open = o.states[i].state == QB_CIRCUIT_OPEN;
		if (strcmp(o.states[i].destination, "d2") == 0)
			d2_counted = o.states[i].state == QB_CIRCUIT_CLOSED && o.states[i].failures == 1;
	}
	assert_true(d1_open);
	assert_true(d2_counted);
	assert_false(claimed_id(&o, row));
	qb_cycle_out_free(&o);
	assert_int_equal(query(QB_Q_GAUGES, &out, NULL, NULL, NULL, NULL), 0);
	j = json_loads(out, 0, NULL);
	assert_string_equal(json_string_value(json_object_get(json_object_get(j, "circuits"), "d1")), "open");
	json_decref(j);
	free(out);
	assert_string_equal(outbox_state(row), "pending");
}

/* breaker_move: one tally into d1's breaker; its circuit's move. */
static void
breaker_move(const QbDestTally *t, QbCircuit from, QbCircuit to)
{
	QbCycleOut	o = cycle(t, 1, NULL, 0, 0, 0, NULL, NULL, 0);

	assert_int_equal(o.nchanges, 1);
	assert_string_equal(o.changes[0].destination, "d1");
	assert_int_equal(o.changes[0].old_state, from);
	assert_int_equal(o.changes[0].new_state, to);
	qb_cycle_out_free(&o);
}

/*
 * A late success (issue 38): an open or half-open circuit is closed only by
 * a success sent after it opened.  A success sent a minute before (a
 * request answered just before a partition, settled late) leaves it open,
 * its failures counted; one sent now (the probe) closes it.  The spi
 * adapter's _outbox_breaker() takes no send time (its schema is 0.3.4's):
 * the extension's store is held to it end to end (TAP 021).
 */
static void
test_breaker_late_success(void **state)
{
	QbDestTally fail = {.destination = "d1", .failed = 3, .error = "HTTP 503", .threshold = 3,
	.cooldown_ms = 60000};
	QbDestTally late = {.destination = "d1", .ok = 1, .ok_sent_ago_us = 60 * 1000000LL,
	.threshold = 3, .cooldown_ms = 60000};
	QbDestTally fresh = {.destination = "d1", .ok = 1, .ok_sent_ago_us = 0, .threshold = 3,
	.cooldown_ms = 60000};

	if (!kind_pq && !mssql)
	{
		print_message("spi: _outbox_breaker() takes no send time; TAP 021 covers the extension's store\n");
		skip();
	}
	breaker_move(&fail, QB_CIRCUIT_CLOSED, QB_CIRCUIT_OPEN);
	breaker_move(&late, QB_CIRCUIT_OPEN, QB_CIRCUIT_OPEN);
	assert_int_equal(qv("SELECT failures FROM queuebox.destination_state WHERE destination = 'd1'",
						0, NULL, NULL), 3);
	/* half-open (its cooldown over, a claim's states moved it): the same */
	rfree(q("UPDATE queuebox.destination_state SET state = 'half-open' WHERE destination = 'd1'", 0));
	breaker_move(&late, QB_CIRCUIT_HALF_OPEN, QB_CIRCUIT_HALF_OPEN);
	breaker_move(&fresh, QB_CIRCUIT_HALF_OPEN, QB_CIRCUIT_CLOSED);
	assert_int_equal(qv("SELECT failures FROM queuebox.destination_state WHERE destination = 'd1'",
						0, NULL, NULL), 0);
	/* closed: any success resets the count, however old */
	fail.failed = 1;
	breaker_move(&fail, QB_CIRCUIT_CLOSED, QB_CIRCUIT_CLOSED);
	breaker_move(&late, QB_CIRCUIT_CLOSED, QB_CIRCUIT_CLOSED);
	assert_int_equal(qv("SELECT failures FROM queuebox.destination_state WHERE destination = 'd1'",
						0, NULL, NULL), 0);
}

/* Rows held for a destination taking rows again are unparked; rows of a removed one unrouted. */
static void
test_unpark_unroute(void **state)
{
	int64_t		held = add_outbox("t.hold", NULL);
	int64_t		routed = add_outbox("t.hold", NULL);
	const char *d1[1] = {"d1"};
	const char *gone[1] = {"d2"};
	int			n = -1;

	rfree(q("UPDATE queuebox.outbox SET destination = 'd1', hold = 'destination' WHERE id = $1",
			  1, num(held)));
	rfree(q("UPDATE queuebox.outbox SET destination = 'd1', hold = NULL WHERE id = $1", 1, num(routed)));
	assert_int_equal(store.outbox_unpark(store.ctx, d1, 1, 10, &n, err, sizeof(err)), 0);
	assert_int_equal(n, 1);
	assert_int_equal(qv("SELECT count(*) FROM queuebox.outbox WHERE hold IS NULL AND destination = 'd1'",
						0, NULL, NULL), 2);
	assert_int_equal(store.outbox_unroute(store.ctx, gone, 1, &n, err, sizeof(err)), 0);
	assert_int_equal(n, 2);
	assert_int_equal(qv("SELECT count(*) FROM queuebox.outbox WHERE hold = 'ready' AND destination IS NULL",
						0, NULL, NULL), 2);
	assert_int_equal(outbox_count("pending"), 2);
}

/*
 * The sweep: a row parked behind its key whose earlier rows have all ended
 * (the state an engine that ignores the park's share lock leaves, or an
 * operator's UPDATE) is released; a row with an earlier open row stays
 * parked.  The walk goes key by key from where the last one stopped.
 */
static void
test_sweep(void **state)
{
	int64_t		a1 = add_outbox("t.sweep", "k1");
	int64_t		a2 = add_outbox("t.sweep", "k1");
	int64_t		a3 = add_outbox("t.sweep", "k1");
	int64_t		b1 = add_outbox("t.sweep", "k2");
	int64_t		b2 = add_outbox("t.sweep", "k2");
	int64_t		c1 = add_outbox("t.sweep", "k3");
	char	   *next = NULL;
	int			n = -1;

	/* k1: its first row sent by hand, the next two parked (a2 stranded) */
	rfree(q("UPDATE queuebox.outbox SET state = 'sent' WHERE id = $1", 1, num(a1)));
	rfree(q("UPDATE queuebox.outbox SET hold = 'key' WHERE id IN ($1, $2)", 2, num(a2), num(a3)));
	/* k2: its first row not met yet, the second parked behind it */
	rfree(q("UPDATE queuebox.outbox SET hold = 'key' WHERE id = $1", 1, num(b2)));
	/* k3: its only row parked, routed to d1 (stranded) */
	rfree(q("UPDATE queuebox.outbox SET hold = 'key', destination = 'd1' WHERE id = $1", 1, num(c1)));
	assert_int_equal(qv("SELECT count(*) FROM queuebox.outbox WHERE hold = 'key'", 0, NULL, NULL), 4);

	/* two keys: k1 (a2 released to ready) and k2; the next walk starts at k2 */
	assert_int_equal(store.outbox_sweep(store.ctx, "", 2, &n, &next, err, sizeof(err)), 0);
	assert_int_equal(n, 1);
	assert_non_null(next);
	assert_string_equal(next, "k2");
	assert_int_equal(qv("SELECT count(*) FROM queuebox.outbox WHERE id = $1 AND state = 'pending'"
						" AND hold = 'ready'", 1, num(a2), NULL), 1);
	free(next);
	next = NULL;
	/* from k2: k3's row goes back to its destination's routed rows; the walk ends */
	assert_int_equal(store.outbox_sweep(store.ctx, "k2", 10, &n, &next, err, sizeof(err)), 0);
	assert_int_equal(n, 1);
	assert_null(next);
	assert_int_equal(qv("SELECT count(*) FROM queuebox.outbox WHERE id = $1 AND state = 'pending'"
						" AND hold IS NULL AND destination = 'd1'", 1, num(c1), NULL), 1);
	/* again from the first key: a3 and b2 wait behind open rows, nothing changes */
	assert_int_equal(store.outbox_sweep(store.ctx, "", 10, &n, &next, err, sizeof(err)), 0);
	assert_int_equal(n, 0);
	assert_null(next);
	assert_int_equal(qv("SELECT count(*) FROM queuebox.outbox WHERE hold = 'key'", 0, NULL, NULL), 2);
	assert_int_equal(qv("SELECT count(*) FROM queuebox.outbox WHERE hold = 'key' AND id IN ($1, $2)",
						2, num(a3), num(b2)), 2);
	assert_int_equal(outbox_count("pending"), 5);
	assert_int_equal(outbox_count("sent"), 1);
	(void) b1;
}

/* pq: wait for a NOTIFY on the store's socket; the count drained. */
static int
wait_notified(void)
{
	struct pollfd p = {.fd = qb_pq_store_socket(pq), .events = POLLIN};
	int			n = 0;

	for (int i = 0; i < 50 && n == 0; i++)
	{
		(void) poll(&p, 1, 100);
		n = qb_pq_store_notified(pq);
	}
	return n;
}

/* pq: the backend killed; the next op fails, a later one reconnects (and LISTENs again). */
static void
test_pq_backend_killed(void **state)
{
	char	   *out = NULL;
	long long	pid;

	assert_int_equal(qb_pq_store_listen(pq, "qb_conformance", err, sizeof(err)), 0);
	assert_int_equal(query(QB_Q_READY, &out, NULL, NULL, NULL, NULL), 0);
	free(out);
	rfree(q("SELECT pg_notify($1, '')", 1, "qb_conformance"));
	assert_true(wait_notified() >= 1);
	pid = qv("SELECT pid FROM pg_stat_activity WHERE application_name = $1", 1, APP_NAME, NULL);
	assert_true(pid > 0);
	assert_int_equal(qv("SELECT pg_terminate_backend($1::int)::int", 1, num(pid), NULL), 1);
	for (int i = 0; i < 100 && qv("SELECT count(*) FROM pg_stat_activity WHERE pid = $1::int", 1,
								  num(pid), NULL) > 0; i++)
		usleep(20 * 1000);
	assert_int_equal(query(QB_Q_READY, &out, NULL, NULL, NULL, NULL), -1);
	assert_null(out);
	assert_true(strlen(err) > 0);
	assert_int_equal(query(QB_Q_READY, &out, NULL, NULL, NULL, NULL), 0);
	free(out);
	assert_true(qv("SELECT pid FROM pg_stat_activity WHERE application_name = $1", 1, APP_NAME,
				   NULL) != pid);
	rfree(q("SELECT pg_notify($1, '')", 1, "qb_conformance"));
	assert_true(wait_notified() >= 1);
}

/* pq: a wrong password is a clear error, retried with the backoff. */
static void
test_pq_wrong_password(void **state)
{
	const char *bad = getenv("QB_CONFORMANCE_BAD_DSN");
	const char *secret = getenv("QB_CONFORMANCE_BAD_PASSWORD");
	QbPqConf	c = {.url = bad, .application_name = "qb bad", .connect_timeout_ms = 3000};
	QbPqStore  *s;
	QbStore		st;
	char	   *out = NULL;
	const char *const none[1] = {NULL};
	char	   *p;

	if (bad == NULL)
	{
		print_message("QB_CONFORMANCE_BAD_DSN is not set: the wrong-password scenario is skipped\n");
		skip();
	}
	s = qb_pq_store_new(&c);
	qb_pq_store_ops(s, &st);
	assert_int_equal(qb_pq_store_connect(s, err, sizeof(err)), -1);
	print_message("wrong password: %s\n", err);
	assert_non_null(strstr(err, "password authentication failed"));
	assert_null(strstr(err, "next try"));
	if (secret != NULL)
		assert_null(strstr(err, secret));
	/* at once again: the backoff answers without trying */
	assert_int_equal(st.query_text(st.ctx, QB_Q_READY, none, 1000, &out, err, sizeof(err)), -1);
	assert_non_null(strstr(err, "database unreachable, next try in "));
	assert_non_null(strstr(err, "password authentication failed"));
	assert_int_equal(qb_pq_store_socket(s), -1);
	/* after the wait, a new try, then a longer wait */
	usleep(300 * 1000);
	assert_int_equal(qb_pq_store_connect(s, err, sizeof(err)), -1);
	assert_null(strstr(err, "next try"));
	assert_int_equal(qb_pq_store_connect(s, err, sizeof(err)), -1);
	p = strstr(err, "next try in ");
	assert_non_null(p);
	assert_in_range(strtol(p + strlen("next try in "), NULL, 10), 300, 500);
	qb_pq_store_free(s);
}

/* pq: an unreachable server is a clear error; the URL's password is in no message. */
static void
test_pq_unreachable(void **state)
{
	QbPqConf	c = {.url = "postgresql://qb_user:Hunter2-secret@127.0.0.1:1/qbdb?sslmode=disable",
	.application_name = "qb unreachable", .connect_timeout_ms = 1500};
	QbPqStore  *s = qb_pq_store_new(&c);
	QbStore		st;
	int			n = -1;

	qb_pq_store_ops(s, &st);
	assert_int_equal(st.outbox_reclaim(st.ctx, 10, &n, err, sizeof(err)), -1);
	print_message("unreachable: %s\n", err);
	assert_non_null(strstr(err, "connecting to PostgreSQL at qb_user@127.0.0.1:1/qbdb"));
	assert_non_null(strstr(err, "refused"));
	assert_null(strstr(err, "Hunter2"));
	assert_int_equal(n, 0);
	assert_int_equal(st.outbox_reclaim(st.ctx, 10, &n, err, sizeof(err)), -1);
	assert_non_null(strstr(err, "database unreachable, next try in "));
	assert_null(strstr(err, "Hunter2"));
	qb_pq_store_free(s);
}

/* odbc: a wrong password is a clear error, with no secret in it, retried with the backoff. */
static void
test_odbc_wrong_password(void **state)
{
	const char *bad = getenv("QB_CONFORMANCE_BAD_MSSQL_URL");
	QbOdbcStore *s;
	QbStore		st;
	char	   *out = NULL;
	const char *const none[1] = {NULL};

	if (bad == NULL)
	{
		print_message("QB_CONFORMANCE_BAD_MSSQL_URL is not set: the wrong-password scenario is skipped\n");
		skip();
	}
	s = qb_odbc_store_new(&(QbOdbcConf) {.url = bad, .application_name = "qb bad",
		.connect_timeout_ms = 5000}, err, sizeof(err));
	assert_non_null(s);
	qb_odbc_store_ops(s, &st);
	assert_int_equal(qb_odbc_store_connect(s, err, sizeof(err)), -1);
	print_message("wrong password: %s\n", err);
	assert_non_null(strstr(err, "connecting to "));
	assert_non_null(strstr(err, "SQLSTATE"));
	assert_null(strstr(err, "Wrong-Secret-9"));
	assert_int_equal(st.query_text(st.ctx, QB_Q_READY, none, 1000, &out, err, sizeof(err)), -1);
	assert_non_null(strstr(err, "database unreachable, next try in "));
	assert_null(strstr(err, "Wrong-Secret-9"));
	qb_odbc_store_free(s);
}

/* odbc: an unreachable server is a clear error; the URL's password is in no message. */
static void
test_odbc_unreachable(void **state)
{
	QbOdbcStore *s = qb_odbc_store_new(&(QbOdbcConf) {
		.url = "sqlserver://qb_user:Hunter2%3Bse%7Dcret@127.0.0.1:1/qbdb?encrypt=false",
		.application_name = "qb unreachable", .connect_timeout_ms = 2000}, err, sizeof(err));
	QbStore		st;
	int			n = -1;

	assert_non_null(s);
	qb_odbc_store_ops(s, &st);
	assert_int_equal(st.outbox_reclaim(st.ctx, 10, &n, err, sizeof(err)), -1);
	print_message("unreachable: %s\n", err);
	assert_non_null(strstr(err, "connecting to qb_user@127.0.0.1:1/qbdb"));
	assert_null(strstr(err, "Hunter2"));
	assert_int_equal(n, 0);
	assert_int_equal(st.outbox_reclaim(st.ctx, 10, &n, err, sizeof(err)), -1);
	assert_non_null(strstr(err, "database unreachable, next try in "));
	assert_null(strstr(err, "Hunter2"));
	qb_odbc_store_free(s);
}

/* main_odbc: the common scenarios against the ODBC store, then its connection scenarios. */
static int
main_odbc(const struct CMUnitTest *common, size_t ncommon, const struct CMUnitTest *own, size_t nown)
{
	int			failed;

	mssql = true;
	dsn = getenv("QB_CONFORMANCE_MSSQL_URL");
	if (dsn == NULL)
	{
		fprintf(stderr, "usage: QB_CONFORMANCE_MSSQL_URL=sqlserver://... conformance odbc\n");
		return 2;
	}
	if ((madmin = qb_odbc_connect(dsn, APP_NAME " admin", 5000, err, sizeof(err))) == NULL)
	{
		fprintf(stderr, "conformance: cannot connect: %s\n", err);
		return 2;
	}
	if (qb_config_parse(CONFIG_DOC, strlen(CONFIG_DOC), NULL, &cfg, err, sizeof(err)) != 0 ||
		(odbc = qb_odbc_store_new(&(QbOdbcConf) {.url = dsn, .application_name = APP_NAME,
			.connect_timeout_ms = 5000, .statement_timeout_ms = 30000}, err, sizeof(err))) == NULL)
	{
		fprintf(stderr, "conformance: %s\n", err);
		return 2;
	}
	qb_odbc_store_set_config(odbc, cfg);
	qb_odbc_store_ops(odbc, &store);
	babelfish = qv("SELECT CASE WHEN SERVERPROPERTY('BabelfishVersion') IS NULL THEN 0 ELSE 1 END",
				   0, NULL, NULL) == 1;
	if (babelfish)
		print_message("odbc: the server is Babelfish, not SQL Server: values with a quote or a"
					  " backslash are not judged (its JSON functions keep their escapes)\n");
	failed = _cmocka_run_group_tests("store odbc", common, ncommon, NULL, NULL);
	failed += _cmocka_run_group_tests("store odbc: connection", own, nown, NULL, NULL);
	qb_odbc_store_free(odbc);
	qb_odbc_close(madmin);
	qb_config_free(cfg);
	return failed == 0 ? 0 : 1;
}

int
main(int argc, char **argv)
{
	const struct CMUnitTest common[] = {
		cmocka_unit_test_setup(test_claim_once, clean),
		cmocka_unit_test_setup(test_key_order, clean),
		cmocka_unit_test_setup(test_settle_fenced, clean),
		cmocka_unit_test_setup(test_release_keeps_attempt, clean),
		cmocka_unit_test_setup(test_lease_reclaim, clean),
		cmocka_unit_test_setup(test_retention, clean),
		cmocka_unit_test_setup(test_retention_floor, clean),
		cmocka_unit_test_setup(test_relay, clean),
		cmocka_unit_test_setup(test_inbox_insert, clean),
		cmocka_unit_test_setup(test_inbox_insert_timeout, clean),
		cmocka_unit_test_setup(test_query_text, clean),
		cmocka_unit_test_setup(test_breaker, clean),
		cmocka_unit_test_setup(test_breaker_late_success, clean),
		cmocka_unit_test_setup(test_unpark_unroute, clean),
		cmocka_unit_test_setup(test_sweep, clean),
	};
	const struct CMUnitTest pq_only[] = {
		cmocka_unit_test_setup(test_pq_backend_killed, clean),
		cmocka_unit_test_setup(test_pq_wrong_password, clean),
		cmocka_unit_test_setup(test_pq_unreachable, clean),
	};
	const struct CMUnitTest odbc_only[] = {
		cmocka_unit_test_setup(test_odbc_wrong_password, clean),
		cmocka_unit_test_setup(test_odbc_unreachable, clean),
	};
	QbPqConf	conf = {.application_name = APP_NAME, .connect_timeout_ms = 5000,
	.statement_timeout_ms = 30000, .async_commit = true};
	int			failed;

	if (argc == 2 && strcmp(argv[1], "odbc") == 0)
		return main_odbc(common, sizeof(common) / sizeof(common[0]),
						 odbc_only, sizeof(odbc_only) / sizeof(odbc_only[0]));
	dsn = getenv("QB_CONFORMANCE_DSN");
	if (argc != 2 || (strcmp(argv[1], "pq") != 0 && strcmp(argv[1], "spi") != 0) || dsn == NULL)
	{
		fprintf(stderr, "usage: QB_CONFORMANCE_DSN=... %s pq|spi\n"
				"       QB_CONFORMANCE_MSSQL_URL=sqlserver://... %s odbc\n", argv[0], argv[0]);
		return 2;
	}
	kind_pq = strcmp(argv[1], "pq") == 0;
	admin = PQconnectdb(dsn);
	if (PQstatus(admin) != CONNECTION_OK)
	{
		fprintf(stderr, "conformance: cannot connect: %s", PQerrorMessage(admin));
		return 2;
	}
	if (qb_config_parse(CONFIG_DOC, strlen(CONFIG_DOC), NULL, &cfg, err, sizeof(err)) != 0)
	{
		fprintf(stderr, "conformance: the test configuration is invalid: %s\n", err);
		return 2;
	}
	/*
	 * The extension renders replay topics from its stored document; the
	 * daemon's schema (queuebox-mssqld --migrate) has no configure(): its
	 * store renders them from the set config, as the daemon's does.
	 */
	{
		Res		   *r = q("SELECT to_regprocedure('queuebox.configure(text)') IS NOT NULL", 0);

		if (strcmp(rv(r, 0, 0), "t") == 0)
			rfree(q("SELECT queuebox.configure($1)", 1, CONFIG_DOC));
		else if (!kind_pq)
		{
			fprintf(stderr, "conformance: the spi kind needs the extension's schema\n");
			return 2;
		}
		rfree(r);
	}
	conf.url = dsn;
	pq = qb_pq_store_new(&conf);
	qb_pq_store_set_config(pq, cfg);
	if (kind_pq)
		qb_pq_store_ops(pq, &store);
	else
	{
		spi_conn = PQconnectdb(dsn);
		if (PQstatus(spi_conn) != CONNECTION_OK)
		{
			fprintf(stderr, "conformance: cannot connect: %s", PQerrorMessage(spi_conn));
			return 2;
		}
		sa_store(&store);
		print_message("spi: inbox_insert and outbox_unroute have no SQL-callable wrapper;"
					  " the adapter runs the pq store's (the same statement text)\n");
	}
	failed = cmocka_run_group_tests_name(kind_pq ? "store pq" : "store spi", common, NULL, NULL);
	if (kind_pq)
		failed += cmocka_run_group_tests_name("store pq: connection", pq_only, NULL, NULL);
	qb_pq_store_free(pq);
	qb_config_free(cfg);
	PQfinish(spi_conn);
	PQfinish(admin);
	return failed == 0 ? 0 : 1;
}
