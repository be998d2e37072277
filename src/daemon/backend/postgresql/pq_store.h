/*-------------------------------------------------------------------------
 * pq_store.h
 *	  The libpq store: the core's QbStore over one libpq connection, for
 *	  queuebox-mssqld on PostgreSQL (managed PostgreSQL, where no extension
 *	  can be loaded, and the daemon's end-to-end tests).
 *
 * One store is one connection, used by one engine thread; give each engine
 * its own store.  It runs the same SQL text as the SPI store (qb_sql_pg.h),
 * so both are held to one contract (test/store/conformance.c).
 *
 * The connection is made on first use (or qb_pq_store_connect) and made
 * again after it is lost, with a backoff: while it waits, every op fails at
 * once with "database unreachable, next try in N ms: <why>".
 *
 * The store is three files over one private header (pq_store_int.h):
 * pq_conn.c (the connection), pq_txn.c (an op's transaction and pipeline),
 * pq_store.c (the ops).  With the schema's migrations (pq_migrate.c) and
 * the daemon's ops table (pq_backend.c), this header is the daemon's
 * PostgreSQL backend.
 *-------------------------------------------------------------------------
 */
#ifndef PQ_STORE_H
#define PQ_STORE_H

#include <stdbool.h>
#include <stddef.h>

#include "qb_config.h"
#include "qb_store.h"
#include "qbd_backend.h"

typedef struct QbPqConf
{
	const char *url;			/* libpq URI (postgres://...) or conninfo; TLS options (sslmode, sslrootcert, ...) pass through in it */
	const char *application_name;	/* e.g. "queuebox-mssqld outbox 0" */
	long		connect_timeout_ms; /* connect_timeout, rounded up to seconds (libpq's unit) */
	long		statement_timeout_ms;	/* SET statement_timeout at each connect; 0: server default */
	bool		async_commit;	/* SET synchronous_commit = off for the engines' cycles (as the extension's queuebox.worker_async_commit) */
	bool		unnamed_statements; /* send each statement with its text, never prepared by name (a pooler in transaction mode) */
} QbPqConf;

typedef struct QbPqStore QbPqStore;

/* copies the strings; does not connect.  NULL when out of memory. */
extern QbPqStore *qb_pq_store_new(const QbPqConf *conf);

/*
 * fills every op (named initialisers), ctx = s; config_load returns "no
 * document" (the daemon replaces that op: its document comes from a file)
 */
extern void qb_pq_store_ops(QbPqStore *s, QbStore *store);

/* connect now if not connected; 0 or -1 (err says why, without the password) */
extern int	qb_pq_store_connect(QbPqStore *s, char *err, size_t errlen);

/*
 * the connection's socket (-1 if none): the host polls it for NOTIFY.  A
 * reconnect gives a new socket: ask again after each op.
 */
extern int	qb_pq_store_socket(const QbPqStore *s);

/* LISTEN, re-issued after every reconnect */
extern int	qb_pq_store_listen(QbPqStore *s, const char *channel, char *err, size_t errlen);

/* consume input, drain and count notifications (0 when none) */
extern int	qb_pq_store_notified(QbPqStore *s);

/* the configuration in force (borrowed), for the ops that render topics (inbox replay) */
extern void qb_pq_store_set_config(QbPqStore *s, const QbConfig *cfg);

extern void qb_pq_store_free(QbPqStore *s);

/*
 * One connection attempt as every daemon connection makes it (the store's,
 * the supervisor's for migrations): TCP keepalives and tcp_user_timeout
 * (10 s idle, 5 s between probes, 25 s without an answer; the url may set
 * its own), url (a URI or conninfo) as dbname, application_name,
 * connect_timeout rounded up to whole seconds (0: libpq's default).  The connection whatever its status (NULL only when out
 * of memory): the caller checks PQstatus and says what failed.
 */
struct pg_conn;
extern struct pg_conn *qb_pq_connect(const char *url, const char *application_name,
									 long connect_timeout_ms);

/* ---- pq_migrate.c: the schema without the extension -------------------- */

/* the fresh schema and its upgrade steps (build/daemon/schema_pg.c) */
extern const char qbd_schema_pg[];
extern const QbdUpgrade qbd_upgrades_pg[];

/*
 * Create or upgrade schema queuebox to qbd_schema_version, in one
 * transaction under an advisory lock; done says what changed ("" when
 * nothing did).  0, or -1 with err and nothing changed.
 */
extern int	qb_pq_migrate(struct pg_conn *conn, char *done, size_t donelen, char *err, size_t errlen);
/*
 * What the daemon writes for the SQL functions that follow the
 * configuration (route_of, destination_status): its routes and
 * destinations, and whether the tables notify at commit (database.listen).
 */
extern int	qb_pq_publish_config(struct pg_conn *conn, const QbConfig *cfg,
								 char *err, size_t errlen);

/* ---- pq_backend.c: the daemon's ops for PostgreSQL ---------------------- */
extern const QbdBackend qbd_backend_postgresql;

#endif							/* PQ_STORE_H */
