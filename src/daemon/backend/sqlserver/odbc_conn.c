/*-------------------------------------------------------------------------
 * odbc_conn.c
 *	  One ODBC connection to SQL Server: connect, run a statement with bound
 *	  parameters and read every result set, end the transaction.  The ODBC
 *	  store and the SQL Server migrations both use it.
 *
 * Wording:
 *	- A connection is an environment and a connection handle, connected
 *	  with a DSN-less string (odbc_url.c), its session set to XACT_ABORT ON
 *	  (any error rolls the open transaction back) and NOCOUNT ON.
 *	- Transactions are T-SQL's own, sent as statements (BEGIN TRANSACTION,
 *	  COMMIT, a ROLLBACK guarded by @@TRANCOUNT), not ODBC's autocommit-off
 *	  mode, which loses track after a server-side abort (README.md).
 *	- A statement with parameters is prepared once per connection and its
 *	  handle kept (up to QBOC_CACHE texts); every value is bound
 *	  (qb_odbc_binding).  One without (BEGIN, COMMIT, DDL) is sent as it is.
 *	- Results: every result set is read to its end, each value as UTF-8
 *	  text; an error of a later statement of a batch fails the call.
 *	- Errors: the first diagnostic record names the failure and gives its
 *	  class (odbc_error.c); a QB_ODBC_LOST class marks the connection lost.
 *
 * Secrets: the connection string holds the password; it is built, used and
 * wiped here, never logged.  Messages name the server as user@host:port/db.
 *-------------------------------------------------------------------------
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sql.h>
#include <sqlext.h>

#include "odbc_store.h"

#define QBOC_CACHE	24

typedef struct QbocPrepared
{
	char	   *sql;
	SQLHSTMT	st;
} QbocPrepared;

struct QbOdbcConn
{
	SQLHENV		env;
	SQLHDBC		dbc;
	bool		lost;
	char		where[300];		/* user@host:port/db, for messages */
	QbocPrepared prepared[QBOC_CACHE];
	int			nprepared;
};

/* qboc_forget: drop a kept handle (its state is unknown after an error) */
static void
qboc_forget(QbOdbcConn *c, SQLHSTMT st)
{
	for (int i = 0; i < c->nprepared; i++)
		if (c->prepared[i].st == st)
		{
			free(c->prepared[i].sql);
			c->prepared[i] = c->prepared[--c->nprepared];
			break;
		}
	SQLFreeHandle(SQL_HANDLE_STMT, st);
}

/* qboc_kept: the kept handle of sql, or SQL_NULL_HSTMT */
static SQLHSTMT
qboc_kept(QbOdbcConn *c, const char *sql)
{
	for (int i = 0; i < c->nprepared; i++)
		if (strcmp(c->prepared[i].sql, sql) == 0)
			return c->prepared[i].st;
	return SQL_NULL_HSTMT;
}

/* qb_odbc_binding: see odbc_store.h. */
QbOdbcBinding
qb_odbc_binding(const QbOdbcParam *p)
{
	size_t		len = p->text ? strlen(p->text) : 0;

	switch (p->type)
	{
		case QB_ODBC_T_INT:
			return (QbOdbcBinding) {.c_type = SQL_C_SBIGINT, .sql_type = SQL_BIGINT, .column_size = 19};
		case QB_ODBC_T_UUID:
			return (QbOdbcBinding) {.c_type = SQL_C_CHAR, .sql_type = SQL_GUID, .column_size = 36};
		case QB_ODBC_T_TEXT:
			break;
	}
	/* UTF-8 in, NVARCHAR on the wire (ClientCharset=UTF-8); past 4000 characters NVARCHAR(MAX) */
	if (len > 4000)
		return (QbOdbcBinding) {.c_type = SQL_C_CHAR, .sql_type = SQL_WLONGVARCHAR, .column_size = len};
	return (QbOdbcBinding) {.c_type = SQL_C_CHAR, .sql_type = SQL_WVARCHAR,
	.column_size = len > 0 ? len : 1};
}

/*
 * qboc_diag: the first diagnostic record of handle into err ("what: message
 * (SQLSTATE s, error n)"), its class into *cls.
 */
static void
qboc_diag(QbOdbcConn *c, SQLSMALLINT type, SQLHANDLE handle, const char *what,
		  QbOdbcClass *cls, char *err, size_t errlen)
{
	SQLCHAR		state[6] = "";
	SQLCHAR		msg[1024] = "";
	SQLINTEGER	native = 0;
	SQLSMALLINT len = 0;
	QbOdbcClass k = QB_ODBC_FAILED;

	if (SQL_SUCCEEDED(SQLGetDiagRec(type, handle, 1, state, &native, msg, sizeof(msg), &len)))
	{
		/* "[FreeTDS][SQL Server]text": keep the text */
		const char *text = (const char *) msg;
		const char *b;

		while ((b = strstr(text, "]")) != NULL && text[0] == '[')
			text = b + 1;
		k = qb_odbc_classify((const char *) state, (long) native);
		snprintf(err, errlen, "%s: %s%s (SQLSTATE %s, error %ld)", what,
				 k == QB_ODBC_TIMEOUT ? "statement timeout: " : "", text, state, (long) native);
	}
	else
		snprintf(err, errlen, "%s: the driver gave no reason", what);
	for (char *p = err; *p; p++)
		if (*p == '\n' || *p == '\r')
			*p = ' ';
	if (k == QB_ODBC_LOST && c != NULL)
		c->lost = true;
	if (cls != NULL)
		*cls = k;
}

/* qb_odbc_connect: see odbc_store.h. */
QbOdbcConn *
qb_odbc_connect(const char *url, const char *application_name, long connect_timeout_ms,
				char *err, size_t errlen)
{
	QbOdbcUrl	u;
	QbOdbcConn *c;
	char	   *cs = NULL;
	char		what[400];
	SQLRETURN	rc;

	if (qb_odbc_url_parse(url, &u, err, errlen) != 0)
		return NULL;
	if ((c = calloc(1, sizeof(*c))) == NULL)
	{
		snprintf(err, errlen, "connecting to SQL Server: out of memory");
		goto fail;
	}
	{
		const char *driver = u.driver ? u.driver : qb_odbc_default_driver();

		if ((cs = qb_odbc_conn_string(&u, driver, application_name, qb_odbc_braces_for(driver),
									  err, errlen)) == NULL)
			goto fail;
	}
	snprintf(c->where, sizeof(c->where), "%s@%s:%d/%s", u.user, u.host, u.port, u.database);
	snprintf(what, sizeof(what), "connecting to %s", c->where);
	if (!SQL_SUCCEEDED(SQLAllocHandle(SQL_HANDLE_ENV, SQL_NULL_HANDLE, &c->env)) ||
		!SQL_SUCCEEDED(SQLSetEnvAttr(c->env, SQL_ATTR_ODBC_VERSION, (SQLPOINTER) SQL_OV_ODBC3, 0)) ||
		!SQL_SUCCEEDED(SQLAllocHandle(SQL_HANDLE_DBC, c->env, &c->dbc)))
	{
		snprintf(err, errlen, "%s: unixODBC could not make a connection handle", what);
		goto fail;
	}
	if (connect_timeout_ms > 0)
	{
		SQLULEN		secs = (SQLULEN) ((connect_timeout_ms + 999) / 1000);

		SQLSetConnectAttr(c->dbc, SQL_ATTR_LOGIN_TIMEOUT, (SQLPOINTER) secs, 0);
		SQLSetConnectAttr(c->dbc, SQL_ATTR_CONNECTION_TIMEOUT, (SQLPOINTER) secs, 0);
	}
	rc = SQLDriverConnect(c->dbc, NULL, (SQLCHAR *) cs, SQL_NTS, NULL, 0, NULL, SQL_DRIVER_NOPROMPT);
	/* the string holds the password: gone before anything else happens */
	memset(cs, 0, strlen(cs));
	if (!SQL_SUCCEEDED(rc))
	{
		SQLCHAR		state[6] = "";
		SQLINTEGER	native = 0;
		SQLSMALLINT len = 0;
		const char *advice;

		qboc_diag(c, SQL_HANDLE_DBC, c->dbc, what, NULL, err, errlen);
		if (!SQL_SUCCEEDED(SQLGetDiagRec(SQL_HANDLE_DBC, c->dbc, 1, state, &native, NULL, 0, &len)))
			state[0] = '\0';
		if (strstr(err, "Data source name not found") != NULL || strstr(err, "SQLSTATE IM002") != NULL)
			advice = "install the FreeTDS ODBC driver (Debian: apt-get install tdsodbc) or name its library with "
				"?odbcDriver=/path/libtdsodbc.so";
		else
			advice = qb_odbc_connect_advice((const char *) state, (long) native);
		if (advice != NULL)
			snprintf(err + strlen(err), errlen - strlen(err), "; %s", advice);
		SQLFreeHandle(SQL_HANDLE_DBC, c->dbc);
		c->dbc = SQL_NULL_HDBC;
		goto fail;
	}
	{
		QbOdbcClass cls;

		if (qb_odbc_exec(c, "SET XACT_ABORT ON; SET NOCOUNT ON", NULL, 0, 0, NULL, NULL, &cls,
						 err, errlen) != 0)
			goto fail;
	}
	free(cs);
	qb_odbc_url_free(&u);
	return c;

fail:
	free(cs);
	qb_odbc_url_free(&u);
	qb_odbc_close(c);
	return NULL;
}

void
qb_odbc_close(QbOdbcConn *c)
{
	if (c == NULL)
		return;
	for (int i = 0; i < c->nprepared; i++)
	{
		SQLFreeHandle(SQL_HANDLE_STMT, c->prepared[i].st);
		free(c->prepared[i].sql);
	}
	if (c->dbc != SQL_NULL_HDBC && c->dbc != NULL)
	{
		/* an open transaction ends with the session: rolled back */
		SQLDisconnect(c->dbc);
		SQLFreeHandle(SQL_HANDLE_DBC, c->dbc);
	}
	if (c->env != SQL_NULL_HENV && c->env != NULL)
		SQLFreeHandle(SQL_HANDLE_ENV, c->env);
	free(c);
}

bool
qb_odbc_lost(const QbOdbcConn *c)
{
	return c == NULL || c->lost;
}

/* qboc_value: column col of the current row as malloc'd text, NULL for SQL NULL. */
static int
qboc_value(SQLHSTMT st, SQLUSMALLINT col, char **out, bool *oom)
{
	size_t		cap = 256;
	size_t		len = 0;
	char	   *buf = malloc(cap);

	*out = NULL;
	if (buf == NULL)
	{
		*oom = true;
		return -1;
	}
	for (;;)
	{
		SQLLEN		ind = 0;
		SQLRETURN	rc = SQLGetData(st, col, SQL_C_CHAR, buf + len, (SQLLEN) (cap - len), &ind);

		if (rc == SQL_NO_DATA)
			break;
		if (!SQL_SUCCEEDED(rc))
		{
			free(buf);
			return -1;
		}
		if (ind == SQL_NULL_DATA)
		{
			free(buf);
			return 0;
		}
		{
			size_t		got = strlen(buf + len);

			/* SQL_SUCCESS_WITH_INFO with room to spare is not a truncation */
			if (rc == SQL_SUCCESS || len + got < cap - 1)
			{
				len += got;
				break;
			}
		}
		/* truncated (01004): the piece filled what was left, less its NUL */
		len = cap - 1;
		cap = ind != SQL_NO_TOTAL && (size_t) ind + len + 1 > cap * 2 ? (size_t) ind + len + 1 : cap * 2;
		{
			char	   *nb = realloc(buf, cap);

			if (nb == NULL)
			{
				free(buf);
				*oom = true;
				return -1;
			}
			buf = nb;
		}
	}
	buf[len] = '\0';
	*out = buf;
	return 0;
}

/*
 * One qb_odbc_exec call: its statement handle and what it allocated, freed
 * by qboc_release whatever step failed.
 */
typedef struct QbocCall
{
	QbOdbcConn *c;
	SQLHSTMT	st;
	bool		kept;			/* st is a kept handle (c->prepared) */
	SQLLEN	   *ind;			/* the parameters' indicators, bound until the end */
	SQLBIGINT  *nums;			/* the integer parameters' values, likewise */
	bool		oom;
	QbOdbcClass *cls;
	char	   *err;
	size_t		errlen;
} QbocCall;

/*
 * qboc_statement: sql's handle into x->st.  With parameters, the kept one,
 * or a new one prepared and kept while the cache has room; without, a new
 * one for SQLExecDirect.  -1 with err.
 */
static int
qboc_statement(QbocCall *x, const char *sql, int n)
{
	QbOdbcConn *c = x->c;

	if (n > 0 && (x->st = qboc_kept(c, sql)) != SQL_NULL_HSTMT)
	{
		x->kept = true;
		SQLFreeStmt(x->st, SQL_RESET_PARAMS);
		return 0;
	}
	if (!SQL_SUCCEEDED(SQLAllocHandle(SQL_HANDLE_STMT, c->dbc, &x->st)))
	{
		x->st = SQL_NULL_HSTMT;
		qboc_diag(c, SQL_HANDLE_DBC, c->dbc, "allocating a statement", x->cls, x->err, x->errlen);
		return -1;
	}
	if (n == 0)
		return 0;
	if (!SQL_SUCCEEDED(SQLPrepare(x->st, (SQLCHAR *) sql, SQL_NTS)))
	{
		qboc_diag(c, SQL_HANDLE_STMT, x->st, "preparing the statement", x->cls, x->err, x->errlen);
		return -1;
	}
	if (c->nprepared < QBOC_CACHE && (c->prepared[c->nprepared].sql = strdup(sql)) != NULL)
	{
		c->prepared[c->nprepared++].st = x->st;
		x->kept = true;
	}
	return 0;
}

/* qboc_run: the query timeout, every parameter bound, then the statement run.  -1 with err. */
static int
qboc_run(QbocCall *x, const char *sql, const QbOdbcParam *params, int n, long timeout_ms)
{
	SQLRETURN	r;

	SQLSetStmtAttr(x->st, SQL_ATTR_QUERY_TIMEOUT,
				   (SQLPOINTER) (SQLULEN) (timeout_ms > 0 ? (timeout_ms + 999) / 1000 : 0), 0);
	if (n > 0 && ((x->ind = calloc(n, sizeof(SQLLEN))) == NULL ||
				  (x->nums = calloc(n, sizeof(SQLBIGINT))) == NULL))
	{
		x->oom = true;
		return -1;
	}
	for (int i = 0; i < n; i++)
	{
		QbOdbcBinding b = qb_odbc_binding(&params[i]);
		SQLPOINTER	value;

		if (params[i].type == QB_ODBC_T_INT)
		{
			x->nums[i] = params[i].num;
			value = &x->nums[i];
			x->ind[i] = 0;
		}
		else
		{
			value = (SQLPOINTER) params[i].text;
			x->ind[i] = params[i].text ? SQL_NTS : SQL_NULL_DATA;
		}
		if (!SQL_SUCCEEDED(SQLBindParameter(x->st, (SQLUSMALLINT) (i + 1), SQL_PARAM_INPUT, b.c_type,
											b.sql_type, b.column_size, 0, value, 0, &x->ind[i])))
		{
			qboc_diag(x->c, SQL_HANDLE_STMT, x->st, "binding a parameter", x->cls, x->err, x->errlen);
			return -1;
		}
	}
	r = n > 0 ? SQLExecute(x->st) : SQLExecDirect(x->st, (SQLCHAR *) sql, SQL_NTS);
	if (!SQL_SUCCEEDED(r) && r != SQL_NO_DATA)
	{
		qboc_diag(x->c, SQL_HANDLE_STMT, x->st, "running the statement", x->cls, x->err, x->errlen);
		return -1;
	}
	return 0;
}

/*
 * qboc_read_set: every row of the current result set (ncols columns) to
 * row(arg, set, ...), each value read whole and freed after the call.  -1
 * with err.
 */
static int
qboc_read_set(QbocCall *x, int set, SQLSMALLINT ncols, QbOdbcRow row, void *arg)
{
	char	  **values = calloc(ncols, sizeof(char *));
	SQLRETURN	r;
	int			rc = 0;

	if (values == NULL)
	{
		x->oom = true;
		return -1;
	}
	while (rc == 0 && (r = SQLFetch(x->st)) != SQL_NO_DATA)
	{
		int			stop;

		if (!SQL_SUCCEEDED(r))
		{
			qboc_diag(x->c, SQL_HANDLE_STMT, x->st, "reading a result", x->cls, x->err, x->errlen);
			rc = -1;
			break;
		}
		for (int i = 0; i < ncols && rc == 0; i++)
			if (qboc_value(x->st, (SQLUSMALLINT) (i + 1), &values[i], &x->oom) != 0)
			{
				for (int j = 0; j < i; j++)
					free(values[j]);
				if (!x->oom)
					qboc_diag(x->c, SQL_HANDLE_STMT, x->st, "reading a value", x->cls, x->err, x->errlen);
				rc = -1;
			}
		if (rc != 0)
			break;
		stop = row ? row(arg, set, ncols, values) : 0;
		for (int i = 0; i < ncols; i++)
		{
			free(values[i]);
			values[i] = NULL;
		}
		if (stop != 0)
		{
			/* the caller could not keep the row (qboc_release says out of memory) */
			x->oom = true;
			rc = -1;
		}
	}
	free(values);
	return rc;
}

/*
 * qboc_results: each result set in order (set counts those with columns),
 * then the next: an error of a later statement of the batch surfaces at
 * SQLMoreResults and fails the call.  -1 with err.
 */
static int
qboc_results(QbocCall *x, QbOdbcRow row, void *arg)
{
	int			set = 0;

	for (;;)
	{
		SQLSMALLINT ncols = 0;
		SQLRETURN	r;

		SQLNumResultCols(x->st, &ncols);
		if (ncols > 0)
		{
			if (qboc_read_set(x, set, ncols, row, arg) != 0)
				return -1;
			set++;
		}
		r = SQLMoreResults(x->st);
		if (r == SQL_NO_DATA)
			return 0;
		if (!SQL_SUCCEEDED(r))
		{
			qboc_diag(x->c, SQL_HANDLE_STMT, x->st, "running the statement", x->cls, x->err, x->errlen);
			return -1;
		}
	}
}

/* qboc_release: what the call allocated, and its handle closed, kept or freed; rc. */
static int
qboc_release(QbocCall *x, int rc)
{
	if (x->oom)
	{
		snprintf(x->err, x->errlen, "out of memory");
		*x->cls = QB_ODBC_FAILED;
		rc = -1;
	}
	free(x->ind);
	free(x->nums);
	if (x->st != SQL_NULL_HSTMT)
	{
		SQLFreeStmt(x->st, SQL_CLOSE);
		/* a kept handle that failed is prepared again next time */
		if (!x->kept)
			SQLFreeHandle(SQL_HANDLE_STMT, x->st);
		else if (rc != 0)
			qboc_forget(x->c, x->st);
	}
	return rc;
}

/* qb_odbc_exec: see odbc_store.h. */
int
qb_odbc_exec(QbOdbcConn *c, const char *sql, const QbOdbcParam *params, int n,
			 long timeout_ms, QbOdbcRow row, void *arg, QbOdbcClass *cls,
			 char *err, size_t errlen)
{
	QbocCall	x = {.c = c, .st = SQL_NULL_HSTMT, .cls = cls, .err = err, .errlen = errlen};
	int			rc;

	*cls = QB_ODBC_FAILED;
	if (c == NULL || c->lost)
	{
		*cls = QB_ODBC_LOST;
		snprintf(err, errlen, "no connection to SQL Server");
		return -1;
	}
	rc = qboc_statement(&x, sql, n) == 0 &&
		qboc_run(&x, sql, params, n, timeout_ms) == 0 &&
		qboc_results(&x, row, arg) == 0 ? 0 : -1;
	return qboc_release(&x, rc);
}

/* qb_odbc_begin: see odbc_store.h. */
int
qb_odbc_begin(QbOdbcConn *c, char *err, size_t errlen)
{
	QbOdbcClass cls;

	return qb_odbc_exec(c, "BEGIN TRANSACTION", NULL, 0, 0, NULL, NULL, &cls, err, errlen);
}

/* qb_odbc_end: see odbc_store.h. */
int
qb_odbc_end(QbOdbcConn *c, bool commit, char *err, size_t errlen)
{
	QbOdbcClass cls;

	/* a rollback is safe whatever the server already undid */
	if (qb_odbc_exec(c, commit ? "COMMIT TRANSACTION" : "IF @@TRANCOUNT > 0 ROLLBACK TRANSACTION",
					 NULL, 0, 0, NULL, NULL, &cls, err, errlen) == 0)
		return 0;
	/* a transaction whose end failed is in an unknown state: start afresh */
	c->lost = true;
	return -1;
}
