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
 * Transaction rules: qb_pq_migrate is one transaction (BEGIN, the lock, the
 * checks, the DDL, COMMIT), rolled back on any error; PostgreSQL's DDL is
 * transactional, so a half-made schema never stays behind.
 * qb_pq_publish_config is one transaction too.  Values are bound
 * parameters; the only text sent as it is, is the schema's own DDL.
 *
 * Messages: each failure says what failed (the step, the server's words
 * and SQLSTATE) and what to do (qbd_pg_advice, by SQLSTATE); only a schema
 * script of this binary that the server cannot parse blames the build.
 *-------------------------------------------------------------------------
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

#include "pq_store.h"
#include "qb_pg_array.h"

/* 'queuebox' as a number: the key of the migration lock (docs/daemon.md) */
#define QBD_MIGRATE_LOCK	"7087869466226663544"

/* What a failed statement was doing: the advice differs (qbd_pg_advice) */
typedef enum QbdStmt
{
	QBD_STMT_MIGRATE,			/* the migration's own statements: lock, checks */
	QBD_STMT_SCRIPT,			/* a schema script built into this binary */
	QBD_STMT_PUBLISH			/* the config tables, the notify triggers */
} QbdStmt;

/*
 * qbd_pg_advice: what to do about a failed statement, from its SQLSTATE
 * (the server's words come in its language, so they are repeated, never
 * matched).  Only a syntax error in a script built into this binary is
 * this build's fault.  Every failure leaves the database as it was: each
 * caller's work is one transaction, rolled back.
 */
static void
qbd_pg_advice(PGconn *conn, const char *state, QbdStmt stmt, char *buf, size_t len)
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
 * qbd_pg_error: "what: the server's message (SQLSTATE); its hint; what to
 * do" on one line; libpq's own text when the server said nothing.
 */
static void
qbd_pg_error(PGconn *conn, const PGresult *res, const char *what, QbdStmt stmt, char *err, size_t errlen)
{
	const char *primary = res ? PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY) : NULL;
	const char *hint = res ? PQresultErrorField(res, PG_DIAG_MESSAGE_HINT) : NULL;
	const char *state = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;
	char		advice[400];

	qbd_pg_advice(conn, state, stmt, advice, sizeof(advice));
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

/* qbd_exec: one statement with text parameters; the result, or NULL with err. */
static PGresult *
qbd_exec(PGconn *conn, const char *sql, int nparams, const char *const *params,
		 ExecStatusType want, QbdStmt stmt, const char *what, char *err, size_t errlen)
{
	PGresult   *res = PQexecParams(conn, sql, nparams, NULL, params, NULL, NULL, 0);

	if (PQresultStatus(res) == want)
		return res;
	qbd_pg_error(conn, res, what, stmt, err, errlen);
	PQclear(res);
	return NULL;
}

static bool
qbd_ok(PGconn *conn, const char *sql, int nparams, const char *const *params,
	   QbdStmt stmt, const char *what, char *err, size_t errlen)
{
	PGresult   *res = qbd_exec(conn, sql, nparams, params, PGRES_COMMAND_OK, stmt, what, err, errlen);

	PQclear(res);
	return res != NULL;
}

/*
 * qbd_apply: run one of the schema's scripts (constant text built into the
 * binary, one simple query) in the open transaction, then record the
 * version it brings.  false with err on failure.
 */
static bool
qbd_apply(PGconn *conn, const char *script, const char *version, const char *what,
		  char *err, size_t errlen)
{
	PGresult   *res = PQexec(conn, script);
	const char *params[1] = {version};
	bool		ok = PQresultStatus(res) == PGRES_COMMAND_OK || PQresultStatus(res) == PGRES_TUPLES_OK;

	if (!ok)
		qbd_pg_error(conn, res, what, QBD_STMT_SCRIPT, err, errlen);
	PQclear(res);
	return ok && qbd_ok(conn, "INSERT INTO queuebox.schema_version (version) VALUES ($1)", 1, params,
						QBD_STMT_MIGRATE, "could not record the schema version", err, errlen);
}

/* qbd_version_index: where a version stands among the known ones, or -1. */
static int
qbd_version_index(const char *v)
{
	int			i = 0;

	for (const QbdUpgrade *u = qbd_upgrades_pg; u->from != NULL; u++, i++)
		if (strcmp(u->from, v) == 0)
			return i;
	/* the current version comes after every step */
	return strcmp(v, qbd_schema_version) == 0 ? i : -1;
}

/* qb_pq_migrate: see pq_store.h. */
int
qb_pq_migrate(PGconn *conn, char *done, size_t donelen, char *err, size_t errlen)
{
	PGresult   *res = NULL;
	char		have[64] = "";
	bool		has_version_table;
	bool		has_outbox;
	bool		installed = false;
	int			at;

	done[0] = '\0';
	if (!qbd_ok(conn, "BEGIN", 0, NULL, QBD_STMT_MIGRATE, "could not begin the migration", err, errlen))
		return -1;
	if ((res = qbd_exec(conn, "SELECT pg_advisory_xact_lock(" QBD_MIGRATE_LOCK ")", 0, NULL,
						PGRES_TUPLES_OK, QBD_STMT_MIGRATE, "could not take the migration lock", err, errlen)) == NULL)
		goto fail;
	PQclear(res);

	/* the extension's workers would claim the same rows: one host per database */
	if ((res = qbd_exec(conn, "SELECT extversion FROM pg_extension WHERE extname = 'queuebox'",
						0, NULL, PGRES_TUPLES_OK, QBD_STMT_MIGRATE, "could not look for the extension", err, errlen)) == NULL)
		goto fail;
	if (PQntuples(res) > 0)
	{
		snprintf(err, errlen,
				 "the queuebox extension (version %s) is installed in database %s, and its background workers serve it; "
				 "queuebox-mssqld refuses to serve the same tables. Use the daemon only where the extension cannot be loaded, "
				 "or point database.url at another database",
				 PQgetvalue(res, 0, 0), PQdb(conn));
		goto fail;
	}
	PQclear(res);

	if ((res = qbd_exec(conn,
						"SELECT to_regclass('queuebox.schema_version') IS NOT NULL,"
						"       to_regclass('queuebox.outbox') IS NOT NULL",
						0, NULL, PGRES_TUPLES_OK, QBD_STMT_MIGRATE, "could not look at schema queuebox", err, errlen)) == NULL)
		goto fail;
	has_version_table = strcmp(PQgetvalue(res, 0, 0), "t") == 0;
	has_outbox = strcmp(PQgetvalue(res, 0, 1), "t") == 0;
	PQclear(res);
	res = NULL;

	if (!has_version_table && has_outbox)
	{
		snprintf(err, errlen,
				 "schema queuebox holds an outbox table that queuebox-mssqld did not make (no queuebox.schema_version): "
				 "left by a dropped extension or made by hand. Move its rows elsewhere and drop the schema, "
				 "or point database.url at another database");
		goto fail;
	}
	if (!has_version_table)
	{
		if (!qbd_apply(conn, qbd_schema_pg, qbd_schema_version, "could not create the QueueBox schema",
					   err, errlen))
			goto fail;
		installed = true;
	}
	else
	{
		if ((res = qbd_exec(conn,
							"SELECT version FROM queuebox.schema_version ORDER BY applied_at DESC, version DESC LIMIT 1",
							0, NULL, PGRES_TUPLES_OK, QBD_STMT_MIGRATE, "could not read the schema version", err, errlen)) == NULL)
			goto fail;
		if (PQntuples(res) == 1)
			snprintf(have, sizeof(have), "%s", PQgetvalue(res, 0, 0));
		PQclear(res);
		res = NULL;
		if ((at = qbd_version_index(have)) < 0)
		{
			snprintf(err, errlen,
					 "the QueueBox schema here is at version %s, which this queuebox-mssqld (schema %s) does not know: "
					 "a newer daemon migrated it. Run that version of queuebox-mssqld (or newer) against this database",
					 have[0] ? have : "(none recorded)", qbd_schema_version);
			goto fail;
		}
		for (const QbdUpgrade *u = &qbd_upgrades_pg[at]; u->from != NULL; u++)
		{
			char		what[128];

			snprintf(what, sizeof(what), "could not migrate the schema from %s to %s", u->from, u->to);
			if (!qbd_apply(conn, u->sql, u->to, what, err, errlen))
				goto fail;
		}
	}
	if (!qbd_ok(conn, "COMMIT", 0, NULL, QBD_STMT_MIGRATE, "could not commit the migration", err, errlen))
		goto fail;
	/* said after the commit: a step rolled back was never applied */
	if (installed)
		snprintf(done, donelen, "created the QueueBox schema (version %s)", qbd_schema_version);
	else if (have[0] != '\0' && strcmp(have, qbd_schema_version) != 0)
		snprintf(done, donelen, "upgraded the QueueBox schema from %s to %s", have, qbd_schema_version);
	return 0;

fail:
	PQclear(res);
	PQclear(PQexec(conn, "ROLLBACK"));
	return -1;
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
	QbPgArray	names = {0};
	const char *a_pat;
	const char *a_dst;
	const char *a_names;
	PGresult   *res = NULL;
	int			rc = -1;

	for (int i = 0; i < cfg->nroutes; i++)
	{
		qb_pg_array_add(&pat, cfg->routes[i].topic_pattern);
		qb_pg_array_add(&dst, cfg->routes[i].destination);
	}
	for (int i = 0; i < cfg->ndestinations; i++)
		qb_pg_array_add(&names, cfg->destinations[i].name);
	a_pat = qb_pg_array_text(&pat);
	a_dst = qb_pg_array_text(&dst);
	a_names = qb_pg_array_text(&names);
	if (a_pat == NULL || a_dst == NULL || a_names == NULL)
	{
		snprintf(err, errlen, "out of memory");
		goto done;
	}
	if (!qbd_ok(conn, "BEGIN", 0, NULL, QBD_STMT_PUBLISH, "could not begin writing the routes", err, errlen))
		goto done;
	{
		const char *p2[2] = {a_pat, a_dst};
		const char *p1[1] = {a_names};
		const char *pl[1] = {cfg->database.listen ? "t" : "f"};
		int			ntrig;

		if (!qbd_ok(conn, "DELETE FROM queuebox.config_route", 0, NULL, QBD_STMT_PUBLISH,
					"could not write the routes", err, errlen) ||
			!qbd_ok(conn,
					"INSERT INTO queuebox.config_route (position, pattern, destination)"
					" SELECT n, p, d FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS u(p, d, n)",
					2, p2, QBD_STMT_PUBLISH, "could not write the routes", err, errlen) ||
			!qbd_ok(conn, "DELETE FROM queuebox.config_destination", 0, NULL, QBD_STMT_PUBLISH,
					"could not write the destinations", err, errlen) ||
			!qbd_ok(conn, "INSERT INTO queuebox.config_destination (name) SELECT unnest($1::text[])",
					1, p1, QBD_STMT_PUBLISH, "could not write the destinations", err, errlen))
			goto rollback;
		/* the triggers whose enabled state is not what database.listen asks */
		if ((res = qbd_exec(conn,
							"SELECT t.tgname FROM pg_trigger t"
							" WHERE t.tgrelid IN ('queuebox.outbox'::regclass, 'queuebox.inbox'::regclass)"
							"   AND t.tgname IN ('outbox_notify', 'inbox_notify')"
							"   AND (t.tgenabled <> 'D') <> $1::boolean ORDER BY 1",
							1, pl, PGRES_TUPLES_OK, QBD_STMT_PUBLISH, "could not read the notify triggers", err, errlen)) == NULL)
			goto rollback;
		ntrig = PQntuples(res);
		for (int i = 0; i < ntrig; i++)
		{
			/* constant text: the two names are ours, and DDL takes no parameter */
			bool		outbox = strcmp(PQgetvalue(res, i, 0), "outbox_notify") == 0;
			const char *sql = cfg->database.listen ?
				(outbox ? "ALTER TABLE queuebox.outbox ENABLE TRIGGER outbox_notify" :
				 "ALTER TABLE queuebox.inbox ENABLE TRIGGER inbox_notify") :
				(outbox ? "ALTER TABLE queuebox.outbox DISABLE TRIGGER outbox_notify" :
				 "ALTER TABLE queuebox.inbox DISABLE TRIGGER inbox_notify");

			if (!qbd_ok(conn, sql, 0, NULL, QBD_STMT_PUBLISH, "could not switch a notify trigger", err, errlen))
				goto rollback;
		}
		PQclear(res);
		res = NULL;
	}
	if (!qbd_ok(conn, "COMMIT", 0, NULL, QBD_STMT_PUBLISH, "could not commit the routes", err, errlen))
		goto rollback;
	rc = 0;
	goto done;

rollback:
	PQclear(PQexec(conn, "ROLLBACK"));
done:
	PQclear(res);
	qb_pg_array_free(&pat);
	qb_pg_array_free(&dst);
	qb_pg_array_free(&names);
	return rc;
}
