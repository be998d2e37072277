/*
 * sql/schema/upgrade/0.3.7--0.3.8.sql
 *	  What changes from schema 0.3.7 to 0.3.8 in both PostgreSQL installs:
 *	  the extension's build/sql/queuebox--0.3.7--0.3.8.sql and the daemon's
 *	  upgrade step are made of this file (docs/design/schema.md).
 *
 * What changes (issue 39; what the features add follows), one section each
 * below: so far the version only.
 */

-- ---- the version ------------------------------------------------------------

CREATE OR REPLACE FUNCTION queuebox._schema_version() RETURNS text
	LANGUAGE sql IMMUTABLE AS $$ SELECT '0.3.8'::text $$;
