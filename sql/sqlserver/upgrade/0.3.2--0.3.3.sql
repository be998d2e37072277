/*
 * sql/sqlserver/upgrade/0.3.2--0.3.3.sql
 *	  What changes from schema 0.3.2 to 0.3.3 on SQL Server, as on
 *	  PostgreSQL (sql/schema/upgrade/0.3.2--0.3.3.sql):
 *	- outbox.claimer and inbox.claimer: the claimer of a processing row; a
 *	  role holds the session applock N'queuebox.claimer.<id>' while it
 *	  lives, and _claimer_gone() tests it (APPLOCK_TEST).
 *	- _outbox_cycle and _relay_claim record the claimer (@claimer); the
 *	  reclaim (_outbox_reclaim) and the relay claim take over the rows of a
 *	  gone claimer at once, as an expired lease.  Rows claimed before the
 *	  upgrade have none: their leases end them, as before.
 *	- outbox_parked_idx and _outbox_sweep: the outbox engine's sweep
 *	  releases a row parked behind its key when no earlier row of the key
 *	  is open.  A Babelfish engine ignores the shared lock a park is made
 *	  under, so a settle could end the earlier row and promote before the
 *	  park committed, and the row waited forever (docs/sqlserver.md).
 *	- _relay_claim and inbox_claim re-check their parks in a later
 *	  statement and release a row whose earlier row has ended by then: the
 *	  same race on the inbox, closed where it opens.
 *
 * The engine's procedures are changed by DROP and CREATE, as Babelfish
 * does not run ALTER for every object; inbox_claim, which applications
 * call, by ALTER PROCEDURE, which keeps what an operator granted on it
 * (GRANT EXECUTE ON queuebox.inbox_claim TO app, docs/sqlserver.md);
 * _schema_version by DROP and CREATE.  ADD of a NULL column rewrites no
 * row.  The migration is one transaction: no caller sees anything missing.
 */
ALTER TABLE queuebox.outbox ADD claimer BIGINT NULL;
GO
ALTER TABLE queuebox.inbox ADD claimer BIGINT NULL;
GO
/*
 * _claimer_gone: is the claimer of a processing row gone?  Each claimer
 * (a role's connection) holds the session applock
 * N'queuebox.claimer.<id>' for as long as it lives (sp_getapplock,
 * @LockOwner = 'Session'); the applock is free when no session holds it.
 * @own is the caller's claimer: a session's own applock tests free to
 * itself, so its own rows are never gone.  NULL (no claimer): never gone.
 */
CREATE FUNCTION queuebox._claimer_gone(@claimer BIGINT, @own BIGINT)
RETURNS BIT
AS
BEGIN
	IF @claimer IS NULL OR @claimer = ISNULL(@own, 0)
		RETURN 0;
	RETURN CASE WHEN APPLOCK_TEST(N'public', CONCAT(N'queuebox.claimer.', @claimer), N'Exclusive', N'Session') = 1
				THEN 1 ELSE 0 END;
END
GO
DROP PROCEDURE queuebox._outbox_cycle;
GO
/*
 * _outbox_cycle: one cycle, in the caller's transaction (qb_store.h,
 * QbStore.outbox_cycle): the tallies into the circuit breakers, the
 * settles, the promotion of the next row of each key that ended, then
 * (@claim not NULL) the destination states and the claim.
 *	@tallies [{"d": destination, "ok": n, "fail": n, "gone": bool, "ra": Retry-After ms,
 *	           "err": text, "th": failures threshold, "cd": cooldown ms}] or NULL
 *	@settles [{"id": id, "t": token, "o": outcome, "a": attempt, "ms": delay ms,
 *	           "err": text, "d": destination}] or NULL
 *	@claim   {"batch": n, "lease": ms, "maxa": default max_attempts, "token": uuid,
 *	          "floor": unrouted intake floor, "probe": probe ms,
 *	          "dests": [{"n": destination, "l": limit}]} or NULL
 * Four result sets, always, in this order: the breaker's destinations
 * (destination, old_state, new_state, paused); the rows the settles changed
 * (one row, one column); the destination states (destination, state,
 * failures, paused, probe; empty without a claim); the rows changed by the
 * promotion and the claim (as QB_PG_OUTBOX_CLAIM returns them).
 * @claimer: the claimer the rows it claims record (NULL: none; takeover,
 * _claimer_gone).
 */
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
										 ELSE N'pending' END
			FROM queuebox.outbox o WITH (UPDLOCK, ROWLOCK) JOIN @s s ON s.id = o.id
			WHERE o.claim_token = s.token AND o.state = N'processing';
		UPDATE o
		SET state = w.state,
			attempt = s.attempt,
			destination = COALESCE(s.destination, o.destination),
			hold = CASE WHEN s.outcome = N'hold' THEN N'destination'
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
			WHERE o.id IN (SELECT (SELECT TOP (1) e.id FROM queuebox.outbox e
								   WHERE e.[key] = k.[key] AND e.state IN (N'pending', N'processing')
								   ORDER BY e.id)
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
			CROSS APPLY (SELECT TOP (1) e.id FROM queuebox.outbox e
						 WHERE e.[key] = c.[key] AND e.id < c.id
						   AND e.state IN (N'pending', N'processing')
						 ORDER BY e.id DESC) b
			WHERE c.[key] IS NOT NULL;
		INSERT @lk (id)
			SELECT e.id FROM queuebox.outbox e WITH (ROWLOCK, READPAST, REPEATABLEREAD)
			WHERE e.id IN (SELECT bid FROM @blk) AND e.state IN (N'pending', N'processing');

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
DROP PROCEDURE queuebox._outbox_reclaim;
GO
/*
 * _outbox_reclaim (QB_PG_OUTBOX_RECLAIM): expired leases, and the claims
 * of claimers that are gone (takeover), back to pending, at most @limit.
 * @claimer is the caller's own (NULL: none).
 */
CREATE PROCEDURE queuebox._outbox_reclaim @limit INT, @claimer BIGINT = NULL
AS
BEGIN
	SET NOCOUNT ON;
	SET XACT_ABORT ON;
	DECLARE @now DATETIME2(6) = SYSUTCDATETIME();
	DECLARE @n INT;
	DECLARE @x TABLE (id BIGINT PRIMARY KEY, claimer BIGINT);

	INSERT @x (id, claimer)
		SELECT TOP (@limit) x.id, x.claimer FROM queuebox.outbox x WITH (ROWLOCK, READPAST, UPDLOCK)
		WHERE x.state = N'processing'
		  AND (x.lease_until < @now OR queuebox._claimer_gone(x.claimer, @claimer) = 1)
		ORDER BY x.lease_until;
	UPDATE o
	SET state = N'pending', claim_token = NULL, lease_until = NULL, claimer = NULL,
		hold = CASE WHEN o.destination IS NULL THEN N'ready' END,
		last_error = CASE WHEN o.lease_until < @now
			THEN N'lease expired: the claim was not settled within outbox.claimTimeoutMs; returned to pending'
			ELSE N'taken over: the worker that claimed it is gone (its session ended); returned to pending' END
	FROM queuebox.outbox o JOIN @x x ON x.id = o.id
	WHERE o.state = N'processing' AND (o.lease_until < @now OR o.claimer = x.claimer);
	SET @n = @@ROWCOUNT;
	SELECT @n AS reclaimed;
END
GO
DROP PROCEDURE queuebox._relay_claim;
GO
/*
 * _relay_claim (QB_PG_RELAY_CLAIM): up to @batch push rows under @token
 * with a lease of @lease ms, one in flight per aggregate across every push
 * source, in created_at order.  Returns the claimed rows: id, source,
 * event_type, in created_at order.  @claimer: the claimer the rows record
 * (NULL: none); a row whose claimer is gone is taken over as an expired
 * lease is.
 */
CREATE PROCEDURE queuebox._relay_claim @batch INT, @lease BIGINT, @token UNIQUEIDENTIFIER,
	@claimer BIGINT = NULL
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
		WHERE c.consumption = N'push' AND c.state = N'processing'
		  AND (c.lease_until < @now OR queuebox._claimer_gone(c.claimer, @claimer) = 1)
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
		lease_until = CASE WHEN b.cid IS NULL THEN queuebox._after(@now, @lease) END,
		claimer = CASE WHEN b.cid IS NULL THEN @claimer END
	FROM queuebox.inbox i
	JOIN @cand c ON c.id = i.id
	LEFT JOIN @blk b ON b.cid = c.id
	WHERE (b.cid IS NULL OR b.bid IN (SELECT id FROM @lk))
	  AND ((i.state = N'pending' AND i.claim_token IS NULL)
		   OR (i.state = N'processing'
			   AND (i.lease_until < @now OR queuebox._claimer_gone(i.claimer, @claimer) = 1)));
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
