/*-------------------------------------------------------------------------
 * pq_store.c
 *	  The libpq store: the core's QbStore over one libpq connection.
 *
 * Wording:
 *	- A statement is one of qb_pg_stmts (qb_pg_stmt.h), the SQL the SPI
 *	  store runs too: prepared once per connection, lazily, as qb_<id>, and
 *	  again after a reconnect.  Parameters are typed (qbpq_oids) and sent as
 *	  text (arrays as literals, qb_pg_array.h); no value is spliced into SQL.
 *	- An op is one QbStore call: one transaction (BEGIN ... COMMIT, ROLLBACK
 *	  on any error) holding the statements the SPI store runs for it
 *	  (qbpq_txn), its statements pipelined (qbpq_pipeline, README.md).
 *	- The connection is lost by PQstatus, or a statement that failed with
 *	  no SQLSTATE, class 08 or 57P01-57P03; the next op connects again
 *	  (with a backoff after a failed connect, qb_store_conn.h).
 *
 * Transaction rules: as qb_store.h, one short transaction per op.  A
 * COMMIT whose answer was lost fails the op, never retried.  async_commit:
 * asynchronous commits, but the forward and the inbox insert are durable.
 * Through a pooler nothing is prepared by name (README.md).  Over TCP
 * each connect gives the server's end the keepalives and tcp_user_timeout
 * of its own (qbpq_server_tcp), so each end finds a vanished peer in seconds.
 *
 * Takeover (qb_sql_pg.h, "Takeover"): when the engine asks for it
 * (QbStore.claimer), each connect takes a session advisory lock on the
 * store's claimer id and the claims record that id; the lock is held for
 * the connection's life, so when the role dies (or loses its connection)
 * its rows are taken over at once by any peer.  Through a pooler in
 * transaction mode no lock is taken: the session that would hold it is the
 * pooler's, which outlives the role (or is closed under it); claims record
 * no claimer and are taken over by lease only (docs/operations.md).
 *
 * Secrets: messages name the server as user@host:port/dbname, never the
 * URL; the password is scrubbed from libpq's.  One store, one thread.
 *-------------------------------------------------------------------------
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <libpq-fe.h>

/* the op's statements go out in pipeline mode (README.md, "round trips") */
#ifndef LIBPQ_HAS_PIPELINING
#error "queuebox-mssqld needs libpq 14 or later (pipeline mode): install a newer libpq-dev / libpq-devel"
#endif

#include "pq_store.h"
#include "qb_claim_cols.h"
#include "qb_host.h"
#include "qb_pg_array.h"
#include "qb_relay.h"
#include "qb_pg_stmt.h"
#include "qb_store_conn.h"

/*
 * The pg_type OIDs libpq sends for each QbPgType (catalog/pg_type.dat:
 * fixed numbers, the same on every server).
 */
static const Oid qbpq_oids[QB_PG_NTYPES] = {
	[QB_PG_T_NONE] = 0,
	[QB_PG_T_BOOL] = 16,
	[QB_PG_T_INT4] = 23,
	[QB_PG_T_INT8] = 20,
	[QB_PG_T_TEXT] = 25,
	[QB_PG_T_UUID] = 2950,
	[QB_PG_T_TIMESTAMPTZ] = 1184,
	[QB_PG_T_BOOL_ARRAY] = 1000,
	[QB_PG_T_INT4_ARRAY] = 1007,
	[QB_PG_T_INT8_ARRAY] = 1016,
	[QB_PG_T_TEXT_ARRAY] = 1009,
	[QB_PG_T_UUID_ARRAY] = 2951,
};

struct QbPqStore
{
	char	   *url;
	char	   *application_name;
	char	   *where;			/* user@host:port/dbname: the URL without its secrets */
	char	   *password;		/* scrubbed from libpq's messages; NULL: none given */
	long		connect_timeout_ms;
	long		statement_timeout_ms;
	bool		async_commit;
	bool		unnamed;		/* no named statements: a pooler in transaction mode */
	PGconn	   *conn;			/* NULL: not connected */
	bool		prepared[QB_PG_NSTMTS];
	QbStoreBackoff backoff;		/* of the connects that failed */
	char		sqlstate[6];	/* of the op's failed statement, "" when none */
	/* the op in progress (qbpq_txn, qbpq_pipeline) */
	bool		begin_pending;	/* its BEGIN goes out with its first statement */
	long		begin_timeout_ms;	/* > 0: SET LOCAL statement_timeout after that BEGIN */
	bool		begin_durable;	/* SET LOCAL synchronous_commit on after that BEGIN */
	bool		in_txn;			/* its BEGIN succeeded and no COMMIT ended it yet */
	bool		committed;		/* its COMMIT went out with its last statement and succeeded */
	char	  **channels;		/* LISTEN after every connect */
	int			nchannels;
	const QbConfig *cfg;		/* borrowed, for the inbox replay's topics */
	bool		takeover;		/* the engine asked for it (QbStore.claimer) */
	int64_t		claimer_id;		/* the claims' claimer id; 0: none drawn yet */
	bool		claimer_held;	/* this connection holds its lock */
};

/* ---- messages ------------------------------------------------------------ */

/*
 * qbpq_scrub copies libpq's message into err after what, without its
 * trailing newline and with the password (if libpq ever echoed it) masked.
 */
static void
qbpq_scrub(const QbPqStore *s, const char *what, const char *msg, char *err, size_t errlen)
{
	char		buf[QB_ERRLEN];
	size_t		len;
	char	   *hit;

	snprintf(buf, sizeof(buf), "%s", msg && *msg ? msg : "no message from libpq");
	len = strlen(buf);
	while (len > 0 && (buf[len - 1] == '\n' || buf[len - 1] == ' '))
		buf[--len] = '\0';
	/* a short password would mask every such letter: too short to matter */
	while (s->password != NULL && strlen(s->password) >= 4 &&
		   (hit = strstr(buf, s->password)) != NULL)
	{
		size_t		plen = strlen(s->password);

		memset(hit, '*', 3);
		memmove(hit + 3, hit + plen, strlen(hit + plen) + 1);
	}
	snprintf(err, errlen, "%s: %s", what, buf);
}

/* qbpq_describe: s->where (user@host:port/dbname) and s->password, from the URL or conninfo. */
static bool
qbpq_describe(QbPqStore *s)
{
	char	   *perr = NULL;
	PQconninfoOption *opts = PQconninfoParse(s->url, &perr);
	const char *user = NULL,
			   *host = NULL,
			   *port = NULL,
			   *db = NULL;
	char		buf[512];

	PQfreemem(perr);
	if (opts == NULL)
	{
		/* libpq will refuse it at connect, with its reason */
		s->where = strdup("the PostgreSQL server (the connection string does not parse)");
		return s->where != NULL;
	}
	for (PQconninfoOption *o = opts; o->keyword != NULL; o++)
	{
		if (o->val == NULL || o->val[0] == '\0')
			continue;
		if (strcmp(o->keyword, "user") == 0)
			user = o->val;
		else if (strcmp(o->keyword, "host") == 0 || (strcmp(o->keyword, "hostaddr") == 0 && !host))
			host = o->val;
		else if (strcmp(o->keyword, "port") == 0)
			port = o->val;
		else if (strcmp(o->keyword, "dbname") == 0)
			db = o->val;
		else if (strcmp(o->keyword, "password") == 0 && (s->password = strdup(o->val)) == NULL)
			break;
	}
	snprintf(buf, sizeof(buf), "PostgreSQL at %s%s%s%s%s/%s", user ? user : "", user ? "@" : "",
			 host ? host : "(default host)", port ? ":" : "", port ? port : "",
			 db ? db : "(default database)");
	PQconninfoFree(opts);
	s->where = strdup(buf);
	return s->where != NULL;
}

/* ---- the connection --------------------------------------------------------- */

/* qbpq_drop closes a connection that is lost (or never became usable). */
static void
qbpq_drop(QbPqStore *s)
{
	if (s->conn != NULL)
		PQfinish(s->conn);
	s->conn = NULL;
	memset(s->prepared, 0, sizeof(s->prepared));
	s->claimer_held = false;	/* the lock went with the session */
}

/* qbpq_lost: does this failure mean the connection is gone? */
static bool
qbpq_lost(const QbPqStore *s, const char *state)
{
	return s->conn == NULL || PQstatus(s->conn) != CONNECTION_OK ||
		state == NULL || state[0] == '\0' || strncmp(state, "08", 2) == 0 ||
		strcmp(state, "57P01") == 0 || strcmp(state, "57P02") == 0 ||
		strcmp(state, "57P03") == 0;
}

/*
 * qbpq_failed records a failed statement: err = what + libpq's message,
 * s->sqlstate its SQLSTATE; a lost connection is dropped.
 */
static void
qbpq_failed(QbPqStore *s, const PGresult *res, const char *what, char *err, size_t errlen)
{
	const char *state = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;
	const char *msg = res ? PQresultErrorMessage(res) : NULL;

	if ((msg == NULL || *msg == '\0') && s->conn != NULL)
		msg = PQerrorMessage(s->conn);
	snprintf(s->sqlstate, sizeof(s->sqlstate), "%s", state ? state : "");
	qbpq_scrub(s, what, msg, err, errlen);
	if (qbpq_lost(s, state))
		qbpq_drop(s);
}

/* qbpq_command runs SQL text with no parameter and no row (BEGIN, LISTEN ...). */
static int
qbpq_command(QbPqStore *s, const char *sql, const char *what, char *err, size_t errlen)
{
	PGresult   *res = PQexec(s->conn, sql);
	int			rc = 0;

	if (PQresultStatus(res) != PGRES_COMMAND_OK)
	{
		qbpq_failed(s, res, what, err, errlen);
		rc = -1;
	}
	PQclear(res);
	return rc;
}

/*
 * The parameters of one statement: text values, numbers formatted into
 * num[], arrays built in arr[] (qbpq_args_array once an array is full).
 * Out of memory sticks and fails the statement.
 */
typedef struct QbpqArgs
{
	const char *v[QB_PG_MAXPARAMS];
	char		num[QB_PG_MAXPARAMS][24];
	QbPgArray	arr[QB_PG_MAXPARAMS];
	bool		oom;
} QbpqArgs;

static void
qbpq_args_int(QbpqArgs *a, int i, long long v)
{
	snprintf(a->num[i], sizeof(a->num[i]), "%lld", v);
	a->v[i] = a->num[i];
}

/* qbpq_args_array: parameter i is arr[i] (filled by the caller). */
static void
qbpq_args_array(QbpqArgs *a, int i)
{
	if ((a->v[i] = qb_pg_array_text(&a->arr[i])) == NULL)
		a->oom = true;
}

static void
qbpq_args_free(QbpqArgs *a)
{
	for (int i = 0; i < QB_PG_MAXPARAMS; i++)
		qb_pg_array_free(&a->arr[i]);
}

/* The COMMIT whose answer was lost with the connection: never guess. */
static void
qbpq_commit_lost(char *err, size_t errlen)
{
	char		buf[QB_ERRLEN];

	snprintf(buf, sizeof(buf), "%s", err);
	snprintf(err, errlen,
			 "%s (the connection was lost at COMMIT, so whether it committed is unknown; claimed rows come back when their lease ends)",
			 buf);
}

/* One statement of a pipeline: what to run, and (out) its result. */
typedef struct QbpqStep
{
	QbPgStmtId	id;				/* qb_pg_stmts[id] */
	const QbpqArgs *args;
	ExecStatusType want;
	const char *what;
	PGresult   *res;			/* its result when its status is want */
} QbpqStep;

#define QBPQ_MAXSTEPS	4

/* What each answer of a pipeline answers. */
typedef enum QbpqSent
{
	QBPQ_SENT_BEGIN,
	QBPQ_SENT_LOCAL,			/* a SET LOCAL after BEGIN */
	QBPQ_SENT_PREPARE,
	QBPQ_SENT_STEP,
	QBPQ_SENT_COMMIT
} QbpqSent;

/* One command queued in a pipeline: the server answers them in this order. */
typedef struct QbpqQueued
{
	QbpqSent	kind;
	int			step;			/* steps[] index of a PREPARE or STEP; else -1 */
} QbpqQueued;

/* One qbpq_pipeline call: what it queued, and what the answers said. */
typedef struct QbpqPipe
{
	QbPqStore  *s;
	QbpqStep   *steps;
	int			n;
	bool		commit;			/* a COMMIT goes out after the steps */
	const char *what;			/* names a failure not of one statement */
	char		timeout_ms[24]; /* the SET LOCAL statement_timeout value */
	QbpqQueued	queued[3 + 2 * QBPQ_MAXSTEPS + 1];
	int			nqueued;
	bool		send_refused;	/* a PQsend* call failed: the connection is not usable */
	bool		began;			/* the BEGIN answered: the transaction is open */
	bool		committed;		/* the COMMIT answered: the transaction ended well */
	bool		lost;			/* an answer never came: the connection went */
	PGresult   *fail;			/* the first failed answer (the server skipped the rest) */
	const char *fail_what;		/* what failed: its step, COMMIT, or what */
} QbpqPipe;

/* qbpq_pipe_check: refuses too many steps or parameters that ran out of memory. */
static int
qbpq_pipe_check(QbpqPipe *p, char *err, size_t errlen)
{
	if (p->n > QBPQ_MAXSTEPS)
	{
		snprintf(err, errlen, "%s: %d statements in one pipeline, at most %d", p->what, p->n,
				 QBPQ_MAXSTEPS);
		return -1;
	}
	for (int i = 0; i < p->n; i++)
	{
		p->steps[i].res = NULL;
		if (p->steps[i].args->oom)
		{
			snprintf(err, errlen, "%s: out of memory building its parameters", p->steps[i].what);
			return -1;
		}
	}
	return 0;
}

/* qbpq_queue records a command just sent (sent: the PQsend* call's return). */
static void
qbpq_queue(QbpqPipe *p, QbpqSent kind, int step, int sent)
{
	if (sent != 1)
		p->send_refused = true;
	p->queued[p->nqueued++] = (QbpqQueued) {.kind = kind, .step = step};
}

/* qbpq_queue_begin: the op's pending BEGIN and its SET LOCALs. */
static void
qbpq_queue_begin(QbpqPipe *p)
{
	static const char *const local_sql = "SELECT set_config($1, $2, true)";
	PGconn	   *conn = p->s->conn;

	qbpq_queue(p, QBPQ_SENT_BEGIN, -1,
			   PQsendQueryParams(conn, "BEGIN", 0, NULL, NULL, NULL, NULL, 0));
	if (p->s->begin_timeout_ms > 0)
	{
		const char *v[2] = {"statement_timeout", p->timeout_ms};

		snprintf(p->timeout_ms, sizeof(p->timeout_ms), "%ld", p->s->begin_timeout_ms);
		qbpq_queue(p, QBPQ_SENT_LOCAL, -1,
				   PQsendQueryParams(conn, local_sql, 2, NULL, v, NULL, NULL, 0));
	}
	if (p->s->begin_durable)
	{
		const char *v[2] = {"synchronous_commit", "on"};

		qbpq_queue(p, QBPQ_SENT_LOCAL, -1,
				   PQsendQueryParams(conn, local_sql, 2, NULL, v, NULL, NULL, 0));
	}
}

/*
 * qbpq_queue_step: steps[i], with its Parse first when it is not prepared on
 * this connection yet; through a pooler, its text (an unnamed statement).
 */
static void
qbpq_queue_step(QbpqPipe *p, int i)
{
	QbPqStore  *s = p->s;
	int			id = p->steps[i].id;
	const QbPgStmt *st = &qb_pg_stmts[id];
	Oid			types[QB_PG_MAXPARAMS];
	char		name[16];

	for (int k = 0; k < st->nparams; k++)
		types[k] = qbpq_oids[st->params[k]];
	if (s->unnamed)
	{
		/* each transaction may run on another server connection */
		qbpq_queue(p, QBPQ_SENT_STEP, i,
				   PQsendQueryParams(s->conn, st->sql, st->nparams, types, p->steps[i].args->v,
									 NULL, NULL, 0));
		return;
	}
	snprintf(name, sizeof(name), "qb_%d", id);
	if (!s->prepared[id])
		qbpq_queue(p, QBPQ_SENT_PREPARE, i,
				   PQsendPrepare(s->conn, name, st->sql, st->nparams, types));
	qbpq_queue(p, QBPQ_SENT_STEP, i,
			   PQsendQueryPrepared(s->conn, name, st->nparams, p->steps[i].args->v, NULL, NULL, 0));
}

/* qbpq_want: the status that means q succeeded. */
static ExecStatusType
qbpq_want(const QbpqPipe *p, const QbpqQueued *q)
{
	if (q->kind == QBPQ_SENT_STEP)
		return p->steps[q->step].want;
	return q->kind == QBPQ_SENT_LOCAL ? PGRES_TUPLES_OK : PGRES_COMMAND_OK;
}

/* qbpq_answered: q succeeded with res; keeps res (a step's result) or clears it. */
static void
qbpq_answered(QbpqPipe *p, const QbpqQueued *q, PGresult *res)
{
	if (q->kind == QBPQ_SENT_STEP)
	{
		p->steps[q->step].res = res;
		return;
	}
	if (q->kind == QBPQ_SENT_PREPARE)
		p->s->prepared[p->steps[q->step].id] = true;
	else if (q->kind == QBPQ_SENT_BEGIN)
		p->began = true;
	else if (q->kind == QBPQ_SENT_COMMIT)
		p->committed = true;
	PQclear(res);
}

/* qbpq_failed_first keeps q's failure res when it is the first one. */
static void
qbpq_failed_first(QbpqPipe *p, const QbpqQueued *q, PGresult *res)
{
	if (PQresultStatus(res) == PGRES_PIPELINE_ABORTED || p->fail != NULL)
	{
		PQclear(res);
		return;
	}
	/* the first failure; the server skipped what came after it */
	p->fail = res;
	p->fail_what = q->kind == QBPQ_SENT_STEP || q->kind == QBPQ_SENT_PREPARE ?
		p->steps[q->step].what : q->kind == QBPQ_SENT_COMMIT ? "COMMIT" : p->what;
	if (q->kind == QBPQ_SENT_COMMIT)
		p->s->in_txn = false;	/* a failed COMMIT ends the transaction */
}

/*
 * qbpq_read_answer reads q's result, then the NULL that ends its results;
 * a missing answer or an early Sync sets lost.
 */
static void
qbpq_read_answer(QbpqPipe *p, const QbpqQueued *q)
{
	PGresult   *res = PQgetResult(p->s->conn);

	if (res == NULL)
	{
		p->lost = true;			/* no answer at all: the connection went */
		return;
	}
	if (PQresultStatus(res) == qbpq_want(p, q))
		qbpq_answered(p, q, res);
	else
		qbpq_failed_first(p, q, res);
	while ((res = PQgetResult(p->s->conn)) != NULL)
	{
		if (PQresultStatus(res) == PGRES_PIPELINE_SYNC)
			break;				/* not expected here: treat the rest as lost */
		PQclear(res);
	}
	if (res != NULL)
	{
		PQclear(res);
		p->lost = true;
	}
}

/* qbpq_read_answers: every queued command's, then the Sync's, then pipeline mode ends. */
static void
qbpq_read_answers(QbpqPipe *p)
{
	for (int k = 0; k < p->nqueued && !p->lost; k++)
		qbpq_read_answer(p, &p->queued[k]);
	if (!p->lost)
	{
		PGresult   *res = PQgetResult(p->s->conn);

		p->lost = PQresultStatus(res) != PGRES_PIPELINE_SYNC;
		PQclear(res);
	}
	if (!p->lost && PQexitPipelineMode(p->s->conn) != 1)
		p->lost = true;
}

/* qbpq_pipe_failed: the steps' results go, err says what failed first. */
static void
qbpq_pipe_failed(QbpqPipe *p, char *err, size_t errlen)
{
	QbPqStore  *s = p->s;

	for (int i = 0; i < p->n; i++)
	{
		PQclear(p->steps[i].res);
		p->steps[i].res = NULL;
	}
	if (p->fail != NULL)
		qbpq_failed(s, p->fail, p->fail_what, err, errlen);
	else
		qbpq_failed(s, NULL, p->what, err, errlen);
	PQclear(p->fail);
	if (p->lost)
		qbpq_drop(s);
	/* the connection went with the COMMIT sent and not answered: never guess */
	if (p->commit && !p->committed && s->conn == NULL)
		qbpq_commit_lost(err, errlen);
}

/*
 * qbpq_pipeline sends, in pipeline mode and in this order, the op's pending
 * BEGIN and SET LOCALs, the Parse of each statement not yet prepared on
 * this connection, steps[0..n-1], and COMMIT when commit is set, then one
 * Sync, and reads every answer.  0: every steps[i].res set (the caller
 * clears them).  -1: err says what failed first (the statements after it
 * were skipped by the server), every res NULL; a lost connection is
 * dropped, and when the COMMIT was sent its outcome is unknown, which err
 * says.  Its steps: check, queue (BEGIN, the steps, COMMIT), Sync, read
 * the answers, then the transaction state they tell (QbpqPipe).
 */
static int
qbpq_pipeline(QbPqStore *s, QbpqStep *steps, int n, bool commit, char *err, size_t errlen)
{
	QbpqPipe	p = {.s = s, .steps = steps, .n = n, .commit = commit,
	.what = n > 0 ? steps[0].what : "COMMIT"};

	if (qbpq_pipe_check(&p, err, errlen) != 0)
		return -1;
	if (PQenterPipelineMode(s->conn) != 1)
	{
		qbpq_failed(s, NULL, p.what, err, errlen);
		return -1;
	}
	if (s->begin_pending)
		qbpq_queue_begin(&p);
	for (int i = 0; i < n && !p.send_refused; i++)
		qbpq_queue_step(&p, i);
	if (commit && !p.send_refused)
		qbpq_queue(&p, QBPQ_SENT_COMMIT, -1,
				   PQsendQueryParams(s->conn, "COMMIT", 0, NULL, NULL, NULL, NULL, 0));
	if (p.send_refused || PQpipelineSync(s->conn) != 1)
	{
		/* nothing was sent, or the socket failed: the connection is not usable */
		qbpq_failed(s, NULL, p.what, err, errlen);
		qbpq_drop(s);
		if (commit)
			qbpq_commit_lost(err, errlen);
		return -1;
	}
	qbpq_read_answers(&p);
	if (p.began)
	{
		s->begin_pending = false;
		s->in_txn = true;
	}
	if (p.committed)
	{
		s->in_txn = false;
		s->committed = true;
	}
	if (p.lost || p.fail != NULL)
	{
		qbpq_pipe_failed(&p, err, errlen);
		return -1;
	}
	return 0;
}

/*
 * qbpq_run executes statement id (preparing it on this connection first)
 * and returns its result when its status is want, else NULL with err.  The
 * op's pending BEGIN goes with it.
 */
static PGresult *
qbpq_run(QbPqStore *s, int id, const QbpqArgs *a, ExecStatusType want, const char *what,
		 char *err, size_t errlen)
{
	QbpqStep	step = {.id = id, .args = a, .want = want, .what = what};

	return qbpq_pipeline(s, &step, 1, false, err, errlen) == 0 ? step.res : NULL;
}

/* qbpq_run_commit: qbpq_run for an op's last statement, its COMMIT with it. */
static PGresult *
qbpq_run_commit(QbPqStore *s, int id, const QbpqArgs *a, ExecStatusType want,
				const char *what, char *err, size_t errlen)
{
	QbpqStep	step = {.id = id, .args = a, .want = want, .what = what};

	return qbpq_pipeline(s, &step, 1, true, err, errlen) == 0 ? step.res : NULL;
}

/* qbpq_set: set_config(name, value, is_local), as SET [LOCAL] does. */
static int
qbpq_set(QbPqStore *s, const char *name, const char *value, bool local, char *err, size_t errlen)
{
	QbpqArgs	a = {.v = {name, value, local ? "t" : "f"}};
	char		what[96];
	PGresult   *res;

	snprintf(what, sizeof(what), "setting %s", name);
	if ((res = qbpq_run(s, QB_PG_S_SET_CONFIG, &a, PGRES_TUPLES_OK, what, err, errlen)) == NULL)
		return -1;
	PQclear(res);
	return 0;
}

static int
qbpq_listen_one(QbPqStore *s, const char *channel, char *err, size_t errlen)
{
	/* LISTEN takes no parameter: the channel goes in as a quoted identifier */
	char	   *ident = PQescapeIdentifier(s->conn, channel, strlen(channel));
	char	   *sql;
	int			rc;

	if (ident == NULL)
	{
		qbpq_failed(s, NULL, "quoting a LISTEN channel", err, errlen);
		return -1;
	}
	sql = malloc(strlen(ident) + 8);
	if (sql == NULL)
	{
		PQfreemem(ident);
		snprintf(err, errlen, "LISTEN: out of memory");
		return -1;
	}
	sprintf(sql, "LISTEN %s", ident);
	rc = qbpq_command(s, sql, "LISTEN", err, errlen);
	free(sql);
	PQfreemem(ident);
	return rc;
}

/*
 * qbpq_server_tcp gives the server's end of the connection the keepalives
 * and tcp_user_timeout the connection has at this end (qbpq_tcp_keys or the
 * URL's): a backend whose client vanished mid-transaction would otherwise
 * hold its row locks until the server's kernel gives up (2 hours of
 * keepalive by default), and the claim skips locked rows.  Nothing on a
 * Unix socket, nor with keepalives=0.
 */
static int
qbpq_server_tcp(QbPqStore *s, char *err, size_t errlen)
{
	static const char *const map[][2] = {
		{"keepalives_idle", "tcp_keepalives_idle"},
		{"keepalives_interval", "tcp_keepalives_interval"},
		{"keepalives_count", "tcp_keepalives_count"},
		{"tcp_user_timeout", "tcp_user_timeout"},
	};
	const char *host = PQhost(s->conn);
	PQconninfoOption *opts;
	int			rc = 0;

	if (host == NULL || host[0] == '/' || host[0] == '@')
		return 0;
	if ((opts = PQconninfo(s->conn)) == NULL)
		return 0;
	for (PQconninfoOption *o = opts; o->keyword != NULL; o++)
		if (strcmp(o->keyword, "keepalives") == 0 && o->val != NULL && strcmp(o->val, "0") == 0)
			goto done;
	for (size_t i = 0; i < sizeof(map) / sizeof(map[0]) && rc == 0; i++)
		for (PQconninfoOption *o = opts; o->keyword != NULL; o++)
			if (strcmp(o->keyword, map[i][0]) == 0 && o->val != NULL && o->val[0] != '\0')
			{
				rc = qbpq_set(s, map[i][1], o->val, false, err, errlen);
				break;
			}
done:
	PQconninfoFree(opts);
	return rc;
}

/*
 * qbpq_claimer_lock takes the lock of the store's claimer id on this
 * session: after a reconnect the same id, so rows claimed before the
 * connection was lost stay this role's unless a peer took them over
 * meanwhile; a fresh id when there is none yet or another session holds
 * it.  Not through a pooler.
 */
static int
qbpq_claimer_lock(QbPqStore *s, char *err, size_t errlen)
{
	for (int tries = 0; tries < 8 && !s->claimer_held && !s->unnamed; tries++)
	{
		int64_t		id = s->claimer_id != 0 && tries == 0 ? s->claimer_id : qb_claimer_id();
		QbpqArgs	a = {0};
		PGresult   *res;
		bool		got;

		if (id == 0)
		{
			snprintf(err, errlen, "no random bytes for a claimer id");
			return -1;
		}
		qbpq_args_int(&a, 0, id);
		if ((res = qbpq_run(s, QB_PG_S_CLAIMER_LOCK, &a, PGRES_TUPLES_OK, "taking the claimer lock",
							err, errlen)) == NULL)
			return -1;
		got = PQntuples(res) == 1 && strcmp(PQgetvalue(res, 0, 0), "t") == 0;
		PQclear(res);
		if (got)
		{
			s->claimer_id = id;
			s->claimer_held = true;
		}
	}
	return 0;
}

/* the claimer a claim records: 0 records none */
static int64_t
qbpq_claimer(const QbPqStore *s)
{
	return s->takeover && s->claimer_held ? s->claimer_id : 0;
}

/*
 * qbpq_session sets up a new connection as the extension's workers set up
 * their backend, then issues the LISTENs and takes the claimer lock.
 */
static int
qbpq_session(QbPqStore *s, char *err, size_t errlen)
{
	static const char *const off[] = {"enable_seqscan", "enable_bitmapscan", "enable_sort",
	"enable_hashjoin", "jit"};
	char		ms[24];

	for (size_t i = 0; i < sizeof(off) / sizeof(off[0]); i++)
		if (qbpq_set(s, off[i], "off", false, err, errlen) != 0)
			return -1;
	if (s->statement_timeout_ms > 0)
	{
		snprintf(ms, sizeof(ms), "%ld", s->statement_timeout_ms);
		if (qbpq_set(s, "statement_timeout", ms, false, err, errlen) != 0)
			return -1;
	}
	if (s->async_commit && qbpq_set(s, "synchronous_commit", "off", false, err, errlen) != 0)
		return -1;
	if (qbpq_server_tcp(s, err, errlen) != 0)
		return -1;
	for (int i = 0; i < s->nchannels; i++)
		if (qbpq_listen_one(s, s->channels[i], err, errlen) != 0)
			return -1;
	return s->takeover ? qbpq_claimer_lock(s, err, errlen) : 0;
}

/*
 * The TCP settings every daemon connection starts from, so a peer that went
 * silent (a partition, a host gone without a FIN or RST) is found in about
 * 25 s instead of the kernel's 2 hours of keepalive or 15 minutes of
 * retransmission: probes after 10 s idle, every 5 s, and no byte left
 * unacknowledged for more than 25 s.  They come before the URL in
 * qb_pq_connect's arrays, so the URL's own keepalives* or tcp_user_timeout
 * win (libpq keeps the last value of a key).  libpq ignores them on a Unix
 * socket.  docs/daemon.md "Dead peers" has the same figures.
 */
static const char *const qbpq_tcp_keys[] = {
	"keepalives", "keepalives_idle", "keepalives_interval", "keepalives_count", "tcp_user_timeout",
};
static const char *const qbpq_tcp_vals[] = {"1", "10", "5", "3", "25000"};

#define QBPQ_NTCP (sizeof(qbpq_tcp_keys) / sizeof(qbpq_tcp_keys[0]))
_Static_assert(QBPQ_NTCP == sizeof(qbpq_tcp_vals) / sizeof(qbpq_tcp_vals[0]), "a value per TCP key");

/* qb_pq_connect: see pq_store.h. */
PGconn *
qb_pq_connect(const char *url, const char *application_name, long connect_timeout_ms)
{
	const char *keys[QBPQ_NTCP + 4];
	const char *vals[QBPQ_NTCP + 4];
	size_t		n = 0;
	char		secs[24];

	for (size_t i = 0; i < QBPQ_NTCP; i++, n++)
	{
		keys[n] = qbpq_tcp_keys[i];
		vals[n] = qbpq_tcp_vals[i];
	}
	keys[n] = "dbname";
	vals[n++] = url;
	keys[n] = "application_name";
	vals[n++] = application_name;
	if (connect_timeout_ms > 0)
	{
		/* libpq counts whole seconds: round up, never to 0 (no limit) */
		snprintf(secs, sizeof(secs), "%ld", (connect_timeout_ms + 999) / 1000);
		keys[n] = "connect_timeout";
		vals[n++] = secs;
	}
	keys[n] = NULL;
	vals[n] = NULL;
	return PQconnectdbParams(keys, vals, 1);
}

static int
qbpq_open(void *ctx, char *err, size_t errlen)
{
	QbPqStore  *s = ctx;
	char		what[600];

	snprintf(what, sizeof(what), "connecting to %s", s->where);
	s->conn = qb_pq_connect(s->url, s->application_name, s->connect_timeout_ms);
	if (s->conn == NULL || PQstatus(s->conn) != CONNECTION_OK)
	{
		qbpq_scrub(s, what, s->conn ? PQerrorMessage(s->conn) : "out of memory", err, errlen);
		qbpq_drop(s);
		return -1;
	}
	memset(s->prepared, 0, sizeof(s->prepared));
	if (qbpq_session(s, err, errlen) != 0)
	{
		qbpq_drop(s);
		return -1;
	}
	return 0;
}

/*
 * qbpq_ensure: a usable connection, or -1.  Connects when there is none,
 * unless the backoff of the last failed connect is still running.
 */
static int
qbpq_ensure(QbPqStore *s, char *err, size_t errlen)
{
	if (s->conn != NULL && PQstatus(s->conn) == CONNECTION_OK)
		return 0;
	qbpq_drop(s);
	return qb_store_connect(&s->backoff, qbpq_open, s, err, errlen);
}

/* ---- one op, one transaction ---------------------------------------------- */

typedef int (*QbpqBody) (QbPqStore *s, void *arg, char *err, size_t errlen);

/*
 * qbpq_txn runs body(arg) in a transaction of its own: connect if needed,
 * BEGIN and SET LOCAL statement_timeout (timeout_ms > 0) with the body's
 * first statement, body, COMMIT (with the body's last statement when it
 * ran it with qbpq_run_commit).  When body fails (-1, or a QB_QUERY_*
 * code) the transaction is rolled back and its code returned.  A body that
 * ran no statement opened no transaction: nothing to commit.
 */
static int
qbpq_txn(QbPqStore *s, const char *what, long timeout_ms, QbpqBody body, void *arg,
		 char *err, size_t errlen)
{
	char		buf[QB_ERRLEN];
	int			rc;

	s->sqlstate[0] = '\0';
	if (qbpq_ensure(s, err, errlen) != 0)
		return -1;
	s->begin_pending = true;
	s->begin_timeout_ms = timeout_ms;
	s->begin_durable = false;
	s->in_txn = false;
	s->committed = false;
	rc = body(s, arg, err, errlen);
	s->begin_pending = false;
	if (rc == 0 && s->committed)
		return 0;
	if (rc == 0 && s->conn != NULL && !s->in_txn)
		return 0;
	if (rc != 0)
	{
		if (s->conn != NULL && s->in_txn && qbpq_command(s, "ROLLBACK", what, buf, sizeof(buf)) != 0)
			qbpq_drop(s);
		s->in_txn = false;
		return rc;
	}
	s->in_txn = false;
	if (s->conn == NULL || qbpq_command(s, "COMMIT", what, err, errlen) != 0)
	{
		if (s->conn == NULL)
			qbpq_commit_lost(err, errlen);
		return -1;
	}
	return 0;
}

/*
 * qbpq_durable: this transaction commits synchronously even on a session
 * that commits asynchronously (the relay's forward, the inbox insert).
 */
static int
qbpq_durable(QbPqStore *s, char *err, size_t errlen)
{
	if (!s->async_commit)
		return 0;
	if (s->begin_pending)
	{
		/* with the BEGIN, in the first statement's round trip */
		s->begin_durable = true;
		return 0;
	}
	return qbpq_set(s, "synchronous_commit", "on", true, err, errlen);
}

/* ---- reading results ---------------------------------------------------------- */

/* qbpq_dup: a column as a malloc'd string, NULL for SQL NULL; *oom on failure. */
static char *
qbpq_dup(const PGresult *res, int row, int col, bool *oom)
{
	char	   *v;

	if (PQgetisnull(res, row, col))
		return NULL;
	if ((v = strdup(PQgetvalue(res, row, col))) == NULL)
		*oom = true;
	return v;
}

static long long
qbpq_int(const PGresult *res, int row, int col)
{
	return PQgetisnull(res, row, col) ? 0 : strtoll(PQgetvalue(res, row, col), NULL, 10);
}

static bool
qbpq_bool(const PGresult *res, int row, int col)
{
	return !PQgetisnull(res, row, col) && PQgetvalue(res, row, col)[0] == 't';
}

/* qbpq_oom: the op's err for a copy that ran out of memory. */
static int
qbpq_oom(const char *what, char *err, size_t errlen)
{
	snprintf(err, errlen, "%s: out of memory copying its rows", what);
	return -1;
}

/*
 * qbpq_take_rows appends the rows of a claim-shaped result (QB_PG_OUTBOX_CLAIM,
 * QB_PG_OUTBOX_PROMOTE) to out->rows.  Each row is counted before it is
 * copied, so a row copied in part is freed with the rest.
 */
static int
qbpq_take_rows(const PGresult *res, QbCycleOut *out, const char *what, char *err, size_t errlen)
{
	int			n = PQntuples(res);
	QbOutboxRow *rows;
	bool		oom = false;

	if (n == 0)
		return 0;
	if ((rows = realloc(out->rows, (out->nrows + n) * sizeof(QbOutboxRow))) == NULL)
		return qbpq_oom(what, err, errlen);
	memset(rows + out->nrows, 0, n * sizeof(QbOutboxRow));
	out->rows = rows;
	for (int i = 0; i < n && !oom; i++)
	{
		QbOutboxRow *r = &out->rows[out->nrows++];

		r->id = qbpq_int(res, i, QB_CLAIM_COL_ID);
		snprintf(r->message_id, sizeof(r->message_id), "%s",
				 PQgetvalue(res, i, QB_CLAIM_COL_MESSAGE_ID));
		r->topic = qbpq_dup(res, i, QB_CLAIM_COL_TOPIC, &oom);
		r->key = qbpq_dup(res, i, QB_CLAIM_COL_KEY, &oom);
		r->payload = qbpq_dup(res, i, QB_CLAIM_COL_PAYLOAD, &oom);
		r->payload_len = r->payload ? strlen(r->payload) : 0;
		r->headers = qbpq_dup(res, i, QB_CLAIM_COL_HEADERS, &oom);
		r->attempt = (int) qbpq_int(res, i, QB_CLAIM_COL_ATTEMPT);
		r->max_attempts = (int) qbpq_int(res, i, QB_CLAIM_COL_MAX_ATTEMPTS);
		r->created_epoch = strtod(PQgetvalue(res, i, QB_CLAIM_COL_CREATED_EPOCH), NULL);
		r->claimed = qbpq_bool(res, i, QB_CLAIM_COL_CLAIMED);
		r->destination = qbpq_dup(res, i, QB_CLAIM_COL_DESTINATION, &oom);
		r->in_intake = qbpq_bool(res, i, QB_CLAIM_COL_IN_INTAKE);
		r->not_due = qbpq_bool(res, i, QB_CLAIM_COL_NOT_DUE);
		r->probe = qbpq_bool(res, i, QB_CLAIM_COL_PROBE);
	}
	return oom ? qbpq_oom(what, err, errlen) : 0;
}

/* ---- the outbox cycle -------------------------------------------------------- */

/* qbpq_breaker: QB_PG_OUTBOX_BREAKER_ROWS then QB_PG_OUTBOX_BREAKER. */
static int
qbpq_breaker(QbPqStore *s, const QbDestTally *t, int n, QbCycleOut *out,
			 char *err, size_t errlen)
{
	QbpqArgs	a = {0};
	PGresult   *res = NULL;
	bool		oom = false;
	int			rc = -1;

	for (int i = 0; i < n; i++)
	{
		qb_pg_array_add(&a.arr[0], t[i].destination);
		qb_pg_array_add_int(&a.arr[1], t[i].ok);
		qb_pg_array_add_int(&a.arr[2], t[i].failed);
		qb_pg_array_add_bool(&a.arr[3], t[i].gone);
		qb_pg_array_add_int(&a.arr[4], t[i].retry_after_ms);
		qb_pg_array_add(&a.arr[5], t[i].error);
		qb_pg_array_add_int(&a.arr[6], t[i].threshold);
		qb_pg_array_add_int(&a.arr[7], t[i].cooldown_ms);
	}
	for (int i = 0; i < 8; i++)
		qbpq_args_array(&a, i);
	if ((res = qbpq_run(s, QB_PG_S_BREAKER_ROWS, &a, PGRES_COMMAND_OK,
						"creating the circuit breaker rows", err, errlen)) == NULL)
		goto done;
	PQclear(res);
	if ((res = qbpq_run(s, QB_PG_S_BREAKER, &a, PGRES_TUPLES_OK,
						"the circuit breaker statement", err, errlen)) == NULL)
		goto done;
	if (PQntuples(res) > 0 &&
		(out->changes = calloc(PQntuples(res), sizeof(QbDestChange))) == NULL)
	{
		rc = qbpq_oom("the circuit breaker statement", err, errlen);
		goto done;
	}
	for (int i = 0; i < PQntuples(res); i++)
	{
		QbDestChange *c = &out->changes[out->nchanges++];

		c->destination = qbpq_dup(res, i, 0, &oom);
		c->old_state = qb_circuit_parse(PQgetvalue(res, i, 1));
		c->new_state = qb_circuit_parse(PQgetvalue(res, i, 2));
		c->paused = qbpq_bool(res, i, 3);
	}
	rc = oom ? qbpq_oom("the circuit breaker statement", err, errlen) : 0;
done:
	PQclear(res);
	qbpq_args_free(&a);
	return rc;
}

/*
 * qbpq_settle: QB_PG_OUTBOX_SETTLE.  p gets the parameters of
 * QB_PG_OUTBOX_PROMOTE for the keys whose row ended (*nkeys of them), run
 * by the caller in a statement of its own (its comment says why); with
 * claim, the promoted rows that are due are claimed under its token.
 */
static int
qbpq_settle(QbPqStore *s, const QbSettle *st, int n, const QbClaimReq *claim,
			QbpqArgs *p, int *nkeys, QbCycleOut *out, char *err, size_t errlen)
{
	QbpqArgs	a = {0};
	PGresult   *res = NULL;
	int			rc = -1;

	*nkeys = 0;
	for (int i = 0; i < n; i++)
	{
		qb_pg_array_add(&a.arr[0], st[i].token);
		qb_pg_array_add_int(&a.arr[1], st[i].id);
		qb_pg_array_add(&a.arr[2], qb_settle_kind_name(st[i].kind));
		qb_pg_array_add_int(&a.arr[3], st[i].attempt);
		qb_pg_array_add_int(&a.arr[4], st[i].delay_ms);
		qb_pg_array_add(&a.arr[5], st[i].error);
		qb_pg_array_add(&a.arr[6], st[i].destination);
	}
	for (int i = 0; i < 7; i++)
		qbpq_args_array(&a, i);
	if ((res = qbpq_run(s, QB_PG_S_SETTLE, &a, PGRES_TUPLES_OK, "the outbox settle",
						err, errlen)) == NULL)
		goto done;
	out->nsettled = PQntuples(res);
	for (int i = 0; i < PQntuples(res); i++)
	{
		const char *state = PQgetvalue(res, i, 1);

		if (!PQgetisnull(res, i, 0) && (strcmp(state, "sent") == 0 || strcmp(state, "dead") == 0))
		{
			qb_pg_array_add(&p->arr[0], PQgetvalue(res, i, 0));
			(*nkeys)++;
		}
	}
	if (*nkeys > 0)
	{
		qbpq_args_array(p, 0);
		if (claim != NULL)
		{
			p->v[1] = claim->token;
			qbpq_args_int(p, 2, claim->lease_ms);
			qbpq_args_int(p, 3, claim->default_max_attempts);
			qbpq_args_int(p, 4, qbpq_claimer(s));
		}
	}
	rc = 0;
done:
	PQclear(res);
	qbpq_args_free(&a);
	return rc;
}

/* qbpq_states: the result of QB_PG_OUTBOX_STATES into out; the probe names into probes. */
static int
qbpq_states(const PGresult *res, QbCycleOut *out, QbPgArray *probes, char *err, size_t errlen)
{
	bool		oom = false;
	int			n = PQntuples(res);

	if (n > 0 && (out->states = calloc(n, sizeof(QbDestState))) == NULL)
		oom = true;
	for (int i = 0; i < n && !oom; i++)
	{
		QbDestState *st = &out->states[out->nstates++];

		st->destination = qbpq_dup(res, i, 0, &oom);
		st->state = qb_circuit_parse(PQgetvalue(res, i, 1));
		st->failures = (int) qbpq_int(res, i, 2);
		st->paused = qbpq_bool(res, i, 3);
		st->probe = qbpq_bool(res, i, 4);
		if (st->probe)
			qb_pg_array_add(probes, st->destination);
	}
	return oom ? qbpq_oom("reading the destination states", err, errlen) : 0;
}

/* qbpq_claim: QB_PG_OUTBOX_CLAIM, its rows into out. */
static int
qbpq_claim(QbPqStore *s, const QbClaimReq *c, QbPgArray *probes, QbCycleOut *out,
		   char *err, size_t errlen)
{
	QbpqArgs	a = {0};
	PGresult   *res;
	int			rc = -1;

	for (int i = 0; i < c->ndests; i++)
	{
		qb_pg_array_add(&a.arr[5], c->dests[i]);
		qb_pg_array_add_int(&a.arr[6], c->limits[i]);
		qb_pg_array_add_int(&a.arr[8], c->floors ? c->floors[i] : 0);
	}
	qbpq_args_int(&a, 0, c->batch_size);
	qbpq_args_int(&a, 1, c->lease_ms);
	qbpq_args_int(&a, 2, c->default_max_attempts);
	a.v[3] = c->token;
	qbpq_args_int(&a, 4, c->floor);
	qbpq_args_array(&a, 5);
	qbpq_args_array(&a, 6);
	if ((a.v[7] = qb_pg_array_text(probes)) == NULL)
		a.oom = true;
	qbpq_args_array(&a, 8);
	qbpq_args_int(&a, 9, qbpq_claimer(s));
	/* the cycle's last statement: its COMMIT goes with it */
	if ((res = qbpq_run_commit(s, QB_PG_S_CLAIM, &a, PGRES_TUPLES_OK, "the outbox claim",
						err, errlen)) != NULL)
	{
		rc = qbpq_take_rows(res, out, "the outbox claim", err, errlen);
		PQclear(res);
	}
	qbpq_args_free(&a);
	return rc;
}

/*
 * qbpq_cycle_body: as the SPI store's qbs_cycle_body, statement for
 * statement.  The round trips: the breaker's two statements (when it has
 * tallies) and the settle; then the promote with the destination states
 * (neither waits for the other); then the claim, which takes the promoted
 * rows and the probes into account, with the COMMIT.
 */
static int
qbpq_cycle_body(QbPqStore *s, void *arg, char *err, size_t errlen)
{
	QbCycleCall *cy = arg;
	const QbClaimReq *claim = cy->claim;
	QbClaimReq	req;
	QbPgArray	probes = {0};
	QbpqArgs	p = {0};
	QbpqArgs	sa = {0};
	QbpqStep	steps[2];
	int			nsteps = 0;
	int			nkeys = 0;
	int		   *limits = NULL;
	int			rc = -1;

	if (cy->ntallies > 0 &&
		qbpq_breaker(s, cy->tallies, cy->ntallies, cy->out, err, errlen) != 0)
		goto done;
	if (cy->nsettles > 0 &&
		qbpq_settle(s, cy->settles, cy->nsettles, claim, &p, &nkeys, cy->out, err, errlen) != 0)
		goto done;
	if (nkeys > 0)
		steps[nsteps++] = (QbpqStep) {.id = QB_PG_S_PROMOTE, .args = &p, .want = PGRES_TUPLES_OK,
		.what = "promoting the next row of each key"};
	if (claim != NULL)
	{
		qbpq_args_int(&sa, 0, claim->probe_ms);
		steps[nsteps++] = (QbpqStep) {.id = QB_PG_S_STATES, .args = &sa, .want = PGRES_TUPLES_OK,
		.what = "reading the destination states"};
	}
	/* a settle alone commits with its promote */
	if (nsteps > 0 && qbpq_pipeline(s, steps, nsteps, claim == NULL, err, errlen) != 0)
		goto done;
	if (nkeys > 0 && claim != NULL &&
		qbpq_take_rows(steps[0].res, cy->out, "promoting the next row of each key", err, errlen) != 0)
		goto done;
	if (claim == NULL)
	{
		rc = 0;
		goto done;
	}
	if (qbpq_states(steps[nsteps - 1].res, cy->out, &probes, err, errlen) != 0)
		goto done;
	if ((limits = malloc(sizeof(int) * (claim->ndests + 1))) == NULL)
	{
		rc = qbpq_oom("the outbox claim", err, errlen);
		goto done;
	}
	qb_claim_left(claim, cy->out->rows, cy->out->nrows, &req, limits);
	rc = qbpq_claim(s, &req, &probes, cy->out, err, errlen);
done:
	/* the results of a pipeline that failed are cleared already (NULL) */
	for (int i = 0; i < nsteps; i++)
		PQclear(steps[i].res);
	qb_pg_array_free(&probes);
	qbpq_args_free(&p);
	free(limits);
	return rc;
}

static int
qbpq_outbox_cycle(void *ctx, const QbDestTally *tallies, int ntallies,
				  const QbSettle *settles, int nsettles, const QbClaimReq *claim,
				  QbCycleOut *out, char *err, size_t errlen)
{
	QbCycleCall c = {.tallies = tallies, .ntallies = ntallies, .settles = settles,
		.nsettles = nsettles, .claim = claim, .out = out};
	int			rc;

	memset(out, 0, sizeof(*out));
	rc = qbpq_txn(ctx, claim ? "settle and claim" : "settle", 0, qbpq_cycle_body, &c,
				  err, errlen);
	if (rc != 0)
		qb_cycle_out_free(out);
	return rc;
}

/* ---- the ops that count rows ------------------------------------------------- */

typedef struct QbpqCount
{
	int			id;
	const char *what;
	QbpqArgs	args;
	int			count;
} QbpqCount;

static int
qbpq_count_body(QbPqStore *s, void *arg, char *err, size_t errlen)
{
	QbpqCount  *c = arg;
	PGresult   *res = qbpq_run_commit(s, c->id, &c->args, PGRES_COMMAND_OK, c->what, err,
										errlen);

	if (res == NULL)
		return -1;
	c->count = atoi(PQcmdTuples(res));
	PQclear(res);
	return 0;
}

/* qbpq_count runs c's statement as an op; *count is the rows it changed. */
static int
qbpq_count(QbPqStore *s, QbpqCount *c, int *count, char *err, size_t errlen)
{
	int			rc = qbpq_txn(s, c->what, 0, qbpq_count_body, c, err, errlen);

	*count = rc == 0 ? c->count : 0;
	qbpq_args_free(&c->args);
	return rc;
}

/* qbpq_names: parameter 0 is the text[] of names. */
static void
qbpq_names(QbpqArgs *a, const char *const *names, int n)
{
	for (int i = 0; i < n; i++)
		qb_pg_array_add(&a->arr[0], names[i]);
	qbpq_args_array(a, 0);
}

static int
qbpq_outbox_unpark(void *ctx, const char *const *dests, int n, int limit, int *nmoved,
				   char *err, size_t errlen)
{
	QbpqCount	c = {.id = QB_PG_S_UNPARK, .what = "unpark"};

	qbpq_names(&c.args, dests, n);
	qbpq_args_int(&c.args, 1, limit);
	return qbpq_count(ctx, &c, nmoved, err, errlen);
}

static int
qbpq_outbox_unroute(void *ctx, const char *const *dests, int n, int *nmoved,
					char *err, size_t errlen)
{
	QbpqCount	c = {.id = QB_PG_S_UNROUTE, .what = "unroute"};

	qbpq_names(&c.args, dests, n);
	return qbpq_count(ctx, &c, nmoved, err, errlen);
}

static int
qbpq_outbox_reclaim(void *ctx, int limit, int *n, char *err, size_t errlen)
{
	QbpqCount	c = {.id = QB_PG_S_RECLAIM, .what = "reclaim"};

	qbpq_args_int(&c.args, 0, limit);
	return qbpq_count(ctx, &c, n, err, errlen);
}

static int
qbpq_outbox_retention(void *ctx, long retention_sec, int limit, int *n,
					  char *err, size_t errlen)
{
	QbpqCount	c = {.id = QB_PG_S_RETENTION, .what = "retention"};

	qbpq_args_int(&c.args, 0, retention_sec);
	qbpq_args_int(&c.args, 1, limit);
	return qbpq_count(ctx, &c, n, err, errlen);
}

typedef struct QbpqSweep
{
	QbpqArgs	args;
	int			released;
	char	   *next;			/* malloc'd */
} QbpqSweep;

static int
qbpq_sweep_body(QbPqStore *s, void *arg, char *err, size_t errlen)
{
	QbpqSweep  *w = arg;
	PGresult   *res = qbpq_run_commit(s, QB_PG_S_SWEEP, &w->args, PGRES_TUPLES_OK, "sweep",
									  err, errlen);

	if (res == NULL)
		return -1;
	if (PQntuples(res) != 1)
	{
		snprintf(err, errlen, "the sweep of parked rows answered %d rows, not one", PQntuples(res));
		PQclear(res);
		return -1;
	}
	w->released = atoi(PQgetvalue(res, 0, 0));
	if (!PQgetisnull(res, 0, 1) && (w->next = strdup(PQgetvalue(res, 0, 1))) == NULL)
	{
		snprintf(err, errlen, "out of memory for the sweep's next key");
		PQclear(res);
		return -1;
	}
	PQclear(res);
	return 0;
}

static int
qbpq_outbox_sweep(void *ctx, const char *after, int limit, int *nreleased, char **next,
				  char *err, size_t errlen)
{
	QbpqSweep	w = {.args = {.v = {after}}};
	int			rc;

	qbpq_args_int(&w.args, 1, limit);
	rc = qbpq_txn(ctx, "sweep", 0, qbpq_sweep_body, &w, err, errlen);
	if (rc != 0)
	{
		free(w.next);
		w.next = NULL;
	}
	*nreleased = rc == 0 ? w.released : 0;
	*next = w.next;
	return rc;
}

/* ---- the relay ------------------------------------------------------------------ */

typedef struct QbpqRelayClaim
{
	int			batch_size;
	long		lease_ms;
	const char *token;
	QbRelayRow *rows;
	int			nrows;
} QbpqRelayClaim;

static int
qbpq_relay_claim_body(QbPqStore *s, void *arg, char *err, size_t errlen)
{
	QbpqRelayClaim *c = arg;
	QbpqArgs	a = {0};
	PGresult   *res;
	bool		oom = false;
	int			n;

	qbpq_args_int(&a, 0, c->batch_size);
	qbpq_args_int(&a, 1, c->lease_ms);
	a.v[2] = c->token;
	qbpq_args_int(&a, 3, qbpq_claimer(s));
	if ((res = qbpq_run_commit(s, QB_PG_S_RELAY_CLAIM, &a, PGRES_TUPLES_OK, "relay claim",
						err, errlen)) == NULL)
		return -1;
	n = PQntuples(res);
	if (n > 0 && (c->rows = calloc(n, sizeof(QbRelayRow))) == NULL)
		oom = true;
	for (int i = 0; i < n && !oom; i++)
	{
		QbRelayRow *r = &c->rows[c->nrows++];

		r->id = qbpq_int(res, i, 0);
		r->source = qbpq_dup(res, i, 1, &oom);
		r->event_type = qbpq_dup(res, i, 2, &oom);
		r->traceparent = PQnfields(res) >= 5 ? qbpq_dup(res, i, 4, &oom) : NULL;
	}
	PQclear(res);
	return oom ? qbpq_oom("relay claim", err, errlen) : 0;
}

static int
qbpq_relay_claim(void *ctx, int batch_size, long lease_ms, const char *token,
				 QbRelayRow **rows, int *nrows, char *err, size_t errlen)
{
	QbpqRelayClaim c = {.batch_size = batch_size, .lease_ms = lease_ms, .token = token};
	int			rc = qbpq_txn(ctx, "relay claim", 0, qbpq_relay_claim_body, &c, err, errlen);

	if (rc != 0)
	{
		qb_relay_rows_free(c.rows, c.nrows);
		c.rows = NULL;
		c.nrows = 0;
	}
	*rows = c.rows;
	*nrows = c.nrows;
	return rc;
}

typedef struct QbpqForward
{
	QbpqArgs	args;
	int			nsettled;
	int			ninserted;
} QbpqForward;

/*
 * the forward, then QB_PG_RELAY_PROMOTE with the same ids, in a later
 * statement (its parameters are the forward's, so both go in one round
 * trip, with the BEGIN and the COMMIT)
 */
static int
qbpq_relay_forward_body(QbPqStore *s, void *arg, char *err, size_t errlen)
{
	QbpqForward *f = arg;
	QbpqArgs	p = {.v = {f->args.v[1]}};
	QbpqStep	steps[2] = {
		{.id = QB_PG_S_RELAY_FORWARD, .args = &f->args, .want = PGRES_TUPLES_OK,
		.what = "the relay forward"},
		{.id = QB_PG_S_RELAY_PROMOTE, .args = &p, .want = PGRES_COMMAND_OK,
		.what = "promoting the next row of each aggregate"},
	};

	if (qbpq_durable(s, err, errlen) != 0 || qbpq_pipeline(s, steps, 2, true, err, errlen) != 0)
		return -1;
	f->nsettled = (int) qbpq_int(steps[0].res, 0, 0);
	f->ninserted = (int) qbpq_int(steps[0].res, 0, 1);
	PQclear(steps[0].res);
	PQclear(steps[1].res);
	return 0;
}

static int
qbpq_relay_forward(void *ctx, const char *token, const int64_t *ids,
				   const char *const *topics, const bool *holds, int n, int max_attempts,
				   int *nsettled, int *ninserted, char *err, size_t errlen)
{
	QbpqForward f = {.args = {.v = {token}}};
	int			rc;

	for (int i = 0; i < n; i++)
	{
		qb_pg_array_add_int(&f.args.arr[1], ids[i]);
		qb_pg_array_add(&f.args.arr[2], topics[i]);
		qb_pg_array_add_bool(&f.args.arr[4], holds != NULL && holds[i]);
	}
	qbpq_args_array(&f.args, 1);
	qbpq_args_array(&f.args, 2);
	qbpq_args_int(&f.args, 3, max_attempts);
	qbpq_args_array(&f.args, 4);
	rc = qbpq_txn(ctx, "relay forward", 0, qbpq_relay_forward_body, &f, err, errlen);
	qbpq_args_free(&f.args);
	*nsettled = rc == 0 ? f.nsettled : 0;
	*ninserted = rc == 0 ? f.ninserted : 0;
	return rc;
}

/* ---- the inbox insert --------------------------------------------------------- */

typedef struct QbpqInsert
{
	const QbInboxRow *rows;
	int			n;
	int64_t    *ids;
	QbpqArgs	args;
} QbpqInsert;

static int
qbpq_inbox_insert_body(QbPqStore *s, void *arg, char *err, size_t errlen)
{
	QbpqInsert *a = arg;
	PGresult   *res;

	if (qbpq_durable(s, err, errlen) != 0)
		return -1;
	if ((res = qbpq_run_commit(s, QB_PG_S_INBOX_INSERT, &a->args, PGRES_TUPLES_OK, "the inbox insert",
						err, errlen)) == NULL)
		return -1;
	/* match each stored row to the first request of its key */
	for (int r = 0; r < PQntuples(res); r++)
		(void) qb_inbox_match(a->rows, a->n, a->ids, qbpq_int(res, r, 0),
							  PQgetvalue(res, r, 1), PQgetvalue(res, r, 2));
	PQclear(res);
	return 0;
}

static int
qbpq_inbox_insert(void *ctx, const QbInboxRow *rows, int n, long timeout_ms,
				  int64_t *ids, char *err, size_t errlen)
{
	QbpqInsert	a = {.rows = rows, .n = n, .ids = ids};
	int			rc;

	memset(ids, 0, sizeof(int64_t) * n);
	for (int i = 0; i < n; i++)
	{
		qb_pg_array_add(&a.args.arr[0], rows[i].source);
		qb_pg_array_add(&a.args.arr[1], rows[i].idempotency_key);
		qb_pg_array_add(&a.args.arr[2], rows[i].event_type);
		qb_pg_array_add(&a.args.arr[3], rows[i].aggregate_id);
		qb_pg_array_add(&a.args.arr[4], rows[i].payload);
		qb_pg_array_add(&a.args.arr[5], rows[i].headers);
		qb_pg_array_add(&a.args.arr[6], rows[i].pull ? "pull" : "push");
		qb_pg_array_add(&a.args.arr[7], rows[i].dead_error);
	}
	for (int i = 0; i < 8; i++)
		qbpq_args_array(&a.args, i);
	rc = qbpq_txn(ctx, "storing received messages", timeout_ms, qbpq_inbox_insert_body, &a,
				  err, errlen);
	if (rc != 0)
		memset(ids, 0, sizeof(int64_t) * n);
	qbpq_args_free(&a.args);
	return rc;
}

/* ---- query_text --------------------------------------------------------------- */

typedef struct QbpqQuery
{
	QbQuery		query;
	const char *const *params;
	char	  **out;
} QbpqQuery;

/* qbpq_replay's state: the store and its select's result, which the rows point into. */
typedef struct QbpqReplay
{
	QbPqStore  *s;
	PGresult   *sel;
	int64_t    *ids;
	const char **sources;
	const char **types;
} QbpqReplay;

/* qbpq_replay_select: QB_PG_INBOX_REPLAY_SELECT (qb_replay_run's select). */
static int
qbpq_replay_select(void *ctx, const char *const *v, const int64_t **ids,
				   const char *const **sources, const char *const **types, int *n,
				   char *err, size_t errlen)
{
	QbpqReplay *p = ctx;
	QbpqArgs	a = {0};
	int			nt;

	for (int i = 0; i < 5; i++)
		a.v[i] = v[i];
	if ((p->sel = qbpq_run(p->s, QB_PG_S_REPLAY_SELECT, &a, PGRES_TUPLES_OK,
						   "reading the inbox rows to replay", err, errlen)) == NULL)
		return -1;
	nt = PQntuples(p->sel);
	p->ids = malloc(sizeof(int64_t) * (nt + 1));
	p->sources = malloc(sizeof(char *) * (nt + 1));
	p->types = malloc(sizeof(char *) * (nt + 1));
	if (p->ids == NULL || p->sources == NULL || p->types == NULL)
		return qbpq_oom("the replay", err, errlen);
	for (int i = 0; i < nt; i++)
	{
		p->ids[i] = qbpq_int(p->sel, i, 0);
		p->sources[i] = PQgetvalue(p->sel, i, 1);
		p->types[i] = PQgetisnull(p->sel, i, 2) ? NULL : PQgetvalue(p->sel, i, 2);
	}
	*ids = p->ids;
	*sources = p->sources;
	*types = p->types;
	*n = nt;
	return 0;
}

/* qbpq_replay_insert: QB_PG_INBOX_REPLAY (qb_replay_run's insert). */
static int
qbpq_replay_insert(void *ctx, const QbReplay *r, int max_attempts, long long *nrows,
				   bool *first_null, long long *first_id, char *err, size_t errlen)
{
	QbpqReplay *p = ctx;
	QbpqArgs	ins = {0};
	PGresult   *res;

	for (int i = 0; i < r->n; i++)
	{
		qb_pg_array_add_int(&ins.arr[0], r->ids[i]);
		qb_pg_array_add(&ins.arr[1], r->topics[i]);
	}
	qbpq_args_array(&ins, 0);
	qbpq_args_array(&ins, 1);
	qbpq_args_int(&ins, 2, max_attempts);
	res = qbpq_run(p->s, QB_PG_S_REPLAY, &ins, PGRES_TUPLES_OK,
				   "inserting the replayed outbox rows", err, errlen);
	qbpq_args_free(&ins);
	if (res == NULL)
		return -1;
	*nrows = PQntuples(res);
	*first_null = PQntuples(res) == 0;
	*first_id = *first_null ? 0 : qbpq_int(res, 0, 0);
	PQclear(res);
	return 0;
}

/*
 * qbpq_replay: QB_Q_REPLAY_INBOX and QB_Q_REPLAY_INBOX_BULK without the
 * extension's queuebox.replay_inbox() (a plain-SQL schema has none): the
 * rows (QB_PG_INBOX_REPLAY_SELECT), their topics from the configuration in
 * force (qb_replay_render, as the extension renders them), the insert
 * (QB_PG_INBOX_REPLAY); the answers and failures are the extension's.
 */
static int
qbpq_replay(QbPqStore *s, QbpqQuery *q, char *err, size_t errlen)
{
	static const QbReplayCalls calls = {
		.select = qbpq_replay_select,
		.insert = qbpq_replay_insert,
		.oom = "the replay: out of memory copying its rows",
	};
	QbpqReplay	p = {.s = s};
	int			rc;

	rc = qb_replay_run(s->cfg, q->query == QB_Q_REPLAY_INBOX, q->params, &calls, &p, q->out,
					   err, errlen);
	PQclear(p.sel);
	free(p.ids);
	free(p.sources);
	free(p.types);
	return rc;
}

static int
qbpq_query_text_body(QbPqStore *s, void *arg, char *err, size_t errlen)
{
	QbpqQuery  *q = arg;
	QbpqArgs	a = {0};
	PGresult   *res;
	bool		oom = false;

	if (q->query == QB_Q_REPLAY_INBOX || q->query == QB_Q_REPLAY_INBOX_BULK)
		return qbpq_replay(s, q, err, errlen);
	for (int i = 0; i < qb_pg_stmts[QB_PG_S_QUERY + q->query].nparams; i++)
		a.v[i] = q->params[i];
	if ((res = qbpq_run_commit(s, QB_PG_S_QUERY + q->query, &a, PGRES_TUPLES_OK, "query", err,
						errlen)) == NULL)
		return -1;
	if (PQntuples(res) > 0)
		*q->out = qbpq_dup(res, 0, 0, &oom);
	PQclear(res);
	return oom ? qbpq_oom("query", err, errlen) : 0;
}

static int
qbpq_query_text(void *ctx, QbQuery query, const char *const *params, long timeout_ms,
				char **out, char *err, size_t errlen)
{
	QbPqStore  *s = ctx;
	QbpqQuery	q = {.query = query, .params = params, .out = out};
	int			rc;

	_Static_assert(QB_PG_NQUERIES == QB_NQUERIES, "one statement per QbQuery");
	*out = NULL;
	rc = qbpq_txn(s, "query", timeout_ms, qbpq_query_text_body, &q, err, errlen);
	if (rc == 0)
		return 0;
	free(*out);
	*out = NULL;
	/* the store's own codes stand; a failed statement says what its SQLSTATE means */
	return rc == -1 ? qb_query_failure(s->sqlstate) : rc;
}

/* The daemon reads its document from a file: this op is replaced. */
static int
qbpq_config_load(void *ctx, char **text, char *err, size_t errlen)
{
	*text = NULL;
	return 0;
}

/*
 * qbpq_claimer_op: QbStore.claimer.  A lock once taken is kept while the
 * connection lives, also when takeover is turned off: rows claimed under it
 * may still be in flight.
 */
static int
qbpq_claimer_op(void *ctx, bool on, char *err, size_t errlen)
{
	QbPqStore  *s = ctx;

	s->takeover = on;
	if (!on || s->claimer_held || s->unnamed)
		return 0;
	if (qbpq_ensure(s, err, errlen) != 0)
		return -1;
	/* a fresh connection took it in its session set-up */
	return qbpq_claimer_lock(s, err, errlen);
}

/* ---- the API ----------------------------------------------------------------------- */

QbPqStore *
qb_pq_store_new(const QbPqConf *conf)
{
	QbPqStore  *s = calloc(1, sizeof(QbPqStore));

	if (s == NULL)
		return NULL;
	s->url = strdup(conf->url ? conf->url : "");
	s->application_name = strdup(conf->application_name ? conf->application_name : "queuebox");
	s->connect_timeout_ms = conf->connect_timeout_ms;
	s->statement_timeout_ms = conf->statement_timeout_ms;
	s->async_commit = conf->async_commit;
	s->unnamed = conf->unnamed_statements;
	if (s->url == NULL || s->application_name == NULL || !qbpq_describe(s))
	{
		qb_pq_store_free(s);
		return NULL;
	}
	return s;
}

void
qb_pq_store_ops(QbPqStore *s, QbStore *store)
{
	*store = (QbStore) {
		.ctx = s,
		.config_load = qbpq_config_load,
		.outbox_cycle = qbpq_outbox_cycle,
		.outbox_unpark = qbpq_outbox_unpark,
		.outbox_unroute = qbpq_outbox_unroute,
		.outbox_reclaim = qbpq_outbox_reclaim,
		.outbox_retention = qbpq_outbox_retention,
		.outbox_sweep = qbpq_outbox_sweep,
		.inbox_insert = qbpq_inbox_insert,
		.query_text = qbpq_query_text,
		.claimer = qbpq_claimer_op,
		.relay_claim = qbpq_relay_claim,
		.relay_forward = qbpq_relay_forward,
	};
}

int
qb_pq_store_connect(QbPqStore *s, char *err, size_t errlen)
{
	return qbpq_ensure(s, err, errlen);
}

int
qb_pq_store_socket(const QbPqStore *s)
{
	return s->conn != NULL ? PQsocket(s->conn) : -1;
}

int
qb_pq_store_listen(QbPqStore *s, const char *channel, char *err, size_t errlen)
{
	bool		connected = s->conn != NULL && PQstatus(s->conn) == CONNECTION_OK;
	bool		known = false;

	for (int i = 0; i < s->nchannels; i++)
		known |= strcmp(s->channels[i], channel) == 0;
	if (!known)
	{
		char	  **c = realloc(s->channels, sizeof(char *) * (s->nchannels + 1));

		if (c == NULL || (c[s->nchannels] = strdup(channel)) == NULL)
		{
			if (c != NULL)
				s->channels = c;
			snprintf(err, errlen, "LISTEN: out of memory");
			return -1;
		}
		s->channels = c;
		s->nchannels++;
	}
	/* a new connection issues every channel's LISTEN itself */
	if (!connected)
		return qbpq_ensure(s, err, errlen);
	return qbpq_listen_one(s, channel, err, errlen);
}

int
qb_pq_store_notified(QbPqStore *s)
{
	PGnotify   *n;
	int			count = 0;

	if (s->conn == NULL)
		return 0;
	if (!PQconsumeInput(s->conn))
	{
		/* the next op connects again (and says why if it cannot) */
		qbpq_drop(s);
		return 0;
	}
	while ((n = PQnotifies(s->conn)) != NULL)
	{
		count++;
		PQfreemem(n);
	}
	return count;
}

void
qb_pq_store_set_config(QbPqStore *s, const QbConfig *cfg)
{
	s->cfg = cfg;
}

void
qb_pq_store_free(QbPqStore *s)
{
	if (s == NULL)
		return;
	qbpq_drop(s);
	for (int i = 0; i < s->nchannels; i++)
		free(s->channels[i]);
	free(s->channels);
	free(s->url);
	free(s->application_name);
	free(s->where);
	free(s->password);
	free(s);
}
