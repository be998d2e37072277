/*-------------------------------------------------------------------------
 * pq_store_int.h
 *	  The libpq store's insides, shared by its four files (one prefix,
 *	  qbpq_): pq_conn.c (the connection and its session), pq_txn.c (one op:
 *	  its transaction, its statements in pipeline mode), pq_store.c (the
 *	  QbStore ops), pq_limits.c (the limit take, QbStore.limits_take).
 *	  pq_store.h is the store's face; nothing else includes this header.
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
 * One store, one thread: nothing here is locked.
 *-------------------------------------------------------------------------
 */
#ifndef PQ_STORE_INT_H
#define PQ_STORE_INT_H

#include <stdbool.h>
#include <stdint.h>

#include <libpq-fe.h>

/* the op's statements go out in pipeline mode (README.md, "round trips") */
#ifndef LIBPQ_HAS_PIPELINING
#error "queuebox-mssqld needs libpq 14 or later (pipeline mode): install a newer libpq-dev / libpq-devel"
#endif

#include "pq_store.h"
#include "qb_pg_array.h"
#include "qb_pg_stmt.h"
#include "qb_store_conn.h"

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

/* an op's work inside its transaction (qbpq_txn): 0, -1 or a QB_QUERY_* code, with err */
typedef int (*QbpqBody) (QbPqStore *s, void *arg, char *err, size_t errlen);

/* ---- pq_conn.c: the connection ------------------------------------------- */

/* close a connection that is lost (or never became usable) */
extern void qbpq_drop(QbPqStore *s);

/* a failed statement: err = what + libpq's message, s->sqlstate; a lost connection dropped */
extern void qbpq_failed(QbPqStore *s, const PGresult *res, const char *what, char *err, size_t errlen);

/* SQL text with no parameter and no row (BEGIN, LISTEN ...) */
extern int	qbpq_command(QbPqStore *s, const char *sql, const char *what, char *err, size_t errlen);

/* a usable connection (connecting when there is none, after the backoff), or -1 */
extern int	qbpq_ensure(QbPqStore *s, char *err, size_t errlen);

/* the store's claimer lock on this session (Takeover, pq_conn.c) */
extern int	qbpq_claimer_lock(QbPqStore *s, char *err, size_t errlen);

/* ---- pq_txn.c: one op ---------------------------------------------------- */

extern void qbpq_args_int(QbpqArgs *a, int i, long long v);
extern void qbpq_args_array(QbpqArgs *a, int i);
extern void qbpq_args_free(QbpqArgs *a);

/*
 * steps[0..n-1] (and COMMIT when commit is set) in one round trip, with the
 * op's pending BEGIN: 0 with every steps[i].res set (the caller clears
 * them), or -1 with err
 */
extern int	qbpq_pipeline(QbPqStore *s, QbpqStep *steps, int n, bool commit, char *err, size_t errlen);

/* one statement: its result when its status is want, else NULL with err */
extern PGresult *qbpq_run(QbPqStore *s, int id, const QbpqArgs *a, ExecStatusType want,
						  const char *what, char *err, size_t errlen);
/* the same for an op's last statement, its COMMIT with it */
extern PGresult *qbpq_run_commit(QbPqStore *s, int id, const QbpqArgs *a, ExecStatusType want,
								 const char *what, char *err, size_t errlen);

/* set_config(name, value, is_local), as SET [LOCAL] does */
extern int	qbpq_set(QbPqStore *s, const char *name, const char *value, bool local,
					 char *err, size_t errlen);

/* body(arg) as one op: its own transaction, committed or rolled back */
extern int	qbpq_txn(QbPqStore *s, const char *what, long timeout_ms, QbpqBody body, void *arg,
					 char *err, size_t errlen);

/* this op commits synchronously even on a session that commits asynchronously */
extern int	qbpq_durable(QbPqStore *s, char *err, size_t errlen);

/* ---- pq_limits.c: the limit take ---------------------------------------- */

/* QbStore.limits_take */
extern int	qbpq_limits_take(void *ctx, QbLimitTake *takes, int n, long lease_ms,
							 char *err, size_t errlen);

#endif							/* PQ_STORE_INT_H */
