/*
 * sql/schema/functions.sql
 *	  The SQL functions and views of QueueBox that both hosts share: the
 *	  application's enqueue(), the five pull statements, the operations
 *	  (requeue, replay of outbox rows, destinations) and the views.
 *
 * They call a few functions each host defines in its host file, before this
 * one: topic_matches(), route_of(), _destination_names(), _arm_outbox_wake()
 * and _arm_relay_wake() (sql/pgext/host.sql in C; sql/daemon/host.sql
 * in SQL).  The order of the parts and the rules for a change:
 * sql/schema/tables.sql and docs/design/schema.md.
 */

-- ---------------------------------------------------------------------------
-- The application's convenience form of INSERT
-- ---------------------------------------------------------------------------
CREATE FUNCTION queuebox.enqueue(
	topic text, payload jsonb, key text DEFAULT NULL, headers jsonb DEFAULT '{}')
	RETURNS bigint
	LANGUAGE sql VOLATILE
	AS $$
	INSERT INTO queuebox.outbox (topic, key, payload, headers)
	VALUES (topic, key, payload, coalesce(headers, '{}'))
	RETURNING id
$$;
COMMENT ON FUNCTION queuebox.enqueue(text, jsonb, text, jsonb) IS
	'Insert one outbox row in the current transaction; returns its id.';

-- ---------------------------------------------------------------------------
-- Pull consumption: the five statements (examples/pull/sql/postgresql/)
-- ---------------------------------------------------------------------------
-- Each is one statement, safe to call from any driver with bound parameters.
-- renew, complete, retry and dead return true only when exactly one row
-- changed: false means another worker owns the message, so stop the work.

/*
 * inbox_claim: up to batch_size messages of one pull source, each with a
 * new claim token and a lease of lease_ms, at most one per (source,
 * aggregate_id) in created_at order, in O(batch_size).  Candidates are due unparked pull rows of the source in due order, and
 * processing rows whose lease expired (a takeover, the old token fenced
 * off), up to batch_size together.  For each candidate with an aggregate,
 * its nearest earlier open row (created_at, id) of the same source and
 * aggregate:
 *	- none: claimed (new token, lease);
 *	- one this statement can lock FOR SHARE and that is still open: the
 *	  candidate is parked (pending, hold 'aggregate'; a takeover candidate
 *	  loses its expired claim).  The lock is why no park is lost: the
 *	  statement that ends that earlier row must wait for it, so its
 *	  promotion (a later snapshot) sees the park;
 *	- one locked by another transaction (being claimed or ended right now):
 *	  left as it is, still a candidate for the next claim.
 * Nothing waits (SKIP LOCKED throughout).
 *
 * jit is off for it: the planner cannot size c_due's LIMIT (an expression
 * of a subquery), so it guesses a tenth of the source, and above
 * jit_above_cost every call paid ~25 ms of JIT compilation for a statement
 * that runs in well under a millisecond (bench/pull; schema 0.3.1).
 */
CREATE FUNCTION queuebox.inbox_claim(source text, batch_size int, lease_ms int)
	RETURNS TABLE (id bigint, claim_token uuid, source text, idempotency_key text,
				   event_type text, aggregate_id text, payload jsonb, headers jsonb,
				   attempt int, created_at timestamptz)
	LANGUAGE sql VOLATILE
	SET jit = off
	AS $$
	WITH c_lease AS MATERIALIZED (
		SELECT c.id, c.aggregate_id, c.created_at FROM queuebox.inbox c
		WHERE c.source = inbox_claim.source AND c.consumption = 'pull'
		  AND c.state = 'processing' AND c.lease_until < now()
		ORDER BY c.lease_until LIMIT inbox_claim.batch_size
		FOR UPDATE SKIP LOCKED),
	c_due AS MATERIALIZED (
		SELECT c.id, c.aggregate_id, c.created_at FROM queuebox.inbox c
		WHERE c.source = inbox_claim.source AND c.consumption = 'pull'
		  AND c.state = 'pending' AND c.hold IS NULL AND c.scheduled_at <= now()
		ORDER BY c.scheduled_at, c.created_at, c.id
		LIMIT greatest(inbox_claim.batch_size - (SELECT count(*) FROM c_lease), 0)
		FOR UPDATE SKIP LOCKED),
	cand AS (SELECT * FROM c_lease UNION ALL SELECT * FROM c_due),
	blk AS MATERIALIZED (
		SELECT c.id AS cid, b.id AS bid FROM cand c
		CROSS JOIN LATERAL (
			SELECT e.id FROM queuebox.inbox e
			WHERE e.source = inbox_claim.source AND e.aggregate_id = c.aggregate_id
			  AND e.state IN ('pending', 'processing')
			  AND (e.created_at, e.id) < (c.created_at, c.id)
			ORDER BY e.created_at DESC, e.id DESC LIMIT 1) b
		WHERE c.aggregate_id IS NOT NULL),
	lk AS MATERIALIZED (
		SELECT e.id FROM queuebox.inbox e
		WHERE e.id = ANY (ARRAY(SELECT bid FROM blk)) AND e.state IN ('pending', 'processing')
		FOR SHARE SKIP LOCKED),
	dec AS MATERIALIZED (
		SELECT c.id, b.bid IS NULL AS claim FROM cand c LEFT JOIN blk b ON b.cid = c.id
		WHERE b.bid IS NULL OR b.bid = ANY (ARRAY(SELECT id FROM lk))),
	u AS (
		UPDATE queuebox.inbox i
		SET state = CASE WHEN i.id = ANY (ARRAY(SELECT id FROM dec WHERE claim))
						 THEN 'processing' ELSE 'pending' END,
			hold = CASE WHEN i.id = ANY (ARRAY(SELECT id FROM dec WHERE claim))
						THEN NULL ELSE 'aggregate' END,
			claim_token = CASE WHEN i.id = ANY (ARRAY(SELECT id FROM dec WHERE claim))
							   THEN gen_random_uuid() END,
			lease_until = CASE WHEN i.id = ANY (ARRAY(SELECT id FROM dec WHERE claim))
							   THEN now() + inbox_claim.lease_ms * interval '1 millisecond' END
		WHERE i.id = ANY (ARRAY(SELECT id FROM dec))
		RETURNING i.state = 'processing' AS claim, i.id, i.claim_token, i.source,
				  i.idempotency_key, i.event_type, i.aggregate_id, i.payload, i.headers,
				  i.attempt, i.created_at)
	SELECT u.id, u.claim_token, u.source, u.idempotency_key, u.event_type,
		   u.aggregate_id, u.payload, u.headers, u.attempt, u.created_at
	FROM u WHERE u.claim ORDER BY u.created_at, u.id
$$;

/* inbox_renew: extend the lease of a message this token still holds. */
CREATE FUNCTION queuebox.inbox_renew(id bigint, claim_token uuid, lease_ms int)
	RETURNS boolean
	LANGUAGE sql VOLATILE
	AS $$
	WITH u AS (
		UPDATE queuebox.inbox i
		SET lease_until = now() + inbox_renew.lease_ms * interval '1 millisecond'
		WHERE i.id = inbox_renew.id AND i.claim_token = inbox_renew.claim_token
		  AND i.state = 'processing'
		RETURNING 1)
	SELECT count(*) = 1 FROM u
$$;

/*
 * inbox_complete and inbox_dead: true only when exactly one row changed;
 * they promote the next row of the (source, aggregate):
 * both are _inbox_end, two statements, each with its own snapshot (a
 * VOLATILE SQL function takes a new one per statement in READ COMMITTED):
 *	1. lock the claimed row FOR NO KEY UPDATE: this waits for every claim
 *	   that is parking a row behind it (they hold FOR SHARE on it), and from
 *	   then on no claim can park behind it (SKIP LOCKED);
 *	2. end the row (state processed or dead, last_error set for dead), and
 *	   release the first other open row of its source and aggregate when
 *	   that is a pending pull row.  This snapshot is newer than every park
 *	   behind the row, so it sees them all.  A row that looks unparked is
 *	   updated too (hold stays NULL), so a park this snapshot cannot see
 *	   (REPEATABLE READ, SERIALIZABLE) ends in a serialization failure
 *	   rather than in a row parked for ever.
 * Run them in READ COMMITTED (the client libraries do): in REPEATABLE READ
 * a row inserted and parked after the transaction's snapshot is missed.
 */
CREATE FUNCTION queuebox._inbox_end(id bigint, claim_token uuid, end_state text, error text)
	RETURNS boolean
	LANGUAGE sql VOLATILE
	AS $$
	SELECT 1 FROM queuebox.inbox i
	WHERE i.id = _inbox_end.id AND i.claim_token = _inbox_end.claim_token
	  AND i.state = 'processing'
	FOR NO KEY UPDATE;

	WITH u AS (
		UPDATE queuebox.inbox i
		SET state = _inbox_end.end_state,
			last_error = CASE WHEN _inbox_end.end_state = 'dead' THEN _inbox_end.error
							  ELSE i.last_error END,
			claim_token = NULL, lease_until = NULL
		WHERE i.id = _inbox_end.id AND i.claim_token = _inbox_end.claim_token
		  AND i.state = 'processing'
		RETURNING i.id, i.source, i.aggregate_id),
	p AS (
		UPDATE queuebox.inbox o SET hold = NULL
		WHERE o.id = (
			SELECT f.id FROM u CROSS JOIN LATERAL (
				SELECT e.id, e.consumption FROM queuebox.inbox e
				WHERE e.source = u.source AND e.aggregate_id = u.aggregate_id
				  AND e.state IN ('pending', 'processing') AND e.id <> u.id
				ORDER BY e.created_at, e.id LIMIT 1) f
			WHERE f.consumption = 'pull')
		  AND o.state = 'pending'
		RETURNING 1)
	SELECT count(*) = 1 FROM u
$$;

CREATE FUNCTION queuebox.inbox_complete(id bigint, claim_token uuid)
	RETURNS boolean
	LANGUAGE sql VOLATILE
	AS $$
	SELECT queuebox._inbox_end(inbox_complete.id, inbox_complete.claim_token, 'processed', NULL)
$$;

CREATE FUNCTION queuebox.inbox_dead(id bigint, claim_token uuid, error text)
	RETURNS boolean
	LANGUAGE sql VOLATILE
	AS $$
	SELECT queuebox._inbox_end(inbox_dead.id, inbox_dead.claim_token, 'dead', inbox_dead.error)
$$;

/* inbox_retry: back to pending, attempt + 1, due after delay_ms. */
CREATE FUNCTION queuebox.inbox_retry(id bigint, claim_token uuid, delay_ms int, error text)
	RETURNS boolean
	LANGUAGE sql VOLATILE
	AS $$
	WITH u AS (
		UPDATE queuebox.inbox i
		SET state = 'pending', attempt = i.attempt + 1,
			scheduled_at = now() + greatest(inbox_retry.delay_ms, 0) * interval '1 millisecond',
			last_error = inbox_retry.error, claim_token = NULL, lease_until = NULL
		WHERE i.id = inbox_retry.id AND i.claim_token = inbox_retry.claim_token
		  AND i.state = 'processing'
		RETURNING 1)
	SELECT count(*) = 1 FROM u
$$;

-- ---------------------------------------------------------------------------
-- Operations: requeue and replay
-- ---------------------------------------------------------------------------
/*
 * requeue_outbox(id): a dead row back to pending, due now, attempts reset,
 * routed again with the current configuration; a row of a route with
 * several destinations (origin set) goes back to its own destination only.  It keeps its id, so it
 * keeps its place in its key's order: a row that held its key (onDead:
 * holdKey, hold 'dead') is its key's first open row again, and the rows
 * parked behind it follow it.  Recorded in outbox_audit (a requeue, the
 * payload unchanged).
 */
CREATE FUNCTION queuebox.requeue_outbox(id bigint) RETURNS boolean
	LANGUAGE sql VOLATILE
	AS $$
	WITH u AS (
		UPDATE queuebox.outbox o
		SET state = 'pending', attempt = 0, scheduled_at = now(),
			claim_token = NULL, lease_until = NULL,
			destination = CASE WHEN o.origin IS NOT NULL THEN o.destination END,
			hold = CASE WHEN o.origin IS NULL OR o.destination IS NULL THEN 'ready' END
		WHERE o.id = requeue_outbox.id AND o.state = 'dead'
		RETURNING o.id),
	a AS (
		INSERT INTO queuebox.outbox_audit (outbox_id, action)
		SELECT u.id, 'requeue' FROM u
		RETURNING 1)
	SELECT count(*) = 1 FROM a, LATERAL (SELECT queuebox._arm_outbox_wake()) w
$$;

/* requeue_outbox(topic_pattern, since, until): each row audited as one */
CREATE FUNCTION queuebox.requeue_outbox(
	topic_pattern text, since timestamptz DEFAULT NULL, until timestamptz DEFAULT NULL)
	RETURNS bigint
	LANGUAGE sql VOLATILE
	AS $$
	WITH u AS (
		UPDATE queuebox.outbox o
		SET state = 'pending', attempt = 0, scheduled_at = now(),
			claim_token = NULL, lease_until = NULL,
			destination = CASE WHEN o.origin IS NOT NULL THEN o.destination END,
			hold = CASE WHEN o.origin IS NULL OR o.destination IS NULL THEN 'ready' END
		WHERE o.state = 'dead'
		  AND (requeue_outbox.topic_pattern IS NULL
			   OR queuebox.topic_matches(requeue_outbox.topic_pattern, o.topic))
		  AND (requeue_outbox.since IS NULL OR o.created_at >= requeue_outbox.since)
		  AND (requeue_outbox.until IS NULL OR o.created_at < requeue_outbox.until)
		RETURNING o.id),
	a AS (
		INSERT INTO queuebox.outbox_audit (outbox_id, action)
		SELECT u.id, 'requeue' FROM u ORDER BY u.id
		RETURNING 1)
	SELECT count(*) FROM a, LATERAL (SELECT queuebox._arm_outbox_wake()) w
$$;

/*
 * requeue_outbox(id, payload): a dead row back to pending as
 * requeue_outbox(id) does, with its payload replaced by payload.  The
 * edit is recorded in outbox_audit: who (current_user), when, the payload
 * before and after.  Its key's rows held behind it (onDead: holdKey) go
 * out after it, in order.  False, and nothing changed, when the row is not
 * dead.
 */
CREATE FUNCTION queuebox.requeue_outbox(id bigint, payload jsonb) RETURNS boolean
	LANGUAGE sql VOLATILE
	AS $$
	WITH o AS (
		SELECT o.id, o.payload FROM queuebox.outbox o
		WHERE o.id = requeue_outbox.id AND o.state = 'dead'
		FOR UPDATE),
	u AS (
		UPDATE queuebox.outbox x
		SET state = 'pending', attempt = 0, scheduled_at = now(), payload = requeue_outbox.payload,
			claim_token = NULL, lease_until = NULL,
			destination = CASE WHEN x.origin IS NOT NULL THEN x.destination END,
			hold = CASE WHEN x.origin IS NULL OR x.destination IS NULL THEN 'ready' END
		FROM o WHERE x.id = o.id
		RETURNING x.id),
	a AS (
		INSERT INTO queuebox.outbox_audit (outbox_id, action, payload_before, payload_after)
		SELECT o.id, 'requeue', o.payload, requeue_outbox.payload FROM o JOIN u ON u.id = o.id
		RETURNING 1)
	SELECT count(*) = 1 FROM a, LATERAL (SELECT queuebox._arm_outbox_wake()) w
$$;

/*
 * skip_outbox(id): a dead row that holds its key (onDead: holdKey) lets
 * it go: the row stays dead, its hold is cleared (recorded in
 * outbox_audit), and its key's first open row, when parked, is released
 * as a settle's promotion releases it.  The promotion is a later
 * statement: the update waited for every claim parking a row behind this
 * one (they hold FOR SHARE on it), and the new snapshot sees those parks
 * (docs/design/claim.md).  False, and nothing changed, when the row is not
 * dead and holding its key.
 */
CREATE FUNCTION queuebox.skip_outbox(id bigint) RETURNS boolean
	LANGUAGE plpgsql VOLATILE
	AS $$
DECLARE
	k text;
	d text;
BEGIN
	UPDATE queuebox.outbox o SET hold = NULL
	WHERE o.id = skip_outbox.id AND o.state = 'dead' AND o.hold = 'dead'
	RETURNING o.key, coalesce(o.destination, '') INTO k, d;
	IF NOT FOUND THEN
		RETURN false;
	END IF;
	INSERT INTO queuebox.outbox_audit (outbox_id, action) VALUES (skip_outbox.id, 'skip');
	-- the first open row it held back: at its destination or not routed yet
	UPDATE queuebox.outbox o SET hold = CASE WHEN o.destination IS NULL THEN 'ready' END
	WHERE o.id = (SELECT e.id FROM queuebox.outbox e
				  WHERE e.key = k AND coalesce(e.destination, '') IN (d, '')
					AND (e.state IN ('pending', 'processing') OR e.hold = 'dead')
				  ORDER BY coalesce(e.origin, e.id) LIMIT 1)
	  AND o.state = 'pending' AND o.hold = 'key';
	PERFORM queuebox._arm_outbox_wake();
	RETURN true;
END
$$;

/*
 * held_keys(): the keys whose first open row at a destination is dead and
 * holding them (onDead: holdKey) or retrying (pending after a failed
 * attempt), with rows parked behind it there (a key's order is kept per
 * destination): the key, the head's destination, id and state
 * ('dead' or 'retrying'), how many open rows wait behind it, and since
 * when (the oldest of them was created).  It walks outbox_parked_idx one
 * step per key and destination, as the sweep does, so it costs the keys
 * with parked rows, not the table.
 */
CREATE FUNCTION queuebox.held_keys()
	RETURNS TABLE (key text, destination text, head_id bigint, head_state text,
				   behind bigint, since timestamptz)
	LANGUAGE sql STABLE
	AS $$
	WITH RECURSIVE k AS (
		(SELECT o.key, coalesce(o.destination, '') AS g FROM queuebox.outbox o
		 WHERE o.state = 'pending' AND o.hold = 'key'
		 ORDER BY o.key, coalesce(o.destination, '') LIMIT 1)
		UNION ALL
		SELECT x.key, x.g FROM k CROSS JOIN LATERAL (
			SELECT o.key, coalesce(o.destination, '') AS g FROM queuebox.outbox o
			WHERE o.state = 'pending' AND o.hold = 'key'
			  AND (o.key, coalesce(o.destination, '')) > (k.key, k.g)
			ORDER BY o.key, coalesce(o.destination, '') LIMIT 1) x)
	SELECT k.key, h.destination, h.id,
		   CASE WHEN h.state = 'dead' THEN 'dead' ELSE 'retrying' END,
		   b.n, b.since
	FROM k
	CROSS JOIN LATERAL (
		SELECT e.id, e.state, e.attempt, e.destination, coalesce(e.origin, e.id) AS pos
		FROM queuebox.outbox e
		WHERE e.key = k.key AND (k.g = '' OR coalesce(e.destination, '') IN (k.g, ''))
		  AND (e.state IN ('pending', 'processing') OR e.hold = 'dead')
		ORDER BY coalesce(e.origin, e.id) LIMIT 1) h
	CROSS JOIN LATERAL (
		SELECT count(*) AS n, min(e.created_at) AS since FROM queuebox.outbox e
		WHERE e.key = k.key AND coalesce(e.destination, '') = k.g
		  AND coalesce(e.origin, e.id) > h.pos AND e.state IN ('pending', 'processing')) b
	WHERE h.state = 'dead' OR (h.state = 'pending' AND h.attempt > 0)
	ORDER BY k.key
$$;

-- ---------------------------------------------------------------------------
-- onDead: holdKey in the relay's aggregate order (inbox push rows; a
-- source's onDead): a dead push row with hold 'dead' is open for its
-- aggregate in the relay claim and its promotion (docs/design/claim.md, "A
-- dead head that holds its key").  The counterparts of requeue_outbox(id,
-- payload), skip_outbox and held_keys.
-- ---------------------------------------------------------------------------
/*
 * requeue_inbox(id, payload): a dead row back to pending as
 * requeue_inbox(id) does, with its payload replaced by payload, recorded
 * in inbox_audit (who, when, the payload before and after).  Its
 * aggregate's rows held behind it go on after it, in order.  False, and
 * nothing changed, when the row is not dead.
 */
CREATE FUNCTION queuebox.requeue_inbox(id bigint, payload jsonb) RETURNS boolean
	LANGUAGE sql VOLATILE
	AS $$
	WITH o AS (
		SELECT i.id, i.payload FROM queuebox.inbox i
		WHERE i.id = requeue_inbox.id AND i.state = 'dead'
		FOR UPDATE),
	u AS (
		UPDATE queuebox.inbox x
		SET state = 'pending', attempt = 0, scheduled_at = now(), payload = requeue_inbox.payload,
			claim_token = NULL, lease_until = NULL, hold = NULL
		FROM o WHERE x.id = o.id
		RETURNING x.id),
	a AS (
		INSERT INTO queuebox.inbox_audit (inbox_id, action, payload_before, payload_after)
		SELECT o.id, 'requeue', o.payload, requeue_inbox.payload FROM o JOIN u ON u.id = o.id
		RETURNING 1)
	SELECT count(*) = 1 FROM a, LATERAL (SELECT queuebox._arm_relay_wake()) w
$$;

/*
 * skip_inbox(id): a dead push row that holds its aggregate lets it go: the
 * row stays dead, its hold is cleared (recorded in inbox_audit), and the
 * aggregate's first open push row, when pending, is released as the
 * relay's promotion releases it.  The promotion is a later statement: the
 * update waited for every relay claim parking a row behind this one (they
 * hold FOR SHARE on it), and the new snapshot sees those parks.  False,
 * and nothing changed, when the row is not dead and holding.
 */
CREATE FUNCTION queuebox.skip_inbox(id bigint) RETURNS boolean
	LANGUAGE plpgsql VOLATILE
	AS $$
DECLARE
	agg text;
BEGIN
	UPDATE queuebox.inbox i SET hold = NULL
	WHERE i.id = skip_inbox.id AND i.state = 'dead' AND i.hold = 'dead'
	RETURNING i.aggregate_id INTO agg;
	IF NOT FOUND THEN
		RETURN false;
	END IF;
	INSERT INTO queuebox.inbox_audit (inbox_id, action) VALUES (skip_inbox.id, 'skip');
	UPDATE queuebox.inbox o SET hold = NULL
	WHERE o.id = (SELECT e.id FROM queuebox.inbox e
				  WHERE e.consumption = 'push' AND e.aggregate_id = agg
					AND (e.state IN ('pending', 'processing') OR e.hold = 'dead')
				  ORDER BY e.created_at, e.id LIMIT 1)
	  AND o.state = 'pending';
	PERFORM queuebox._arm_relay_wake();
	RETURN true;
END
$$;

/*
 * held_aggregates(): the aggregates whose first open push row is dead and
 * holding them (onDead: holdKey) with rows parked behind it: the
 * aggregate, the head's source and id, how many open push rows wait behind
 * it, and since when (the oldest of them was created).  It steps through
 * inbox_push_aggregate_idx one aggregate with parked rows at a time, so it
 * costs the open push rows, not the table.
 */
CREATE FUNCTION queuebox.held_aggregates()
	RETURNS TABLE (aggregate_id text, source text, head_id bigint, behind bigint,
				   since timestamptz)
	LANGUAGE sql STABLE
	AS $$
	WITH RECURSIVE a AS (
		(SELECT i.aggregate_id FROM queuebox.inbox i
		 WHERE i.state = 'pending' AND i.hold = 'aggregate' AND i.consumption = 'push'
		   AND i.aggregate_id IS NOT NULL
		 ORDER BY i.aggregate_id LIMIT 1)
		UNION ALL
		SELECT x.aggregate_id FROM a CROSS JOIN LATERAL (
			SELECT i.aggregate_id FROM queuebox.inbox i
			WHERE i.state = 'pending' AND i.hold = 'aggregate' AND i.consumption = 'push'
			  AND i.aggregate_id > a.aggregate_id
			ORDER BY i.aggregate_id LIMIT 1) x)
	SELECT a.aggregate_id, h.source, h.id, b.n, b.since
	FROM a
	CROSS JOIN LATERAL (
		SELECT e.id, e.source, e.state, e.created_at FROM queuebox.inbox e
		WHERE e.consumption = 'push' AND e.aggregate_id = a.aggregate_id
		  AND (e.state IN ('pending', 'processing') OR e.hold = 'dead')
		ORDER BY e.created_at, e.id LIMIT 1) h
	CROSS JOIN LATERAL (
		SELECT count(*) AS n, min(e.created_at) AS since FROM queuebox.inbox e
		WHERE e.consumption = 'push' AND e.aggregate_id = a.aggregate_id
		  AND e.state IN ('pending', 'processing')
		  AND (e.created_at, e.id) > (h.created_at, h.id)) b
	WHERE h.state = 'dead'
	ORDER BY a.aggregate_id
$$;

/*
 * replay_outbox(id): a new pending row with the same topic, key, payload,
 * headers and max_attempts, and a new message_id; any state may be
 * replayed.  A row of a route with several destinations (origin set) is
 * replayed to its own destination only.  Returns the new row's id, or NULL when there is no such row.
 */
CREATE FUNCTION queuebox.replay_outbox(id bigint) RETURNS bigint
	LANGUAGE sql VOLATILE
	AS $$
	INSERT INTO queuebox.outbox (topic, key, payload, headers, max_attempts, destination)
	SELECT o.topic, o.key, o.payload, o.headers, o.max_attempts,
		   CASE WHEN o.origin IS NOT NULL THEN o.destination END
	FROM queuebox.outbox o WHERE o.id = replay_outbox.id
	RETURNING id
$$;

/*
 * replay_outbox(state, topic_pattern, since, until): replays every row in
 * that state (NULL: any) matching the filters, in id order, so the copies
 * keep each key's order.  Returns rows replayed.
 */
CREATE FUNCTION queuebox.replay_outbox(
	state text, topic_pattern text DEFAULT NULL,
	since timestamptz DEFAULT NULL, until timestamptz DEFAULT NULL)
	RETURNS bigint
	LANGUAGE sql VOLATILE
	AS $$
	WITH n AS (
		INSERT INTO queuebox.outbox (topic, key, payload, headers, max_attempts, destination)
		SELECT o.topic, o.key, o.payload, o.headers, o.max_attempts,
			   CASE WHEN o.origin IS NOT NULL THEN o.destination END
		FROM queuebox.outbox o
		WHERE (replay_outbox.state IS NULL OR o.state = replay_outbox.state)
		  AND (replay_outbox.topic_pattern IS NULL
			   OR queuebox.topic_matches(replay_outbox.topic_pattern, o.topic))
		  AND (replay_outbox.since IS NULL OR o.created_at >= replay_outbox.since)
		  AND (replay_outbox.until IS NULL OR o.created_at < replay_outbox.until)
		ORDER BY o.id
		RETURNING 1)
	SELECT count(*) FROM n
$$;

/*
 * inbox_retry needs no change: the row stays open (pending, due later), so
 * the rows parked behind it stay parked, and it is claimed again from the
 * due index when due (it has no earlier open row, so it is never parked).
 *
 * requeue_inbox: a dead row back to pending, unparked (hold NULL: a row
 * that held its aggregate, onDead: holdKey, is its first open row again,
 * and the rows parked behind it follow it).  Nothing
 * parked behind others is stuck by it: the next claim checks the requeued
 * row's order like any new row's, and parks it behind an open earlier row
 * if there is one; a row parked behind a later row is released when that
 * row ends, or, when the requeued row is now the first open row of the
 * unit, by the promotion of the requeued row's own end (a promotion
 * releases the first open row of the unit, whichever row ended).  Each
 * requeued row is recorded in inbox_audit (a requeue, the payload
 * unchanged).
 */
CREATE FUNCTION queuebox.requeue_inbox(id bigint) RETURNS boolean
	LANGUAGE sql VOLATILE
	AS $$
	WITH u AS (
		UPDATE queuebox.inbox i
		SET state = 'pending', attempt = 0, scheduled_at = now(),
			claim_token = NULL, lease_until = NULL, hold = NULL
		WHERE i.id = requeue_inbox.id AND i.state = 'dead'
		RETURNING i.id),
	a AS (
		INSERT INTO queuebox.inbox_audit (inbox_id, action)
		SELECT u.id, 'requeue' FROM u
		RETURNING 1)
	SELECT count(*) = 1 FROM a, LATERAL (SELECT queuebox._arm_relay_wake()) w
$$;

CREATE FUNCTION queuebox.requeue_inbox(
	source text, since timestamptz DEFAULT NULL, until timestamptz DEFAULT NULL)
	RETURNS bigint
	LANGUAGE sql VOLATILE
	AS $$
	WITH u AS (
		UPDATE queuebox.inbox i
		SET state = 'pending', attempt = 0, scheduled_at = now(),
			claim_token = NULL, lease_until = NULL, hold = NULL
		WHERE i.state = 'dead'
		  AND (requeue_inbox.source IS NULL OR i.source = requeue_inbox.source)
		  AND (requeue_inbox.since IS NULL OR i.created_at >= requeue_inbox.since)
		  AND (requeue_inbox.until IS NULL OR i.created_at < requeue_inbox.until)
		RETURNING i.id),
	a AS (
		INSERT INTO queuebox.inbox_audit (inbox_id, action)
		SELECT u.id, 'requeue' FROM u ORDER BY u.id
		RETURNING 1)
	SELECT count(*) FROM a, LATERAL (SELECT queuebox._arm_relay_wake()) w
$$;

-- ---------------------------------------------------------------------------
-- Destinations and visibility
-- ---------------------------------------------------------------------------
/*
 * destination_status(): one row per destination of the configuration (and
 * any with a stored state): its circuit, why, and the rows waiting for it:
 * pending counts the rows not routed yet by their topic's route, as
 * outbox_stats does (rows parked behind a key are mostly not routed yet).
 */
CREATE FUNCTION queuebox.destination_status(
	OUT destination text, OUT state text, OUT failures int, OUT opened_at timestamptz,
	OUT probe_at timestamptz, OUT paused_until timestamptz, OUT last_error text,
	OUT changed_at timestamptz, OUT pending bigint, OUT held bigint)
	RETURNS SETOF record
	LANGUAGE sql STABLE
	AS $$
	WITH names AS (
		SELECT n FROM unnest(queuebox._destination_names()) n
		UNION SELECT d.destination FROM queuebox.destination_state d),
	per_topic AS (
		SELECT o.destination, o.topic, count(*) AS pending,
			   count(*) FILTER (WHERE o.hold = 'destination') AS held
		FROM queuebox.outbox o WHERE o.state = 'pending'
		GROUP BY o.destination, o.topic),
	waiting AS (
		SELECT coalesce(p.destination, queuebox.route_of(p.topic)) AS n,
			   sum(p.pending)::bigint AS pending, sum(p.held)::bigint AS held
		FROM per_topic p GROUP BY 1)
	SELECT names.n, coalesce(d.state, 'closed'), coalesce(d.failures, 0), d.opened_at,
		   d.probe_at, d.paused_until, d.last_error, d.changed_at,
		   coalesce(w.pending, 0), coalesce(w.held, 0)
	FROM names LEFT JOIN queuebox.destination_state d ON d.destination = names.n
	LEFT JOIN waiting w ON w.n = names.n
	ORDER BY names.n
$$;
COMMENT ON FUNCTION queuebox.destination_status() IS
	'Each destination''s circuit (closed, open, half-open, disabled), consecutive failures, pause, last error, and its pending and held rows.';


/*
 * resume_destination(name): close the circuit of a destination (disabled by
 * a 410, or open), clear its failures and pause; its held rows are
 * delivered again.  True when it was holding rows: not closed, or paused
 * (a pause whose time is over holds nothing).  A closed destination with
 * failures counted has them cleared, and answers false.
 */
CREATE FUNCTION queuebox.resume_destination(name text) RETURNS boolean
	LANGUAGE sql VOLATILE
	AS $$
	WITH o AS (
		SELECT d.destination, d.state <> 'closed' OR coalesce(d.paused_until > now(), false) AS held
		FROM queuebox.destination_state d
		WHERE d.destination = resume_destination.name
		FOR UPDATE),
	u AS (
		UPDATE queuebox.destination_state d
		SET state = 'closed', failures = 0, paused_until = NULL, probe_at = NULL,
			opened_at = NULL, changed_at = CASE WHEN d.state = 'closed' THEN d.changed_at ELSE now() END
		FROM o
		WHERE d.destination = o.destination
		  AND (d.state <> 'closed' OR d.failures > 0 OR d.paused_until IS NOT NULL)
		RETURNING o.held)
	SELECT coalesce(bool_or(u.held), false) FROM u, LATERAL (SELECT queuebox._arm_outbox_wake()) w
$$;
COMMENT ON FUNCTION queuebox.resume_destination(text) IS
	'Close a destination''s circuit (after a 410 Gone, or to end an open one now); its held rows are delivered again.';

-- ---------------------------------------------------------------------------
-- Operations: the console's reads and destination actions (issue 25)
-- ---------------------------------------------------------------------------
/*
 * dead_outbox(destination, topic, key, error, since, until, after,
 * page_size): one page of dead outbox rows, id ascending, as
 * {"rows": [...], "next_after": id | null}.  destination, topic and key
 * match exactly, error is a case-insensitive substring of last_error,
 * since (inclusive) and until (exclusive) bound created_at, after skips
 * the ids up to it; NULL: no filter.
 *
 * The cost of a page is bounded: it walks the dead rows in id order through
 * one partial index (outbox_dead_key_idx when key is given, else
 * outbox_dead_destination_idx for destination, outbox_dead_topic_idx for
 * topic, else outbox_dead_idx), tests the other filters on each row, and
 * stops after page_size matches or 10000 rows examined.  next_after is
 * where the next page starts: the last row's id when the page is full, the
 * last id examined when the bound stopped it, NULL when the walk reached
 * the end.  So a page of a rare substring may come back short, or empty,
 * with next_after set: ask again from there.
 */
CREATE FUNCTION queuebox.dead_outbox(
	destination text DEFAULT NULL, topic text DEFAULT NULL, key text DEFAULT NULL,
	error text DEFAULT NULL, since timestamptz DEFAULT NULL, until timestamptz DEFAULT NULL,
	after bigint DEFAULT NULL, page_size int DEFAULT 100)
	RETURNS jsonb
	LANGUAGE plpgsql STABLE
	AS $$
DECLARE
	lead		text;
	lead_value	text;
	needle		text := lower(dead_outbox.error);
	walk		refcursor;
	r			record;
	ids			bigint[] := '{}';
	examined	int := 0;
	last_id		bigint;
BEGIN
	IF page_size IS NULL OR page_size NOT BETWEEN 1 AND 1000 THEN
		RAISE EXCEPTION 'page_size must be from 1 to 1000, not %', page_size
			USING ERRCODE = 'invalid_parameter_value';
	END IF;
	lead := CASE WHEN dead_outbox.key IS NOT NULL THEN 'key'
				 WHEN dead_outbox.destination IS NOT NULL THEN 'destination'
				 WHEN dead_outbox.topic IS NOT NULL THEN 'topic' END;
	lead_value := coalesce(dead_outbox.key, dead_outbox.destination, dead_outbox.topic);
	/*
	 * The walk: a cursor (OPEN plans for its first rows, as a FOR loop does
	 * not) with the bound as its LIMIT, so the planner walks the lead's
	 * index in id order rather than reading and sorting every dead row of
	 * the lead's value before the first.
	 */
	OPEN walk FOR EXECUTE
		'SELECT o.id, o.destination, o.topic, o.key, o.last_error, o.created_at'
		' FROM queuebox.outbox o WHERE o.state = ''dead'' AND o.id > $1'
		|| CASE WHEN lead IS NULL THEN '' ELSE format(' AND o.%I = $2', lead) END
		|| ' ORDER BY o.id LIMIT 10000'
		USING coalesce(dead_outbox.after, 0), lead_value;
	LOOP
		FETCH walk INTO r;
		EXIT WHEN NOT FOUND;
		examined := examined + 1;
		last_id := r.id;
		IF (dead_outbox.destination IS NULL OR r.destination = dead_outbox.destination)
		   AND (dead_outbox.topic IS NULL OR r.topic = dead_outbox.topic)
		   AND (dead_outbox.key IS NULL OR r.key = dead_outbox.key)
		   AND (needle IS NULL OR strpos(lower(r.last_error), needle) > 0)
		   AND (dead_outbox.since IS NULL OR r.created_at >= dead_outbox.since)
		   AND (dead_outbox.until IS NULL OR r.created_at < dead_outbox.until) THEN
			ids := ids || r.id;
			EXIT WHEN cardinality(ids) = page_size;
		END IF;
		EXIT WHEN examined >= 10000;
	END LOOP;
	CLOSE walk;
	RETURN jsonb_build_object(
		'rows', (SELECT coalesce(jsonb_agg(jsonb_build_object(
					'id', o.id, 'message_id', o.message_id, 'topic', o.topic, 'key', o.key,
					'destination', o.destination, 'attempt', o.attempt,
					'max_attempts', o.max_attempts, 'last_error', o.last_error,
					'created_at', o.created_at, 'holds_key', o.hold IS NOT DISTINCT FROM 'dead')
					ORDER BY o.id), '[]')
				 FROM queuebox.outbox o WHERE o.id = ANY (ids)),
		'next_after', CASE WHEN cardinality(ids) = page_size THEN ids[page_size]
						   WHEN examined >= 10000 THEN last_id END);
END
$$;
COMMENT ON FUNCTION queuebox.dead_outbox(text, text, text, text, timestamptz, timestamptz, bigint, int) IS
	'One page of dead outbox rows (id ascending) matching the filters, as {"rows": [...], "next_after": id}; a page examines at most 10000 rows: continue from next_after.';

/*
 * dead_inbox(source, event_type, idempotency_key, aggregate_id, error,
 * since, until, after, page_size): one page of dead inbox rows, as
 * dead_outbox's: through inbox_dead_source_idx when source is given, else
 * inbox_dead_idx, the same 10000-row bound and next_after.
 */
CREATE FUNCTION queuebox.dead_inbox(
	source text DEFAULT NULL, event_type text DEFAULT NULL, idempotency_key text DEFAULT NULL,
	aggregate_id text DEFAULT NULL, error text DEFAULT NULL, since timestamptz DEFAULT NULL,
	until timestamptz DEFAULT NULL, after bigint DEFAULT NULL, page_size int DEFAULT 100)
	RETURNS jsonb
	LANGUAGE plpgsql STABLE
	AS $$
DECLARE
	needle		text := lower(dead_inbox.error);
	walk		refcursor;
	r			record;
	ids			bigint[] := '{}';
	examined	int := 0;
	last_id		bigint;
BEGIN
	IF page_size IS NULL OR page_size NOT BETWEEN 1 AND 1000 THEN
		RAISE EXCEPTION 'page_size must be from 1 to 1000, not %', page_size
			USING ERRCODE = 'invalid_parameter_value';
	END IF;
	/* as dead_outbox's walk: source its lead, the LIMIT its bound */
	OPEN walk FOR EXECUTE
		'SELECT i.id, i.event_type, i.idempotency_key, i.aggregate_id, i.last_error, i.created_at'
		' FROM queuebox.inbox i WHERE i.state = ''dead'' AND i.id > $1'
		|| CASE WHEN dead_inbox.source IS NULL THEN '' ELSE ' AND i.source = $2' END
		|| ' ORDER BY i.id LIMIT 10000'
		USING coalesce(dead_inbox.after, 0), dead_inbox.source;
	LOOP
		FETCH walk INTO r;
		EXIT WHEN NOT FOUND;
		examined := examined + 1;
		last_id := r.id;
		IF (dead_inbox.event_type IS NULL OR r.event_type = dead_inbox.event_type)
		   AND (dead_inbox.idempotency_key IS NULL OR r.idempotency_key = dead_inbox.idempotency_key)
		   AND (dead_inbox.aggregate_id IS NULL OR r.aggregate_id = dead_inbox.aggregate_id)
		   AND (needle IS NULL OR strpos(lower(r.last_error), needle) > 0)
		   AND (dead_inbox.since IS NULL OR r.created_at >= dead_inbox.since)
		   AND (dead_inbox.until IS NULL OR r.created_at < dead_inbox.until) THEN
			ids := ids || r.id;
			EXIT WHEN cardinality(ids) = page_size;
		END IF;
		EXIT WHEN examined >= 10000;
	END LOOP;
	CLOSE walk;
	RETURN jsonb_build_object(
		'rows', (SELECT coalesce(jsonb_agg(jsonb_build_object(
					'id', i.id, 'source', i.source, 'idempotency_key', i.idempotency_key,
					'event_type', i.event_type, 'aggregate_id', i.aggregate_id,
					'consumption', i.consumption, 'attempt', i.attempt,
					'last_error', i.last_error, 'created_at', i.created_at)
					ORDER BY i.id), '[]')
				 FROM queuebox.inbox i WHERE i.id = ANY (ids)),
		'next_after', CASE WHEN cardinality(ids) = page_size THEN ids[page_size]
						   WHEN examined >= 10000 THEN last_id END);
END
$$;
COMMENT ON FUNCTION queuebox.dead_inbox(text, text, text, text, text, timestamptz, timestamptz, bigint, int) IS
	'One page of dead inbox rows (id ascending) matching the filters, as {"rows": [...], "next_after": id}; a page examines at most 10000 rows: continue from next_after.';

/*
 * outbox_row(id): the whole outbox row as one object, payload and headers
 * included, with what operators did to it (outbox_audit, oldest first)
 * and, for a row of a route with several destinations, every delivery of
 * its message (deliveries: id, destination, state; null otherwise); NULL
 * when there is no such row.
 */
CREATE FUNCTION queuebox.outbox_row(id bigint) RETURNS jsonb
	LANGUAGE sql STABLE
	AS $$
	SELECT jsonb_build_object(
		'id', o.id, 'message_id', o.message_id, 'topic', o.topic, 'key', o.key,
		'destination', o.destination, 'state', o.state, 'hold', o.hold, 'attempt', o.attempt,
		'max_attempts', o.max_attempts, 'scheduled_at', o.scheduled_at, 'created_at', o.created_at,
		'last_error', o.last_error, 'payload', o.payload, 'headers', o.headers,
		'deliveries', (SELECT jsonb_agg(jsonb_build_object(
							'id', c.id, 'destination', c.destination, 'state', c.state)
							ORDER BY c.id)
					   FROM queuebox.outbox c WHERE c.origin = o.origin),
		'audit', (SELECT coalesce(jsonb_agg(jsonb_build_object(
						'action', a.action, 'done_by', a.done_by, 'done_at', a.done_at,
						'payload_before', a.payload_before, 'payload_after', a.payload_after)
						ORDER BY a.id), '[]')
				  FROM queuebox.outbox_audit a WHERE a.outbox_id = o.id))
	FROM queuebox.outbox o WHERE o.id = outbox_row.id
$$;

/* inbox_row(id): the whole inbox row as one object; NULL when there is none. */
CREATE FUNCTION queuebox.inbox_row(id bigint) RETURNS jsonb
	LANGUAGE sql STABLE
	AS $$
	SELECT jsonb_build_object(
		'id', i.id, 'source', i.source, 'idempotency_key', i.idempotency_key,
		'event_type', i.event_type, 'aggregate_id', i.aggregate_id,
		'consumption', i.consumption, 'state', i.state, 'hold', i.hold, 'attempt', i.attempt,
		'scheduled_at', i.scheduled_at, 'created_at', i.created_at, 'last_error', i.last_error,
		'payload', i.payload, 'headers', i.headers)
	FROM queuebox.inbox i WHERE i.id = inbox_row.id
$$;

/*
 * inbox_lookup(source, idempotency_key): inbox_row of the row received from
 * source under that key (the unique index), NULL when none: it did not
 * arrive, or retention deleted it.
 */
CREATE FUNCTION queuebox.inbox_lookup(source text, idempotency_key text) RETURNS jsonb
	LANGUAGE sql STABLE
	AS $$
	SELECT queuebox.inbox_row(i.id) FROM queuebox.inbox i
	WHERE i.source = inbox_lookup.source AND i.idempotency_key = inbox_lookup.idempotency_key
$$;

/*
 * pause_destination(name, until): no row goes to the destination before
 * until, as a 429's Retry-After pauses it (every worker and replica reads
 * paused_until on its next claim); its circuit and failures stay as they
 * are.  A later pause replaces an earlier one, a shorter one too;
 * resume_destination ends it.  Returns until.  Raises no_data_found for a
 * name the configuration does not have.
 */
CREATE FUNCTION queuebox.pause_destination(name text, until timestamptz) RETURNS timestamptz
	LANGUAGE plpgsql VOLATILE
	AS $$
DECLARE
	t timestamptz;
BEGIN
	IF until IS NULL THEN
		RAISE EXCEPTION 'pause_destination needs a time to pause until'
			USING ERRCODE = 'null_value_not_allowed';
	END IF;
	IF NOT name = ANY (queuebox._destination_names()) THEN
		RAISE EXCEPTION 'no destination named "%" in the configuration', name
			USING ERRCODE = 'no_data_found';
	END IF;
	INSERT INTO queuebox.destination_state AS d (destination, paused_until)
	VALUES (pause_destination.name, pause_destination.until)
	ON CONFLICT (destination) DO UPDATE SET paused_until = excluded.paused_until
	RETURNING d.paused_until INTO t;
	PERFORM queuebox._arm_outbox_wake();
	RETURN t;
END
$$;
COMMENT ON FUNCTION queuebox.pause_destination(text, timestamptz) IS
	'Send nothing to a destination before a time (as a 429 Retry-After does); its rows wait, none is lost. resume_destination() ends the pause.';

/*
 * reset_destination(name): close its circuit and clear its failures, as
 * resume_destination does, but keep a pause.  True when it changed
 * something.
 */
CREATE FUNCTION queuebox.reset_destination(name text) RETURNS boolean
	LANGUAGE sql VOLATILE
	AS $$
	WITH u AS (
		UPDATE queuebox.destination_state d
		SET state = 'closed', failures = 0, probe_at = NULL, opened_at = NULL,
			changed_at = CASE WHEN d.state = 'closed' THEN d.changed_at ELSE now() END
		WHERE d.destination = reset_destination.name AND (d.state <> 'closed' OR d.failures > 0)
		RETURNING 1)
	SELECT count(*) = 1 FROM u, LATERAL (SELECT queuebox._arm_outbox_wake()) w
$$;
COMMENT ON FUNCTION queuebox.reset_destination(text) IS
	'Close a destination''s circuit and clear its failures, keeping a pause.';

/*
 * outbox_stats: one row per (destination, state) plus a total per state
 * (destination '(all)', listed first), by the destination a row was routed
 * to (its topic's route when not routed yet), with the destination's
 * circuit.  A destination name cannot hold '(' (configure refuses it), so
 * '(all)' and '(no route)' name no destination.
 */
CREATE VIEW queuebox.outbox_stats AS
	WITH per_topic AS (
		SELECT topic, destination, state, count(*) AS n,
			   min(created_at) FILTER (WHERE state = 'pending') AS oldest_pending
		FROM queuebox.outbox
		GROUP BY topic, destination, state
	), routed AS (
		SELECT coalesce(destination, queuebox.route_of(topic), '(no route)') AS destination,
			   state, n, oldest_pending
		FROM per_topic
	)
	SELECT CASE WHEN GROUPING(r.destination) = 1 THEN '(all)' ELSE r.destination END AS destination,
		   r.state, sum(r.n)::bigint AS rows,
		   now() - min(r.oldest_pending) AS oldest_pending_age,
		   CASE WHEN GROUPING(r.destination) = 1 THEN NULL
				WHEN r.destination = '(no route)' THEN NULL
				ELSE coalesce(min(d.state), 'closed') END::text AS circuit
	FROM routed r LEFT JOIN queuebox.destination_state d ON d.destination = r.destination
	GROUP BY GROUPING SETS ((r.destination, r.state), (r.state))
	ORDER BY GROUPING(r.destination) DESC, r.destination, r.state;
COMMENT ON VIEW queuebox.outbox_stats IS
	'Rows per state and per destination (destination ''(all)'': all destinations), with the age of the oldest pending row and the destination''s circuit.';

/* The schema version the workers check before they claim. */
CREATE FUNCTION queuebox._schema_version() RETURNS text
	LANGUAGE sql IMMUTABLE AS $$ SELECT '@SCHEMA_VERSION@'::text $$;
