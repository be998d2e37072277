-- The relay's statements: claim push rows (one per aggregate across all push
-- sources, created_at order) and forward them into the outbox in one
-- statement, with the mapped headers; an empty topic sends the row to dead.
TRUNCATE queuebox.outbox RESTART IDENTITY;
TRUNCATE queuebox.inbox RESTART IDENTITY;
INSERT INTO queuebox.inbox (source, idempotency_key, event_type, aggregate_id, payload, headers, consumption, created_at) VALUES
  ('stripe', 'evt_1', 'invoice.paid', 'cus_1', '{"n": 1}',
   '{"Content-Type": "application/json", "x-correlation-id": "corr-7", "X-Source": "forged", "X-INBOX-ID": "forged"}', 'push', now() - interval '5 min'),
  ('github', 'del_1', NULL, 'cus_1', '{"n": 2}', '{}', 'push', now() - interval '4 min'),
  ('stripe', 'evt_2', NULL, 'cus_2', '{"n": 3}', '{}', 'push', now() - interval '3 min'),
  ('stripe', 'evt_3', 'x', NULL, '{"n": 4}', '{}', 'push', now() - interval '2 min'),
  ('orders', 'o_1', 'x', 'cus_1', '{"n": 5}', '{}', 'pull', now() - interval '6 min');

-- cus_1's second message (another push source) waits for its first; pull rows are not the relay's
SELECT id, source, event_type FROM queuebox._relay_claim(10, 60000, 'aaaaaaaa-0000-0000-0000-000000000001') ORDER BY id;
SELECT count(*) AS nothing_more FROM queuebox._relay_claim(10, 60000, 'aaaaaaaa-0000-0000-0000-000000000002');
-- del_1 was parked behind evt_1 at its first claim: later claims do not read it
SELECT id, source, state, hold FROM queuebox.inbox ORDER BY id;

-- a stale token forwards nothing
SELECT queuebox._relay_forward('aaaaaaaa-0000-0000-0000-000000000002', ARRAY[1]::bigint[], ARRAY['x'], NULL);
SELECT count(*) AS outbox_rows FROM queuebox.outbox;

-- forward: rendered topics from the worker; evt_2 rendered empty
SELECT queuebox._relay_forward('aaaaaaaa-0000-0000-0000-000000000001',
  ARRAY[1, 3, 4]::bigint[], ARRAY['stripe.invoice.paid', '', 'stripe.x'], 7);
SELECT id, topic, key, payload, headers, max_attempts, state FROM queuebox.outbox ORDER BY id;
SELECT id, source, state, claim_token, last_error FROM queuebox.inbox ORDER BY id;

-- the forward's second statement released cus_1's next message
SELECT id, source, state, hold FROM queuebox.inbox WHERE id = 2;
-- now cus_1's next message is claimable
SELECT id, source FROM queuebox._relay_claim(10, 60000, 'aaaaaaaa-0000-0000-0000-000000000003');

-- a takeover: del_1's lease expires while a later cus_1 row waits parked
-- behind it; the takeover claims it again (nothing earlier is open), and
-- its forward by the new token releases the parked row
INSERT INTO queuebox.inbox (source, idempotency_key, event_type, aggregate_id, payload, consumption)
VALUES ('stripe', 'evt_4', 'x', 'cus_1', '{"n": 6}', 'push');
SELECT count(*) AS parked_only FROM queuebox._relay_claim(10, 60000, 'aaaaaaaa-0000-0000-0000-000000000004');
UPDATE queuebox.inbox SET lease_until = now() - interval '1 second' WHERE id = 2;
SELECT id, source FROM queuebox._relay_claim(10, 60000, 'aaaaaaaa-0000-0000-0000-000000000005');
SELECT queuebox._relay_forward('aaaaaaaa-0000-0000-0000-000000000003', ARRAY[2]::bigint[], ARRAY['x'], NULL) AS stale;
SELECT id, state, hold FROM queuebox.inbox WHERE idempotency_key = 'evt_4';
SELECT queuebox._relay_forward('aaaaaaaa-0000-0000-0000-000000000005', ARRAY[2]::bigint[], ARRAY['github.push'], NULL) AS forwarded;
SELECT id, state, hold FROM queuebox.inbox WHERE idempotency_key = 'evt_4';
SELECT id, source FROM queuebox._relay_claim(10, 60000, 'aaaaaaaa-0000-0000-0000-000000000006');
DELETE FROM queuebox.outbox;
DELETE FROM queuebox.inbox;
