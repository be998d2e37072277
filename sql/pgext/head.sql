/*
 * queuebox--<version>.sql: the extension's install script, made by the
 * Makefile from sql/pgext/head.sql, sql/schema/tables.sql,
 * sql/pgext/host.sql and sql/schema/functions.sql (docs/design/schema.md).
 * Edit those files, not this one.  An upgrade runs the
 * queuebox--<old>--<new>.sql scripts instead.
 */
\echo Use "CREATE EXTENSION queuebox" to load this file. \quit

-- The daemon (queuebox-mssqld) keeps its own copy of the schema and records
-- it in queuebox.schema_version: one database is served by one of the two.
DO $$
BEGIN
	IF to_regclass('queuebox.schema_version') IS NOT NULL THEN
		RAISE EXCEPTION 'schema "queuebox" is managed by queuebox-mssqld in this database'
			USING DETAIL = 'The daemon created the QueueBox tables here and serves them; the extension''s workers would claim the same rows.',
				  HINT = 'Use one of the two per database: stop the daemon and drop its schema (DROP SCHEMA queuebox CASCADE, after delivering its rows), or keep the daemon and do not create the extension.';
	END IF;
END
$$;

