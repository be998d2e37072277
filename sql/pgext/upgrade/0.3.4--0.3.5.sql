/*
 * sql/pgext/upgrade/0.3.4--0.3.5.sql
 *	  What the extension alone changes from 0.3.4 to 0.3.5, after the shared
 *	  step (sql/schema/upgrade/0.3.4--0.3.5.sql): the Makefile appends it to
 *	  build/sql/queuebox--0.3.4--0.3.5.sql, before the roles' grants.
 *
 *	- config_source(): where the configuration in force came from
 *	  (queuebox.config_file or configure()), as sql/pgext/host.sql makes it.
 *	- _relay_claim returns each row's traceparent too (the relay's forward
 *	  span is its child), as the statement it runs does.
 */
/*
 * config_source: where the configuration in force came from (the file
 * queuebox.config_file names, or the table configure() writes), when the
 * workers loaded it, its SHA-256, and the last load that failed.
 */
CREATE FUNCTION queuebox.config_source(
	OUT source text, OUT path text, OUT loaded_at timestamptz, OUT sha256 text,
	OUT last_error text, OUT last_error_at timestamptz)
	AS 'MODULE_PATHNAME', 'qb_sql_config_source'
	LANGUAGE C VOLATILE;
COMMENT ON FUNCTION queuebox.config_source() IS
	'Where the configuration in force came from (file, table or none), when the workers loaded it, its SHA-256, and the last failed load.';

DROP FUNCTION queuebox._relay_claim(int, bigint, uuid);
CREATE FUNCTION queuebox._relay_claim(batch_size int, lease_ms bigint, token uuid)
	RETURNS TABLE (id bigint, source text, event_type text, created_at timestamptz, traceparent text)
	AS 'MODULE_PATHNAME', 'qb_sql_relay_claim'
	LANGUAGE C VOLATILE;
