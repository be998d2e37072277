-- batch 1 parses
DECLARE @role SYSNAME = N'queuebox_reader', @sql NVARCHAR(600);
SET @sql = N'CREATE ROLE ' + QUOTENAME(@role);
EXEC (@sql);
GO
-- batch 2: a function call inside EXEC ( ... ), as roles.sql had it
-- (line 9 of the file: ScriptDom refuses it, as SQL Server does)
DECLARE @role SYSNAME = N'queuebox_reader';
EXEC (N'CREATE ROLE ' + QUOTENAME(@role));
GO
-- batch 3: a misspelt keyword on the file's line 13
SELECT 1;
SELEC name FROM sys.objects;
go
-- batch 4 parses (a lower-case go ended batch 3)
EXEC queuebox.take @source = N'x', @batch_size = 1;
