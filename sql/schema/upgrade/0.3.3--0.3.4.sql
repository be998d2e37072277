/*
 * sql/schema/upgrade/0.3.3--0.3.4.sql
 *	  What changes from schema 0.3.3 to 0.3.4 in both PostgreSQL installs:
 *	  the extension's build/sql/queuebox--0.3.3--0.3.4.sql and the daemon's
 *	  upgrade step are made of this file (docs/design/schema.md).
 *
 * What changes (onDead: holdKey, docs/delivery.md "Dead letters";
 * docs/design/claim.md "A dead head that holds its key"):
 *	- outbox.hold may be 'dead' on a dead row: it holds its key's later
 *	  rows until an operator requeues or skips it.
 *	- outbox_key_open_idx covers those rows too: the claim, the promotion
 *	  and the sweep count them as open for their key, one index probe each.
 *	  The index is made again under a new name, then renamed: the old one
 *	  serves the claims until the new one is there.
 *	- outbox_audit: what operators did to dead rows (an edited requeue, a
 *	  skip), who and when.
 *	- requeue_outbox(id, payload), skip_outbox(id), held_keys().
 *	- The same for the relay's aggregate order (a source's onDead): inbox.hold
 *	  may be 'dead' on a dead push row; inbox_push_aggregate_idx covers those
 *	  rows (made again as outbox_key_open_idx is); inbox_audit;
 *	  requeue_inbox(id, payload), skip_inbox(id), held_aggregates().
 *	- Every requeue is audited: requeue_outbox and requeue_inbox, one row or
 *	  in bulk, record each row they requeue.
 *
 * No row changes: no dead row holds its key before this version.  CREATE
 * INDEX reads the outbox once and blocks writes to it while it runs:
 * upgrade when the outbox is quiet, or create outbox_key_open_0_3_4_idx
 * CONCURRENTLY by hand first (the script then finds it and skips it); the
 * same for the inbox and inbox_push_aggregate_0_3_4_idx.
 */
ALTER TABLE queuebox.outbox DROP CONSTRAINT outbox_hold_check;
ALTER TABLE queuebox.outbox ADD CONSTRAINT outbox_hold_check
	CHECK (hold IN ('key', 'destination', 'ready', 'intake', 'dead'));
COMMENT ON COLUMN queuebox.outbox.hold IS
	'Where a pending row waits: intake (new, routed at insert), key (an earlier row of its key is open), destination (its destination is not taking rows), ready (claimable, not yet routed); NULL: new and not routed, or routed and due at scheduled_at. On a dead row, dead: it holds its key''s later rows until queuebox.requeue_outbox() or queuebox.skip_outbox() (onDead: holdKey).';

CREATE INDEX IF NOT EXISTS outbox_key_open_0_3_4_idx ON queuebox.outbox (key, id)
	WHERE (state IN ('pending', 'processing') OR hold = 'dead') AND key IS NOT NULL;
DROP INDEX queuebox.outbox_key_open_idx;
ALTER INDEX queuebox.outbox_key_open_0_3_4_idx RENAME TO outbox_key_open_idx;

CREATE TABLE queuebox.outbox_audit (
	id				bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	outbox_id		bigint NOT NULL,
	action			varchar(20) NOT NULL
		CONSTRAINT outbox_audit_action_check CHECK (action IN ('requeue', 'skip')),
	done_by			text NOT NULL DEFAULT current_user,
	done_at			timestamptz NOT NULL DEFAULT now(),
	payload_before	jsonb,
	payload_after	jsonb
);
CREATE INDEX outbox_audit_outbox_idx ON queuebox.outbox_audit (outbox_id);
COMMENT ON TABLE queuebox.outbox_audit IS
	'What operators did to dead outbox rows, by queuebox.requeue_outbox() (one row per requeued row; the payload before and after for an edited one) and queuebox.skip_outbox(id): who and when. Retention does not delete it.';

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
			claim_token = NULL, lease_until = NULL, destination = NULL, hold = 'ready'
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
BEGIN
	UPDATE queuebox.outbox o SET hold = NULL
	WHERE o.id = skip_outbox.id AND o.state = 'dead' AND o.hold = 'dead'
	RETURNING o.key INTO k;
	IF NOT FOUND THEN
		RETURN false;
	END IF;
	INSERT INTO queuebox.outbox_audit (outbox_id, action) VALUES (skip_outbox.id, 'skip');
	UPDATE queuebox.outbox o SET hold = CASE WHEN o.destination IS NULL THEN 'ready' END
	WHERE o.id = (SELECT e.id FROM queuebox.outbox e
				  WHERE e.key = k AND (e.state IN ('pending', 'processing') OR e.hold = 'dead')
				  ORDER BY e.id LIMIT 1)
	  AND o.state = 'pending' AND o.hold = 'key';
	PERFORM queuebox._arm_outbox_wake();
	RETURN true;
END
$$;

/*
 * held_keys(): the keys whose first open row is dead and holding them
 * (onDead: holdKey) or retrying (pending after a failed attempt), with
 * rows parked behind it: the key, the head's destination, id and state
 * ('dead' or 'retrying'), how many open rows wait behind it, and since
 * when (the oldest of them was created).  It walks outbox_parked_idx one
 * step per key, as the sweep does, so it costs the keys with parked rows,
 * not the table.
 */
CREATE FUNCTION queuebox.held_keys()
	RETURNS TABLE (key text, destination text, head_id bigint, head_state text,
				   behind bigint, since timestamptz)
	LANGUAGE sql STABLE
	AS $$
	WITH RECURSIVE k AS (
		(SELECT o.key FROM queuebox.outbox o
		 WHERE o.state = 'pending' AND o.hold = 'key' ORDER BY o.key LIMIT 1)
		UNION ALL
		SELECT x.key FROM k CROSS JOIN LATERAL (
			SELECT o.key FROM queuebox.outbox o
			WHERE o.state = 'pending' AND o.hold = 'key' AND o.key > k.key
			ORDER BY o.key LIMIT 1) x)
	SELECT k.key, h.destination, h.id,
		   CASE WHEN h.state = 'dead' THEN 'dead' ELSE 'retrying' END,
		   b.n, b.since
	FROM k
	CROSS JOIN LATERAL (
		SELECT e.id, e.state, e.attempt, e.destination FROM queuebox.outbox e
		WHERE e.key = k.key AND (e.state IN ('pending', 'processing') OR e.hold = 'dead')
		ORDER BY e.id LIMIT 1) h
	CROSS JOIN LATERAL (
		SELECT count(*) AS n, min(e.created_at) AS since FROM queuebox.outbox e
		WHERE e.key = k.key AND e.id > h.id AND e.state IN ('pending', 'processing')) b
	WHERE h.state = 'dead' OR (h.state = 'pending' AND h.attempt > 0)
	ORDER BY k.key
$$;

-- ---------------------------------------------------------------------------
-- onDead: holdKey in the relay's aggregate order: the inbox's hold, index
-- and audit table (sql/schema/tables.sql)
-- ---------------------------------------------------------------------------
ALTER TABLE queuebox.inbox DROP CONSTRAINT inbox_hold_check;
ALTER TABLE queuebox.inbox ADD CONSTRAINT inbox_hold_check
	CHECK (hold IN ('aggregate', 'dead'));
COMMENT ON COLUMN queuebox.inbox.hold IS
	'aggregate: a pending row waiting for an earlier open row of its aggregate (released when that row ends); NULL: claimable when due. On a dead push row, dead: it holds its aggregate''s later rows in the relay''s order until queuebox.requeue_inbox() or queuebox.skip_inbox() (its source''s onDead: holdKey).';

CREATE INDEX IF NOT EXISTS inbox_push_aggregate_0_3_4_idx ON queuebox.inbox (aggregate_id, created_at, id)
	WHERE (state IN ('pending', 'processing') OR hold = 'dead') AND consumption = 'push'
	  AND aggregate_id IS NOT NULL;
DROP INDEX queuebox.inbox_push_aggregate_idx;
ALTER INDEX queuebox.inbox_push_aggregate_0_3_4_idx RENAME TO inbox_push_aggregate_idx;

CREATE TABLE queuebox.inbox_audit (
	id				bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	inbox_id		bigint NOT NULL,
	action			varchar(20) NOT NULL
		CONSTRAINT inbox_audit_action_check CHECK (action IN ('requeue', 'skip')),
	done_by			text NOT NULL DEFAULT current_user,
	done_at			timestamptz NOT NULL DEFAULT now(),
	payload_before	jsonb,
	payload_after	jsonb
);
CREATE INDEX inbox_audit_inbox_idx ON queuebox.inbox_audit (inbox_id);
COMMENT ON TABLE queuebox.inbox_audit IS
	'What operators did to dead inbox rows, by queuebox.requeue_inbox() (one row per requeued row; the payload before and after for an edited one) and queuebox.skip_inbox(id): who and when.';

-- ---------------------------------------------------------------------------
-- Every requeue audited (outbox and inbox, one row or in bulk)
-- ---------------------------------------------------------------------------
/*
 * requeue_outbox(id): a dead row back to pending, due now, attempts reset,
 * routed again with the current configuration.  It keeps its id, so it
 * keeps its place in its key's order: a row that held its key (onDead:
 * holdKey, hold 'dead') is its key's first open row again, and the rows
 * parked behind it follow it.  Recorded in outbox_audit (a requeue, the
 * payload unchanged).
 */
CREATE OR REPLACE FUNCTION queuebox.requeue_outbox(id bigint) RETURNS boolean
	LANGUAGE sql VOLATILE
	AS $$
	WITH u AS (
		UPDATE queuebox.outbox o
		SET state = 'pending', attempt = 0, scheduled_at = now(),
			claim_token = NULL, lease_until = NULL, destination = NULL, hold = 'ready'
		WHERE o.id = requeue_outbox.id AND o.state = 'dead'
		RETURNING o.id),
	a AS (
		INSERT INTO queuebox.outbox_audit (outbox_id, action)
		SELECT u.id, 'requeue' FROM u
		RETURNING 1)
	SELECT count(*) = 1 FROM a, LATERAL (SELECT queuebox._arm_outbox_wake()) w
$$;

/* requeue_outbox(topic_pattern, since, until): each row audited as one */
CREATE OR REPLACE FUNCTION queuebox.requeue_outbox(
	topic_pattern text, since timestamptz DEFAULT NULL, until timestamptz DEFAULT NULL)
	RETURNS bigint
	LANGUAGE sql VOLATILE
	AS $$
	WITH u AS (
		UPDATE queuebox.outbox o
		SET state = 'pending', attempt = 0, scheduled_at = now(),
			claim_token = NULL, lease_until = NULL, destination = NULL, hold = 'ready'
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
CREATE OR REPLACE FUNCTION queuebox.requeue_inbox(id bigint) RETURNS boolean
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

CREATE OR REPLACE FUNCTION queuebox.requeue_inbox(
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

CREATE OR REPLACE FUNCTION queuebox._schema_version() RETURNS text
	LANGUAGE sql IMMUTABLE AS $$ SELECT '0.3.4'::text $$;
