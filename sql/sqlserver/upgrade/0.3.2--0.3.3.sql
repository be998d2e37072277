/*
 * sql/sqlserver/upgrade/0.3.2--0.3.3.sql
 *	  What changes from schema 0.3.2 to 0.3.3 on SQL Server, as on
 *	  PostgreSQL (sql/schema/upgrade/0.3.2--0.3.3.sql):
 *	- outbox_parked_idx and _outbox_sweep: the outbox engine's sweep
 *	  releases a row parked behind its key when no earlier row of the key
 *	  is open.  A Babelfish engine ignores the shared lock a park is made
 *	  under, so a settle could end the earlier row and promote before the
 *	  park committed, and the row waited forever (docs/sqlserver.md).
 *	- _relay_claim and inbox_claim re-check their parks in a later
 *	  statement and release a row whose earlier row has ended by then: the
 *	  same race on the inbox, closed where it opens.
 *
 * The two claims are changed by ALTER PROCEDURE, which keeps what an
 * operator granted on them (GRANT EXECUTE ON queuebox.inbox_claim TO app,
 * docs/sqlserver.md); _schema_version by DROP and CREATE, as before
 * (Babelfish runs no ALTER FUNCTION).  One transaction: no caller sees
 * anything missing.
 */
CREATE INDEX outbox_parked_idx ON queuebox.outbox ([key], id)
	WHERE state = N'pending' AND hold = N'key';
GO
CREATE PROCEDURE queuebox._outbox_sweep @after NVARCHAR(400), @limit INT
AS
BEGIN
	SET NOCOUNT ON;
	SET XACT_ABORT ON;
	DECLARE @key NVARCHAR(400) = ISNULL(@after, N'');
	DECLARE @next NVARCHAR(400);
	DECLARE @id BIGINT;
	DECLARE @seen INT = 0;
	DECLARE @n INT;
	DECLARE @free TABLE (id BIGINT PRIMARY KEY);

	WHILE @seen < @limit
	BEGIN
		SET @id = NULL;
		-- the next key with parked rows, and its first parked row (@after itself first)
		SELECT TOP (1) @next = o.[key], @id = o.id
		FROM queuebox.outbox o
		WHERE o.state = N'pending' AND o.hold = N'key' AND o.[key] >= @key
		  AND (@seen = 0 OR o.[key] > @key)
		ORDER BY o.[key], o.id;
		IF @id IS NULL
			BREAK;
		SET @seen = @seen + 1;
		SET @key = @next;
		IF NOT EXISTS (SELECT 1 FROM queuebox.outbox e
					   WHERE e.[key] = @key AND e.id < @id AND e.state IN (N'pending', N'processing'))
			INSERT @free (id) VALUES (@id);
	END
	UPDATE o
	SET hold = CASE WHEN o.destination IS NULL THEN N'ready' END
	FROM queuebox.outbox o WITH (ROWLOCK, READPAST)
	JOIN @free f ON f.id = o.id
	WHERE o.state = N'pending' AND o.hold = N'key';
	SET @n = @@ROWCOUNT;
	SELECT @n AS released, CASE WHEN @seen = @limit THEN @key END AS next_key;
END
GO
ALTER PROCEDURE queuebox._relay_claim @batch INT, @lease BIGINT, @token UNIQUEIDENTIFIER
AS
BEGIN
	SET NOCOUNT ON;
	SET XACT_ABORT ON;
	DECLARE @now DATETIME2(6) = SYSUTCDATETIME();
	DECLARE @left INT;
	DECLARE @cand TABLE (id BIGINT PRIMARY KEY, aggregate_id NVARCHAR(400) COLLATE Latin1_General_100_BIN2,
						 created_at DATETIME2(6));
	DECLARE @blk TABLE (cid BIGINT PRIMARY KEY, bid BIGINT);
	DECLARE @lk TABLE (id BIGINT PRIMARY KEY);
	INSERT @cand (id, aggregate_id, created_at)
		SELECT TOP (@batch) c.id, c.aggregate_id, c.created_at
		FROM queuebox.inbox c WITH (ROWLOCK, READPAST, UPDLOCK)
		WHERE c.consumption = N'push' AND c.state = N'processing' AND c.lease_until < @now
		ORDER BY c.lease_until;
	SET @left = @batch - @@ROWCOUNT;
	IF @left > 0
		INSERT @cand (id, aggregate_id, created_at)
			SELECT TOP (@left) c.id, c.aggregate_id, c.created_at
			FROM queuebox.inbox c WITH (ROWLOCK, READPAST, UPDLOCK)
			WHERE c.consumption = N'push' AND c.state = N'pending' AND c.hold IS NULL
			  AND c.scheduled_at <= @now
			ORDER BY c.scheduled_at, c.created_at, c.id;
	INSERT @blk (cid, bid)
		SELECT c.id, b.id FROM @cand c
		CROSS APPLY (SELECT TOP (1) e.id FROM queuebox.inbox e
					 WHERE e.consumption = N'push' AND e.aggregate_id = c.aggregate_id
					   AND e.state IN (N'pending', N'processing')
					   AND (e.created_at < c.created_at OR (e.created_at = c.created_at AND e.id < c.id))
					 ORDER BY e.created_at DESC, e.id DESC) b
		WHERE c.aggregate_id IS NOT NULL;
	INSERT @lk (id)
		SELECT e.id FROM queuebox.inbox e WITH (ROWLOCK, READPAST, REPEATABLEREAD)
		WHERE e.id IN (SELECT bid FROM @blk) AND e.state IN (N'pending', N'processing');

	-- a candidate whose earlier row is locked elsewhere is left as it is
	UPDATE i
	SET state = CASE WHEN b.cid IS NULL THEN N'processing' ELSE N'pending' END,
		hold = CASE WHEN b.cid IS NULL THEN NULL ELSE N'aggregate' END,
		claim_token = CASE WHEN b.cid IS NULL THEN @token END,
		lease_until = CASE WHEN b.cid IS NULL THEN queuebox._after(@now, @lease) END
	FROM queuebox.inbox i
	JOIN @cand c ON c.id = i.id
	LEFT JOIN @blk b ON b.cid = c.id
	WHERE (b.cid IS NULL OR b.bid IN (SELECT id FROM @lk))
	  AND ((i.state = N'pending' AND i.claim_token IS NULL)
		   OR (i.state = N'processing' AND i.lease_until < @now));
	/*
	 * The re-check, a statement after the park: a row parked behind an
	 * earlier row that has ended by now is released.  A Babelfish engine
	 * ignores the shared lock on the earlier row (@lk), so its end can
	 * commit while this claim parks; the end's promotion updates the
	 * unit's first open row whether parked or not, so either it waits for
	 * this claim and releases the park, or this claim's park waited for
	 * it, and this statement, reading after that commit, sees the row
	 * ended.  On SQL Server the lock makes it a no-op.
	 */
	UPDATE i SET hold = NULL
	FROM queuebox.inbox i JOIN @blk b ON b.cid = i.id
	WHERE i.state = N'pending' AND i.hold = N'aggregate'
	  AND NOT EXISTS (SELECT 1 FROM queuebox.inbox e
					  WHERE e.id = b.bid AND e.state IN (N'pending', N'processing'));
	-- what this claim took, by its token
	SELECT i.id, i.source, i.event_type
	FROM @cand c JOIN queuebox.inbox i ON i.id = c.id
	WHERE i.claim_token = @token AND i.state = N'processing'
	ORDER BY i.created_at, i.id;
END
GO
ALTER PROCEDURE queuebox.inbox_claim @source NVARCHAR(200), @batch_size INT, @lease_ms INT
AS
BEGIN
	SET NOCOUNT ON;
	SET XACT_ABORT ON;
	DECLARE @now DATETIME2(6);
	DECLARE @own BIT = CASE WHEN @@TRANCOUNT = 0 THEN 1 ELSE 0 END;
	DECLARE @lock INT;
	DECLARE @resource NVARCHAR(255) = N'queuebox.inbox_claim:' + @source;
	DECLARE @left INT;
	DECLARE @cand TABLE (id BIGINT PRIMARY KEY, aggregate_id NVARCHAR(400) COLLATE Latin1_General_100_BIN2,
						 created_at DATETIME2(6), token UNIQUEIDENTIFIER);
	DECLARE @blk TABLE (cid BIGINT PRIMARY KEY, bid BIGINT);
	DECLARE @lk TABLE (id BIGINT PRIMARY KEY);
	IF @source IS NULL OR @batch_size IS NULL OR @batch_size < 1 OR @lease_ms IS NULL OR @lease_ms < 1
		THROW 50022, N'queuebox.inbox_claim: @source, @batch_size (1 or more) and @lease_ms (1 or more) are required', 1;
	IF @own = 1
		BEGIN TRANSACTION;
	EXEC @lock = sp_getapplock @Resource = @resource, @LockMode = N'Exclusive',
		 @LockOwner = N'Transaction', @LockTimeout = 10000;
	IF @lock < 0
		THROW 51000, N'queuebox.inbox_claim: another claim of this source held its lock for 10 s; this is temporary: wait, then claim again (one source takes one claim at a time on SQL Server: split a busy source)', 1;
	SET @now = SYSUTCDATETIME();

	INSERT @cand (id, aggregate_id, created_at)
		SELECT TOP (@batch_size) c.id, c.aggregate_id, c.created_at
		FROM queuebox.inbox c WITH (ROWLOCK, READPAST, UPDLOCK)
		WHERE c.source = @source AND c.consumption = N'pull' AND c.state = N'processing'
		  AND c.lease_until < @now
		ORDER BY c.lease_until;
	SET @left = @batch_size - @@ROWCOUNT;
	IF @left > 0
		INSERT @cand (id, aggregate_id, created_at)
			SELECT TOP (@left) c.id, c.aggregate_id, c.created_at
			FROM queuebox.inbox c WITH (ROWLOCK, READPAST, UPDLOCK)
			WHERE c.source = @source AND c.consumption = N'pull' AND c.state = N'pending'
			  AND c.hold IS NULL AND c.scheduled_at <= @now
			ORDER BY c.scheduled_at, c.created_at, c.id;
	INSERT @blk (cid, bid)
		SELECT c.id, b.id FROM @cand c
		CROSS APPLY (SELECT TOP (1) e.id FROM queuebox.inbox e
					 WHERE e.source = @source AND e.aggregate_id = c.aggregate_id
					   AND e.state IN (N'pending', N'processing')
					   AND (e.created_at < c.created_at OR (e.created_at = c.created_at AND e.id < c.id))
					 ORDER BY e.created_at DESC, e.id DESC) b
		WHERE c.aggregate_id IS NOT NULL;
	INSERT @lk (id)
		SELECT e.id FROM queuebox.inbox e WITH (ROWLOCK, READPAST, REPEATABLEREAD)
		WHERE e.id IN (SELECT bid FROM @blk) AND e.state IN (N'pending', N'processing');

	-- each claimed row's new token, drawn first: what changed is read back by it
	UPDATE c SET token = CASE WHEN b.cid IS NULL THEN NEWID() END
	FROM @cand c LEFT JOIN @blk b ON b.cid = c.id;
	UPDATE i
	SET state = CASE WHEN c.token IS NOT NULL THEN N'processing' ELSE N'pending' END,
		hold = CASE WHEN c.token IS NOT NULL THEN NULL ELSE N'aggregate' END,
		claim_token = c.token,
		lease_until = CASE WHEN c.token IS NOT NULL THEN queuebox._after(@now, @lease_ms) END
	FROM queuebox.inbox i
	JOIN @cand c ON c.id = i.id
	LEFT JOIN @blk b ON b.cid = c.id
	WHERE (b.cid IS NULL OR b.bid IN (SELECT id FROM @lk))
	  AND ((i.state = N'pending' AND i.claim_token IS NULL)
		   OR (i.state = N'processing' AND i.lease_until < @now));
	-- the re-check of the parks, as in _relay_claim
	UPDATE i SET hold = NULL
	FROM queuebox.inbox i JOIN @blk b ON b.cid = i.id
	WHERE i.state = N'pending' AND i.hold = N'aggregate'
	  AND NOT EXISTS (SELECT 1 FROM queuebox.inbox e
					  WHERE e.id = b.bid AND e.state IN (N'pending', N'processing'));

	SELECT i.id, i.claim_token, i.source, i.idempotency_key, i.event_type, i.aggregate_id,
		   i.payload, i.headers, i.attempt, i.created_at
	FROM @cand c JOIN queuebox.inbox i ON i.id = c.id
	WHERE c.token IS NOT NULL AND i.claim_token = c.token AND i.state = N'processing'
	ORDER BY i.created_at, i.id;
	IF @own = 1
		COMMIT;
END
GO
DROP FUNCTION queuebox._schema_version;
GO
CREATE FUNCTION queuebox._schema_version() RETURNS NVARCHAR(50)
AS
BEGIN
	RETURN N'0.3.3';
END
GO
