/*-------------------------------------------------------------------------
 * pq_migrate.c
 *	  The daemon's PostgreSQL schema: installed, checked and upgraded
 *	  without the extension, and the configuration's routes written where
 *	  the SQL functions read them.
 *
 * Wording:
 *	- The schema text (qbd_schema_pg, made by the Makefile from sql/daemon/
 *	  and sql/schema/: the extension's tables, indexes and SQL functions)
 *	  creates schema queuebox at this build's qbd_schema_version.
 *	- A migration takes the schema from one version to the next:
 *	  qbd_upgrades_pg[], in order, one per sql/schema/upgrade/<from>--<to>.sql.
 *	  Versions the daemon applied are rows of queuebox.schema_version.
 *	- The migration lock is a transaction advisory lock (QBD_MIGRATE_LOCK):
 *	  two daemons starting together take turns.
 *
 * Transaction rules: qb_pq_migrate is the walk of ../qbd_migrate.c with this
 * file's steps (BEGIN, the lock, the checks, the DDL, COMMIT): one
 * transaction, rolled back on any error; PostgreSQL's DDL is transactional,
 * so a half-made schema never stays behind.  qb_pq_publish_config is one
 * transaction too.  Values are bound
 * parameters; the only text sent as it is, is the schema's own DDL.
 *
 * Messages: each failure says what failed (the step, the server's words
 * and SQLSTATE) and what to do (qbpm_pg_advice, by SQLSTATE); only a schema
 * script of this binary that the server cannot parse blames the build.
 *-------------------------------------------------------------------------
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

#include "pq_store.h"
#include "qb_pg_array.h"
#include "qbd_migrate.h"

/* 'queuebox' as a number: the key of the migration lock (docs/daemon.md) */
#define QBD_MIGRATE_LOCK	"7087869466226663544"

/* What a failed statement was doing: the advice differs (qbpm_pg_advice) */
typedef enum QbdStmt
{
	QBD_STMT_MIGRATE,			/* the migration's own statements: lock, checks */
	QBD_STMT_SCRIPT,			/* a schema script built into this binary */
	QBD_STMT_PUBLISH			/* the config tables, the notify triggers */
} QbdStmt;

/*
 * qbpm_pg_advice: what to do about a failed statement, from its SQLSTATE
 * (the server's words come in its language, so they are repeated, never
 * matched).  Only a syntax error in a script built into this binary is
 * this build's fault.  Every failure leaves the database as it was: each
 * caller's work is one transaction, rolled back.
 */
static void
qbpm_pg_advice(PGconn *conn, const char *state, QbdStmt stmt, char *buf, size_t len)
{
	const char *user = PQuser(conn);
	const char *db = PQdb(conn);

	if (state == NULL && PQstatus(conn) != CONNECTION_OK)
		snprintf(buf, len, "the connection was lost and nothing was changed; once the server is back, try again");
	else if (state == NULL)
		snprintf(buf, len, "nothing was changed");
	else if (strcmp(state, "42501") == 0 && stmt == QBD_STMT_PUBLISH)
		snprintf(buf, len, "nothing was changed; role %s may not write the tables of schema queuebox, which "
				 "another role made: run the daemon as the schema's owner, or make role %s a member of it "
				 "(GRANT owner TO %s)", user, user, user);
	else if (strcmp(state, "42501") == 0)
		snprintf(buf, len, "nothing was changed; role %s may not make or change schema queuebox in database %s: "
				 "GRANT CREATE ON DATABASE %s TO %s, or make the schema for it (CREATE SCHEMA queuebox "
				 "AUTHORIZATION %s), as docs/daemon.md step 1 says; a schema another role made, that role migrates",
				 user, db, db, user, user);
	else if (strcmp(state, "25006") == 0)
		snprintf(buf, len, "nothing was changed; database.url reaches a read-only server (a standby): point it at "
				 "the primary, or list every host with ?target_session_attrs=read-write");
	else if (strcmp(state, "57014") == 0 || strcmp(state, "55P03") == 0)
		snprintf(buf, len, "nothing was changed; a statement_timeout or lock_timeout of the server, database %s "
				 "or role %s (or an administrator) cancelled it: try again, or raise that setting for role %s",
				 db, user, user);
	else if (strncmp(state, "40", 2) == 0)
		snprintf(buf, len, "nothing was changed; a concurrent transaction got in the way: try again");
	else if (strncmp(state, "53", 2) == 0)
		snprintf(buf, len, "nothing was changed; the server is short of disk, memory or connections: "
				 "free some, then try again");
	else if (stmt == QBD_STMT_SCRIPT && (strcmp(state, "42601") == 0 || strcmp(state, "0A000") == 0))
		snprintf(buf, len, "nothing was changed; the schema built into this queuebox-mssqld does not run on "
				 "PostgreSQL %d: this build is broken, or the server is older than QueueBox supports; "
				 "report it with this message", PQserverVersion(conn) / 10000);
	else
		snprintf(buf, len, "nothing was changed; the server's message says what stopped it");
}

/*
 * qbpm_pg_error: "what: the server's message (SQLSTATE); its hint; what to
 * do" on one line; libpq's own text when the server said nothing.
 */
static void
qbpm_pg_error(PGconn *conn, const PGresult *res, const char *what, QbdStmt stmt, char *err, size_t errlen)
{
	const char *primary = res ? PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY) : NULL;
	const char *hint = res ? PQresultErrorField(res, PG_DIAG_MESSAGE_HINT) : NULL;
	const char *state = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;
	char		advice[400];

	qbpm_pg_advice(conn, state, stmt, advice, sizeof(advice));
	if (primary != NULL)
		snprintf(err, errlen, "%s: %s (SQLSTATE %s)%s%s; %s", what, primary, state ? state : "?",
				 hint ? "; " : "", hint ? hint : "", advice);
	else
	{
		char		why[QB_ERRLEN];

		/* libpq's messages end with a newline: one line per event */
		snprintf(why, sizeof(why), "%s", res ? PQresultErrorMessage(res) : PQerrorMessage(conn));
		why[strcspn(why, "\n")] = '\0';
		snprintf(err, errlen, "%s: %s; %s", what, why, advice);
	}
	for (char *p = err; *p; p++)
		if (*p == '\n')
			*p = ' ';
}

/* qbpm_exec: one statement with text parameters; the result, or NULL with err. */
static PGresult *
qbpm_exec(PGconn *conn, const char *sql, int nparams, const char *const *params,
		 ExecStatusType want, QbdStmt stmt, const char *what, char *err, size_t errlen)
{
	PGresult   *res = PQexecParams(conn, sql, nparams, NULL, params, NULL, NULL, 0);

	if (PQresultStatus(res) == want)
		return res;
	qbpm_pg_error(conn, res, what, stmt, err, errlen);
	PQclear(res);
	return NULL;
}

static bool
qbpm_ok(PGconn *conn, const char *sql, int nparams, const char *const *params,
	   QbdStmt stmt, const char *what, char *err, size_t errlen)
{
	PGresult   *res = qbpm_exec(conn, sql, nparams, params, PGRES_COMMAND_OK, stmt, what, err, errlen);

	PQclear(res);
	return res != NULL;
}

/* ---- the migration's steps (qbd_migrate.h), on a PGconn ---------------- */

static int
qbpm_pg_begin(void *conn, char *err, size_t errlen)
{
	return qbpm_ok(conn, "BEGIN", 0, NULL, QBD_STMT_MIGRATE, "could not begin the migration", err, errlen) ? 0 : -1;
}

static int
qbpm_pg_lock(void *conn, char *err, size_t errlen)
{
	PGresult   *res = qbpm_exec(conn, "SELECT pg_advisory_xact_lock(" QBD_MIGRATE_LOCK ")", 0, NULL,
							   PGRES_TUPLES_OK, QBD_STMT_MIGRATE, "could not take the migration lock",
							   err, errlen);

	PQclear(res);
	return res != NULL ? 0 : -1;
}

/* the extension's workers would claim the same rows: one host per database */
static int
qbpm_pg_no_extension(PGconn *conn, char *err, size_t errlen)
{
	PGresult   *res = qbpm_exec(conn, "SELECT extversion FROM pg_extension WHERE extname = 'queuebox'",
							   0, NULL, PGRES_TUPLES_OK, QBD_STMT_MIGRATE, "could not look for the extension",
							   err, errlen);

	if (res == NULL)
		return -1;
	if (PQntuples(res) > 0)
	{
		snprintf(err, errlen,
				 "the queuebox extension (version %s) is installed in database %s, and its background workers serve it; "
				 "queuebox-mssqld refuses to serve the same tables. Use the daemon only where the extension cannot be loaded, "
				 "or point database.url at another database",
				 PQgetvalue(res, 0, 0), PQdb(conn));
		PQclear(res);
		return -1;
	}
	PQclear(res);
	return 0;
}

/* no extension, then schema queuebox: the daemon's (1), none (0), another's (-1) */
static int
qbpm_pg_inspect(void *conn, char *err, size_t errlen)
{
	PGresult   *res;
	bool		has_version_table;
	bool		has_outbox;

	if (qbpm_pg_no_extension(conn, err, errlen) != 0)
		return -1;
	if ((res = qbpm_exec(conn,
						"SELECT to_regclass('queuebox.schema_version') IS NOT NULL,"
						"       to_regclass('queuebox.outbox') IS NOT NULL",
						0, NULL, PGRES_TUPLES_OK, QBD_STMT_MIGRATE, "could not look at schema queuebox", err, errlen)) == NULL)
		return -1;
	has_version_table = strcmp(PQgetvalue(res, 0, 0), "t") == 0;
	has_outbox = strcmp(PQgetvalue(res, 0, 1), "t") == 0;
	PQclear(res);
	if (!has_version_table && has_outbox)
	{
		snprintf(err, errlen,
				 "schema queuebox holds an outbox table that queuebox-mssqld did not make (no queuebox.schema_version): "
				 "left by a dropped extension or made by hand. Move its rows elsewhere and drop the schema, "
				 "or point database.url at another database");
		return -1;
	}
	return has_version_table ? 1 : 0;
}

static int
qbpm_pg_read_version(void *conn, char *have, size_t havelen, char *err, size_t errlen)
{
	PGresult   *res = qbpm_exec(conn,
							   "SELECT version FROM queuebox.schema_version ORDER BY applied_at DESC, version DESC LIMIT 1",
							   0, NULL, PGRES_TUPLES_OK, QBD_STMT_MIGRATE, "could not read the schema version",
							   err, errlen);

	if (res == NULL)
		return -1;
	if (PQntuples(res) == 1)
		snprintf(have, havelen, "%s", PQgetvalue(res, 0, 0));
	PQclear(res);
	return 0;
}

/* one of the schema's scripts: constant text built into the binary, one simple query */
static int
qbpm_pg_run_script(void *conn, const char *script, const char *what, char *err, size_t errlen)
{
	PGresult   *res = PQexec(conn, script);
	bool		ok = PQresultStatus(res) == PGRES_COMMAND_OK || PQresultStatus(res) == PGRES_TUPLES_OK;

	if (!ok)
		qbpm_pg_error(conn, res, what, QBD_STMT_SCRIPT, err, errlen);
	PQclear(res);
	return ok ? 0 : -1;
}

static int
qbpm_pg_record_version(void *conn, const char *version, char *err, size_t errlen)
{
	const char *params[1] = {version};

	return qbpm_ok(conn, "INSERT INTO queuebox.schema_version (version) VALUES ($1)", 1, params,
				  QBD_STMT_MIGRATE, "could not record the schema version", err, errlen) ? 0 : -1;
}

static int
qbpm_pg_commit(void *conn, char *err, size_t errlen)
{
	return qbpm_ok(conn, "COMMIT", 0, NULL, QBD_STMT_MIGRATE, "could not commit the migration", err, errlen) ? 0 : -1;
}

static void
qbpm_pg_rollback(void *conn)
{
	PQclear(PQexec(conn, "ROLLBACK"));
}

static const QbdMigrateOps qbd_pg_migrate_ops = {
	.name = "postgresql",
	.where = "",
	.schema = qbd_schema_pg,
	.upgrades = qbd_upgrades_pg,
	.begin = qbpm_pg_begin,
	.lock = qbpm_pg_lock,
	.inspect = qbpm_pg_inspect,
	.read_version = qbpm_pg_read_version,
	.run_script = qbpm_pg_run_script,
	.record_version = qbpm_pg_record_version,
	.commit = qbpm_pg_commit,
	.rollback = qbpm_pg_rollback,
};

/* qb_pq_migrate: see pq_store.h. */
int
qb_pq_migrate(PGconn *conn, char *done, size_t donelen, char *err, size_t errlen)
{
	return qbd_migrate(&qbd_pg_migrate_ops, conn, done, donelen, err, errlen);
}

/* the routes and destination names replace the stored ones (in the open transaction) */
static bool
qbpm_pg_write_routes(PGconn *conn, const char *a_pat, const char *a_dst, const char *a_fan,
					const char *a_names, char *err, size_t errlen)
{
	const char *p2[3] = {a_pat, a_dst, a_fan};
	const char *p1[1] = {a_names};

	return qbpm_ok(conn, "DELETE FROM queuebox.config_route", 0, NULL, QBD_STMT_PUBLISH,
				  "could not write the routes", err, errlen) &&
		qbpm_ok(conn,
			   "INSERT INTO queuebox.config_route (position, pattern, destination, fanout)"
			   " SELECT n, p, d, f FROM unnest($1::text[], $2::text[], $3::boolean[])"
			   "   WITH ORDINALITY AS u(p, d, f, n)",
			   3, p2, QBD_STMT_PUBLISH, "could not write the routes", err, errlen) &&
		qbpm_ok(conn, "DELETE FROM queuebox.config_destination", 0, NULL, QBD_STMT_PUBLISH,
			   "could not write the destinations", err, errlen) &&
		qbpm_ok(conn, "INSERT INTO queuebox.config_destination (name) SELECT unnest($1::text[])",
			   1, p1, QBD_STMT_PUBLISH, "could not write the destinations", err, errlen);
}

/* The triggers the configuration switches: their table, and the DDL each way. */
static const struct
{
	const char *name;
	const char *enable;
	const char *disable;
}			qbpm_switched[] = {
	{"outbox_notify", "ALTER TABLE queuebox.outbox ENABLE TRIGGER outbox_notify",
	"ALTER TABLE queuebox.outbox DISABLE TRIGGER outbox_notify"},
	{"inbox_notify", "ALTER TABLE queuebox.inbox ENABLE TRIGGER inbox_notify",
	"ALTER TABLE queuebox.inbox DISABLE TRIGGER inbox_notify"},
	{"outbox_fanout", "ALTER TABLE queuebox.outbox ENABLE TRIGGER outbox_fanout",
	"ALTER TABLE queuebox.outbox DISABLE TRIGGER outbox_fanout"},
};

/*
 * The notify triggers enabled as database.listen asks, and the fan-out
 * trigger while a route has several destinations, switching only those
 * that differ (in the open transaction): a reload that changes neither
 * takes no table lock.
 */
static bool
qbpm_pg_switch_triggers(PGconn *conn, bool listen, bool fanout, char *err, size_t errlen)
{
	const char *pl[2] = {listen ? "t" : "f", fanout ? "t" : "f"};
	PGresult   *res;
	bool		ok = true;

	if ((res = qbpm_exec(conn,
						"SELECT t.tgname, t.tgenabled = 'D' FROM pg_trigger t"
						" WHERE t.tgrelid IN ('queuebox.outbox'::regclass, 'queuebox.inbox'::regclass)"
						"   AND (t.tgname IN ('outbox_notify', 'inbox_notify')"
						"          AND (t.tgenabled <> 'D') <> $1::boolean"
						"        OR t.tgname = 'outbox_fanout' AND (t.tgenabled <> 'D') <> $2::boolean)"
						" ORDER BY 1",
						2, pl, PGRES_TUPLES_OK, QBD_STMT_PUBLISH, "could not read the switched triggers", err, errlen)) == NULL)
		return false;
	for (int i = 0; ok && i < PQntuples(res); i++)
	{
		/* constant text: the names are ours, and DDL takes no parameter */
		bool		off = strcmp(PQgetvalue(res, i, 1), "t") == 0;

		for (size_t j = 0; j < sizeof(qbpm_switched) / sizeof(qbpm_switched[0]); j++)
			if (strcmp(PQgetvalue(res, i, 0), qbpm_switched[j].name) == 0)
				ok = qbpm_ok(conn, off ? qbpm_switched[j].enable : qbpm_switched[j].disable, 0, NULL,
							 QBD_STMT_PUBLISH, "could not switch a trigger", err, errlen);
	}
	PQclear(res);
	return ok;
}

/*
 * qb_pq_publish_config: see pq_store.h.  The routes and destinations replace the
 * stored ones; the notify triggers are switched only when they differ, so
 * a reload that leaves database.listen alone takes no table lock.
 */
int
qb_pq_publish_config(PGconn *conn, const QbConfig *cfg, char *err, size_t errlen)
{
	QbPgArray	pat = {0};
	QbPgArray	dst = {0};
	QbPgArray	fan = {0};
	QbPgArray	names = {0};
	const char *a_pat;
	const char *a_dst;
	const char *a_fan;
	const char *a_names;
	bool		fanout = false;
	int			rc = -1;

	for (int i = 0; i < cfg->nroutes; i++)
	{
		qb_pg_array_add(&pat, cfg->routes[i].topic_pattern);
		qb_pg_array_add(&dst, cfg->routes[i].dest_list);	/* what route_of() shows */
		qb_pg_array_add_bool(&fan, cfg->routes[i].ndests > 1);
		fanout |= cfg->routes[i].ndests > 1;
	}
	for (int i = 0; i < cfg->ndestinations; i++)
		qb_pg_array_add(&names, cfg->destinations[i].name);
	a_pat = qb_pg_array_text(&pat);
	a_dst = qb_pg_array_text(&dst);
	a_fan = qb_pg_array_text(&fan);
	a_names = qb_pg_array_text(&names);
	if (a_pat == NULL || a_dst == NULL || a_fan == NULL || a_names == NULL)
		snprintf(err, errlen, "out of memory");
	else if (qbpm_ok(conn, "BEGIN", 0, NULL, QBD_STMT_PUBLISH, "could not begin writing the routes", err, errlen))
	{
		if (qbpm_pg_write_routes(conn, a_pat, a_dst, a_fan, a_names, err, errlen) &&
			qbpm_pg_switch_triggers(conn, cfg->database.listen, fanout, err, errlen) &&
			qbpm_ok(conn, "COMMIT", 0, NULL, QBD_STMT_PUBLISH, "could not commit the routes", err, errlen))
			rc = 0;
		else
			PQclear(PQexec(conn, "ROLLBACK"));
	}
	qb_pg_array_free(&pat);
	qb_pg_array_free(&dst);
	qb_pg_array_free(&fan);
	qb_pg_array_free(&names);
	return rc;
}
