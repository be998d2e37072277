/*
 * queuebox--0.2.0--0.3.0.sql
 *	  Rows are routed when they are inserted, and each destination reads its
 *	  own intake (docs/design/claim.md, "Routed at insert").
 *
 * What changes:
 *	- outbox.hold gains 'intake': a new row routed at insert (destination
 *	  set by the outbox_route trigger), which no claim has met yet.  A
 *	  claim reads a destination's intake only when that destination has
 *	  room, so the rows of a full, slow or open destination cost the others
 *	  nothing, not even a write;
 *	- outbox_dest_intake_idx (destination, id): that place's index;
 *	- the outbox_route trigger (BEFORE INSERT FOR EACH ROW) routes a row by
 *	  its topic with the routes the outbox workers published in shared
 *	  memory; when none are published for this database (no worker running
 *	  yet, a server without the library preloaded), the row stays in the
 *	  unrouted intake and the claim routes it, as in 0.2.0;
 *	- _outbox_claim takes each destination's intake floor.
 *
 * Rows pending at the upgrade keep their place: unrouted rows are routed at
 * their claim, as before.  The index is built while holding the outbox's
 * lock; it covers no row yet, so the build is quick.
 */
\echo Use "ALTER EXTENSION queuebox UPDATE" to load this file. \quit

ALTER TABLE queuebox.outbox DROP CONSTRAINT outbox_hold_check;
ALTER TABLE queuebox.outbox ADD CONSTRAINT outbox_hold_check
	CHECK (hold IN ('key', 'destination', 'ready', 'intake'));

COMMENT ON COLUMN queuebox.outbox.destination IS
	'The destination the row is routed to: at insert (the outbox_route trigger) or at its first claim; NULL until then.';
COMMENT ON COLUMN queuebox.outbox.hold IS
	'Where a pending row waits: intake (new, routed at insert), key (an earlier row of its key is open), destination (its destination is not taking rows), ready (claimable, not yet routed); NULL: new and not routed, or routed and due at scheduled_at.';

-- New rows routed at insert, per destination in id order: a claim reads a
-- destination's rows from its floor, and only when it has room.
CREATE INDEX outbox_dest_intake_idx ON queuebox.outbox (destination, id)
	WHERE state = 'pending' AND hold = 'intake';

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

DROP FUNCTION queuebox._outbox_claim(int, bigint, int, uuid, bigint, text[], int[], text[]);
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

CREATE OR REPLACE FUNCTION queuebox._schema_version() RETURNS text
	LANGUAGE sql IMMUTABLE AS $$ SELECT '0.3.0'::text $$;
