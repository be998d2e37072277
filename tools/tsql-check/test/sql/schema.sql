-- a schema of one procedure, queuebox.take (@source, @batch_size)
IF SCHEMA_ID(N'queuebox') IS NULL
	EXEC (N'CREATE SCHEMA queuebox');
GO
CREATE OR ALTER PROCEDURE queuebox.take @source NVARCHAR(200), @batch_size INT
AS
BEGIN
	SET NOCOUNT ON;
	SELECT TOP (@batch_size) name FROM sys.objects WHERE name = @source;
END
GO
