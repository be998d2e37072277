/*
 * sql/schema/upgrade/0.3.2--0.3.3.sql
 *	  What changes from schema 0.3.2 to 0.3.3 in both PostgreSQL installs:
 *	  the extension's build/sql/queuebox--0.3.2--0.3.3.sql and the daemon's
 *	  upgrade step are made of this file (docs/design/schema.md).
 *
 * What changes:
 *	- outbox_parked_idx: the rows parked behind their key, by (key, id).
 *	  The outbox engine's sweep walks it key by key and releases a key's
 *	  first parked row when no earlier row of the key is open: a row whose
 *	  promotion was missed (an operator who ended a row by UPDATE, or an
 *	  engine that ignores the share lock a park is made under) no longer
 *	  waits forever (docs/design/claim.md, "The sweep").  The sweep's
 *	  statement lives in the engines (src/common/store/qb_sql_pg.h), so the
 *	  index is all the schema needs.
 *	- outbox.claimer and inbox.claimer: takeover after a crash
 *	  (docs/operations.md, "After a crash"), below.
 *
 * CREATE INDEX reads the outbox once and blocks writes to it while it
 * runs (parked rows are few; the scan is the cost): upgrade when the
 * outbox is quiet, or create the index CONCURRENTLY by hand first (the
 * script then finds it and skips it).
 */
CREATE INDEX IF NOT EXISTS outbox_parked_idx ON queuebox.outbox (key, id)
	WHERE state = 'pending' AND hold = 'key';

/*
 * Takeover after a crash (docs/operations.md, "After a crash"):
 *	- outbox.claimer and inbox.claimer: the claimer of a processing row, an
 *	  id whose session advisory lock the claiming worker holds while it
 *	  runs.  When no session holds that lock the worker is gone, and the
 *	  reclaim step (the relay's claim for push rows) takes the row over at
 *	  once instead of waiting for its lease.  Rows claimed before the
 *	  upgrade have none: their leases end them, as before.
 *
 * ADD COLUMN without a default changes the catalog only: no row is
 * rewritten, the ACCESS EXCLUSIVE lock is held for the catalog update.
 */
ALTER TABLE queuebox.outbox ADD COLUMN claimer bigint;
ALTER TABLE queuebox.inbox ADD COLUMN claimer bigint;
COMMENT ON COLUMN queuebox.outbox.claimer IS
	'While processing: the worker that claimed the row, by the session advisory lock it holds while it runs (pg_locks, objsubid 1); when no session holds that lock the reclaim step takes the row over at once. NULL: taken over only when its lease expires (takeover off, or a pooled daemon connection).';
COMMENT ON COLUMN queuebox.inbox.claimer IS
	'While a push row is processing: the relay that claimed it, by its session advisory lock (as outbox.claimer); the next relay claim takes the row over when no session holds that lock. NULL for pull rows: their leases belong to the application.';

CREATE OR REPLACE FUNCTION queuebox._schema_version() RETURNS text
	LANGUAGE sql IMMUTABLE AS $$ SELECT '0.3.3'::text $$;
