/*
 * sql/sqlserver/upgrade/0.3.4--0.3.5.sql
 *	  What changes from schema 0.3.4 to 0.3.5 on SQL Server (issue 27,
 *	  production fit), one section each below; T-SQL batches split on GO.
 */

-- ---- trace context ------------------------------------------------------


-- ---- least-privilege roles -----------------------------------------------
-- sql/sqlserver/roles.sql ends this step, as it ends every step and the
-- fresh schema: it makes the missing database roles and grants.

-- ---- the version ------------------------------------------------------------

DROP FUNCTION queuebox._schema_version;
GO
CREATE FUNCTION queuebox._schema_version() RETURNS NVARCHAR(50)
AS
BEGIN
	RETURN N'0.3.5';
END
GO
