/*
 * sql/daemon/head.sql
 *	  The start of the daemon's PostgreSQL schema: what the extension has
 *	  from CREATE EXTENSION (the schema) and what only the daemon keeps.
 *
 * queuebox-mssqld puts its schema together from this file,
 * sql/schema/tables.sql, sql/daemon/host.sql and
 * sql/schema/functions.sql (the Makefile embeds them; docs/design/schema.md)
 * and runs it in one transaction under its migration lock.
 */
CREATE SCHEMA IF NOT EXISTS queuebox;

-- The versions applied, one row per migration: the newest is the schema's.
CREATE TABLE queuebox.schema_version (
	version		text PRIMARY KEY,
	applied_at	timestamptz NOT NULL DEFAULT now(),
	applied_by	name NOT NULL DEFAULT current_user
);
COMMENT ON TABLE queuebox.schema_version IS
	'The QueueBox schema versions queuebox-mssqld applied here; the extension refuses to install over it.';

-- What the SQL functions that follow the configuration read (route_of,
-- destination_status): the daemon writes them at every load of its file.
CREATE TABLE queuebox.config_route (
	position	int PRIMARY KEY,
	pattern		text NOT NULL,
	destination	text NOT NULL,
	fanout		boolean NOT NULL DEFAULT false
);
COMMENT ON TABLE queuebox.config_route IS
	'The routes of the configuration file queuebox-mssqld runs, in order (the first match wins). Written by the daemon; do not edit.';
CREATE TABLE queuebox.config_destination (
	name		text PRIMARY KEY
);
COMMENT ON TABLE queuebox.config_destination IS
	'The destinations of the configuration file queuebox-mssqld runs. Written by the daemon; do not edit.';
