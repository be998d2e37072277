/*
 * sql/sqlserver/tables.sql
 *	  The tables and indexes of QueueBox on SQL Server, as of the current
 *	  schema version: the same columns, states and places as the PostgreSQL
 *	  schema (sql/schema/tables.sql), in T-SQL.
 *
 * queuebox-mssqld runs this file, then sql/sqlserver/topics.sql,
 * sql/sqlserver/engine.sql and sql/sqlserver/operations.sql, one batch at a
 * time (a line holding only GO ends a batch), in one transaction under its
 * migration lock (sp_getapplock, docs/sqlserver.md).  Every value the daemon
 * sends is a bound parameter; the only text sent as it is, is this DDL.
 *
 * Types: ids BIGINT IDENTITY, tokens UNIQUEIDENTIFIER, states NVARCHAR(50)
 * with CHECK constraints naming the spec's states, JSON in NVARCHAR(MAX)
 * checked with ISJSON, times DATETIME2 in UTC.  A payload may be any JSON
 * value, as on PostgreSQL: ISJSON of SQL Server 2019 accepts only an object
 * or an array, so the check reads the payload inside brackets.  Indexed text has a length (an
 * index key holds at most 1,700 bytes): topics and keys 400 characters,
 * sources and destinations 200, idempotency keys 400.  Names, keys and
 * topics compare as PostgreSQL's text does, code point by code point
 * (Latin1_General_100_BIN2, whatever the database's collation): "Evt-1" and
 * "evt-1" are two idempotency keys, two ordering keys, two topics.
 */

CREATE SCHEMA queuebox;
GO
-- Who did an operator's action (outbox_audit.done_by): what the admin route
-- put in SESSION_CONTEXT (its peer, "admin route from 127.0.0.1"), else the
-- login.  A function, not the expression, as the column's default: Babelfish
-- cannot read that expression back from sys.default_constraints.
CREATE FUNCTION queuebox._actor() RETURNS NVARCHAR(200)
AS
BEGIN
	RETURN COALESCE(CAST(SESSION_CONTEXT(N'queuebox.actor') AS NVARCHAR(200)), SUSER_SNAME());
END
GO

-- The versions applied, one row per migration: the newest is the schema's.
CREATE TABLE queuebox.schema_version (
	version		NVARCHAR(50) NOT NULL CONSTRAINT schema_version_pkey PRIMARY KEY,
	applied_at	DATETIME2(6) NOT NULL CONSTRAINT schema_version_applied_at_default DEFAULT SYSUTCDATETIME(),
	applied_by	NVARCHAR(128) NOT NULL CONSTRAINT schema_version_applied_by_default DEFAULT SUSER_SNAME()
);

-- What the procedures that follow the configuration read (routes, names):
-- the daemon writes them at every load of its file.  A route with several
-- destinations (fan-out) has fanout = 1 and its names joined by ", " in
-- destination (what route_of() shows): hence 4000 characters, not 200.
CREATE TABLE queuebox.config_route (
	position	INT NOT NULL CONSTRAINT config_route_pkey PRIMARY KEY,
	pattern		NVARCHAR(400) COLLATE Latin1_General_100_BIN2 NOT NULL,
	destination	NVARCHAR(4000) COLLATE Latin1_General_100_BIN2 NOT NULL,
	fanout		BIT NOT NULL CONSTRAINT config_route_fanout_default DEFAULT 0
);
CREATE TABLE queuebox.config_destination (
	name		NVARCHAR(200) COLLATE Latin1_General_100_BIN2 NOT NULL CONSTRAINT config_destination_pkey PRIMARY KEY
);

-- ---------------------------------------------------------------------------
-- The outbox
-- ---------------------------------------------------------------------------
CREATE TABLE queuebox.outbox (
	id				BIGINT IDENTITY(1, 1) NOT NULL CONSTRAINT outbox_pkey PRIMARY KEY,
	message_id		UNIQUEIDENTIFIER NOT NULL CONSTRAINT outbox_message_id_default DEFAULT NEWID(),
	topic			NVARCHAR(400) COLLATE Latin1_General_100_BIN2 NOT NULL CONSTRAINT outbox_topic_check CHECK (topic <> N''),
	[key]			NVARCHAR(400) COLLATE Latin1_General_100_BIN2 NULL,
	payload			NVARCHAR(MAX) NOT NULL CONSTRAINT outbox_payload_check CHECK (ISJSON(N'[' + payload + N']') = 1),
	headers			NVARCHAR(MAX) NOT NULL CONSTRAINT outbox_headers_default DEFAULT N'{}'
		CONSTRAINT outbox_headers_check CHECK (ISJSON(headers) = 1 AND LEFT(LTRIM(headers), 1) = N'{'),
	state			NVARCHAR(50) NOT NULL CONSTRAINT outbox_state_default DEFAULT N'pending'
		CONSTRAINT outbox_state_check CHECK (state IN (N'pending', N'processing', N'sent', N'dead')),
	attempt			INT NOT NULL CONSTRAINT outbox_attempt_default DEFAULT 0
		CONSTRAINT outbox_attempt_check CHECK (attempt >= 0),
	max_attempts	INT NULL CONSTRAINT outbox_max_attempts_check CHECK (max_attempts IS NULL OR max_attempts >= 1),
	scheduled_at	DATETIME2(6) NOT NULL CONSTRAINT outbox_scheduled_at_default DEFAULT SYSUTCDATETIME(),
	created_at		DATETIME2(6) NOT NULL CONSTRAINT outbox_created_at_default DEFAULT SYSUTCDATETIME(),
	claim_token		UNIQUEIDENTIFIER NULL,
	lease_until		DATETIME2(6) NULL,
	last_error		NVARCHAR(MAX) NULL,
	destination		NVARCHAR(200) COLLATE Latin1_General_100_BIN2 NULL,
	hold			NVARCHAR(20) NULL
		CONSTRAINT outbox_hold_check CHECK (hold IN (N'key', N'destination', N'ready', N'intake', N'dead')),
	-- while processing: the claimer whose session applock shows it alive (engine.sql _claimer_gone)
	claimer			BIGINT NULL,
	-- fan-out (a route with several destinations): on a copy, the id of the
	-- row it was copied from; on that row, its own id; NULL on every other row
	origin			BIGINT NULL,
	-- a row's place in its key's order: its id, a copy's origin (a copy
	-- takes the place of the row it was copied from); computed, not stored:
	-- the key indexes hold it
	place			AS ISNULL(origin, id)
);

-- One filtered index per place a pending row can wait in, as on PostgreSQL
-- (docs/design/claim.md): a claim reads only the places that can give it a
-- row now, and sent and dead rows are in no filtered index.  Rows are not
-- routed at insert here (no trigger), so hold 'intake' stays unused.
CREATE INDEX outbox_intake_idx ON queuebox.outbox (id)
	WHERE state = N'pending' AND destination IS NULL AND hold IS NULL;
CREATE INDEX outbox_ready_idx ON queuebox.outbox (scheduled_at, id)
	WHERE state = N'pending' AND hold = N'ready';
CREATE INDEX outbox_routed_idx ON queuebox.outbox (destination, scheduled_at, id)
	WHERE state = N'pending' AND hold IS NULL AND destination IS NOT NULL;
CREATE INDEX outbox_held_idx ON queuebox.outbox (destination, id)
	WHERE state = N'pending' AND hold = N'destination';
-- The per-key predicate (docs/design/claim.md): is an earlier row of this
-- key open?  A key's order is kept per destination (NULL: not routed yet,
-- which waits for and holds back every destination), by place, so the
-- probes seek (key, destination, place).
CREATE INDEX outbox_key_open_idx ON queuebox.outbox ([key], destination, place)
	WHERE state IN (N'pending', N'processing') AND [key] IS NOT NULL;
-- Dead rows that hold their key (onDead: holdKey): open for their key's
-- order too.  A filtered index takes no OR, so the probes seek both.
CREATE INDEX outbox_key_dead_idx ON queuebox.outbox ([key], destination, place)
	WHERE hold = N'dead';
-- Rows parked behind their key, key and destination by key and
-- destination: the sweep (_outbox_sweep).
CREATE INDEX outbox_parked_idx ON queuebox.outbox ([key], destination, place)
	WHERE state = N'pending' AND hold = N'key';
-- Fan-out: a message's deliveries (outbox_row).
CREATE INDEX outbox_origin_idx ON queuebox.outbox (origin)
	WHERE origin IS NOT NULL;
CREATE INDEX outbox_lease_idx ON queuebox.outbox (lease_until)
	WHERE state = N'processing';
-- The gauges count the open states, operators read the dead rows.
CREATE INDEX outbox_open_state_idx ON queuebox.outbox (state, created_at)
	WHERE state IN (N'pending', N'processing');
CREATE INDEX outbox_dead_idx ON queuebox.outbox (id)
	WHERE state = N'dead';
-- Retention reads sent rows by creation time.
CREATE INDEX outbox_sent_idx ON queuebox.outbox (created_at)
	WHERE state = N'sent';

-- What operators did to dead outbox rows: an edited requeue, a skip.
CREATE TABLE queuebox.outbox_audit (
	id				BIGINT IDENTITY(1, 1) NOT NULL CONSTRAINT outbox_audit_pkey PRIMARY KEY,
	outbox_id		BIGINT NOT NULL,
	action			NVARCHAR(20) NOT NULL CONSTRAINT outbox_audit_action_check CHECK (action IN (N'requeue', N'skip')),
	done_by			NVARCHAR(200) NOT NULL CONSTRAINT outbox_audit_done_by_default DEFAULT queuebox._actor(),
	done_at			DATETIME2(6) NOT NULL CONSTRAINT outbox_audit_done_at_default DEFAULT SYSUTCDATETIME(),
	payload_before	NVARCHAR(MAX) NULL,
	payload_after	NVARCHAR(MAX) NULL
);
CREATE INDEX outbox_audit_outbox_idx ON queuebox.outbox_audit (outbox_id);

-- ---------------------------------------------------------------------------
-- Destinations: the circuit breaker every worker and replica shares
-- ---------------------------------------------------------------------------
CREATE TABLE queuebox.destination_state (
	destination		NVARCHAR(200) COLLATE Latin1_General_100_BIN2 NOT NULL CONSTRAINT destination_state_pkey PRIMARY KEY,
	state			NVARCHAR(20) NOT NULL CONSTRAINT destination_state_state_default DEFAULT N'closed'
		CONSTRAINT destination_state_check
		CHECK (state IN (N'closed', N'open', N'half-open', N'disabled')),
	failures		INT NOT NULL CONSTRAINT destination_state_failures_default DEFAULT 0
		CONSTRAINT destination_state_failures_check CHECK (failures >= 0),
	opened_at		DATETIME2(6) NULL,
	probe_at		DATETIME2(6) NULL,
	paused_until	DATETIME2(6) NULL,
	last_error		NVARCHAR(MAX) NULL,
	changed_at		DATETIME2(6) NOT NULL CONSTRAINT destination_state_changed_at_default DEFAULT SYSUTCDATETIME()
);

-- ---------------------------------------------------------------------------
-- Takeover on an engine where a claimer's applock cannot be tested
-- (Babelfish: engine.sql _claimer_gone): each claimer writes here how long
-- it is alive, at least once a second while it runs; a claimer with no
-- row, or one whose alive_until has passed, is gone.  SQL Server tests the
-- applock and never reads this table.
-- ---------------------------------------------------------------------------
CREATE TABLE queuebox.claimer_beat (
	claimer			BIGINT NOT NULL CONSTRAINT claimer_beat_pkey PRIMARY KEY,
	alive_until		DATETIME2(6) NOT NULL
);

-- ---------------------------------------------------------------------------
-- Limits across replicas (issue 39, schema 0.3.8)
-- ---------------------------------------------------------------------------
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

-- ---------------------------------------------------------------------------
-- The inbox
-- ---------------------------------------------------------------------------
CREATE TABLE queuebox.inbox (
	id				BIGINT IDENTITY(1, 1) NOT NULL CONSTRAINT inbox_pkey PRIMARY KEY,
	source			NVARCHAR(200) COLLATE Latin1_General_100_BIN2 NOT NULL CONSTRAINT inbox_source_check CHECK (source <> N''),
	idempotency_key	NVARCHAR(400) COLLATE Latin1_General_100_BIN2 NOT NULL CONSTRAINT inbox_idempotency_key_check CHECK (idempotency_key <> N''),
	event_type		NVARCHAR(400) COLLATE Latin1_General_100_BIN2 NULL,
	aggregate_id	NVARCHAR(400) COLLATE Latin1_General_100_BIN2 NULL,
	payload			NVARCHAR(MAX) NOT NULL CONSTRAINT inbox_payload_check CHECK (ISJSON(N'[' + payload + N']') = 1),
	headers			NVARCHAR(MAX) NOT NULL CONSTRAINT inbox_headers_default DEFAULT N'{}'
		CONSTRAINT inbox_headers_check CHECK (ISJSON(headers) = 1 AND LEFT(LTRIM(headers), 1) = N'{'),
	consumption		NVARCHAR(10) NOT NULL CONSTRAINT inbox_consumption_default DEFAULT N'push'
		CONSTRAINT inbox_consumption_check CHECK (consumption IN (N'push', N'pull')),
	state			NVARCHAR(50) NOT NULL CONSTRAINT inbox_state_default DEFAULT N'pending'
		CONSTRAINT inbox_state_check CHECK (state IN (N'pending', N'processing', N'processed', N'dead')),
	attempt			INT NOT NULL CONSTRAINT inbox_attempt_default DEFAULT 0
		CONSTRAINT inbox_attempt_check CHECK (attempt >= 0),
	scheduled_at	DATETIME2(6) NOT NULL CONSTRAINT inbox_scheduled_at_default DEFAULT SYSUTCDATETIME(),
	created_at		DATETIME2(6) NOT NULL CONSTRAINT inbox_created_at_default DEFAULT SYSUTCDATETIME(),
	claim_token		UNIQUEIDENTIFIER NULL,
	lease_until		DATETIME2(6) NULL,
	last_error		NVARCHAR(MAX) NULL,
	hold			NVARCHAR(20) NULL CONSTRAINT inbox_hold_check CHECK (hold IN (N'aggregate', N'dead')),
	claimer			BIGINT NULL
);
-- Stored once per (source, idempotency key): a second insert answers 2601
-- (2627 on some engines), which the daemon counts as a duplicate.
CREATE UNIQUE INDEX inbox_source_idempotency_key ON queuebox.inbox (source, idempotency_key);

CREATE INDEX inbox_aggregate_open_idx ON queuebox.inbox (source, aggregate_id, created_at, id)
	WHERE state IN (N'pending', N'processing') AND aggregate_id IS NOT NULL;
CREATE INDEX inbox_push_aggregate_idx ON queuebox.inbox (aggregate_id, created_at, id)
	WHERE state IN (N'pending', N'processing') AND consumption = N'push' AND aggregate_id IS NOT NULL;
-- a dead push row that holds its aggregate (a source's onDead: holdKey):
-- open for it too; a filtered index takes no OR, so the relay's probes seek
-- this one beside inbox_push_aggregate_idx
CREATE INDEX inbox_push_dead_idx ON queuebox.inbox (aggregate_id, created_at, id)
	WHERE hold = N'dead';
CREATE INDEX inbox_pull_due_idx ON queuebox.inbox (source, scheduled_at, created_at, id)
	WHERE state = N'pending' AND consumption = N'pull' AND hold IS NULL;
CREATE INDEX inbox_pull_lease_idx ON queuebox.inbox (source, lease_until)
	WHERE state = N'processing' AND consumption = N'pull';
CREATE INDEX inbox_push_due_idx ON queuebox.inbox (scheduled_at, created_at, id)
	WHERE state = N'pending' AND consumption = N'push' AND hold IS NULL;
CREATE INDEX inbox_push_lease_idx ON queuebox.inbox (lease_until)
	WHERE state = N'processing' AND consumption = N'push';
CREATE INDEX inbox_open_idx ON queuebox.inbox (source, created_at, id)
	WHERE state IN (N'pending', N'processing');
CREATE INDEX inbox_open_state_idx ON queuebox.inbox (state, created_at)
	WHERE state IN (N'pending', N'processing');
CREATE INDEX inbox_dead_idx ON queuebox.inbox (id)
	WHERE state = N'dead';

-- What operators did to dead inbox rows: a requeue (as is or edited), a
-- skip (outbox_audit's shape; sql/schema/tables.sql says why its own table).
CREATE TABLE queuebox.inbox_audit (
	id				BIGINT IDENTITY(1, 1) NOT NULL CONSTRAINT inbox_audit_pkey PRIMARY KEY,
	inbox_id		BIGINT NOT NULL,
	action			NVARCHAR(20) NOT NULL CONSTRAINT inbox_audit_action_check CHECK (action IN (N'requeue', N'skip')),
	done_by			NVARCHAR(200) NOT NULL CONSTRAINT inbox_audit_done_by_default DEFAULT queuebox._actor(),
	done_at			DATETIME2(6) NOT NULL CONSTRAINT inbox_audit_done_at_default DEFAULT SYSUTCDATETIME(),
	payload_before	NVARCHAR(MAX) NULL,
	payload_after	NVARCHAR(MAX) NULL
);
CREATE INDEX inbox_audit_inbox_idx ON queuebox.inbox_audit (inbox_id);
GO
-- Operations: the console's reads (issue 25): dead rows by each exact
-- filter of dead_outbox / dead_inbox (outbox_dead_idx and inbox_dead_idx
-- serve the unfiltered walk); only a row going dead writes an entry.
CREATE INDEX outbox_dead_destination_idx ON queuebox.outbox (destination, id) WHERE state = N'dead';
CREATE INDEX outbox_dead_topic_idx ON queuebox.outbox (topic, id) WHERE state = N'dead';
CREATE INDEX outbox_dead_key_idx ON queuebox.outbox ([key], id) WHERE state = N'dead';
CREATE INDEX inbox_dead_source_idx ON queuebox.inbox (source, id) WHERE state = N'dead';
GO

-- ---------------------------------------------------------------------------
-- The outbox's trace context (docs/observability.md, "Trace context"): a
-- row takes its session's, as PostgreSQL's SET LOCAL queuebox.traceparent
-- does there
-- ---------------------------------------------------------------------------
/*
 * _trace_error: why a session's trace context cannot be carried, or NULL
 * when it can: @tp must be a traceparent qb_trace_parse accepts (2 lower-case
 * hex, not ff, then 32, 16 and 2 lower-case hex joined by '-', ids not all
 * zero; version 00 exactly 55 characters, a later one may add "-..."), @ts
 * (NULL: none) at most 512 printable ASCII characters without '"' or '\'.
 * The lengths are LEN(@x + N'x') - 1: LEN does not count trailing blanks,
 * and DATALENGTH counts bytes, two a character on SQL Server, one on
 * Babelfish.
 */
CREATE FUNCTION queuebox._trace_error(@tp NVARCHAR(4000), @ts NVARCHAR(4000)) RETURNS NVARCHAR(2000)
AS
BEGIN
	DECLARE @n INT = LEN(@tp + N'x') - 1;

	IF NOT (@n >= 55
			AND @tp COLLATE Latin1_General_100_BIN2 LIKE N'[0-9a-f][0-9a-f]-' + REPLICATE(N'[0-9a-f]', 32) + N'-'
				+ REPLICATE(N'[0-9a-f]', 16) + N'-[0-9a-f][0-9a-f]%'
			AND LEFT(@tp, 2) <> N'ff'
			AND (@n = 55 OR (LEFT(@tp, 2) <> N'00' AND SUBSTRING(@tp, 56, 1) = N'-'))
			AND SUBSTRING(@tp, 4, 32) <> REPLICATE(N'0', 32)
			AND SUBSTRING(@tp, 37, 16) <> REPLICATE(N'0', 16))
		RETURN CONCAT(N'queuebox: SESSION_CONTEXT(N''queuebox.traceparent'') is not a valid traceparent: "',
					  LEFT(@tp, 80), N'". A traceparent is 00-<trace-id: 32 hex>-<parent-id: 16 hex>-<flags: 2 hex>,',
					  N' lower case, ids not all zero: set what your tracer''s propagator writes, e.g.',
					  N' 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01 (sp_set_session_context).');
	IF @ts IS NOT NULL AND (LEN(@ts + N'x') - 1 > 512 OR @ts COLLATE Latin1_General_100_BIN2 LIKE N'%[^ -~]%'
						   OR @ts LIKE N'%["\]%')
		RETURN N'queuebox: SESSION_CONTEXT(N''queuebox.tracestate'') is not a valid tracestate. A tracestate is at'
			+ N' most 512 printable ASCII characters, without ''"'' or ''\'', e.g. congo=t61rcWkgMzE.';
	RETURN NULL;
END
GO

/*
 * outbox_trace: the rows an INSERT writes take the trace context of its
 * session, sp_set_session_context N'queuebox.traceparent' (and
 * N'queuebox.tracestate'), into their headers, unless a row carries its own
 * traceparent header (in any letter case: that is the one delivered).  A
 * context that is not valid refuses the insert, and XACT_ABORT or not the
 * error ends the statement's transaction (THROW in a trigger aborts the
 * batch): the business write goes with it.  A session without a context
 * costs one SESSION_CONTEXT read per statement.  An AFTER trigger: the
 * rows keep their SCOPE_IDENTITY(); an INSERT with OUTPUT needs INTO on
 * SQL Server (Msg 334), docs/sqlserver.md says so.  A writer that may
 * only INSERT has its rows updated here: by ownership chaining on SQL
 * Server; Babelfish checks only the call of _trace_error, which roles.sql
 * grants queuebox_writer.
 */
CREATE TRIGGER queuebox.outbox_trace ON queuebox.outbox AFTER INSERT
AS
BEGIN
	SET NOCOUNT ON;
	DECLARE @tp NVARCHAR(4000) = NULLIF(CAST(SESSION_CONTEXT(N'queuebox.traceparent') AS NVARCHAR(4000)), N'');
	DECLARE @ts NVARCHAR(4000), @error NVARCHAR(2000);

	IF @tp IS NULL OR NOT EXISTS (SELECT 1 FROM inserted)
		RETURN;
	SET @ts = NULLIF(CAST(SESSION_CONTEXT(N'queuebox.tracestate') AS NVARCHAR(4000)), N'');
	SET @error = queuebox._trace_error(@tp, @ts);
	IF @error IS NOT NULL
		THROW 50022, @error, 1;
	-- a later version's traceparent is delivered as version 00 of its first
	-- 55 characters, as the PostgreSQL triggers store it
	SET @tp = N'00' + SUBSTRING(@tp, 3, 53);
	UPDATE o
	SET headers = CASE WHEN @ts IS NULL THEN JSON_MODIFY(o.headers, '$.traceparent', @tp)
					   ELSE JSON_MODIFY(JSON_MODIFY(o.headers, '$.traceparent', @tp), '$.tracestate', @ts) END
	FROM queuebox.outbox o JOIN inserted i ON i.id = o.id
	WHERE NOT EXISTS (SELECT 1 FROM OPENJSON(o.headers) h WHERE LOWER(h.[key]) = N'traceparent');
END
GO
