/*
 * sql/sqlserver/session.sql
 *	  The working tables of one daemon session: what _outbox_cycle and
 *	  _limits_take (sql/sqlserver/engine.sql) keep between their
 *	  statements, as #temporary tables the session creates once.
 *
 * queuebox-mssqld's store runs this batch on each connection it opens
 * (odbc_store.c, qbos_open), before any call; a test that calls those
 * procedures itself runs it first too (QueueBoxMssql::mssql_session).  It is
 * not part of the schema: nothing here is stored in the database, and a
 * session without these tables gets a clear error from each procedure.
 *
 * Why not table variables, as every other procedure uses: a DECLARE @t
 * TABLE is made again at every call.  On SQL Server that is cheap; on a
 * Babelfish engine each one is a PostgreSQL temporary table created and
 * dropped, 1 ms of catalog writes on an idle 2-core machine and 2 to 6 ms
 * on a busy one, and the cycle declared 15.  A session's own #tables live
 * as long as the session; each procedure empties those it uses (TRUNCATE)
 * before it fills them, so a call never sees a row of the one before.
 * TRUNCATE, not DELETE: on Babelfish a DELETE leaves the table's pages,
 * and PostgreSQL, which keeps no statistics of a temporary table, guesses
 * its rows from its pages; a table as large as its largest call made it
 * plan hash joins over the whole outbox (bench/RESULTS.md, 2026-12-06).
 *
 * Each table is named after the procedure and the table variable it
 * replaces (#qb_cycle_rows is _outbox_cycle's @rows, as it was).  Text
 * columns say their collation (a #table would take tempdb's otherwise).
 * STATISTICS_NORECOMPUTE: the few rows each call writes must not make
 * SQL Server recompile the procedures' statements, as a table variable's
 * never did.
 */

-- _outbox_cycle: the circuit breakers' changes, the tallies and their next states
CREATE TABLE #qb_cycle_changes (
	destination NVARCHAR(200) COLLATE Latin1_General_100_BIN2 PRIMARY KEY WITH (STATISTICS_NORECOMPUTE = ON),
	old_state NVARCHAR(20) COLLATE DATABASE_DEFAULT, new_state NVARCHAR(20) COLLATE DATABASE_DEFAULT,
	paused BIT);
CREATE TABLE #qb_cycle_tally (
	destination NVARCHAR(200) COLLATE Latin1_General_100_BIN2 PRIMARY KEY WITH (STATISTICS_NORECOMPUTE = ON),
	n_ok INT, ok_sent_at DATETIME2(6), n_fail INT, gone BIT, retry_after_ms BIGINT,
	error NVARCHAR(MAX) COLLATE DATABASE_DEFAULT, threshold INT, cooldown_ms BIGINT);
CREATE TABLE #qb_cycle_next (
	destination NVARCHAR(200) COLLATE Latin1_General_100_BIN2 PRIMARY KEY WITH (STATISTICS_NORECOMPUTE = ON),
	old_state NVARCHAR(20) COLLATE DATABASE_DEFAULT, new_state NVARCHAR(20) COLLATE DATABASE_DEFAULT,
	old_failures INT, new_failures INT, old_paused DATETIME2(6), new_paused DATETIME2(6), n_fail INT,
	error NVARCHAR(MAX) COLLATE DATABASE_DEFAULT, cooldown_ms BIGINT);
-- _outbox_cycle: the settles, the rows they hold, the rows to copy (fan-out)
CREATE TABLE #qb_cycle_settles (
	id BIGINT, token UNIQUEIDENTIFIER, outcome NVARCHAR(10) COLLATE DATABASE_DEFAULT, attempt INT,
	delay_ms BIGINT, error NVARCHAR(MAX) COLLATE DATABASE_DEFAULT,
	destination NVARCHAR(200) COLLATE Latin1_General_100_BIN2, unrouted BIT,
	copies NVARCHAR(MAX) COLLATE DATABASE_DEFAULT);
CREATE TABLE #qb_cycle_settled (
	id BIGINT PRIMARY KEY WITH (STATISTICS_NORECOMPUTE = ON),
	[key] NVARCHAR(400) COLLATE Latin1_General_100_BIN2, state NVARCHAR(50) COLLATE DATABASE_DEFAULT,
	unrouted BIT);
CREATE TABLE #qb_cycle_fan (
	id BIGINT PRIMARY KEY WITH (STATISTICS_NORECOMPUTE = ON),
	copies NVARCHAR(MAX) COLLATE DATABASE_DEFAULT);
-- _outbox_cycle: the keys whose row ended, and the rows their promotion releases
CREATE TABLE #qb_cycle_ended (
	[key] NVARCHAR(400) COLLATE Latin1_General_100_BIN2,
	destination NVARCHAR(200) COLLATE Latin1_General_100_BIN2);
CREATE TABLE #qb_cycle_promoted (
	id BIGINT PRIMARY KEY WITH (STATISTICS_NORECOMPUTE = ON), claim BIT);
-- _outbox_cycle: the claim: probes, destinations taking rows, candidates, blockers
CREATE TABLE #qb_cycle_probe (
	destination NVARCHAR(200) COLLATE Latin1_General_100_BIN2 PRIMARY KEY WITH (STATISTICS_NORECOMPUTE = ON));
CREATE TABLE #qb_cycle_dests (
	name NVARCHAR(200) COLLATE Latin1_General_100_BIN2 PRIMARY KEY WITH (STATISTICS_NORECOMPUTE = ON),
	lim INT);
CREATE TABLE #qb_cycle_cand (
	id BIGINT PRIMARY KEY WITH (STATISTICS_NORECOMPUTE = ON),
	[key] NVARCHAR(400) COLLATE Latin1_General_100_BIN2, src CHAR(1) COLLATE DATABASE_DEFAULT,
	destination NVARCHAR(200) COLLATE Latin1_General_100_BIN2, pos BIGINT, fan BIT);
CREATE TABLE #qb_cycle_blk (
	cid BIGINT PRIMARY KEY WITH (STATISTICS_NORECOMPUTE = ON), bid BIGINT);
CREATE TABLE #qb_cycle_lk (
	id BIGINT PRIMARY KEY WITH (STATISTICS_NORECOMPUTE = ON));
-- _outbox_cycle: what it answers: the destination states, the rows
CREATE TABLE #qb_cycle_states (
	destination NVARCHAR(200) COLLATE Latin1_General_100_BIN2 PRIMARY KEY WITH (STATISTICS_NORECOMPUTE = ON),
	state NVARCHAR(20) COLLATE DATABASE_DEFAULT, failures INT, paused BIT, probe BIT);
CREATE TABLE #qb_cycle_rows (
	id BIGINT PRIMARY KEY WITH (STATISTICS_NORECOMPUTE = ON), claimed BIT,
	destination NVARCHAR(200) COLLATE Latin1_General_100_BIN2, src CHAR(1) COLLATE DATABASE_DEFAULT,
	not_due BIT);
-- _limits_take: the destinations of one take
CREATE TABLE #qb_limits_take (
	destination NVARCHAR(200) COLLATE Latin1_General_100_BIN2 PRIMARY KEY WITH (STATISTICS_NORECOMPUTE = ON),
	per_sec FLOAT, burst INT, max_concurrent INT, held INT, give INT, want INT,
	tokens FLOAT NULL, places INT NULL, got INT NULL);
