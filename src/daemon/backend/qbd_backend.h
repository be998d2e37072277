/*-------------------------------------------------------------------------
 * qbd_backend.h
 *	  What the daemon's process asks of a database: one ops table per
 *	  backend (backend/postgresql/, backend/sqlserver/), chosen once from
 *	  database.url (qbd_backend_for), the only place that reads its scheme.
 *
 * Wording:
 *	- A backend is one database kind the daemon serves: its URL, schema,
 *	  migrations and store.  Its ops table (QbdBackend) is every call the
 *	  process makes that differs by database; the process never names a
 *	  backend's own functions.
 *	- The admin connection is the supervisor's short one: migrate, write the
 *	  config tables, close (no role inherits its socket).  A store is a
 *	  role's own (QbStore over one connection, made on first use).
 *	- A database that has no notification at commit (SQL Server) says so
 *	  through its ops: listen does nothing, socket is -1, the probe answers
 *	  QBD_PROBE_NONE; its roles poll.
 *
 * Every function field must be set: qbd_backend_check (run by main at
 * start) names a missing one, since -Wmissing-field-initializers does not
 * warn for a named initialiser that leaves a field out.
 *-------------------------------------------------------------------------
 */
#ifndef QBD_BACKEND_H
#define QBD_BACKEND_H

#include <stdbool.h>
#include <stddef.h>

#include "qb_config.h"
#include "qb_store.h"

/* The schema of this build (the Makefile's EXTVERSION) */
extern const char qbd_schema_version[];

/*
 * One upgrade step of a backend's schema, one per sql/schema/upgrade/
 * <from>--<to>.sql (PostgreSQL) or sql/sqlserver/upgrade/ (SQL Server), in
 * version order, ended by a step whose from is NULL: made by
 * scripts/embed-schema.sh.
 */
typedef struct QbdUpgrade
{
	const char *from;
	const char *to;
	const char *sql;
} QbdUpgrade;

/* how long the supervisor waits for its probe NOTIFY (probe_notify) */
#define QBD_PROBE_MS		3000

/* Does a NOTIFY reach a LISTEN through database.url? (probe_notify) */
typedef enum QbdProbe
{
	QBD_PROBE_FAILED = -1,		/* the probe could not be made (err says why) */
	QBD_PROBE_LOST = 0,			/* not within QBD_PROBE_MS: a pooler in transaction mode */
	QBD_PROBE_ARRIVED = 1,
	QBD_PROBE_NONE = 2			/* the database has no notification: nothing to check */
} QbdProbe;

typedef struct QbdBackend
{
	const char *name;			/* "postgresql", "sqlserver" */

	/* what the daemon needs of database: beyond the validator; -1 with err naming the key */
	int			(*check_config) (const QbConfig *cfg, char *err, size_t errlen);

	/* the admin connection: NULL with err (no password in it) */
	void	   *(*connect) (const QbConfig *cfg, const char *application_name,
							char *err, size_t errlen);
	/*
	 * Create or upgrade the schema, in one transaction.  done: what changed,
	 * for the log ("" when nothing did).  0, or -1 with err.
	 */
	int			(*migrate) (void *conn, char *done, size_t donelen, char *err, size_t errlen);
	/* the routes and destinations where the SQL functions read them; one transaction */
	int			(*publish_config) (void *conn, const QbConfig *cfg, char *err, size_t errlen);
	void		(*disconnect) (void *conn);

	/* does a NOTIFY reach a LISTEN through database.url (QbdProbe) */
	QbdProbe	(*probe_notify) (const QbConfig *cfg, char *err, size_t errlen);

	/*
	 * A role's store, filling *store (every op; ctx is the returned handle).
	 * pooled: the probe found a pooler (no statement prepared by name).  NULL
	 * with err.  Does not connect.
	 */
	void	   *(*store_new) (const QbConfig *cfg, const char *application_name, bool pooled,
							  QbStore *store, char *err, size_t errlen);
	/* connect now if not connected; 0, or -1 with err */
	int			(*store_connect) (void *db, char *err, size_t errlen);
	/* the configuration in force (borrowed), for the ops that render topics */
	void		(*store_set_config) (void *db, const QbConfig *cfg);
	/* LISTEN on channel from now on, again at each new connection */
	int			(*store_listen) (void *db, const char *channel, char *err, size_t errlen);
	/* the socket a wait polls for notifications (-1: none); ask again after each op */
	int			(*store_socket) (void *db);
	/* drain the notifications that arrived; how many (0: none) */
	int			(*store_notified) (void *db);
	void		(*store_free) (void *db);
} QbdBackend;

/* QbdBackend's functions, in order: each must be set (qb_ops.h) */
#define QBD_BACKEND_OPS(X, T) \
	X(T, check_config) X(T, connect) X(T, migrate) X(T, publish_config) X(T, disconnect) \
	X(T, probe_notify) X(T, store_new) X(T, store_connect) X(T, store_set_config) \
	X(T, store_listen) X(T, store_socket) X(T, store_notified) X(T, store_free)

/* One role's database: its backend and the store that backend made. */
typedef struct QbdDb
{
	const QbdBackend *ops;
	void	   *store;
} QbdDb;

/* The backend that serves url (a NULL url: PostgreSQL's, which check_config never sees). */
extern const QbdBackend *qbd_backend_for(const char *url);

/*
 * Every backend's table has every field: 0, or -1 with err naming the
 * backend and the missing field ("backend ops 'sqlserver' lacks
 * 'store_free'").  qbd_backend_check_one checks one table.
 */
extern int	qbd_backend_check(char *err, size_t errlen);
extern int	qbd_backend_check_one(const QbdBackend *be, char *err, size_t errlen);

/*
 * The URL with its password replaced by "***", into buf: what the daemon
 * says of a database URL (log lines, --check, connection errors).
 */
extern void qbd_redact_url(const char *url, char *buf, size_t len);

#endif							/* QBD_BACKEND_H */
