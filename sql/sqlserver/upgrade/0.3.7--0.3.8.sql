/*
 * sql/sqlserver/upgrade/0.3.7--0.3.8.sql
 *	  What changes from schema 0.3.7 to 0.3.8 on SQL Server (issue 39), one
 *	  section each below: fan-out; limits across the daemon's replicas (two
 *	  tables, empty until a daemon takes a limit, and _limits_take); the
 *	  version.  T-SQL batches split on GO.
 */

-- ---- fan-out: a key's order per destination ---------------------------------
-- A route may name several destinations (destinations: [a, b]): a row is
-- marked at insert (the outbox_fanout trigger), copied at its first claim,
-- one copy per other destination, and each copy keeps its key's order at
-- its own destination (docs/delivery.md, "Fan-out"; docs/design/claim.md,
-- "One key, several destinations"; docs/sqlserver.md).
-- - config_route: destination holds every name of a fan-out route (4000
--   characters), fanout marks such a route.  Babelfish cannot ALTER COLUMN
--   with a COLLATE, so the table is made again, its rows kept (the daemon
--   writes them again at its next start anyway); roles.sql, which follows
--   this step, grants it again.
-- - outbox.origin (on a copy, the row it was copied from; a nullable
--   column: no row is rewritten) and outbox.place, computed (its id or its
--   origin: its place in its key's order; not stored, the indexes hold it).
-- - outbox_key_open_idx, outbox_key_dead_idx and outbox_parked_idx made
--   again on (key, destination, place), in this step's transaction;
--   outbox_origin_idx.
-- - route_of returns every destination of a fan-out route (NVARCHAR(4000)):
--   made again by DROP and CREATE, and outbox_stats, which reads it, with it.
-- - _outbox_blocker, the outbox_fanout trigger, and the procedures that
--   follow a key's order or a fan-out row (ALTER PROCEDURE keeps their
--   grants).  No row changes.
DECLARE @routes TABLE (position INT PRIMARY KEY, pattern NVARCHAR(400), destination NVARCHAR(4000));
INSERT @routes (position, pattern, destination)
	SELECT position, pattern, destination FROM queuebox.config_route;
DROP TABLE queuebox.config_route;
CREATE TABLE queuebox.config_route (
	position	INT NOT NULL CONSTRAINT config_route_pkey PRIMARY KEY,
	pattern		NVARCHAR(400) COLLATE Latin1_General_100_BIN2 NOT NULL,
	destination	NVARCHAR(4000) COLLATE Latin1_General_100_BIN2 NOT NULL,
	fanout		BIT NOT NULL CONSTRAINT config_route_fanout_default DEFAULT 0
);
INSERT queuebox.config_route (position, pattern, destination)
	SELECT position, pattern, destination FROM @routes;
GO
ALTER TABLE queuebox.outbox ADD origin BIGINT NULL;
GO
ALTER TABLE queuebox.outbox ADD place AS ISNULL(origin, id);
GO
DROP INDEX outbox_key_open_idx ON queuebox.outbox;
DROP INDEX outbox_key_dead_idx ON queuebox.outbox;
DROP INDEX outbox_parked_idx ON queuebox.outbox;
CREATE INDEX outbox_key_open_idx ON queuebox.outbox ([key], destination, place)
	WHERE state IN (N'pending', N'processing') AND [key] IS NOT NULL;
CREATE INDEX outbox_key_dead_idx ON queuebox.outbox ([key], destination, place)
	WHERE hold = N'dead';
CREATE INDEX outbox_parked_idx ON queuebox.outbox ([key], destination, place)
	WHERE state = N'pending' AND hold = N'key';
CREATE INDEX outbox_origin_idx ON queuebox.outbox (origin)
	WHERE origin IS NOT NULL;
GO
DROP VIEW queuebox.outbox_stats;
GO
DROP FUNCTION queuebox.route_of;
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
ALTER PROCEDURE queuebox._outbox_cycle
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
 * _outbox_unroute (QB_PG_OUTBOX_UNROUTE): rows routed to a destination not
 * among @dests (a JSON array of the configuration's names) are routed again
 * by the next claim (a row parked behind its key stays parked).  A fan-out
 * row (origin set) belongs to its destination: it goes dead saying so
 * (routed again, it would be delivered twice elsewhere).  One row: the
 * rows moved.
 */
ALTER PROCEDURE queuebox._outbox_unroute @dests NVARCHAR(MAX)
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
ALTER PROCEDURE queuebox._outbox_sweep @after NVARCHAR(400), @limit INT
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
 * requeue_outbox: a dead row back to pending, due now, attempts reset,
 * routed again; a row of a route with several destinations (origin set)
 * goes back to its own destination only (routed again, the others would
 * have it twice).  Recorded in outbox_audit (a requeue, the payload
 * unchanged).
 */
ALTER PROCEDURE queuebox.requeue_outbox @id BIGINT
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
ALTER PROCEDURE queuebox.requeue_outbox_matching @topic_pattern NVARCHAR(400) = NULL,
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
ALTER PROCEDURE queuebox.requeue_outbox_edited @id BIGINT, @payload NVARCHAR(MAX)
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
ALTER PROCEDURE queuebox.skip_outbox @id BIGINT
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
ALTER PROCEDURE queuebox.held_keys @limit INT = 100
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

/*
 * replay_outbox: a new pending row with the same content and a new
 * message_id; a row of a route with several destinations (origin set) is
 * replayed to its own destination only.  Its id, or NULL.
 */
ALTER PROCEDURE queuebox.replay_outbox @id BIGINT
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
ALTER PROCEDURE queuebox.replay_outbox_matching @state NVARCHAR(50) = NULL,
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
 * outbox_row: the whole outbox row as one JSON text (row), payload and
 * headers as they are stored, with its audit rows oldest first and, for a
 * row of a route with several destinations, every delivery of its message
 * (deliveries: id, destination, state, by id; null otherwise); no row
 * when there is none.  Built as text: a payload may be any JSON, which
 * JSON_QUERY does not take.
 */
ALTER PROCEDURE queuebox.outbox_row @id BIGINT
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
-- bucket, and the places and tokens each claimer holds (tokens taken and
-- not spent yet: the bucket refills up to burst less them).  Written by
-- _limits_take alone (engine.sql), which locks a destination's bucket row
-- before it reads or writes either table.  A claimer's places and tokens
-- count while _claimer_gone says it lives (its applock; on Babelfish its
-- beat), or until alive_until.
CREATE TABLE queuebox.destination_limit (
	destination		NVARCHAR(200) COLLATE Latin1_General_100_BIN2 NOT NULL CONSTRAINT destination_limit_pkey PRIMARY KEY,
	tokens			FLOAT NOT NULL,
	refilled_at		DATETIME2(6) NOT NULL
);
CREATE TABLE queuebox.destination_limit_place (
	destination		NVARCHAR(200) COLLATE Latin1_General_100_BIN2 NOT NULL,
	claimer			BIGINT NOT NULL,
	held			INT NOT NULL CONSTRAINT destination_limit_place_held_check CHECK (held >= 0),
	tokens_out		INT NOT NULL CONSTRAINT destination_limit_place_tokens_out_default DEFAULT 0
		CONSTRAINT destination_limit_place_tokens_out_check CHECK (tokens_out >= 0),
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
