/*-------------------------------------------------------------------------
 * odbc_error.c
 *	  What an ODBC diagnostic means: to the store its class, to a failed
 *	  connect what to do; from the SQLSTATE and SQL Server's native error
 *	  number.
 *
 * The native number decides where SQL Server has one (ODBC reports most
 * server errors as SQLSTATE 42000 or 23000, whatever they are); the
 * SQLSTATE decides for what the driver itself says (08xxx: the connection,
 * HYT00: the statement's timeout).  Numbers of SQL Server 2019 and later,
 * and the one a Babelfish engine answers for a lock timeout (33557097),
 * which SQL Server never sends.
 *-------------------------------------------------------------------------
 */
#include <string.h>

#include "odbc_store.h"

typedef struct QboNative
{
	long		native;
	QbOdbcClass cls;
} QboNative;

static const QboNative qboe_natives[] = {
	{.native = 1205, .cls = QB_ODBC_RETRY},	/* chosen as the deadlock victim */
	{.native = 1222, .cls = QB_ODBC_RETRY},	/* lock request time out period exceeded */
	{.native = 33557097, .cls = QB_ODBC_RETRY},	/* Babelfish: canceling statement due to lock timeout */
	{.native = 2601, .cls = QB_ODBC_DUPLICATE},	/* duplicate key row in a unique index */
	{.native = 2627, .cls = QB_ODBC_DUPLICATE},	/* violation of a UNIQUE or PRIMARY KEY constraint */
	{.native = 51000, .cls = QB_ODBC_PULL_BUSY},	/* inbox_claim: the source's lock was held 10 s */
	{.native = 50022, .cls = QB_ODBC_BAD_INPUT},	/* a procedure refused a parameter */
	{.native = 50002, .cls = QB_ODBC_NOT_FOUND},	/* a procedure found no such row */
	{.native = 245, .cls = QB_ODBC_BAD_INPUT},	/* conversion failed (a number) */
	{.native = 241, .cls = QB_ODBC_BAD_INPUT},	/* conversion failed (a date or time) */
	{.native = 242, .cls = QB_ODBC_BAD_INPUT},	/* a date or time out of range */
	{.native = 8114, .cls = QB_ODBC_BAD_INPUT},	/* error converting a data type */
	{.native = 8115, .cls = QB_ODBC_BAD_INPUT},	/* arithmetic overflow */
	{.native = 8169, .cls = QB_ODBC_BAD_INPUT},	/* conversion to uniqueidentifier failed */
	{.native = 547, .cls = QB_ODBC_BAD_INPUT},	/* a CHECK constraint */
	{.native = 515, .cls = QB_ODBC_BAD_INPUT},	/* NULL into a NOT NULL column */
	{.native = 2628, .cls = QB_ODBC_BAD_INPUT},	/* string or binary data would be truncated (2019+) */
	{.native = 8152, .cls = QB_ODBC_BAD_INPUT},	/* the same, before 2019 */
	{.native = 13609, .cls = QB_ODBC_BAD_INPUT},	/* JSON text is not properly formatted */
};

/* qb_odbc_classify: see odbc_store.h. */
QbOdbcClass
qb_odbc_classify(const char *sqlstate, long native)
{
	if (sqlstate != NULL && (strncmp(sqlstate, "08", 2) == 0 || strcmp(sqlstate, "HYT01") == 0))
		return QB_ODBC_LOST;
	if (sqlstate != NULL && strcmp(sqlstate, "HYT00") == 0)
		return QB_ODBC_TIMEOUT;
	for (size_t i = 0; i < sizeof(qboe_natives) / sizeof(qboe_natives[0]); i++)
		if (qboe_natives[i].native == native)
			return qboe_natives[i].cls;
	/* 40001 is a serialization failure, as a deadlock victim is reported by some drivers */
	if (sqlstate != NULL && strcmp(sqlstate, "40001") == 0)
		return QB_ODBC_RETRY;
	return QB_ODBC_FAILED;
}

/*
 * qb_odbc_connect_advice: see odbc_store.h.  By the native number where
 * SQL Server sent one (18456: the login failed, for a reason SQL Server
 * logs but does not tell the client; 4060: the login's database; 911, a
 * database that does not exist, is what Babelfish answers there, with
 * SQLSTATE 08004), else by the SQLSTATE: 28xxx an authorization, 08xxx a
 * server not reached.
 */
const char *
qb_odbc_connect_advice(const char *sqlstate, long native)
{
	if (native == 18456 || (sqlstate != NULL && strncmp(sqlstate, "28", 2) == 0))
		return "check the user and the password in database.url (percent-encode @, : and / in them); "
			"SQL Server's error log says why it refused the login";
	if (native == 4060 || native == 911)
		return "check the database in database.url's path, and that the login is a user there";
	if (sqlstate != NULL && strncmp(sqlstate, "08", 2) == 0)
		return "check database.url's host and port, that SQL Server listens there for TCP, and ?encrypt= "
			"(TLS is required unless encrypt=request or encrypt=false)";
	return NULL;
}
