/*
 * sql/sqlserver/engine.sql
 *	  What the daemon's engines run on SQL Server: the outbox cycle, the
 *	  maintenance steps, the inbox insert, the relay, and the five pull
 *	  statements, as procedures over the tables of sql/sqlserver/tables.sql.
 *
 * The same statements as src/common/store/qb_sql_pg.h, step for step (read
 * that file's comments for why each is shaped as it is), in T-SQL:
 *	- FOR UPDATE SKIP LOCKED is WITH (ROWLOCK, READPAST, UPDLOCK): the update
 *	  lock is held to the end of the transaction and other claimers skip
 *	  the row; FOR SHARE SKIP LOCKED is WITH (ROWLOCK, READPAST,
 *	  REPEATABLEREAD).  The statement that changes a row always re-checks
 *	  its state (and token), so even an engine that ignores a hint never
 *	  gives one row to two claimers.
 *	- Arrays are JSON arrays in one NVARCHAR(MAX) parameter, read with
 *	  OPENJSON; results come back as result sets, in a fixed order.
 *	- No OUTPUT clause: a statement that must know which rows it changes
 *	  first reads them under an update lock into a table variable (the
 *	  lock keeps them as read), then updates them by a join; what the claim
 *	  took is read back by its token.  The same text runs on SQL Server and
 *	  on a Babelfish engine, which mishandles OUTPUT with a join or in a
 *	  cached plan (docs/sqlserver.md).
 *	- Each procedure runs in its caller's transaction (the daemon's ODBC
 *	  store sends BEGIN TRANSACTION first) with XACT_ABORT ON: any error
 *	  rolls the whole transaction back.  The pull claim is the exception: it opens
 *	  its own when called outside one, because its application lock needs
 *	  a transaction to belong to.
 *	- A deadlock (1205) or a lock timeout (1222) ends the transaction; the
 *	  daemon runs it again, and every step is fenced by a claim token, so a
 *	  second run changes nothing the first did.
 *	- Errors the caller caused are THROW 50022 (bad input, as SQLSTATE
 *	  22023) and 50002 (no such row, as P0002); the pull claim's lock
 *	  timeout is THROW 51000, as the spec says.
 */

/* _after: t plus ms milliseconds (DATEADD takes an INT; leases and pauses may not fit one). */
CREATE FUNCTION queuebox._after(@t DATETIME2(6), @ms BIGINT) RETURNS DATETIME2(6)
AS
BEGIN
	RETURN DATEADD(millisecond, CAST(@ms % 1000 AS INT), DATEADD(second, CAST(@ms / 1000 AS INT), @t));
END
GO

/* _epoch: seconds since 1970 as a float (DATEDIFF in seconds runs out of INT in 2038). */
CREATE FUNCTION queuebox._epoch(@t DATETIME2(6)) RETURNS FLOAT
AS
BEGIN
	RETURN CAST(DATEDIFF(day, '19700101', @t) AS FLOAT) * 86400.0
		+ DATEDIFF(millisecond, CAST(CAST(@t AS DATE) AS DATETIME2(6)), @t) / 1000.0;
END
GO

/*
 * _outbox_blocker (QB_PG_OUTBOX_BLOCKER): what holds back a row of @key at
 * @dest (NULL: not routed yet) in place @pos, as one row (id) or none.  A
 * key's order is kept per destination (docs/design/claim.md, "One key,
 * several destinations"): a row waits for the earlier open rows of its key
 * at its own destination and for those not routed yet; a row not routed
 * yet waits for every earlier open row of its key.  Earlier is by place
 * (outbox.place: a fan-out copy takes the place of the row it was copied
 * from); open is pending or processing (outbox_key_open_idx), or dead and
 * holding its key (outbox_key_dead_idx): a filtered index takes no OR, so
 * each branch is two seeks of (key, destination, place), the nearest wins;
 * the last two only for a row not routed yet, any routed row will do.
 */
CREATE FUNCTION queuebox._outbox_blocker(@key NVARCHAR(400), @dest NVARCHAR(200), @pos BIGINT)
RETURNS TABLE
AS
RETURN (
	SELECT TOP (1) f.id FROM (
		SELECT a.id, a.place FROM (SELECT TOP (1) e.id, e.place FROM queuebox.outbox e
								   WHERE e.[key] = @key AND e.destination IS NULL AND e.place < @pos
									 AND e.state IN (N'pending', N'processing')
								   ORDER BY e.place DESC) a
		UNION ALL
		SELECT a.id, a.place FROM (SELECT TOP (1) e.id, e.place FROM queuebox.outbox e
								   WHERE e.[key] = @key AND e.destination IS NULL AND e.place < @pos
									 AND e.hold = N'dead'
								   ORDER BY e.place DESC) a
		UNION ALL
		SELECT a.id, a.place FROM (SELECT TOP (1) e.id, e.place FROM queuebox.outbox e
								   WHERE e.[key] = @key AND e.destination = @dest AND e.place < @pos
									 AND e.state IN (N'pending', N'processing')
								   ORDER BY e.place DESC) a
		UNION ALL
		SELECT a.id, a.place FROM (SELECT TOP (1) e.id, e.place FROM queuebox.outbox e
								   WHERE e.[key] = @key AND e.destination = @dest AND e.place < @pos
									 AND e.hold = N'dead'
								   ORDER BY e.place DESC) a
		UNION ALL
		SELECT a.id, a.place FROM (SELECT TOP (1) e.id, e.place FROM queuebox.outbox e
								   WHERE @dest IS NULL AND e.[key] = @key AND e.destination IS NOT NULL
									 AND e.place < @pos AND e.state IN (N'pending', N'processing')) a
		UNION ALL
		SELECT a.id, a.place FROM (SELECT TOP (1) e.id, e.place FROM queuebox.outbox e
								   WHERE @dest IS NULL AND e.[key] = @key AND e.destination IS NOT NULL
									 AND e.place < @pos AND e.hold = N'dead') a) f
	ORDER BY f.place DESC);
GO

/*
 * _outbox_cycle: one cycle, in the caller's transaction (qb_store.h,
 * QbStore.outbox_cycle): the tallies into the circuit breakers, the
 * settles, the promotion of the next row of each key that ended, then
 * (@claim not NULL) the destination states and the claim.
 *	@tallies [{"d": destination, "ok": n, "ago": how many microseconds before
 *	           the tally the latest success was sent, "fail": n, "gone": bool,
 *	           "ra": Retry-After ms, "err": text, "th": failures threshold,
 *	           "cd": cooldown ms}] or NULL
 *	@settles [{"id": id, "t": token, "o": outcome, "a": attempt, "ms": delay ms,
 *	           "err": text, "d": destination, "u": true when the row had no
 *	           destination at its claim, "c": fan-out: the JSON array of the
 *	           destinations to copy the row to}] or NULL
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
	-- the keys whose row ended, or was routed now having had no destination
	-- at its claim, and where (NULL: it had none at its claim, so it held
	-- back its key at every destination)
	DECLARE @ended TABLE ([key] NVARCHAR(400) COLLATE Latin1_General_100_BIN2,
						  destination NVARCHAR(200) COLLATE Latin1_General_100_BIN2);
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
						  destination NVARCHAR(200) COLLATE Latin1_General_100_BIN2, unrouted BIT,
						  copies NVARCHAR(MAX));
		DECLARE @settled TABLE (id BIGINT PRIMARY KEY, [key] NVARCHAR(400) COLLATE Latin1_General_100_BIN2,
								state NVARCHAR(50), unrouted BIT);
		DECLARE @fan TABLE (id BIGINT PRIMARY KEY, copies NVARCHAR(MAX));

		INSERT @s (id, token, outcome, attempt, delay_ms, error, destination, unrouted, copies)
			SELECT id, token, outcome, attempt, ISNULL(delay_ms, 0), error, destination,
				   ISNULL(unrouted, 0), copies
			FROM OPENJSON(@settles) WITH (id BIGINT '$.id', token UNIQUEIDENTIFIER '$.t',
										  outcome NVARCHAR(10) '$.o', attempt INT '$.a',
										  delay_ms BIGINT '$.ms', error NVARCHAR(MAX) '$.err',
										  destination NVARCHAR(200) '$.d', unrouted BIT '$.u',
										  copies NVARCHAR(MAX) '$.c' AS JSON);
		-- the rows this token still holds, locked: the ones the update changes
		INSERT @settled (id, [key], state, unrouted)
			SELECT o.id, o.[key], CASE s.outcome WHEN N'sent' THEN N'sent' WHEN N'dead' THEN N'dead'
										 WHEN N'dead-hold' THEN N'dead' ELSE N'pending' END, s.unrouted
			FROM queuebox.outbox o WITH (UPDLOCK, ROWLOCK) JOIN @s s ON s.id = o.id
			WHERE o.claim_token = s.token AND o.state = N'processing';

		/*
		 * -- fan-out (QB_PG_OUTBOX_FANOUT): a row a route with several
		 * destinations matched is copied at its first claim, before the
		 * settle records its first destination, in this transaction: one
		 * copy per other destination, in the route's order, with the row's
		 * message_id, topic, key, payload, headers, max_attempts,
		 * scheduled_at and created_at, routed (hold NULL), origin = the
		 * row's id (its place in its key's order); the row gets origin =
		 * its id too (outbox_fanout set it already when it knew the
		 * route).  Fenced by the token, and only while the row is not
		 * routed: a row is copied once.  outbox_fanout leaves a copy as it is.
		 */
		INSERT @fan (id, copies)
			SELECT o.id, s.copies FROM queuebox.outbox o JOIN @settled w ON w.id = o.id JOIN @s s ON s.id = o.id
			WHERE s.copies IS NOT NULL AND o.destination IS NULL AND (o.origin IS NULL OR o.origin = o.id);
		IF @@ROWCOUNT > 0
		BEGIN
			UPDATE o SET origin = o.id
			FROM queuebox.outbox o JOIN @fan f ON f.id = o.id
			WHERE o.origin IS NULL AND o.destination IS NULL;
			INSERT queuebox.outbox (message_id, topic, [key], payload, headers, max_attempts, scheduled_at,
									created_at, destination, origin)
				SELECT o.message_id, o.topic, o.[key], o.payload, o.headers, o.max_attempts, o.scheduled_at,
					   o.created_at, CAST(d.[value] AS NVARCHAR(200)), o.id
				FROM @fan f JOIN queuebox.outbox o ON o.id = f.id
				CROSS APPLY OPENJSON(f.copies) d
				ORDER BY o.id, CAST(d.[key] AS INT);
		END
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
		-- a row routed now that had no destination at its claim (a fan-out
		-- row routed to its first destination, a retry, a hold, a release)
		-- no longer holds back its key's rows at the other destinations:
		-- its key is promoted as for a row that ended
		INSERT @ended ([key], destination)
			SELECT DISTINCT w.[key], CASE WHEN w.unrouted = 0 THEN o.destination END
			FROM @settled w JOIN queuebox.outbox o ON o.id = w.id
			WHERE w.[key] IS NOT NULL
			  AND (w.state IN (N'sent', N'dead') OR (w.unrouted = 1 AND o.destination IS NOT NULL));
	END

	/*
	 * -- the promotion (QB_PG_OUTBOX_PROMOTE), a statement after the settle:
	 * the settle's update waited for every claim that parked a row behind
	 * an ended row (they held a shared lock on it), so this one reads
	 * their parks.  The rows the ended row may have held back are looked
	 * at: of its key, the first pending or processing row at its
	 * destination and the first open row not routed yet; for a row that
	 * had no destination at its claim, the first at each destination too.
	 * Each is released when it is parked behind its key and nothing else
	 * holds it back (_outbox_blocker: a dead row holding its key among
	 * them).  A row not routed yet waits for rows at every destination,
	 * which may end at once in other transactions, each promotion seeing
	 * the others open: so for it a row in flight (processing) does not
	 * count (QB_PG_OUTBOX_ROUTED_WAITING); released, the claim checks its
	 * order again and parks it again under a lock.  With a claim, a due
	 * released row is claimed at once if it is routed, or if no earlier
	 * row of its key is in flight at a destination
	 * (QB_PG_OUTBOX_PROMOTE_CLAIMS): a row not routed yet released past
	 * rows in flight is only for the claim to look at again; claimed here
	 * it would go out beside them.
	 */
	IF EXISTS (SELECT 1 FROM @ended)
	BEGIN
		DECLARE @promoted TABLE (id BIGINT PRIMARY KEY, claim BIT);

		INSERT @promoted (id, claim)
			SELECT o.id, CASE WHEN @token IS NOT NULL AND o.scheduled_at <= @now
								   AND (o.destination IS NOT NULL
										OR NOT EXISTS (SELECT 1 FROM queuebox.outbox e
													   WHERE e.[key] = o.[key] AND e.destination IS NOT NULL
														 AND e.place < o.place AND e.state = N'processing'))
							  THEN 1 ELSE 0 END
			FROM queuebox.outbox o WITH (UPDLOCK, ROWLOCK)
			WHERE o.id IN (SELECT f.id FROM @ended k
						   CROSS APPLY (SELECT TOP (1) e.id FROM queuebox.outbox e
										WHERE e.[key] = k.[key] AND e.destination = k.destination
										  AND e.state IN (N'pending', N'processing')
										ORDER BY e.place) f
						   UNION ALL
						   SELECT f.id FROM @ended k
						   CROSS APPLY (SELECT TOP (1) u.id FROM (
											SELECT a.id, a.place FROM (
												SELECT TOP (1) e.id, e.place FROM queuebox.outbox e
												WHERE e.[key] = k.[key] AND e.destination IS NULL
												  AND e.state IN (N'pending', N'processing')
												ORDER BY e.place) a
											UNION ALL
											SELECT a.id, a.place FROM (
												SELECT TOP (1) e.id, e.place FROM queuebox.outbox e
												WHERE e.[key] = k.[key] AND e.destination IS NULL
												  AND e.hold = N'dead'
												ORDER BY e.place) a) u
										ORDER BY u.place) f
						   UNION ALL
						   SELECT f.id FROM @ended k
						   CROSS APPLY (SELECT DISTINCT e.destination FROM queuebox.outbox e
										WHERE e.[key] = k.[key] AND e.destination IS NOT NULL
										  AND e.state IN (N'pending', N'processing')) g
						   CROSS APPLY (SELECT TOP (1) e.id FROM queuebox.outbox e
										WHERE e.[key] = k.[key] AND e.destination = g.destination
										  AND e.state IN (N'pending', N'processing')
										ORDER BY e.place) f
						   WHERE k.destination IS NULL)
			  AND o.state = N'pending' AND o.hold = N'key'
			  AND ((o.destination IS NOT NULL
					AND NOT EXISTS (SELECT 1 FROM queuebox._outbox_blocker(o.[key], o.destination, o.place)))
				   OR (o.destination IS NULL
					   AND NOT EXISTS (SELECT 1 FROM queuebox.outbox e
									   WHERE e.[key] = o.[key] AND e.destination IS NOT NULL
										 AND e.place < o.place AND e.state = N'pending')
					   AND NOT EXISTS (SELECT 1 FROM queuebox.outbox e
									   WHERE e.[key] = o.[key] AND e.destination IS NOT NULL
										 AND e.place < o.place AND e.hold = N'dead')));
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

	/*
	 * -- two ends at once (QB_PG_OUTBOX_PROMOTE_PAST; docs/design/claim.md):
	 * a fan-out row is claimed whatever its key's order, so while it is
	 * copied it can end beside the row before it at a destination D, in
	 * another transaction; a row C parked at D behind both is then left
	 * parked by both promotions, each reading the other row in flight.  So
	 * after the promotion in a cycle that copied a fan-out row, each
	 * destination's first parked row of its key is released, unclaimed,
	 * when every earlier open row of its key at D or not routed yet is in
	 * flight (none pending, none dead holding the key).  This does not ask,
	 * as PostgreSQL does, whether one of them is being ended right now (a
	 * READPAST lock test): an engine that ignores the hint (Babelfish)
	 * would never release C.  So C may be released while its blockers are
	 * simply in flight; the claim checks its order again under a lock and
	 * parks it again behind them, one more write, in cycles that copied a
	 * fan-out row only.  Whichever of the two ends commits, one of them
	 * released C: the fan-out row's transaction reads the other row in
	 * flight, whether or not it ends.  The fan-out rows are read from @fan,
	 * declared with the settles: no table variable is added (on Babelfish
	 * each is a table made at every call).
	 */
	IF @settles IS NOT NULL
	BEGIN
		IF EXISTS (SELECT 1 FROM @fan)
			UPDATE o SET hold = NULL
			FROM queuebox.outbox o
			WHERE o.id IN (SELECT c.id FROM (SELECT DISTINCT u.[key] FROM @fan f JOIN queuebox.outbox u ON u.id = f.id
											 WHERE u.[key] IS NOT NULL) k
						   CROSS APPLY (SELECT DISTINCT e.destination FROM queuebox.outbox e
										WHERE e.[key] = k.[key] AND e.state = N'pending' AND e.hold = N'key'
										  AND e.destination IS NOT NULL) g
						   CROSS APPLY (SELECT TOP (1) e.id, e.place FROM queuebox.outbox e
										WHERE e.[key] = k.[key] AND e.destination = g.destination
										  AND e.state = N'pending' AND e.hold = N'key'
										ORDER BY e.place) c
						   WHERE NOT EXISTS (SELECT 1 FROM queuebox.outbox e
											 WHERE e.[key] = k.[key] AND e.destination = g.destination
											   AND e.place < c.place AND e.state = N'pending')
							 AND NOT EXISTS (SELECT 1 FROM queuebox.outbox e
											 WHERE e.[key] = k.[key] AND e.destination IS NULL
											   AND e.place < c.place AND e.state = N'pending')
							 AND NOT EXISTS (SELECT 1 FROM queuebox.outbox e
											 WHERE e.[key] = k.[key] AND e.destination = g.destination
											   AND e.place < c.place AND e.hold = N'dead')
							 AND NOT EXISTS (SELECT 1 FROM queuebox.outbox e
											 WHERE e.[key] = k.[key] AND e.destination IS NULL
											   AND e.place < c.place AND e.hold = N'dead'))
			  AND o.state = N'pending' AND o.hold = N'key';
	END

	IF @claim IS NOT NULL
	BEGIN
		DECLARE @probe_ms BIGINT = CONVERT(BIGINT, JSON_VALUE(@claim, '$.probe'));
		DECLARE @batch INT = CONVERT(INT, JSON_VALUE(@claim, '$.batch'));
		DECLARE @floor BIGINT = ISNULL(CONVERT(BIGINT, JSON_VALUE(@claim, '$.floor')), 0);
		DECLARE @left INT;
		DECLARE @p TABLE (destination NVARCHAR(200) COLLATE Latin1_General_100_BIN2 PRIMARY KEY);
		DECLARE @d TABLE (name NVARCHAR(200) COLLATE Latin1_General_100_BIN2 PRIMARY KEY, lim INT);
		-- a candidate: its key, destination (NULL: not routed), place, and
		-- fan 1 for a fan-out row not copied yet (origin = id, not routed)
		DECLARE @cand TABLE (id BIGINT PRIMARY KEY, [key] NVARCHAR(400) COLLATE Latin1_General_100_BIN2, src CHAR(1),
							 destination NVARCHAR(200) COLLATE Latin1_General_100_BIN2, pos BIGINT, fan BIT);
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
		INSERT @cand (id, [key], src, destination, pos, fan)
			SELECT r.id, r.[key], 'd', r.destination, r.place, 0
			FROM @d d
			CROSS APPLY (SELECT TOP (d.lim) c.id, c.[key], c.destination, c.place
						 FROM queuebox.outbox c WITH (ROWLOCK, READPAST, UPDLOCK)
						 WHERE c.destination = d.name AND c.destination IS NOT NULL
						   AND c.state = N'pending' AND c.hold IS NULL AND c.scheduled_at <= @now
						 ORDER BY c.scheduled_at, c.id) r
			WHERE d.lim > 0
			  AND NOT EXISTS (SELECT 1 FROM queuebox.destination_state s
							  WHERE s.destination = d.name
								AND (s.state <> N'closed' OR s.paused_until > @now));
		INSERT @cand (id, [key], src, destination, pos, fan)
			SELECT TOP (@batch) c.id, c.[key], 'i', NULL, c.place, CASE WHEN c.origin = c.id THEN 1 ELSE 0 END
			FROM queuebox.outbox c WITH (ROWLOCK, READPAST, UPDLOCK)
			WHERE c.state = N'pending' AND c.destination IS NULL AND c.hold IS NULL AND c.id > @floor
			ORDER BY c.id;
		SET @left = @batch - @@ROWCOUNT;
		IF @left > 0
			INSERT @cand (id, [key], src, destination, pos, fan)
				SELECT TOP (@left) c.id, c.[key], 'r', c.destination, c.place,
					   CASE WHEN c.destination IS NULL AND c.origin = c.id THEN 1 ELSE 0 END
				FROM queuebox.outbox c WITH (ROWLOCK, READPAST, UPDLOCK)
				WHERE c.state = N'pending' AND c.hold = N'ready' AND c.scheduled_at <= @now
				ORDER BY c.scheduled_at, c.id;
		INSERT @cand (id, [key], src, destination, pos, fan)
			SELECT r.id, r.[key], 'p', pd.destination, r.place, 0
			FROM @p pd
			CROSS APPLY (SELECT TOP (1) x.id, x.[key], x.place FROM (
							SELECT 1 AS pri, h.id, h.[key], h.place FROM (
								SELECT TOP (1) c.id, c.[key], c.place FROM queuebox.outbox c WITH (ROWLOCK, READPAST, UPDLOCK)
								WHERE c.destination = pd.destination AND c.state = N'pending'
								  AND c.hold = N'destination'
								ORDER BY c.id) h
							UNION ALL
							SELECT 2, g.id, g.[key], g.place FROM (
								SELECT TOP (1) c.id, c.[key], c.place FROM queuebox.outbox c WITH (ROWLOCK, READPAST, UPDLOCK)
								WHERE c.destination = pd.destination AND c.destination IS NOT NULL
								  AND c.state = N'pending' AND c.hold IS NULL
								ORDER BY c.scheduled_at, c.id) g) x
						 ORDER BY x.pri) r
			WHERE NOT EXISTS (SELECT 1 FROM @cand k WHERE k.id = r.id);

		/*
		 * -- per-key order, per destination: a keyed candidate that an
		 * earlier open row of its key holds back (_outbox_blocker) is parked
		 * behind it when that row can be share-locked (so the settle that
		 * ends it waits for this commit, and its promotion sees the park),
		 * else moved to ready to be looked at again; a fan-out row not
		 * copied yet is claimed whatever its key's order (it is only copied
		 * and routed back, not_due), each copy then waits at its own
		 * destination --
		 */
		INSERT @blk (cid, bid)
			SELECT c.id, b.id FROM @cand c
			CROSS APPLY queuebox._outbox_blocker(c.[key], c.destination, c.pos) b
			WHERE c.[key] IS NOT NULL AND c.fan = 0;
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
		-- (a row the promotion released and did not claim was a candidate:
		-- what the claim did with it replaces what the promotion said)
		DELETE r FROM @rows r JOIN @cand c ON c.id = r.id WHERE r.claimed = 0;
		INSERT @rows (id, claimed, destination, src, not_due)
			SELECT o.id, CASE WHEN o.claim_token = @token THEN 1 ELSE 0 END, o.destination, c.src,
				   CASE WHEN o.scheduled_at > @now OR c.fan = 1 THEN 1 ELSE 0 END
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

/*
 * _outbox_unpark (QB_PG_OUTBOX_UNPARK): rows held for the destinations of
 * @dests (a JSON array of names), at most @limit each, become claimable,
 * due now at the latest.  A destination whose stored circuit is not
 * closed, or that is paused, keeps its rows.  One row: the rows moved.
 */
CREATE PROCEDURE queuebox._outbox_unpark @dests NVARCHAR(MAX), @limit INT
AS
BEGIN
	SET NOCOUNT ON;
	SET XACT_ABORT ON;
	DECLARE @now DATETIME2(6) = SYSUTCDATETIME();
	DECLARE @n INT;

	UPDATE o
	SET hold = NULL, scheduled_at = CASE WHEN o.scheduled_at < @now THEN o.scheduled_at ELSE @now END
	FROM queuebox.outbox o
	WHERE o.id IN (
		SELECT x.id
		FROM OPENJSON(@dests) WITH (name NVARCHAR(200) '$') d
		CROSS APPLY (SELECT TOP (@limit) c.id FROM queuebox.outbox c WITH (ROWLOCK, READPAST, UPDLOCK)
					 WHERE c.destination = d.name AND c.state = N'pending' AND c.hold = N'destination'
					 ORDER BY c.id) x
		WHERE NOT EXISTS (SELECT 1 FROM queuebox.destination_state s
						  WHERE s.destination = d.name
							AND (s.state <> N'closed' OR s.paused_until > @now)))
	  AND o.state = N'pending' AND o.hold = N'destination';
	SET @n = @@ROWCOUNT;
	SELECT @n AS moved;
END
GO

/*
 * _outbox_unroute (QB_PG_OUTBOX_UNROUTE): rows routed to a destination not
 * among @dests (a JSON array of the configuration's names) are routed again
 * by the next claim (a row parked behind its key stays parked).  A fan-out
 * row (origin set) belongs to its destination: it goes dead saying so
 * (routed again, it would be delivered twice elsewhere).  One row: the
 * rows moved.
 */
CREATE PROCEDURE queuebox._outbox_unroute @dests NVARCHAR(MAX)
AS
BEGIN
	SET NOCOUNT ON;
	SET XACT_ABORT ON;
	DECLARE @n INT;

	UPDATE o
	SET destination = CASE WHEN o.origin IS NOT NULL THEN o.destination END,
		state = CASE WHEN o.origin IS NOT NULL THEN N'dead' ELSE N'pending' END,
		hold = CASE WHEN o.origin IS NOT NULL THEN NULL WHEN o.hold = N'key' THEN N'key' ELSE N'ready' END,
		last_error = CASE WHEN o.origin IS NOT NULL
			THEN N'destination ' + o.destination + N' is no longer in the configuration;'
				+ N' add it back and requeue the row (queuebox.requeue_outbox), or leave it dead'
			ELSE o.last_error END
	FROM queuebox.outbox o
	WHERE o.state = N'pending' AND o.destination IS NOT NULL
	  AND o.destination NOT IN (SELECT name FROM OPENJSON(@dests) WITH (name NVARCHAR(200) '$'));
	SET @n = @@ROWCOUNT;
	SELECT @n AS moved;
END
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

/*
 * _limits_take (QB_PG_LIMITS_TAKE): the destinations' limits across every
 * replica on this database (QbStore.limits_take; docs/delivery.md,
 * "Limits").
 *	@takes [{"n": destination, "r": perSecond (0: none), "b": burst,
 *	         "m": maxConcurrent (0: none), "h": the places the caller holds
 *	         in use, "o": the tokens it took before and has not spent,
 *	         "g": tokens it gives back, "w": what it asks for}]
 *	@claimer: the caller's claimer (its places); @lease: > 0, its places
 *	          count for that many ms, else while _claimer_gone says it lives
 * One result set: destination, got, wait_ms (in how many ms a token comes
 * when tokens cut it; -1: places did, or it got all).  The bucket rows are
 * locked first (an UPDATE that changes nothing: UPDLOCK is ignored on
 * Babelfish), the places read only then, in later statements; two takes
 * that lock in another order are a deadlock the store runs again.  The
 * bucket refills up to burst less the tokens the live claimers' rows count
 * out: those rows were as they are since the last take, which refilled it
 * too, so a token spent late counts as taken when its claimer's take says
 * it was spent (qb_ratelimit.h).  A new bucket is full; a bucket not used
 * for an hour is full again.
 */
CREATE PROCEDURE queuebox._limits_take @takes NVARCHAR(MAX), @claimer BIGINT, @lease BIGINT = 0
AS
BEGIN
	SET NOCOUNT ON;
	SET XACT_ABORT ON;
	DECLARE @now DATETIME2(6);
	DECLARE @t TABLE (destination NVARCHAR(200) COLLATE Latin1_General_100_BIN2 PRIMARY KEY,
					  per_sec FLOAT, burst INT, max_concurrent INT, held INT, tokens_out INT,
					  give INT, want INT, out_all INT NULL, tokens FLOAT NULL, places INT NULL,
					  got INT NULL);

	INSERT @t (destination, per_sec, burst, max_concurrent, held, tokens_out, give, want)
		SELECT n, r, b, m, h, ISNULL(o, 0), g, w FROM OPENJSON(@takes)
		WITH (n NVARCHAR(200) '$.n', r FLOAT '$.r', b INT '$.b', m INT '$.m', h INT '$.h',
			  o INT '$.o', g INT '$.g', w INT '$.w');
	INSERT INTO queuebox.destination_limit (destination, tokens, refilled_at)
		SELECT t.destination, t.burst, SYSUTCDATETIME() FROM @t t
		WHERE NOT EXISTS (SELECT 1 FROM queuebox.destination_limit l WHERE l.destination = t.destination);
	UPDATE l SET tokens = l.tokens
	FROM queuebox.destination_limit l JOIN @t t ON t.destination = l.destination;
	SET @now = SYSUTCDATETIME();

	UPDATE t
	SET out_all = ISNULL((
		SELECT SUM(p.tokens_out) FROM queuebox.destination_limit_place p
		WHERE p.destination = t.destination AND p.tokens_out > 0
		  AND (p.claimer = @claimer
			   OR 0 = CASE WHEN p.alive_until IS NULL THEN queuebox._claimer_gone(p.claimer, @claimer)
						   WHEN p.alive_until >= @now THEN 0 ELSE 1 END)), 0)
	FROM @t t WHERE t.per_sec > 0;
	UPDATE t
	SET tokens = t.give
		+ CASE WHEN l.refilled_at < DATEADD(hour, -1, @now)
				 OR l.tokens + t.per_sec * DATEDIFF(ms, l.refilled_at, @now) / 1000.0 > t.burst - t.out_all
			   THEN CASE WHEN t.burst > t.out_all THEN t.burst - t.out_all ELSE 0 END
			   ELSE l.tokens + t.per_sec * DATEDIFF(ms, l.refilled_at, @now) / 1000.0 END
	FROM @t t JOIN queuebox.destination_limit l ON l.destination = t.destination
	WHERE t.per_sec > 0;
	UPDATE @t SET tokens = burst WHERE per_sec > 0 AND tokens > burst;
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
	UPDATE p SET held = CASE WHEN t.max_concurrent > 0 THEN t.held + t.got ELSE 0 END,
		tokens_out = CASE WHEN t.per_sec > 0 THEN t.tokens_out + t.got ELSE 0 END,
		alive_until = CASE WHEN @lease > 0 THEN DATEADD(ms, @lease, @now) END
	FROM queuebox.destination_limit_place p JOIN @t t ON t.destination = p.destination
	WHERE p.claimer = @claimer;
	INSERT INTO queuebox.destination_limit_place (destination, claimer, held, tokens_out, alive_until)
		SELECT t.destination, @claimer, CASE WHEN t.max_concurrent > 0 THEN t.held + t.got ELSE 0 END,
			CASE WHEN t.per_sec > 0 THEN t.tokens_out + t.got ELSE 0 END,
			CASE WHEN @lease > 0 THEN DATEADD(ms, @lease, @now) END
		FROM @t t
		WHERE NOT EXISTS (SELECT 1 FROM queuebox.destination_limit_place p
						  WHERE p.destination = t.destination AND p.claimer = @claimer);
	SELECT destination, got,
		CASE WHEN got < want AND per_sec > 0 AND (places IS NULL OR got < places)
			 THEN CASE WHEN (1 - (tokens - got)) <= 0 THEN 0
					   ELSE CONVERT(INT, CEILING((1 - (tokens - got)) * 1000 / per_sec)) END
			 ELSE -1 END AS wait_ms
	FROM @t;
END
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

/* _outbox_retention (QB_PG_OUTBOX_RETENTION): delete at most @limit sent rows older than @seconds. */
CREATE PROCEDURE queuebox._outbox_retention @seconds BIGINT, @limit INT
AS
BEGIN
	SET NOCOUNT ON;
	SET XACT_ABORT ON;
	DECLARE @before DATETIME2(6) = queuebox._after(SYSUTCDATETIME(), -1000 * @seconds);
	DECLARE @n INT;

	DELETE o FROM queuebox.outbox o
	WHERE o.id IN (SELECT TOP (@limit) x.id FROM queuebox.outbox x WITH (ROWLOCK, READPAST, UPDLOCK)
				   WHERE x.state = N'sent' AND x.created_at < @before)
	  AND o.state = N'sent';
	SET @n = @@ROWCOUNT;
	SELECT @n AS deleted;
END
GO

/*
 * _outbox_sweep (QB_PG_OUTBOX_SWEEP): rows parked behind their key that
 * nothing holds back any more (_outbox_blocker) are released, as the
 * promotion would have released them (ready, or back to their
 * destination's routed rows; the claim checks the key's order again).  A
 * Babelfish engine ignores the shared lock a park is made under, so a
 * settle can end the earlier row and run its promotion before the park
 * commits: this is what frees such a row.  The walk visits at most @limit
 * keys and destinations that have parked rows (a key's order is kept per
 * destination; NULL, not routed yet, first), in key order from @after
 * (N'': the first), one seek of outbox_parked_idx each for its first
 * parked row, and probes outbox_key_open_idx and outbox_key_dead_idx for
 * what holds it back.  One row: the rows released, and the key the next
 * sweep starts at (NULL: the walk reached the last key; the key's
 * destinations are walked again from its first).
 */
CREATE PROCEDURE queuebox._outbox_sweep @after NVARCHAR(400), @limit INT
AS
BEGIN
	SET NOCOUNT ON;
	SET XACT_ABORT ON;
	DECLARE @key NVARCHAR(400) = ISNULL(@after, N'');
	DECLARE @dest NVARCHAR(200);
	DECLARE @next NVARCHAR(400);
	DECLARE @ndest NVARCHAR(200);
	DECLARE @id BIGINT;
	DECLARE @pos BIGINT;
	DECLARE @seen INT = 0;
	DECLARE @n INT;
	DECLARE @free TABLE (id BIGINT PRIMARY KEY);

	WHILE @seen < @limit
	BEGIN
		SET @id = NULL;
		-- the key's next destination with parked rows (after @dest; NULL sorts first)
		IF @seen > 0
			SELECT TOP (1) @ndest = o.destination, @id = o.id, @pos = o.place
			FROM queuebox.outbox o
			WHERE o.state = N'pending' AND o.hold = N'key' AND o.[key] = @key
			  AND o.destination IS NOT NULL AND (@dest IS NULL OR o.destination > @dest)
			ORDER BY o.destination, o.place;
		-- else the next key with parked rows (@after itself first), its first destination
		IF @id IS NULL
		BEGIN
			SELECT TOP (1) @next = o.[key], @ndest = o.destination, @id = o.id, @pos = o.place
			FROM queuebox.outbox o
			WHERE o.state = N'pending' AND o.hold = N'key' AND o.[key] >= @key
			  AND (@seen = 0 OR o.[key] > @key)
			ORDER BY o.[key], o.destination, o.place;
			IF @id IS NULL
				BREAK;
			SET @key = @next;
		END
		SET @dest = @ndest;
		SET @seen = @seen + 1;
		IF NOT EXISTS (SELECT 1 FROM queuebox._outbox_blocker(@key, @dest, @pos))
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
 * _inbox_insert (QB_PG_INBOX_INSERT): @rows [{"s": source, "k": idempotency
 * key, "e": event type, "a": aggregate id, "p": the payload, "ps": true
 * when p is [the payload] (a JSON scalar: AS JSON reads objects and arrays
 * only), "h": the headers object, "c": "push" or "pull", "err": last_error
 * (NULL: pending, else stored dead)}].  Payload and headers are JSON values
 * in the document, read AS JSON: stored as sent, never escaped twice.  In
 * array order; of two rows of one key the first is stored, a key that
 * exists is skipped (the range lock makes a concurrent insert of the same
 * key wait, then skip; should two still meet, the unique index answers
 * 2601 and the daemon runs the call again).  Returns the stored rows' id,
 * source and idempotency key, in array order.
 */
CREATE PROCEDURE queuebox._inbox_insert @rows NVARCHAR(MAX)
AS
BEGIN
	SET NOCOUNT ON;
	SET XACT_ABORT ON;
	DECLARE @new TABLE (n INT PRIMARY KEY, s NVARCHAR(200) COLLATE Latin1_General_100_BIN2,
						k NVARCHAR(400) COLLATE Latin1_General_100_BIN2, e NVARCHAR(400), a NVARCHAR(400),
						p NVARCHAR(MAX), h NVARCHAR(MAX), c NVARCHAR(10), err NVARCHAR(MAX));

	INSERT @new (n, s, k, e, a, p, h, c, err)
		SELECT r.n, r.s, r.k, r.e, r.a,
			   CASE WHEN r.ps = 1 THEN SUBSTRING(r.p, 2, LEN(r.p) - 2) ELSE r.p END, r.h, r.c, r.err
		FROM (SELECT CAST(j.[key] AS INT) AS n, x.*,
					 ROW_NUMBER() OVER (PARTITION BY x.s, x.k ORDER BY CAST(j.[key] AS INT)) AS nth
			  FROM OPENJSON(@rows) j
			  CROSS APPLY OPENJSON(j.[value]) WITH (s NVARCHAR(200) '$.s', k NVARCHAR(400) '$.k',
													e NVARCHAR(400) '$.e', a NVARCHAR(400) '$.a',
													p NVARCHAR(MAX) '$.p' AS JSON, ps BIT '$.ps',
													h NVARCHAR(MAX) '$.h' AS JSON,
													c NVARCHAR(10) '$.c', err NVARCHAR(MAX) '$.err') x) r
		WHERE r.nth = 1
		  AND NOT EXISTS (SELECT 1 FROM queuebox.inbox i WITH (UPDLOCK, HOLDLOCK)
						  WHERE i.source = r.s AND i.idempotency_key = r.k);
	INSERT queuebox.inbox (source, idempotency_key, event_type, aggregate_id, payload, headers,
						   consumption, state, last_error)
		SELECT s, k, e, a, p, ISNULL(h, N'{}'), c,
			   CASE WHEN err IS NULL THEN N'pending' ELSE N'dead' END, err
		FROM @new ORDER BY n;
	-- the keys were locked by the check above: these rows are this call's
	SELECT i.id, i.source, i.idempotency_key
	FROM @new w JOIN queuebox.inbox i ON i.source = w.s AND i.idempotency_key = w.k
	ORDER BY w.n;
END
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

/*
 * _relay_headers (QB_PG_INBOX_TO_OUTBOX): the received headers with
 * x-inbox-id, x-source, x-idempotency-key and X-Correlation-Id replacing
 * any of those names in any letter case (the received correlation id,
 * whatever its case, kept under the canonical name).
 */
CREATE FUNCTION queuebox._relay_headers(@headers NVARCHAR(MAX), @id BIGINT, @source NVARCHAR(200),
										@key NVARCHAR(400)) RETURNS NVARCHAR(MAX)
AS
BEGIN
	DECLARE @kept NVARCHAR(MAX), @corr NVARCHAR(MAX);

	SELECT @kept = STRING_AGG(CAST(N'"' + STRING_ESCAPE(h.[key], 'json') + N'":'
								   + CASE h.[type] WHEN 1 THEN N'"' + STRING_ESCAPE(h.[value], 'json') + N'"'
												   WHEN 0 THEN N'null'
												   ELSE h.[value] END AS NVARCHAR(MAX)), N',')
	FROM OPENJSON(@headers) h
	WHERE LOWER(h.[key]) NOT IN (N'x-inbox-id', N'x-source', N'x-idempotency-key', N'x-correlation-id');
	SELECT TOP (1) @corr = CASE h.[type] WHEN 1 THEN N'"' + STRING_ESCAPE(h.[value], 'json') + N'"'
										 WHEN 0 THEN N'null' ELSE h.[value] END
	FROM OPENJSON(@headers) h
	WHERE LOWER(h.[key]) = N'x-correlation-id';
	RETURN N'{' + ISNULL(@kept + N',', N'')
		+ N'"x-inbox-id":"' + CAST(@id AS NVARCHAR(20)) + N'",'
		+ N'"x-source":"' + STRING_ESCAPE(@source, 'json') + N'",'
		+ N'"x-idempotency-key":"' + STRING_ESCAPE(@key, 'json') + N'"'
		+ ISNULL(N',"X-Correlation-Id":' + @corr, N'') + N'}';
END
GO

/*
 * _relay_forward (QB_PG_RELAY_FORWARD, then QB_PG_RELAY_PROMOTE in a later
 * statement): @rows [{"id": inbox id, "t": rendered topic, "h": 1 when a
 * dead row holds its aggregate (its source's onDead: holdKey)}] claimed
 * under @token.  Each row with a non-empty topic becomes an outbox row and
 * is marked processed; one whose topic rendered empty is marked dead, with
 * hold N'dead' when "h" says so and it has an aggregate.  Then the first
 * open row of each ended row's aggregate is released (a row holding it is
 * that first row, and is not pending: nothing moves).  One row: the inbox
 * rows settled, the outbox rows inserted.
 */
CREATE PROCEDURE queuebox._relay_forward @token UNIQUEIDENTIFIER, @rows NVARCHAR(MAX), @max_attempts INT
AS
BEGIN
	SET NOCOUNT ON;
	SET XACT_ABORT ON;
	DECLARE @c TABLE (id BIGINT PRIMARY KEY, out_topic NVARCHAR(400), holds BIT);
	DECLARE @ended TABLE (id BIGINT PRIMARY KEY, source NVARCHAR(200) COLLATE Latin1_General_100_BIN2,
						  aggregate_id NVARCHAR(400) COLLATE Latin1_General_100_BIN2);
	DECLARE @ninserted INT;

	INSERT @c (id, out_topic, holds)
		SELECT s.id, s.t, ISNULL(s.h, 0)
		FROM OPENJSON(@rows) WITH (id BIGINT '$.id', t NVARCHAR(400) '$.t', h BIT '$.h') s
		JOIN queuebox.inbox i WITH (UPDLOCK, ROWLOCK) ON i.id = s.id
		WHERE i.claim_token = @token AND i.state = N'processing';
	INSERT queuebox.outbox (topic, [key], payload, headers, max_attempts)
		SELECT c.out_topic, i.aggregate_id, i.payload,
			   queuebox._relay_headers(i.headers, i.id, i.source, i.idempotency_key), @max_attempts
		FROM @c c JOIN queuebox.inbox i ON i.id = c.id
		WHERE c.out_topic <> N''
		ORDER BY i.created_at, i.id;
	SET @ninserted = @@ROWCOUNT;
	-- @c holds the rows this token holds, locked: all of them end here
	INSERT @ended (id, source, aggregate_id)
		SELECT i.id, i.source, i.aggregate_id FROM @c c JOIN queuebox.inbox i ON i.id = c.id;
	UPDATE i
	SET state = CASE WHEN c.out_topic <> N'' THEN N'processed' ELSE N'dead' END,
		hold = CASE WHEN c.out_topic = N'' AND c.holds = 1 AND i.aggregate_id IS NOT NULL THEN N'dead' END,
		last_error = CASE WHEN c.out_topic <> N'' THEN i.last_error
			ELSE N'the topic template rendered empty, so the message can reach no destination; set eventTypePath or use {{ source }} in the topic, then requeue the row' END,
		claim_token = NULL, lease_until = NULL
	FROM queuebox.inbox i JOIN @c c ON c.id = i.id
	WHERE i.claim_token = @token AND i.state = N'processing';

	-- the promotion: a statement after the forward's update, which waited
	-- for every claim parking a row behind an ended one
	UPDATE o SET hold = NULL
	FROM queuebox.inbox o
	WHERE o.state = N'pending'
	  AND o.id IN (
		SELECT f.id FROM @ended x
		CROSS APPLY (SELECT TOP (1) u.id FROM (
						 SELECT p.id, p.created_at FROM (
							 SELECT TOP (1) e.id, e.created_at FROM queuebox.inbox e
							 WHERE e.consumption = N'push' AND e.aggregate_id = x.aggregate_id
							   AND e.state IN (N'pending', N'processing')
							 ORDER BY e.created_at, e.id) p
						 UNION ALL
						 SELECT d.id, d.created_at FROM (
							 SELECT TOP (1) e.id, e.created_at FROM queuebox.inbox e
							 WHERE e.hold = N'dead' AND e.aggregate_id = x.aggregate_id
							 ORDER BY e.created_at, e.id) d) u
					 ORDER BY u.created_at, u.id) f
		WHERE x.aggregate_id IS NOT NULL
		UNION ALL
		SELECT f.id FROM @ended x
		CROSS APPLY (SELECT TOP (1) e.id, e.consumption FROM queuebox.inbox e
					 WHERE e.source = x.source AND e.aggregate_id = x.aggregate_id
					   AND e.state IN (N'pending', N'processing')
					 ORDER BY e.created_at, e.id) f
		WHERE x.aggregate_id IS NOT NULL AND f.consumption = N'pull');
	SELECT (SELECT COUNT(*) FROM @ended) AS settled, @ninserted AS inserted;
END
GO

/*
 * _inbox_replay (QB_PG_INBOX_REPLAY): new outbox rows from inbox rows
 * through the relay's mapping, @rows [{"id": inbox id, "t": rendered
 * topic}], in created_at, id order; the inbox rows are not changed.  One
 * row: the rows inserted, and the new id when there is one.
 */
CREATE PROCEDURE queuebox._inbox_replay @rows NVARCHAR(MAX), @max_attempts INT
AS
BEGIN
	SET NOCOUNT ON;
	SET XACT_ABORT ON;
	DECLARE @n INT;

	INSERT queuebox.outbox (topic, [key], payload, headers, max_attempts)
	SELECT s.t, i.aggregate_id, i.payload,
		   queuebox._relay_headers(i.headers, i.id, i.source, i.idempotency_key), @max_attempts
	FROM OPENJSON(@rows) WITH (id BIGINT '$.id', t NVARCHAR(400) '$.t') s
	JOIN queuebox.inbox i ON i.id = s.id
	WHERE s.t <> N''
	ORDER BY i.created_at, i.id;
	SET @n = @@ROWCOUNT;
	-- the new id is asked for one row only (the admin route's single replay)
	SELECT @n AS replayed, CASE WHEN @n = 1 THEN CAST(SCOPE_IDENTITY() AS BIGINT) END AS first_id;
END
GO

-- ---------------------------------------------------------------------------
-- The five pull statements (examples/pull/sql/sqlserver, docs/pull.md)
-- ---------------------------------------------------------------------------
/*
 * inbox_claim: up to @batch_size messages of pull source @source, each with
 * a new claim token and a lease of @lease_ms, as queuebox.inbox_claim() on
 * PostgreSQL: expired leases first (a takeover), then due rows in due
 * order, never two open rows of one (source, aggregate).
 *
 * One claim at a time per source: an exclusive application lock owned by
 * the transaction (released at its end).  A claim that waits 10 s for it
 * raises Msg 51000: a temporary failure, claim again after a pause.  Run it
 * alone in its own transaction and commit before a handler starts; called
 * outside a transaction it opens and commits its own.
 */
CREATE PROCEDURE queuebox.inbox_claim @source NVARCHAR(200), @batch_size INT, @lease_ms INT
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

/* inbox_renew: extend the lease of a message this token still holds; renewed 1 or 0. */
CREATE PROCEDURE queuebox.inbox_renew @id BIGINT, @claim_token UNIQUEIDENTIFIER, @lease_ms INT
AS
BEGIN
	SET NOCOUNT ON;
	SET XACT_ABORT ON;
	DECLARE @n INT;

	UPDATE queuebox.inbox
	SET lease_until = queuebox._after(SYSUTCDATETIME(), @lease_ms)
	WHERE id = @id AND claim_token = @claim_token AND state = N'processing';
	SET @n = @@ROWCOUNT;
	SELECT CAST(CASE WHEN @n = 1 THEN 1 ELSE 0 END AS BIT) AS renewed;
END
GO

/*
 * _inbox_end: end a claimed pull row (processed, or dead with @error), then
 * release the next row of its (source, aggregate).  The update waits for
 * every claim that is parking a row behind this one (they hold a shared
 * lock on it); the release is a later statement, so it reads their parks.
 */
CREATE PROCEDURE queuebox._inbox_end @id BIGINT, @claim_token UNIQUEIDENTIFIER, @end_state NVARCHAR(50),
	@error NVARCHAR(MAX), @ok BIT OUTPUT
AS
BEGIN
	SET NOCOUNT ON;
	SET XACT_ABORT ON;
	DECLARE @u TABLE (id BIGINT, source NVARCHAR(200) COLLATE Latin1_General_100_BIN2,
					  aggregate_id NVARCHAR(400) COLLATE Latin1_General_100_BIN2);

	INSERT @u (id, source, aggregate_id)
		SELECT id, source, aggregate_id FROM queuebox.inbox WITH (UPDLOCK, ROWLOCK)
		WHERE id = @id AND claim_token = @claim_token AND state = N'processing';
	UPDATE queuebox.inbox
	SET state = @end_state,
		last_error = CASE WHEN @end_state = N'dead' THEN @error ELSE last_error END,
		claim_token = NULL, lease_until = NULL
	WHERE id = @id AND claim_token = @claim_token AND state = N'processing';
	SET @ok = CASE WHEN @@ROWCOUNT = 1 THEN 1 ELSE 0 END;

	UPDATE o SET hold = NULL
	FROM queuebox.inbox o
	WHERE o.state = N'pending'
	  AND o.id = (SELECT f.id FROM @u u
				  CROSS APPLY (SELECT TOP (1) e.id, e.consumption FROM queuebox.inbox e
							   WHERE e.source = u.source AND e.aggregate_id = u.aggregate_id
								 AND e.state IN (N'pending', N'processing') AND e.id <> u.id
							   ORDER BY e.created_at, e.id) f
				  WHERE f.consumption = N'pull');
END
GO

/* inbox_complete: the message is processed; completed 1, or 0 when another worker owns it. */
CREATE PROCEDURE queuebox.inbox_complete @id BIGINT, @claim_token UNIQUEIDENTIFIER
AS
BEGIN
	SET NOCOUNT ON;
	DECLARE @ok BIT;

	EXEC queuebox._inbox_end @id, @claim_token, N'processed', NULL, @ok OUTPUT;
	SELECT @ok AS completed;
END
GO

/* inbox_dead: the message goes dead with @error; dead 1, or 0 when another worker owns it. */
CREATE PROCEDURE queuebox.inbox_dead @id BIGINT, @claim_token UNIQUEIDENTIFIER, @error NVARCHAR(MAX)
AS
BEGIN
	SET NOCOUNT ON;
	DECLARE @ok BIT;

	EXEC queuebox._inbox_end @id, @claim_token, N'dead', @error, @ok OUTPUT;
	SELECT @ok AS dead;
END
GO

/* inbox_retry: back to pending, attempt + 1, due after @delay_ms; retried 1 or 0. */
CREATE PROCEDURE queuebox.inbox_retry @id BIGINT, @claim_token UNIQUEIDENTIFIER, @delay_ms INT,
	@error NVARCHAR(MAX)
AS
BEGIN
	SET NOCOUNT ON;
	SET XACT_ABORT ON;
	DECLARE @n INT;

	UPDATE queuebox.inbox
	SET state = N'pending', attempt = attempt + 1,
		scheduled_at = queuebox._after(SYSUTCDATETIME(), CASE WHEN @delay_ms > 0 THEN @delay_ms ELSE 0 END),
		last_error = @error, claim_token = NULL, lease_until = NULL
	WHERE id = @id AND claim_token = @claim_token AND state = N'processing';
	SET @n = @@ROWCOUNT;
	SELECT CAST(CASE WHEN @n = 1 THEN 1 ELSE 0 END AS BIT) AS retried;
END
GO
