/*-------------------------------------------------------------------------
 * qb_pg_stmt.c
 *	  The PostgreSQL statements' descriptors (qb_pg_stmt.h): each
 *	  statement's text and parameter types, written once for the SPI and
 *	  the libpq store.  The types are those qb_sql_pg.h's comments give
 *	  each $n.
 *-------------------------------------------------------------------------
 */
#include "qb_pg_stmt.h"
#include "qb_sql_pg.h"

#define B	QB_PG_T_BOOL
#define I4	QB_PG_T_INT4
#define I8	QB_PG_T_INT8
#define T	QB_PG_T_TEXT
#define U	QB_PG_T_UUID
#define TS	QB_PG_T_TIMESTAMPTZ
#define BA	QB_PG_T_BOOL_ARRAY
#define I4A QB_PG_T_INT4_ARRAY
#define I8A QB_PG_T_INT8_ARRAY
#define TA	QB_PG_T_TEXT_ARRAY
#define UA	QB_PG_T_UUID_ARRAY

/*
 * The session runs only these statements, each meant to be an index walk
 * or a primary-key lookup: the alternatives are off rather than left to
 * estimates (without statistics, a freshly filled table, the planner
 * bitmap-scanned every due row and sorted them: 50-150 ms a claim at 20k
 * rows), and each statement keeps one generic plan.  The plan cache would
 * otherwise plan the claim anew at every execution (its custom plans cost
 * less than the generic one by estimate, never by the clock): 60 % of a
 * worker's CPU at 50 rows/s went to the planner, and COMMIT to request took
 * 1.4 ms instead of 0.6 (bench/RESULTS.md, 2026-12-05).
 */
const QbPgSetting qb_pg_session_settings[QB_PG_NSETTINGS] = {
	{"enable_seqscan", "off"},
	{"enable_bitmapscan", "off"},
	{"enable_sort", "off"},
	{"enable_hashjoin", "off"},
	{"jit", "off"},
	{"plan_cache_mode", "force_generic_plan"},
};

const QbPgStmt qb_pg_stmts[QB_PG_NSTMTS] = {
	[QB_PG_S_CLAIM] = {"outbox claim", QB_PG_OUTBOX_CLAIM, 10,
	{I4, I8, I4, U, I8, TA, I4A, TA, I8A, I8}},
	[QB_PG_S_CLAIM_NO_PROBE] = {"outbox claim", QB_PG_OUTBOX_CLAIM_NO_PROBE, 10,
	{I4, I8, I4, U, I8, TA, I4A, TA, I8A, I8}},
	[QB_PG_S_SETTLE] = {"outbox settle", QB_PG_OUTBOX_SETTLE, 8, {UA, I8A, TA, I4A, I8A, TA, TA, BA}},
	[QB_PG_S_PROMOTE] = {"outbox promote", QB_PG_OUTBOX_PROMOTE, 6, {TA, U, I8, I4, I8, TA}},
	[QB_PG_S_PROMOTE_PAST] = {"outbox promote past", QB_PG_OUTBOX_PROMOTE_PAST, 1, {TA}},
	[QB_PG_S_FANOUT] = {"outbox fan-out", QB_PG_OUTBOX_FANOUT, 3, {UA, I8A, TA}},
	[QB_PG_S_BREAKER] = {"circuit breaker", QB_PG_OUTBOX_BREAKER, 9,
	{TA, I4A, I4A, BA, I8A, TA, I4A, I8A, I8A}},
	[QB_PG_S_BREAKER_ROWS] = {"circuit breaker rows", QB_PG_OUTBOX_BREAKER_ROWS, 1, {TA}},
	[QB_PG_S_STATES] = {"destination states", QB_PG_OUTBOX_STATES, 1, {I8}},
	[QB_PG_S_UNPARK] = {"outbox unpark", QB_PG_OUTBOX_UNPARK, 2, {TA, I4}},
	[QB_PG_S_UNROUTE] = {"outbox unroute", QB_PG_OUTBOX_UNROUTE, 1, {TA}},
	[QB_PG_S_RECLAIM] = {"outbox reclaim", QB_PG_OUTBOX_RECLAIM, 2, {I4, I8}},
	[QB_PG_S_RETENTION] = {"outbox retention", QB_PG_OUTBOX_RETENTION, 3, {I8, I4, I8}},
	[QB_PG_S_SWEEP] = {"outbox sweep", QB_PG_OUTBOX_SWEEP, 2, {T, I4}},
	[QB_PG_S_RELAY_CLAIM] = {"relay claim", QB_PG_RELAY_CLAIM, 5, {I4, I8, U, I8, I8}},
	[QB_PG_S_RELAY_FORWARD] = {"relay forward", QB_PG_RELAY_FORWARD, 5, {U, I8A, TA, I4, BA}},
	[QB_PG_S_RELAY_PROMOTE] = {"relay promote", QB_PG_RELAY_PROMOTE, 1, {I8A}},
	[QB_PG_S_INBOX_INSERT] = {"inbox insert", QB_PG_INBOX_INSERT, 8,
	{TA, TA, TA, TA, TA, TA, TA, TA}},
	[QB_PG_S_REPLAY_SELECT] = {"inbox replay select", QB_PG_INBOX_REPLAY_SELECT, 5,
	{I8, T, T, TS, TS}},
	[QB_PG_S_REPLAY] = {"inbox replay", QB_PG_INBOX_REPLAY, 3, {I8A, TA, I4}},
	[QB_PG_S_CONFIG_LOAD] = {"configuration load", QB_PG_CONFIG_LOAD, 0, {0}},
	[QB_PG_S_SET_CONFIG] = {"set_config", QB_PG_SET_CONFIG, 3, {T, T, B}},
	[QB_PG_S_CLAIMER_LOCK] = {"claimer lock", QB_PG_CLAIMER_LOCK, 1, {I8}},
	[QB_PG_S_LIMITS_ENSURE] = {"limit buckets", QB_PG_LIMITS_ENSURE, 2, {TA, I4A}},
	[QB_PG_S_LIMITS_LOCK] = {"limit lock", QB_PG_LIMITS_LOCK, 1, {TA}},
	[QB_PG_S_LIMITS_TAKE] = {"limit take", QB_PG_LIMITS_TAKE, 10, {TA, TA, I4A, I4A, I4A, I4A, I4A, I4A, I8, I8}},
	/* the queries of QbStore.query_text, in QbQuery's order */
	[QB_PG_S_QUERY + 0] = {"ready", QB_PG_Q_READY, 0, {0}},
	[QB_PG_S_QUERY + 1] = {"gauges", QB_PG_Q_GAUGES, 0, {0}},
	[QB_PG_S_QUERY + 2] = {"dead outbox rows", QB_PG_Q_DEAD_OUTBOX, 8, {T, T, T, T, T, T, T, T}},
	[QB_PG_S_QUERY + 3] = {"dead inbox rows", QB_PG_Q_DEAD_INBOX, 9, {T, T, T, T, T, T, T, T, T}},
	[QB_PG_S_QUERY + 4] = {"replay outbox", QB_PG_Q_REPLAY_OUTBOX, 2, {T, T}},
	[QB_PG_S_QUERY + 5] = {"requeue outbox", QB_PG_Q_REQUEUE_OUTBOX, 2, {T, T}},
	[QB_PG_S_QUERY + 6] = {"replay inbox", QB_PG_Q_REPLAY_INBOX, 2, {T, T}},
	[QB_PG_S_QUERY + 7] = {"requeue inbox", QB_PG_Q_REQUEUE_INBOX, 2, {T, T}},
	[QB_PG_S_QUERY + 8] = {"replay outbox rows", QB_PG_Q_REPLAY_OUTBOX_BULK, 5, {T, T, T, T, T}},
	[QB_PG_S_QUERY + 9] = {"requeue outbox rows", QB_PG_Q_REQUEUE_OUTBOX_BULK, 4, {T, T, T, T}},
	[QB_PG_S_QUERY + 10] = {"replay inbox rows", QB_PG_Q_REPLAY_INBOX_BULK, 5, {T, T, T, T, T}},
	[QB_PG_S_QUERY + 11] = {"requeue inbox rows", QB_PG_Q_REQUEUE_INBOX_BULK, 4, {T, T, T, T}},
	[QB_PG_S_QUERY + 12] = {"resume destination", QB_PG_Q_RESUME_DESTINATION, 2, {T, T}},
	[QB_PG_S_QUERY + 13] = {"held keys", QB_PG_Q_HELD_KEYS, 1, {T}},
	[QB_PG_S_QUERY + 14] = {"skip outbox", QB_PG_Q_SKIP_OUTBOX, 2, {T, T}},
	[QB_PG_S_QUERY + 15] = {"requeue outbox edited", QB_PG_Q_REQUEUE_OUTBOX_EDITED, 3, {T, T, T}},
	[QB_PG_S_QUERY + 16] = {"overview", QB_PG_Q_OVERVIEW, 0, {0}},
	[QB_PG_S_QUERY + 17] = {"held aggregates", QB_PG_Q_HELD_AGGREGATES, 1, {T}},
	[QB_PG_S_QUERY + 18] = {"skip inbox", QB_PG_Q_SKIP_INBOX, 2, {T, T}},
	[QB_PG_S_QUERY + 19] = {"requeue inbox edited", QB_PG_Q_REQUEUE_INBOX_EDITED, 3, {T, T, T}},
	[QB_PG_S_QUERY + 20] = {"outbox row", QB_PG_Q_OUTBOX_ROW, 1, {T}},
	[QB_PG_S_QUERY + 21] = {"inbox row", QB_PG_Q_INBOX_ROW, 1, {T}},
	[QB_PG_S_QUERY + 22] = {"inbox lookup", QB_PG_Q_INBOX_LOOKUP, 2, {T, T}},
	[QB_PG_S_QUERY + 23] = {"pause destination", QB_PG_Q_PAUSE_DESTINATION, 3, {T, T, T}},
	[QB_PG_S_QUERY + 24] = {"reset destination", QB_PG_Q_RESET_DESTINATION, 2, {T, T}},
};
