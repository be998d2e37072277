/*-------------------------------------------------------------------------
 * odbc_queries.c
 *	  The T-SQL of QbStore.query_text on SQL Server: readiness, the metrics
 *	  gauges, the dead rows and the operations, one text per QbQuery.
 *
 * Each text takes its parameters as '?' markers, once each and in order,
 * bound as text and checked before use (QBOQ_ID, QBOQ_TIME: a malformed
 * number or time is THROW 50022 naming the parameter, which the store
 * reads as bad input, whatever number the engine gives its own conversion
 * errors),
 * and returns one row with one JSON text value, spaced as PostgreSQL's
 * json_build_object prints it ({"requeued" : true}), so both stores answer
 * the admin routes with the same bytes.  The operations call the procedures of sql/sqlserver/operations.sql
 * through INSERT ... EXEC, so an operator's EXEC and the admin route run
 * the same code.  QB_Q_REPLAY_INBOX and QB_Q_REPLAY_INBOX_BULK are not
 * here: their topics are rendered in C (odbc_store.c, qbos_replay).
 *-------------------------------------------------------------------------
 */
#include <stddef.h>

#include "odbc_store.h"

/* a text parameter as a number: @name BIGINT, or THROW 50022 saying which */
#define QBOQ_ID(name) \
	"DECLARE @" name "_t NVARCHAR(64) = ?;" \
	" IF @" name "_t IS NOT NULL AND TRY_CONVERT(BIGINT, @" name "_t) IS NULL" \
	"  THROW 50022, N'" name ": not a whole number', 1;" \
	" DECLARE @" name " BIGINT = TRY_CONVERT(BIGINT, @" name "_t);"

/*
 * a text parameter as a time: @name DATETIME2 in UTC, or THROW 50022 saying
 * which (the check converts to DATETIMEOFFSET of the default precision:
 * Babelfish's TRY_CONVERT to DATETIMEOFFSET(6) answers NULL for every time)
 */
#define QBOQ_TIME(name) \
	" DECLARE @" name "_t NVARCHAR(64) = ?;" \
	" IF @" name "_t IS NOT NULL AND TRY_CONVERT(DATETIMEOFFSET, @" name "_t) IS NULL" \
	"  THROW 50022, N'" name ": not a time; write it in ISO 8601, e.g. 2026-12-01T09:30:00Z', 1;" \
	" DECLARE @" name " DATETIME2(6) = queuebox._utc(@" name "_t);"

/*
 * The actor, a write's last parameter, in SESSION_CONTEXT while the
 * operation runs: outbox_audit's done_by default reads it.  Cleared after,
 * the connection serving other work.
 */
#define QBOQ_ACTOR \
	" DECLARE @actor NVARCHAR(200) = ?;" \
	" EXEC sp_set_session_context N'queuebox.actor', @actor;"
#define QBOQ_ACTOR_CLEAR \
	" EXEC sp_set_session_context N'queuebox.actor', NULL;"

/* the one JSON text a procedure returns (a page, a row), or no row */
#define QBOQ_JSON(decl, call) \
	decl " DECLARE @r TABLE (j NVARCHAR(MAX));" \
	" INSERT @r EXEC " call ";" \
	" SELECT j FROM @r"

/* a BIT result of procedure call into {"name": true|false} */
#define QBOQ_FLAG(decl, call, name) \
	decl QBOQ_ACTOR " DECLARE @r TABLE (r BIT);" \
	" INSERT @r EXEC " call ";" QBOQ_ACTOR_CLEAR \
	" SELECT CASE WHEN (SELECT r FROM @r) = 1 THEN N'{\"" name "\" : true}'" \
	"             ELSE N'{\"" name "\" : false}' END"

/* a count result of procedure call into {"name": n} */
#define QBOQ_COUNT(decl, call, name) \
	decl QBOQ_ACTOR " DECLARE @r TABLE (n BIGINT);" \
	" INSERT @r EXEC " call ";" QBOQ_ACTOR_CLEAR \
	" SELECT N'{\"" name "\" : ' + CAST((SELECT n FROM @r) AS NVARCHAR(20)) + N'}'"

/* whether @n is a configured destination, as JSON */
#define QBOQ_KNOWN \
	"CASE WHEN EXISTS (SELECT 1 FROM queuebox.config_destination WHERE name = @n)" \
	" THEN N'true' ELSE N'false' END"

/* The rows a replay of inbox rows reads (odbc_store.c renders their topics). */
const char qb_odbc_replay_select[] =
	QBOQ_ID("id") " DECLARE @st NVARCHAR(50) = ?; DECLARE @src NVARCHAR(200) = ?;"
	QBOQ_TIME("since") QBOQ_TIME("until")
	" SELECT i.id, i.source, i.event_type FROM queuebox.inbox i"
	" WHERE (@id IS NULL OR i.id = @id) AND (@st IS NULL OR i.state = @st)"
	"   AND (@src IS NULL OR i.source = @src)"
	"   AND (@since IS NULL OR i.created_at >= @since)"
	"   AND (@until IS NULL OR i.created_at < @until)"
	" ORDER BY i.created_at, i.id";

/* the console's overview of one table: its open and dead rows, as JSON text */
#define QBOQ_OVERVIEW_COUNTS(table) \
	"(SELECT N'{\"pending\" : ' + CAST(COUNT_BIG(CASE WHEN state = N'pending' THEN 1 END) AS NVARCHAR(20))" \
	"  + N', \"processing\" : ' + CAST(COUNT_BIG(CASE WHEN state = N'processing' THEN 1 END) AS NVARCHAR(20))" \
	"  + N', \"dead\" : ' + CAST(COUNT_BIG(CASE WHEN state = N'dead' THEN 1 END) AS NVARCHAR(20))" \
	"  + N', \"oldest_pending_sec\" : ' + CONVERT(NVARCHAR(40), CAST(ISNULL(@now - queuebox._epoch(" \
	"      MIN(CASE WHEN state = N'pending' THEN created_at END)), 0) AS DECIMAL(20, 6))) + N'}'" \
	"  FROM queuebox." table " WHERE state IN (N'pending', N'processing', N'dead'))"

typedef struct QboQuery
{
	const char *sql;			/* NULL: rendered in C */
	int			nparams;
} QboQuery;

static const QboQuery qboq_queries[QB_NQUERIES] = {
	[QB_Q_READY] = {.sql = "SELECT queuebox._schema_version()", .nparams = 0},
	/* built as text: a JSON fragment nested with FOR JSON is a string on some engines */
	[QB_Q_GAUGES] = {.sql =
		"DECLARE @now FLOAT = queuebox._epoch(SYSUTCDATETIME());"
		" SELECT N'{\"outbox_pending\" : '"
		"  + CAST((SELECT COUNT_BIG(*) FROM queuebox.outbox WHERE state = N'pending') AS NVARCHAR(20))"
		"  + N', \"outbox_processing\" : '"
		"  + CAST((SELECT COUNT_BIG(*) FROM queuebox.outbox WHERE state = N'processing') AS NVARCHAR(20))"
		"  + N', \"outbox_oldest\" : '"
		"  + CONVERT(NVARCHAR(40), CAST(ISNULL((SELECT @now - queuebox._epoch(MIN(created_at))"
		"      FROM queuebox.outbox WHERE state = N'pending'), 0) AS DECIMAL(20, 6)))"
		"  + N', \"inbox_pending\" : '"
		"  + CAST((SELECT COUNT_BIG(*) FROM queuebox.inbox WHERE state = N'pending') AS NVARCHAR(20))"
		"  + N', \"inbox_processing\" : '"
		"  + CAST((SELECT COUNT_BIG(*) FROM queuebox.inbox WHERE state = N'processing') AS NVARCHAR(20))"
		"  + N', \"inbox_oldest\" : '"
		"  + CONVERT(NVARCHAR(40), CAST(ISNULL((SELECT @now - queuebox._epoch(MIN(created_at))"
		"      FROM queuebox.inbox WHERE state = N'pending'), 0) AS DECIMAL(20, 6)))"
		"  + N', \"circuits\" : {' + ISNULL((SELECT STRING_AGG(CAST(N'\"' + STRING_ESCAPE(destination, 'json')"
		"      + N'\" : \"' + state + N'\"' AS NVARCHAR(MAX)), N', ') FROM queuebox.destination_state), N'')"
		"  + N'}}'",
	.nparams = 0},
	[QB_Q_DEAD_OUTBOX] = {.sql = QBOQ_JSON(
		"DECLARE @d NVARCHAR(200) = ?; DECLARE @t NVARCHAR(400) = ?; DECLARE @k NVARCHAR(400) = ?;"
		" DECLARE @e NVARCHAR(400) = ?;" QBOQ_TIME("since") QBOQ_TIME("until") " " QBOQ_ID("after")
		" " QBOQ_ID("limit") " DECLARE @lim INT = ISNULL(@limit, 100);",
		"queuebox.dead_outbox @d, @t, @k, @e, @since, @until, @after, @lim"),
	.nparams = 8},
	[QB_Q_DEAD_INBOX] = {.sql = QBOQ_JSON(
		"DECLARE @s NVARCHAR(200) = ?; DECLARE @et NVARCHAR(400) = ?; DECLARE @ik NVARCHAR(400) = ?;"
		" DECLARE @ag NVARCHAR(400) = ?; DECLARE @e NVARCHAR(400) = ?;" QBOQ_TIME("since")
		QBOQ_TIME("until") " " QBOQ_ID("after") " " QBOQ_ID("limit") " DECLARE @lim INT = ISNULL(@limit, 100);",
		"queuebox.dead_inbox @s, @et, @ik, @ag, @e, @since, @until, @after, @lim"),
	.nparams = 9},
	[QB_Q_REPLAY_OUTBOX] = {.sql =
		QBOQ_ID("id") QBOQ_ACTOR " DECLARE @r TABLE (id BIGINT);"
		" INSERT @r EXEC queuebox.replay_outbox @id;" QBOQ_ACTOR_CLEAR
		" SELECT N'{\"id\" : ' + ISNULL(CAST((SELECT id FROM @r) AS NVARCHAR(20)), N'null') + N'}'",
	.nparams = 2},
	[QB_Q_REQUEUE_OUTBOX] = {.sql = QBOQ_FLAG(QBOQ_ID("id"),
											  "queuebox.requeue_outbox @id", "requeued"),
	.nparams = 2},
	[QB_Q_REPLAY_INBOX] = {.sql = NULL, .nparams = 2},
	[QB_Q_REQUEUE_INBOX] = {.sql = QBOQ_FLAG(QBOQ_ID("id"),
											 "queuebox.requeue_inbox @id", "requeued"),
	.nparams = 2},
	[QB_Q_REPLAY_OUTBOX_BULK] = {.sql = QBOQ_COUNT(
		"DECLARE @st NVARCHAR(50) = ?; DECLARE @p NVARCHAR(400) = ?;" QBOQ_TIME("since") QBOQ_TIME("until"),
		"queuebox.replay_outbox_matching @st, @p, @since, @until", "replayed"),
	.nparams = 5},
	[QB_Q_REQUEUE_OUTBOX_BULK] = {.sql = QBOQ_COUNT(
		"DECLARE @p NVARCHAR(400) = ?;" QBOQ_TIME("since") QBOQ_TIME("until"),
		"queuebox.requeue_outbox_matching @p, @since, @until", "requeued"),
	.nparams = 4},
	[QB_Q_REPLAY_INBOX_BULK] = {.sql = NULL, .nparams = 5},
	[QB_Q_REQUEUE_INBOX_BULK] = {.sql = QBOQ_COUNT(
		"DECLARE @s NVARCHAR(200) = ?;" QBOQ_TIME("since") QBOQ_TIME("until"),
		"queuebox.requeue_inbox_matching @s, @since, @until", "requeued"),
	.nparams = 4},
	[QB_Q_RESUME_DESTINATION] = {.sql =
		"DECLARE @n NVARCHAR(200) = ?;" QBOQ_ACTOR " DECLARE @r TABLE (r BIT);"
		" INSERT @r EXEC queuebox.resume_destination @n;" QBOQ_ACTOR_CLEAR
		" SELECT N'{\"known\" : ' + " QBOQ_KNOWN
		"        + N', \"resumed\" : ' + CASE WHEN (SELECT r FROM @r) = 1 THEN N'true' ELSE N'false' END + N'}'",
	.nparams = 2},
	[QB_Q_HELD_KEYS] = {.sql =
		QBOQ_ID("limit") " DECLARE @lim INT = ISNULL(@limit, 100);"
		" DECLARE @h TABLE ([key] NVARCHAR(400), destination NVARCHAR(200), head_id BIGINT,"
		"                   head_state NVARCHAR(20), behind BIGINT, since DATETIME2(6));"
		" INSERT @h EXEC queuebox.held_keys @lim;"
		" SELECT ISNULL((SELECT [key], destination, head_id, head_state, behind,"
		"                 CONVERT(NVARCHAR(33), since, 127) + N'Z' AS since"
		"                FROM @h ORDER BY [key] FOR JSON PATH, INCLUDE_NULL_VALUES), N'[]')",
	.nparams = 1},
	[QB_Q_SKIP_OUTBOX] = {.sql = QBOQ_FLAG(QBOQ_ID("id"), "queuebox.skip_outbox @id", "skipped"),
	.nparams = 2},
	[QB_Q_REQUEUE_OUTBOX_EDITED] = {.sql = QBOQ_FLAG(QBOQ_ID("id") " DECLARE @payload NVARCHAR(MAX) = ?;",
													 "queuebox.requeue_outbox_edited @id, @payload", "requeued"),
	.nparams = 3},
	/* onDead: holdKey in the relay's aggregate order */
	[QB_Q_HELD_AGGREGATES] = {.sql =
		QBOQ_ID("limit") " DECLARE @lim INT = ISNULL(@limit, 100);"
		" DECLARE @h TABLE (aggregate_id NVARCHAR(400), source NVARCHAR(200), head_id BIGINT,"
		"                   behind BIGINT, since DATETIME2(6));"
		" INSERT @h EXEC queuebox.held_aggregates @lim;"
		" SELECT ISNULL((SELECT aggregate_id, source, head_id, behind,"
		"                 CONVERT(NVARCHAR(33), since, 127) + N'Z' AS since"
		"                FROM @h ORDER BY aggregate_id FOR JSON PATH, INCLUDE_NULL_VALUES), N'[]')",
	.nparams = 1},
	[QB_Q_SKIP_INBOX] = {.sql = QBOQ_FLAG(QBOQ_ID("id"), "queuebox.skip_inbox @id", "skipped"),
	.nparams = 2},
	[QB_Q_REQUEUE_INBOX_EDITED] = {.sql = QBOQ_FLAG(QBOQ_ID("id") " DECLARE @payload NVARCHAR(MAX) = ?;",
													"queuebox.requeue_inbox_edited @id, @payload", "requeued"),
	.nparams = 3},
	/*
	 * built as text, as the gauges are; destination_status's rows through a
	 * table, with the pending rows by where they wait (qb_sql_pg.h's
	 * QB_PG_Q_OVERVIEW says which)
	 */
	[QB_Q_OVERVIEW] = {.sql =
		"DECLARE @now FLOAT = queuebox._epoch(SYSUTCDATETIME());"
		" DECLARE @d TABLE (destination NVARCHAR(200) COLLATE Latin1_General_100_BIN2, state NVARCHAR(40), failures INT,"
		"  opened_at DATETIME2(6), probe_at DATETIME2(6), paused_until DATETIME2(6),"
		"  last_error NVARCHAR(MAX), changed_at DATETIME2(6), pending BIGINT, held BIGINT);"
		" INSERT @d EXEC queuebox.destination_status;"
		" SELECT N'{\"destinations\" : ' + ISNULL((SELECT d.destination, d.state, d.failures,"
		"   CONVERT(NVARCHAR(33), d.opened_at, 127) + N'Z' AS opened_at,"
		"   CONVERT(NVARCHAR(33), d.probe_at, 127) + N'Z' AS probe_at,"
		"   CONVERT(NVARCHAR(33), d.paused_until, 127) + N'Z' AS paused_until, d.last_error,"
		"   CONVERT(NVARCHAR(33), d.changed_at, 127) + N'Z' AS changed_at, d.pending, d.held,"
		"   ISNULL(w.intake, 0) AS intake, ISNULL(w.retrying, 0) AS retrying, ISNULL(w.parked, 0) AS parked,"
		"   CAST(ISNULL(@now - queuebox._epoch(w.oldest), 0) AS DECIMAL(20, 6)) AS oldest_pending_sec"
		"   FROM @d d LEFT JOIN (SELECT n, SUM(intake) AS intake, SUM(retrying) AS retrying,"
		"     SUM(parked) AS parked, MIN(oldest) AS oldest"
		"    FROM (SELECT COALESCE(destination, queuebox.route_of(topic)) AS n, intake, retrying, parked, oldest"
		"     FROM (SELECT destination, topic,"
		"       COUNT_BIG(CASE WHEN hold = N'intake' OR (hold IS NULL AND destination IS NULL) THEN 1 END) AS intake,"
		"       COUNT_BIG(CASE WHEN hold IS NULL AND destination IS NOT NULL AND attempt > 0 THEN 1 END) AS retrying,"
		"       COUNT_BIG(CASE WHEN hold = N'key' THEN 1 END) AS parked, MIN(created_at) AS oldest"
		"      FROM queuebox.outbox WHERE state = N'pending' GROUP BY destination, topic) p) r"
		"    GROUP BY n) w ON w.n COLLATE Latin1_General_100_BIN2 = d.destination"
		"   ORDER BY d.destination FOR JSON PATH, INCLUDE_NULL_VALUES), N'[]')"
		"  + N', \"outbox\" : ' + " QBOQ_OVERVIEW_COUNTS("outbox")
		"  + N', \"inbox\" : ' + " QBOQ_OVERVIEW_COUNTS("inbox") " + N'}'",
	.nparams = 0},
	[QB_Q_OUTBOX_ROW] = {.sql = QBOQ_JSON(QBOQ_ID("id"), "queuebox.outbox_row @id"), .nparams = 1},
	[QB_Q_INBOX_ROW] = {.sql = QBOQ_JSON(QBOQ_ID("id"), "queuebox.inbox_row @id"), .nparams = 1},
	[QB_Q_INBOX_LOOKUP] = {.sql = QBOQ_JSON("DECLARE @s NVARCHAR(200) = ?; DECLARE @k NVARCHAR(400) = ?;",
											"queuebox.inbox_lookup @s, @k"),
	.nparams = 2},
	/* an unknown name is 50002 (not found): the route's 404 */
	[QB_Q_PAUSE_DESTINATION] = {.sql =
		"DECLARE @n NVARCHAR(200) = ?; " QBOQ_ID("seconds") QBOQ_ACTOR
		" DECLARE @until DATETIME2(6) = DATEADD(second, CAST(@seconds AS INT), SYSUTCDATETIME());"
		" DECLARE @r TABLE (p DATETIME2(6));"
		" INSERT @r EXEC queuebox.pause_destination @n, @until;" QBOQ_ACTOR_CLEAR
		" SELECT N'{\"paused_until\" : \"' + CONVERT(NVARCHAR(33), (SELECT p FROM @r), 127)"
		"        + N'Z\", \"known\" : true}'",
	.nparams = 3},
	[QB_Q_RESET_DESTINATION] = {.sql =
		"DECLARE @n NVARCHAR(200) = ?;" QBOQ_ACTOR " DECLARE @r TABLE (r BIT);"
		" INSERT @r EXEC queuebox.reset_destination @n;" QBOQ_ACTOR_CLEAR
		" SELECT N'{\"known\" : ' + " QBOQ_KNOWN
		"        + N', \"reset\" : ' + CASE WHEN (SELECT r FROM @r) = 1 THEN N'true' ELSE N'false' END + N'}'",
	.nparams = 2},
};

/* qb_odbc_query_text: see odbc_store.h. */
const char *
qb_odbc_query_text(QbQuery q, int *nparams)
{
	if ((int) q < 0 || q >= QB_NQUERIES)
	{
		*nparams = 0;
		return NULL;
	}
	*nparams = qboq_queries[q].nparams;
	return qboq_queries[q].sql;
}
