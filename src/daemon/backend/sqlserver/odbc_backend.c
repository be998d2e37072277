/*-------------------------------------------------------------------------
 * odbc_backend.c
 *	  The daemon's ops for SQL Server (qbd_backend.h): the ODBC store and
 *	  the migrations of odbc_migrate.c.
 *
 * SQL Server has no notification at commit: database.listen is refused
 * when the file is read, the store has nothing to LISTEN on, and the roles
 * poll, stretching idle polls up to database.idlePollMaxMs.
 *-------------------------------------------------------------------------
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "odbc_store.h"

/* qbob_check_config: what the driver cannot read is refused now, not at each connect. */
static int
qbob_check_config(const QbConfig *cfg, char *err, size_t errlen)
{
	QbOdbcUrl	parsed;
	const char *driver;
	char	   *cs;

	if (qb_odbc_url_parse(cfg->database.url, &parsed, err, errlen) != 0)
		return -1;
	driver = parsed.driver ? parsed.driver : qb_odbc_default_driver();
	cs = qb_odbc_conn_string(&parsed, driver, NULL, qb_odbc_braces_for(driver), err, errlen);
	qb_odbc_url_free(&parsed);
	if (cs == NULL)
		return -1;
	memset(cs, 0, strlen(cs));
	free(cs);
	if (cfg->database.listen)
	{
		snprintf(err, errlen,
				 "database.listen: SQL Server has no notification at commit (LISTEN is PostgreSQL's); "
				 "remove the key: the daemon polls SQL Server, stretching idle polls up to database.idlePollMaxMs "
				 "(docs/sqlserver.md)");
		return -1;
	}
	return 0;
}

static void *
qbob_connect(const QbConfig *cfg, const char *application_name, char *err, size_t errlen)
{
	return qb_odbc_connect(cfg->database.url, application_name,
						   cfg->database.connect_timeout_ms, err, errlen);
}

static int
qbob_migrate(void *conn, char *done, size_t donelen, char *err, size_t errlen)
{
	return qb_mssql_migrate(conn, done, donelen, err, errlen);
}

static int
qbob_publish_config(void *conn, const QbConfig *cfg, char *err, size_t errlen)
{
	return qb_mssql_publish_config(conn, cfg, err, errlen);
}

static void
qbob_disconnect(void *conn)
{
	qb_odbc_close(conn);
}

/* qbob_probe_notify: no notification to check; the roles poll. */
static QbdProbe
qbob_probe_notify(const QbConfig *cfg, char *err, size_t errlen)
{
	return QBD_PROBE_NONE;
}

/* qbob_store_new: a role's ODBC store (no pooler question: nothing is prepared by name). */
static void *
qbob_store_new(const QbConfig *cfg, const char *application_name, bool pooled,
			   QbStore *store, char *err, size_t errlen)
{
	QbOdbcStore *odbc = qb_odbc_store_new(&(QbOdbcConf) {
		.url = cfg->database.url,
		.application_name = application_name,
		.connect_timeout_ms = cfg->database.connect_timeout_ms,
		.statement_timeout_ms = cfg->database.statement_timeout_ms,
	}, err, errlen);

	if (odbc != NULL)
		qb_odbc_store_ops(odbc, store);
	return odbc;
}

static int
qbob_store_connect(void *db, char *err, size_t errlen)
{
	return qb_odbc_store_connect(db, err, errlen);
}

static void
qbob_store_set_config(void *db, const QbConfig *cfg)
{
	qb_odbc_store_set_config(db, cfg);
}

/* qbob_store_listen: nothing to LISTEN on; the role polls. */
static int
qbob_store_listen(void *db, const char *channel, char *err, size_t errlen)
{
	return 0;
}

static int
qbob_store_socket(void *db)
{
	return -1;
}

static int
qbob_store_notified(void *db)
{
	return 0;
}

static void
qbob_store_free(void *db)
{
	qb_odbc_store_free(db);
}

const QbdBackend qbd_backend_sqlserver = {
	.name = "sqlserver",
	.check_config = qbob_check_config,
	.connect = qbob_connect,
	.migrate = qbob_migrate,
	.publish_config = qbob_publish_config,
	.disconnect = qbob_disconnect,
	.probe_notify = qbob_probe_notify,
	.store_new = qbob_store_new,
	.store_connect = qbob_store_connect,
	.store_set_config = qbob_store_set_config,
	.store_listen = qbob_store_listen,
	.store_socket = qbob_store_socket,
	.store_notified = qbob_store_notified,
	.store_free = qbob_store_free,
};
