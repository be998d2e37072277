/*
 * sql/schema/upgrade/PENDING-metrics.sql  (branch i21-metrics, issue 21 friction 8)
 *	  NOT an upgrade step yet: the lead folds it into the next version's
 *	  sql/schema/upgrade/<old>--<new>.sql (with that step's _schema_version()).
 *	  The Makefile and scripts/embed-schema.sh take only <from>--<to>.sql, so
 *	  this file is built into nothing.
 *
 * What changes:
 *	- outbox_stats names its totals: destination '(all)' instead of NULL
 *	  (listed first, as the NULLs were).  Same columns, same types: CREATE OR
 *	  REPLACE VIEW keeps the grants on it (docs/operations.md's monitor role).
 *	  A query that picked the totals with "destination IS NULL" now writes
 *	  "destination = '(all)'" (docs/operations.md says so).
 *
 * No row is touched.
 */
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
