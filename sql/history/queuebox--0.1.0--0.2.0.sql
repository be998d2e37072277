/*
 * queuebox--0.1.0--0.2.0.sql
 *	  Delivery that no down destination, hot key or held snapshot can stall
 *	  (docs/design/claim.md).
 *
 * A new install runs queuebox--0.1.0.sql and then this script, so a fresh
 * database and an upgraded one are the same schema by construction.
 *
 * What changes:
 *	- outbox.destination: the destination a worker routed the row to, set at
 *	  its first claim (NULL: not routed yet);
 *	- outbox.hold: why a pending row is not claimable now: 'key' (an earlier
 *	  row of its key is open), 'destination' (its destination's circuit is
 *	  open, it was disabled by a 410, or it asked for a pause), 'ready'
 *	  (claimable, not routed yet); NULL: new, or routed and due at
 *	  scheduled_at.  The states of the spec are unchanged.
 *	- the due index is replaced by one index per place a claim reads
 *	  (intake, ready, routed, held), so held rows cost a claim nothing;
 *	- queuebox.destination_state: each destination's circuit breaker, shared
 *	  by every worker and replica;
 *	- the wake trigger fires BEFORE the insert, so it also learns the first
 *	  id a transaction can have (the late-commit report, claim.md).
 *
 * Upgrading builds four indexes on queuebox.outbox while holding its lock:
 * on a large outbox, run it when a pause of inserts is acceptable.  Rows
 * pending at the upgrade are claimed from intake again and keep their order.
 */
\echo Use "ALTER EXTENSION queuebox UPDATE" to load this file. \quit

ALTER TABLE queuebox.outbox
	ADD COLUMN destination text,
	ADD COLUMN hold varchar(20)
		CONSTRAINT outbox_hold_check CHECK (hold IN ('key', 'destination', 'ready'));

COMMENT ON COLUMN queuebox.outbox.destination IS
	'The destination a worker routed the row to at its first claim; NULL until then.';
COMMENT ON COLUMN queuebox.outbox.hold IS
	'Why a pending row waits: key (an earlier row of its key is open), destination (its destination is not taking rows), ready (claimable, not yet routed); NULL: new, or routed and due at scheduled_at.';

DROP INDEX queuebox.outbox_due_idx;
-- New rows, in id order: the claim reads from its floor (claim.md).
CREATE INDEX outbox_intake_idx ON queuebox.outbox (id)
	WHERE state = 'pending' AND destination IS NULL AND hold IS NULL;
-- Rows made claimable again before they were routed.
CREATE INDEX outbox_ready_idx ON queuebox.outbox (scheduled_at, id)
	WHERE state = 'pending' AND hold = 'ready';
-- Routed rows, per destination in due order: the claim asks each
-- destination only for what it can take now.
CREATE INDEX outbox_routed_idx ON queuebox.outbox (destination, scheduled_at, id)
	WHERE state = 'pending' AND hold IS NULL AND destination IS NOT NULL;
-- Rows held for their destination: the probe and the unpark read them.
CREATE INDEX outbox_held_idx ON queuebox.outbox (destination, id)
	WHERE state = 'pending' AND hold = 'destination';

-- ---------------------------------------------------------------------------
-- Destinations: the circuit breaker every worker and replica shares
-- ---------------------------------------------------------------------------
CREATE TABLE queuebox.destination_state (
	destination		text PRIMARY KEY,
	state			varchar(20) NOT NULL DEFAULT 'closed'
		CONSTRAINT destination_state_check
		CHECK (state IN ('closed', 'open', 'half-open', 'disabled')),
	failures		int NOT NULL DEFAULT 0 CHECK (failures >= 0),
	opened_at		timestamptz,
	probe_at		timestamptz,
	paused_until	timestamptz,
	last_error		text,
	changed_at		timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE queuebox.destination_state IS
	'Circuit breaker per destination, shared by every worker and replica: closed (rows flow), open (rows held, no attempt spent), half-open (one probe row in flight), disabled (a 410 Gone; until queuebox.resume_destination()). Written only on a change.';
SELECT pg_catalog.pg_extension_config_dump('queuebox.destination_state', '');

-- ---------------------------------------------------------------------------
-- The wake trigger: before the insert, so it can note the sequence's value
-- ---------------------------------------------------------------------------
DROP TRIGGER outbox_wake ON queuebox.outbox;
CREATE TRIGGER outbox_wake BEFORE INSERT ON queuebox.outbox
	FOR EACH STATEMENT EXECUTE FUNCTION queuebox._wake_outbox();

-- ---------------------------------------------------------------------------
-- The worker statements (src/common/store/qb_sql_pg.h)
-- ---------------------------------------------------------------------------
DROP FUNCTION queuebox._outbox_claim(int, bigint, int, uuid);
/*
 * _outbox_claim: claim up to batch_size new rows (ids above floor) and up to
 * batch_size ready rows, plus, per destination in destinations, up to
 * limits[i] routed due rows, plus one held row of each destination in
 * probes.  A keyed row with an earlier open row of its key is parked (hold
 * 'key') instead.  claimed is false for rows parked or moved to ready.
 */
CREATE FUNCTION queuebox._outbox_claim(
	batch_size int, lease_ms bigint, default_max_attempts int, token uuid,
	floor bigint DEFAULT 0, destinations text[] DEFAULT '{}', limits int[] DEFAULT '{}',
	probes text[] DEFAULT '{}')
	RETURNS TABLE (id bigint, message_id uuid, topic text, key text,
				   payload text, headers text, attempt int, max_attempts int,
				   created_epoch double precision, claimed boolean, destination text,
				   in_intake boolean, not_due boolean, probe boolean)
	AS 'MODULE_PATHNAME', 'qb_sql_outbox_claim'
	LANGUAGE C VOLATILE;

DROP FUNCTION queuebox._outbox_settle(uuid, bigint[], text[], int[], bigint[], text[]);
/*
 * _outbox_settle: end a claim.  Element i says what happened to ids[i]:
 * 'sent', 'retry' (due after delays_ms[i]), 'dead', 'release' (pending,
 * attempt unchanged), 'route' (pending with its destination recorded) or
 * 'hold' (waits for its destination).  destinations[i] is where the row was
 * routed (NULL: not routed).  Fenced by the token; then the first open row
 * of each key that ended is promoted, in a statement of its own.  Returns
 * the rows changed.
 */
CREATE FUNCTION queuebox._outbox_settle(
	token uuid, ids bigint[], outcomes text[], attempts int[],
	delays_ms bigint[], errors text[], destinations text[] DEFAULT NULL)
	RETURNS bigint
	AS 'MODULE_PATHNAME', 'qb_sql_outbox_settle'
	LANGUAGE C VOLATILE;

/*
 * _outbox_breaker: count a settle's attempts per destination into the
 * shared circuit breakers; returns each destination's state before and
 * after.
 */
CREATE FUNCTION queuebox._outbox_breaker(
	destinations text[], succeeded int[], failed int[], gone boolean[],
	retry_after_ms bigint[], errors text[], failures int[], cooldown_ms bigint[])
	RETURNS TABLE (destination text, old_state text, new_state text, paused boolean,
				   written bigint)
	AS 'MODULE_PATHNAME', 'qb_sql_outbox_breaker'
	LANGUAGE C VOLATILE;

/*
 * _outbox_states: the destinations that do not simply take rows now; an
 * open one whose cooldown is over goes half-open, and probe is true for the
 * caller that moved it.
 */
CREATE FUNCTION queuebox._outbox_states(probe_ms bigint)
	RETURNS TABLE (destination text, state text, failures int, paused boolean,
				   probe boolean, stored_state text)
	AS 'MODULE_PATHNAME', 'qb_sql_outbox_states'
	LANGUAGE C VOLATILE;

/* _outbox_unpark: rows held for these destinations become claimable. */
CREATE FUNCTION queuebox._outbox_unpark(destinations text[], max_rows int)
	RETURNS bigint
	AS 'MODULE_PATHNAME', 'qb_sql_outbox_unpark'
	LANGUAGE C STRICT VOLATILE;

-- ---------------------------------------------------------------------------
-- Operations
-- ---------------------------------------------------------------------------
/*
 * requeue_outbox(id): a dead row back to pending, due now, attempts reset,
 * routed again with the current configuration.  It keeps its id, so it
 * keeps its place in its key's order.
 */
CREATE OR REPLACE FUNCTION queuebox.requeue_outbox(id bigint) RETURNS boolean
	LANGUAGE sql VOLATILE
	AS $$
	WITH u AS (
		UPDATE queuebox.outbox o
		SET state = 'pending', attempt = 0, scheduled_at = now(),
			claim_token = NULL, lease_until = NULL, destination = NULL, hold = 'ready'
		WHERE o.id = requeue_outbox.id AND o.state = 'dead'
		RETURNING 1)
	SELECT count(*) = 1 FROM u, LATERAL (SELECT queuebox._arm_outbox_wake()) w
$$;

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
		RETURNING 1)
	SELECT count(*) FROM u, LATERAL (SELECT queuebox._arm_outbox_wake()) w
$$;

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

CREATE FUNCTION queuebox._destination_names() RETURNS text[]
	AS 'MODULE_PATHNAME', 'qb_sql_destination_names'
	LANGUAGE C STABLE;

/*
 * resume_destination(name): close the circuit of a destination (disabled by
 * a 410, or open), clear its failures and pause; its held rows are
 * delivered again.  True when it was not simply closed.
 */
CREATE FUNCTION queuebox.resume_destination(name text) RETURNS boolean
	LANGUAGE sql VOLATILE
	AS $$
	WITH u AS (
		UPDATE queuebox.destination_state d
		SET state = 'closed', failures = 0, paused_until = NULL, probe_at = NULL,
			opened_at = NULL, changed_at = now()
		WHERE d.destination = resume_destination.name
		  AND (d.state <> 'closed' OR d.failures > 0 OR d.paused_until IS NOT NULL)
		RETURNING 1)
	SELECT count(*) = 1 FROM u, LATERAL (SELECT queuebox._arm_outbox_wake()) w
$$;
COMMENT ON FUNCTION queuebox.resume_destination(text) IS
	'Close a destination''s circuit (after a 410 Gone, or to end an open one now); its held rows are delivered again.';

/*
 * outbox_stats: as before, by the destination a row was routed to (its
 * topic's route when not routed yet), with the destination's circuit.
 */
CREATE OR REPLACE VIEW queuebox.outbox_stats AS
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
	SELECT r.destination, r.state, sum(r.n)::bigint AS rows,
		   now() - min(r.oldest_pending) AS oldest_pending_age,
		   CASE WHEN r.destination IS NULL THEN NULL
				WHEN r.destination = '(no route)' THEN NULL
				ELSE coalesce(min(d.state), 'closed') END::text AS circuit
	FROM routed r LEFT JOIN queuebox.destination_state d ON d.destination = r.destination
	GROUP BY GROUPING SETS ((r.destination, r.state), (r.state))
	ORDER BY r.destination NULLS FIRST, r.state;
COMMENT ON VIEW queuebox.outbox_stats IS
	'Rows per state and per destination (destination NULL: all destinations), with the age of the oldest pending row and the destination''s circuit.';

/* The schema version the workers check before they claim. */
CREATE FUNCTION queuebox._schema_version() RETURNS text
	LANGUAGE sql IMMUTABLE AS $$ SELECT '0.2.0'::text $$;

-- ===========================================================================
-- The inbox: pull and relay claims that no failing aggregate can slow
-- (docs/design/claim.md, "The inbox: pull and relay")
-- ===========================================================================
/*
 * The same design as the outbox: a row that cannot be claimed because an
 * earlier row of its unit is open is parked (hold 'aggregate') at its first
 * claim, and leaves the claim's indexes; the statement that ends the
 * earlier row promotes the next one, in a later statement of the same
 * transaction.  The units:
 *	- pull: (source, aggregate_id); a pull row waits for every earlier open
 *	  row of its source and aggregate (as in 0.1.0, push rows of the same
 *	  source included);
 *	- push (the relay): aggregate_id across every push source; a push row
 *	  waits for earlier open push rows only.
 * Rows without an aggregate take part in no ordering and are never parked.
 * The states of the spec are unchanged (parked rows are pending).
 */
ALTER TABLE queuebox.inbox
	ADD COLUMN hold varchar(20)
		CONSTRAINT inbox_hold_check CHECK (hold IN ('aggregate'));
COMMENT ON COLUMN queuebox.inbox.hold IS
	'aggregate: a pending row waiting for an earlier open row of its aggregate (released when that row ends); NULL: claimable when due.';

-- The claims read due unparked rows in due order (a head retried a day
-- ahead is not walked), and expired leases from an index of their own.  The
-- order within an aggregate does not come from these indexes: a row is
-- claimed only when no earlier row of its unit is open (the aggregate
-- indexes below), and parking leaves one open head per unit to look at.
DROP INDEX queuebox.inbox_push_open_idx;
CREATE INDEX inbox_pull_due_idx ON queuebox.inbox (source, scheduled_at, created_at, id)
	WHERE state = 'pending' AND consumption = 'pull' AND hold IS NULL;
CREATE INDEX inbox_pull_lease_idx ON queuebox.inbox (source, lease_until)
	WHERE state = 'processing' AND consumption = 'pull';
CREATE INDEX inbox_push_due_idx ON queuebox.inbox (scheduled_at, created_at, id)
	WHERE state = 'pending' AND consumption = 'push' AND hold IS NULL;
CREATE INDEX inbox_push_lease_idx ON queuebox.inbox (lease_until)
	WHERE state = 'processing' AND consumption = 'push';
-- inbox_open_idx stays for the gauges and operators (no claim reads it);
-- inbox_aggregate_open_idx and inbox_push_aggregate_idx find a row's
-- nearest earlier open row (the claim) and a unit's first (the promotion).

/*
 * inbox_claim: as in 0.1.0 (same signature, same rows), now O(batch_size):
 * candidates are due unparked pull rows of the source in due order, and
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
 */
CREATE OR REPLACE FUNCTION queuebox.inbox_claim(source text, batch_size int, lease_ms int)
	RETURNS TABLE (id bigint, claim_token uuid, source text, idempotency_key text,
				   event_type text, aggregate_id text, payload jsonb, headers jsonb,
				   attempt int, created_at timestamptz)
	LANGUAGE sql VOLATILE
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

/*
 * inbox_complete and inbox_dead: as in 0.1.0 (true only when exactly one
 * row changed), and they promote the next row of the (source, aggregate):
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

CREATE OR REPLACE FUNCTION queuebox.inbox_complete(id bigint, claim_token uuid)
	RETURNS boolean
	LANGUAGE sql VOLATILE
	AS $$
	SELECT queuebox._inbox_end(inbox_complete.id, inbox_complete.claim_token, 'processed', NULL)
$$;

CREATE OR REPLACE FUNCTION queuebox.inbox_dead(id bigint, claim_token uuid, error text)
	RETURNS boolean
	LANGUAGE sql VOLATILE
	AS $$
	SELECT queuebox._inbox_end(inbox_dead.id, inbox_dead.claim_token, 'dead', inbox_dead.error)
$$;

/*
 * inbox_retry needs no change: the row stays open (pending, due later), so
 * the rows parked behind it stay parked, and it is claimed again from the
 * due index when due (it has no earlier open row, so it is never parked).
 *
 * requeue_inbox: a dead row back to pending, unparked (hold NULL; a dead
 * row was never parked, the assignment only makes it certain).  Nothing
 * parked behind others is stuck by it: the next claim checks the requeued
 * row's order like any new row's, and parks it behind an open earlier row
 * if there is one; a row parked behind a later row is released when that
 * row ends, or, when the requeued row is now the first open row of the
 * unit, by the promotion of the requeued row's own end (a promotion
 * releases the first open row of the unit, whichever row ended).
 */
CREATE OR REPLACE FUNCTION queuebox.requeue_inbox(id bigint) RETURNS boolean
	LANGUAGE sql VOLATILE
	AS $$
	WITH u AS (
		UPDATE queuebox.inbox i
		SET state = 'pending', attempt = 0, scheduled_at = now(),
			claim_token = NULL, lease_until = NULL, hold = NULL
		WHERE i.id = requeue_inbox.id AND i.state = 'dead'
		RETURNING 1)
	SELECT count(*) = 1 FROM u, LATERAL (SELECT queuebox._arm_relay_wake()) w
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
		RETURNING 1)
	SELECT count(*) FROM u, LATERAL (SELECT queuebox._arm_relay_wake()) w
$$;
