/*
 * queuebox--0.1.0.sql
 *	  Schema of the QueueBox extension: the outbox, its configuration, and the
 *	  statements the workers run.
 *
 * The statements the workers run live in src/common/store/qb_sql_pg.h; the
 * internal functions _outbox_claim() and friends below run the same text.
 */
\echo Use "CREATE EXTENSION queuebox" to load this file. \quit

-- ---------------------------------------------------------------------------
-- The outbox
-- ---------------------------------------------------------------------------
CREATE TABLE queuebox.outbox (
	id				bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	message_id		uuid NOT NULL DEFAULT gen_random_uuid(),
	topic			text NOT NULL CHECK (topic <> ''),
	key				text,
	payload			jsonb NOT NULL,
	headers			jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(headers) = 'object'),
	state			varchar(50) NOT NULL DEFAULT 'pending'
		CONSTRAINT outbox_state_check
		CHECK (state IN ('pending', 'processing', 'sent', 'dead')),
	attempt			int NOT NULL DEFAULT 0 CHECK (attempt >= 0),
	max_attempts	int CHECK (max_attempts IS NULL OR max_attempts >= 1),
	scheduled_at	timestamptz NOT NULL DEFAULT now(),
	created_at		timestamptz NOT NULL DEFAULT now(),
	claim_token		uuid,
	lease_until		timestamptz,
	last_error		text
) WITH (fillfactor = 80,
	  -- a queue table: every row is updated twice, so vacuum it early and
	  -- often; until it is, claims walk the dead entries of delivered rows
	  autovacuum_vacuum_scale_factor = 0.01,
	  autovacuum_vacuum_threshold = 1000,
	  autovacuum_vacuum_insert_scale_factor = 0.05,
	  autovacuum_analyze_scale_factor = 0.02,
	  -- truncating the table's empty tail takes an ACCESS EXCLUSIVE lock that
	  -- stalls every claim and insert for its duration
	  vacuum_truncate = false);

COMMENT ON TABLE queuebox.outbox IS
	'Messages to deliver. Insert in the transaction of your business write; QueueBox claims, routes and publishes them.';
COMMENT ON COLUMN queuebox.outbox.key IS
	'Ordering unit: rows of one key are delivered one at a time in id order. NULL takes part in no ordering.';
COMMENT ON COLUMN queuebox.outbox.max_attempts IS
	'Delivery attempts before the row goes dead; NULL takes outbox.maxAttempts from the configuration.';
COMMENT ON COLUMN queuebox.outbox.lease_until IS
	'While processing: when the claim expires and the reclaim step returns the row to pending.';

-- The claim scans due pending rows in order; sent and dead rows are in no
-- partial index, so millions of them cost the claim nothing.
CREATE INDEX outbox_due_idx ON queuebox.outbox (scheduled_at, id)
	WHERE state = 'pending';
-- The per-key predicate: is an earlier row of this key still unsettled?
CREATE INDEX outbox_key_open_idx ON queuebox.outbox (key, id)
	WHERE state IN ('pending', 'processing') AND key IS NOT NULL;
-- The reclaim step: expired leases.
CREATE INDEX outbox_lease_idx ON queuebox.outbox (lease_until)
	WHERE state = 'processing';
-- Retention: old rows by creation time.  BRIN, not a partial btree on sent
-- rows: every settle to 'sent' would otherwise add a btree entry, and rows
-- are created in time order, so block ranges summarise created_at well.
CREATE INDEX outbox_created_brin ON queuebox.outbox USING brin (created_at);

-- ---------------------------------------------------------------------------
-- Configuration: one document, validated by queuebox.configure()
-- ---------------------------------------------------------------------------
CREATE TABLE queuebox.config (
	id			int PRIMARY KEY DEFAULT 1 CHECK (id = 1),
	document	text NOT NULL,
	updated_at	timestamptz NOT NULL DEFAULT now(),
	updated_by	name NOT NULL DEFAULT current_user
);
COMMENT ON TABLE queuebox.config IS
	'The active configuration document (raw YAML; ${NAME} references are expanded by the workers). Change it with queuebox.configure().';

-- pg_dump keeps the rows of both tables (undelivered messages, the active
-- configuration) instead of treating them as part of the extension.
SELECT pg_catalog.pg_extension_config_dump('queuebox.outbox', '');
SELECT pg_catalog.pg_extension_config_dump('queuebox.config', '');
SELECT pg_catalog.pg_extension_config_dump('queuebox.outbox_id_seq', '');

-- ---------------------------------------------------------------------------
-- C functions
-- ---------------------------------------------------------------------------
CREATE FUNCTION queuebox.configure(document text) RETURNS text
	AS 'MODULE_PATHNAME', 'qb_sql_configure'
	LANGUAGE C STRICT VOLATILE;
COMMENT ON FUNCTION queuebox.configure(text) IS
	'Validate a YAML configuration document and make it the active one (workers reload it after commit).';

CREATE FUNCTION queuebox.validate(document text) RETURNS text
	AS 'MODULE_PATHNAME', 'qb_sql_validate'
	LANGUAGE C STRICT STABLE;
COMMENT ON FUNCTION queuebox.validate(text) IS
	'Validate a YAML configuration document without storing it; raises the same ERROR as configure().';

CREATE FUNCTION queuebox._wake_outbox() RETURNS trigger
	AS 'MODULE_PATHNAME', 'qb_sql_wake_outbox'
	LANGUAGE C;

-- One statement-level trigger arms a wake that fires at commit, whatever
-- inserted the rows (INSERT, COPY, a function, enqueue()).
CREATE TRIGGER outbox_wake AFTER INSERT ON queuebox.outbox
	FOR EACH STATEMENT EXECUTE FUNCTION queuebox._wake_outbox();

CREATE FUNCTION queuebox.worker_status(
	OUT worker text, OUT pid int, OUT database text)
	RETURNS SETOF record
	AS 'MODULE_PATHNAME', 'qb_sql_worker_status'
	LANGUAGE C STRICT VOLATILE;

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
-- The worker statements
-- ---------------------------------------------------------------------------
-- The workers run these statements through SPI; the functions below run the
-- same text (src/common/store/qb_sql_pg.h), so tests of them test what the workers
-- do.  They are internal: an application never needs to call them.

/*
 * _outbox_claim: move up to batch_size due pending rows to processing under
 * one claim token, with a lease of lease_ms.  A keyed row is claimable only
 * when no earlier row of its key is pending or processing.
 */
CREATE FUNCTION queuebox._outbox_claim(
	batch_size int, lease_ms bigint, default_max_attempts int, token uuid)
	RETURNS TABLE (id bigint, message_id uuid, topic text, key text,
				   payload text, headers text, attempt int, max_attempts int,
				   created_epoch double precision)
	AS 'MODULE_PATHNAME', 'qb_sql_outbox_claim'
	LANGUAGE C VOLATILE;

/*
 * _outbox_settle: end a claim for a whole batch in one statement.  Element i
 * says what happened to ids[i]: 'sent', 'retry' (pending again, due after
 * delays_ms[i]), 'dead', or 'release' (pending again, attempt unchanged: the
 * worker stopped before it knew).  Fenced by the claim token; returns the
 * rows changed.
 */
CREATE FUNCTION queuebox._outbox_settle(
	token uuid, ids bigint[], outcomes text[], attempts int[],
	delays_ms bigint[], errors text[])
	RETURNS bigint
	AS 'MODULE_PATHNAME', 'qb_sql_outbox_settle'
	LANGUAGE C VOLATILE;

/* _outbox_reclaim: expired leases go back to pending, attempt unchanged. */
CREATE FUNCTION queuebox._outbox_reclaim(max_rows int)
	RETURNS bigint
	AS 'MODULE_PATHNAME', 'qb_sql_outbox_reclaim'
	LANGUAGE C STRICT VOLATILE;

/* _outbox_retention: delete up to max_rows sent rows older than keep_sec. */
CREATE FUNCTION queuebox._outbox_retention(keep_sec bigint, max_rows int)
	RETURNS bigint
	AS 'MODULE_PATHNAME', 'qb_sql_outbox_retention'
	LANGUAGE C STRICT VOLATILE;

-- ---------------------------------------------------------------------------
-- The inbox
-- ---------------------------------------------------------------------------
CREATE TABLE queuebox.inbox (
	id				bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	source			text NOT NULL CHECK (source <> ''),
	idempotency_key	text NOT NULL CHECK (idempotency_key <> ''),
	event_type		text,
	aggregate_id	text,
	payload			jsonb NOT NULL,
	headers			jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(headers) = 'object'),
	consumption		varchar(10) NOT NULL DEFAULT 'push'
		CONSTRAINT inbox_consumption_check CHECK (consumption IN ('push', 'pull')),
	state			varchar(50) NOT NULL DEFAULT 'pending'
		CONSTRAINT inbox_state_check
		CHECK (state IN ('pending', 'processing', 'processed', 'dead')),
	attempt			int NOT NULL DEFAULT 0 CHECK (attempt >= 0),
	scheduled_at	timestamptz NOT NULL DEFAULT now(),
	created_at		timestamptz NOT NULL DEFAULT now(),
	claim_token		uuid,
	lease_until		timestamptz,
	last_error		text,
	CONSTRAINT inbox_source_idempotency_key UNIQUE (source, idempotency_key)
) WITH (fillfactor = 80,
	  autovacuum_vacuum_scale_factor = 0.01,
	  autovacuum_vacuum_threshold = 1000,
	  autovacuum_analyze_scale_factor = 0.02,
	  vacuum_truncate = false);

COMMENT ON TABLE queuebox.inbox IS
	'Messages received from outside, stored once per (source, idempotency_key). Push rows are forwarded by the relay; pull rows are consumed with queuebox.inbox_claim() and friends.';
COMMENT ON COLUMN queuebox.inbox.consumption IS
	'push: the relay forwards the row into the outbox; pull: the application consumes it. Stored at receipt.';

-- Pull claims: open rows of a source in created_at order ...
CREATE INDEX inbox_open_idx ON queuebox.inbox (source, created_at, id)
	WHERE state IN ('pending', 'processing');
-- ... and the per-aggregate predicate: an earlier open row of the aggregate?
CREATE INDEX inbox_aggregate_open_idx ON queuebox.inbox (source, aggregate_id, created_at, id)
	WHERE state IN ('pending', 'processing') AND aggregate_id IS NOT NULL;

-- The relay: open push rows in created_at order, and the per-aggregate
-- predicate across every push source.
CREATE INDEX inbox_push_open_idx ON queuebox.inbox (created_at, id)
	WHERE state IN ('pending', 'processing') AND consumption = 'push';
CREATE INDEX inbox_push_aggregate_idx ON queuebox.inbox (aggregate_id, created_at, id)
	WHERE state IN ('pending', 'processing') AND consumption = 'push' AND aggregate_id IS NOT NULL;

CREATE FUNCTION queuebox._wake_relay() RETURNS trigger
	AS 'MODULE_PATHNAME', 'qb_sql_wake_relay'
	LANGUAGE C;

-- As on the outbox: whatever inserts inbox rows wakes the relay at commit.
CREATE TRIGGER inbox_wake AFTER INSERT ON queuebox.inbox
	FOR EACH STATEMENT EXECUTE FUNCTION queuebox._wake_relay();

CREATE FUNCTION queuebox._arm_relay_wake() RETURNS void
	AS 'MODULE_PATHNAME', 'qb_sql_arm_relay_wake'
	LANGUAGE C VOLATILE;

SELECT pg_catalog.pg_extension_config_dump('queuebox.inbox', '');
SELECT pg_catalog.pg_extension_config_dump('queuebox.inbox_id_seq', '');

-- ---------------------------------------------------------------------------
-- Pull consumption: the five statements (examples/pull/sql/postgresql/)
-- ---------------------------------------------------------------------------
-- Each is one statement, safe to call from any driver with bound parameters.
-- renew, complete, retry and dead return true only when exactly one row
-- changed: false means another worker owns the message, so stop the work.

/*
 * inbox_claim: up to batch_size messages of one pull source, each with a new
 * claim token and a lease of lease_ms.  Claimable: pending and due, or
 * processing with an expired lease (a takeover; the old token is fenced off).
 * A row with an aggregate is claimable only when no earlier row (created_at,
 * id) of the same source and aggregate is pending or processing, so at most
 * one message per (source, aggregate_id) is held, in created_at order.
 */
CREATE FUNCTION queuebox.inbox_claim(source text, batch_size int, lease_ms int)
	RETURNS TABLE (id bigint, claim_token uuid, source text, idempotency_key text,
				   event_type text, aggregate_id text, payload jsonb, headers jsonb,
				   attempt int, created_at timestamptz)
	LANGUAGE sql VOLATILE
	AS $$
	UPDATE queuebox.inbox i
	SET state = 'processing',
		claim_token = gen_random_uuid(),
		lease_until = now() + inbox_claim.lease_ms * interval '1 millisecond'
	WHERE i.id = ANY (ARRAY(
		SELECT c.id FROM queuebox.inbox c
		WHERE c.source = inbox_claim.source
		  AND c.consumption = 'pull'
		  AND c.state IN ('pending', 'processing')
		  AND ((c.state = 'pending' AND c.scheduled_at <= now())
			   OR (c.state = 'processing' AND c.lease_until < now()))
		  AND (c.aggregate_id IS NULL OR NOT EXISTS (
				SELECT 1 FROM queuebox.inbox e
				WHERE e.source = c.source AND e.aggregate_id = c.aggregate_id
				  AND e.state IN ('pending', 'processing')
				  AND (e.created_at, e.id) < (c.created_at, c.id)))
		ORDER BY c.created_at, c.id
		LIMIT inbox_claim.batch_size
		FOR UPDATE SKIP LOCKED))
	RETURNING i.id, i.claim_token, i.source, i.idempotency_key, i.event_type,
			  i.aggregate_id, i.payload, i.headers, i.attempt, i.created_at
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

/* inbox_complete: the work is done; run it in the business transaction. */
CREATE FUNCTION queuebox.inbox_complete(id bigint, claim_token uuid)
	RETURNS boolean
	LANGUAGE sql VOLATILE
	AS $$
	WITH u AS (
		UPDATE queuebox.inbox i
		SET state = 'processed', claim_token = NULL, lease_until = NULL
		WHERE i.id = inbox_complete.id AND i.claim_token = inbox_complete.claim_token
		  AND i.state = 'processing'
		RETURNING 1)
	SELECT count(*) = 1 FROM u
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

/* inbox_dead: give up; dead is final (only an operator requeues). */
CREATE FUNCTION queuebox.inbox_dead(id bigint, claim_token uuid, error text)
	RETURNS boolean
	LANGUAGE sql VOLATILE
	AS $$
	WITH u AS (
		UPDATE queuebox.inbox i
		SET state = 'dead', last_error = inbox_dead.error,
			claim_token = NULL, lease_until = NULL
		WHERE i.id = inbox_dead.id AND i.claim_token = inbox_dead.claim_token
		  AND i.state = 'processing'
		RETURNING 1)
	SELECT count(*) = 1 FROM u
$$;

-- ---------------------------------------------------------------------------
-- The relay statements (the relay worker runs the same text)
-- ---------------------------------------------------------------------------
/* _relay_claim: push rows to forward, one per aggregate across all push sources. */
CREATE FUNCTION queuebox._relay_claim(batch_size int, lease_ms bigint, token uuid)
	RETURNS TABLE (id bigint, source text, event_type text, created_at timestamptz)
	AS 'MODULE_PATHNAME', 'qb_sql_relay_claim'
	LANGUAGE C VOLATILE;

/*
 * _relay_forward: the claimed rows with their rendered topics become outbox
 * rows and are marked processed (an empty topic: dead), in one statement.
 */
CREATE FUNCTION queuebox._relay_forward(token uuid, ids bigint[], topics text[], max_attempts int)
	RETURNS bigint
	AS 'MODULE_PATHNAME', 'qb_sql_relay_forward'
	LANGUAGE C VOLATILE;

-- ---------------------------------------------------------------------------
-- Operations: requeue and replay
-- ---------------------------------------------------------------------------
CREATE FUNCTION queuebox.topic_matches(pattern text, topic text) RETURNS boolean
	AS 'MODULE_PATHNAME', 'qb_sql_topic_matches'
	LANGUAGE C STRICT IMMUTABLE;
COMMENT ON FUNCTION queuebox.topic_matches(text, text) IS
	'True when the topic matches the pattern, as routes match: "*" one segment, "**" any number.';

CREATE FUNCTION queuebox._arm_outbox_wake() RETURNS void
	AS 'MODULE_PATHNAME', 'qb_sql_arm_outbox_wake'
	LANGUAGE C VOLATILE;

/*
 * requeue_outbox(id): a dead row back to pending, due now, attempts reset.
 * The row keeps its id and message_id, so it keeps its place in its key's
 * order.  True when the row was dead and is now pending.
 */
CREATE FUNCTION queuebox.requeue_outbox(id bigint) RETURNS boolean
	LANGUAGE sql VOLATILE
	AS $$
	WITH u AS (
		UPDATE queuebox.outbox o
		SET state = 'pending', attempt = 0, scheduled_at = now(),
			claim_token = NULL, lease_until = NULL
		WHERE o.id = requeue_outbox.id AND o.state = 'dead'
		RETURNING 1)
	SELECT count(*) = 1 FROM u, LATERAL (SELECT queuebox._arm_outbox_wake()) w
$$;

/*
 * requeue_outbox(topic_pattern, since, until): every dead row whose topic
 * matches (NULL: all) and whose created_at is in [since, until) (NULL: open).
 * Rows keep their ids, so each key's order is kept.  Returns rows requeued.
 */
CREATE FUNCTION queuebox.requeue_outbox(
	topic_pattern text, since timestamptz DEFAULT NULL, until timestamptz DEFAULT NULL)
	RETURNS bigint
	LANGUAGE sql VOLATILE
	AS $$
	WITH u AS (
		UPDATE queuebox.outbox o
		SET state = 'pending', attempt = 0, scheduled_at = now(),
			claim_token = NULL, lease_until = NULL
		WHERE o.state = 'dead'
		  AND (requeue_outbox.topic_pattern IS NULL
			   OR queuebox.topic_matches(requeue_outbox.topic_pattern, o.topic))
		  AND (requeue_outbox.since IS NULL OR o.created_at >= requeue_outbox.since)
		  AND (requeue_outbox.until IS NULL OR o.created_at < requeue_outbox.until)
		RETURNING 1)
	SELECT count(*) FROM u, LATERAL (SELECT queuebox._arm_outbox_wake()) w
$$;

/*
 * replay_outbox(id): a new pending row with the same topic, key, payload,
 * headers and max_attempts, and a new message_id; any state may be
 * replayed.  Returns the new row's id, or NULL when there is no such row.
 */
CREATE FUNCTION queuebox.replay_outbox(id bigint) RETURNS bigint
	LANGUAGE sql VOLATILE
	AS $$
	INSERT INTO queuebox.outbox (topic, key, payload, headers, max_attempts)
	SELECT o.topic, o.key, o.payload, o.headers, o.max_attempts
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
		INSERT INTO queuebox.outbox (topic, key, payload, headers, max_attempts)
		SELECT o.topic, o.key, o.payload, o.headers, o.max_attempts
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

/* requeue_inbox(id): a dead inbox row back to pending, attempts reset. */
CREATE FUNCTION queuebox.requeue_inbox(id bigint) RETURNS boolean
	LANGUAGE sql VOLATILE
	AS $$
	WITH u AS (
		UPDATE queuebox.inbox i
		SET state = 'pending', attempt = 0, scheduled_at = now(),
			claim_token = NULL, lease_until = NULL
		WHERE i.id = requeue_inbox.id AND i.state = 'dead'
		RETURNING 1)
	SELECT count(*) = 1 FROM u, LATERAL (SELECT queuebox._arm_relay_wake()) w
$$;

/* requeue_inbox(source, since, until): every dead row of a source (NULL: all). */
CREATE FUNCTION queuebox.requeue_inbox(
	source text, since timestamptz DEFAULT NULL, until timestamptz DEFAULT NULL)
	RETURNS bigint
	LANGUAGE sql VOLATILE
	AS $$
	WITH u AS (
		UPDATE queuebox.inbox i
		SET state = 'pending', attempt = 0, scheduled_at = now(),
			claim_token = NULL, lease_until = NULL
		WHERE i.state = 'dead'
		  AND (requeue_inbox.source IS NULL OR i.source = requeue_inbox.source)
		  AND (requeue_inbox.since IS NULL OR i.created_at >= requeue_inbox.since)
		  AND (requeue_inbox.until IS NULL OR i.created_at < requeue_inbox.until)
		RETURNING 1)
	SELECT count(*) FROM u, LATERAL (SELECT queuebox._arm_relay_wake()) w
$$;

/*
 * replay_inbox(id): a new outbox row from an inbox row in any state,
 * mapped as the relay maps it (topic rendered from the source's template in
 * the CURRENT configuration, key = aggregate_id, the payload, the headers
 * with x-inbox-id, x-source, x-idempotency-key and X-Correlation-Id set by
 * QueueBox, inbox.relay.maxAttempts).  The inbox row is not changed.
 * Returns the new outbox id; an unknown id or an empty topic is an ERROR.
 */
CREATE FUNCTION queuebox.replay_inbox(id bigint) RETURNS bigint
	AS 'MODULE_PATHNAME', 'qb_sql_replay_inbox_one'
	LANGUAGE C STRICT VOLATILE;

/*
 * replay_inbox(state, source, since, until): every inbox row in that state
 * (NULL: any) of that source (NULL: any) created in [since, until), in
 * created_at, id order, so each aggregate's order is kept.  Rows whose
 * topic renders empty are skipped and counted in a NOTICE.  Returns the
 * outbox rows inserted.
 */
CREATE FUNCTION queuebox.replay_inbox(
	state text, source text DEFAULT NULL,
	since timestamptz DEFAULT NULL, until timestamptz DEFAULT NULL)
	RETURNS bigint
	AS 'MODULE_PATHNAME', 'qb_sql_replay_inbox'
	LANGUAGE C VOLATILE;

-- ---------------------------------------------------------------------------
-- Visibility
-- ---------------------------------------------------------------------------

/*
 * outbox_stats: one row per (destination, state) plus a total per state
 * (destination NULL).  The destination is the route the current
 * configuration gives the row's topic; rows no route matches show as
 * '(no route)'.
 */
CREATE FUNCTION queuebox.route_of(topic text) RETURNS text
	AS 'MODULE_PATHNAME', 'qb_sql_route_of'
	LANGUAGE C STRICT STABLE;
COMMENT ON FUNCTION queuebox.route_of(text) IS
	'The destination the active configuration routes a topic to, or NULL when no route matches.';

CREATE VIEW queuebox.outbox_stats AS
	WITH per_topic AS (
		SELECT topic, state, count(*) AS n,
			   min(created_at) FILTER (WHERE state = 'pending') AS oldest_pending
		FROM queuebox.outbox
		GROUP BY topic, state
	), routed AS (
		SELECT coalesce(queuebox.route_of(topic), '(no route)') AS destination,
			   state, n, oldest_pending
		FROM per_topic
	)
	SELECT destination, state, sum(n)::bigint AS rows,
		   now() - min(oldest_pending) AS oldest_pending_age
	FROM routed
	GROUP BY GROUPING SETS ((destination, state), (state))
	ORDER BY destination NULLS FIRST, state;
COMMENT ON VIEW queuebox.outbox_stats IS
	'Rows per state and per destination (destination NULL: all destinations), with the age of the oldest pending row.';
