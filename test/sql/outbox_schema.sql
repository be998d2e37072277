-- The outbox table, its constraints and enqueue().
CREATE EXTENSION queuebox;

\d queuebox.outbox
-- each destination's circuit breaker, shared by every worker
\d queuebox.destination_state

-- enqueue() inserts a pending row with defaults and returns its id
SELECT queuebox.enqueue('orders.created', '{"id": 1}', 'customer-42',
                        '{"X-Correlation-Id": "c-1"}') > 0 AS enqueued;
SELECT topic, key, payload, headers, state, attempt, max_attempts,
       message_id IS NOT NULL AS has_message_id,
       scheduled_at <= now() AS due, claim_token, lease_until, last_error
FROM queuebox.outbox;

-- a plain INSERT is the same thing
INSERT INTO queuebox.outbox (topic, payload) VALUES ('orders.paid', '{"id": 2}');
SELECT topic, key, headers, state FROM queuebox.outbox ORDER BY id;

-- message ids are unique per row
SELECT count(DISTINCT message_id) = count(*) AS distinct_ids FROM queuebox.outbox;

-- CHECK constraints name the four states and nothing else
-- (terse: the DETAIL would print the row's random message_id)
\set VERBOSITY terse
INSERT INTO queuebox.outbox (topic, payload, state) VALUES ('t', '{}', 'failed');
INSERT INTO queuebox.outbox (topic, payload, state) VALUES ('t', '{}', 'processed');
UPDATE queuebox.outbox SET state = 'sent' WHERE topic = 'orders.paid';
UPDATE queuebox.outbox SET state = 'done' WHERE topic = 'orders.paid';
-- other refusals
INSERT INTO queuebox.outbox (topic, payload) VALUES ('', '{}');
INSERT INTO queuebox.outbox (topic, payload) VALUES (NULL, '{}');
INSERT INTO queuebox.outbox (topic, payload) VALUES ('t', NULL);
INSERT INTO queuebox.outbox (topic, payload) VALUES ('t', 'not json');
INSERT INTO queuebox.outbox (topic, payload, headers) VALUES ('t', '{}', '[1]');
INSERT INTO queuebox.outbox (topic, payload, max_attempts) VALUES ('t', '{}', 0);
INSERT INTO queuebox.outbox (topic, payload, attempt) VALUES ('t', '{}', -1);
INSERT INTO queuebox.outbox (id, topic, payload) VALUES (99, 't', '{}');
-- hold names the three reasons a pending row waits, and nothing else
INSERT INTO queuebox.outbox (topic, payload, hold) VALUES ('t', '{}', 'parked');
INSERT INTO queuebox.destination_state (destination, state) VALUES ('web', 'broken');
INSERT INTO queuebox.destination_state (destination, failures) VALUES ('web', -1);
\set VERBOSITY default
SELECT count(*) AS rows_after_refusals FROM queuebox.outbox;

-- Each part of the claim reads its own partial index, never a scan of
-- sent rows or of held ones.  The statements are the workers' own text,
-- read from src/common/pgsql/qb_sql_pg.h (pg_regress runs in the tree), planned
-- with their parameters as the SQL wrappers run them; plans after ANALYZE
-- of an outbox that is mostly sent and held rows, with a few rows in each
-- place the claim reads.
\set VERBOSITY terse
INSERT INTO queuebox.outbox (topic, key, payload, state, destination)
  SELECT 't', 'k' || (i % 100), '{}', 'sent', 'web' FROM generate_series(1, 20000) i;
INSERT INTO queuebox.outbox (topic, key, payload, hold, destination)
  SELECT 't', 'h' || (i % 100), '{}', 'key', CASE WHEN i % 2 = 0 THEN 'web' END FROM generate_series(1, 2000) i;
INSERT INTO queuebox.outbox (topic, key, payload, hold, destination)
  SELECT 't', NULL, '{}', 'destination', 'web' FROM generate_series(1, 2000) i;
INSERT INTO queuebox.outbox (topic, key, payload, hold, destination)
  SELECT 't', 'r' || i, '{}', CASE i % 3 WHEN 0 THEN 'ready' END,
         CASE i % 3 WHEN 1 THEN 'web' END
  FROM generate_series(1, 30) i;
INSERT INTO queuebox.outbox (topic, key, payload, hold, destination)
  SELECT 't', 'n' || i, '{}', 'intake', 'web' FROM generate_series(1, 30) i;
ANALYZE queuebox.outbox;
SELECT state, hold, destination IS NOT NULL AS routed, count(*)
FROM queuebox.outbox GROUP BY 1, 2, 3 ORDER BY 1, 2, 3;

-- scans(name, args[, run]): the scans of queuebox.outbox in the plan of
-- prepared statement name with these arguments, under the CTE each is in (a
-- scan of the whole outbox would show as a Seq Scan or Bitmap Heap Scan);
-- run: executed (EXPLAIN ANALYZE), with how many times each scan ran
CREATE FUNCTION pg_temp.scans(stmt text, args text, run boolean DEFAULT false) RETURNS SETOF text
LANGUAGE plpgsql AS $f$
DECLARE
  l text;
BEGIN
  FOR l IN EXECUTE format('EXPLAIN (%s) EXECUTE %s(%s)',
                          CASE WHEN run THEN 'ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF' ELSE 'COSTS OFF' END,
                          stmt, args) LOOP
    IF l ~ '^ *CTE \w+$' OR l ~ 'Scan.* on outbox ' THEN
      RETURN NEXT rtrim(regexp_replace(regexp_replace(l, '->  ', ''), '\(actual rows=[0-9.]+ ', '('));
    END IF;
  END LOOP;
END $f$;

-- the claim's two texts are made of shared parts: the C preprocessor joins them
\set claim_sql `printf '#include "qb_sql_pg.h"\nQB_PG_OUTBOX_CLAIM\n' | cpp -P -Isrc/common/pgsql - | tr -d '\n' | sed 's/" *"//g; s/^ *"//; s/" *$//'`
\set claim_np_sql `printf '#include "qb_sql_pg.h"\nQB_PG_OUTBOX_CLAIM_NO_PROBE\n' | cpp -P -Isrc/common/pgsql - | tr -d '\n' | sed 's/" *"//g; s/^ *"//; s/" *$//'`
PREPARE claim(int, bigint, int, uuid, bigint, text[], int[], text[], bigint[], bigint) AS :claim_sql;
PREPARE claim_np(int, bigint, int, uuid, bigint, text[], int[], text[], bigint[], bigint) AS :claim_np_sql;
-- per destination its routed rows (outbox_routed_idx) then its intake from
-- its floor (outbox_dest_intake_idx), the unrouted intake
-- (outbox_intake_idx from the floor), ready (outbox_ready_idx), the
-- probe's held, routed or intake row (outbox_held_idx, outbox_routed_idx,
-- outbox_dest_intake_idx), each candidate's blocker (outbox_key_open_idx),
-- the blockers' locks and the update by primary key; the custom plan, then
-- the generic one (the workers' and the daemon's: qb_pg_session_settings)
SELECT * FROM pg_temp.scans('claim',
  $$100, 60000, 10, '11111111-1111-1111-1111-111111111111', 0, ARRAY['web'], ARRAY[100], ARRAY['web'], ARRAY[0]::bigint[], 0$$);
SET plan_cache_mode = force_generic_plan;
SELECT * FROM pg_temp.scans('claim',
  $$100, 60000, 10, '11111111-1111-1111-1111-111111111111', 0, ARRAY['web'], ARRAY[100], ARRAY['web'], ARRAY[0]::bigint[], 0$$);
-- the claim with no probe asked for (the workers' usual one): the same
-- scans without the probe's three
SELECT * FROM pg_temp.scans('claim_np',
  $$100, 60000, 10, '11111111-1111-1111-1111-111111111111', 0, ARRAY['web'], ARRAY[100], ARRAY[]::text[], ARRAY[0]::bigint[], 0$$);

-- the promotion is made of macros (QB_PG_OUTBOX_BLOCKER): the preprocessor puts it together
\set promote_sql `printf '#include "qb_sql_pg.h"\nQB_PG_OUTBOX_PROMOTE\n' | cpp -P -Isrc/common/pgsql - | tr -d '\n' | sed 's/" *"//g; s/^ *"//; s/" *$//'`
PREPARE promote(text[], uuid, bigint, int, bigint, text[]) AS :promote_sql;
-- the promotion: the first open row of each key (outbox_key_open_idx, one seek; a second,
-- at the ended row's destination, only when that row is not routed or is at another
-- destination), claimed with the cycle's token; of a row that had no destination, the
-- first at each destination, each checked for what else holds it back
SELECT * FROM pg_temp.scans('promote', $$ARRAY['h1', 'h2'], '11111111-1111-1111-1111-111111111111', 60000, 10, 0, ARRAY['web', NULL]$$);

-- the promotion claims a released row at once only when nothing of its key is in flight
-- before it: a fan-out row's copies at A (in flight) and B (sent), and R, of the same key,
-- not routed yet, parked.  B's promotion releases R (only rows not in flight hold a row
-- not routed yet back at a promotion) but leaves it for the claim to look at again:
-- claimed here, it would go out beside A.  Once A is sent, A's promotion claims it.
BEGIN;
CREATE TEMP TABLE keep_outbox AS SELECT * FROM queuebox.outbox;
DELETE FROM queuebox.outbox;
INSERT INTO queuebox.outbox (topic, key, payload, destination, state, hold, claim_token, lease_until)
VALUES ('f', 'pk', '"A"', 'A', 'processing', 'ready', '22222222-2222-2222-2222-222222222222', now() + interval '1 minute');
UPDATE queuebox.outbox SET origin = id, hold = NULL WHERE key = 'pk';
INSERT INTO queuebox.outbox (topic, key, payload, destination, state, origin)
VALUES ('f', 'pk', '"B"', 'B', 'sent', (SELECT min(id) FROM queuebox.outbox WHERE key = 'pk'));
INSERT INTO queuebox.outbox (topic, key, payload, hold) VALUES ('f', 'pk', '"R"', 'key');
\o /dev/null
EXECUTE promote(ARRAY['pk'], '11111111-1111-1111-1111-111111111111', 60000, 10, 0, ARRAY['B']);
\o
SELECT payload::text, state, hold, claim_token IS NOT NULL AS claimed FROM queuebox.outbox WHERE key = 'pk' ORDER BY id;
UPDATE queuebox.outbox SET state = 'sent', claim_token = NULL, lease_until = NULL WHERE payload::text = '"A"' AND key = 'pk';
UPDATE queuebox.outbox SET hold = 'key' WHERE payload::text = '"R"' AND key = 'pk';
\o /dev/null
EXECUTE promote(ARRAY['pk'], '11111111-1111-1111-1111-111111111111', 60000, 10, 0, ARRAY['A']);
\o
SELECT payload::text, state, hold, claim_token IS NOT NULL AS claimed FROM queuebox.outbox WHERE key = 'pk' ORDER BY id;
ROLLBACK;

-- the promotion's first seek finds the first open row of the key wherever it waits; the
-- second, at the ended row's destination, runs only when that first row is not routed or
-- waits at another destination.  A row at B ended (sent) in each key; the key's parked row
-- at B is released and claimed when nothing before it at B or not routed is open:
--   q1: the first open row waits at A (before B): B's parked row is found by the second seek
--   q2: the first open row is not routed and before B's parked row: it holds that row back
--   q3: a row not routed is open, after B's parked row: the parked row goes
--   q4: the first open row is B's parked row (a row at C waits after it)
-- and keys with no parked row, as the daemon's are (it parks only at a claim): their
-- promotion asks outbox_parked_idx once and makes no second seek, nor the check of what
-- holds a row not routed back (those scans never run):
--   q5: the first open row is not routed, not parked
--   q6: the first open row waits at A, not parked
-- and keys whose ended row had no destination when claimed (the daemon routes at the
-- claim), each parked row that is first where it waits released:
--   q7: parked rows at B and at C
--   q8: a parked row not routed yet
BEGIN;
DELETE FROM queuebox.outbox;
-- the rows as written, not parked at insert
SET LOCAL session_replication_role = replica;
INSERT INTO queuebox.outbox (topic, key, payload, destination, state, hold)
VALUES ('q', 'q1', '"A open"', 'A', 'pending', NULL),
       ('q', 'q1', '"B sent"', 'B', 'sent', NULL),
       ('q', 'q1', '"B parked"', 'B', 'pending', 'key'),
       ('q', 'q2', '"not routed"', NULL, 'pending', NULL),
       ('q', 'q2', '"B sent"', 'B', 'sent', NULL),
       ('q', 'q2', '"B parked"', 'B', 'pending', 'key'),
       ('q', 'q3', '"B sent"', 'B', 'sent', NULL),
       ('q', 'q3', '"B parked"', 'B', 'pending', 'key'),
       ('q', 'q3', '"not routed"', NULL, 'pending', NULL),
       ('q', 'q4', '"B sent"', 'B', 'sent', NULL),
       ('q', 'q4', '"B parked"', 'B', 'pending', 'key'),
       ('q', 'q4', '"C open"', 'C', 'pending', NULL),
       ('q', 'q5', '"B sent"', 'B', 'sent', NULL),
       ('q', 'q5', '"not routed"', NULL, 'pending', NULL),
       ('q', 'q5', '"not routed"', NULL, 'pending', NULL),
       ('q', 'q6', '"B sent"', 'B', 'sent', NULL),
       ('q', 'q6', '"A open"', 'A', 'pending', NULL),
       ('q', 'q7', '"B sent"', 'B', 'sent', NULL),
       ('q', 'q7', '"B parked"', 'B', 'pending', 'key'),
       ('q', 'q7', '"C parked"', 'C', 'pending', 'key'),
       ('q', 'q8', '"B sent"', 'B', 'sent', NULL),
       ('q', 'q8', '"parked"', NULL, 'pending', 'key');
RESET session_replication_role;
\o /dev/null
EXECUTE promote(ARRAY['q1', 'q2', 'q3', 'q4', 'q7', 'q8'], '11111111-1111-1111-1111-111111111111', 60000, 10, 0, ARRAY['B', 'B', 'B', 'B', NULL, NULL]);
\o
SELECT * FROM pg_temp.scans('promote', $$ARRAY['q5', 'q6'], '11111111-1111-1111-1111-111111111111', 60000, 10, 0, ARRAY['B', 'B']$$, true);
-- and the same keys as if their ended row had had no destination when claimed (the
-- daemon's, routed at their claim): every destination would be looked at, but for
-- outbox_parked_idx nothing is
SELECT * FROM pg_temp.scans('promote', $$ARRAY['q5', 'q6'], '11111111-1111-1111-1111-111111111111', 60000, 10, 0, ARRAY[NULL, NULL]::text[]$$, true);
SELECT key, payload::text, state, hold, claim_token IS NOT NULL AS claimed FROM queuebox.outbox ORDER BY id;
ROLLBACK;

\set unpark_sql `sed -n '/^#define QB_PG_OUTBOX_UNPARK /,/^$/p' src/common/pgsql/qb_sql_pg.h | sed -n 's/^[^"]*"\(.*\)"[^"]*$/\1/p' | tr -d '\n'`
PREPARE unpark(text[], int) AS :unpark_sql;
-- the unpark: a destination's held rows (outbox_held_idx), then those rows
-- by id: through the primary key, or through outbox_held_idx where the
-- planner costs that lower, as 17 and 18 do with this few held rows (their
-- btree reads an array of ids in one pass); with 20,000 held rows and
-- more, 15, 17 and 18 all take the key
SELECT regexp_replace(s, 'using outbox_(pkey|held_idx) on outbox o$', 'using outbox_pkey or outbox_held_idx on outbox o') AS scans
FROM pg_temp.scans('unpark', $$ARRAY['web'], 1000$$) s;
RESET plan_cache_mode;
DEALLOCATE ALL;
\set VERBOSITY default

DELETE FROM queuebox.outbox;
