/*-------------------------------------------------------------------------
 * odbc_store.h
 *	  The daemon's SQL Server backend: the ODBC store (the core's QbStore
 *	  over one ODBC connection, FreeTDS's driver under unixODBC), its
 *	  connection, its migrations (odbc_migrate.c), its ops table
 *	  (odbc_backend.c), and the pieces that need no server (the connection
 *	  string, the error classes, the JSON parameters) for the unit tests.
 *
 * Wording:
 *	- A procedure is one of sql/sqlserver/engine.sql's; an op is one
 *	  QbStore call: one transaction (BEGIN TRANSACTION ... COMMIT) holding
 *	  the procedure calls the op needs.  Arrays go to a procedure as one
 *	  JSON array in a bound NVARCHAR(MAX) parameter; every value is bound
 *	  (SQLBindParameter), never spliced into SQL text.
 *	- An error's class (QbOdbcClass) comes from its SQLSTATE and native
 *	  error number, and says what the store does: run the op again, fail
 *	  it, or reconnect (odbc_store.c).
 *
 * One store is one connection, used by one engine thread.
 *-------------------------------------------------------------------------
 */
#ifndef ODBC_STORE_H
#define ODBC_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "qb_config.h"
#include "qb_store.h"
#include "qbd_backend.h"

/* ---- the connection string --------------------------------------------- */

/*
 * What a sqlserver:// URL says: sqlserver://user:password@host[:port]/database
 * [?encrypt=true|false|request&odbcDriver=...].  User and password are
 * percent-decoded.  encrypt: true (the default) requires TLS, request
 * uses it when the server offers it, false never.
 */
typedef struct QbOdbcUrl
{
	char	   *user;
	char	   *password;
	char	   *host;
	int			port;			/* 1433 when the URL has none */
	char	   *database;
	const char *encryption;		/* FreeTDS's word: "require", "request", "off" */
	char	   *driver;			/* odbcDriver, or NULL: the default */
} QbOdbcUrl;

/* parse url; -1 with err naming the part or the key that is wrong (no secret in it) */
extern int	qb_odbc_url_parse(const char *url, QbOdbcUrl *u, char *err, size_t errlen);
extern void qb_odbc_url_free(QbOdbcUrl *u);

/* How braced values are written: ODBC's rule, or FreeTDS 1.3's. */
typedef enum QbOdbcBraces
{
	QB_ODBC_BRACES_ODBC,		/* { ... } with each } doubled */
	QB_ODBC_BRACES_FREETDS13,	/* { ... } as it is; "};" or a final } cannot be written */
} QbOdbcBraces;

/*
 * A connection string value: as it is when it holds none of ;{}= and no
 * space at either end (and !always), else in braces in style.  Returns the
 * length it needs (without NUL), or (size_t) -1 when style cannot write it;
 * writes at most outlen bytes with the NUL.
 */
extern size_t qb_odbc_quote(const char *value, QbOdbcBraces style, bool always,
							char *out, size_t outlen);

/*
 * The DSN-less connection string for u: DRIVER (u->driver, else
 * default_driver), SERVER, PORT, DATABASE, UID, PWD, TDS_Version=7.4,
 * ClientCharset=UTF-8, Encryption, APP (application_name).  malloc'd; it
 * holds the password: never log it.  NULL with err when out of memory or
 * when style cannot write a value (err names which, never its value).
 */
extern char *qb_odbc_conn_string(const QbOdbcUrl *u, const char *default_driver,
								 const char *application_name, QbOdbcBraces style,
								 char *err, size_t errlen);

/* "freetds vX.Y" of a driver library: 1 and the version, or 0 (not FreeTDS) */
extern int	qb_odbc_freetds_version(const char *path, int *major, int *minor);

/* the brace style a driver (a library path, or a {registered name}: ODBC's) reads */
extern QbOdbcBraces qb_odbc_braces_for(const char *driver);

/* The FreeTDS driver library where Debian and others put it, or "{FreeTDS}" (a registered name). */
extern const char *qb_odbc_default_driver(void);

/* ---- errors ------------------------------------------------------------ */

typedef enum QbOdbcClass
{
	QB_ODBC_FAILED,				/* anything else: the op fails, the connection stays */
	QB_ODBC_RETRY,				/* deadlock victim (1205), lock timeout (1222): run the op again */
	QB_ODBC_DUPLICATE,			/* a unique index (2601, 2627) */
	QB_ODBC_PULL_BUSY,			/* the pull claim's application lock (51000): temporary */
	QB_ODBC_BAD_INPUT,			/* the caller's value: 50022, conversions, CHECK, truncation */
	QB_ODBC_NOT_FOUND,			/* 50002: the row an operation names does not exist */
	QB_ODBC_TIMEOUT,			/* the statement ran out of time (HYT00) */
	QB_ODBC_LOST				/* the connection is gone (class 08, HYT01): reconnect */
} QbOdbcClass;

/* the class of one diagnostic record */
extern QbOdbcClass qb_odbc_classify(const char *sqlstate, long native);
/* what to do about a failed connect, from its diagnostic (NULL: nothing to add) */
extern const char *qb_odbc_connect_advice(const char *sqlstate, long native);

/* ---- the JSON parameters of sql/sqlserver/engine.sql --------------------- */
/*
 * Each returns malloc'd compact JSON text, or NULL when n is 0 or out of
 * memory (*oom); qb_odbc_json_inbox_rows also NULL without *oom when a
 * payload is not JSON text or the headers are not a JSON object.
 */
extern char *qb_odbc_json_tallies(const QbDestTally *t, int n, bool *oom);
extern char *qb_odbc_json_settles(const QbSettle *s, int n, bool *oom);
extern char *qb_odbc_json_claim(const QbClaimReq *c, bool *oom);
extern char *qb_odbc_json_inbox_rows(const QbInboxRow *rows, int n, bool *oom);
extern char *qb_odbc_json_names(const char *const *names, int n, bool *oom);
/* a limit take's destinations (engine.sql, _limits_take) */
extern char *qb_odbc_json_limits(const QbLimitTake *t, int n, bool *oom);
extern char *qb_odbc_json_topics(const int64_t *ids, const char *const *topics,
								 const bool *holds, int n, bool *oom);

/*
 * The inbox columns' lengths on SQL Server (sql/sqlserver/tables.sql, in
 * UTF-16 code units): a row whose source, idempotency key, event type or
 * aggregate id is longer cannot be stored.  -1 with err naming the first
 * such row, field and length, else 0.
 */
extern int	qb_odbc_check_lengths(const QbInboxRow *rows, int n, char *err, size_t errlen);

/* ---- parameters -------------------------------------------------------- */

typedef enum QbOdbcType
{
	QB_ODBC_T_TEXT,				/* NVARCHAR (NVARCHAR(MAX) past 4000 characters) */
	QB_ODBC_T_INT,				/* BIGINT */
	QB_ODBC_T_UUID				/* UNIQUEIDENTIFIER */
} QbOdbcType;

/* One bound parameter: text, or a number for QB_ODBC_T_INT. */
typedef struct QbOdbcParam
{
	QbOdbcType	type;
	const char *text;			/* NULL: SQL NULL (TEXT, UUID) */
	long long	num;
} QbOdbcParam;

/* How a parameter is bound: SQLBindParameter's C type, SQL type and column size. */
typedef struct QbOdbcBinding
{
	short		c_type;
	short		sql_type;
	unsigned long column_size;
} QbOdbcBinding;

extern QbOdbcBinding qb_odbc_binding(const QbOdbcParam *p);

/* ---- the statements ------------------------------------------------------ */

/* The T-SQL text of a QbQuery and the text parameters it takes (NULL: none). */
extern const char qb_odbc_replay_select[];	/* (id, state, source, since, until) -> id, source, event_type */
extern const char *qb_odbc_query_text(QbQuery q, int *nparams);

/* ---- the store ------------------------------------------------------------ */

typedef struct QbOdbcConf
{
	const char *url;			/* sqlserver://... */
	const char *application_name;
	long		connect_timeout_ms; /* SQL_ATTR_LOGIN_TIMEOUT, rounded up to seconds */
	long		statement_timeout_ms;	/* SQL_ATTR_QUERY_TIMEOUT per statement, rounded up; 0: none */
} QbOdbcConf;

typedef struct QbOdbcStore QbOdbcStore;

/* copies the strings; does not connect.  NULL with err when the URL is wrong or out of memory. */
extern QbOdbcStore *qb_odbc_store_new(const QbOdbcConf *conf, char *err, size_t errlen);
extern void qb_odbc_store_ops(QbOdbcStore *s, QbStore *store);
extern int	qb_odbc_store_connect(QbOdbcStore *s, char *err, size_t errlen);
extern void qb_odbc_store_set_config(QbOdbcStore *s, const QbConfig *cfg);
extern void qb_odbc_store_free(QbOdbcStore *s);

/* ---- one connection, for the store and for the migrations ---------------- */

typedef struct QbOdbcConn QbOdbcConn;

/* connect (XACT_ABORT ON); NULL with err (the server named as user@host:port/db) */
extern QbOdbcConn *qb_odbc_connect(const char *url, const char *application_name,
								   long connect_timeout_ms, char *err, size_t errlen);
extern void qb_odbc_close(QbOdbcConn *c);

/*
 * Run sql with params; then, for each result set in order, call row(arg,
 * set, ncols, values) for each row (values[i] NULL for SQL NULL; the text
 * of any type, UTF-8).  row returns 0 to go on.  Returns 0, or -1 with err
 * and *cls the class of the first error.  Outside a transaction (no
 * qb_odbc_begin) each statement of sql commits on its own.
 */
typedef int (*QbOdbcRow) (void *arg, int set, int ncols, char **values);
extern int	qb_odbc_exec(QbOdbcConn *c, const char *sql, const QbOdbcParam *params, int n,
						 long timeout_ms, QbOdbcRow row, void *arg, QbOdbcClass *cls,
						 char *err, size_t errlen);

/* BEGIN TRANSACTION; -1 with err */
extern int	qb_odbc_begin(QbOdbcConn *c, char *err, size_t errlen);

/*
 * COMMIT (true), or roll back whatever transaction is open (none is no
 * error); -1 with err, and the connection is then marked lost
 */
extern int	qb_odbc_end(QbOdbcConn *c, bool commit, char *err, size_t errlen);

/* the connection failed (class QB_ODBC_LOST): drop it */
extern bool qb_odbc_lost(const QbOdbcConn *c);

/* ---- odbc_migrate.c: the SQL Server schema (docs/sqlserver.md) ---------- */

/* the fresh schema and its upgrade steps (build/daemon/schema_mssql.c) */
extern const char qbd_schema_mssql[];
extern const QbdUpgrade qbd_upgrades_mssql[];

/* as qb_pq_migrate, under sp_getapplock; one transaction, committed or rolled back */
extern int	qb_mssql_migrate(QbOdbcConn *c, char *done, size_t donelen, char *err, size_t errlen);
/* as qb_pq_publish_config: the routes and destination names, one transaction */
extern int	qb_mssql_publish_config(QbOdbcConn *c, const QbConfig *cfg,
									char *err, size_t errlen);
/* split a T-SQL script on its GO lines; fn's first non-zero answer, or 0 */
extern int	qb_mssql_batches(const char *script, int (*fn) (void *arg, const char *batch), void *arg);

/* ---- odbc_backend.c: the daemon's ops for SQL Server -------------------- */
extern const QbdBackend qbd_backend_sqlserver;

#endif							/* ODBC_STORE_H */
