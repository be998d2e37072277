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

-- row 1 claimed, 2 and 3 parked behind it, 4 (no key) claimed
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

-- a new row of the key is parked behind the dead head by the next claim
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
WHERE e.key = 'k' AND e.id < 9 AND (e.state IN ('pending', 'processing') OR e.hold = 'dead')
ORDER BY e.id DESC LIMIT 1;
RESET enable_seqscan;

DROP VIEW places;
TRUNCATE queuebox.outbox RESTART IDENTITY;
TRUNCATE queuebox.outbox_audit RESTART IDENTITY;
