/*
 * sql/schema/upgrade/0.3.6--0.3.7.sql
 *	  What changes from schema 0.3.6 to 0.3.7 in both PostgreSQL installs:
 *	  the extension's build/sql/queuebox--0.3.6--0.3.7.sql and the daemon's
 *	  upgrade step are made of this file (docs/design/schema.md).
 *
 * What changes (issue 37, speed), one section each below.
 */

-- ---- outbox_created_brin dropped -------------------------------------------
-- Every non-HOT version of an outbox row paid 2-3 shared-buffer reads in
-- brininsert (metapage, revmap, range page), and nothing reads the index:
-- retention walks outbox_pkey, the operators' since/until filters are
-- written so no plan of theirs can use it, and once retention runs every
-- block range holds an old row (bench/RESULTS.md, "Issue 37, target 4").
-- No row is touched.  The drop takes an ACCESS EXCLUSIVE lock on
-- queuebox.outbox for a moment; IF EXISTS lets an operator drop it
-- CONCURRENTLY beforehand instead (docs/operations.md).
DROP INDEX IF EXISTS queuebox.outbox_created_brin;

-- ---- the version ------------------------------------------------------------

CREATE OR REPLACE FUNCTION queuebox._schema_version() RETURNS text
	LANGUAGE sql IMMUTABLE AS $$ SELECT '0.3.7'::text $$;
