/*-------------------------------------------------------------------------
 * qbd_migrate.c
 *	  The migration walk (qbd_migrate.h's wording): the same steps for
 *	  PostgreSQL (postgresql/pq_migrate.c) and SQL Server
 *	  (sqlserver/odbc_migrate.c), each backend giving how.
 *
 * Transaction rules: the walk is one transaction, from begin to commit,
 * rolled back on any error; both servers' DDL is transactional, so a
 * half-made schema never stays behind.  What changed is said only after
 * the commit: a step rolled back was never applied.
 *-------------------------------------------------------------------------
 */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "qb_ops.h"
#include "qbd_migrate.h"

QB_OPS_LISTED(QbdMigrateOps, 4, QBD_MIGRATE_OPS, QB_OPS_NONE);

/* qbd_version_index: where a version stands among ops's steps, or -1. */
static int
qbd_version_index(const QbdMigrateOps *ops, const char *v)
{
	int			i = 0;

	for (const QbdUpgrade *u = ops->upgrades; u->from != NULL; u++, i++)
		if (strcmp(u->from, v) == 0)
			return i;
	/* the current version comes after every step */
	return strcmp(v, qbd_schema_version) == 0 ? i : -1;
}

/* qbd_migrate_apply: one script, then the version it brings recorded. */
static int
qbd_migrate_apply(const QbdMigrateOps *ops, void *conn, const char *script, const char *version,
		  const char *what, char *err, size_t errlen)
{
	if (ops->run_script(conn, script, what, err, errlen) != 0)
		return -1;
	return ops->record_version(conn, version, err, errlen);
}

/* qbd_upgrade: from the version there (into have) to this build's, step by step. */
static int
qbd_upgrade(const QbdMigrateOps *ops, void *conn, char *have, size_t havelen,
			char *err, size_t errlen)
{
	int			at;

	if (ops->read_version(conn, have, havelen, err, errlen) != 0)
		return -1;
	if ((at = qbd_version_index(ops, have)) < 0)
	{
		snprintf(err, errlen,
				 "the QueueBox schema here is at version %s, which this queuebox-mssqld (schema %s) does not know: "
				 "a newer daemon migrated it. Run that version of queuebox-mssqld (or newer) against this database",
				 have[0] ? have : "(none recorded)", qbd_schema_version);
		return -1;
	}
	for (const QbdUpgrade *u = &ops->upgrades[at]; u->from != NULL; u++)
	{
		char		what[128];

		snprintf(what, sizeof(what), "could not migrate the schema from %s to %s", u->from, u->to);
		if (qbd_migrate_apply(ops, conn, u->sql, u->to, what, err, errlen) != 0)
			return -1;
	}
	return 0;
}

/* qbd_migrate: see qbd_migrate.h. */
int
qbd_migrate(const QbdMigrateOps *ops, void *conn, char *done, size_t donelen,
			char *err, size_t errlen)
{
	static const QbOpsField fields[] = {QBD_MIGRATE_OPS(QB_OPS_FIELD, QbdMigrateOps)};
	char		have[64] = "";
	int			there;

	done[0] = '\0';
	if (qb_ops_check("migrate ops", ops->name, ops, fields, sizeof(fields) / sizeof(fields[0]),
					 err, errlen) != 0)
		return -1;
	if (ops->begin(conn, err, errlen) != 0)
		return -1;
	if (ops->lock(conn, err, errlen) != 0 ||
		(there = ops->inspect(conn, err, errlen)) < 0 ||
		(there == 0 ?
		 qbd_migrate_apply(ops, conn, ops->schema, qbd_schema_version, "could not create the QueueBox schema",
				   err, errlen) :
		 qbd_upgrade(ops, conn, have, sizeof(have), err, errlen)) != 0 ||
		ops->commit(conn, err, errlen) != 0)
	{
		ops->rollback(conn);
		return -1;
	}
	if (there == 0)
		snprintf(done, donelen, "created the QueueBox schema%s (version %s)", ops->where,
				 qbd_schema_version);
	else if (have[0] != '\0' && strcmp(have, qbd_schema_version) != 0)
		snprintf(done, donelen, "upgraded the QueueBox schema from %s to %s", have, qbd_schema_version);
	return 0;
}
