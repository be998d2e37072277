/*
 * sql/schema/upgrade/0.3.4--0.3.5.sql
 *	  What changes from schema 0.3.4 to 0.3.5 in both PostgreSQL installs:
 *	  the extension's build/sql/queuebox--0.3.4--0.3.5.sql and the daemon's
 *	  upgrade step are made of this file (docs/design/schema.md).
 *
 * What changes (issue 27, production fit), one section each below:
 *	- trace context;
 *	- the configuration file;
 *	- least-privilege roles;
 *	- egress rules.
 */

-- ---- trace context ------------------------------------------------------


-- ---- the configuration file ----------------------------------------------


-- ---- least-privilege roles -----------------------------------------------
-- sql/schema/roles.sql ends this step, as it ends every step and the fresh
-- schema: it makes the missing roles, takes EXECUTE from PUBLIC and grants.

-- ---- egress rules ---------------------------------------------------------


-- ---- the version ------------------------------------------------------------

CREATE OR REPLACE FUNCTION queuebox._schema_version() RETURNS text
	LANGUAGE sql IMMUTABLE AS $$ SELECT '0.3.5'::text $$;
