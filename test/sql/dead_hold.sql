-- onDead: holdKey (docs/design/claim.md, "A dead head that holds its key"):
-- a row settled 'dead-hold' stays dead with hold 'dead' and keeps its
-- key's later rows parked, through claims, promotions and new rows, until
-- requeue_outbox (as is, or edited and audited) or skip_outbox releases
-- them; 'dead' still releases the key at once.
TRUNCATE queuebox.outbox RESTART IDENTITY;
TRUNCATE queuebox.outbox_audit RESTART IDENTITY;
INSERT INTO queuebox.outbox (topic, key, payload) VALUES
  ('a', 'k', '{"n": 1}'), ('a', 'k', '{"n": 2}'), ('a', 'k', '{"n": 3}'),
  ('a', NULL, '{"n": 4}');

CREATE VIEW places AS
SELECT id, key, state, hold, attempt, payload, last_error
FROM queuebox.outbox ORDER BY id;

-- row 1 claimed, 4 (no key) claimed; 2 and 3 went in parked behind 1
-- (their key's first row was open when they were inserted)
SELECT id, claimed FROM queuebox._outbox_claim(100, 60000, 10, '11111111-1111-1111-1111-111111111111')
ORDER BY id;

-- rows 1 and 4 die under holdKey: 1 keeps its key (hold 'dead'), 4 has no
-- key to keep and is a plain dead row; the promotion releases nothing
SELECT queuebox._outbox_settle('11111111-1111-1111-1111-111111111111',
  ARRAY[1,4]::bigint[], ARRAY['dead-hold','dead-hold'], ARRAY[10,10], ARRAY[0,0]::bigint[],
  ARRAY['HTTP 500, no attempt left', 'HTTP 500, no attempt left'], ARRAY['web','web']);
SELECT * FROM places;

-- both still parked
SELECT count(*) FROM queuebox.outbox WHERE state = 'pending' AND hold = 'key';

-- a new row of the key goes in parked behind the dead head (at insert); the next claim takes nothing
INSERT INTO queuebox.outbox (topic, key, payload) VALUES ('a', 'k', '{"n": 5}');
SELECT id, claimed FROM queuebox._outbox_claim(100, 60000, 10, '22222222-2222-2222-2222-222222222222')
ORDER BY id;
SELECT id, state, hold FROM queuebox.outbox WHERE id = 5;

-- the held key, its head and what waits behind it
SELECT key, head_id, head_state, behind, since IS NOT NULL AS since_known FROM queuebox.held_keys();

-- skip and an edited requeue refuse rows that are not dead: nothing changes
SELECT queuebox.skip_outbox(2), queuebox.skip_outbox(4), queuebox.requeue_outbox(2, '{"x": 1}');
SELECT count(*) FROM queuebox.outbox_audit;

-- requeue row 1 with an edited payload: pending, first of its key again;
-- the edit is audited (who, when, before, after)
SELECT queuebox.requeue_outbox(1, '{"n": 10}');
SELECT id, state, hold, attempt, payload FROM queuebox.outbox WHERE id = 1;
SELECT outbox_id, action, done_by = current_user AS by_me, done_at > now() - interval '1 minute' AS recent,
       payload_before, payload_after FROM queuebox.outbox_audit ORDER BY id;
SELECT count(*) FROM queuebox.held_keys();

-- the next claim takes row 1 (from ready); 2, 3 and 5 stay parked
SELECT id, claimed FROM queuebox._outbox_claim(100, 60000, 10, '33333333-3333-3333-3333-333333333333')
ORDER BY id;
-- sent: row 2 is promoted, claimed, and dies again under holdKey
SELECT queuebox._outbox_settle('33333333-3333-3333-3333-333333333333',
  ARRAY[1]::bigint[], ARRAY['sent'], ARRAY[1], ARRAY[0]::bigint[], ARRAY[NULL]::text[], ARRAY['web']);
SELECT id, claimed FROM queuebox._outbox_claim(100, 60000, 10, '44444444-4444-4444-4444-444444444444')
ORDER BY id;
SELECT queuebox._outbox_settle('44444444-4444-4444-4444-444444444444',
  ARRAY[2]::bigint[], ARRAY['dead-hold'], ARRAY[10], ARRAY[0]::bigint[], ARRAY['HTTP 400'], ARRAY['web']);
SELECT * FROM places;

-- skip row 2: it stays dead, its key goes on (row 3 released), audited
SELECT queuebox.skip_outbox(2);
SELECT queuebox.skip_outbox(2);
SELECT * FROM places;
SELECT outbox_id, action, payload_before, payload_after FROM queuebox.outbox_audit ORDER BY id;

-- release (plain 'dead', the default) lets the key go on at once
SELECT id, claimed FROM queuebox._outbox_claim(100, 60000, 10, '55555555-5555-5555-5555-555555555555')
ORDER BY id;
SELECT queuebox._outbox_settle('55555555-5555-5555-5555-555555555555',
  ARRAY[3]::bigint[], ARRAY['dead'], ARRAY[10], ARRAY[0]::bigint[], ARRAY['HTTP 500'], ARRAY['web']);
SELECT id, state, hold FROM queuebox.outbox WHERE id IN (3, 5) ORDER BY id;
SELECT count(*) FROM queuebox.held_keys();

-- the claim's blocker probe still uses the open-rows index
SET enable_seqscan = off;
EXPLAIN (COSTS OFF) SELECT id FROM queuebox.outbox e
WHERE e.key = 'k' AND coalesce(e.destination, '') = 'web' AND coalesce(e.origin, e.id) < 9
  AND (e.state IN ('pending', 'processing') OR e.hold = 'dead')
ORDER BY coalesce(e.origin, e.id) DESC LIMIT 1;
RESET enable_seqscan;

DROP VIEW places;
TRUNCATE queuebox.outbox RESTART IDENTITY;
TRUNCATE queuebox.outbox_audit RESTART IDENTITY;

-- Every requeue is audited: one row by id, and each row of a bulk requeue
INSERT INTO queuebox.outbox (topic, key, payload, state) VALUES
  ('a', 'k', '{"n": 1}', 'dead'), ('b', 'k', '{"n": 2}', 'dead'), ('b', NULL, '{"n": 3}', 'dead');
SELECT queuebox.requeue_outbox(1), queuebox.requeue_outbox(1);
SELECT queuebox.requeue_outbox('b');
SELECT outbox_id, action, done_by = current_user AS by_me, payload_before, payload_after
FROM queuebox.outbox_audit ORDER BY id;
TRUNCATE queuebox.outbox RESTART IDENTITY;
TRUNCATE queuebox.outbox_audit RESTART IDENTITY;

-- onDead: holdKey in the relay's aggregate order: a push row the forward
-- settles dead with holds[i] (its source's onDead: holdKey) stays dead
-- with hold 'dead' and keeps its aggregate's later push rows parked, new
-- ones too, until requeue_inbox (as is, or edited and audited) or
-- skip_inbox; without holds a dead row releases its aggregate as before.
TRUNCATE queuebox.inbox RESTART IDENTITY;
TRUNCATE queuebox.inbox_audit RESTART IDENTITY;
INSERT INTO queuebox.inbox (source, idempotency_key, event_type, aggregate_id, payload, consumption, created_at) VALUES
  ('s', 'e1', 'x', 'a', '{"n": 1}', 'push', now() - interval '5 min'),
  ('t', 'e2', 'x', 'a', '{"n": 2}', 'push', now() - interval '4 min'),
  ('s', 'e3', 'x', 'a', '{"n": 3}', 'push', now() - interval '3 min'),
  ('s', 'e4', 'x', 'b', '{"n": 4}', 'push', now() - interval '2 min');

CREATE VIEW inbox_places AS
SELECT id, aggregate_id, state, hold, payload, claim_token IS NOT NULL AS claimed
FROM queuebox.inbox ORDER BY id;

-- 1 and 4 claimed, 2 and 3 parked behind 1
SELECT id FROM queuebox._relay_claim(100, 60000, 'aaaaaaaa-1111-0000-0000-000000000001') ORDER BY id;
-- 1's topic rendered empty and its source holds: dead, hold 'dead'; 4 forwarded
SELECT queuebox._relay_forward('aaaaaaaa-1111-0000-0000-000000000001',
  ARRAY[1, 4]::bigint[], ARRAY['', 'x'], NULL, ARRAY[true, true]);
SELECT * FROM inbox_places;

-- a new row of the aggregate is parked behind the dead head; nothing is claimed
INSERT INTO queuebox.inbox (source, idempotency_key, event_type, aggregate_id, payload, consumption)
VALUES ('s', 'e5', 'x', 'a', '{"n": 5}', 'push');
SELECT count(*) AS claimed FROM queuebox._relay_claim(100, 60000, 'aaaaaaaa-1111-0000-0000-000000000002');
SELECT id, state, hold FROM queuebox.inbox WHERE id = 5;

-- the held aggregate, its head and what waits behind it
SELECT aggregate_id, source, head_id, behind, since IS NOT NULL AS since_known
FROM queuebox.held_aggregates();

-- skip and an edited requeue refuse rows that are not dead: nothing changes
SELECT queuebox.skip_inbox(2), queuebox.skip_inbox(4), queuebox.requeue_inbox(2, '{"x": 1}');
SELECT count(*) FROM queuebox.inbox_audit;

-- requeue row 1 edited: pending, first of its aggregate again, audited
SELECT queuebox.requeue_inbox(1, '{"n": 10}');
SELECT * FROM inbox_places;
SELECT inbox_id, action, done_by = current_user AS by_me, done_at > now() - interval '1 minute' AS recent,
       payload_before, payload_after FROM queuebox.inbox_audit ORDER BY id;
SELECT count(*) FROM queuebox.held_aggregates();

-- the next claim takes row 1 only; it dies again, holding
SELECT id FROM queuebox._relay_claim(100, 60000, 'aaaaaaaa-1111-0000-0000-000000000003') ORDER BY id;
SELECT queuebox._relay_forward('aaaaaaaa-1111-0000-0000-000000000003',
  ARRAY[1]::bigint[], ARRAY[''], NULL, ARRAY[true]);
SELECT * FROM inbox_places;

-- skip row 1: it stays dead, its aggregate goes on (row 2 released), audited
SELECT queuebox.skip_inbox(1);
SELECT queuebox.skip_inbox(1);
SELECT * FROM inbox_places;
SELECT inbox_id, action, payload_before, payload_after FROM queuebox.inbox_audit ORDER BY id;

-- 2 forwarded, its promotion releases 3; 3 dies without holds (release,
-- the default): 5 is released at once
SELECT id FROM queuebox._relay_claim(100, 60000, 'aaaaaaaa-1111-0000-0000-000000000004') ORDER BY id;
SELECT queuebox._relay_forward('aaaaaaaa-1111-0000-0000-000000000004', ARRAY[2]::bigint[], ARRAY['x'], NULL);
SELECT id FROM queuebox._relay_claim(100, 60000, 'aaaaaaaa-1111-0000-0000-000000000005') ORDER BY id;
SELECT queuebox._relay_forward('aaaaaaaa-1111-0000-0000-000000000005',
  ARRAY[3]::bigint[], ARRAY[''], NULL, ARRAY[false]);
SELECT * FROM inbox_places;
SELECT count(*) FROM queuebox.held_aggregates();
SELECT topic, key, payload FROM queuebox.outbox ORDER BY id;

-- plain and bulk inbox requeues are audited, one row each
SELECT queuebox.requeue_inbox(3);
UPDATE queuebox.inbox SET state = 'dead' WHERE id IN (1, 3);
SELECT queuebox.requeue_inbox('s');
SELECT inbox_id, action, payload_before, payload_after FROM queuebox.inbox_audit ORDER BY id;

-- the relay claim's blocker probe still uses the push aggregate index
SET enable_seqscan = off;
EXPLAIN (COSTS OFF) SELECT e.id FROM queuebox.inbox e
WHERE e.consumption = 'push' AND e.aggregate_id = 'a'
  AND (e.state IN ('pending', 'processing') OR e.hold = 'dead')
  AND (e.created_at, e.id) < (now(), 9)
ORDER BY e.created_at DESC, e.id DESC LIMIT 1;
RESET enable_seqscan;

DROP VIEW inbox_places;
TRUNCATE queuebox.outbox RESTART IDENTITY;
TRUNCATE queuebox.inbox RESTART IDENTITY;
TRUNCATE queuebox.inbox_audit RESTART IDENTITY;
