/*
 * sql/sqlserver/upgrade/0.3.3--0.3.4.sql
 *	  What changes from schema 0.3.3 to 0.3.4 on SQL Server.  On PostgreSQL
 *	  0.3.4 adds onDead: holdKey (sql/schema/upgrade/0.3.3--0.3.4.sql); the
 *	  SQL Server procedures do not hold keys yet (the ODBC store settles
 *	  such a row as a plain dead one), so this step only records the
 *	  version: one version number serves both databases.
 */
DROP FUNCTION queuebox._schema_version;
GO
CREATE FUNCTION queuebox._schema_version() RETURNS NVARCHAR(50)
AS
BEGIN
	RETURN N'0.3.4';
END
GO
