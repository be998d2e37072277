/*
 * sql/sqlserver/upgrade/PENDING-metrics.sql  (branch i21-metrics, issue 21 friction 8)
 *	  NOT an upgrade step yet: the lead folds it into the next version's
 *	  sql/sqlserver/upgrade/<old>--<new>.sql.  Only <from>--<to>.sql files
 *	  are built, so this one is built into nothing.
 *
 * What changes: outbox_stats names its totals destination N'(all)' instead
 * of NULL, as on PostgreSQL (sql/schema/upgrade/PENDING-metrics.sql).
 * DROP and CREATE, not CREATE OR ALTER (Babelfish); nothing is bound to the
 * view, and the step is one transaction.  A grant an operator made on the
 * view goes with it (the schema makes none): the upgrade notes must say so.
 */
DROP VIEW queuebox.outbox_stats;
GO
CREATE VIEW queuebox.outbox_stats AS
	WITH per_topic AS (
		SELECT topic, destination, state, COUNT(*) AS n,
			   MIN(CASE WHEN state = N'pending' THEN created_at END) AS oldest_pending
		FROM queuebox.outbox
		GROUP BY topic, destination, state),
	routed AS (
		SELECT COALESCE(destination, queuebox.route_of(topic), N'(no route)') AS destination,
			   state, n, oldest_pending
		FROM per_topic)
	SELECT CASE WHEN GROUPING(r.destination) = 1 THEN N'(all)' ELSE r.destination END AS destination,
		   r.state, CAST(SUM(r.n) AS BIGINT) AS [rows],
		   DATEDIFF(millisecond, MIN(r.oldest_pending), SYSUTCDATETIME()) / 1000.0 AS oldest_pending_age_s,
		   CASE WHEN GROUPING(r.destination) = 1 OR r.destination = N'(no route)' THEN NULL
				ELSE COALESCE(MIN(d.state), N'closed') END AS circuit
	FROM routed r LEFT JOIN queuebox.destination_state d ON d.destination = r.destination
	GROUP BY GROUPING SETS ((r.destination, r.state), (r.state));
GO
