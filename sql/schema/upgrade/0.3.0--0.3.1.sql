/*
 * sql/schema/upgrade/0.3.0--0.3.1.sql
 *	  What changes from schema 0.3.0 to 0.3.1 in both PostgreSQL installs:
 *	  the extension's build/sql/queuebox--0.3.0--0.3.1.sql and the daemon's
 *	  upgrade step are made of this file (docs/design/schema.md).
 *
 * What changes:
 *	- inbox_claim() runs with jit off.  The planner cannot size the LIMIT of
 *	  its due candidates (an expression of a subquery), guesses a tenth of
 *	  the source, and past jit_above_cost every claim compiled itself: about
 *	  25 ms of a call whose statement runs in well under a millisecond, so
 *	  one source could not pass ~35 claims/s (bench/pull).
 *
 * No row is touched; no lock is held longer than the catalog update.
 */
ALTER FUNCTION queuebox.inbox_claim(text, int, int) SET jit = off;

CREATE OR REPLACE FUNCTION queuebox._schema_version() RETURNS text
	LANGUAGE sql IMMUTABLE AS $$ SELECT '0.3.1'::text $$;
