/*
 * sql/pgext/upgrade/0.3.3--0.3.4.sql
 *	  What the extension alone changes from 0.3.3 to 0.3.4, after the shared
 *	  step (sql/schema/upgrade/0.3.3--0.3.4.sql): the Makefile appends it to
 *	  build/sql/queuebox--0.3.3--0.3.4.sql.
 *
 *	- pg_dump keeps the audit tables' rows, as it keeps the outbox's
 *	  (sql/pgext/host.sql).
 *	- _relay_forward takes holds (onDead: holdKey of each row's source), as
 *	  the relay's forward statement does.
 */
SELECT pg_catalog.pg_extension_config_dump('queuebox.outbox_audit', '');
SELECT pg_catalog.pg_extension_config_dump('queuebox.outbox_audit_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('queuebox.inbox_audit', '');
SELECT pg_catalog.pg_extension_config_dump('queuebox.inbox_audit_id_seq', '');

DROP FUNCTION queuebox._relay_forward(uuid, bigint[], text[], int);
CREATE FUNCTION queuebox._relay_forward(token uuid, ids bigint[], topics text[], max_attempts int,
										holds boolean[] DEFAULT NULL)
	RETURNS bigint
	AS 'MODULE_PATHNAME', 'qb_sql_relay_forward'
	LANGUAGE C VOLATILE;
