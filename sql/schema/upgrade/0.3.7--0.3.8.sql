/*
 * sql/schema/upgrade/0.3.7--0.3.8.sql
 *	  What changes from schema 0.3.7 to 0.3.8 in both PostgreSQL installs:
 *	  the extension's build/sql/queuebox--0.3.7--0.3.8.sql and the daemon's
 *	  upgrade step are made of this file (docs/design/schema.md).
 *
 * What changes (issue 39), one section each below: fan-out (outbox.origin,
 * a key's order per destination in outbox_key_open_idx and
 * outbox_parked_idx, outbox_origin_idx); the version; limits across the
 * daemon's replicas (two tables, empty until a daemon takes a limit).
 */

-- ---- fan-out: a key's order per destination -----------------------------------
-- A route may name several destinations (destinations: [a, b]): a row is
-- copied at its first claim, one copy per other destination, and each copy
-- keeps its key's order at its own destination (docs/delivery.md,
-- "Fan-out"; docs/design/claim.md, "One key, several destinations").
-- outbox.origin: on a copy, the row it was copied from (a nullable column:
-- no row is rewritten).  outbox_key_open_idx and outbox_parked_idx are made
-- again on (key, destination, place), under new names and then renamed: the
-- old ones serve the claims until the new ones are there (IF NOT EXISTS: an
-- operator may make them CONCURRENTLY first, docs/operations.md).  No row
-- changes.

ALTER TABLE queuebox.outbox ADD COLUMN IF NOT EXISTS origin bigint;
COMMENT ON COLUMN queuebox.outbox.origin IS
	'On a copy made by a route with several destinations (fan-out): the id of the row it was copied from, whose place in its key''s order it takes at its own destination. NULL on every other row.';

CREATE INDEX IF NOT EXISTS outbox_key_open_0_3_8_idx ON queuebox.outbox
	(key, (coalesce(destination, '')), (coalesce(origin, id)))
	WHERE (state IN ('pending', 'processing') OR hold = 'dead') AND key IS NOT NULL;
DROP INDEX queuebox.outbox_key_open_idx;
ALTER INDEX queuebox.outbox_key_open_0_3_8_idx RENAME TO outbox_key_open_idx;

CREATE INDEX IF NOT EXISTS outbox_parked_0_3_8_idx ON queuebox.outbox
	(key, (coalesce(destination, '')), (coalesce(origin, id)))
	WHERE state = 'pending' AND hold = 'key';
DROP INDEX queuebox.outbox_parked_idx;
ALTER INDEX queuebox.outbox_parked_0_3_8_idx RENAME TO outbox_parked_idx;

CREATE INDEX IF NOT EXISTS outbox_origin_idx ON queuebox.outbox (origin) WHERE origin IS NOT NULL;

-- The operators' functions of the outbox, as functions.sql has them now: a
-- requeued or replayed fan-out row goes to its own destination only (the
-- rest would be delivered twice); skip_outbox releases the row it held at
-- its destination; held_keys() reports a key per destination; outbox_row()
-- lists a fan-out message's deliveries.

CREATE OR REPLACE FUNCTION queuebox.requeue_outbox(id bigint) RETURNS boolean
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

CREATE OR REPLACE FUNCTION queuebox.requeue_outbox(
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

CREATE OR REPLACE FUNCTION queuebox.requeue_outbox(id bigint, payload jsonb) RETURNS boolean
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

CREATE OR REPLACE FUNCTION queuebox.skip_outbox(id bigint) RETURNS boolean
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

CREATE OR REPLACE FUNCTION queuebox.held_keys()
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

CREATE OR REPLACE FUNCTION queuebox.replay_outbox(id bigint) RETURNS bigint
	LANGUAGE sql VOLATILE
	AS $$
	INSERT INTO queuebox.outbox (topic, key, payload, headers, max_attempts, destination)
	SELECT o.topic, o.key, o.payload, o.headers, o.max_attempts,
		   CASE WHEN o.origin IS NOT NULL THEN o.destination END
	FROM queuebox.outbox o WHERE o.id = replay_outbox.id
	RETURNING id
$$;

CREATE OR REPLACE FUNCTION queuebox.replay_outbox(
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

CREATE OR REPLACE FUNCTION queuebox.outbox_row(id bigint) RETURNS jsonb
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

-- ---- the version ------------------------------------------------------------

CREATE OR REPLACE FUNCTION queuebox._schema_version() RETURNS text
	LANGUAGE sql IMMUTABLE AS $$ SELECT '0.3.8'::text $$;

-- ---- limits across replicas (issue 39: rateLimit, maxConcurrent) ----------
-- The same as a fresh install's (sql/schema/tables.sql).
-- The destinations' limits (rateLimit, maxConcurrent) every daemon replica
-- on this database shares (docs/delivery.md, "Limits"): a destination's
-- token bucket, and the places and tokens each claimer holds.  Written by
-- queuebox-mssqld's limit take alone (qb_sql_pg.h, QB_PG_LIMITS_TAKE),
-- which locks a destination's bucket row before it reads or writes either
-- table; the extension keeps its limits in shared memory and leaves these
-- empty.  A row per limited destination used, and per claimer and
-- destination; a gone claimer's rows are deleted by the next take.
CREATE TABLE queuebox.destination_limit (
	destination		text PRIMARY KEY,
	tokens			double precision NOT NULL,
	refilled_at		timestamptz NOT NULL
);
COMMENT ON TABLE queuebox.destination_limit IS
	'The token bucket of each rate-limited destination that the daemon replicas on this database share: its tokens at refilled_at (the database''s clock). Written by queuebox-mssqld; do not edit.';
CREATE TABLE queuebox.destination_limit_place (
	destination		text NOT NULL,
	claimer			bigint NOT NULL,
	held			int NOT NULL CONSTRAINT destination_limit_place_held_check CHECK (held >= 0),
	tokens_out		int NOT NULL DEFAULT 0 CONSTRAINT destination_limit_place_tokens_out_check CHECK (tokens_out >= 0),
	alive_until		timestamptz,
	PRIMARY KEY (destination, claimer)
);
COMMENT ON TABLE queuebox.destination_limit_place IS
	'The maxConcurrent places each daemon claimer holds at each destination, and the rateLimit tokens it took there and has not spent (the bucket refills up to burst less them); a claimer counts while a session holds its advisory lock (alive_until NULL) or, through a pooler, until alive_until. Written by queuebox-mssqld; do not edit.';
