/*
 * sql/schema/tables.sql
 *	  The tables and indexes of QueueBox, as of the current schema version:
 *	  one copy for both hosts.
 *
 * The extension's install script (build/sql/queuebox--<version>.sql, made
 * by the Makefile) and the daemon's PostgreSQL schema are both put together
 * from a head file (sql/pgext/head.sql, sql/daemon/head.sql), this file, a
 * host file (sql/pgext/host.sql, sql/daemon/host.sql: what each host does
 * in C or in SQL) and sql/schema/functions.sql, in that order.
 * docs/design/schema.md has the rules for a schema change.  No psql
 * meta-command here: the daemon sends the text as it is.
 */

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
	last_error		text,
	destination		text,
	hold			varchar(20)
		CONSTRAINT outbox_hold_check CHECK (hold IN ('key', 'destination', 'ready', 'intake', 'dead')),
	claimer			bigint,
	origin			bigint
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
COMMENT ON COLUMN queuebox.outbox.claimer IS
	'While processing: the worker that claimed the row, by the session advisory lock it holds while it runs (pg_locks, objsubid 1); when no session holds that lock the reclaim step takes the row over at once. NULL: taken over only when its lease expires (takeover off, or a pooled daemon connection).';
COMMENT ON COLUMN queuebox.outbox.destination IS
	'The destination the row is routed to: at insert (the outbox_route trigger) or at its first claim; NULL until then.';
COMMENT ON COLUMN queuebox.outbox.origin IS
	'On a copy made by a route with several destinations (fan-out): the id of the row it was copied from, whose place in its key''s order it takes at its own destination. NULL on every other row.';
COMMENT ON COLUMN queuebox.outbox.hold IS
	'Where a pending row waits: intake (new, routed at insert), key (an earlier row of its key is open), destination (its destination is not taking rows), ready (claimable, not yet routed); NULL: new and not routed, or routed and due at scheduled_at. On a dead row, dead: it holds its key''s later rows until queuebox.requeue_outbox() or queuebox.skip_outbox() (onDead: holdKey).';

-- Each place a pending row can wait in has its own partial index, so a claim
-- reads only the places that can give it a row now (docs/design/claim.md);
-- sent and dead rows are in no partial index and cost the claims nothing.
-- New rows that were not routed at insert (the unrouted intake), in id
-- order: the claim reads them from its floor (claim.md).
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
-- New rows routed at insert, per destination in id order: a claim reads a
-- destination's rows from its floor, and only when it has room.
CREATE INDEX outbox_dest_intake_idx ON queuebox.outbox (destination, id)
	WHERE state = 'pending' AND hold = 'intake';
-- The per-key predicate: is an earlier row of this key still unsettled, or
-- dead and holding its key (onDead: holdKey; claim.md)?  A key's order is
-- kept per destination ('': not routed yet, which waits for and holds back
-- every destination), by place: a row's id, a fan-out copy's origin.
CREATE INDEX outbox_key_open_idx ON queuebox.outbox
	(key, (coalesce(destination, '')), (coalesce(origin, id)))
	WHERE (state IN ('pending', 'processing') OR hold = 'dead') AND key IS NOT NULL;
-- Rows parked behind their key, key and destination by key and destination:
-- the sweep reads each one's first parked row (one step each, however many
-- it has parked) and releases it when no earlier row of its key that it
-- waits for is open (claim.md, "The sweep").
CREATE INDEX outbox_parked_idx ON queuebox.outbox
	(key, (coalesce(destination, '')), (coalesce(origin, id)))
	WHERE state = 'pending' AND hold = 'key';
-- Fan-out: a row's copies, for the console and route_of's callers.
CREATE INDEX outbox_origin_idx ON queuebox.outbox (origin) WHERE origin IS NOT NULL;
-- The reclaim step: expired leases.
CREATE INDEX outbox_lease_idx ON queuebox.outbox (lease_until)
	WHERE state = 'processing';
-- Retention walks outbox_pkey (ids follow created_at), so created_at has no
-- index: a BRIN on it (to schema 0.3.6) cost every non-HOT row version 2-3
-- block reads and narrowed nothing once freed space was reused (0.3.7).

-- What operators did to dead outbox rows: a requeue (as is or edited), a skip.
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
	'What operators did to dead outbox rows, by queuebox.requeue_outbox() (one row per requeued row; the payload before and after for an edited one) and queuebox.skip_outbox(id): who and when. Retention does not delete it.';

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
	hold			varchar(20)
		CONSTRAINT inbox_hold_check CHECK (hold IN ('aggregate', 'dead')),
	claimer			bigint,
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
COMMENT ON COLUMN queuebox.inbox.claimer IS
	'While a push row is processing: the relay that claimed it, by its session advisory lock (as outbox.claimer); the next relay claim takes the row over when no session holds that lock. NULL for pull rows: their leases belong to the application.';
COMMENT ON COLUMN queuebox.inbox.hold IS
	'aggregate: a pending row waiting for an earlier open row of its aggregate (released when that row ends); NULL: claimable when due. On a dead push row, dead: it holds its aggregate''s later rows in the relay''s order until queuebox.requeue_inbox() or queuebox.skip_inbox() (its source''s onDead: holdKey).';

-- Pull claims: open rows of a source in created_at order ...
CREATE INDEX inbox_open_idx ON queuebox.inbox (source, created_at, id)
	WHERE state IN ('pending', 'processing');
-- ... and the per-aggregate predicate: an earlier open row of the aggregate?
CREATE INDEX inbox_aggregate_open_idx ON queuebox.inbox (source, aggregate_id, created_at, id)
	WHERE state IN ('pending', 'processing') AND aggregate_id IS NOT NULL;

-- The relay's per-aggregate predicate across every push source; a dead
-- row that holds its aggregate (hold 'dead', onDead: holdKey) counts as open.
CREATE INDEX inbox_push_aggregate_idx ON queuebox.inbox (aggregate_id, created_at, id)
	WHERE (state IN ('pending', 'processing') OR hold = 'dead') AND consumption = 'push'
	  AND aggregate_id IS NOT NULL;

-- The claims read due unparked rows in due order (a head retried a day
-- ahead is not walked), and expired leases from an index of their own.  The
-- order within an aggregate does not come from these indexes: a row is
-- claimed only when no earlier row of its unit is open (the aggregate
-- indexes below), and parking leaves one open head per unit to look at.
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

-- What operators did to dead inbox rows: a requeue (as is or edited), a
-- skip.  Its own table, of outbox_audit's shape: each row names a row of
-- one table by its id, and neither table's readers filter the other's.
CREATE TABLE queuebox.inbox_audit (
	id				bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	inbox_id		bigint NOT NULL,
	action			varchar(20) NOT NULL
		CONSTRAINT inbox_audit_action_check CHECK (action IN ('requeue', 'skip')),
	done_by			text NOT NULL DEFAULT coalesce(nullif(current_setting('queuebox_admin.actor', true), ''), current_user),
	done_at			timestamptz NOT NULL DEFAULT now(),
	payload_before	jsonb,
	payload_after	jsonb
);
CREATE INDEX inbox_audit_inbox_idx ON queuebox.inbox_audit (inbox_id);
COMMENT ON TABLE queuebox.inbox_audit IS
	'What operators did to dead inbox rows, by queuebox.requeue_inbox() (one row per requeued row; the payload before and after for an edited one) and queuebox.skip_inbox(id): who and when.';

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
-- Limits across replicas (issue 39, schema 0.3.8)
-- ---------------------------------------------------------------------------
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
