-- roles: the five queuebox roles (sql/schema/roles.sql), each through its
-- own login: it can do its job and nothing more.  EXECUTE is nobody's by
-- default.
SELECT rolname, rolcanlogin, shobj_description(oid, 'pg_authid') LIKE 'Made by QueueBox in database %' AS commented
FROM pg_roles WHERE rolname LIKE 'queuebox\_%' ORDER BY rolname;
SELECT count(*) AS public_may_execute FROM pg_proc p
WHERE p.pronamespace = 'queuebox'::regnamespace AND has_function_privilege('public', p.oid, 'EXECUTE');
SELECT queuebox.configure($$
destinations:
  web: {type: http, baseUrl: "http://127.0.0.1:1", path: /in}
routes:
  - {topicPattern: "orders.*", destination: web}
$$) IS NOT NULL AS configured;
CREATE ROLE qb_app LOGIN IN ROLE queuebox_writer;
CREATE ROLE qb_worker LOGIN IN ROLE queuebox_consumer;
CREATE ROLE qb_monitor LOGIN IN ROLE queuebox_reader;
CREATE ROLE qb_ops LOGIN IN ROLE queuebox_operator;
CREATE ROLE qb_admin LOGIN IN ROLE queuebox_admin;
CREATE ROLE qb_nobody LOGIN;
INSERT INTO queuebox.inbox (source, idempotency_key, payload, consumption)
VALUES ('jobs', 'j-1', '{"n": 1}', 'pull'), ('jobs', 'j-2', '{"n": 2}', 'pull');
\set VERBOSITY terse

-- a login with no queuebox role can do nothing
\c - qb_nobody
INSERT INTO queuebox.outbox (topic, payload) VALUES ('orders.created', '{}');
SELECT queuebox.validate('{}');
SELECT count(*) FROM queuebox.destination_status();

-- writer: inserts rows in its transaction, and nothing else
\c - qb_app
BEGIN;
INSERT INTO queuebox.outbox (topic, key, payload) VALUES ('orders.created', 'k1', '{"n": 1}');
SELECT queuebox.enqueue('orders.created', '{"n": 2}', 'k1') > 0 AS enqueued;
COMMIT;
SELECT payload FROM queuebox.outbox;
SELECT count(*) FROM queuebox.outbox_stats;
SELECT queuebox.requeue_outbox(1);
SELECT count(*) FROM queuebox.inbox_claim('jobs', 1, 30000);
SELECT queuebox.configure('{}');

-- consumer: the pull statements, no table
\c - qb_worker
SELECT idempotency_key, attempt FROM queuebox.inbox_claim('jobs', 1, 30000);
SELECT queuebox.inbox_complete(id, claim_token) AS completed
FROM queuebox.inbox_claim('jobs', 1, 30000);
SELECT count(*) FROM queuebox.inbox;
UPDATE queuebox.inbox SET state = 'processed';
INSERT INTO queuebox.outbox (topic, payload) VALUES ('orders.created', '{}');
SELECT queuebox.requeue_inbox(1);

-- reader: counts and states, no payload, no action
\c - qb_monitor
SELECT destination, state, rows, circuit FROM queuebox.outbox_stats;
SELECT destination, state, pending FROM queuebox.destination_status();
SELECT count(*) AS held FROM queuebox.held_keys();
SELECT queuebox.route_of('orders.created');
SELECT payload FROM queuebox.outbox;
SELECT count(*) FROM queuebox.outbox_row(1);
SELECT queuebox.pause_destination('web', now() + interval '1 hour');
SELECT document FROM queuebox.config;

-- operator: the reader's, the console's reads, the actions; no configure
\c - qb_ops
SELECT count(*) AS rows FROM queuebox.outbox_stats;
UPDATE queuebox.outbox SET state = 'dead', last_error = 'HTTP 500' WHERE payload->>'n' = '1';
SELECT queuebox.requeue_outbox(id) FROM queuebox.outbox WHERE payload->>'n' = '1';
SELECT action, done_by FROM queuebox.outbox_audit;
SELECT queuebox.pause_destination('web', now() + interval '1 hour') > now() AS paused;
SELECT queuebox.resume_destination('web') AS resumed;
SELECT (queuebox.outbox_row(id))->>'state' AS state FROM queuebox.outbox WHERE payload->>'n' = '1';
SELECT queuebox.configure('{}');
SELECT queuebox.grant_roles();
INSERT INTO queuebox.config (id, document) VALUES (1, '{}') ON CONFLICT (id) DO UPDATE SET document = '{}';

-- admin: the operator's and the configuration
\c - qb_admin
SELECT queuebox.validate('{}') IS NOT NULL AS valid;
SELECT queuebox.configure($$
destinations:
  web: {type: http, baseUrl: "http://127.0.0.1:2", path: /in}
routes:
  - {topicPattern: "orders.*", destination: web}
$$) IS NOT NULL AS configured;
SELECT updated_by FROM queuebox.config;
SELECT queuebox.resume_destination('web') AS resumed;
SELECT queuebox.grant_roles();

-- grant_roles() again changes nothing and makes nothing
\c - postgres
SELECT * FROM queuebox.grant_roles();
SELECT count(*) AS public_may_execute FROM pg_proc p
WHERE p.pronamespace = 'queuebox'::regnamespace AND has_function_privilege('public', p.oid, 'EXECUTE');
DELETE FROM queuebox.outbox_audit;
DELETE FROM queuebox.outbox;
DELETE FROM queuebox.inbox;
DELETE FROM queuebox.destination_state;
DROP ROLE qb_app, qb_worker, qb_monitor, qb_ops, qb_admin, qb_nobody;
