/*
 * sql/schema/roles.sql
 *	  Who may do what: the five queuebox roles, their grants, and EXECUTE
 *	  taken from PUBLIC (docs/operations.md, "Roles").
 *
 * The last part of both PostgreSQL schemas, and of every upgrade step of
 * both (the Makefile and scripts/embed-schema.sh append it), so it is
 * written to run any number of times: a step that adds a function ends
 * with that function granted to its role and taken from PUBLIC.
 *
 * The roles (NOLOGIN; grant them to login roles):
 *	queuebox_writer		insert outbox rows (INSERT, enqueue())
 *	queuebox_consumer	the five pull statements (inbox_claim() & co.)
 *	queuebox_reader		stats and status, no payload: outbox_stats,
 *						destination_status(), held_keys(), held_aggregates(),
 *						worker_status(), route_of(), topic_matches()
 *	queuebox_operator	the reader's, and requeue, replay, skip, pause,
 *						resume, reset, the console's reads (payloads)
 *	queuebox_admin		the operator's, and configure(), validate()
 *
 * Roles are cluster-wide and outlive DROP EXTENSION, so they are made only
 * when missing, by a role allowed to (a superuser runs CREATE EXTENSION;
 * the daemon's role needs CREATEROLE), with a WARNING naming them and a
 * comment on each role naming the database.  A
 * role that cannot be made is named in a NOTICE with what to run; grants
 * to it wait for queuebox.grant_roles() to be run again.
 *
 * The reader's and consumer's functions run as their owner (SECURITY
 * DEFINER, search_path pinned): a reader counts rows it may not read, a
 * consumer claims rows without UPDATE on the inbox.  The operator's run as
 * the caller, on the tables granted to the operator, so that the audit
 * tables record who did it (done_by defaults to current_user).
 */
CREATE OR REPLACE FUNCTION queuebox.grant_roles() RETURNS SETOF text
	LANGUAGE plpgsql VOLATILE
	SET search_path = pg_catalog, pg_temp
	AS $grant$
DECLARE
	me			record;
	r			text;
	f			text;
	g			text[];
	made		text[] := '{}';
	-- what each role may do: {role, privilege, object}; an object missing
	-- on this host (the extension's C functions, the daemon's SQL ones) is
	-- passed over
	grants		CONSTANT text[] := ARRAY[
		['queuebox_writer', 'INSERT', 'TABLE queuebox.outbox'],
		['queuebox_writer', 'SELECT (id)', 'TABLE queuebox.outbox'],
		['queuebox_writer', 'EXECUTE', 'FUNCTION queuebox.enqueue(text,jsonb,text,jsonb)'],
		['queuebox_consumer', 'EXECUTE', 'FUNCTION queuebox.inbox_claim(text,integer,integer)'],
		['queuebox_consumer', 'EXECUTE', 'FUNCTION queuebox.inbox_renew(bigint,uuid,integer)'],
		['queuebox_consumer', 'EXECUTE', 'FUNCTION queuebox.inbox_complete(bigint,uuid)'],
		['queuebox_consumer', 'EXECUTE', 'FUNCTION queuebox.inbox_retry(bigint,uuid,integer,text)'],
		['queuebox_consumer', 'EXECUTE', 'FUNCTION queuebox.inbox_dead(bigint,uuid,text)'],
		['queuebox_reader', 'SELECT', 'TABLE queuebox.outbox_stats'],
		['queuebox_reader', 'EXECUTE', 'FUNCTION queuebox.destination_status()'],
		['queuebox_reader', 'EXECUTE', 'FUNCTION queuebox.held_keys()'],
		['queuebox_reader', 'EXECUTE', 'FUNCTION queuebox.held_aggregates()'],
		['queuebox_reader', 'EXECUTE', 'FUNCTION queuebox.worker_status()'],
		['queuebox_reader', 'EXECUTE', 'FUNCTION queuebox.route_of(text)'],
		['queuebox_reader', 'EXECUTE', 'FUNCTION queuebox.topic_matches(text,text)'],
		['queuebox_reader', 'EXECUTE', 'FUNCTION queuebox._schema_version()'],
		['queuebox_reader', 'EXECUTE', 'FUNCTION queuebox.config_source()'],
		['queuebox_operator', 'SELECT, UPDATE, INSERT', 'TABLE queuebox.outbox'],
		['queuebox_operator', 'SELECT, UPDATE', 'TABLE queuebox.inbox'],
		['queuebox_operator', 'SELECT, INSERT, UPDATE', 'TABLE queuebox.destination_state'],
		['queuebox_operator', 'SELECT, INSERT', 'TABLE queuebox.outbox_audit'],
		['queuebox_operator', 'SELECT, INSERT', 'TABLE queuebox.inbox_audit'],
		['queuebox_operator', 'SELECT', 'TABLE queuebox.config'],
		-- the requeues and replays wake the workers as they commit
		['queuebox_operator', 'EXECUTE', 'FUNCTION queuebox._arm_outbox_wake()'],
		['queuebox_operator', 'EXECUTE', 'FUNCTION queuebox._arm_relay_wake()'],
		['queuebox_operator', 'EXECUTE', 'FUNCTION queuebox._destination_names()'],
		['queuebox_operator', 'EXECUTE', 'FUNCTION queuebox.requeue_outbox(bigint)'],
		['queuebox_operator', 'EXECUTE', 'FUNCTION queuebox.requeue_outbox(text,timestamptz,timestamptz)'],
		['queuebox_operator', 'EXECUTE', 'FUNCTION queuebox.requeue_outbox(bigint,jsonb)'],
		['queuebox_operator', 'EXECUTE', 'FUNCTION queuebox.skip_outbox(bigint)'],
		['queuebox_operator', 'EXECUTE', 'FUNCTION queuebox.replay_outbox(bigint)'],
		['queuebox_operator', 'EXECUTE', 'FUNCTION queuebox.replay_outbox(text,text,timestamptz,timestamptz)'],
		['queuebox_operator', 'EXECUTE', 'FUNCTION queuebox.requeue_inbox(bigint)'],
		['queuebox_operator', 'EXECUTE', 'FUNCTION queuebox.requeue_inbox(text,timestamptz,timestamptz)'],
		['queuebox_operator', 'EXECUTE', 'FUNCTION queuebox.requeue_inbox(bigint,jsonb)'],
		['queuebox_operator', 'EXECUTE', 'FUNCTION queuebox.skip_inbox(bigint)'],
		['queuebox_operator', 'EXECUTE', 'FUNCTION queuebox.replay_inbox(bigint)'],
		['queuebox_operator', 'EXECUTE', 'FUNCTION queuebox.replay_inbox(text,text,timestamptz,timestamptz)'],
		['queuebox_operator', 'EXECUTE', 'FUNCTION queuebox.resume_destination(text)'],
		['queuebox_operator', 'EXECUTE', 'FUNCTION queuebox.pause_destination(text,timestamptz)'],
		['queuebox_operator', 'EXECUTE', 'FUNCTION queuebox.reset_destination(text)'],
		['queuebox_operator', 'EXECUTE', 'FUNCTION queuebox.dead_outbox(text,text,text,text,timestamptz,timestamptz,bigint,integer)'],
		['queuebox_operator', 'EXECUTE', 'FUNCTION queuebox.dead_inbox(text,text,text,text,text,timestamptz,timestamptz,bigint,integer)'],
		['queuebox_operator', 'EXECUTE', 'FUNCTION queuebox.outbox_row(bigint)'],
		['queuebox_operator', 'EXECUTE', 'FUNCTION queuebox.inbox_row(bigint)'],
		['queuebox_operator', 'EXECUTE', 'FUNCTION queuebox.inbox_lookup(text,text)'],
		['queuebox_admin', 'INSERT, UPDATE', 'TABLE queuebox.config'],
		['queuebox_admin', 'EXECUTE', 'FUNCTION queuebox.configure(text)'],
		['queuebox_admin', 'EXECUTE', 'FUNCTION queuebox.validate(text)']];
	-- the reader's and consumer's functions run as their owner
	definers	CONSTANT text[] := ARRAY[
		'queuebox.inbox_claim(text,integer,integer)', 'queuebox.inbox_renew(bigint,uuid,integer)',
		'queuebox.inbox_complete(bigint,uuid)', 'queuebox.inbox_retry(bigint,uuid,integer,text)',
		'queuebox.inbox_dead(bigint,uuid,text)', 'queuebox.destination_status()', 'queuebox.held_keys()',
		'queuebox.held_aggregates()', 'queuebox.route_of(text)'];
	-- who includes whom: {member, role}
	members		CONSTANT text[] := ARRAY[
		['queuebox_operator', 'queuebox_reader'], ['queuebox_admin', 'queuebox_operator']];
BEGIN
	SELECT rolname, rolsuper OR rolcreaterole AS may INTO me FROM pg_roles WHERE rolname = current_user;
	FOREACH r IN ARRAY ARRAY['queuebox_writer', 'queuebox_consumer', 'queuebox_reader',
							 'queuebox_operator', 'queuebox_admin']
	LOOP
		CONTINUE WHEN EXISTS (SELECT FROM pg_roles WHERE rolname = r);
		IF me.may THEN
			EXECUTE format('CREATE ROLE %I NOLOGIN', r);
			EXECUTE format('COMMENT ON ROLE %I IS %L', r,
						   format('Made by QueueBox in database %s (docs/operations.md, "Roles").', current_database()));
			made := made || r;
			RETURN NEXT 'created ' || r;
		ELSE
			RAISE NOTICE 'queuebox: role % does not exist and role % may not create it', r, me.rolname
				USING HINT = format('As a role with CREATEROLE, run CREATE ROLE %I NOLOGIN; then SELECT queuebox.grant_roles(); as %I.', r, me.rolname);
			RETURN NEXT 'missing ' || r;
		END IF;
	END LOOP;
	IF cardinality(made) > 0 THEN
		-- a WARNING: CREATE EXTENSION hides its script's NOTICEs
		RAISE WARNING 'queuebox: created the roles %', array_to_string(made, ', ')
			USING DETAIL = 'Group roles (NOLOGIN) with the grants of docs/operations.md, "Roles"; DROP EXTENSION leaves them.',
				  HINT = 'Grant them to your login roles, e.g. GRANT queuebox_writer TO app.';
	END IF;

	FOREACH f IN ARRAY definers
	LOOP
		CONTINUE WHEN to_regprocedure(f) IS NULL;
		EXECUTE format('ALTER FUNCTION %s SECURITY DEFINER SET search_path = pg_catalog, pg_temp', f);
	END LOOP;
	-- every function, the ones a later step adds too, only for its roles
	REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA queuebox FROM PUBLIC;

	FOREACH g SLICE 1 IN ARRAY members
	LOOP
		CONTINUE WHEN NOT EXISTS (SELECT FROM pg_roles WHERE rolname = g[1])
				   OR NOT EXISTS (SELECT FROM pg_roles WHERE rolname = g[2])
				   OR pg_has_role(g[1], g[2], 'MEMBER');
		EXECUTE format('GRANT %I TO %I', g[2], g[1]);
		RETURN NEXT format('granted %s to %s', g[2], g[1]);
	END LOOP;
	FOREACH g SLICE 1 IN ARRAY grants
	LOOP
		CONTINUE WHEN NOT EXISTS (SELECT FROM pg_roles WHERE rolname = g[1]);
		IF g[3] LIKE 'FUNCTION %' THEN
			CONTINUE WHEN to_regprocedure(substr(g[3], 10)) IS NULL;
		ELSE
			CONTINUE WHEN to_regclass(substr(g[3], 7)) IS NULL;
		END IF;
		EXECUTE format('GRANT USAGE ON SCHEMA queuebox TO %I', g[1]);
		EXECUTE format('GRANT %s ON %s TO %I', g[2], g[3], g[1]);
	END LOOP;
	RETURN;
END
$grant$;
COMMENT ON FUNCTION queuebox.grant_roles() IS
	'Make the missing queuebox roles (when the caller may), take EXECUTE on every queuebox function from PUBLIC, and grant each role its tables and functions; safe to run again (docs/operations.md, "Roles").';

SELECT count(*) AS queuebox_roles FROM queuebox.grant_roles();
