/*
 * sql/pgext/host.sql
 *	  What the extension does in C: the configuration table and the
 *	  functions around it, the wake and routing triggers, the internal
 *	  wrappers of the workers' statements, and the functions
 *	  sql/schema/functions.sql calls (topic_matches, route_of,
 *	  _destination_names, _arm_outbox_wake, _arm_relay_wake), and
 *	  config_source().
 *
 * Between sql/schema/tables.sql and sql/schema/functions.sql in the
 * extension's install script (the Makefile puts them together).
 */

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

-- pg_dump keeps the rows of these tables (undelivered messages, the active
-- configuration, what operators did) instead of treating them as part of
-- the extension.
SELECT pg_catalog.pg_extension_config_dump('queuebox.outbox', '');
SELECT pg_catalog.pg_extension_config_dump('queuebox.config', '');
SELECT pg_catalog.pg_extension_config_dump('queuebox.outbox_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('queuebox.inbox', '');
SELECT pg_catalog.pg_extension_config_dump('queuebox.inbox_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('queuebox.destination_state', '');
SELECT pg_catalog.pg_extension_config_dump('queuebox.outbox_audit', '');
SELECT pg_catalog.pg_extension_config_dump('queuebox.outbox_audit_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('queuebox.inbox_audit', '');
SELECT pg_catalog.pg_extension_config_dump('queuebox.inbox_audit_id_seq', '');

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
-- The late-commit report (docs/design/claim.md) comes from outbox_route,
-- which sees each row's id; where that trigger does not fire, this one
-- reports "from the start".
CREATE TRIGGER outbox_wake BEFORE INSERT ON queuebox.outbox
	FOR EACH STATEMENT EXECUTE FUNCTION queuebox._wake_outbox();

CREATE FUNCTION queuebox.worker_status(
	OUT worker text, OUT pid int, OUT database text)
	RETURNS SETOF record
	AS 'MODULE_PATHNAME', 'qb_sql_worker_status'
	LANGUAGE C STRICT VOLATILE;

/*
 * _route_outbox: BEFORE INSERT FOR EACH ROW.  A row inserted without a
 * destination or hold gets its topic's destination and hold 'intake', by
 * the routes the workers published; otherwise it is left as it is.
 */
CREATE FUNCTION queuebox._route_outbox() RETURNS trigger
	AS 'MODULE_PATHNAME', 'qb_sql_route_outbox'
	LANGUAGE C;
CREATE TRIGGER outbox_route BEFORE INSERT ON queuebox.outbox
	FOR EACH ROW EXECUTE FUNCTION queuebox._route_outbox();

CREATE FUNCTION queuebox._wake_relay() RETURNS trigger
	AS 'MODULE_PATHNAME', 'qb_sql_wake_relay'
	LANGUAGE C;

-- As on the outbox: whatever inserts inbox rows wakes the relay at commit.
CREATE TRIGGER inbox_wake AFTER INSERT ON queuebox.inbox
	FOR EACH STATEMENT EXECUTE FUNCTION queuebox._wake_relay();

CREATE FUNCTION queuebox._arm_relay_wake() RETURNS void
	AS 'MODULE_PATHNAME', 'qb_sql_arm_relay_wake'
	LANGUAGE C VOLATILE;

-- ---------------------------------------------------------------------------
-- The worker statements
-- ---------------------------------------------------------------------------
-- The workers run these statements through SPI; the functions below run the
-- same text (src/common/store/qb_sql_pg.h), so tests of them test what the workers
-- do.  They are internal: an application never needs to call them.

/*
 * _outbox_claim: claim up to batch_size new unrouted rows (ids above
 * floor) and up to batch_size ready rows, plus, per destination in
 * destinations, up to limits[i] rows from its routed due rows and then its
 * intake above floors[i], plus one held row of each destination in
 * probes.  A keyed row with an earlier open row of its key is parked (hold
 * 'key') instead.  claimed is false for rows parked or moved to ready.
 */
CREATE FUNCTION queuebox._outbox_claim(
	batch_size int, lease_ms bigint, default_max_attempts int, token uuid,
	floor bigint DEFAULT 0, destinations text[] DEFAULT '{}', limits int[] DEFAULT '{}',
	probes text[] DEFAULT '{}', floors bigint[] DEFAULT '{}')
	RETURNS TABLE (id bigint, message_id uuid, topic text, key text,
				   payload text, headers text, attempt int, max_attempts int,
				   created_epoch double precision, claimed boolean, destination text,
				   in_intake boolean, not_due boolean, probe boolean)
	AS 'MODULE_PATHNAME', 'qb_sql_outbox_claim'
	LANGUAGE C VOLATILE;

/*
 * _outbox_settle: end a claim.  Element i says what happened to ids[i]:
 * 'sent', 'retry' (due after delays_ms[i]), 'dead', 'release' (pending,
 * attempt unchanged), 'route' (pending with its destination recorded) or
 * 'hold' (waits for its destination) or 'dead-hold' (dead, and its key's
 * later rows wait for it: onDead: holdKey).  destinations[i] is where the row was
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
-- The relay statements (the relay worker runs the same text)
-- ---------------------------------------------------------------------------
/* _relay_claim: push rows to forward, one per aggregate across all push sources. */
CREATE FUNCTION queuebox._relay_claim(batch_size int, lease_ms bigint, token uuid)
	RETURNS TABLE (id bigint, source text, event_type text, created_at timestamptz, traceparent text)
	AS 'MODULE_PATHNAME', 'qb_sql_relay_claim'
	LANGUAGE C VOLATILE;

/*
 * _relay_forward: the claimed rows with their rendered topics become outbox
 * rows and are marked processed (an empty topic: dead, holding its
 * aggregate where holds[i] is true: onDead: holdKey), in one statement.
 */
CREATE FUNCTION queuebox._relay_forward(token uuid, ids bigint[], topics text[], max_attempts int,
										holds boolean[] DEFAULT NULL)
	RETURNS bigint
	AS 'MODULE_PATHNAME', 'qb_sql_relay_forward'
	LANGUAGE C VOLATILE;

-- ---------------------------------------------------------------------------
-- What sql/schema/functions.sql calls
-- ---------------------------------------------------------------------------
CREATE FUNCTION queuebox.topic_matches(pattern text, topic text) RETURNS boolean
	AS 'MODULE_PATHNAME', 'qb_sql_topic_matches'
	LANGUAGE C STRICT IMMUTABLE;
COMMENT ON FUNCTION queuebox.topic_matches(text, text) IS
	'True when the topic matches the pattern, as routes match: "*" one segment, "**" any number.';

CREATE FUNCTION queuebox._arm_outbox_wake() RETURNS void
	AS 'MODULE_PATHNAME', 'qb_sql_arm_outbox_wake'
	LANGUAGE C VOLATILE;

CREATE FUNCTION queuebox._destination_names() RETURNS text[]
	AS 'MODULE_PATHNAME', 'qb_sql_destination_names'
	LANGUAGE C STABLE;

/*
 * config_source: where the configuration in force came from (the file
 * queuebox.config_file names, or the table configure() writes), when the
 * workers loaded it, its SHA-256, and the last load that failed.
 */
CREATE FUNCTION queuebox.config_source(
	OUT source text, OUT path text, OUT loaded_at timestamptz, OUT sha256 text,
	OUT last_error text, OUT last_error_at timestamptz)
	AS 'MODULE_PATHNAME', 'qb_sql_config_source'
	LANGUAGE C VOLATILE;
COMMENT ON FUNCTION queuebox.config_source() IS
	'Where the configuration in force came from (file, table or none), when the workers loaded it, its SHA-256, and the last failed load.';

/* route_of: the stats and destination_status() group unrouted rows by it. */
CREATE FUNCTION queuebox.route_of(topic text) RETURNS text
	AS 'MODULE_PATHNAME', 'qb_sql_route_of'
	LANGUAGE C STRICT STABLE;
COMMENT ON FUNCTION queuebox.route_of(text) IS
	'The destination the active configuration routes a topic to, or NULL when no route matches.';

-- ---------------------------------------------------------------------------
-- Replaying inbox rows: the topic is rendered with the configuration, in C
-- ---------------------------------------------------------------------------
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
