/*
 * sql/schema/upgrade/0.3.1--0.3.2.sql
 *	  What changes from schema 0.3.1 to 0.3.2 in both PostgreSQL installs:
 *	  the extension's build/sql/queuebox--0.3.1--0.3.2.sql and the daemon's
 *	  upgrade step are made of this file (docs/design/schema.md).
 *
 * What changes:
 *	- resume_destination() answers true only when the destination was
 *	  holding rows: not closed, or paused until a time still ahead.  It
 *	  answered true for a closed destination with failures counted, or
 *	  with a pause whose time was over, where docs/http-api.md says
 *	  "resumed false: it was closed already".  It still clears both.
 *	- outbox_stats names its per-state totals: destination '(all)' instead
 *	  of NULL (listed first, as the NULLs were; no destination name can be
 *	  '(all)').  Same columns, same types: CREATE OR REPLACE VIEW keeps the
 *	  grants on it.  A query that picked the totals with "destination IS
 *	  NULL" now writes "destination = '(all)'" (docs/operations.md).
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

CREATE OR REPLACE VIEW queuebox.outbox_stats AS
	WITH per_topic AS (
		SELECT topic, destination, state, count(*) AS n,
			   min(created_at) FILTER (WHERE state = 'pending') AS oldest_pending
		FROM queuebox.outbox
		GROUP BY topic, destination, state
	), routed AS (
		SELECT coalesce(destination, queuebox.route_of(topic), '(no route)') AS destination,
			   state, n, oldest_pending
		FROM per_topic
	)
	SELECT CASE WHEN GROUPING(r.destination) = 1 THEN '(all)' ELSE r.destination END AS destination,
		   r.state, sum(r.n)::bigint AS rows,
		   now() - min(r.oldest_pending) AS oldest_pending_age,
		   CASE WHEN GROUPING(r.destination) = 1 THEN NULL
				WHEN r.destination = '(no route)' THEN NULL
				ELSE coalesce(min(d.state), 'closed') END::text AS circuit
	FROM routed r LEFT JOIN queuebox.destination_state d ON d.destination = r.destination
	GROUP BY GROUPING SETS ((r.destination, r.state), (r.state))
	ORDER BY GROUPING(r.destination) DESC, r.destination, r.state;
COMMENT ON VIEW queuebox.outbox_stats IS
	'Rows per state and per destination (destination ''(all)'': all destinations), with the age of the oldest pending row and the destination''s circuit.';

CREATE OR REPLACE FUNCTION queuebox._schema_version() RETURNS text
	LANGUAGE sql IMMUTABLE AS $$ SELECT '0.3.2'::text $$;
