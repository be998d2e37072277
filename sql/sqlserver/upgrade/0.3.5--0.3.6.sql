/*
 * sql/sqlserver/upgrade/0.3.5--0.3.6.sql
 *	  What changes from schema 0.3.5 to 0.3.6 on SQL Server (issue 38, chaos
 *	  with a checker), one section each below; T-SQL batches split on GO.
 */

-- ---- the version ------------------------------------------------------------

DROP FUNCTION queuebox._schema_version;
GO
CREATE FUNCTION queuebox._schema_version() RETURNS NVARCHAR(50)
AS
BEGIN
	RETURN N'0.3.6';
END
GO
