/*
 * sql/sqlserver/upgrade/0.3.1--0.3.2.sql
 *	  What changes from schema 0.3.1 to 0.3.2 on SQL Server, as on
 *	  PostgreSQL (sql/schema/upgrade/0.3.1--0.3.2.sql):
 *	- resume_destination answers resumed 1 only when the destination was
 *	  holding rows: not closed, or paused until a time still ahead.  It
 *	  answered 1 for a closed destination with failures counted, or with a
 *	  pause whose time was over.  It still clears both.
 *	- outbox_stats names its per-state totals destination N'(all)' instead
 *	  of NULL.  The view is dropped and made again: a grant an operator
 *	  made on it goes with it (the schema makes none; docs/sqlserver.md).
 *
 * DROP and CREATE rather than ALTER, which Babelfish does not run for
 * functions; nothing is schema-bound to either, and the migration is one
 * transaction, so no caller sees them missing.
 */
DROP PROCEDURE queuebox.resume_destination;
GO
CREATE PROCEDURE queuebox.resume_destination @name NVARCHAR(200)
AS
BEGIN
	SET NOCOUNT ON;
	SET XACT_ABORT ON;
	DECLARE @held BIT = 0;
	DECLARE @own BIT = CASE WHEN @@TRANCOUNT = 0 THEN 1 ELSE 0 END;

	IF @own = 1
		BEGIN TRANSACTION;
	SELECT @held = CASE WHEN state <> N'closed' OR paused_until > SYSUTCDATETIME() THEN 1 ELSE 0 END
	FROM queuebox.destination_state WITH (UPDLOCK, ROWLOCK)
	WHERE destination = @name;
	UPDATE queuebox.destination_state
	SET state = N'closed', failures = 0, paused_until = NULL, probe_at = NULL, opened_at = NULL,
		changed_at = CASE WHEN state = N'closed' THEN changed_at ELSE SYSUTCDATETIME() END
	WHERE destination = @name
	  AND (state <> N'closed' OR failures > 0 OR paused_until IS NOT NULL);
	IF @own = 1
		COMMIT TRANSACTION;
	SELECT @held AS resumed;
END
GO
DROP VIEW queuebox.outbox_stats;
GO
CREATE VIEW queuebox.outbox_stats AS
	WITH per_topic AS (
		SELECT topic, destination, state, COUNT(*) AS n,
			   MIN(CASE WHEN state = N'pending' THEN created_at END) AS oldest_pending
		FROM queuebox.outbox
		GROUP BY topic, destination, state),
	routed AS (
		SELECT COALESCE(destination, queuebox.route_of(topic), N'(no route)') AS destination,
			   state, n, oldest_pending
		FROM per_topic)
	SELECT CASE WHEN GROUPING(r.destination) = 1 THEN N'(all)' ELSE r.destination END AS destination,
		   r.state, CAST(SUM(r.n) AS BIGINT) AS [rows],
		   DATEDIFF(millisecond, MIN(r.oldest_pending), SYSUTCDATETIME()) / 1000.0 AS oldest_pending_age_s,
		   CASE WHEN GROUPING(r.destination) = 1 OR r.destination = N'(no route)' THEN NULL
				ELSE COALESCE(MIN(d.state), N'closed') END AS circuit
	FROM routed r LEFT JOIN queuebox.destination_state d ON d.destination = r.destination
	GROUP BY GROUPING SETS ((r.destination, r.state), (r.state));
GO
DROP FUNCTION queuebox._schema_version;
GO
CREATE FUNCTION queuebox._schema_version() RETURNS NVARCHAR(50)
AS
BEGIN
	RETURN N'0.3.2';
END
GO
