/*
 * sql/sqlserver/upgrade/0.3.3--0.3.4.sql
 *	  What changes from schema 0.3.3 to 0.3.4 on SQL Server, as on
 *	  PostgreSQL (sql/schema/upgrade/0.3.3--0.3.4.sql): onDead: holdKey
 *	  (docs/delivery.md, "A dead row and its key").
 *	- outbox.hold may be N'dead' on a dead row that holds its key, and
 *	  outbox_key_dead_idx finds those rows by key (a filtered index takes no
 *	  OR, so the key probes seek it beside outbox_key_open_idx).
 *	- _outbox_cycle settles 'dead-hold', and its claim, its promotion and
 *	  _outbox_sweep count a row that holds its key as open for that key.
 *	- outbox_audit, requeue_outbox_edited, skip_outbox, held_keys.
 *
 * DROP and CREATE rather than ALTER, which Babelfish does not run for
 * procedures; the migration is one transaction, so no caller sees them
 * missing.  No row changes: no dead row holds its key before 0.3.4.
 */
ALTER TABLE queuebox.outbox DROP CONSTRAINT outbox_hold_check;
GO
ALTER TABLE queuebox.outbox ADD CONSTRAINT outbox_hold_check
	CHECK (hold IN (N'key', N'destination', N'ready', N'intake', N'dead'));
GO
CREATE INDEX outbox_key_dead_idx ON queuebox.outbox ([key], id)
	WHERE hold = N'dead';
GO
CREATE TABLE queuebox.outbox_audit (
	id				BIGINT IDENTITY(1, 1) NOT NULL CONSTRAINT outbox_audit_pkey PRIMARY KEY,
	outbox_id		BIGINT NOT NULL,
	action			NVARCHAR(20) NOT NULL CONSTRAINT outbox_audit_action_check CHECK (action IN (N'requeue', N'skip')),
	done_by			NVARCHAR(200) NOT NULL CONSTRAINT outbox_audit_done_by_default DEFAULT COALESCE(CAST(SESSION_CONTEXT(N'queuebox.actor') AS NVARCHAR(200)), SUSER_SNAME()),
	done_at			DATETIME2(6) NOT NULL CONSTRAINT outbox_audit_done_at_default DEFAULT SYSUTCDATETIME(),
	payload_before	NVARCHAR(MAX) NULL,
	payload_after	NVARCHAR(MAX) NULL
);
GO
CREATE INDEX outbox_audit_outbox_idx ON queuebox.outbox_audit (outbox_id);
GO
DROP PROCEDURE queuebox._outbox_cycle;
GO
CREATE PROCEDURE queuebox._outbox_cycle
	@tallies NVARCHAR(MAX), @settles NVARCHAR(MAX), @claim NVARCHAR(MAX), @claimer BIGINT = NULL
AS
BEGIN
	SET NOCOUNT ON;
	SET XACT_ABORT ON;
	DECLARE @now DATETIME2(6) = SYSUTCDATETIME();
	DECLARE @nsettled INT = 0;
	DECLARE @token UNIQUEIDENTIFIER = CONVERT(UNIQUEIDENTIFIER, JSON_VALUE(@claim, '$.token'));
	DECLARE @lease BIGINT = CONVERT(BIGINT, JSON_VALUE(@claim, '$.lease'));
	DECLARE @maxa INT = ISNULL(CONVERT(INT, JSON_VALUE(@claim, '$.maxa')), 1);
	DECLARE @changes TABLE (destination NVARCHAR(200) COLLATE Latin1_General_100_BIN2 PRIMARY KEY,
							old_state NVARCHAR(20), new_state NVARCHAR(20), paused BIT);
	DECLARE @ended TABLE ([key] NVARCHAR(400) COLLATE Latin1_General_100_BIN2);
	DECLARE @states TABLE (destination NVARCHAR(200) COLLATE Latin1_General_100_BIN2 PRIMARY KEY,
						   state NVARCHAR(20), failures INT, paused BIT, probe BIT);
	DECLARE @rows TABLE (id BIGINT PRIMARY KEY, claimed BIT, destination NVARCHAR(200) COLLATE Latin1_General_100_BIN2,
						 src CHAR(1), not_due BIT);

	/* -- the circuit breakers (QB_PG_OUTBOX_BREAKER_ROWS, QB_PG_OUTBOX_BREAKER) -- */
	IF @tallies IS NOT NULL
	BEGIN
		DECLARE @t TABLE (destination NVARCHAR(200) COLLATE Latin1_General_100_BIN2 PRIMARY KEY,
						  n_ok INT, n_fail INT, gone BIT, retry_after_ms BIGINT, error NVARCHAR(MAX),
						  threshold INT, cooldown_ms BIGINT);
		DECLARE @nx TABLE (destination NVARCHAR(200) COLLATE Latin1_General_100_BIN2 PRIMARY KEY,
						   old_state NVARCHAR(20), new_state NVARCHAR(20), old_failures INT,
						   new_failures INT, old_paused DATETIME2(6), new_paused DATETIME2(6),
						   n_fail INT, error NVARCHAR(MAX), cooldown_ms BIGINT);

		INSERT @t (destination, n_ok, n_fail, gone, retry_after_ms, error, threshold, cooldown_ms)
			SELECT destination, n_ok, n_fail, ISNULL(gone, 0), ISNULL(retry_after_ms, 0), error,
				   threshold, cooldown_ms
			FROM OPENJSON(@tallies) WITH (destination NVARCHAR(200) '$.d', n_ok INT '$.ok',
										  n_fail INT '$.fail', gone BIT '$.gone',
										  retry_after_ms BIGINT '$.ra', error NVARCHAR(MAX) '$.err',
										  threshold INT '$.th', cooldown_ms BIGINT '$.cd');
		-- every destination has its row before the counts go in: the range
		-- lock makes a second creator wait, then find the row
		INSERT queuebox.destination_state (destination)
			SELECT t.destination FROM @t t
			WHERE NOT EXISTS (SELECT 1 FROM queuebox.destination_state d WITH (UPDLOCK, HOLDLOCK)
							  WHERE d.destination = t.destination);
		INSERT @nx (destination, old_state, new_state, old_failures, new_failures, old_paused,
					new_paused, n_fail, error, cooldown_ms)
			SELECT t.destination, c.state,
				   CASE WHEN t.gone = 1 OR c.state = N'disabled' THEN N'disabled'
						WHEN t.n_ok > 0 THEN N'closed'
						WHEN t.n_fail > 0 AND c.state IN (N'open', N'half-open') THEN N'open'
						WHEN t.n_fail > 0 AND c.failures + t.n_fail >= t.threshold THEN N'open'
						ELSE c.state END,
				   c.failures,
				   CASE WHEN t.n_ok > 0 AND t.gone = 0 THEN 0 ELSE c.failures + t.n_fail END,
				   c.paused_until,
				   CASE WHEN t.retry_after_ms > 0
							 AND (c.paused_until IS NULL OR c.paused_until < queuebox._after(@now, t.retry_after_ms))
						THEN queuebox._after(@now, t.retry_after_ms)
						ELSE c.paused_until END,
				   t.n_fail, t.error, t.cooldown_ms
			FROM @t t
			JOIN queuebox.destination_state c WITH (UPDLOCK, ROWLOCK) ON c.destination = t.destination;
		UPDATE s
		SET state = nx.new_state, failures = nx.new_failures,
			opened_at = CASE WHEN nx.new_state = s.state THEN s.opened_at
							 WHEN nx.new_state IN (N'open', N'disabled') THEN @now END,
			probe_at = CASE WHEN nx.new_state = N'open' AND s.state = N'open' THEN s.probe_at
							WHEN nx.new_state = N'open' THEN queuebox._after(@now, nx.cooldown_ms) END,
			paused_until = nx.new_paused,
			last_error = COALESCE(CASE WHEN nx.n_fail > 0 THEN nx.error END, s.last_error),
			changed_at = CASE WHEN nx.new_state = s.state THEN s.changed_at ELSE @now END
		FROM queuebox.destination_state s JOIN @nx nx ON nx.destination = s.destination
		WHERE nx.new_state <> nx.old_state OR nx.new_failures <> nx.old_failures
		   OR ISNULL(nx.new_paused, '00010101') <> ISNULL(nx.old_paused, '00010101');
		INSERT @changes (destination, old_state, new_state, paused)
			SELECT destination, old_state, new_state,
				   CASE WHEN new_paused > @now THEN 1 ELSE 0 END
			FROM @nx;
	END

	/* -- the settles (QB_PG_OUTBOX_SETTLE), fenced by each row's token -- */
	IF @settles IS NOT NULL
	BEGIN
		DECLARE @s TABLE (id BIGINT, token UNIQUEIDENTIFIER, outcome NVARCHAR(10), attempt INT,
						  delay_ms BIGINT, error NVARCHAR(MAX),
						  destination NVARCHAR(200) COLLATE Latin1_General_100_BIN2);
		DECLARE @settled TABLE (id BIGINT PRIMARY KEY, [key] NVARCHAR(400) COLLATE Latin1_General_100_BIN2,
								state NVARCHAR(50));

		INSERT @s (id, token, outcome, attempt, delay_ms, error, destination)
			SELECT id, token, outcome, attempt, ISNULL(delay_ms, 0), error, destination
			FROM OPENJSON(@settles) WITH (id BIGINT '$.id', token UNIQUEIDENTIFIER '$.t',
										  outcome NVARCHAR(10) '$.o', attempt INT '$.a',
										  delay_ms BIGINT '$.ms', error NVARCHAR(MAX) '$.err',
										  destination NVARCHAR(200) '$.d');
		-- the rows this token still holds, locked: the ones the update changes
		INSERT @settled (id, [key], state)
			SELECT o.id, o.[key], CASE s.outcome WHEN N'sent' THEN N'sent' WHEN N'dead' THEN N'dead'
										 WHEN N'dead-hold' THEN N'dead' ELSE N'pending' END
			FROM queuebox.outbox o WITH (UPDLOCK, ROWLOCK) JOIN @s s ON s.id = o.id
			WHERE o.claim_token = s.token AND o.state = N'processing';
		UPDATE o
		SET state = w.state,
			attempt = s.attempt,
			destination = COALESCE(s.destination, o.destination),
			hold = CASE WHEN s.outcome = N'hold' THEN N'destination'
						WHEN s.outcome = N'dead-hold' AND o.[key] IS NOT NULL THEN N'dead'
						WHEN s.outcome = N'retry'
							 AND EXISTS (SELECT 1 FROM queuebox.destination_state d
										 WHERE d.destination = s.destination
										   AND (d.state <> N'closed' OR d.paused_until > @now))
						THEN N'destination'
						WHEN s.outcome IN (N'release', N'route', N'retry')
							 AND COALESCE(s.destination, o.destination) IS NULL THEN N'ready' END,
			scheduled_at = CASE s.outcome WHEN N'retry' THEN queuebox._after(@now, s.delay_ms)
							   ELSE o.scheduled_at END,
			last_error = CASE WHEN s.outcome IN (N'sent', N'route') THEN o.last_error ELSE s.error END,
			claim_token = NULL, lease_until = NULL
		FROM queuebox.outbox o
		JOIN @settled w ON w.id = o.id
		JOIN @s s ON s.id = o.id
		WHERE o.claim_token = s.token AND o.state = N'processing';
		SELECT @nsettled = COUNT(*) FROM @settled;
		INSERT @ended ([key])
			SELECT DISTINCT [key] FROM @settled
			WHERE [key] IS NOT NULL AND state IN (N'sent', N'dead');
	END

	/*
	 * -- the promotion (QB_PG_OUTBOX_PROMOTE), a statement after the settle:
	 * the settle's update waited for every claim that parked a row behind
	 * an ended row (they held a shared lock on it), so this one reads
	 * their parks.  With a claim, a due released row is claimed at once.
	 */
	IF EXISTS (SELECT 1 FROM @ended)
	BEGIN
		DECLARE @promoted TABLE (id BIGINT PRIMARY KEY, claim BIT);

		INSERT @promoted (id, claim)
			SELECT o.id, CASE WHEN @token IS NOT NULL AND o.scheduled_at <= @now THEN 1 ELSE 0 END
			FROM queuebox.outbox o WITH (UPDLOCK, ROWLOCK)
			WHERE o.id IN (SELECT (SELECT MIN(f.id) FROM (
									   SELECT a.id FROM (SELECT TOP (1) e.id FROM queuebox.outbox e
														 WHERE e.[key] = k.[key]
														   AND e.state IN (N'pending', N'processing')
														 ORDER BY e.id) a
									   UNION ALL
									   SELECT d.id FROM (SELECT TOP (1) e.id FROM queuebox.outbox e
														 WHERE e.[key] = k.[key] AND e.hold = N'dead'
														 ORDER BY e.id) d) f)
						   FROM @ended k)
			  AND o.state = N'pending' AND o.hold = N'key';
		UPDATE o
		SET state = CASE WHEN p.claim = 1 THEN N'processing' ELSE N'pending' END,
			hold = CASE WHEN p.claim = 1 THEN NULL WHEN o.destination IS NULL THEN N'ready' END,
			claim_token = CASE WHEN p.claim = 1 THEN @token END,
			lease_until = CASE WHEN p.claim = 1 THEN queuebox._after(@now, @lease) END,
			claimer = CASE WHEN p.claim = 1 THEN @claimer END
		FROM queuebox.outbox o JOIN @promoted p ON p.id = o.id
		WHERE o.state = N'pending' AND o.hold = N'key';
		INSERT @rows (id, claimed, destination, src, not_due)
			SELECT o.id, CASE WHEN o.claim_token = @token AND o.state = N'processing' THEN 1 ELSE 0 END,
				   o.destination, 'k', 0
			FROM @promoted p JOIN queuebox.outbox o ON o.id = p.id;
	END

	IF @claim IS NOT NULL
	BEGIN
		DECLARE @probe_ms BIGINT = CONVERT(BIGINT, JSON_VALUE(@claim, '$.probe'));
		DECLARE @batch INT = CONVERT(INT, JSON_VALUE(@claim, '$.batch'));
		DECLARE @floor BIGINT = ISNULL(CONVERT(BIGINT, JSON_VALUE(@claim, '$.floor')), 0);
		DECLARE @left INT;
		DECLARE @p TABLE (destination NVARCHAR(200) COLLATE Latin1_General_100_BIN2 PRIMARY KEY);
		DECLARE @d TABLE (name NVARCHAR(200) COLLATE Latin1_General_100_BIN2 PRIMARY KEY, lim INT);
		DECLARE @cand TABLE (id BIGINT PRIMARY KEY, [key] NVARCHAR(400) COLLATE Latin1_General_100_BIN2, src CHAR(1));
		DECLARE @blk TABLE (cid BIGINT PRIMARY KEY, bid BIGINT);
		DECLARE @lk TABLE (id BIGINT PRIMARY KEY);

		/* -- the destination states (QB_PG_OUTBOX_STATES): a cooled-down open circuit goes half-open -- */
		INSERT @p (destination)
			SELECT d.destination FROM queuebox.destination_state d WITH (ROWLOCK, READPAST, UPDLOCK)
			WHERE d.state IN (N'open', N'half-open') AND d.probe_at <= @now;
		UPDATE d
		SET state = N'half-open', probe_at = queuebox._after(@now, @probe_ms), changed_at = @now
		FROM queuebox.destination_state d JOIN @p p ON p.destination = d.destination;
		INSERT @states (destination, state, failures, paused, probe)
			SELECT d.destination, d.state, d.failures,
				   CASE WHEN d.paused_until > @now THEN 1 ELSE 0 END,
				   CASE WHEN p.destination IS NOT NULL THEN 1 ELSE 0 END
			FROM queuebox.destination_state d LEFT JOIN @p p ON p.destination = d.destination
			WHERE d.state <> N'closed' OR d.failures > 0 OR d.paused_until > @now
			   OR p.destination IS NOT NULL;

		/* -- what the promotion left of the claim (qb_claim_left) -- */
		SET @batch = @batch - (SELECT COUNT(*) FROM @rows WHERE claimed = 1 AND destination IS NULL);
		IF @batch < 0
			SET @batch = 0;
		INSERT @d (name, lim)
			SELECT name, lim FROM OPENJSON(@claim, '$.dests') WITH (name NVARCHAR(200) '$.n', lim INT '$.l');
		UPDATE d
		SET lim = CASE WHEN d.lim > x.n THEN d.lim - x.n ELSE 0 END
		FROM @d d JOIN (SELECT destination, COUNT(*) AS n FROM @rows WHERE claimed = 1
						GROUP BY destination) x ON x.destination = d.name;

		/* -- the candidates: routed rows per destination taking rows, the unrouted intake, ready, probes -- */
		INSERT @cand (id, [key], src)
			SELECT r.id, r.[key], 'd'
			FROM @d d
			CROSS APPLY (SELECT TOP (d.lim) c.id, c.[key] FROM queuebox.outbox c WITH (ROWLOCK, READPAST, UPDLOCK)
						 WHERE c.destination = d.name AND c.destination IS NOT NULL
						   AND c.state = N'pending' AND c.hold IS NULL AND c.scheduled_at <= @now
						 ORDER BY c.scheduled_at, c.id) r
			WHERE d.lim > 0
			  AND NOT EXISTS (SELECT 1 FROM queuebox.destination_state s
							  WHERE s.destination = d.name
								AND (s.state <> N'closed' OR s.paused_until > @now));
		INSERT @cand (id, [key], src)
			SELECT TOP (@batch) c.id, c.[key], 'i' FROM queuebox.outbox c WITH (ROWLOCK, READPAST, UPDLOCK)
			WHERE c.state = N'pending' AND c.destination IS NULL AND c.hold IS NULL AND c.id > @floor
			ORDER BY c.id;
		SET @left = @batch - @@ROWCOUNT;
		IF @left > 0
			INSERT @cand (id, [key], src)
				SELECT TOP (@left) c.id, c.[key], 'r' FROM queuebox.outbox c WITH (ROWLOCK, READPAST, UPDLOCK)
				WHERE c.state = N'pending' AND c.hold = N'ready' AND c.scheduled_at <= @now
				ORDER BY c.scheduled_at, c.id;
		INSERT @cand (id, [key], src)
			SELECT r.id, r.[key], 'p'
			FROM @p pd
			CROSS APPLY (SELECT TOP (1) x.id, x.[key] FROM (
							SELECT 1 AS pri, h.id, h.[key] FROM (
								SELECT TOP (1) c.id, c.[key] FROM queuebox.outbox c WITH (ROWLOCK, READPAST, UPDLOCK)
								WHERE c.destination = pd.destination AND c.state = N'pending'
								  AND c.hold = N'destination'
								ORDER BY c.id) h
							UNION ALL
							SELECT 2, g.id, g.[key] FROM (
								SELECT TOP (1) c.id, c.[key] FROM queuebox.outbox c WITH (ROWLOCK, READPAST, UPDLOCK)
								WHERE c.destination = pd.destination AND c.destination IS NOT NULL
								  AND c.state = N'pending' AND c.hold IS NULL
								ORDER BY c.scheduled_at, c.id) g) x
						 ORDER BY x.pri) r
			WHERE NOT EXISTS (SELECT 1 FROM @cand k WHERE k.id = r.id);

		/*
		 * -- per-key order: a keyed candidate with an earlier open row of its
		 * key is parked behind it when that row can be share-locked (so the
		 * settle that ends it waits for this commit, and its promotion sees
		 * the park), else moved to ready to be looked at again --
		 */
		INSERT @blk (cid, bid)
			SELECT c.id, b.id FROM @cand c
			CROSS APPLY (SELECT MAX(f.id) AS id FROM (
							 SELECT a.id FROM (SELECT TOP (1) e.id FROM queuebox.outbox e
											   WHERE e.[key] = c.[key] AND e.id < c.id
												 AND e.state IN (N'pending', N'processing')
											   ORDER BY e.id DESC) a
							 UNION ALL
							 SELECT d.id FROM (SELECT TOP (1) e.id FROM queuebox.outbox e
											   WHERE e.[key] = c.[key] AND e.id < c.id AND e.hold = N'dead'
											   ORDER BY e.id DESC) d) f) b
			WHERE c.[key] IS NOT NULL AND b.id IS NOT NULL;
		INSERT @lk (id)
			SELECT e.id FROM queuebox.outbox e WITH (ROWLOCK, READPAST, REPEATABLEREAD)
			WHERE e.id IN (SELECT bid FROM @blk)
			  AND (e.state IN (N'pending', N'processing') OR e.hold = N'dead');

		-- the candidates still pending and unclaimed (the lock keeps them so)
		DELETE c FROM @cand c
		WHERE NOT EXISTS (SELECT 1 FROM queuebox.outbox o WITH (UPDLOCK, ROWLOCK)
						  WHERE o.id = c.id AND o.state = N'pending' AND o.claim_token IS NULL);
		UPDATE o
		SET state = CASE WHEN b.cid IS NULL THEN N'processing' ELSE N'pending' END,
			hold = CASE WHEN b.cid IS NULL THEN NULL WHEN l.id IS NOT NULL THEN N'key' ELSE N'ready' END,
			claim_token = CASE WHEN b.cid IS NULL THEN @token END,
			lease_until = CASE WHEN b.cid IS NULL THEN queuebox._after(@now, @lease) END,
			claimer = CASE WHEN b.cid IS NULL THEN @claimer END
		FROM queuebox.outbox o
		JOIN @cand c ON c.id = o.id
		LEFT JOIN @blk b ON b.cid = c.id
		LEFT JOIN @lk l ON l.id = b.bid
		WHERE o.state = N'pending' AND o.claim_token IS NULL;
		-- what changed, by the token: exact even where a lock hint is not honoured
		INSERT @rows (id, claimed, destination, src, not_due)
			SELECT o.id, CASE WHEN o.claim_token = @token THEN 1 ELSE 0 END, o.destination, c.src,
				   CASE WHEN o.scheduled_at > @now THEN 1 ELSE 0 END
			FROM @cand c JOIN queuebox.outbox o ON o.id = c.id
			WHERE (o.claim_token = @token AND o.state = N'processing')
			   OR (o.state = N'pending' AND o.hold IN (N'key', N'ready'));
	END

	SELECT destination, old_state, new_state, paused FROM @changes ORDER BY destination;
	SELECT @nsettled AS settled;
	SELECT destination, state, failures, paused, probe FROM @states ORDER BY destination;
	SELECT o.id, o.message_id, o.topic, o.[key], o.payload, o.headers, o.attempt,
		   COALESCE(o.max_attempts, @maxa) AS max_attempts, queuebox._epoch(o.created_at) AS created_epoch,
		   r.claimed, o.destination,
		   CASE WHEN r.src = 'i' THEN 1 ELSE 0 END AS in_intake, r.not_due,
		   CASE WHEN r.src = 'p' THEN 1 ELSE 0 END AS probe
	FROM @rows r JOIN queuebox.outbox o ON o.id = r.id
	ORDER BY o.id;
END
GO
DROP PROCEDURE queuebox._outbox_sweep;
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
		   AND NOT EXISTS (SELECT 1 FROM queuebox.outbox e
						   WHERE e.[key] = @key AND e.id < @id AND e.hold = N'dead')
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
/*
 * requeue_outbox_edited: requeue_outbox with the payload replaced (onDead:
 * holdKey: the rows held behind it follow it, in order).  The edit is
 * recorded in outbox_audit: who (SUSER_SNAME()), when, the payload before
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
			lease_until = NULL, destination = NULL, hold = N'ready', payload = @payload
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
 * its key's first open row, when parked, is released as a settle's
 * promotion releases it, in a later statement (the update waited for the
 * claims parking rows behind it).  0, nothing changed, for a row that is
 * not dead and holding its key.
 */
CREATE PROCEDURE queuebox.skip_outbox @id BIGINT
AS
BEGIN
	SET NOCOUNT ON;
	SET XACT_ABORT ON;
	DECLARE @own BIT = CASE WHEN @@TRANCOUNT = 0 THEN 1 ELSE 0 END;
	DECLARE @key NVARCHAR(400);
	DECLARE @n INT = 0;

	IF @own = 1
		BEGIN TRANSACTION;
	SELECT @key = [key] FROM queuebox.outbox WITH (UPDLOCK, ROWLOCK)
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
		WHERE o.id = (SELECT MIN(f.id) FROM (
						  SELECT a.id FROM (SELECT TOP (1) e.id FROM queuebox.outbox e
											WHERE e.[key] = @key AND e.state IN (N'pending', N'processing')
											ORDER BY e.id) a
						  UNION ALL
						  SELECT d.id FROM (SELECT TOP (1) e.id FROM queuebox.outbox e
											WHERE e.[key] = @key AND e.hold = N'dead'
											ORDER BY e.id) d) f)
		  AND o.state = N'pending' AND o.hold = N'key';
	END
	IF @own = 1
		COMMIT TRANSACTION;
	SELECT CAST(CASE WHEN @n = 1 THEN 1 ELSE 0 END AS BIT) AS skipped;
END
GO

/*
 * held_keys: the keys whose first open row is dead and holding them
 * (onDead: holdKey) or retrying, with rows parked behind it: key,
 * destination, head_id, head_state (dead | retrying), behind, since (the
 * oldest of them was created, UTC); at most @limit keys, in key order.
 */
CREATE PROCEDURE queuebox.held_keys @limit INT = 100
AS
BEGIN
	SET NOCOUNT ON;
	SELECT TOP (@limit) k.[key], h.destination, h.id AS head_id,
		   CASE WHEN h.state = N'dead' THEN N'dead' ELSE N'retrying' END AS head_state,
		   b.n AS behind, b.since
	FROM (SELECT DISTINCT o.[key] FROM queuebox.outbox o
		  WHERE o.state = N'pending' AND o.hold = N'key') k
	CROSS APPLY (SELECT TOP (1) e.id, e.state, e.attempt, e.destination FROM queuebox.outbox e
				 WHERE e.[key] = k.[key] AND (e.state IN (N'pending', N'processing') OR e.hold = N'dead')
				 ORDER BY e.id) h
	CROSS APPLY (SELECT COUNT_BIG(*) AS n, MIN(e.created_at) AS since FROM queuebox.outbox e
				 WHERE e.[key] = k.[key] AND e.id > h.id AND e.state IN (N'pending', N'processing')) b
	WHERE h.state = N'dead' OR (h.state = N'pending' AND h.attempt > 0)
	ORDER BY k.[key];
END
GO

-- Operations: the console's reads (issue 25): dead rows by each exact
-- filter of dead_outbox / dead_inbox (outbox_dead_idx and inbox_dead_idx
-- serve the unfiltered walk); only a row going dead writes an entry.
CREATE INDEX outbox_dead_destination_idx ON queuebox.outbox (destination, id) WHERE state = N'dead';
CREATE INDEX outbox_dead_topic_idx ON queuebox.outbox (topic, id) WHERE state = N'dead';
CREATE INDEX outbox_dead_key_idx ON queuebox.outbox ([key], id) WHERE state = N'dead';
CREATE INDEX inbox_dead_source_idx ON queuebox.inbox (source, id) WHERE state = N'dead';
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
		WHERE state = N'dead' AND [key] = @key AND id > @after ORDER BY id;
	ELSE IF @destination IS NOT NULL
		INSERT @c SELECT TOP (10000) id FROM queuebox.outbox
		WHERE state = N'dead' AND destination = @destination AND id > @after ORDER BY id;
	ELSE IF @topic IS NOT NULL
		INSERT @c SELECT TOP (10000) id FROM queuebox.outbox
		WHERE state = N'dead' AND topic = @topic AND id > @after ORDER BY id;
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
		WHERE state = N'dead' AND source = @source AND id > @after ORDER BY id;
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
 * headers as they are stored, with its audit rows oldest first; no row
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

DROP FUNCTION queuebox._schema_version;
GO
CREATE FUNCTION queuebox._schema_version() RETURNS NVARCHAR(50)
AS
BEGIN
	RETURN N'0.3.4';
END
GO
