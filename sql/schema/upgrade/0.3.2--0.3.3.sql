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
 *
 * CREATE INDEX reads the outbox once and blocks writes to it while it
 * runs (parked rows are few; the scan is the cost): upgrade when the
 * outbox is quiet, or create the index CONCURRENTLY by hand first (the
 * script then finds it and skips it).
 */
CREATE INDEX IF NOT EXISTS outbox_parked_idx ON queuebox.outbox (key, id)
	WHERE state = 'pending' AND hold = 'key';

CREATE OR REPLACE FUNCTION queuebox._schema_version() RETURNS text
	LANGUAGE sql IMMUTABLE AS $$ SELECT '0.3.3'::text $$;
