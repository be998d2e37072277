-- The claim / settle / reclaim / retention statements, as the workers call
-- them, driven by hand: the outbox state machine.
TRUNCATE queuebox.outbox RESTART IDENTITY;
INSERT INTO queuebox.outbox (topic, key, payload, max_attempts) VALUES
  ('a', 'k1', '{"n": 1}', NULL),
  ('a', 'k1', '{"n": 2}', NULL),
  ('a', 'k2', '{"n": 3}', 3),
  ('a', NULL, '{"n": 4}', NULL),
  ('a', NULL, '{"n": 5}', NULL);
-- not yet due
INSERT INTO queuebox.outbox (topic, key, payload, scheduled_at)
  VALUES ('a', 'k3', '{"n": 6}', now() + interval '1 hour');

-- pending -> processing: one row per key, in id order; max_attempts NULL
-- takes the default passed in (outbox.maxAttempts)
SELECT id, key, payload, attempt, max_attempts
FROM queuebox._outbox_claim(100, 60000, 10, '11111111-1111-1111-1111-111111111111')
ORDER BY id;
SELECT id, state, claim_token, lease_until > now() AS leased FROM queuebox.outbox ORDER BY id;

-- a second claim finds nothing: k1's second row waits for the first
SELECT count(*) FROM queuebox._outbox_claim(100, 60000, 10, '22222222-2222-2222-2222-222222222222');

-- a settle with the wrong token changes nothing
SELECT queuebox._outbox_settle('22222222-2222-2222-2222-222222222222',
  ARRAY[1,3]::bigint[], ARRAY['sent','sent'], ARRAY[1,1], ARRAY[0,0]::bigint[], ARRAY[NULL,NULL]::text[]);
SELECT id, state FROM queuebox.outbox WHERE id IN (1, 3) ORDER BY id;

-- processing -> sent, -> pending (retry), -> dead, -> pending (release)
SELECT queuebox._outbox_settle('11111111-1111-1111-1111-111111111111',
  ARRAY[1,3,4,5]::bigint[], ARRAY['retry','dead','sent','release'],
  ARRAY[1,3,1,0], ARRAY[3600000,0,0,0]::bigint[],
  ARRAY['attempt 1 of 10 failed: HTTP 500', 'attempt 3 of 3 failed, none remain', NULL, 'released']);
SELECT id, key, state, attempt, scheduled_at > now() + interval '59 minutes' AS delayed,
       claim_token, lease_until, last_error
FROM queuebox.outbox ORDER BY id;

-- settling again with the same token changes nothing (already settled)
SELECT queuebox._outbox_settle('11111111-1111-1111-1111-111111111111',
  ARRAY[4]::bigint[], ARRAY['dead'], ARRAY[9], ARRAY[0]::bigint[], ARRAY['x']);

-- k1's first row is waiting for its retry: k1's second row stays blocked;
-- the released row 5 is claimable again
SELECT id FROM queuebox._outbox_claim(100, 60000, 10, '33333333-3333-3333-3333-333333333333') ORDER BY id;

-- reclaim: an expired lease goes back to pending, attempt unchanged
UPDATE queuebox.outbox SET lease_until = now() - interval '1 second' WHERE id = 5;
SELECT queuebox._outbox_reclaim(100);
SELECT id, state, attempt, claim_token, last_error FROM queuebox.outbox WHERE id = 5;
-- the old claimer's settle is fenced off
SELECT queuebox._outbox_settle('33333333-3333-3333-3333-333333333333',
  ARRAY[5]::bigint[], ARRAY['sent'], ARRAY[1], ARRAY[0]::bigint[], ARRAY[NULL]::text[]);
SELECT id, state FROM queuebox.outbox WHERE id = 5;

-- dead is final: nothing claims it; sent is final too
SELECT count(*) FROM queuebox._outbox_claim(100, 60000, 10, '44444444-4444-4444-4444-444444444444')
WHERE id IN (3, 4);

-- retention deletes old sent rows only
UPDATE queuebox.outbox SET created_at = now() - interval '8 days' WHERE id IN (3, 4);
SELECT queuebox._outbox_retention(7 * 86400, 1000);
SELECT id, state FROM queuebox.outbox ORDER BY id;

DELETE FROM queuebox.outbox;
