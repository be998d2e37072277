/*
 * sql/schema/upgrade/0.3.1--0.3.2.sql
 *	  What changes from schema 0.3.1 to 0.3.2 in both PostgreSQL installs:
 *	  the extension's sql/queuebox--0.3.1--0.3.2.sql and the daemon's
 *	  upgrade step are made of this file (docs/design/schema.md).
 *
 * What changes:
 *	- resume_destination() answers true only when the destination was
 *	  holding rows: not closed, or paused until a time still ahead.  It
 *	  answered true for a closed destination with failures counted, or
 *	  with a pause whose time was over, where docs/http-api.md says
 *	  "resumed false: it was closed already".  It still clears both.
 *
 * No row is touched; no lock is held longer than the catalog update.
 */
CREATE OR REPLACE FUNCTION queuebox.resume_destination(name text) RETURNS boolean
	LANGUAGE sql VOLATILE
	AS $$
	WITH o AS (
		SELECT d.destination, d.state <> 'closed' OR coalesce(d.paused_until > now(), false) AS held
		FROM queuebox.destination_state d
		WHERE d.destination = resume_destination.name
		FOR UPDATE),
	u AS (
		UPDATE queuebox.destination_state d
		SET state = 'closed', failures = 0, paused_until = NULL, probe_at = NULL,
			opened_at = NULL, changed_at = CASE WHEN d.state = 'closed' THEN d.changed_at ELSE now() END
		FROM o
		WHERE d.destination = o.destination
		  AND (d.state <> 'closed' OR d.failures > 0 OR d.paused_until IS NOT NULL)
		RETURNING o.held)
	SELECT coalesce(bool_or(u.held), false) FROM u, LATERAL (SELECT queuebox._arm_outbox_wake()) w
$$;

CREATE OR REPLACE FUNCTION queuebox._schema_version() RETURNS text
	LANGUAGE sql IMMUTABLE AS $$ SELECT '0.3.2'::text $$;
