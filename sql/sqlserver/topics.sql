/*
 * sql/sqlserver/topics.sql
 *	  Topic patterns in T-SQL, as the daemon's routes match them
 *	  (src/common/lib/qb_route.c): the operator procedures filter by them and
 *	  destination_status routes unrouted rows with them.
 *
 * "*" is one segment (any text between dots, empty included), "**" any
 * number of segments, zero included; any other segment matches itself,
 * case included.  A scalar function cannot raise an error, so
 * topic_matches answers NULL for a pattern the routes would refuse, and the
 * procedures that take a pattern ask _pattern_error first and THROW 50022
 * (the daemon reads 50022 as bad input, as PostgreSQL's SQLSTATE 22023).
 */

/* _pattern_error: why the routes would refuse the pattern, or NULL. */
CREATE FUNCTION queuebox._pattern_error(@pattern NVARCHAR(400)) RETURNS NVARCHAR(400)
AS
BEGIN
	DECLARE @segs TABLE (n INT PRIMARY KEY, s NVARCHAR(400));
	DECLARE @why NVARCHAR(400) = NULL;

	IF @pattern = N''
		RETURN N'the pattern is empty; use "**" to match every topic';
	INSERT @segs (n, s)
		SELECT CAST([key] AS INT) + 1, [value]
		FROM OPENJSON(N'["' + REPLACE(STRING_ESCAPE(@pattern, 'json'), N'.', N'","') + N'"]');
	SELECT TOP (1) @why = CASE
			WHEN s = N'' THEN CONCAT(N'segment ', n, N' is empty (a leading, trailing or doubled dot); segments are separated by single dots, e.g. "orders.*.created"')
			WHEN PATINDEX(N'%[' + NCHAR(1) + N'-' + NCHAR(32) + NCHAR(127) + N']%', s COLLATE Latin1_General_BIN2) > 0
				THEN CONCAT(N'segment ', n, N' contains a space or a control character')
			ELSE CONCAT(N'segment ', n, N' "', LEFT(s, 40), N'" mixes ''*'' with other text: a wildcard is a whole segment, "*" for one segment or "**" for any number') END
	FROM @segs
	WHERE s = N''
	   OR PATINDEX(N'%[' + NCHAR(1) + N'-' + NCHAR(32) + NCHAR(127) + N']%', s COLLATE Latin1_General_BIN2) > 0
	   OR (s NOT IN (N'*', N'**') AND CHARINDEX(N'*', s) > 0)
	ORDER BY n;
	RETURN @why;
END
GO

/*
 * topic_matches: 1 when the topic matches the pattern, 0 when not, NULL
 * when either is NULL or the pattern is refused.  One row of the usual
 * wildcard table per pattern segment: @row holds, for each prefix of the
 * topic's segments, whether the pattern's segments so far match it.  An
 * empty topic has no segment, so only a pattern made of "**" matches it.
 */
CREATE FUNCTION queuebox.topic_matches(@pattern NVARCHAR(400), @topic NVARCHAR(400)) RETURNS BIT
AS
BEGIN
	DECLARE @t TABLE (j INT PRIMARY KEY, s NVARCHAR(400));
	DECLARE @p TABLE (i INT PRIMARY KEY, s NVARCHAR(400));
	DECLARE @n INT, @np INT, @i INT = 1, @j INT, @seg NVARCHAR(400), @row VARCHAR(402),
			@new VARCHAR(402), @c CHAR(1);

	IF @pattern IS NULL OR @topic IS NULL OR queuebox._pattern_error(@pattern) IS NOT NULL
		RETURN NULL;
	IF @topic <> N''
		INSERT @t (j, s)
			SELECT CAST([key] AS INT) + 1, [value]
			FROM OPENJSON(N'["' + REPLACE(STRING_ESCAPE(@topic, 'json'), N'.', N'","') + N'"]');
	INSERT @p (i, s)
		SELECT CAST([key] AS INT) + 1, [value]
		FROM OPENJSON(N'["' + REPLACE(STRING_ESCAPE(@pattern, 'json'), N'.', N'","') + N'"]');
	SELECT @n = COUNT(*) FROM @t;
	SELECT @np = COUNT(*) FROM @p;
	SET @row = '1' + REPLICATE('0', @n);
	WHILE @i <= @np
	BEGIN
		SELECT @seg = s FROM @p WHERE i = @i;
		SET @new = '';
		SET @j = 0;
		WHILE @j <= @n
		BEGIN
			IF @seg = N'**'
				SET @c = CASE WHEN SUBSTRING(@row, @j + 1, 1) = '1'
								OR (@j > 0 AND SUBSTRING(@new, @j, 1) = '1') THEN '1' ELSE '0' END;
			ELSE IF @j = 0
				SET @c = '0';
			ELSE
				SET @c = CASE WHEN SUBSTRING(@row, @j, 1) = '1'
								AND (@seg = N'*'
									 OR EXISTS (SELECT 1 FROM @t WHERE j = @j
												AND CAST(s AS VARBINARY(800)) = CAST(@seg AS VARBINARY(800))))
							  THEN '1' ELSE '0' END;
			SET @new = @new + @c;
			SET @j = @j + 1;
		END
		SET @row = @new;
		SET @i = @i + 1;
	END
	RETURN CASE WHEN RIGHT(@row, 1) = '1' THEN 1 ELSE 0 END;
END
GO

/*
 * route_of: the destination of the first route of the configuration that
 * matches; of a route with several destinations (fan-out), every one of
 * them, joined by ", ".
 */
CREATE FUNCTION queuebox.route_of(@topic NVARCHAR(400)) RETURNS NVARCHAR(4000)
AS
BEGIN
	RETURN (SELECT TOP (1) r.destination FROM queuebox.config_route r
			WHERE queuebox.topic_matches(r.pattern, @topic) = 1
			ORDER BY r.position);
END
GO

/*
 * outbox_fanout: a row whose topic's first route has several destinations
 * (fan-out) is marked at insert (origin = its id), so the first claim
 * copies it whatever its key's order, and each copy then waits at its own
 * destination (docs/design/claim.md, "One key, several destinations"), as
 * the PostgreSQL triggers do.  A row inserted routed (a replay of one
 * delivery) or a copy is left as it is.  Without a fan-out route in the
 * configuration it reads one row of config_route at most and returns; with
 * one, each distinct topic of the statement is matched once.  A row
 * inserted before its route fanned out is copied all the same, only after
 * its key's earlier rows everywhere.  An AFTER trigger, as outbox_trace:
 * the rows keep their SCOPE_IDENTITY().  On Babelfish, where a trigger
 * runs with its caller's rights, a writer needs SELECT on config_route
 * and EXECUTE on topic_matches and _pattern_error, which roles.sql grants
 * queuebox_writer.
 */
CREATE TRIGGER queuebox.outbox_fanout ON queuebox.outbox AFTER INSERT
AS
BEGIN
	SET NOCOUNT ON;
	DECLARE @fan TABLE (topic NVARCHAR(400) COLLATE Latin1_General_100_BIN2 PRIMARY KEY);

	IF NOT EXISTS (SELECT 1 FROM queuebox.config_route WHERE fanout = 1)
		RETURN;
	INSERT @fan (topic)
		SELECT t.topic FROM (SELECT DISTINCT i.topic FROM inserted i
							 WHERE i.destination IS NULL AND i.origin IS NULL) t
		WHERE (SELECT TOP (1) r.fanout FROM queuebox.config_route r
			   WHERE queuebox.topic_matches(r.pattern, t.topic) = 1
			   ORDER BY r.position) = 1;
	IF @@ROWCOUNT = 0
		RETURN;
	UPDATE o SET origin = o.id
	FROM queuebox.outbox o JOIN inserted i ON i.id = o.id JOIN @fan f ON f.topic = i.topic
	WHERE i.destination IS NULL AND i.origin IS NULL;
END
GO
