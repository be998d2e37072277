/*
 * sql/sqlserver/upgrade/0.3.0--0.3.1.sql
 *	  What changes from schema 0.3.0 to 0.3.1 on SQL Server: the version
 *	  only.  0.3.1 changes PostgreSQL's inbox_claim() (jit off,
 *	  sql/schema/upgrade/0.3.0--0.3.1.sql); SQL Server has no JIT.  One
 *	  version number serves both, so the daemon knows where each database
 *	  stands (docs/design/schema.md).
 *
 * DROP and CREATE rather than ALTER FUNCTION, which Babelfish does not run;
 * nothing is schema-bound to the function, and the migration is one
 * transaction, so no caller sees it missing.
 */
DROP FUNCTION queuebox._schema_version;
GO
CREATE FUNCTION queuebox._schema_version() RETURNS NVARCHAR(50)
AS
BEGIN
	RETURN N'0.3.1';
END
GO
