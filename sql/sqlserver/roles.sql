/*
 * sql/sqlserver/roles.sql
 *	  Who may do what on SQL Server: the five queuebox database roles and
 *	  their grants, as sql/schema/roles.sql does on PostgreSQL
 *	  (docs/sqlserver.md, "Roles").
 *
 * The last batch of the schema and of every upgrade step (the Makefile
 * appends it), so it runs any number of times.  Each role is made when it
 * is missing and the migrating user may (CREATE ROLE: db_securityadmin or
 * db_owner; db_ddladmin may not), and each grant is made when its role and
 * object exist and the user may grant (CONTROL on the object: db_owner or
 * the schema's owner): what could not be done is PRINTed with what to run,
 * and the next --migrate by a user who may does it.  The user dbo may do
 * all of it, whatever the probes answer (on SQL Server they answer 1 for
 * dbo; Babelfish answers 0 to HAS_PERMS_BY_NAME(..., N'CREATE ROLE') and
 * IS_MEMBER(N'db_owner') even there).  Each is asked first,
 * not tried: the daemon's session runs with XACT_ABORT ON, where a caught
 * error still dooms the migration's transaction.
 *
 * A statement made at run time is built in @sql first, then EXEC (@sql):
 * EXEC ( ... ) takes only string literals and variables joined by +, no
 * function call (QUOTENAME there is a syntax error on SQL Server and on
 * Babelfish alike; tools/tsql-check finds it).
 *
 * A procedure reads and writes its tables through ownership chaining, so
 * EXECUTE on it is all a role needs (not on Babelfish, where a procedure
 * reads with its caller's rights: docs/sqlserver.md); SQL Server grants nothing to public
 * on a new object, so there is nothing to take back.
 */
SET NOCOUNT ON;
DECLARE @grants TABLE (seq INT IDENTITY PRIMARY KEY, role SYSNAME, perm NVARCHAR(60), obj NVARCHAR(200));
INSERT INTO @grants (role, perm, obj) VALUES
	(N'queuebox_writer', N'INSERT', N'queuebox.outbox'),
	(N'queuebox_writer', N'SELECT', N'queuebox.outbox'),
	-- what the outbox's triggers read and call (outbox_trace, outbox_fanout):
	-- no-op grants on SQL Server (ownership chaining), needed on Babelfish
	(N'queuebox_writer', N'EXECUTE', N'queuebox._trace_error'),
	(N'queuebox_writer', N'SELECT', N'queuebox.config_route'),
	(N'queuebox_writer', N'EXECUTE', N'queuebox.topic_matches'),
	(N'queuebox_writer', N'EXECUTE', N'queuebox._pattern_error'),
	(N'queuebox_consumer', N'EXECUTE', N'queuebox.inbox_claim'),
	(N'queuebox_consumer', N'EXECUTE', N'queuebox.inbox_renew'),
	(N'queuebox_consumer', N'EXECUTE', N'queuebox.inbox_complete'),
	(N'queuebox_consumer', N'EXECUTE', N'queuebox.inbox_retry'),
	(N'queuebox_consumer', N'EXECUTE', N'queuebox.inbox_dead'),
	(N'queuebox_reader', N'SELECT', N'queuebox.outbox_stats'),
	(N'queuebox_reader', N'EXECUTE', N'queuebox.destination_status'),
	(N'queuebox_reader', N'EXECUTE', N'queuebox.held_keys'),
	(N'queuebox_reader', N'EXECUTE', N'queuebox.held_aggregates'),
	(N'queuebox_reader', N'EXECUTE', N'queuebox.route_of'),
	(N'queuebox_reader', N'EXECUTE', N'queuebox.topic_matches'),
	(N'queuebox_operator', N'EXECUTE', N'queuebox.requeue_outbox'),
	(N'queuebox_operator', N'EXECUTE', N'queuebox.requeue_outbox_matching'),
	(N'queuebox_operator', N'EXECUTE', N'queuebox.requeue_outbox_edited'),
	(N'queuebox_operator', N'EXECUTE', N'queuebox.skip_outbox'),
	(N'queuebox_operator', N'EXECUTE', N'queuebox.replay_outbox'),
	(N'queuebox_operator', N'EXECUTE', N'queuebox.replay_outbox_matching'),
	(N'queuebox_operator', N'EXECUTE', N'queuebox.requeue_inbox'),
	(N'queuebox_operator', N'EXECUTE', N'queuebox.requeue_inbox_matching'),
	(N'queuebox_operator', N'EXECUTE', N'queuebox.requeue_inbox_edited'),
	(N'queuebox_operator', N'EXECUTE', N'queuebox.skip_inbox'),
	(N'queuebox_operator', N'EXECUTE', N'queuebox.resume_destination'),
	(N'queuebox_operator', N'EXECUTE', N'queuebox.pause_destination'),
	(N'queuebox_operator', N'EXECUTE', N'queuebox.reset_destination'),
	(N'queuebox_operator', N'EXECUTE', N'queuebox.dead_outbox'),
	(N'queuebox_operator', N'EXECUTE', N'queuebox.dead_inbox'),
	(N'queuebox_operator', N'EXECUTE', N'queuebox.outbox_row'),
	(N'queuebox_operator', N'EXECUTE', N'queuebox.inbox_row'),
	(N'queuebox_operator', N'EXECUTE', N'queuebox.inbox_lookup'),
	(N'queuebox_admin', N'SELECT, INSERT, UPDATE, DELETE', N'queuebox.config_route'),
	(N'queuebox_admin', N'SELECT, INSERT, UPDATE, DELETE', N'queuebox.config_destination');
DECLARE @members TABLE (member SYSNAME, role SYSNAME);
INSERT INTO @members VALUES (N'queuebox_operator', N'queuebox_reader'), (N'queuebox_admin', N'queuebox_operator');
DECLARE @role SYSNAME, @member SYSNAME, @perm NVARCHAR(60), @obj NVARCHAR(200), @sql NVARCHAR(600);

DECLARE r CURSOR LOCAL FAST_FORWARD FOR
	SELECT n FROM (VALUES (N'queuebox_writer'), (N'queuebox_consumer'), (N'queuebox_reader'),
					  (N'queuebox_operator'), (N'queuebox_admin')) v(n)
	WHERE DATABASE_PRINCIPAL_ID(n) IS NULL;
OPEN r;
FETCH NEXT FROM r INTO @role;
WHILE @@FETCH_STATUS = 0
BEGIN
	IF HAS_PERMS_BY_NAME(DB_NAME(), N'DATABASE', N'CREATE ROLE') = 1 OR USER_NAME() = N'dbo'
	BEGIN
		SET @sql = N'CREATE ROLE ' + QUOTENAME(@role);
		EXEC (@sql);
		PRINT N'queuebox: created database role ' + @role + N'; ALTER ROLE ' + @role + N' ADD MEMBER your user.';
	END
	ELSE
		PRINT N'queuebox: database role ' + @role + N' does not exist and ' + USER_NAME()
			  + N' may not create it: run queuebox-mssqld --migrate as a db_owner or db_securityadmin user.';
	FETCH NEXT FROM r INTO @role;
END
CLOSE r;
DEALLOCATE r;

DECLARE m CURSOR LOCAL FAST_FORWARD FOR
	SELECT member, role FROM @members
	WHERE DATABASE_PRINCIPAL_ID(member) IS NOT NULL AND DATABASE_PRINCIPAL_ID(role) IS NOT NULL
	  AND IS_ROLEMEMBER(role, member) = 0;
OPEN m;
FETCH NEXT FROM m INTO @member, @role;
WHILE @@FETCH_STATUS = 0
BEGIN
	IF IS_MEMBER(N'db_owner') = 1 OR IS_MEMBER(N'db_securityadmin') = 1 OR USER_NAME() = N'dbo'
	BEGIN
		SET @sql = N'ALTER ROLE ' + QUOTENAME(@role) + N' ADD MEMBER ' + QUOTENAME(@member);
		EXEC (@sql);
	END
	ELSE
		PRINT N'queuebox: ' + USER_NAME() + N' may not add ' + @member + N' to ' + @role
			  + N': run queuebox-mssqld --migrate as a db_owner user.';
	FETCH NEXT FROM m INTO @member, @role;
END
CLOSE m;
DEALLOCATE m;

DECLARE g CURSOR LOCAL FAST_FORWARD FOR
	SELECT role, perm, obj FROM @grants
	WHERE DATABASE_PRINCIPAL_ID(role) IS NOT NULL AND OBJECT_ID(obj) IS NOT NULL
	ORDER BY seq;
OPEN g;
FETCH NEXT FROM g INTO @role, @perm, @obj;
WHILE @@FETCH_STATUS = 0
BEGIN
	-- perm and obj are the constants above; the role is quoted
	SET @sql = N'GRANT ' + @perm + N' ON ' + @obj + N' TO ' + QUOTENAME(@role);
	IF HAS_PERMS_BY_NAME(@obj, N'OBJECT', N'CONTROL') = 1
	BEGIN
		EXEC (@sql);
	END
	ELSE
		PRINT N'queuebox: ' + USER_NAME() + N' may not run ' + @sql + N': run queuebox-mssqld --migrate as a db_owner user.';
	FETCH NEXT FROM g INTO @role, @perm, @obj;
END
CLOSE g;
DEALLOCATE g;
GO
