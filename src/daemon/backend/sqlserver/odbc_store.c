/*-------------------------------------------------------------------------
 * odbc_store.c
 *	  The ODBC store: the core's QbStore over one SQL Server connection.
 *
 * Wording (odbc_store.h has the rest):
 *	- An op is one transaction: qbos_txn connects when needed, sends BEGIN
 *	  TRANSACTION, runs the op's body (procedure calls of
 *	  sql/sqlserver/engine.sql, each an "EXEC queuebox.<procedure> ?, ..."
 *	  with bound parameters), sends COMMIT.
 *	  A body that failed is rolled back; one whose error is a deadlock
 *	  victim, a lock timeout or (the inbox insert) a duplicate that a
 *	  concurrent insert slipped in is run again, up to QBOS_TRIES times.
 *	- A lost connection is dropped; the next op connects again, after a
 *	  backoff (250 ms doubling to 10 s) while connects fail: until it ends
 *	  every op fails at once, "database unreachable, next try in N ms".
 *	- A COMMIT whose answer was lost has an unknown outcome: the op fails
 *	  saying so and is not run again (claimed rows come back through their
 *	  lease; settles and forwards are fenced by their claim token).
 *
 *	- Takeover: when the engine asks for it (QbStore.claimer), each connect
 *	  takes the session applock N'queuebox.claimer.<id>' (sp_getapplock,
 *	  @LockOwner = 'Session') of the store's random claimer id, and the
 *	  claims record that id; SQL Server frees the applock when the session
 *	  ends, so a peer's reclaim or relay claim takes the rows over at once
 *	  (engine.sql _claimer_gone).  No special permission is needed.
 *	- A beat (Babelfish only, where testing a peer's applock crashes the
 *	  server): instead of the applock the store registers its claimer id in
 *	  queuebox.claimer_beat (_claimer_beat, an id no row has) and, before an
 *	  op when a second has passed since the last, writes that it is alive
 *	  for the alive bound from now (qbos_alive_ms); a claimer whose bound
 *	  passed is gone.  Ops come at least once a second with rows in flight
 *	  (the outbox reclaim) and once a poll when idle (a poll interval, or
 *	  up to database.idlePollMaxMs), so the bound is three of the longest
 *	  of those, and at least 10 s.
 *
 * Transaction rules: as qb_store.h, one short transaction per op.  SQL
 * Server commits durably; there is no asynchronous commit to choose.
 *
 * Threads: one store, one connection, one thread at a time.
 *-------------------------------------------------------------------------
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "odbc_store.h"
#include "qb_claim_cols.h"
#include "qb_clock.h"
#include "qb_host.h"
#include "qb_relay.h"
#include "qb_store_conn.h"

#define QBOS_TRIES				3
#define QBOS_BEAT_EVERY_MS		1000	/* the least time between two beats */
#define QBOS_ALIVE_MIN_MS		10000	/* the least alive bound a beat writes */

struct QbOdbcStore
{
	char	   *url;
	char	   *application_name;
	long		connect_timeout_ms;
	long		statement_timeout_ms;
	QbOdbcConn *conn;
	QbStoreBackoff backoff;
	const QbConfig *cfg;
	bool		takeover;		/* the engine asked for it (QbStore.claimer) */
	int64_t		claimer_id;		/* the claims' claimer id; 0: none drawn yet */
	bool		claimer_held;	/* this session holds its applock (Babelfish: beats) */
	bool		babelfish;		/* the server is Babelfish: a beat, no applock */
	long		beat_at;		/* qb_now_ms of the last beat written */
};

/* ---- connections and transactions ------------------------------------------------ */

static void
qbos_drop(QbOdbcStore *s)
{
	qb_odbc_close(s->conn);
	s->conn = NULL;
	s->claimer_held = false;	/* the applock went with the session */
}

static int	qbos_claimer_lock(QbOdbcStore *s, char *err, size_t errlen);
static int	qbos_beat_due(QbOdbcStore *s, QbOdbcClass *cls, char *err, size_t errlen);

/* qbos_open makes one connection attempt. */
static int
qbos_open(void *ctx, char *err, size_t errlen)
{
	QbOdbcStore *s = ctx;

	s->conn = qb_odbc_connect(s->url, s->application_name, s->connect_timeout_ms, err, errlen);
	if (s->conn == NULL)
		return -1;
	if (s->takeover && qbos_claimer_lock(s, err, errlen) != 0)
	{
		qbos_drop(s);
		return -1;
	}
	return 0;
}

/* qbos_ensure: a connection, or -1 (at once while the backoff runs). */
static int
qbos_ensure(QbOdbcStore *s, char *err, size_t errlen)
{
	if (s->conn != NULL && !qb_odbc_lost(s->conn))
		return 0;
	qbos_drop(s);
	return qb_store_connect(&s->backoff, qbos_open, s, err, errlen);
}

/*
 * A body runs the op's statements on s->conn; on failure it returns -1 and
 * leaves the failing statement's class in *cls (QB_ODBC_FAILED for its own).
 */
typedef int (*QbosBody) (QbOdbcStore *s, void *arg, QbOdbcClass *cls, char *err, size_t errlen);

/* qbos_txn: see the banner.  Returns 0, or -1 with *cls the last failure's class. */
static int
qbos_txn(QbOdbcStore *s, const char *what, QbosBody body, void *arg, bool retry_duplicate,
		 QbOdbcClass *cls, char *err, size_t errlen)
{
	char		buf[QB_ERRLEN];

	for (int attempt = 1;; attempt++)
	{
		QbOdbcClass k = QB_ODBC_FAILED;

		if (qbos_ensure(s, err, errlen) != 0)
		{
			*cls = QB_ODBC_LOST;
			return -1;
		}
		if (qbos_beat_due(s, cls, err, errlen) != 0)
		{
			if (*cls == QB_ODBC_LOST || qb_odbc_lost(s->conn))
			{
				*cls = QB_ODBC_LOST;
				qbos_drop(s);
			}
			return -1;
		}
		if (qb_odbc_begin(s->conn, err, errlen) != 0)
		{
			*cls = QB_ODBC_LOST;
			qbos_drop(s);
			return -1;
		}
		if (body(s, arg, &k, err, errlen) == 0)
		{
			if (qb_odbc_end(s->conn, true, buf, sizeof(buf)) == 0)
				return 0;
			snprintf(err, errlen, "%s: the commit's outcome is unknown (%s); rows it claimed come back when their lease ends",
					 what, buf);
			qbos_drop(s);
			*cls = QB_ODBC_LOST;
			return -1;
		}
		*cls = k;
		if (!qb_odbc_lost(s->conn) && qb_odbc_end(s->conn, false, buf, sizeof(buf)) != 0)
			qbos_drop(s);
		if (k == QB_ODBC_LOST)
			qbos_drop(s);
		if (attempt < QBOS_TRIES && (k == QB_ODBC_RETRY || (retry_duplicate && k == QB_ODBC_DUPLICATE)))
			continue;
		return -1;
	}
}

static long
qbos_timeout(const QbOdbcStore *s, long op_ms)
{
	return op_ms > 0 ? op_ms : s->statement_timeout_ms;
}

#define QBOS_TEXT(v)	((QbOdbcParam) {.type = QB_ODBC_T_TEXT, .text = (v)})
#define QBOS_INT(v)		((QbOdbcParam) {.type = QB_ODBC_T_INT, .num = (v)})
#define QBOS_UUID(v)	((QbOdbcParam) {.type = QB_ODBC_T_UUID, .text = (v)})
/* the claimer a claim records (NULL: none) */
#define QBOS_CLAIMER(s) ((s)->takeover && (s)->claimer_held ? QBOS_INT((s)->claimer_id) : QBOS_TEXT(NULL))

static long long
qbos_num(const char *v)
{
	return v ? strtoll(v, NULL, 10) : 0;
}

static bool
qbos_bool(const char *v)
{
	return v != NULL && (strcmp(v, "1") == 0 || strcmp(v, "true") == 0);
}

/* qbos_take: the value, moved out of the row (the reader frees what is left). */
static char *
qbos_take(char **values, int i)
{
	char	   *v = values[i];

	values[i] = NULL;
	return v;
}

/* ---- the cycle ---------------------------------------------------------------------- */

typedef struct QbosCycle
{
	const QbCycleCall *call;
	char	   *tallies;
	char	   *settles;
	char	   *claim;
} QbosCycle;

static bool
qbos_grow(void **arr, int n, size_t size)
{
	void	   *na = realloc(*arr, size * (n + 1));

	if (na == NULL)
		return false;
	*arr = na;
	return true;
}

/* the four result sets of queuebox._outbox_cycle into the QbCycleOut */
static int
qbos_cycle_row(void *arg, int set, int ncols, char **v)
{
	QbCycleOut *out = arg;

	if (set == 0 && ncols >= 4)
	{
		QbDestChange *c;

		if (!qbos_grow((void **) &out->changes, out->nchanges, sizeof(QbDestChange)))
			return -1;
		c = &out->changes[out->nchanges++];
		c->destination = qbos_take(v, 0);
		c->old_state = qb_circuit_parse(v[1] ? v[1] : "closed");
		c->new_state = qb_circuit_parse(v[2] ? v[2] : "closed");
		c->paused = qbos_bool(v[3]);
	}
	else if (set == 1 && ncols >= 1)
		out->nsettled = (int) qbos_num(v[0]);
	else if (set == 2 && ncols >= 5)
	{
		QbDestState *st;

		if (!qbos_grow((void **) &out->states, out->nstates, sizeof(QbDestState)))
			return -1;
		st = &out->states[out->nstates++];
		st->destination = qbos_take(v, 0);
		st->state = qb_circuit_parse(v[1] ? v[1] : "closed");
		st->failures = (int) qbos_num(v[2]);
		st->paused = qbos_bool(v[3]);
		st->probe = qbos_bool(v[4]);
	}
	else if (set == 3 && ncols >= QB_CLAIM_NCOLS)
	{
		QbOutboxRow *r;

		if (!qbos_grow((void **) &out->rows, out->nrows, sizeof(QbOutboxRow)))
			return -1;
		r = &out->rows[out->nrows++];
		memset(r, 0, sizeof(*r));
		const char *mid = v[QB_CLAIM_COL_MESSAGE_ID];
		const char *epoch = v[QB_CLAIM_COL_CREATED_EPOCH];

		r->id = qbos_num(v[QB_CLAIM_COL_ID]);
		/* SQL Server prints UUIDs in capitals; the other stores in small letters */
		for (int i = 0; mid && mid[i] && i < QB_UUID_LEN; i++)
			r->message_id[i] = (char) tolower((unsigned char) mid[i]);
		r->topic = qbos_take(v, QB_CLAIM_COL_TOPIC);
		r->key = qbos_take(v, QB_CLAIM_COL_KEY);
		r->payload = qbos_take(v, QB_CLAIM_COL_PAYLOAD);
		r->payload_len = r->payload ? strlen(r->payload) : 0;
		r->headers = qbos_take(v, QB_CLAIM_COL_HEADERS);
		r->attempt = (int) qbos_num(v[QB_CLAIM_COL_ATTEMPT]);
		r->max_attempts = (int) qbos_num(v[QB_CLAIM_COL_MAX_ATTEMPTS]);
		r->created_epoch = epoch ? strtod(epoch, NULL) : 0;
		r->claimed = qbos_bool(v[QB_CLAIM_COL_CLAIMED]);
		r->destination = qbos_take(v, QB_CLAIM_COL_DESTINATION);
		r->in_intake = qbos_bool(v[QB_CLAIM_COL_IN_INTAKE]);
		r->not_due = qbos_bool(v[QB_CLAIM_COL_NOT_DUE]);
		r->probe = qbos_bool(v[QB_CLAIM_COL_PROBE]);
		if (r->topic == NULL || r->payload == NULL || r->headers == NULL)
			return -1;
	}
	return 0;
}

static int
qbos_cycle_body(QbOdbcStore *s, void *arg, QbOdbcClass *cls, char *err, size_t errlen)
{
	QbosCycle  *c = arg;
	QbOdbcParam p[4] = {QBOS_TEXT(c->tallies), QBOS_TEXT(c->settles), QBOS_TEXT(c->claim),
	QBOS_CLAIMER(s)};

	/* a second run starts from nothing */
	qb_cycle_out_free(c->call->out);
	memset(c->call->out, 0, sizeof(*c->call->out));
	return qb_odbc_exec(s->conn, "EXEC queuebox._outbox_cycle ?, ?, ?, ?", p, 4,
						s->statement_timeout_ms, qbos_cycle_row, c->call->out, cls, err, errlen);
}

static int
qbos_outbox_cycle(void *ctx, const QbDestTally *tallies, int ntallies,
				  const QbSettle *settles, int nsettles, const QbClaimReq *claim,
				  QbCycleOut *out, char *err, size_t errlen)
{
	QbCycleCall call = {.tallies = tallies, .ntallies = ntallies, .settles = settles,
		.nsettles = nsettles, .claim = claim, .out = out};
	QbosCycle	c = {.call = &call};
	QbOdbcClass cls;
	bool		oom = false;
	int			rc = -1;

	memset(out, 0, sizeof(*out));
	c.tallies = qb_odbc_json_tallies(tallies, ntallies, &oom);
	c.settles = qb_odbc_json_settles(settles, nsettles, &oom);
	c.claim = qb_odbc_json_claim(claim, &oom);
	if (oom)
		snprintf(err, errlen, "settle and claim: out of memory");
	else
		rc = qbos_txn(ctx, claim ? "settle and claim" : "settle", qbos_cycle_body, &c, false,
					  &cls, err, errlen);
	if (rc != 0)
		qb_cycle_out_free(out);
	free(c.tallies);
	free(c.settles);
	free(c.claim);
	return rc;
}

/* ---- the ops that count rows ---------------------------------------------------------- */

typedef struct QbosCount
{
	const char *sql;
	QbOdbcParam p[2];
	int			np;
	long long	n;
} QbosCount;

static int
qbos_count_row(void *arg, int set, int ncols, char **v)
{
	QbosCount  *c = arg;

	if (set == 0 && ncols >= 1)
		c->n = qbos_num(v[0]);
	return 0;
}

static int
qbos_count_body(QbOdbcStore *s, void *arg, QbOdbcClass *cls, char *err, size_t errlen)
{
	QbosCount  *c = arg;

	c->n = 0;
	return qb_odbc_exec(s->conn, c->sql, c->p, c->np, s->statement_timeout_ms, qbos_count_row, c,
						cls, err, errlen);
}

static int
qbos_count(QbOdbcStore *s, QbosCount *c, const char *what, int *n, char *err, size_t errlen)
{
	QbOdbcClass cls;
	int			rc = qbos_txn(s, what, qbos_count_body, c, false, &cls, err, errlen);

	*n = rc == 0 ? (int) c->n : 0;
	return rc;
}

static int
qbos_outbox_unpark(void *ctx, const char *const *dests, int n, int limit, int *nmoved,
				   char *err, size_t errlen)
{
	bool		oom = false;
	char	   *names = qb_odbc_json_names(dests, n, &oom);
	QbosCount	c = {.sql = "EXEC queuebox._outbox_unpark ?, ?",
	.p = {QBOS_TEXT(names), QBOS_INT(limit)}, .np = 2};
	int			rc;

	if (names == NULL)
	{
		*nmoved = 0;
		snprintf(err, errlen, "unpark: out of memory");
		return -1;
	}
	rc = qbos_count(ctx, &c, "unpark", nmoved, err, errlen);
	free(names);
	return rc;
}

static int
qbos_outbox_unroute(void *ctx, const char *const *dests, int n, int *nmoved,
					char *err, size_t errlen)
{
	bool		oom = false;
	char	   *names = qb_odbc_json_names(dests, n, &oom);
	QbosCount	c = {.sql = "EXEC queuebox._outbox_unroute ?", .p = {QBOS_TEXT(names)}, .np = 1};
	int			rc;

	if (names == NULL)
	{
		*nmoved = 0;
		snprintf(err, errlen, "unroute: out of memory");
		return -1;
	}
	rc = qbos_count(ctx, &c, "unroute", nmoved, err, errlen);
	free(names);
	return rc;
}

static int
qbos_outbox_reclaim(void *ctx, int limit, int *n, char *err, size_t errlen)
{
	QbOdbcStore *s = ctx;
	QbosCount	c = {.sql = "EXEC queuebox._outbox_reclaim ?, ?", .p = {QBOS_INT(limit), QBOS_CLAIMER(s)},
	.np = 2};

	return qbos_count(ctx, &c, "reclaim", n, err, errlen);
}

static int
qbos_outbox_retention(void *ctx, long retention_sec, int limit, int64_t *after, int *n,
					  char *err, size_t errlen)
{
	/*
	 * No floor: _outbox_retention seeks outbox_sent_idx (created_at) WHERE
	 * state = N'sent', a filtered index that holds no row it keeps, so a
	 * batch reads only rows it deletes; *after stays as it is.
	 */
	QbosCount	c = {.sql = "EXEC queuebox._outbox_retention ?, ?",
	.p = {QBOS_INT(retention_sec), QBOS_INT(limit)}, .np = 2};

	return qbos_count(ctx, &c, "retention", n, err, errlen);
}

/* ---- the sweep of parked rows ------------------------------------------------------- */

typedef struct QbosSweep
{
	const char *after;
	int			limit;
	long long	released;
	char	   *next;			/* malloc'd */
	bool		oom;
} QbosSweep;

static int
qbos_sweep_row(void *arg, int set, int ncols, char **v)
{
	QbosSweep  *w = arg;

	if (set != 0 || ncols < 2)
		return 0;
	w->released = qbos_num(v[0]);
	if (v[1] != NULL && (w->next = strdup(v[1])) == NULL)
		w->oom = true;
	return 0;
}

static int
qbos_sweep_body(QbOdbcStore *s, void *arg, QbOdbcClass *cls, char *err, size_t errlen)
{
	QbosSweep  *w = arg;
	QbOdbcParam p[2] = {QBOS_TEXT(w->after), QBOS_INT(w->limit)};
	int			rc;

	/* a second run starts from nothing */
	free(w->next);
	w->next = NULL;
	w->released = 0;
	w->oom = false;
	rc = qb_odbc_exec(s->conn, "EXEC queuebox._outbox_sweep ?, ?", p, 2, s->statement_timeout_ms,
					  qbos_sweep_row, w, cls, err, errlen);
	if (rc == 0 && w->oom)
	{
		snprintf(err, errlen, "sweep: out of memory for the next key");
		rc = -1;
	}
	return rc;
}

static int
qbos_outbox_sweep(void *ctx, const char *after, int limit, int *nreleased, char **next,
				  char *err, size_t errlen)
{
	QbosSweep	w = {.after = after, .limit = limit};
	QbOdbcClass cls;
	int			rc = qbos_txn(ctx, "sweep", qbos_sweep_body, &w, false, &cls, err, errlen);

	if (rc != 0)
	{
		free(w.next);
		w.next = NULL;
	}
	*nreleased = rc == 0 ? (int) w.released : 0;
	*next = w.next;
	return rc;
}

/* ---- the relay ---------------------------------------------------------------------- */

typedef struct QbosRelayClaim
{
	int			batch;
	long		lease_ms;
	const char *token;
	QbRelayRow *rows;
	int			n;
} QbosRelayClaim;

static int
qbos_relay_row(void *arg, int set, int ncols, char **v)
{
	QbosRelayClaim *c = arg;
	QbRelayRow *r;

	if (set != 0 || ncols < 3)
		return 0;
	if (!qbos_grow((void **) &c->rows, c->n, sizeof(QbRelayRow)))
		return -1;
	r = &c->rows[c->n++];
	r->id = qbos_num(v[0]);
	r->source = qbos_take(v, 1);
	r->event_type = qbos_take(v, 2);
	/* schema 0.3.6 returns the row's traceparent header (NULL: none) */
	r->traceparent = ncols >= 4 ? qbos_take(v, 3) : NULL;
	return r->source == NULL ? -1 : 0;
}

static int
qbos_relay_claim_body(QbOdbcStore *s, void *arg, QbOdbcClass *cls, char *err, size_t errlen)
{
	QbosRelayClaim *c = arg;
	QbOdbcParam p[4] = {QBOS_INT(c->batch), QBOS_INT(c->lease_ms), QBOS_UUID(c->token),
	QBOS_CLAIMER(s)};

	qb_relay_rows_free(c->rows, c->n);
	c->rows = NULL;
	c->n = 0;
	return qb_odbc_exec(s->conn, "EXEC queuebox._relay_claim ?, ?, ?, ?", p, 4,
						s->statement_timeout_ms, qbos_relay_row, c, cls, err, errlen);
}

static int
qbos_relay_claim(void *ctx, int batch_size, long lease_ms, const char *token,
				 QbRelayRow **rows, int *nrows, char *err, size_t errlen)
{
	QbosRelayClaim c = {.batch = batch_size, .lease_ms = lease_ms, .token = token};
	QbOdbcClass cls;
	int			rc = qbos_txn(ctx, "relay claim", qbos_relay_claim_body, &c, false, &cls, err, errlen);

	if (rc != 0)
	{
		qb_relay_rows_free(c.rows, c.n);
		c.rows = NULL;
		c.n = 0;
	}
	*rows = c.rows;
	*nrows = c.n;
	return rc;
}

typedef struct QbosForward
{
	const char *token;
	char	   *rows;
	int			max_attempts;
	int			nsettled;
	int			ninserted;
} QbosForward;

static int
qbos_forward_row(void *arg, int set, int ncols, char **v)
{
	QbosForward *f = arg;

	if (set == 0 && ncols >= 2)
	{
		f->nsettled = (int) qbos_num(v[0]);
		f->ninserted = (int) qbos_num(v[1]);
	}
	return 0;
}

static int
qbos_forward_body(QbOdbcStore *s, void *arg, QbOdbcClass *cls, char *err, size_t errlen)
{
	QbosForward *f = arg;
	QbOdbcParam p[3] = {QBOS_UUID(f->token), QBOS_TEXT(f->rows),
	f->max_attempts > 0 ? QBOS_INT(f->max_attempts) : QBOS_TEXT(NULL)};

	f->nsettled = f->ninserted = 0;
	return qb_odbc_exec(s->conn, "EXEC queuebox._relay_forward ?, ?, ?", p, 3,
						s->statement_timeout_ms, qbos_forward_row, f, cls, err, errlen);
}

static int
qbos_relay_forward(void *ctx, const char *token, const int64_t *ids,
				   const char *const *topics, const bool *holds, int n, int max_attempts,
				   int *nsettled, int *ninserted, char *err, size_t errlen)
{
	bool		oom = false;
	QbosForward f = {.token = token, .max_attempts = max_attempts};
	QbOdbcClass cls;
	int			rc = -1;

	*nsettled = *ninserted = 0;
	if (n == 0)
		return 0;
	if ((f.rows = qb_odbc_json_topics(ids, topics, holds, n, &oom)) == NULL)
	{
		snprintf(err, errlen, "relay forward: out of memory");
		return -1;
	}
	rc = qbos_txn(ctx, "relay forward", qbos_forward_body, &f, false, &cls, err, errlen);
	if (rc == 0)
	{
		*nsettled = f.nsettled;
		*ninserted = f.ninserted;
	}
	free(f.rows);
	return rc;
}

/* ---- the inbox insert --------------------------------------------------------------- */

typedef struct QbosInsert
{
	const QbInboxRow *rows;
	int			n;
	int64_t    *ids;
	char	   *json;
	long		timeout_ms;
} QbosInsert;

static int
qbos_insert_row(void *arg, int set, int ncols, char **v)
{
	QbosInsert *a = arg;

	/* match each stored row to the first request of its key */
	if (set == 0 && ncols >= 3 && v[1] != NULL && v[2] != NULL)
		(void) qb_inbox_match(a->rows, a->n, a->ids, qbos_num(v[0]), v[1], v[2]);
	return 0;
}

static int
qbos_insert_body(QbOdbcStore *s, void *arg, QbOdbcClass *cls, char *err, size_t errlen)
{
	QbosInsert *a = arg;
	QbOdbcParam p[1] = {QBOS_TEXT(a->json)};

	memset(a->ids, 0, sizeof(int64_t) * a->n);
	return qb_odbc_exec(s->conn, "EXEC queuebox._inbox_insert ?", p, 1, qbos_timeout(s, a->timeout_ms),
						qbos_insert_row, a, cls, err, errlen);
}

static int
qbos_inbox_insert(void *ctx, const QbInboxRow *rows, int n, long timeout_ms,
				  int64_t *ids, char *err, size_t errlen)
{
	bool		oom = false;
	QbosInsert	a = {.rows = rows, .n = n, .ids = ids, .timeout_ms = timeout_ms};
	QbOdbcClass cls;
	int			rc;

	memset(ids, 0, sizeof(int64_t) * n);
	if (n == 0)
		return 0;
	if (qb_odbc_check_lengths(rows, n, err, errlen) != 0)
		return -1;
	if ((a.json = qb_odbc_json_inbox_rows(rows, n, &oom)) == NULL)
	{
		snprintf(err, errlen, "storing received messages: %s", oom ? "out of memory" :
				 "a payload is not JSON text, or the headers are not a JSON object");
		return -1;
	}
	/* a duplicate is a concurrent insert of the same key: the next run skips it */
	rc = qbos_txn(ctx, "storing received messages", qbos_insert_body, &a, true, &cls, err, errlen);
	if (rc != 0)
		memset(ids, 0, sizeof(int64_t) * n);
	free(a.json);
	return rc;
}

/* ---- query_text --------------------------------------------------------------------- */

typedef struct QbosQuery
{
	QbQuery		query;
	const char *const *params;
	long		timeout_ms;
	char	  **out;
	/* the replay's select */
	int64_t    *ids;
	char	  **sources;
	char	  **types;
	int			n;
	long long	replayed;
	long long	first_id;
	bool		first_null;
} QbosQuery;

static int
qbos_text_row(void *arg, int set, int ncols, char **v)
{
	QbosQuery  *q = arg;

	if (set == 0 && ncols >= 1 && *q->out == NULL)
		*q->out = qbos_take(v, 0);
	return 0;
}

static int
qbos_select_row(void *arg, int set, int ncols, char **v)
{
	QbosQuery  *q = arg;

	if (set != 0 || ncols < 3)
		return 0;
	if (!qbos_grow((void **) &q->ids, q->n, sizeof(int64_t)) ||
		!qbos_grow((void **) &q->sources, q->n, sizeof(char *)) ||
		!qbos_grow((void **) &q->types, q->n, sizeof(char *)))
		return -1;
	q->ids[q->n] = qbos_num(v[0]);
	q->sources[q->n] = qbos_take(v, 1);
	q->types[q->n] = qbos_take(v, 2);
	q->n++;
	return 0;
}

static int
qbos_replayed_row(void *arg, int set, int ncols, char **v)
{
	QbosQuery  *q = arg;

	if (set == 0 && ncols >= 2)
	{
		q->replayed = qbos_num(v[0]);
		q->first_null = v[1] == NULL;
		q->first_id = qbos_num(v[1]);
	}
	return 0;
}

static void
qbos_select_free(QbosQuery *q)
{
	for (int i = 0; i < q->n; i++)
	{
		free(q->sources[i]);
		free(q->types[i]);
	}
	free(q->ids);
	free(q->sources);
	free(q->types);
	q->ids = NULL;
	q->sources = q->types = NULL;
	q->n = 0;
}

/* qbos_replay's state: the store, the query holding the selected rows, the failure's class. */
typedef struct QbosReplay
{
	QbOdbcStore *s;
	QbosQuery  *q;
	QbOdbcClass *cls;
} QbosReplay;

/* qbos_replay_select: qb_odbc_replay_select (qb_replay_run's select). */
static int
qbos_replay_select(void *ctx, const char *const *v, const int64_t **ids,
				   const char *const **sources, const char *const **types, int *n,
				   char *err, size_t errlen)
{
	QbosReplay *p = ctx;
	QbosQuery  *q = p->q;
	QbOdbcParam sel[5];

	for (int i = 0; i < 5; i++)
		sel[i] = QBOS_TEXT(v[i]);
	if (qb_odbc_exec(p->s->conn, qb_odbc_replay_select,
					 sel, 5, q->timeout_ms, qbos_select_row, q, p->cls, err, errlen) != 0)
		return -1;
	*ids = q->ids;
	*sources = (const char *const *) q->sources;
	*types = (const char *const *) q->types;
	*n = q->n;
	return 0;
}

/* qbos_replay_insert: queuebox._inbox_replay (qb_replay_run's insert). */
static int
qbos_replay_insert(void *ctx, const QbReplay *r, int max_attempts, long long *nrows,
				   bool *first_null, long long *first_id, char *err, size_t errlen)
{
	QbosReplay *p = ctx;
	QbosQuery  *q = p->q;
	QbOdbcParam ins[2];
	char	   *rows;
	bool		oom = false;
	int			rc;

	if ((rows = qb_odbc_json_topics(r->ids, (const char *const *) r->topics, NULL, r->n, &oom)) == NULL)
	{
		snprintf(err, errlen, "the replay: out of memory");
		return -1;
	}
	ins[0] = QBOS_TEXT(rows);
	ins[1] = QBOS_INT(max_attempts);
	q->replayed = 0;
	q->first_null = true;
	rc = qb_odbc_exec(p->s->conn, "EXEC queuebox._inbox_replay ?, ?", ins, 2, q->timeout_ms,
					  qbos_replayed_row, q, p->cls, err, errlen);
	free(rows);
	if (rc != 0)
		return -1;
	*nrows = q->replayed;
	*first_null = q->first_null;
	*first_id = q->first_id;
	return 0;
}

/*
 * qbos_replay: QB_Q_REPLAY_INBOX and QB_Q_REPLAY_INBOX_BULK, as the libpq
 * store does them (qb_replay_run): the rows, their topics rendered from the
 * configuration in force, the insert (queuebox._inbox_replay).
 */
static int
qbos_replay(QbOdbcStore *s, QbosQuery *q, QbOdbcClass *cls, char *err, size_t errlen)
{
	static const QbReplayCalls calls = {
		.select = qbos_replay_select,
		.insert = qbos_replay_insert,
		.oom = "the replay: out of memory",
	};
	QbosReplay	p = {.s = s, .q = q, .cls = cls};
	int			rc;

	*cls = QB_ODBC_FAILED;
	qbos_select_free(q);
	rc = qb_replay_run(s->cfg, q->query == QB_Q_REPLAY_INBOX, q->params, &calls, &p, q->out,
					   err, errlen);
	if (rc == QB_QUERY_NOT_FOUND)
		*cls = QB_ODBC_NOT_FOUND;
	else if (rc == QB_QUERY_BAD_INPUT)
		*cls = QB_ODBC_BAD_INPUT;
	return rc == 0 ? 0 : -1;
}

static int
qbos_query_body(QbOdbcStore *s, void *arg, QbOdbcClass *cls, char *err, size_t errlen)
{
	QbosQuery  *q = arg;
	QbOdbcParam p[10];
	int			np;
	const char *sql = qb_odbc_query_text(q->query, &np);

	free(*q->out);
	*q->out = NULL;
	if (q->query == QB_Q_REPLAY_INBOX || q->query == QB_Q_REPLAY_INBOX_BULK)
		return qbos_replay(s, q, cls, err, errlen);
	if (sql == NULL || np > 10)
	{
		*cls = QB_ODBC_FAILED;
		snprintf(err, errlen, "query %d has no SQL Server text", (int) q->query);
		return -1;
	}
	for (int i = 0; i < np; i++)
		p[i] = QBOS_TEXT(q->params[i]);
	return qb_odbc_exec(s->conn, sql, p, np, q->timeout_ms, qbos_text_row, q, cls, err, errlen);
}

static int
qbos_query_text(void *ctx, QbQuery query, const char *const *params, long timeout_ms,
				char **out, char *err, size_t errlen)
{
	QbOdbcStore *s = ctx;
	QbosQuery	q = {.query = query, .params = params, .out = out,
	.timeout_ms = qbos_timeout(s, timeout_ms)};
	QbOdbcClass cls = QB_ODBC_FAILED;
	int			rc;

	*out = NULL;
	rc = qbos_txn(s, "query", qbos_query_body, &q, false, &cls, err, errlen);
	qbos_select_free(&q);
	if (rc == 0)
		return 0;
	free(*out);
	*out = NULL;
	return cls == QB_ODBC_BAD_INPUT ? QB_QUERY_BAD_INPUT : cls == QB_ODBC_NOT_FOUND ? QB_QUERY_NOT_FOUND : -1;
}

/* The daemon reads its document from a file: this op is replaced. */
static int
qbos_config_load(void *ctx, char **text, char *err, size_t errlen)
{
	*text = NULL;
	return 0;
}

/* ---- takeover ---------------------------------------------------------------------- */

static int
qbos_lock_row(void *arg, int set, int ncols, char **v)
{
	long long  *r = arg;

	if (set == 0 && ncols >= 1 && v[0] != NULL)
		*r = qbos_num(v[0]);
	return 0;
}

/*
 * qbos_alive_ms: the alive bound a beat writes (the banner): three times
 * the longest wait between two of the store's ops, at least 10 s.
 */
static long
qbos_alive_ms(const QbOdbcStore *s)
{
	long		gap = QBOS_BEAT_EVERY_MS;

	if (s->cfg != NULL && s->cfg->outbox.poll_interval_ms > gap)
		gap = s->cfg->outbox.poll_interval_ms;
	if (s->cfg != NULL && s->cfg->inbox.relay.poll_interval_ms > gap)
		gap = s->cfg->inbox.relay.poll_interval_ms;
	if (s->cfg != NULL && s->cfg->database.idle_poll_max_ms > gap)
		gap = s->cfg->database.idle_poll_max_ms;
	return 3 * gap > QBOS_ALIVE_MIN_MS ? 3 * gap : QBOS_ALIVE_MIN_MS;
}

/* qbos_beat: _claimer_beat of id (fresh: register it); *written its answer. */
static int
qbos_beat(QbOdbcStore *s, int64_t id, bool fresh, long long *written, QbOdbcClass *cls,
		  char *err, size_t errlen)
{
	QbOdbcParam p[3] = {QBOS_INT(id), QBOS_INT(qbos_alive_ms(s)), QBOS_INT(fresh ? 1 : 0)};

	*written = 0;
	return qb_odbc_exec(s->conn, "EXEC queuebox._claimer_beat ?, ?, ?", p, 3,
						s->statement_timeout_ms, qbos_lock_row, written, cls, err, errlen);
}

/*
 * qbos_beat_due: the claimer's beat when a second has passed since the
 * last, before an op's transaction (autocommit: a rolled back op keeps it).
 */
static int
qbos_beat_due(QbOdbcStore *s, QbOdbcClass *cls, char *err, size_t errlen)
{
	long		now = qb_now_ms();
	long long	written;

	if (!s->babelfish || !s->claimer_held || now - s->beat_at < QBOS_BEAT_EVERY_MS)
		return 0;
	if (qbos_beat(s, s->claimer_id, false, &written, cls, err, errlen) != 0)
		return -1;
	s->beat_at = now;
	return 0;
}

/*
 * qbos_claimer_register: the Babelfish claimer (the banner's beat).  After
 * a reconnect the same id beats on; a drawn id is registered only when no
 * row has it, so no id is used twice while its old row could look alive.
 */
static int
qbos_claimer_register(QbOdbcStore *s, char *err, size_t errlen)
{
	for (int tries = 0; tries < 8 && !s->claimer_held; tries++)
	{
		bool		again = s->claimer_id != 0 && tries == 0;
		int64_t		id = again ? s->claimer_id : qb_claimer_id();
		long long	written = 0;
		QbOdbcClass cls;

		if (id == 0)
		{
			snprintf(err, errlen, "no random bytes for a claimer id");
			return -1;
		}
		if (qbos_beat(s, id, !again, &written, &cls, err, errlen) != 0)
			return -1;
		if (written == 1)
		{
			s->claimer_id = id;
			s->claimer_held = true;
			s->beat_at = qb_now_ms();
		}
	}
	return 0;
}

/*
 * qbos_claimer_lock takes the session applock of the store's claimer id
 * (after a reconnect the same one, as the libpq store), or of a fresh one
 * when there is none yet or another session holds it.  sp_getapplock answers 0
 * or 1 when granted, below 0 when not (SQL Server -1 at once with
 * @LockTimeout = 0).  Not on Babelfish (the statement answers -100): its
 * APPLOCK_TEST of a lock another session holds leaks an error each call,
 * and the fifth in a session crashes the server (PANIC: ERRORDATA_STACK_SIZE
 * exceeded, Babelfish 4.3), so there the claimer beats instead
 * (qbos_claimer_register) and _claimer_gone reads the beats.
 */
static int
qbos_claimer_lock(QbOdbcStore *s, char *err, size_t errlen)
{
	for (int tries = 0; tries < 8 && !s->claimer_held && !s->babelfish; tries++)
	{
		int64_t		id = s->claimer_id != 0 && tries == 0 ? s->claimer_id : qb_claimer_id();
		char		res[64];
		long long	r = -1;
		QbOdbcClass cls;
		QbOdbcParam p[1];

		if (id == 0)
		{
			snprintf(err, errlen, "no random bytes for a claimer id");
			return -1;
		}
		snprintf(res, sizeof(res), "queuebox.claimer.%lld", (long long) id);
		p[0] = QBOS_TEXT(res);
		if (qb_odbc_exec(s->conn,
						 "DECLARE @r INT = -100; IF SERVERPROPERTY('BabelfishVersion') IS NULL"
						 " EXEC @r = sp_getapplock @Resource = ?, @LockMode = N'Exclusive',"
						 " @LockOwner = N'Session', @LockTimeout = 0; SELECT @r",
						 p, 1, s->statement_timeout_ms, qbos_lock_row, &r, &cls, err, errlen) != 0)
			return -1;
		if (r == -100)
			s->babelfish = true;
		else if (r >= 0)
		{
			s->claimer_id = id;
			s->claimer_held = true;
		}
	}
	return s->babelfish ? qbos_claimer_register(s, err, errlen) : 0;
}

/*
 * qbos_claimer_op: QbStore.claimer.  An applock once taken is kept while
 * the session lives, also when takeover is turned off: rows claimed under
 * it may still be in flight (on Babelfish the beats go on likewise).
 */
static int
qbos_claimer_op(void *ctx, bool on, char *err, size_t errlen)
{
	QbOdbcStore *s = ctx;

	s->takeover = on;
	if (!on || s->claimer_held)
		return 0;
	if (qbos_ensure(s, err, errlen) != 0 || qbos_claimer_lock(s, err, errlen) != 0)
		return -1;
	return 0;
}

/* ---- the API -------------------------------------------------------------------------- */

/* ---- the limit take ---------------------------------------------------------------- */

typedef struct QbosLimits
{
	QbLimitTake *t;
	int			n;
	QbOdbcParam p[3];
	int			seen;
} QbosLimits;

/* qbos_limits_row: (destination, got, wait_ms), one per take */
static int
qbos_limits_row(void *arg, int set, int ncols, char **v)
{
	QbosLimits *l = arg;

	if (set == 0 && ncols >= 3 && v[0] != NULL)
		l->seen += qb_limit_take_answer(l->t, l->n, v[0], qbos_num(v[1]), (long) qbos_num(v[2]));
	return 0;
}

static int
qbos_limits_body(QbOdbcStore *s, void *arg, QbOdbcClass *cls, char *err, size_t errlen)
{
	QbosLimits *l = arg;

	l->seen = 0;
	if (qb_odbc_exec(s->conn, "EXEC queuebox._limits_take ?, ?, ?", l->p, 3, s->statement_timeout_ms,
					 qbos_limits_row, l, cls, err, errlen) != 0)
		return -1;
	if (l->seen == l->n)
		return 0;
	*cls = QB_ODBC_FAILED;
	snprintf(err, errlen, "the limit take answered %d of %d destinations", l->seen, l->n);
	return -1;
}

/*
 * qbos_limits_take: QbStore.limits_take (engine.sql _limits_take).  The
 * places are this store's claimer's: its applock (SQL Server) or its beat
 * (Babelfish) shows it alive, taken here when takeover is off too (claims
 * still record none then: QBOS_CLAIMER).  A first take of a destination
 * may meet a peer's making its bucket row: run again.
 */
static int
qbos_limits_take(void *ctx, QbLimitTake *t, int n, long lease_ms, char *err, size_t errlen)
{
	QbOdbcStore *s = ctx;
	QbosLimits	l = {.t = t, .n = n};
	bool		oom = false;
	char	   *json;
	QbOdbcClass cls;
	int			rc;

	if (n <= 0)
		return 0;
	if (!s->claimer_held &&
		(qbos_ensure(s, err, errlen) != 0 || qbos_claimer_lock(s, err, errlen) != 0))
		return -1;
	if (!s->claimer_held)
	{
		snprintf(err, errlen, "no claimer id could be taken for the limits' places");
		return -1;
	}
	if ((json = qb_odbc_json_limits(t, n, &oom)) == NULL)
	{
		snprintf(err, errlen, "out of memory for a limit take");
		return -1;
	}
	l.p[0] = QBOS_TEXT(json);
	l.p[1] = QBOS_INT(s->claimer_id);
	l.p[2] = QBOS_INT(0);		/* the applock or the beat shows it alive */
	(void) lease_ms;
	rc = qbos_txn(s, "limit take", qbos_limits_body, &l, true, &cls, err, errlen);
	free(json);
	return rc;
}

QbOdbcStore *
qb_odbc_store_new(const QbOdbcConf *conf, char *err, size_t errlen)
{
	QbOdbcStore *s;
	QbOdbcUrl	u;

	/* a URL that cannot connect is refused now, not at every op */
	if (qb_odbc_url_parse(conf->url, &u, err, errlen) != 0)
		return NULL;
	qb_odbc_url_free(&u);
	if ((s = calloc(1, sizeof(QbOdbcStore))) == NULL ||
		(s->url = strdup(conf->url)) == NULL ||
		(s->application_name = strdup(conf->application_name ? conf->application_name : "queuebox")) == NULL)
	{
		qb_odbc_store_free(s);
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	s->connect_timeout_ms = conf->connect_timeout_ms;
	s->statement_timeout_ms = conf->statement_timeout_ms;
	return s;
}

void
qb_odbc_store_ops(QbOdbcStore *s, QbStore *store)
{
	*store = (QbStore) {
		.ctx = s,
		.config_load = qbos_config_load,
		.outbox_cycle = qbos_outbox_cycle,
		.outbox_unpark = qbos_outbox_unpark,
		.outbox_unroute = qbos_outbox_unroute,
		.outbox_reclaim = qbos_outbox_reclaim,
		.outbox_retention = qbos_outbox_retention,
		.outbox_sweep = qbos_outbox_sweep,
		.inbox_insert = qbos_inbox_insert,
		.query_text = qbos_query_text,
		.claimer = qbos_claimer_op,
		.limits_take = qbos_limits_take,
		.relay_claim = qbos_relay_claim,
		.relay_forward = qbos_relay_forward,
	};
}

int
qb_odbc_store_connect(QbOdbcStore *s, char *err, size_t errlen)
{
	return qbos_ensure(s, err, errlen);
}

void
qb_odbc_store_set_config(QbOdbcStore *s, const QbConfig *cfg)
{
	s->cfg = cfg;
}

void
qb_odbc_store_free(QbOdbcStore *s)
{
	if (s == NULL)
		return;
	qbos_drop(s);
	free(s->url);
	free(s->application_name);
	free(s);
}
