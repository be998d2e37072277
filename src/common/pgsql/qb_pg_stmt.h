/*-------------------------------------------------------------------------
 * qb_pg_stmt.h
 *	  The PostgreSQL statements by name: one descriptor each (text,
 *	  parameter count and types), read by both PostgreSQL stores, the SPI
 *	  one in the extension and the libpq one in the daemon.
 *
 * Wording:
 *	- A statement is a QbPgStmtId; qb_pg_stmts[id] is its descriptor.  Its
 *	  text is one of qb_sql_pg.h's, whose comments say what each $n is.
 *	- A parameter type is a QbPgType: the core includes no PostgreSQL
 *	  header, so each host maps it to its own type OIDs (SPI to INT4OID and
 *	  friends, libpq to the pg_type numbers it sends).
 *	- A session setting (qb_pg_session_settings) is one both hosts give the
 *	  session that runs the statements, before the first.
 *	- The queries of QbStore.query_text follow the named statements, in
 *	  QbQuery's order (QB_PG_S_QUERY + a QbQuery); each takes text
 *	  parameters and casts them.  QbQuery lives in the engine, above this
 *	  folder, so each host checks QB_PG_NQUERIES == QB_NQUERIES.
 *-------------------------------------------------------------------------
 */
#ifndef QB_PG_STMT_H
#define QB_PG_STMT_H

#include "qb_claim_cols.h"

/* A parameter's type, as the statement's text casts or takes it. */
typedef enum QbPgType
{
	QB_PG_T_NONE,				/* no parameter here */
	QB_PG_T_BOOL,
	QB_PG_T_INT4,
	QB_PG_T_INT8,
	QB_PG_T_TEXT,
	QB_PG_T_UUID,
	QB_PG_T_TIMESTAMPTZ,
	QB_PG_T_BOOL_ARRAY,
	QB_PG_T_INT4_ARRAY,
	QB_PG_T_INT8_ARRAY,
	QB_PG_T_TEXT_ARRAY,
	QB_PG_T_UUID_ARRAY,
	QB_PG_NTYPES
} QbPgType;

typedef enum QbPgStmtId
{
	QB_PG_S_CLAIM,
	QB_PG_S_CLAIM_NO_PROBE,		/* the same parameters; $8 must be empty */
	QB_PG_S_SETTLE,
	QB_PG_S_PROMOTE,
	QB_PG_S_PROMOTE_PAST,
	QB_PG_S_FANOUT,
	QB_PG_S_BREAKER,
	QB_PG_S_BREAKER_ROWS,
	QB_PG_S_STATES,
	QB_PG_S_UNPARK,
	QB_PG_S_UNROUTE,
	QB_PG_S_RECLAIM,
	QB_PG_S_RETENTION,
	QB_PG_S_SWEEP,
	QB_PG_S_RELAY_CLAIM,
	QB_PG_S_RELAY_FORWARD,
	QB_PG_S_RELAY_PROMOTE,
	QB_PG_S_INBOX_INSERT,
	QB_PG_S_REPLAY_SELECT,
	QB_PG_S_REPLAY,
	QB_PG_S_CONFIG_LOAD,
	QB_PG_S_SET_CONFIG,
	QB_PG_S_CLAIMER_LOCK,
	QB_PG_S_LIMITS_ENSURE,
	QB_PG_S_LIMITS_LOCK,
	QB_PG_S_LIMITS_TAKE,
	QB_PG_S_QUERY,				/* + QbQuery */
	QB_PG_NSTMTS = QB_PG_S_QUERY + 25
} QbPgStmtId;

#define QB_PG_NQUERIES		(QB_PG_NSTMTS - QB_PG_S_QUERY)
#define QB_PG_MAXPARAMS		10

typedef struct QbPgStmt
{
	const char *name;			/* for messages */
	const char *sql;
	int			nparams;
	QbPgType	params[QB_PG_MAXPARAMS];
} QbPgStmt;

extern const QbPgStmt qb_pg_stmts[QB_PG_NSTMTS];

/*
 * A setting of the session that runs these statements (the extension's
 * worker backend, the daemon's connection), the same in both.
 */
typedef struct QbPgSetting
{
	const char *name;
	const char *value;
} QbPgSetting;

#define QB_PG_NSETTINGS 6
extern const QbPgSetting qb_pg_session_settings[QB_PG_NSETTINGS];

#endif							/* QB_PG_STMT_H */
