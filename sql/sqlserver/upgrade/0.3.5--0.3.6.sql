/*
 * sql/sqlserver/upgrade/0.3.5--0.3.6.sql
 *	  What changes from schema 0.3.5 to 0.3.6 on SQL Server (issue 38, chaos
 *	  with a checker: takeover on Babelfish), one section each below; T-SQL
 *	  batches split on GO.
 */

-- ---- takeover on Babelfish (issue 38) -------------------------------------
-- The claimers beat in claimer_beat, which _claimer_gone reads on Babelfish
-- (its APPLOCK_TEST of another session's lock crashes that server); SQL
-- Server keeps testing the applock.  A new, empty table; _claimer_gone
-- made again by DROP and CREATE (Babelfish does not ALTER a function); no
-- row is touched.  Rows claimed before the upgrade on Babelfish have no
-- claimer: their leases end them.
CREATE TABLE queuebox.claimer_beat (
	claimer			BIGINT NOT NULL CONSTRAINT claimer_beat_pkey PRIMARY KEY,
	alive_until		DATETIME2(6) NOT NULL
);
GO
DROP FUNCTION queuebox._claimer_gone;
GO
/*
 * _claimer_gone: is the claimer of a processing row gone?  On SQL Server
 * each claimer (a role's connection) holds the session applock
 * N'queuebox.claimer.<id>' for as long as it lives (sp_getapplock,
 * @LockOwner = 'Session'); the applock is free when no session holds it.
 * On Babelfish, whose APPLOCK_TEST of a lock another session holds crashes
 * the server, each claimer beats instead (_claimer_beat): it is gone when
 * its claimer_beat row is missing or its alive_until has passed.  @own is
 * the caller's claimer: its own rows are never gone.  NULL (no claimer):
 * never gone.
 */
CREATE FUNCTION queuebox._claimer_gone(@claimer BIGINT, @own BIGINT)
RETURNS BIT
AS
BEGIN
	IF @claimer IS NULL OR @claimer = ISNULL(@own, 0)
		RETURN 0;
	IF SERVERPROPERTY('BabelfishVersion') IS NOT NULL
		RETURN CASE WHEN EXISTS (SELECT 1 FROM queuebox.claimer_beat b
								 WHERE b.claimer = @claimer AND b.alive_until >= SYSUTCDATETIME())
					THEN 0 ELSE 1 END;
	RETURN CASE WHEN APPLOCK_TEST(N'public', CONCAT(N'queuebox.claimer.', @claimer), N'Exclusive', N'Session') = 1
				THEN 1 ELSE 0 END;
END
GO

/*
 * _claimer_beat: a claimer's heartbeat on Babelfish (_claimer_gone): its
 * claimer_beat row says it is alive for @alive_ms from now.  @fresh = 1
 * registers an id just drawn: it answers 0 and writes nothing when the id
 * has a row already (another claimer's, alive or not: an id is never
 * taken over), after deleting the rows whose claimers are gone (no claim
 * can tell a missing row from a passed one).  @fresh = 0 beats (the row
 * made again if a peer deleted it while this claimer could not beat).
 * Answers 1 when the row is written.
 */
CREATE PROCEDURE queuebox._claimer_beat @claimer BIGINT, @alive_ms INT, @fresh BIT
AS
BEGIN
	SET NOCOUNT ON;
	SET XACT_ABORT ON;
	DECLARE @now DATETIME2(6) = SYSUTCDATETIME();

	IF @fresh = 1
	BEGIN
		DELETE FROM queuebox.claimer_beat WHERE alive_until < @now;
		IF EXISTS (SELECT 1 FROM queuebox.claimer_beat WHERE claimer = @claimer)
		BEGIN
			SELECT 0 AS written;
			RETURN;
		END
	END
	UPDATE queuebox.claimer_beat SET alive_until = DATEADD(ms, @alive_ms, @now) WHERE claimer = @claimer;
	IF @@ROWCOUNT = 0
		INSERT INTO queuebox.claimer_beat (claimer, alive_until) VALUES (@claimer, DATEADD(ms, @alive_ms, @now));
	SELECT 1 AS written;
END
GO

-- ---- the version ------------------------------------------------------------

DROP FUNCTION queuebox._schema_version;
GO
CREATE FUNCTION queuebox._schema_version() RETURNS NVARCHAR(50)
AS
BEGIN
	RETURN N'0.3.6';
END
GO
