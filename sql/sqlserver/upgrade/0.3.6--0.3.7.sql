/*
 * sql/sqlserver/upgrade/0.3.6--0.3.7.sql
 *	  What changes from schema 0.3.6 to 0.3.7 on SQL Server (issue 37,
 *	  speed): the version only.  PostgreSQL drops outbox_created_brin in
 *	  this step; SQL Server never had that index (its retention reads the
 *	  filtered outbox_sent_idx).  T-SQL batches split on GO.
 */

-- ---- the version ------------------------------------------------------------

DROP FUNCTION queuebox._schema_version;
GO
CREATE FUNCTION queuebox._schema_version() RETURNS NVARCHAR(50)
AS
BEGIN
	RETURN N'0.3.7';
END
GO
