/*
 * sql/sqlserver/upgrade/0.3.5--0.3.6.sql
 *	  What changes from schema 0.3.5 to 0.3.6 on SQL Server (issue 38, chaos
 *	  with a checker: takeover on Babelfish, the breaker's late success;
 *	  issue 40: the outbox's trace context from the session, the relay
 *	  claim's traceparent), one section each below; T-SQL batches split on
 *	  GO.
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

-- ---- the breaker's late success (issue 38) ----------------------------------
-- _outbox_cycle counts a success into an open or half-open circuit only
-- when it was sent at or after opened_at (the tallies' "ago"): a request
-- answered before a partition and settled late no longer closes it.  No
-- row changes.

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
						  n_ok INT, ok_sent_at DATETIME2(6), n_fail INT, gone BIT,
						  retry_after_ms BIGINT, error NVARCHAR(MAX), threshold INT, cooldown_ms BIGINT);
		DECLARE @nx TABLE (destination NVARCHAR(200) COLLATE Latin1_General_100_BIN2 PRIMARY KEY,
						   old_state NVARCHAR(20), new_state NVARCHAR(20), old_failures INT,
						   new_failures INT, old_paused DATETIME2(6), new_paused DATETIME2(6),
						   n_fail INT, error NVARCHAR(MAX), cooldown_ms BIGINT);

		-- when the latest success was sent: @now less its age, rounded up to
		-- the millisecond (so never later than it was); an open circuit
		-- counts it only when sent at or after opened_at (QB_PG_OUTBOX_BREAKER)
		INSERT @t (destination, n_ok, ok_sent_at, n_fail, gone, retry_after_ms, error, threshold,
				   cooldown_ms)
			SELECT destination, n_ok, queuebox._after(@now, -((ISNULL(ago, 0) + 999) / 1000)),
				   n_fail, ISNULL(gone, 0), ISNULL(retry_after_ms, 0), error, threshold, cooldown_ms
			FROM OPENJSON(@tallies) WITH (destination NVARCHAR(200) '$.d', n_ok INT '$.ok',
										  ago BIGINT '$.ago',
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
						WHEN t.n_ok > 0 AND (c.state NOT IN (N'open', N'half-open') OR c.opened_at IS NULL
											 OR t.ok_sent_at >= c.opened_at) THEN N'closed'
						WHEN t.n_fail > 0 AND c.state IN (N'open', N'half-open') THEN N'open'
						WHEN t.n_fail > 0 AND c.failures + t.n_fail >= t.threshold THEN N'open'
						ELSE c.state END,
				   c.failures,
				   CASE WHEN t.n_ok > 0 AND t.gone = 0
							 AND (c.state NOT IN (N'open', N'half-open') OR c.opened_at IS NULL
								  OR t.ok_sent_at >= c.opened_at) THEN 0
						ELSE c.failures + t.n_fail END,
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

-- ---- SQL Server carries trace context like PostgreSQL (issue 40) -----------
-- An INSERT into the outbox takes its session's trace context
-- (sp_set_session_context N'queuebox.traceparent', N'queuebox.tracestate')
-- into a row without a traceparent header: _trace_error and the trigger
-- outbox_trace, both new.  _relay_claim returns each row's traceparent
-- too, so the relay's forward span is its child: made again by DROP and
-- CREATE (no role holds a grant on it).  No row is touched.
/*
 * _trace_error: why a session's trace context cannot be carried, or NULL
 * when it can: @tp must be a traceparent qb_trace_parse accepts (2 lower-case
 * hex, not ff, then 32, 16 and 2 lower-case hex joined by '-', ids not all
 * zero; version 00 exactly 55 characters, a later one may add "-..."), @ts
 * (NULL: none) at most 512 printable ASCII characters without '"' or '\'.
 * The lengths are LEN(@x + N'x') - 1: LEN does not count trailing blanks,
 * and DATALENGTH counts bytes, two a character on SQL Server, one on
 * Babelfish.
 */
CREATE FUNCTION queuebox._trace_error(@tp NVARCHAR(4000), @ts NVARCHAR(4000)) RETURNS NVARCHAR(2000)
AS
BEGIN
	DECLARE @n INT = LEN(@tp + N'x') - 1;

	IF NOT (@n >= 55
			AND @tp COLLATE Latin1_General_100_BIN2 LIKE N'[0-9a-f][0-9a-f]-' + REPLICATE(N'[0-9a-f]', 32) + N'-'
				+ REPLICATE(N'[0-9a-f]', 16) + N'-[0-9a-f][0-9a-f]%'
			AND LEFT(@tp, 2) <> N'ff'
			AND (@n = 55 OR (LEFT(@tp, 2) <> N'00' AND SUBSTRING(@tp, 56, 1) = N'-'))
			AND SUBSTRING(@tp, 4, 32) <> REPLICATE(N'0', 32)
			AND SUBSTRING(@tp, 37, 16) <> REPLICATE(N'0', 16))
		RETURN CONCAT(N'queuebox: SESSION_CONTEXT(N''queuebox.traceparent'') is not a valid traceparent: "',
					  LEFT(@tp, 80), N'". A traceparent is 00-<trace-id: 32 hex>-<parent-id: 16 hex>-<flags: 2 hex>,',
					  N' lower case, ids not all zero: set what your tracer''s propagator writes, e.g.',
					  N' 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01 (sp_set_session_context).');
	IF @ts IS NOT NULL AND (LEN(@ts + N'x') - 1 > 512 OR @ts COLLATE Latin1_General_100_BIN2 LIKE N'%[^ -~]%'
						   OR @ts LIKE N'%["\]%')
		RETURN N'queuebox: SESSION_CONTEXT(N''queuebox.tracestate'') is not a valid tracestate. A tracestate is at'
			+ N' most 512 printable ASCII characters, without ''"'' or ''\'', e.g. congo=t61rcWkgMzE.';
	RETURN NULL;
END
GO

/*
 * outbox_trace: the rows an INSERT writes take the trace context of its
 * session, sp_set_session_context N'queuebox.traceparent' (and
 * N'queuebox.tracestate'), into their headers, unless a row carries its own
 * traceparent header (in any letter case: that is the one delivered).  A
 * context that is not valid refuses the insert, and XACT_ABORT or not the
 * error ends the statement's transaction (THROW in a trigger aborts the
 * batch): the business write goes with it.  A session without a context
 * costs one SESSION_CONTEXT read per statement.  An AFTER trigger: the
 * rows keep their SCOPE_IDENTITY(); an INSERT with OUTPUT needs INTO on
 * SQL Server (Msg 334), docs/sqlserver.md says so.  A writer that may
 * only INSERT has its rows updated here: by ownership chaining on SQL
 * Server; Babelfish checks only the call of _trace_error, which roles.sql
 * grants queuebox_writer.
 */
CREATE TRIGGER queuebox.outbox_trace ON queuebox.outbox AFTER INSERT
AS
BEGIN
	SET NOCOUNT ON;
	DECLARE @tp NVARCHAR(4000) = NULLIF(CAST(SESSION_CONTEXT(N'queuebox.traceparent') AS NVARCHAR(4000)), N'');
	DECLARE @ts NVARCHAR(4000), @error NVARCHAR(2000);

	IF @tp IS NULL OR NOT EXISTS (SELECT 1 FROM inserted)
		RETURN;
	SET @ts = NULLIF(CAST(SESSION_CONTEXT(N'queuebox.tracestate') AS NVARCHAR(4000)), N'');
	SET @error = queuebox._trace_error(@tp, @ts);
	IF @error IS NOT NULL
		THROW 50022, @error, 1;
	-- a later version's traceparent is delivered as version 00 of its first
	-- 55 characters, as the PostgreSQL triggers store it
	SET @tp = N'00' + SUBSTRING(@tp, 3, 53);
	UPDATE o
	SET headers = CASE WHEN @ts IS NULL THEN JSON_MODIFY(o.headers, '$.traceparent', @tp)
					   ELSE JSON_MODIFY(JSON_MODIFY(o.headers, '$.traceparent', @tp), '$.tracestate', @ts) END
	FROM queuebox.outbox o JOIN inserted i ON i.id = o.id
	WHERE NOT EXISTS (SELECT 1 FROM OPENJSON(o.headers) h WHERE LOWER(h.[key]) = N'traceparent');
END
GO
DROP PROCEDURE queuebox._relay_claim;
GO
/*
 * _relay_claim (QB_PG_RELAY_CLAIM): up to @batch push rows under @token
 * with a lease of @lease ms, one in flight per aggregate across every push
 * source, in created_at order.  Returns the claimed rows: id, source,
 * event_type, traceparent (its header; NULL: none), in created_at order.
 * @claimer: the claimer the rows record (NULL: none); a row whose claimer
 * is gone is taken over as an expired lease is.  A dead row that holds
 * its aggregate (hold N'dead', a source's onDead: holdKey) is open for it:
 * the blocker seeks inbox_push_dead_idx beside inbox_push_aggregate_idx
 * (TOP (1) of each, the nearer wins).
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
		CROSS APPLY (SELECT TOP (1) u.id FROM (
						 SELECT o.id, o.created_at FROM (
							 SELECT TOP (1) e.id, e.created_at FROM queuebox.inbox e
							 WHERE e.consumption = N'push' AND e.aggregate_id = c.aggregate_id
							   AND e.state IN (N'pending', N'processing')
							   AND (e.created_at < c.created_at OR (e.created_at = c.created_at AND e.id < c.id))
							 ORDER BY e.created_at DESC, e.id DESC) o
						 UNION ALL
						 SELECT d.id, d.created_at FROM (
							 SELECT TOP (1) e.id, e.created_at FROM queuebox.inbox e
							 WHERE e.hold = N'dead' AND e.aggregate_id = c.aggregate_id
							   AND (e.created_at < c.created_at OR (e.created_at = c.created_at AND e.id < c.id))
							 ORDER BY e.created_at DESC, e.id DESC) d) u
					 ORDER BY u.created_at DESC, u.id DESC) b
		WHERE c.aggregate_id IS NOT NULL;
	INSERT @lk (id)
		SELECT e.id FROM queuebox.inbox e WITH (ROWLOCK, READPAST, REPEATABLEREAD)
		WHERE e.id IN (SELECT bid FROM @blk)
		  AND (e.state IN (N'pending', N'processing') OR e.hold = N'dead');

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
					  WHERE e.id = b.bid AND (e.state IN (N'pending', N'processing') OR e.hold = N'dead'));
	-- what this claim took, by its token, with its traceparent header (any
	-- letter case): the relay's forward span is a child of it
	SELECT i.id, i.source, i.event_type,
		   (SELECT TOP (1) h.[value] FROM OPENJSON(i.headers) h
			WHERE LOWER(h.[key]) = N'traceparent' AND h.[type] = 1) AS traceparent
	FROM @cand c JOIN queuebox.inbox i ON i.id = c.id
	WHERE i.claim_token = @token AND i.state = N'processing'
	ORDER BY i.created_at, i.id;
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
