/*-------------------------------------------------------------------------
 * pq_txn.c
 *	  One op of the libpq store (pq_store_int.h): its transaction
 *	  (qbpq_txn) and its statements, sent in libpq's pipeline mode
 *	  (qbpq_pipeline) with their parameters (QbpqArgs).
 *
 * Transaction rules: as qb_store.h, one short transaction per op; BEGIN
 * (and its SET LOCALs) goes out with the op's first statement, COMMIT with
 * its last when the op knows it (qbpq_run_commit), each statement's first
 * Parse on a connection with its first execution; a failed statement skips
 * the rest of its batch, then ROLLBACK.  A COMMIT whose answer was lost
 * fails the op, never retried.  async_commit: asynchronous commits, but
 * the forward and the inbox insert are durable (qbpq_durable).  Through a
 * pooler nothing is prepared by name (README.md).
 *-------------------------------------------------------------------------
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pq_store_int.h"

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

/* ---- the parameters ------------------------------------------------------- */

void
qbpq_args_int(QbpqArgs *a, int i, long long v)
{
	snprintf(a->num[i], sizeof(a->num[i]), "%lld", v);
	a->v[i] = a->num[i];
}

/* qbpq_args_array: parameter i is arr[i] (filled by the caller). */
void
qbpq_args_array(QbpqArgs *a, int i)
{
	if ((a->v[i] = qb_pg_array_text(&a->arr[i])) == NULL)
		a->oom = true;
}

void
qbpq_args_free(QbpqArgs *a)
{
	for (int i = 0; i < QB_PG_MAXPARAMS; i++)
		qb_pg_array_free(&a->arr[i]);
}

/* The COMMIT whose answer was lost with the connection: never guess. */
static void
qbpq_commit_lost(char *err, size_t errlen)
{
	char		buf[512];

	snprintf(buf, sizeof(buf), "%s", err);
	snprintf(err, errlen,
			 "%s (the connection was lost at COMMIT, so whether it committed is unknown; claimed rows come back when their lease ends)",
			 buf);
}

/* ---- the pipeline --------------------------------------------------------- */

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
int
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
PGresult *
qbpq_run(QbPqStore *s, int id, const QbpqArgs *a, ExecStatusType want, const char *what,
		 char *err, size_t errlen)
{
	QbpqStep	step = {.id = id, .args = a, .want = want, .what = what};

	return qbpq_pipeline(s, &step, 1, false, err, errlen) == 0 ? step.res : NULL;
}

/* qbpq_run_commit: qbpq_run for an op's last statement, its COMMIT with it. */
PGresult *
qbpq_run_commit(QbPqStore *s, int id, const QbpqArgs *a, ExecStatusType want,
				const char *what, char *err, size_t errlen)
{
	QbpqStep	step = {.id = id, .args = a, .want = want, .what = what};

	return qbpq_pipeline(s, &step, 1, true, err, errlen) == 0 ? step.res : NULL;
}

/* qbpq_set: set_config(name, value, is_local), as SET [LOCAL] does. */
int
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

/* ---- one op, one transaction ---------------------------------------------- */

/*
 * qbpq_txn runs body(arg) in a transaction of its own: connect if needed,
 * BEGIN and SET LOCAL statement_timeout (timeout_ms > 0) with the body's
 * first statement, body, COMMIT (with the body's last statement when it
 * ran it with qbpq_run_commit).  When body fails (-1, or a QB_QUERY_*
 * code) the transaction is rolled back and its code returned.  A body that
 * ran no statement opened no transaction: nothing to commit.
 */
int
qbpq_txn(QbPqStore *s, const char *what, long timeout_ms, QbpqBody body, void *arg,
		 char *err, size_t errlen)
{
	char		buf[512];
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
int
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
