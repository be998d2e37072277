/*-------------------------------------------------------------------------
 * qbd_migrate.h
 *	  The migration walk, written once for every backend: a backend gives
 *	  its steps (QbdMigrateOps), qbd_migrate walks them.
 *
 * Wording:
 *	- The schema is a backend's whole schema at this build's
 *	  qbd_schema_version; its upgrades are its steps from one version to the
 *	  next (QbdUpgrade, ended by a NULL from).  A version the daemon applied
 *	  is a row of queuebox.schema_version.
 *	- The walk: begin, lock, inspect; then either install the schema (none
 *	  there) or read the version there and apply each upgrade from it; each
 *	  script's version recorded after it; commit.  Any failure rolls back.
 *
 * Each step runs on the backend's admin connection inside the walk's one
 * transaction and returns 0, or -1 with err in the backend's words (what
 * failed, the server's message, what to do): the walk adds nothing to a
 * step's message, and writes only its own (an unknown version, done).
 *-------------------------------------------------------------------------
 */
#ifndef QBD_MIGRATE_H
#define QBD_MIGRATE_H

#include <stddef.h>

#include "qbd_backend.h"

typedef struct QbdMigrateOps
{
	const char *name;			/* the backend's, for a missing step */
	const char *where;			/* after "created the QueueBox schema": "" or " on SQL Server" */
	const char *schema;			/* the fresh schema's script */
	const QbdUpgrade *upgrades; /* the upgrade steps, in version order */

	/* open the transaction (nothing to roll back when it fails) */
	int			(*begin) (void *conn, char *err, size_t errlen);
	/* the migration lock, held to the end of the transaction */
	int			(*lock) (void *conn, char *err, size_t errlen);
	/*
	 * What is there: 1 a schema the daemon made (queuebox.schema_version),
	 * 0 none; -1 with err for what the daemon must not touch (a schema it
	 * did not make, the extension serving the database).
	 */
	int			(*inspect) (void *conn, char *err, size_t errlen);
	/* the version recorded last into have ("" when none) */
	int			(*read_version) (void *conn, char *have, size_t havelen, char *err, size_t errlen);
	/* run one script of the schema; err begins with what */
	int			(*run_script) (void *conn, const char *script, const char *what,
							   char *err, size_t errlen);
	/* the row of queuebox.schema_version for the version a script brought */
	int			(*record_version) (void *conn, const char *version, char *err, size_t errlen);
	int			(*commit) (void *conn, char *err, size_t errlen);
	/* after any failure past begin (a lost connection: nothing to do) */
	void		(*rollback) (void *conn);
} QbdMigrateOps;

/* QbdMigrateOps's functions, in order: each must be set (qb_ops.h) */
#define QBD_MIGRATE_OPS(X, T) \
	X(T, begin) X(T, lock) X(T, inspect) X(T, read_version) X(T, run_script) \
	X(T, record_version) X(T, commit) X(T, rollback)

/*
 * Create or upgrade schema queuebox to qbd_schema_version through ops, in
 * one transaction; done says what changed, for the log ("" when nothing
 * did).  0, or -1 with err and nothing changed.
 */
extern int	qbd_migrate(const QbdMigrateOps *ops, void *conn, char *done, size_t donelen,
						char *err, size_t errlen);

#endif							/* QBD_MIGRATE_H */
