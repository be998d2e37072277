/*
 * sql/schema/upgrade/0.3.5--0.3.6.sql
 *	  What changes from schema 0.3.5 to 0.3.6 in both PostgreSQL installs:
 *	  the extension's build/sql/queuebox--0.3.5--0.3.6.sql and the daemon's
 *	  upgrade step are made of this file (docs/design/schema.md).
 *
 * What changes (issue 38, chaos with a checker), one section each below.
 */

-- ---- the version ------------------------------------------------------------

CREATE OR REPLACE FUNCTION queuebox._schema_version() RETURNS text
	LANGUAGE sql IMMUTABLE AS $$ SELECT '0.3.6'::text $$;
