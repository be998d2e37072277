/*-------------------------------------------------------------------------
 * odbc_migrate.c
 *	  The daemon's SQL Server schema: installed, checked and upgraded, and
 *	  the configuration's routes written where the procedures read them.
 *
 * Wording:
 *	- The schema text (qbd_schema_mssql, made by the Makefile from
 *	  sql/sqlserver/) creates schema queuebox at this build's
 *	  qbd_schema_version.  It is a list of batches, each ended by a line
 *	  holding only GO (CREATE PROCEDURE must be alone in its batch).
 *	- A migration takes the schema from one version to the next:
 *	  qbd_upgrades_mssql[], in order, one per
 *	  sql/sqlserver/upgrade/<from>--<to>.sql.
 *	- The migration lock is an exclusive application lock owned by the
 *	  transaction (sp_getapplock on QBD_MSSQL_LOCK): two daemons take turns.
 *
 * Transaction rules: qb_mssql_migrate is the walk of ../qbd_migrate.c with
 * this file's steps (the lock, the checks, the DDL, the version row, the
 * commit): one transaction, rolled back on any error; SQL Server's DDL is
 * transactional, so a half-made schema never stays behind.
 * qb_mssql_publish_config is one transaction too.  Values are bound
 * parameters; the only text sent as it is, is the schema's own DDL.
 *-------------------------------------------------------------------------
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "odbc_store.h"
#include "qbd_migrate.h"

#define QBD_MSSQL_LOCK	"queuebox.migrate"

/* one value of the first row */
typedef struct QbdmFirst
{
	char	   *v[2];
	int			rows;
} QbdmFirst;

static int
qbdm_first(void *arg, int set, int ncols, char **values)
{
	QbdmFirst  *f = arg;

	if (set == 0 && f->rows++ == 0)
		for (int i = 0; i < ncols && i < 2; i++)
		{
			f->v[i] = values[i];
			values[i] = NULL;
		}
	return 0;
}

static void
qbdm_first_free(QbdmFirst *f)
{
	free(f->v[0]);
	free(f->v[1]);
	memset(f, 0, sizeof(*f));
}

/*
 * qb_mssql_batches: call fn for each batch of script (the text between
 * lines holding only GO, blank batches skipped).  Returns fn's first
 * non-zero answer, or 0.  Public for the unit tests.
 */
int
qb_mssql_batches(const char *script, int (*fn) (void *arg, const char *batch), void *arg)
{
	const char *p = script;
	size_t		cap = strlen(script) + 1;
	char	   *buf = malloc(cap);
	size_t		len = 0;
	int			rc = 0;

	if (buf == NULL)
		return -1;
	while (rc == 0)
	{
		const char *eol = strchr(p, '\n');
		size_t		n = eol ? (size_t) (eol - p) : strlen(p);
		const char *t = p;
		size_t		tn = n;

		/* the separator: GO alone on its line, spaces and a CR around it */
		while (tn > 0 && (*t == ' ' || *t == '\t'))
			t++, tn--;
		while (tn > 0 && (t[tn - 1] == ' ' || t[tn - 1] == '\t' || t[tn - 1] == '\r'))
			tn--;
		if ((tn == 2 && strncasecmp(t, "GO", 2) == 0) || eol == NULL)
		{
			if (eol == NULL && !(tn == 2 && strncasecmp(t, "GO", 2) == 0))
			{
				memcpy(buf + len, p, n);
				len += n;
			}
			buf[len] = '\0';
			if (strspn(buf, " \t\r\n") < len)
				rc = fn(arg, buf);
			len = 0;
		}
		else
		{
			memcpy(buf + len, p, n);
			len += n;
			buf[len++] = '\n';
		}
		if (eol == NULL)
			break;
		p = eol + 1;
	}
	free(buf);
	return rc;
}

/* ---- the migration's steps (qbd_migrate.h), on a QbOdbcConn ------------ */

static int
qbdm_begin(void *conn, char *err, size_t errlen)
{
	return qb_odbc_begin(conn, err, errlen);
}

static int
qbdm_lock(void *conn, char *err, size_t errlen)
{
	QbdmFirst	f = {0};
	QbOdbcClass cls;
	int			rc = 0;

	if (qb_odbc_exec(conn,
					 "DECLARE @r INT; EXEC @r = sp_getapplock @Resource = N'" QBD_MSSQL_LOCK "',"
					 " @LockMode = N'Exclusive', @LockOwner = N'Transaction', @LockTimeout = 60000;"
					 " SELECT @r", NULL, 0, 0, qbdm_first, &f, &cls, err, errlen) != 0)
		rc = -1;
	else if (f.v[0] == NULL || atoi(f.v[0]) < 0)
	{
		snprintf(err, errlen,
				 "could not take the migration lock (sp_getapplock answered %s): another queuebox-mssqld held it for 60 s; "
				 "nothing was changed: once its migration ends (or it is stopped), try again",
				 f.v[0] ? f.v[0] : "nothing");
		rc = -1;
	}
	qbdm_first_free(&f);
	return rc;
}

/* schema queuebox: the daemon's (1), none (0), another's (-1) */
static int
qbdm_inspect(void *conn, char *err, size_t errlen)
{
	QbdmFirst	f = {0};
	QbOdbcClass cls;
	bool		no_version_table;
	bool		has_schema;

	if (qb_odbc_exec(conn,
					 "SELECT CASE WHEN OBJECT_ID(N'queuebox.schema_version') IS NULL THEN 0 ELSE 1 END,"
					 "       CASE WHEN SCHEMA_ID(N'queuebox') IS NULL THEN 0 ELSE 1 END",
					 NULL, 0, 0, qbdm_first, &f, &cls, err, errlen) != 0)
	{
		qbdm_first_free(&f);
		return -1;
	}
	no_version_table = f.v[0] != NULL && strcmp(f.v[0], "0") == 0;
	has_schema = f.v[1] != NULL && strcmp(f.v[1], "1") == 0;
	qbdm_first_free(&f);
	if (no_version_table && has_schema)
	{
		snprintf(err, errlen,
				 "schema queuebox exists but queuebox-mssqld did not make it (no queuebox.schema_version): "
				 "move its tables elsewhere and drop the schema, or point database.url at another database");
		return -1;
	}
	return no_version_table ? 0 : 1;
}

static int
qbdm_read_version(void *conn, char *have, size_t havelen, char *err, size_t errlen)
{
	QbdmFirst	f = {0};
	QbOdbcClass cls;
	int			rc = qb_odbc_exec(conn,
								  "SELECT TOP (1) version FROM queuebox.schema_version ORDER BY applied_at DESC, version DESC",
								  NULL, 0, 0, qbdm_first, &f, &cls, err, errlen);

	if (rc == 0)
		snprintf(have, havelen, "%s", f.v[0] ? f.v[0] : "");
	qbdm_first_free(&f);
	return rc != 0 ? -1 : 0;
}

typedef struct QbdmBatches
{
	QbOdbcConn *conn;
	char	   *err;
	size_t		errlen;
} QbdmBatches;

static int
qbdm_batch(void *arg, const char *batch)
{
	QbdmBatches *a = arg;
	QbOdbcClass cls;

	return qb_odbc_exec(a->conn, batch, NULL, 0, 0, NULL, NULL, &cls, a->err, a->errlen);
}

/* one script's batches, in order; err "what: why" */
static int
qbdm_run_script(void *conn, const char *script, const char *what, char *err, size_t errlen)
{
	QbdmBatches a = {.conn = conn, .err = err, .errlen = errlen};
	char		why[QB_ERRLEN];

	if (qb_mssql_batches(script, qbdm_batch, &a) == 0)
		return 0;
	snprintf(why, sizeof(why), "%s", err);
	snprintf(err, errlen, "%s: %s", what, why);
	return -1;
}

static int
qbdm_record_version(void *conn, const char *version, char *err, size_t errlen)
{
	QbOdbcParam v = {.type = QB_ODBC_T_TEXT, .text = version};
	QbOdbcClass cls;

	return qb_odbc_exec(conn, "INSERT INTO queuebox.schema_version (version) VALUES (?)", &v, 1, 0,
						NULL, NULL, &cls, err, errlen) != 0 ? -1 : 0;
}

static int
qbdm_commit(void *conn, char *err, size_t errlen)
{
	return qb_odbc_end(conn, true, err, errlen);
}

static void
qbdm_rollback(void *conn)
{
	char		buf[QB_ERRLEN];

	if (!qb_odbc_lost(conn))
		(void) qb_odbc_end(conn, false, buf, sizeof(buf));
}

static const QbdMigrateOps qbdm_ops = {
	.name = "sqlserver",
	.where = " on SQL Server",
	.schema = qbd_schema_mssql,
	.upgrades = qbd_upgrades_mssql,
	.begin = qbdm_begin,
	.lock = qbdm_lock,
	.inspect = qbdm_inspect,
	.read_version = qbdm_read_version,
	.run_script = qbdm_run_script,
	.record_version = qbdm_record_version,
	.commit = qbdm_commit,
	.rollback = qbdm_rollback,
};

/* qb_mssql_migrate: see odbc_store.h. */
int
qb_mssql_migrate(QbOdbcConn *c, char *done, size_t donelen, char *err, size_t errlen)
{
	return qbd_migrate(&qbdm_ops, c, done, donelen, err, errlen);
}

/* qb_mssql_publish_config: see odbc_store.h.  The routes and destinations replace the stored ones. */
int
qb_mssql_publish_config(QbOdbcConn *c, const QbConfig *cfg, char *err, size_t errlen)
{
	QbOdbcClass cls;
	char		buf[QB_ERRLEN];

	if (qb_odbc_begin(c, err, errlen) != 0)
		return -1;
	if (qb_odbc_exec(c, "DELETE FROM queuebox.config_route; DELETE FROM queuebox.config_destination",
					 NULL, 0, 0, NULL, NULL, &cls, err, errlen) != 0)
		goto fail;
	for (int i = 0; i < cfg->nroutes; i++)
	{
		/*
		 * destination: what route_of() shows (every destination of a
		 * fan-out route, joined by ", "); fanout: the outbox_fanout trigger
		 * marks the route's rows at insert
		 */
		QbOdbcParam p[4] = {
			{.type = QB_ODBC_T_INT, .num = i + 1},
			{.type = QB_ODBC_T_TEXT, .text = cfg->routes[i].topic_pattern},
			{.type = QB_ODBC_T_TEXT, .text = cfg->routes[i].dest_list},
			{.type = QB_ODBC_T_INT, .num = cfg->routes[i].ndests > 1},
		};

		if (qb_odbc_exec(c, "INSERT INTO queuebox.config_route (position, pattern, destination, fanout)"
						 " VALUES (?, ?, ?, CASE WHEN ? = 1 THEN 1 ELSE 0 END)",
						 p, 4, 0, NULL, NULL, &cls, err, errlen) != 0)
			goto fail;
	}
	for (int i = 0; i < cfg->ndestinations; i++)
	{
		QbOdbcParam p[1] = {{.type = QB_ODBC_T_TEXT, .text = cfg->destinations[i].name}};

		if (qb_odbc_exec(c, "INSERT INTO queuebox.config_destination (name) VALUES (?)",
						 p, 1, 0, NULL, NULL, &cls, err, errlen) != 0)
			goto fail;
	}
	if (qb_odbc_end(c, true, err, errlen) != 0)
		goto fail;
	return 0;
fail:
	if (!qb_odbc_lost(c))
		(void) qb_odbc_end(c, false, buf, sizeof(buf));
	return -1;
}
