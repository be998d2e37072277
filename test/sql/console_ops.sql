-- The console's reads and destination actions (docs/operations.md,
-- "Reading dead rows", "Pausing a destination"): dead_outbox and
-- dead_inbox (filters, the id cursor, the 10000-row bound and next_after,
-- bad input), outbox_row with its audit and the actor, inbox_row,
-- inbox_lookup, pause_destination and reset_destination.
TRUNCATE queuebox.outbox RESTART IDENTITY;
TRUNCATE queuebox.outbox_audit RESTART IDENTITY;
TRUNCATE queuebox.inbox RESTART IDENTITY;
TRUNCATE queuebox.destination_state;
SELECT queuebox.configure($yaml$
destinations:
  web: { type: http, baseUrl: "http://127.0.0.1:9000" }
  audit: { type: http, baseUrl: "http://127.0.0.1:9001" }
routes:
  - { topicPattern: "orders.**", destination: web }
$yaml$);

-- ids 1..6: dead rows of two destinations, topics, keys and errors; 7 is sent
INSERT INTO queuebox.outbox (topic, key, payload, state, destination, hold, attempt, last_error, created_at) VALUES
  ('orders.paid', 'k1', '{"n": 1}', 'dead', 'web', 'dead', 5, 'HTTP 500 Internal', '2026-11-01T10:00:00Z'),
  ('orders.paid', 'k2', '{"n": 2}', 'dead', 'web', NULL, 5, 'HTTP 404 Not Found', '2026-11-02T10:00:00Z'),
  ('orders.made', 'k1', '{"n": 3}', 'dead', 'web', NULL, 5, 'timeout after 10 s', '2026-11-03T10:00:00Z'),
  ('audit.x', NULL, '{"n": 4}', 'dead', 'audit', NULL, 5, 'http 500 internal', '2026-11-04T10:00:00Z'),
  ('audit.x', 'k3', '{"n": 5}', 'dead', 'audit', NULL, 5, NULL, '2026-11-05T10:00:00Z'),
  ('orders.paid', 'k4', '{"n": 6}', 'dead', 'web', NULL, 5, 'HTTP 503', '2026-11-06T10:00:00Z'),
  ('orders.paid', 'k5', '{"n": 7}', 'sent', 'web', NULL, 1, NULL, '2026-11-06T11:00:00Z');

CREATE FUNCTION pg_temp.ids(page jsonb) RETURNS text LANGUAGE sql AS $$
  SELECT coalesce(string_agg(r->>'id', ',' ORDER BY (r->>'id')::bigint), '') || ' next ' || coalesce(page->>'next_after', '-')
  FROM jsonb_array_elements(page->'rows') r $$;

-- no filter: every dead row, oldest id first; a page of 2, then the next
SELECT pg_temp.ids(queuebox.dead_outbox());
SELECT pg_temp.ids(queuebox.dead_outbox(page_size => 2));
SELECT pg_temp.ids(queuebox.dead_outbox(after => 2, page_size => 2));
SELECT pg_temp.ids(queuebox.dead_outbox(after => 4, page_size => 2));
SELECT pg_temp.ids(queuebox.dead_outbox(after => 6, page_size => 2));
-- each filter, and two at once
SELECT pg_temp.ids(queuebox.dead_outbox(destination => 'audit'));
SELECT pg_temp.ids(queuebox.dead_outbox(topic => 'orders.paid'));
SELECT pg_temp.ids(queuebox.dead_outbox(key => 'k1'));
SELECT pg_temp.ids(queuebox.dead_outbox(error => 'http 500'));
SELECT pg_temp.ids(queuebox.dead_outbox(error => '%'));
SELECT pg_temp.ids(queuebox.dead_outbox(since => '2026-11-02T10:00:00Z', until => '2026-11-05T10:00:00Z'));
SELECT pg_temp.ids(queuebox.dead_outbox(destination => 'web', key => 'k1', topic => 'orders.made'));
SELECT pg_temp.ids(queuebox.dead_outbox(destination => 'nosuch'));
-- a row's fields; holds_key on the row that holds its key
SELECT r->>'id' AS id, r->>'topic' AS topic, r->>'key' AS key, r->>'destination' AS destination,
       r->>'attempt' AS attempt, r->>'last_error' AS last_error, r->>'holds_key' AS holds_key,
       (r->>'message_id')::uuid IS NOT NULL AS has_message_id, (r->>'created_at')::timestamptz AS created_at
FROM jsonb_array_elements(queuebox.dead_outbox(page_size => 2)->'rows') r;
-- bad input
SELECT queuebox.dead_outbox(page_size => 0);
SELECT queuebox.dead_outbox(page_size => 1001);

-- the bound: a page examines at most 10000 rows; a rare substring comes
-- back short with next_after where the walk stopped, and the next page
-- goes on from there
INSERT INTO queuebox.outbox (topic, payload, state, destination, last_error)
SELECT 'bulk.x', '{}', 'dead', 'audit', CASE WHEN g = 10500 THEN 'needle here' ELSE 'hay' END
FROM generate_series(1, 10600) g;
SELECT jsonb_array_length(p->'rows') AS found, (p->>'next_after')::bigint AS next_after
FROM queuebox.dead_outbox(error => 'NEEDLE') p;
SELECT jsonb_array_length(p->'rows') AS found, p->'rows'->0->>'last_error' AS last_error, p->>'next_after' AS next_after
FROM queuebox.dead_outbox(error => 'NEEDLE', after => 10001) p;
-- a full page says where the next starts even when no row is left
SELECT pg_temp.ids(queuebox.dead_outbox(topic => 'audit.x'));
SELECT pg_temp.ids(queuebox.dead_outbox(topic => 'audit.x', page_size => 1));
DELETE FROM queuebox.outbox WHERE topic = 'bulk.x';

-- outbox_row: the whole row; an edited requeue's audit names the actor
-- the admin route sets, else the role
SELECT o - 'message_id' - 'created_at' - 'scheduled_at' AS row FROM queuebox.outbox_row(2) o;
SELECT queuebox.outbox_row(999) IS NULL AS none;
BEGIN;
SELECT set_config('queuebox_admin.actor', 'admin route from 127.0.0.1', true) IS NOT NULL AS set;
SELECT queuebox.skip_outbox(1);
SELECT queuebox.requeue_outbox(1, '{"n": 10}');
COMMIT;
SELECT queuebox.requeue_outbox(2, '{"n": 20}');
SELECT a->>'action' AS action, a->>'done_by' = current_user AS by_role, a->>'done_by' AS done_by,
       a->'payload_before' AS before, a->'payload_after' AS after, (a->>'done_at')::timestamptz <= now() AS done
FROM queuebox.outbox_row(1) o, jsonb_array_elements(o->'audit') a;
SELECT a->>'done_by' = current_user AS by_role FROM queuebox.outbox_row(2) o, jsonb_array_elements(o->'audit') a;
SELECT o->>'state' AS state, o->>'hold' AS hold, o->'payload' AS payload FROM queuebox.outbox_row(1) o;

-- the inbox: dead_inbox's filters and cursor, inbox_row, inbox_lookup
INSERT INTO queuebox.inbox (source, idempotency_key, event_type, aggregate_id, payload, headers, state, last_error, created_at) VALUES
  ('stripe', 'e1', 'charge', 'a1', '{"n": 1}', '{"x-a": "1"}', 'dead', 'no route for charge', '2026-11-01T10:00:00Z'),
  ('stripe', 'e2', 'refund', 'a1', '{"n": 2}', '{}', 'dead', 'Bad payload', '2026-11-02T10:00:00Z'),
  ('github', 'e1', 'push', NULL, '{"n": 3}', '{}', 'dead', 'no route for push', '2026-11-03T10:00:00Z'),
  ('github', 'e2', 'push', NULL, '{"n": 4}', '{}', 'processed', NULL, '2026-11-04T10:00:00Z');
SELECT pg_temp.ids(queuebox.dead_inbox());
SELECT pg_temp.ids(queuebox.dead_inbox(source => 'stripe'));
SELECT pg_temp.ids(queuebox.dead_inbox(event_type => 'push'));
SELECT pg_temp.ids(queuebox.dead_inbox(idempotency_key => 'e1'));
SELECT pg_temp.ids(queuebox.dead_inbox(aggregate_id => 'a1', error => 'PAYLOAD'));
SELECT pg_temp.ids(queuebox.dead_inbox(since => '2026-11-02T00:00:00Z'));
SELECT pg_temp.ids(queuebox.dead_inbox(after => 1, page_size => 1));
SELECT queuebox.dead_inbox(page_size => NULL);
SELECT i - 'created_at' - 'scheduled_at' AS row FROM queuebox.inbox_row(1) i;
SELECT queuebox.inbox_row(4)->>'state' AS state, queuebox.inbox_row(999) IS NULL AS none;
SELECT queuebox.inbox_lookup('github', 'e2')->>'id' AS id, queuebox.inbox_lookup('github', 'e9') IS NULL AS none;

-- pause_destination: paused_until set, the circuit untouched; an unknown
-- name or no time is refused; reset keeps the pause, resume ends it
SELECT queuebox.pause_destination('web', now() + interval '1 hour') = now() + interval '1 hour' AS paused;
SELECT destination, state, failures, paused_until > now() AS paused FROM queuebox.destination_state;
SELECT queuebox.pause_destination('nosuch', now() + interval '1 hour');
SELECT queuebox.pause_destination('web', NULL);
UPDATE queuebox.destination_state SET state = 'open', failures = 3, opened_at = now(), probe_at = now();
SELECT queuebox.reset_destination('web') AS reset, queuebox.reset_destination('web') AS again,
       queuebox.reset_destination('nosuch') AS unknown;
SELECT destination, state, failures, opened_at, probe_at, paused_until > now() AS paused FROM queuebox.destination_state;
SELECT queuebox.resume_destination('web');
SELECT destination, state, paused_until FROM queuebox.destination_state;
-- a later pause replaces an earlier one, a shorter one too
SELECT queuebox.pause_destination('audit', now() + interval '2 hours') IS NOT NULL AS paused;
SELECT queuebox.pause_destination('audit', now() + interval '1 minute') = now() + interval '1 minute' AS shorter;

TRUNCATE queuebox.outbox RESTART IDENTITY;
TRUNCATE queuebox.outbox_audit RESTART IDENTITY;
TRUNCATE queuebox.inbox RESTART IDENTITY;
TRUNCATE queuebox.destination_state;
SELECT queuebox.configure('{}');
