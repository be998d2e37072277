/*
 * queuebox--0.1.0.sql
 *	  Schema of the QueueBox extension: the outbox, its configuration, and the
 *	  statements the workers run.
 *
 * The statements the workers run live in src/common/qb_sql_pg.h; the
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
-- same text (src/common/qb_sql_pg.h), so tests of them test what the workers
-- do.  They are internal: an application never needs to call them.

/*
 * _outbox_claim: move up to batch_size due pending rows to processing under
 * one claim token, with a lease of lease_ms.  A keyed row is claimable only
 * when no earlier row of its key is pending or processing.
 */
CREATE FUNCTION queuebox._outbox_claim(
	batch_size int, lease_ms bigint, default_max_attempts int, token uuid)
	RETURNS TABLE (id bigint, message_id uuid, topic text, key text,
				   payload text, headers text, attempt int, max_attempts int)
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
