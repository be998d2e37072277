/*
 * sql/sqlserver/upgrade/0.3.7--0.3.8.sql
 *	  What changes from schema 0.3.7 to 0.3.8 on SQL Server (issue 39; what
 *	  the features add follows), one section each below: the version; limits
 *	  across the daemon's replicas (two tables, empty until a daemon takes a
 *	  limit, and _limits_take).  T-SQL batches split on GO.
 */

-- ---- the version ------------------------------------------------------------

DROP FUNCTION queuebox._schema_version;
GO
CREATE FUNCTION queuebox._schema_version() RETURNS NVARCHAR(50)
AS
BEGIN
	RETURN N'0.3.8';
END
GO

-- ---- limits across replicas (issue 39: rateLimit, maxConcurrent) ----------
-- The same as a fresh install's (sql/sqlserver/tables.sql; engine.sql's _limits_take).
-- The destinations' limits (rateLimit, maxConcurrent) every replica on this
-- database shares (docs/delivery.md, "Limits"): a destination's token
-- bucket, and the places each claimer holds.  Written by _limits_take alone
-- (engine.sql), which locks a destination's bucket row before it reads or
-- writes either table.  A claimer's places count while _claimer_gone says
-- it lives (its applock; on Babelfish its beat), or until alive_until.
CREATE TABLE queuebox.destination_limit (
	destination		NVARCHAR(200) COLLATE Latin1_General_100_BIN2 NOT NULL CONSTRAINT destination_limit_pkey PRIMARY KEY,
	tokens			FLOAT NOT NULL,
	refilled_at		DATETIME2(6) NOT NULL
);
CREATE TABLE queuebox.destination_limit_place (
	destination		NVARCHAR(200) COLLATE Latin1_General_100_BIN2 NOT NULL,
	claimer			BIGINT NOT NULL,
	held			INT NOT NULL CONSTRAINT destination_limit_place_held_check CHECK (held >= 0),
	alive_until		DATETIME2(6) NULL,
	CONSTRAINT destination_limit_place_pkey PRIMARY KEY (destination, claimer)
);
GO

/*
 * _limits_take (QB_PG_LIMITS_TAKE): the destinations' limits across every
 * replica on this database (QbStore.limits_take; docs/delivery.md,
 * "Limits").
 *	@takes [{"n": destination, "r": perSecond (0: none), "b": burst,
 *	         "m": maxConcurrent (0: none), "h": the places the caller holds
 *	         in use, "g": tokens it gives back, "w": what it asks for}]
 *	@claimer: the caller's claimer (its places); @lease: > 0, its places
 *	          count for that many ms, else while _claimer_gone says it lives
 * One result set: destination, got, wait_ms (in how many ms a token comes
 * when tokens cut it; -1: places did, or it got all).  The bucket rows are
 * locked first (an UPDATE that changes nothing: UPDLOCK is ignored on
 * Babelfish), the places read only then, in later statements; two takes
 * that lock in another order are a deadlock the store runs again.  A new
 * bucket is full; a bucket not used for an hour is full again.
 */
CREATE PROCEDURE queuebox._limits_take @takes NVARCHAR(MAX), @claimer BIGINT, @lease BIGINT = 0
AS
BEGIN
	SET NOCOUNT ON;
	SET XACT_ABORT ON;
	DECLARE @now DATETIME2(6);
	DECLARE @t TABLE (destination NVARCHAR(200) COLLATE Latin1_General_100_BIN2 PRIMARY KEY,
					  per_sec FLOAT, burst INT, max_concurrent INT, held INT, give INT, want INT,
					  tokens FLOAT NULL, places INT NULL, got INT NULL);

	INSERT @t (destination, per_sec, burst, max_concurrent, held, give, want)
		SELECT n, r, b, m, h, g, w FROM OPENJSON(@takes)
		WITH (n NVARCHAR(200) '$.n', r FLOAT '$.r', b INT '$.b', m INT '$.m', h INT '$.h',
			  g INT '$.g', w INT '$.w');
	INSERT INTO queuebox.destination_limit (destination, tokens, refilled_at)
		SELECT t.destination, t.burst, SYSUTCDATETIME() FROM @t t
		WHERE NOT EXISTS (SELECT 1 FROM queuebox.destination_limit l WHERE l.destination = t.destination);
	UPDATE l SET tokens = l.tokens
	FROM queuebox.destination_limit l JOIN @t t ON t.destination = l.destination;
	SET @now = SYSUTCDATETIME();

	UPDATE t
	SET tokens = CASE WHEN l.refilled_at < DATEADD(hour, -1, @now)
						OR l.tokens + t.give + t.per_sec * DATEDIFF(ms, l.refilled_at, @now) / 1000.0 > t.burst
					  THEN t.burst
					  ELSE l.tokens + t.give + t.per_sec * DATEDIFF(ms, l.refilled_at, @now) / 1000.0 END
	FROM @t t JOIN queuebox.destination_limit l ON l.destination = t.destination
	WHERE t.per_sec > 0;
	UPDATE t
	SET places = t.max_concurrent - t.held - ISNULL((
		SELECT SUM(p.held) FROM queuebox.destination_limit_place p
		WHERE p.destination = t.destination AND p.claimer <> @claimer AND p.held > 0
		  AND 0 = CASE WHEN p.alive_until IS NULL THEN queuebox._claimer_gone(p.claimer, @claimer)
					   WHEN p.alive_until >= @now THEN 0 ELSE 1 END), 0)
	FROM @t t WHERE t.max_concurrent > 0;
	UPDATE @t SET got = want;
	UPDATE @t SET got = places WHERE places IS NOT NULL AND places < got;
	UPDATE @t SET got = FLOOR(tokens + 1e-9) WHERE per_sec > 0 AND FLOOR(tokens + 1e-9) < got;
	UPDATE @t SET got = 0 WHERE got < 0;

	UPDATE l SET tokens = t.tokens - t.got, refilled_at = @now
	FROM queuebox.destination_limit l JOIN @t t ON t.destination = l.destination
	WHERE t.per_sec > 0;
	DELETE p FROM queuebox.destination_limit_place p JOIN @t t ON t.destination = p.destination
	WHERE p.claimer <> @claimer
	  AND 1 = CASE WHEN p.alive_until IS NULL THEN queuebox._claimer_gone(p.claimer, @claimer)
				   WHEN p.alive_until < @now THEN 1 ELSE 0 END;
	UPDATE p SET held = t.held + t.got,
		alive_until = CASE WHEN @lease > 0 THEN DATEADD(ms, @lease, @now) END
	FROM queuebox.destination_limit_place p JOIN @t t ON t.destination = p.destination
	WHERE p.claimer = @claimer AND t.max_concurrent > 0;
	INSERT INTO queuebox.destination_limit_place (destination, claimer, held, alive_until)
		SELECT t.destination, @claimer, t.held + t.got, CASE WHEN @lease > 0 THEN DATEADD(ms, @lease, @now) END
		FROM @t t
		WHERE t.max_concurrent > 0
		  AND NOT EXISTS (SELECT 1 FROM queuebox.destination_limit_place p
						  WHERE p.destination = t.destination AND p.claimer = @claimer);
	SELECT destination, got,
		CASE WHEN got < want AND per_sec > 0 AND (places IS NULL OR got < places)
			 THEN CASE WHEN (1 - (tokens - got)) <= 0 THEN 0
					   ELSE CONVERT(INT, CEILING((1 - (tokens - got)) * 1000 / per_sec)) END
			 ELSE -1 END AS wait_ms
	FROM @t;
END
GO
