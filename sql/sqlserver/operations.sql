/*
 * sql/sqlserver/operations.sql
 *	  What operators run on SQL Server: requeue and replay, the destinations'
 *	  circuits, the stats view and the schema version, as on PostgreSQL
 *	  (sql/schema/functions.sql).  T-SQL has no overloading, so each
 *	  by-filter form has a name of its own (..._matching).
 *
 * Each procedure is one statement's worth of work and returns one result
 * row; run it in a transaction of its own (EXEC in autocommit is one).
 * Filters: NULL means any; @since and @until bound created_at (UTC),
 * @until excluded.  A pattern the routes would refuse raises 50022.
 */

/*
 * requeue_outbox: a dead row back to pending, due now, attempts reset,
 * routed again; a row of a route with several destinations (origin set)
 * goes back to its own destination only (routed again, the others would
 * have it twice).  Recorded in outbox_audit (a requeue, the payload
 * unchanged).
 */
CREATE PROCEDURE queuebox.requeue_outbox @id BIGINT
AS
BEGIN
	SET NOCOUNT ON;
	SET XACT_ABORT ON;
	DECLARE @own BIT = CASE WHEN @@TRANCOUNT = 0 THEN 1 ELSE 0 END;
	DECLARE @n INT;

	IF @own = 1
		BEGIN TRANSACTION;
	UPDATE queuebox.outbox
	SET state = N'pending', attempt = 0, scheduled_at = SYSUTCDATETIME(), claim_token = NULL,
		lease_until = NULL, destination = CASE WHEN origin IS NOT NULL THEN destination END,
		hold = CASE WHEN origin IS NULL OR destination IS NULL THEN N'ready' END
	WHERE id = @id AND state = N'dead';
	SET @n = @@ROWCOUNT;
	IF @n = 1
		INSERT queuebox.outbox_audit (outbox_id, action) VALUES (@id, N'requeue');
	IF @own = 1
		COMMIT TRANSACTION;
	SELECT CAST(CASE WHEN @n = 1 THEN 1 ELSE 0 END AS BIT) AS requeued;
END
GO

/*
 * requeue_outbox_matching: each dead row matching the filters, audited one
 * by one (a fan-out row to its own destination, as requeue_outbox).  The rows are read under UPDLOCK first (no OUTPUT: engine.sql
 * says why), so the update and the audit name the same rows.
 */
CREATE PROCEDURE queuebox.requeue_outbox_matching @topic_pattern NVARCHAR(400) = NULL,
	@since DATETIME2(6) = NULL, @until DATETIME2(6) = NULL
AS
BEGIN
	SET NOCOUNT ON;
	SET XACT_ABORT ON;
	DECLARE @own BIT = CASE WHEN @@TRANCOUNT = 0 THEN 1 ELSE 0 END;
	DECLARE @why NVARCHAR(400) = queuebox._pattern_error(@topic_pattern);
	DECLARE @msg NVARCHAR(2048);
	DECLARE @ids TABLE (id BIGINT PRIMARY KEY);
	DECLARE @n INT;

	IF @why IS NOT NULL
	BEGIN
		SET @msg = CONCAT(N'invalid topic pattern "', @topic_pattern, N'": ', @why);
		THROW 50022, @msg, 1;
	END
	IF @own = 1
		BEGIN TRANSACTION;
	INSERT @ids (id)
		SELECT id FROM queuebox.outbox WITH (UPDLOCK, ROWLOCK)
		WHERE state = N'dead'
		  AND (@topic_pattern IS NULL OR queuebox.topic_matches(@topic_pattern, topic) = 1)
		  AND (@since IS NULL OR created_at >= @since)
		  AND (@until IS NULL OR created_at < @until);
	UPDATE o
	SET state = N'pending', attempt = 0, scheduled_at = SYSUTCDATETIME(), claim_token = NULL,
		lease_until = NULL, destination = CASE WHEN o.origin IS NOT NULL THEN o.destination END,
		hold = CASE WHEN o.origin IS NULL OR o.destination IS NULL THEN N'ready' END
	FROM queuebox.outbox o JOIN @ids r ON r.id = o.id
	WHERE o.state = N'dead';
	SET @n = @@ROWCOUNT;
	INSERT queuebox.outbox_audit (outbox_id, action)
		SELECT o.id, N'requeue' FROM @ids r JOIN queuebox.outbox o ON o.id = r.id
		WHERE o.state = N'pending' ORDER BY o.id;
	IF @own = 1
		COMMIT TRANSACTION;
	SELECT CAST(@n AS BIGINT) AS requeued;
END
GO

/*
 * requeue_outbox_edited: requeue_outbox with the payload replaced (a
 * fan-out row to its own destination; onDead:
 * holdKey: the rows held behind it follow it, in order).  The edit is
 * recorded in outbox_audit: who (queuebox._actor(): the admin route, else the login), when, the payload before
 * and after.  A payload that is not JSON raises 50023, nothing changed.
 */
CREATE PROCEDURE queuebox.requeue_outbox_edited @id BIGINT, @payload NVARCHAR(MAX)
AS
BEGIN
	SET NOCOUNT ON;
	SET XACT_ABORT ON;
	DECLARE @own BIT = CASE WHEN @@TRANCOUNT = 0 THEN 1 ELSE 0 END;
	DECLARE @before NVARCHAR(MAX);
	DECLARE @n INT = 0;

	IF @payload IS NULL OR ISJSON(N'[' + @payload + N']') <> 1
		THROW 50023, N'the payload is not JSON; pass the edited payload as JSON text, e.g. {"amount": 10}', 1;
	IF @own = 1
		BEGIN TRANSACTION;
	-- the payload before, under the lock the update keeps (no OUTPUT: engine.sql says why)
	SELECT @before = payload FROM queuebox.outbox WITH (UPDLOCK, ROWLOCK)
	WHERE id = @id AND state = N'dead';
	IF @@ROWCOUNT = 1
	BEGIN
		UPDATE queuebox.outbox
		SET state = N'pending', attempt = 0, scheduled_at = SYSUTCDATETIME(), claim_token = NULL,
			lease_until = NULL, destination = CASE WHEN origin IS NOT NULL THEN destination END,
			hold = CASE WHEN origin IS NULL OR destination IS NULL THEN N'ready' END, payload = @payload
		WHERE id = @id AND state = N'dead';
		SET @n = @@ROWCOUNT;
		INSERT queuebox.outbox_audit (outbox_id, action, payload_before, payload_after)
			VALUES (@id, N'requeue', @before, @payload);
	END
	IF @own = 1
		COMMIT TRANSACTION;
	SELECT CAST(CASE WHEN @n = 1 THEN 1 ELSE 0 END AS BIT) AS requeued;
END
GO

/*
 * skip_outbox: a dead row that holds its key (onDead: holdKey) lets it
 * go: it stays dead, its hold is cleared (recorded in outbox_audit), and
 * the first open row it held back (of its key, at its destination or not
 * routed yet, by place: a key's order is kept per destination), when
 * parked, is released as a settle's promotion releases it, in a later
 * statement (the update waited for the claims parking rows behind it).
 * 0, nothing changed, for a row that is not dead and holding its key.
 */
CREATE PROCEDURE queuebox.skip_outbox @id BIGINT
AS
BEGIN
	SET NOCOUNT ON;
	SET XACT_ABORT ON;
	DECLARE @own BIT = CASE WHEN @@TRANCOUNT = 0 THEN 1 ELSE 0 END;
	DECLARE @key NVARCHAR(400);
	DECLARE @dest NVARCHAR(200);
	DECLARE @n INT = 0;

	IF @own = 1
		BEGIN TRANSACTION;
	SELECT @key = [key], @dest = destination FROM queuebox.outbox WITH (UPDLOCK, ROWLOCK)
	WHERE id = @id AND state = N'dead' AND hold = N'dead';
	IF @@ROWCOUNT = 1
	BEGIN
		UPDATE queuebox.outbox WITH (ROWLOCK)
		SET hold = NULL
		WHERE id = @id AND state = N'dead' AND hold = N'dead';
		SET @n = @@ROWCOUNT;
	END
	IF @n = 1
	BEGIN
		INSERT queuebox.outbox_audit (outbox_id, action) VALUES (@id, N'skip');
		UPDATE o
		SET hold = CASE WHEN o.destination IS NULL THEN N'ready' END
		FROM queuebox.outbox o WITH (ROWLOCK)
		WHERE o.id = (SELECT TOP (1) f.id FROM (
						  SELECT a.id, a.place FROM (SELECT TOP (1) e.id, e.place FROM queuebox.outbox e
													 WHERE e.[key] = @key AND e.destination = @dest
													   AND e.state IN (N'pending', N'processing')
													 ORDER BY e.place) a
						  UNION ALL
						  SELECT a.id, a.place FROM (SELECT TOP (1) e.id, e.place FROM queuebox.outbox e
													 WHERE e.[key] = @key AND e.destination = @dest
													   AND e.hold = N'dead'
													 ORDER BY e.place) a
						  UNION ALL
						  SELECT a.id, a.place FROM (SELECT TOP (1) e.id, e.place FROM queuebox.outbox e
													 WHERE e.[key] = @key AND e.destination IS NULL
													   AND e.state IN (N'pending', N'processing')
													 ORDER BY e.place) a
						  UNION ALL
						  SELECT a.id, a.place FROM (SELECT TOP (1) e.id, e.place FROM queuebox.outbox e
													 WHERE e.[key] = @key AND e.destination IS NULL
													   AND e.hold = N'dead'
													 ORDER BY e.place) a) f
					  ORDER BY f.place)
		  AND o.state = N'pending' AND o.hold = N'key';
	END
	IF @own = 1
		COMMIT TRANSACTION;
	SELECT CAST(CASE WHEN @n = 1 THEN 1 ELSE 0 END AS BIT) AS skipped;
END
GO

/*
 * held_keys: the keys whose first open row at a destination is dead and
 * holding them (onDead: holdKey) or retrying, with rows parked behind it
 * there (a key's order is kept per destination; rows not routed yet wait
 * for every destination): key, destination, head_id, head_state (dead |
 * retrying), behind, since (the oldest of them was created, UTC); at most
 * @limit, in key and destination order.
 */
CREATE PROCEDURE queuebox.held_keys @limit INT = 100
AS
BEGIN
	SET NOCOUNT ON;
	SELECT TOP (@limit) k.[key], h.destination, h.id AS head_id,
		   CASE WHEN h.state = N'dead' THEN N'dead' ELSE N'retrying' END AS head_state,
		   b.n AS behind, b.since
	FROM (SELECT DISTINCT o.[key], o.destination FROM queuebox.outbox o
		  WHERE o.state = N'pending' AND o.hold = N'key') k
	CROSS APPLY (SELECT TOP (1) e.id, e.state, e.attempt, e.destination, e.place FROM queuebox.outbox e
				 WHERE e.[key] = k.[key]
				   AND (k.destination IS NULL OR e.destination = k.destination OR e.destination IS NULL)
				   AND (e.state IN (N'pending', N'processing') OR e.hold = N'dead')
				 ORDER BY e.place) h
	CROSS APPLY (SELECT COUNT_BIG(*) AS n, MIN(e.created_at) AS since FROM queuebox.outbox e
				 WHERE e.[key] = k.[key]
				   AND (e.destination = k.destination OR (e.destination IS NULL AND k.destination IS NULL))
				   AND e.place > h.place AND e.state IN (N'pending', N'processing')) b
	WHERE h.state = N'dead' OR (h.state = N'pending' AND h.attempt > 0)
	ORDER BY k.[key], k.destination;
END
GO

-- ---------------------------------------------------------------------------
-- onDead: holdKey in the relay's aggregate order (inbox push rows; a
-- source's onDead): requeue_inbox_edited, skip_inbox, held_aggregates, the
-- counterparts of requeue_outbox_edited, skip_outbox and held_keys
-- ---------------------------------------------------------------------------
/*
 * requeue_inbox_edited: requeue_inbox with the payload replaced (the rows
 * held behind it follow it, in order), recorded in inbox_audit: who
 * (queuebox._actor()), when, the payload before and after.  A payload that is
 * not JSON raises 50023, nothing changed.
 */
CREATE PROCEDURE queuebox.requeue_inbox_edited @id BIGINT, @payload NVARCHAR(MAX)
AS
BEGIN
	SET NOCOUNT ON;
	SET XACT_ABORT ON;
	DECLARE @own BIT = CASE WHEN @@TRANCOUNT = 0 THEN 1 ELSE 0 END;
	DECLARE @before NVARCHAR(MAX);
	DECLARE @n INT = 0;

	IF @payload IS NULL OR ISJSON(N'[' + @payload + N']') <> 1
		THROW 50023, N'the payload is not JSON; pass the edited payload as JSON text, e.g. {"amount": 10}', 1;
	IF @own = 1
		BEGIN TRANSACTION;
	SELECT @before = payload FROM queuebox.inbox WITH (UPDLOCK, ROWLOCK)
	WHERE id = @id AND state = N'dead';
	IF @@ROWCOUNT = 1
	BEGIN
		UPDATE queuebox.inbox
		SET state = N'pending', attempt = 0, scheduled_at = SYSUTCDATETIME(), claim_token = NULL,
			lease_until = NULL, hold = NULL, payload = @payload
		WHERE id = @id AND state = N'dead';
		SET @n = @@ROWCOUNT;
		INSERT queuebox.inbox_audit (inbox_id, action, payload_before, payload_after)
			VALUES (@id, N'requeue', @before, @payload);
	END
	IF @own = 1
		COMMIT TRANSACTION;
	SELECT CAST(CASE WHEN @n = 1 THEN 1 ELSE 0 END AS BIT) AS requeued;
END
GO

/*
 * skip_inbox: a dead push row that holds its aggregate lets it go: it
 * stays dead, its hold is cleared (recorded in inbox_audit), and the
 * aggregate's first open push row, when pending, is released as the
 * relay's promotion releases it, in a later statement (the update waited
 * for the claims parking rows behind it).  0, nothing changed, for a row
 * that is not dead and holding.
 */
CREATE PROCEDURE queuebox.skip_inbox @id BIGINT
AS
BEGIN
	SET NOCOUNT ON;
	SET XACT_ABORT ON;
	DECLARE @own BIT = CASE WHEN @@TRANCOUNT = 0 THEN 1 ELSE 0 END;
	DECLARE @agg NVARCHAR(400);
	DECLARE @n INT = 0;

	IF @own = 1
		BEGIN TRANSACTION;
	SELECT @agg = aggregate_id FROM queuebox.inbox WITH (UPDLOCK, ROWLOCK)
	WHERE id = @id AND state = N'dead' AND hold = N'dead';
	IF @@ROWCOUNT = 1
	BEGIN
		UPDATE queuebox.inbox WITH (ROWLOCK)
		SET hold = NULL
		WHERE id = @id AND state = N'dead' AND hold = N'dead';
		SET @n = @@ROWCOUNT;
	END
	IF @n = 1
	BEGIN
		INSERT queuebox.inbox_audit (inbox_id, action) VALUES (@id, N'skip');
		UPDATE o SET hold = NULL
		FROM queuebox.inbox o WITH (ROWLOCK)
		WHERE o.state = N'pending'
		  AND o.id = (SELECT TOP (1) u.id FROM (
						  SELECT p.id, p.created_at FROM (
							  SELECT TOP (1) e.id, e.created_at FROM queuebox.inbox e
							  WHERE e.consumption = N'push' AND e.aggregate_id = @agg
								AND e.state IN (N'pending', N'processing')
							  ORDER BY e.created_at, e.id) p
						  UNION ALL
						  SELECT d.id, d.created_at FROM (
							  SELECT TOP (1) e.id, e.created_at FROM queuebox.inbox e
							  WHERE e.hold = N'dead' AND e.aggregate_id = @agg
							  ORDER BY e.created_at, e.id) d) u
					  ORDER BY u.created_at, u.id);
	END
	IF @own = 1
		COMMIT TRANSACTION;
	SELECT CAST(CASE WHEN @n = 1 THEN 1 ELSE 0 END AS BIT) AS skipped;
END
GO

/*
 * held_aggregates: the aggregates whose first open push row is dead and
 * holding them, with rows parked behind it: aggregate_id, source, head_id,
 * behind, since (the oldest of them was created, UTC); at most @limit, in
 * aggregate order.
 */
CREATE PROCEDURE queuebox.held_aggregates @limit INT = 100
AS
BEGIN
	SET NOCOUNT ON;
	SELECT TOP (@limit) a.aggregate_id, h.source, h.id AS head_id, b.n AS behind, b.since
	FROM (SELECT DISTINCT i.aggregate_id FROM queuebox.inbox i
		  WHERE i.state = N'pending' AND i.hold = N'aggregate' AND i.consumption = N'push'
			AND i.aggregate_id IS NOT NULL) a
	CROSS APPLY (SELECT TOP (1) e.id, e.source, e.created_at FROM queuebox.inbox e
				 WHERE e.hold = N'dead' AND e.aggregate_id = a.aggregate_id
				 ORDER BY e.created_at, e.id) h
	CROSS APPLY (SELECT COUNT_BIG(*) AS n, MIN(e.created_at) AS since FROM queuebox.inbox e
				 WHERE e.consumption = N'push' AND e.aggregate_id = a.aggregate_id
				   AND e.state IN (N'pending', N'processing')
				   AND (e.created_at > h.created_at OR (e.created_at = h.created_at AND e.id > h.id))) b
	WHERE NOT EXISTS (SELECT 1 FROM queuebox.inbox e
					  WHERE e.consumption = N'push' AND e.aggregate_id = a.aggregate_id
						AND e.state IN (N'pending', N'processing')
						AND (e.created_at < h.created_at OR (e.created_at = h.created_at AND e.id < h.id)))
	ORDER BY a.aggregate_id;
END
GO

/*
 * replay_outbox: a new pending row with the same content and a new
 * message_id; a row of a route with several destinations (origin set) is
 * replayed to its own destination only.  Its id, or NULL.
 */
CREATE PROCEDURE queuebox.replay_outbox @id BIGINT
AS
BEGIN
	SET NOCOUNT ON;
	DECLARE @n INT;

	INSERT queuebox.outbox (topic, [key], payload, headers, max_attempts, destination)
	SELECT topic, [key], payload, headers, max_attempts, CASE WHEN origin IS NOT NULL THEN destination END
	FROM queuebox.outbox WHERE id = @id;
	SET @n = @@ROWCOUNT;
	SELECT CASE WHEN @n = 1 THEN CAST(SCOPE_IDENTITY() AS BIGINT) END AS id;
END
GO

/*
 * replay_outbox_matching: every row in @state (NULL: any) matching the
 * filters, in id order (a fan-out row to its own destination, as replay_outbox).
 */
CREATE PROCEDURE queuebox.replay_outbox_matching @state NVARCHAR(50) = NULL,
	@topic_pattern NVARCHAR(400) = NULL, @since DATETIME2(6) = NULL, @until DATETIME2(6) = NULL
AS
BEGIN
	SET NOCOUNT ON;
	DECLARE @why NVARCHAR(400) = queuebox._pattern_error(@topic_pattern);
	DECLARE @msg NVARCHAR(2048);
	DECLARE @n INT;

	IF @state IS NOT NULL AND @state NOT IN (N'pending', N'processing', N'sent', N'dead')
	BEGIN
		SET @msg = CONCAT(N'unknown outbox state "', LEFT(@state, 50), N'": use pending, processing, sent or dead');
		THROW 50022, @msg, 1;
	END
	IF @why IS NOT NULL
	BEGIN
		SET @msg = CONCAT(N'invalid topic pattern "', @topic_pattern, N'": ', @why);
		THROW 50022, @msg, 1;
	END
	INSERT queuebox.outbox (topic, [key], payload, headers, max_attempts, destination)
	SELECT topic, [key], payload, headers, max_attempts, CASE WHEN origin IS NOT NULL THEN destination END
	FROM queuebox.outbox
	WHERE (@state IS NULL OR state = @state)
	  AND (@topic_pattern IS NULL OR queuebox.topic_matches(@topic_pattern, topic) = 1)
	  AND (@since IS NULL OR created_at >= @since)
	  AND (@until IS NULL OR created_at < @until)
	ORDER BY id;
	SET @n = @@ROWCOUNT;
	SELECT CAST(@n AS BIGINT) AS replayed;
END
GO

/*
 * requeue_inbox: a dead row back to pending, unparked, attempts reset (a
 * row that held its aggregate is its first open row again); recorded in
 * inbox_audit (a requeue, the payload unchanged).
 */
CREATE PROCEDURE queuebox.requeue_inbox @id BIGINT
AS
BEGIN
	SET NOCOUNT ON;
	SET XACT_ABORT ON;
	DECLARE @own BIT = CASE WHEN @@TRANCOUNT = 0 THEN 1 ELSE 0 END;
	DECLARE @n INT;

	IF @own = 1
		BEGIN TRANSACTION;
	UPDATE queuebox.inbox
	SET state = N'pending', attempt = 0, scheduled_at = SYSUTCDATETIME(), claim_token = NULL,
		lease_until = NULL, hold = NULL
	WHERE id = @id AND state = N'dead';
	SET @n = @@ROWCOUNT;
	IF @n = 1
		INSERT queuebox.inbox_audit (inbox_id, action) VALUES (@id, N'requeue');
	IF @own = 1
		COMMIT TRANSACTION;
	SELECT CAST(CASE WHEN @n = 1 THEN 1 ELSE 0 END AS BIT) AS requeued;
END
GO

/* requeue_inbox_matching: as requeue_outbox_matching, for the inbox */
CREATE PROCEDURE queuebox.requeue_inbox_matching @source NVARCHAR(200) = NULL,
	@since DATETIME2(6) = NULL, @until DATETIME2(6) = NULL
AS
BEGIN
	SET NOCOUNT ON;
	SET XACT_ABORT ON;
	DECLARE @own BIT = CASE WHEN @@TRANCOUNT = 0 THEN 1 ELSE 0 END;
	DECLARE @ids TABLE (id BIGINT PRIMARY KEY);
	DECLARE @n INT;

	IF @own = 1
		BEGIN TRANSACTION;
	INSERT @ids (id)
		SELECT id FROM queuebox.inbox WITH (UPDLOCK, ROWLOCK)
		WHERE state = N'dead'
		  AND (@source IS NULL OR source = @source)
		  AND (@since IS NULL OR created_at >= @since)
		  AND (@until IS NULL OR created_at < @until);
	UPDATE i
	SET state = N'pending', attempt = 0, scheduled_at = SYSUTCDATETIME(), claim_token = NULL,
		lease_until = NULL, hold = NULL
	FROM queuebox.inbox i JOIN @ids r ON r.id = i.id
	WHERE i.state = N'dead';
	SET @n = @@ROWCOUNT;
	INSERT queuebox.inbox_audit (inbox_id, action)
		SELECT i.id, N'requeue' FROM @ids r JOIN queuebox.inbox i ON i.id = r.id
		WHERE i.state = N'pending' ORDER BY i.id;
	IF @own = 1
		COMMIT TRANSACTION;
	SELECT CAST(@n AS BIGINT) AS requeued;
END
GO

/*
 * destination_status: one row per destination of the configuration (and
 * any with a stored state): its circuit, why, and the rows waiting for it
 * (rows not routed yet count under their topic's route).
 */
CREATE PROCEDURE queuebox.destination_status
AS
BEGIN
	SET NOCOUNT ON;

	WITH names AS (
		SELECT name AS n FROM queuebox.config_destination
		UNION SELECT destination FROM queuebox.destination_state),
	per_topic AS (
		SELECT destination, topic, COUNT(*) AS pending,
			   SUM(CASE WHEN hold = N'destination' THEN 1 ELSE 0 END) AS held
		FROM queuebox.outbox WHERE state = N'pending'
		GROUP BY destination, topic),
	routed AS (
		SELECT COALESCE(destination, queuebox.route_of(topic)) AS n, pending, held FROM per_topic),
	waiting AS (
		SELECT n, CAST(SUM(pending) AS BIGINT) AS pending, CAST(SUM(held) AS BIGINT) AS held
		FROM routed GROUP BY n)
	SELECT names.n AS destination, COALESCE(d.state, N'closed') AS state,
		   COALESCE(d.failures, 0) AS failures, d.opened_at, d.probe_at, d.paused_until,
		   d.last_error, d.changed_at, COALESCE(w.pending, 0) AS pending, COALESCE(w.held, 0) AS held
	FROM names
	LEFT JOIN queuebox.destination_state d ON d.destination = names.n
	LEFT JOIN waiting w ON w.n = names.n
	ORDER BY names.n;
END
GO

/*
 * resume_destination: close a destination's circuit, clear its failures and
 * pause; resumed 1 when it was holding rows (not closed, or paused until a
 * time still ahead), 0 when it was simply closed.  The row is read under an
 * update lock first (no OUTPUT clause: engine.sql's banner), in the
 * caller's transaction or, outside one, its own.
 */
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

-- ---------------------------------------------------------------------------
-- Operations: the console's reads and destination actions (issue 25), as
-- on PostgreSQL (sql/schema/functions.sql, the same section)
-- ---------------------------------------------------------------------------
/* _json_text, _json_time: a value as JSON text, null for NULL (objects built as text) */
CREATE FUNCTION queuebox._json_text(@s NVARCHAR(MAX)) RETURNS NVARCHAR(MAX)
AS
BEGIN
	RETURN CASE WHEN @s IS NULL THEN N'null' ELSE N'"' + STRING_ESCAPE(@s, 'json') + N'"' END;
END
GO
CREATE FUNCTION queuebox._json_time(@t DATETIME2(6)) RETURNS NVARCHAR(40)
AS
BEGIN
	RETURN CASE WHEN @t IS NULL THEN N'null' ELSE N'"' + CONVERT(NVARCHAR(33), @t, 127) + N'Z"' END;
END
GO

/*
 * dead_outbox: one page of dead outbox rows, id ascending, as one JSON
 * text {"rows" : [...], "next_after" : id | null} (page).  The filters and
 * the bound are PostgreSQL's: the dead rows after @after through one
 * filtered index (@key, else @destination, else @topic, else none), at
 * most 10000 of them, the other filters tested on those; next_after is the
 * last row's id when the page is full, the last id examined when the bound
 * stopped it, else NULL.
 */
CREATE PROCEDURE queuebox.dead_outbox @destination NVARCHAR(200) = NULL, @topic NVARCHAR(400) = NULL,
	@key NVARCHAR(400) = NULL, @error NVARCHAR(400) = NULL, @since DATETIME2(6) = NULL,
	@until DATETIME2(6) = NULL, @after BIGINT = NULL, @page_size INT = 100
AS
BEGIN
	SET NOCOUNT ON;
	DECLARE @c TABLE (id BIGINT PRIMARY KEY);
	DECLARE @m TABLE (id BIGINT PRIMARY KEY);
	DECLARE @examined INT, @matched INT, @last BIGINT, @next BIGINT;

	IF @page_size IS NULL OR @page_size < 1 OR @page_size > 1000
		THROW 50022, N'page_size must be from 1 to 1000', 1;
	SET @after = ISNULL(@after, 0);
	IF @key IS NOT NULL
		INSERT @c SELECT TOP (10000) id FROM queuebox.outbox
		WHERE state = N'dead' AND [key] = @key AND id > @after ORDER BY [key], id;
	ELSE IF @destination IS NOT NULL
		INSERT @c SELECT TOP (10000) id FROM queuebox.outbox
		WHERE state = N'dead' AND destination = @destination AND id > @after ORDER BY destination, id;
	ELSE IF @topic IS NOT NULL
		INSERT @c SELECT TOP (10000) id FROM queuebox.outbox
		WHERE state = N'dead' AND topic = @topic AND id > @after ORDER BY topic, id;
	ELSE
		INSERT @c SELECT TOP (10000) id FROM queuebox.outbox
		WHERE state = N'dead' AND id > @after ORDER BY id;
	SET @examined = @@ROWCOUNT;
	SELECT @last = MAX(id) FROM @c;
	INSERT @m SELECT TOP (@page_size) o.id FROM @c c JOIN queuebox.outbox o ON o.id = c.id
	WHERE (@destination IS NULL OR o.destination = @destination) AND (@topic IS NULL OR o.topic = @topic)
	  AND (@key IS NULL OR o.[key] = @key)
	  AND (@error IS NULL OR CHARINDEX(LOWER(@error), LOWER(o.last_error)) > 0)
	  AND (@since IS NULL OR o.created_at >= @since) AND (@until IS NULL OR o.created_at < @until)
	ORDER BY o.id;
	SET @matched = @@ROWCOUNT;
	SET @next = CASE WHEN @matched = @page_size THEN (SELECT MAX(id) FROM @m)
					 WHEN @examined = 10000 THEN @last END;
	SELECT N'{"rows" : ' + ISNULL((
		SELECT o.id, LOWER(CONVERT(NVARCHAR(36), o.message_id)) AS message_id, o.topic, o.[key],
			   o.destination, o.attempt, o.max_attempts, o.last_error,
			   CONVERT(NVARCHAR(33), o.created_at, 127) + N'Z' AS created_at,
			   CAST(CASE WHEN o.hold = N'dead' THEN 1 ELSE 0 END AS BIT) AS holds_key
		FROM @m m JOIN queuebox.outbox o ON o.id = m.id ORDER BY o.id
		FOR JSON PATH, INCLUDE_NULL_VALUES), N'[]')
		+ N', "next_after" : ' + ISNULL(CAST(@next AS NVARCHAR(20)), N'null') + N'}' AS page;
END
GO

/* dead_inbox: as dead_outbox, through @source's filtered index when given. */
CREATE PROCEDURE queuebox.dead_inbox @source NVARCHAR(200) = NULL, @event_type NVARCHAR(400) = NULL,
	@idempotency_key NVARCHAR(400) = NULL, @aggregate_id NVARCHAR(400) = NULL,
	@error NVARCHAR(400) = NULL, @since DATETIME2(6) = NULL, @until DATETIME2(6) = NULL,
	@after BIGINT = NULL, @page_size INT = 100
AS
BEGIN
	SET NOCOUNT ON;
	DECLARE @c TABLE (id BIGINT PRIMARY KEY);
	DECLARE @m TABLE (id BIGINT PRIMARY KEY);
	DECLARE @examined INT, @matched INT, @last BIGINT, @next BIGINT;

	IF @page_size IS NULL OR @page_size < 1 OR @page_size > 1000
		THROW 50022, N'page_size must be from 1 to 1000', 1;
	SET @after = ISNULL(@after, 0);
	IF @source IS NOT NULL
		INSERT @c SELECT TOP (10000) id FROM queuebox.inbox
		WHERE state = N'dead' AND source = @source AND id > @after ORDER BY source, id;
	ELSE
		INSERT @c SELECT TOP (10000) id FROM queuebox.inbox
		WHERE state = N'dead' AND id > @after ORDER BY id;
	SET @examined = @@ROWCOUNT;
	SELECT @last = MAX(id) FROM @c;
	INSERT @m SELECT TOP (@page_size) i.id FROM @c c JOIN queuebox.inbox i ON i.id = c.id
	WHERE (@event_type IS NULL OR i.event_type = @event_type)
	  AND (@idempotency_key IS NULL OR i.idempotency_key = @idempotency_key)
	  AND (@aggregate_id IS NULL OR i.aggregate_id = @aggregate_id)
	  AND (@error IS NULL OR CHARINDEX(LOWER(@error), LOWER(i.last_error)) > 0)
	  AND (@since IS NULL OR i.created_at >= @since) AND (@until IS NULL OR i.created_at < @until)
	ORDER BY i.id;
	SET @matched = @@ROWCOUNT;
	SET @next = CASE WHEN @matched = @page_size THEN (SELECT MAX(id) FROM @m)
					 WHEN @examined = 10000 THEN @last END;
	SELECT N'{"rows" : ' + ISNULL((
		SELECT i.id, i.source, i.idempotency_key, i.event_type, i.aggregate_id, i.consumption,
			   i.attempt, i.last_error, CONVERT(NVARCHAR(33), i.created_at, 127) + N'Z' AS created_at
		FROM @m m JOIN queuebox.inbox i ON i.id = m.id ORDER BY i.id
		FOR JSON PATH, INCLUDE_NULL_VALUES), N'[]')
		+ N', "next_after" : ' + ISNULL(CAST(@next AS NVARCHAR(20)), N'null') + N'}' AS page;
END
GO

/*
 * outbox_row: the whole outbox row as one JSON text (row), payload and
 * headers as they are stored, with its audit rows oldest first and, for a
 * row of a route with several destinations, every delivery of its message
 * (deliveries: id, destination, state, by id; null otherwise); no row
 * when there is none.  Built as text: a payload may be any JSON, which
 * JSON_QUERY does not take.
 */
CREATE PROCEDURE queuebox.outbox_row @id BIGINT
AS
BEGIN
	SET NOCOUNT ON;
	SELECT N'{"id" : ' + CAST(o.id AS NVARCHAR(20))
		+ N', "message_id" : "' + LOWER(CONVERT(NVARCHAR(36), o.message_id)) + N'"'
		+ N', "topic" : ' + queuebox._json_text(o.topic) + N', "key" : ' + queuebox._json_text(o.[key])
		+ N', "destination" : ' + queuebox._json_text(o.destination)
		+ N', "state" : ' + queuebox._json_text(o.state) + N', "hold" : ' + queuebox._json_text(o.hold)
		+ N', "attempt" : ' + CAST(o.attempt AS NVARCHAR(20))
		+ N', "max_attempts" : ' + ISNULL(CAST(o.max_attempts AS NVARCHAR(20)), N'null')
		+ N', "scheduled_at" : ' + queuebox._json_time(o.scheduled_at)
		+ N', "created_at" : ' + queuebox._json_time(o.created_at)
		+ N', "last_error" : ' + queuebox._json_text(o.last_error)
		+ N', "payload" : ' + o.payload + N', "headers" : ' + o.headers
		+ N', "deliveries" : ' + ISNULL((
			SELECT N'[' + STRING_AGG(CAST(N'{"id" : ' + CAST(c.id AS NVARCHAR(20))
				+ N', "destination" : ' + queuebox._json_text(c.destination)
				+ N', "state" : ' + queuebox._json_text(c.state) + N'}' AS NVARCHAR(MAX)), N', ')
				WITHIN GROUP (ORDER BY c.id) + N']'
			FROM queuebox.outbox c WHERE c.origin = o.origin), N'null')
		+ N', "audit" : [' + ISNULL((
			SELECT STRING_AGG(CAST(N'{"action" : ' + queuebox._json_text(a.action)
				+ N', "done_by" : ' + queuebox._json_text(a.done_by)
				+ N', "done_at" : ' + queuebox._json_time(a.done_at)
				+ N', "payload_before" : ' + ISNULL(a.payload_before, N'null')
				+ N', "payload_after" : ' + ISNULL(a.payload_after, N'null') + N'}' AS NVARCHAR(MAX)), N', ')
				WITHIN GROUP (ORDER BY a.id)
			FROM queuebox.outbox_audit a WHERE a.outbox_id = o.id), N'') + N']}' AS [row]
	FROM queuebox.outbox o WHERE o.id = @id;
END
GO

/* inbox_row: the whole inbox row as one JSON text (row); no row when none. */
CREATE PROCEDURE queuebox.inbox_row @id BIGINT
AS
BEGIN
	SET NOCOUNT ON;
	SELECT N'{"id" : ' + CAST(i.id AS NVARCHAR(20))
		+ N', "source" : ' + queuebox._json_text(i.source)
		+ N', "idempotency_key" : ' + queuebox._json_text(i.idempotency_key)
		+ N', "event_type" : ' + queuebox._json_text(i.event_type)
		+ N', "aggregate_id" : ' + queuebox._json_text(i.aggregate_id)
		+ N', "consumption" : ' + queuebox._json_text(i.consumption)
		+ N', "state" : ' + queuebox._json_text(i.state) + N', "hold" : ' + queuebox._json_text(i.hold)
		+ N', "attempt" : ' + CAST(i.attempt AS NVARCHAR(20))
		+ N', "scheduled_at" : ' + queuebox._json_time(i.scheduled_at)
		+ N', "created_at" : ' + queuebox._json_time(i.created_at)
		+ N', "last_error" : ' + queuebox._json_text(i.last_error)
		+ N', "payload" : ' + i.payload + N', "headers" : ' + i.headers + N'}' AS [row]
	FROM queuebox.inbox i WHERE i.id = @id;
END
GO

/* inbox_lookup: inbox_row of the row from @source under @idempotency_key. */
CREATE PROCEDURE queuebox.inbox_lookup @source NVARCHAR(200), @idempotency_key NVARCHAR(400)
AS
BEGIN
	SET NOCOUNT ON;
	DECLARE @id BIGINT = (SELECT id FROM queuebox.inbox
						  WHERE source = @source AND idempotency_key = @idempotency_key);
	IF @id IS NOT NULL
		EXEC queuebox.inbox_row @id;
END
GO

/*
 * pause_destination: nothing goes to @name before @until (UTC), as a 429's
 * Retry-After pauses it; its circuit and failures stay.  A later pause
 * replaces an earlier one; resume_destination ends it.  Returns
 * paused_until.  50002 for a name the configuration does not have.
 */
CREATE PROCEDURE queuebox.pause_destination @name NVARCHAR(200), @until DATETIME2(6)
AS
BEGIN
	SET NOCOUNT ON;
	SET XACT_ABORT ON;
	DECLARE @own BIT = CASE WHEN @@TRANCOUNT = 0 THEN 1 ELSE 0 END;

	IF @until IS NULL
		THROW 50022, N'pause_destination needs a time to pause until', 1;
	IF NOT EXISTS (SELECT 1 FROM queuebox.config_destination WHERE name = @name)
		THROW 50002, N'no destination of this name in the configuration', 1;
	IF @own = 1
		BEGIN TRANSACTION;
	UPDATE queuebox.destination_state
	SET paused_until = @until WHERE destination = @name;
	IF @@ROWCOUNT = 0
		INSERT queuebox.destination_state (destination, paused_until) VALUES (@name, @until);
	IF @own = 1
		COMMIT TRANSACTION;
	SELECT @until AS paused_until;
END
GO

/*
 * reset_destination: close @name's circuit and clear its failures, keeping
 * a pause; reset 1 when it changed something.
 */
CREATE PROCEDURE queuebox.reset_destination @name NVARCHAR(200)
AS
BEGIN
	SET NOCOUNT ON;
	DECLARE @n INT;

	UPDATE queuebox.destination_state
	SET state = N'closed', failures = 0, probe_at = NULL, opened_at = NULL,
		changed_at = CASE WHEN state = N'closed' THEN changed_at ELSE SYSUTCDATETIME() END
	WHERE destination = @name AND (state <> N'closed' OR failures > 0);
	SET @n = @@ROWCOUNT;
	SELECT CAST(CASE WHEN @n = 1 THEN 1 ELSE 0 END AS BIT) AS reset;
END
GO

/*
 * outbox_stats: rows per (destination, state) plus a total per state
 * (destination N'(all)'), with the age of the oldest pending row in seconds
 * and the destination's circuit.
 */
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

/*
 * _utc: an ISO 8601 time (with an offset or Z; none: UTC) as DATETIME2 in
 * UTC, NULL for NULL.  A malformed time fails with a conversion error (241).
 */
CREATE FUNCTION queuebox._utc(@t NVARCHAR(64)) RETURNS DATETIME2(6)
AS
BEGIN
	RETURN CAST(SWITCHOFFSET(CONVERT(DATETIMEOFFSET(6), @t), 0) AS DATETIME2(6));
END
GO

/* The schema version the engines check before they claim. */
CREATE FUNCTION queuebox._schema_version() RETURNS NVARCHAR(50)
AS
BEGIN
	RETURN N'@SCHEMA_VERSION@';
END
GO
