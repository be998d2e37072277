/*
 * sql/sqlserver/upgrade/0.3.7--0.3.8.sql
 *	  What changes from schema 0.3.7 to 0.3.8 on SQL Server (issue 39; what
 *	  the features add follows), one section each below: so far the version
 *	  only.  T-SQL batches split on GO.
 */

-- ---- the version ------------------------------------------------------------

DROP FUNCTION queuebox._schema_version;
GO
CREATE FUNCTION queuebox._schema_version() RETURNS NVARCHAR(50)
AS
BEGIN
	RETURN N'0.3.8';
END
GO
