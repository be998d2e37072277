-- The claim / settle / promotion / reclaim / retention statements, as the
-- workers call them, driven by hand: the outbox state machine of schema
-- 0.2.0 (docs/design/claim.md).  A pending row is in one place: intake
-- (destination and hold NULL), ready (hold 'ready'), routed (destination
-- set, hold NULL), held behind its key (hold 'key') or for its destination
-- (hold 'destination').
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

-- where every row is
CREATE VIEW places AS
SELECT id, key, state, hold, destination, attempt,
       scheduled_at > now() + interval '59 minutes' AS delayed,
       right(claim_token::text, 4) AS token, lease_until > now() AS leased, last_error
FROM queuebox.outbox ORDER BY id;

-- The first claim reads intake in id order whatever scheduled_at says: row
-- 6 is claimed too, flagged not_due (the worker routes it back with
-- 'route').  k1's second row is not read: its key's first row was open
-- when it was inserted, so it went in parked (hold 'key', outbox_park.c)
-- and waits in no place a claim reads.  max_attempts NULL takes the
-- default passed in (outbox.maxAttempts).
SELECT id, key, payload, attempt, max_attempts, claimed, destination, in_intake, not_due, probe
FROM queuebox._outbox_claim(100, 60000, 10, '11111111-1111-1111-1111-111111111111')
ORDER BY id;
SELECT * FROM places;

-- a second claim finds nothing: the claimed rows are processing and the
-- parked row is in no place a claim reads
SELECT count(*) FROM queuebox._outbox_claim(100, 60000, 10, '22222222-2222-2222-2222-222222222222');

-- a settle with the wrong token changes nothing
SELECT queuebox._outbox_settle('22222222-2222-2222-2222-222222222222',
  ARRAY[1,3]::bigint[], ARRAY['sent','sent'], ARRAY[1,1], ARRAY[0,0]::bigint[], ARRAY[NULL,NULL]::text[]);
SELECT id, state, hold FROM queuebox.outbox WHERE id IN (1, 2, 3) ORDER BY id;

-- processing -> sent (k1's first row, routed to web: the promotion releases
-- k1's parked second row to ready, it was never routed), -> dead, ->
-- pending (retry, routed to web, due in an hour), -> pending (release:
-- never routed, to ready), -> pending (route: row 6 was not due; it is
-- routed to web and waits for its scheduled_at, attempt unchanged)
SELECT queuebox._outbox_settle('11111111-1111-1111-1111-111111111111',
  ARRAY[1,3,4,5,6]::bigint[], ARRAY['sent','dead','retry','release','route'],
  ARRAY[1,3,1,0,0], ARRAY[0,0,3600000,0,0]::bigint[],
  ARRAY[NULL, 'attempt 3 of 3 failed, none remain', 'attempt 1 of 10 failed: HTTP 500', 'released', NULL],
  ARRAY['web', 'web', 'web', NULL, 'web']);
SELECT * FROM places;

-- settling again with the same token changes nothing (already settled)
SELECT queuebox._outbox_settle('11111111-1111-1111-1111-111111111111',
  ARRAY[4]::bigint[], ARRAY['dead'], ARRAY[9], ARRAY[0]::bigint[], ARRAY['x']);

-- the next claim takes the promoted row 2 and the released row 5 from
-- ready (not from intake); nothing routed is asked for, so rows 4 and 6
-- stay where they are
SELECT id, key, claimed, in_intake, not_due
FROM queuebox._outbox_claim(100, 60000, 10, '33333333-3333-3333-3333-333333333333') ORDER BY id;
SELECT queuebox._outbox_settle('33333333-3333-3333-3333-333333333333',
  ARRAY[2,5]::bigint[], ARRAY['sent','sent'], ARRAY[1,1], ARRAY[0,0]::bigint[], ARRAY[NULL,NULL]::text[],
  ARRAY['web','web']);

-- A routed row is claimed only by a claim that asks its destination for
-- rows, and only once it is due.  Rows 4 and 6 are routed to web, not due:
-- asked or not, nothing comes.
SELECT count(*) FROM queuebox._outbox_claim(100, 60000, 10, '44444444-4444-4444-4444-444444444444',
  0, ARRAY['web'], ARRAY[10]);
-- due now: still nothing without web in destinations, nor for another
-- destination, nor with a limit of 0
UPDATE queuebox.outbox SET scheduled_at = now() - interval '1 second' WHERE id IN (4, 6);
SELECT count(*) FROM queuebox._outbox_claim(100, 60000, 10, '44444444-4444-4444-4444-444444444444');
SELECT count(*) FROM queuebox._outbox_claim(100, 60000, 10, '44444444-4444-4444-4444-444444444444',
  0, ARRAY['audit'], ARRAY[10]);
SELECT count(*) FROM queuebox._outbox_claim(100, 60000, 10, '44444444-4444-4444-4444-444444444444',
  0, ARRAY['web'], ARRAY[0]);
-- web with room for one: one row, in due order (row 4 is older)
SELECT id, claimed, destination, in_intake, attempt
FROM queuebox._outbox_claim(100, 60000, 10, '44444444-4444-4444-4444-444444444444',
  0, ARRAY['web'], ARRAY[1]);
SELECT id, claimed, destination, in_intake, attempt
FROM queuebox._outbox_claim(100, 60000, 10, '55555555-5555-5555-5555-555555555555',
  0, ARRAY['web'], ARRAY[10]);

-- 'hold': row 4 waits for its destination (an open circuit): held rows are
-- in no place a claim reads for its destinations
SELECT queuebox._outbox_settle('44444444-4444-4444-4444-444444444444',
  ARRAY[4]::bigint[], ARRAY['hold'], ARRAY[2], ARRAY[0]::bigint[], ARRAY['circuit open'], ARRAY['web']);
SELECT count(*) FROM queuebox._outbox_claim(100, 60000, 10, '66666666-6666-6666-6666-666666666666',
  0, ARRAY['web'], ARRAY[10]);
SELECT * FROM places WHERE id IN (4, 6);

-- Reclaim: an expired lease goes back to pending, attempt unchanged; a
-- routed row (6) stays routed.  The old claimer's settle is fenced off.
UPDATE queuebox.outbox SET lease_until = now() - interval '1 second' WHERE id = 6;
SELECT queuebox._outbox_reclaim(100);
SELECT * FROM places WHERE id = 6;
SELECT queuebox._outbox_settle('55555555-5555-5555-5555-555555555555',
  ARRAY[6]::bigint[], ARRAY['sent'], ARRAY[1], ARRAY[0]::bigint[], ARRAY[NULL]::text[], ARRAY['web']);
SELECT id, state FROM queuebox.outbox WHERE id = 6;
-- the next claim asking web takes it, and it is sent
SELECT id, claimed, destination FROM queuebox._outbox_claim(100, 60000, 10, '12121212-1212-1212-1212-121212121212',
  0, ARRAY['web'], ARRAY[10]);
SELECT queuebox._outbox_settle('12121212-1212-1212-1212-121212121212',
  ARRAY[6]::bigint[], ARRAY['sent'], ARRAY[1], ARRAY[0]::bigint[], ARRAY[NULL]::text[], ARRAY['web']);

-- An unrouted row whose lease expires goes to ready, not back to intake
-- (which claims read from their floor): claimed from ready next, even by a
-- claim whose floor is above it.
INSERT INTO queuebox.outbox (topic, payload) VALUES ('a', '{"n": 7}');
SELECT id, claimed, in_intake FROM queuebox._outbox_claim(100, 0, 10, '77777777-7777-7777-7777-777777777777',
  6, ARRAY['web'], ARRAY[10]) ORDER BY id;
SELECT pg_sleep(0.01);
SELECT queuebox._outbox_reclaim(100);
SELECT * FROM places WHERE id = 7;
SELECT queuebox._outbox_settle('77777777-7777-7777-7777-777777777777',
  ARRAY[7]::bigint[], ARRAY['sent'], ARRAY[1], ARRAY[0]::bigint[], ARRAY[NULL]::text[]);
SELECT id, claimed, in_intake FROM queuebox._outbox_claim(100, 60000, 10, '88888888-8888-8888-8888-888888888888',
  1000) ORDER BY id;

-- The intake floor: new rows at or below it are not read from intake
INSERT INTO queuebox.outbox (topic, payload) VALUES ('a', '{"n": 8}');
SELECT count(*) FROM queuebox._outbox_claim(100, 60000, 10, '99999999-9999-9999-9999-999999999999', 8);
SELECT id, claimed, in_intake FROM queuebox._outbox_claim(100, 60000, 10, '99999999-9999-9999-9999-999999999999', 7);

-- A routed row parked behind its key is released routed (hold NULL, not
-- ready): k5's dead first row is requeued (it keeps its id, so its place
-- in the key's order) while k5's second row waits for a retry.
INSERT INTO queuebox.outbox (topic, key, payload) VALUES ('a', 'k5', '{"n": 9}'), ('a', 'k5', '{"n": 10}');
SELECT id, claimed FROM queuebox._outbox_claim(1, 60000, 10, 'aaaaaaaa-aaaa-aaaa-aaaa-aaaaaaaaaaaa', 8);
SELECT queuebox._outbox_settle('aaaaaaaa-aaaa-aaaa-aaaa-aaaaaaaaaaaa',
  ARRAY[9]::bigint[], ARRAY['dead'], ARRAY[1], ARRAY[0]::bigint[], ARRAY['HTTP 400'], ARRAY['web']);
SELECT id, claimed FROM queuebox._outbox_claim(10, 60000, 10, 'aaaaaaaa-aaaa-aaaa-aaaa-aaaaaaaaaaaa', 8);
SELECT queuebox._outbox_settle('aaaaaaaa-aaaa-aaaa-aaaa-aaaaaaaaaaaa',
  ARRAY[10]::bigint[], ARRAY['retry'], ARRAY[1], ARRAY[0]::bigint[], ARRAY['HTTP 500'], ARRAY['web']);
SELECT queuebox.requeue_outbox(9);
SELECT * FROM places WHERE key = 'k5';
-- one claim: 9 from ready (claimed), 10 routed and due but behind 9 (parked)
SELECT id, claimed, destination FROM queuebox._outbox_claim(10, 60000, 10, 'bbbbbbbb-bbbb-bbbb-bbbb-bbbbbbbbbbbb',
  1000, ARRAY['web'], ARRAY[10]) ORDER BY id;
SELECT * FROM places WHERE key = 'k5';
-- a retry of 9 does not end it: 10 stays parked
SELECT queuebox._outbox_settle('bbbbbbbb-bbbb-bbbb-bbbb-bbbbbbbbbbbb',
  ARRAY[9]::bigint[], ARRAY['retry'], ARRAY[1], ARRAY[0]::bigint[], ARRAY['HTTP 500'], ARRAY['web']);
SELECT * FROM places WHERE key = 'k5';
SELECT id, claimed FROM queuebox._outbox_claim(10, 60000, 10, 'cccccccc-cccc-cccc-cccc-cccccccccccc',
  1000, ARRAY['web'], ARRAY[10]) ORDER BY id;
-- 9 sent: 10 is promoted routed (hold NULL), and the next claim asking web takes it
SELECT queuebox._outbox_settle('cccccccc-cccc-cccc-cccc-cccccccccccc',
  ARRAY[9]::bigint[], ARRAY['sent'], ARRAY[2], ARRAY[0]::bigint[], ARRAY[NULL]::text[], ARRAY['web']);
SELECT * FROM places WHERE key = 'k5';
SELECT id, claimed, destination, attempt FROM queuebox._outbox_claim(10, 60000, 10, 'dddddddd-dddd-dddd-dddd-dddddddddddd',
  1000, ARRAY['web'], ARRAY[10]) ORDER BY id;

-- dead and sent are final: nothing claims them
SELECT count(*) FROM queuebox._outbox_claim(100, 60000, 10, 'eeeeeeee-eeee-eeee-eeee-eeeeeeeeeeee',
  0, ARRAY['web'], ARRAY[100])
WHERE id IN (1, 2, 3, 5);

-- retention deletes old sent rows only
UPDATE queuebox.outbox SET created_at = now() - interval '8 days' WHERE id IN (2, 3);
SELECT queuebox._outbox_retention(7 * 86400, 1000);
SELECT id, state FROM queuebox.outbox ORDER BY id;

-- retention walks the rows in id order and takes $2 of those it deletes and
-- those too young to be: a young row ends the batch, an old row it keeps
-- (dead, or dated in the future) is passed; a row older than one before it
-- is deleted once the walk reaches it
DELETE FROM queuebox.outbox;
INSERT INTO queuebox.outbox (topic, payload)
SELECT 'r', jsonb_build_object('n', g) FROM generate_series(1, 6) g;
UPDATE queuebox.outbox SET state = CASE payload->>'n' WHEN '1' THEN 'dead' ELSE 'sent' END,
  created_at = now() - CASE payload->>'n' WHEN '3' THEN interval '1 day'
                                         WHEN '5' THEN interval '-1 day' ELSE interval '8 days' END;
SELECT queuebox._outbox_retention(7 * 86400, 2);
SELECT payload->>'n' AS n, state FROM queuebox.outbox ORDER BY id;
SELECT queuebox._outbox_retention(7 * 86400, 1000);
SELECT payload->>'n' AS n, state FROM queuebox.outbox ORDER BY id;

-- the floor ($3; the two-argument function above leaves it NULL: from the
-- start): a batch walks the ids after it and answers the highest it took,
-- which the engine passes to the next batch of the run, so the next batch
-- does not read the dead row 1 again.  A new run starts from the start: row
-- 1, requeued and sent after the run passed it, goes in the next run.
-- (walked_n: the row the id is, by its n)
\set ret_sql `printf '#include "qb_sql_pg.h"\nQB_PG_OUTBOX_RETENTION\n' | cpp -P -Isrc/common/pgsql - | tr -d '\n' | sed 's/" *"//g; s/^ *"//; s/" *$//'`
PREPARE ret(int8, int4, int8) AS :ret_sql;
DELETE FROM queuebox.outbox;
INSERT INTO queuebox.outbox (topic, payload)
SELECT 'r', jsonb_build_object('n', g) FROM generate_series(1, 6) g;
UPDATE queuebox.outbox SET state = CASE WHEN payload->>'n' IN ('1', '4') THEN 'dead' ELSE 'sent' END,
  created_at = now() - CASE payload->>'n' WHEN '6' THEN interval '1 day' ELSE interval '8 days' END;
SELECT min(id) - 1 AS base FROM queuebox.outbox \gset
EXECUTE ret(7 * 86400, 2, 0) \gset r_
SELECT :r_deleted AS deleted, :r_walked - :base AS walked_n;
EXECUTE ret(7 * 86400, 2, :r_walked) \gset r_
SELECT :r_deleted AS deleted, :r_walked - :base AS walked_n;
SELECT payload->>'n' AS n, state FROM queuebox.outbox ORDER BY id;
UPDATE queuebox.outbox SET state = 'sent' WHERE payload->>'n' = '1';
-- the same run past its floor: nothing left to take
EXECUTE ret(7 * 86400, 2, :r_walked);
-- the next run
EXECUTE ret(7 * 86400, 2, 0) \gset r_
SELECT :r_deleted AS deleted, :r_walked - :base AS walked_n;
SELECT payload->>'n' AS n, state FROM queuebox.outbox ORDER BY id;
DEALLOCATE ret;

DROP VIEW places;
DELETE FROM queuebox.outbox;
