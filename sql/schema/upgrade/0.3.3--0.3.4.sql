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
 *
 * No row changes: no dead row holds its key before this version.  CREATE
 * INDEX reads the outbox once and blocks writes to it while it runs:
 * upgrade when the outbox is quiet, or create outbox_key_open_0_3_4_idx
 * CONCURRENTLY by hand first (the script then finds it and skips it).
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
	done_by			text NOT NULL DEFAULT coalesce(nullif(current_setting('queuebox_admin.actor', true), ''), current_user),
	done_at			timestamptz NOT NULL DEFAULT now(),
	payload_before	jsonb,
	payload_after	jsonb
);
CREATE INDEX outbox_audit_outbox_idx ON queuebox.outbox_audit (outbox_id);
COMMENT ON TABLE queuebox.outbox_audit IS
	'What operators did to dead outbox rows, by queuebox.requeue_outbox(id, payload) and queuebox.skip_outbox(id): who, when, and for an edited requeue the payload before and after. Retention does not delete it.';

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
-- Operations: the console's reads (issue 25)
-- ---------------------------------------------------------------------------
-- Dead rows by id, and by each exact filter of dead_outbox / dead_inbox:
-- a page walks one of these in id order (docs/operations.md, "Dead rows").
-- Partial on state = 'dead', so only a row going dead writes an entry:
-- claims, settles and sent rows pay nothing, and the state update was
-- never HOT (state is in other partial indexes' predicates).
CREATE INDEX outbox_dead_idx ON queuebox.outbox (id) WHERE state = 'dead';
CREATE INDEX outbox_dead_destination_idx ON queuebox.outbox (destination, id) WHERE state = 'dead';
CREATE INDEX outbox_dead_topic_idx ON queuebox.outbox (topic, id) WHERE state = 'dead';
CREATE INDEX outbox_dead_key_idx ON queuebox.outbox (key, id) WHERE state = 'dead';
CREATE INDEX inbox_dead_idx ON queuebox.inbox (id) WHERE state = 'dead';
CREATE INDEX inbox_dead_source_idx ON queuebox.inbox (source, id) WHERE state = 'dead';

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
	FOR r IN EXECUTE
		'SELECT o.id, o.destination, o.topic, o.key, o.last_error, o.created_at'
		' FROM queuebox.outbox o WHERE o.state = ''dead'' AND o.id > $1'
		|| CASE WHEN lead IS NULL THEN '' ELSE format(' AND o.%I = $2', lead) END
		|| ' ORDER BY o.id'
		USING coalesce(dead_outbox.after, 0), lead_value
	LOOP
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
	r			record;
	ids			bigint[] := '{}';
	examined	int := 0;
	last_id		bigint;
BEGIN
	IF page_size IS NULL OR page_size NOT BETWEEN 1 AND 1000 THEN
		RAISE EXCEPTION 'page_size must be from 1 to 1000, not %', page_size
			USING ERRCODE = 'invalid_parameter_value';
	END IF;
	FOR r IN EXECUTE
		'SELECT i.id, i.event_type, i.idempotency_key, i.aggregate_id, i.last_error, i.created_at'
		' FROM queuebox.inbox i WHERE i.state = ''dead'' AND i.id > $1'
		|| CASE WHEN dead_inbox.source IS NULL THEN '' ELSE ' AND i.source = $2' END
		|| ' ORDER BY i.id'
		USING coalesce(dead_inbox.after, 0), dead_inbox.source
	LOOP
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
 * included, with what operators did to it (outbox_audit, oldest first);
 * NULL when there is no such row.
 */
CREATE FUNCTION queuebox.outbox_row(id bigint) RETURNS jsonb
	LANGUAGE sql STABLE
	AS $$
	SELECT jsonb_build_object(
		'id', o.id, 'message_id', o.message_id, 'topic', o.topic, 'key', o.key,
		'destination', o.destination, 'state', o.state, 'hold', o.hold, 'attempt', o.attempt,
		'max_attempts', o.max_attempts, 'scheduled_at', o.scheduled_at, 'created_at', o.created_at,
		'last_error', o.last_error, 'payload', o.payload, 'headers', o.headers,
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

CREATE OR REPLACE FUNCTION queuebox._schema_version() RETURNS text
	LANGUAGE sql IMMUTABLE AS $$ SELECT '0.3.4'::text $$;
