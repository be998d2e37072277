-- The circuit breaker of each destination (queuebox.destination_state),
-- driven by hand through the workers' statements: _outbox_breaker (a
-- settle's attempts counted), _outbox_states (the claim's view, and the
-- half-open probe), _outbox_unpark, and the operator's
-- destination_status(), resume_destination() and outbox_stats.circuit.
-- No timing is asserted: cooldowns are long, and a cooldown that is over is
-- made so by moving probe_at into the past.
TRUNCATE queuebox.outbox RESTART IDENTITY;
TRUNCATE queuebox.destination_state;
SELECT queuebox.configure($yaml$
destinations:
  web: { type: http, baseUrl: "http://127.0.0.1:9000" }
  audit: { type: http, baseUrl: "http://127.0.0.1:9001" }
routes:
  - { topicPattern: "orders.**", destination: web }
  - { topicPattern: "audit.*", destination: audit }
$yaml$);

CREATE VIEW circuit AS
SELECT destination, state, failures, opened_at IS NOT NULL AS opened,
       probe_at > now() AS probe_later, paused_until > now() AS paused, last_error
FROM queuebox.destination_state ORDER BY destination;

-- breaker(d, ok, failed, gone, retry_after_ms, error): one destination's
-- tally, circuitBreaker.failures 3, cooldownMs one hour
CREATE FUNCTION pg_temp.breaker(d text, ok int, failed int, gone boolean DEFAULT false,
                                retry_after_ms bigint DEFAULT 0, error text DEFAULT NULL)
RETURNS TABLE (destination text, old_state text, new_state text, paused boolean, written bigint)
LANGUAGE sql AS $$
  SELECT * FROM queuebox._outbox_breaker(ARRAY[d], ARRAY[ok], ARRAY[failed], ARRAY[gone],
    ARRAY[retry_after_ms], ARRAY[error], ARRAY[3], ARRAY[3600000]::bigint[])
$$;

-- ---- closed -> open after 3 consecutive failed attempts; a success resets
SELECT * FROM pg_temp.breaker('web', 0, 1, error => 'HTTP 500');
SELECT * FROM circuit;
SELECT * FROM pg_temp.breaker('web', 1, 0);
SELECT * FROM circuit;
-- a destination that keeps succeeding costs no write
SELECT * FROM pg_temp.breaker('web', 1, 0);
-- two failures, then one more: open, its cooldown ahead
SELECT * FROM pg_temp.breaker('web', 0, 2, error => 'HTTP 503');
SELECT * FROM pg_temp.breaker('web', 0, 1, error => 'connection refused');
SELECT * FROM circuit;
-- two destinations in one statement (in name order, as the engine sorts
-- them); then a tally of successes and failures: a success among them
-- resets the count
SELECT * FROM queuebox._outbox_breaker(ARRAY['audit', 'web'], ARRAY[0, 0], ARRAY[2, 1],
  ARRAY[false, false], ARRAY[0, 0]::bigint[], ARRAY['HTTP 500', 'HTTP 500'], ARRAY[3, 3],
  ARRAY[3600000, 3600000]::bigint[]);
SELECT * FROM pg_temp.breaker('audit', 1, 1, error => 'HTTP 500');
SELECT * FROM circuit;
-- failures while open keep it open and do not restart its cooldown
SELECT probe_at AS web_probe_at FROM queuebox.destination_state WHERE destination = 'web' \gset
SELECT * FROM pg_temp.breaker('web', 0, 1, error => 'HTTP 500');
SELECT probe_at = :'web_probe_at' AS same_cooldown, failures
FROM queuebox.destination_state WHERE destination = 'web';

-- ---- the claim's view: web is open, its cooldown not over, no probe
SELECT * FROM queuebox._outbox_states(60000);

-- rows for web: held (a settle's 'hold', as the engine does while web is
-- open), and a routed due row no claim may take while web is not closed
INSERT INTO queuebox.outbox (topic, key, payload, destination, hold) VALUES
  ('orders.created', NULL, '{"n": 1}', 'web', 'destination'),
  ('orders.created', NULL, '{"n": 2}', 'web', 'destination'),
  ('orders.created', NULL, '{"n": 3}', 'web', 'destination'),
  ('orders.created', NULL, '{"n": 4}', 'web', NULL);
SELECT count(*) FROM queuebox._outbox_claim(10, 60000, 10, '11111111-1111-1111-1111-111111111111',
  1000, ARRAY['web'], ARRAY[10]);

-- ---- open -> half-open when the cooldown is over: one caller wins the probe
UPDATE queuebox.destination_state SET probe_at = now() - interval '1 second' WHERE destination = 'web';
SELECT destination, state, probe, stored_state FROM queuebox._outbox_states(60000);
SELECT destination, state, probe, stored_state FROM queuebox._outbox_states(60000);
SELECT * FROM circuit WHERE destination = 'web';
-- the winner claims one held row as the probe; a half-open destination
-- still gives no routed row
SELECT id, claimed, probe, destination
FROM queuebox._outbox_claim(10, 60000, 10, '22222222-2222-2222-2222-222222222222',
  1000, ARRAY['web'], ARRAY[10], ARRAY['web']);

-- ---- the probe fails: open again, a new cooldown (the engine counts the
-- attempt before it settles the row, in one transaction)
BEGIN;
SELECT * FROM pg_temp.breaker('web', 0, 1, error => 'probe: HTTP 500');
SELECT queuebox._outbox_settle('22222222-2222-2222-2222-222222222222',
  ARRAY[1]::bigint[], ARRAY['retry'], ARRAY[1], ARRAY[0]::bigint[], ARRAY['HTTP 500'], ARRAY['web']);
COMMIT;
SELECT * FROM circuit WHERE destination = 'web';
-- the failed probe row was retried while web is not taking rows: held,
-- its attempt counted
SELECT id, state, hold, attempt FROM queuebox.outbox WHERE id = 1;

-- ---- a probe that never settles is probed again once probe_at passes
UPDATE queuebox.destination_state SET probe_at = now() - interval '1 second' WHERE destination = 'web';
SELECT destination, state, probe FROM queuebox._outbox_states(60000);
UPDATE queuebox.destination_state SET probe_at = now() - interval '1 second' WHERE destination = 'web';
SELECT destination, state, probe, stored_state FROM queuebox._outbox_states(60000);

-- ---- the probe succeeds: closed, failures reset; the held rows are unparked
SELECT id, probe FROM queuebox._outbox_claim(10, 60000, 10, '33333333-3333-3333-3333-333333333333',
  1000, ARRAY['web'], ARRAY[10], ARRAY['web']);
BEGIN;
SELECT * FROM pg_temp.breaker('web', 1, 0);
SELECT queuebox._outbox_settle('33333333-3333-3333-3333-333333333333',
  ARRAY[1]::bigint[], ARRAY['sent'], ARRAY[2], ARRAY[0]::bigint[], ARRAY[NULL]::text[], ARRAY['web']);
COMMIT;
SELECT * FROM circuit WHERE destination = 'web';
SELECT count(*) AS not_taking_rows FROM queuebox._outbox_states(60000) WHERE destination = 'web';
-- unpark: at most max_rows per call, only the destinations named; due now
UPDATE queuebox.outbox SET scheduled_at = now() + interval '1 hour' WHERE id = 3;
SELECT queuebox._outbox_unpark(ARRAY['audit'], 1000);
SELECT queuebox._outbox_unpark(ARRAY['web'], 1);
SELECT queuebox._outbox_unpark(ARRAY['web'], 1000);
SELECT queuebox._outbox_unpark(ARRAY['web'], 1000);
SELECT id, state, hold, scheduled_at <= now() AS due FROM queuebox.outbox ORDER BY id;
-- web is closed: its routed rows are claimed again
SELECT id, claimed FROM queuebox._outbox_claim(10, 60000, 10, '44444444-4444-4444-4444-444444444444',
  1000, ARRAY['web'], ARRAY[10]) ORDER BY id;
SELECT queuebox._outbox_settle('44444444-4444-4444-4444-444444444444',
  ARRAY[2,3,4]::bigint[], ARRAY['sent','sent','sent'], ARRAY[1,1,1], ARRAY[0,0,0]::bigint[],
  ARRAY[NULL,NULL,NULL]::text[], ARRAY['web','web','web']);

-- ---- a 410 Gone disables the destination, whatever else was counted,
-- until resume_destination()
SELECT * FROM pg_temp.breaker('web', 1, 1, gone => true, error => 'HTTP 410 Gone');
SELECT * FROM circuit WHERE destination = 'web';
-- successes do not close it, nor does a cooldown (it has none)
SELECT * FROM pg_temp.breaker('web', 1, 0);
SELECT destination, state, probe FROM queuebox._outbox_states(60000) WHERE destination = 'web';
INSERT INTO queuebox.outbox (topic, payload, destination) VALUES ('orders.created', '{"n": 5}', 'web');
SELECT count(*) FROM queuebox._outbox_claim(10, 60000, 10, '55555555-5555-5555-5555-555555555555',
  1000, ARRAY['web'], ARRAY[10]);
SELECT queuebox.resume_destination('web');
SELECT * FROM circuit WHERE destination = 'web';
-- resuming a closed destination changes nothing
SELECT queuebox.resume_destination('web');
-- closed with a failure counted, or a pause whose time is over: it held no
-- row, so resumed is false; the count and the old pause are cleared
SELECT * FROM pg_temp.breaker('web', 0, 1, error => 'HTTP 500');
SELECT queuebox.resume_destination('web');
UPDATE queuebox.destination_state SET paused_until = now() - interval '1 second' WHERE destination = 'web';
SELECT queuebox.resume_destination('web');
SELECT * FROM circuit WHERE destination = 'web';
SELECT id, claimed FROM queuebox._outbox_claim(10, 60000, 10, '55555555-5555-5555-5555-555555555555',
  1000, ARRAY['web'], ARRAY[10]);
SELECT queuebox._outbox_settle('55555555-5555-5555-5555-555555555555',
  ARRAY[5]::bigint[], ARRAY['sent'], ARRAY[1], ARRAY[0]::bigint[], ARRAY[NULL]::text[], ARRAY['web']);

-- ---- a Retry-After pauses the destination without changing its state
SELECT * FROM pg_temp.breaker('audit', 0, 1, retry_after_ms => 3600000, error => 'HTTP 429');
SELECT * FROM circuit WHERE destination = 'audit';
SELECT destination, state, failures, paused, probe FROM queuebox._outbox_states(60000);
-- while paused: its routed rows are not claimed, and a retry is held
INSERT INTO queuebox.outbox (topic, payload, destination) VALUES ('audit.login', '{"n": 6}', 'audit');
SELECT count(*) FROM queuebox._outbox_claim(10, 60000, 10, '66666666-6666-6666-6666-666666666666',
  1000, ARRAY['audit'], ARRAY[10]);
INSERT INTO queuebox.outbox (topic, payload) VALUES ('audit.login', '{"n": 7}');
SELECT id, claimed FROM queuebox._outbox_claim(10, 60000, 10, '66666666-6666-6666-6666-666666666666', 6);
SELECT queuebox._outbox_settle('66666666-6666-6666-6666-666666666666',
  ARRAY[7]::bigint[], ARRAY['retry'], ARRAY[1], ARRAY[0]::bigint[], ARRAY['HTTP 429'], ARRAY['audit']);
SELECT id, state, hold, destination, attempt FROM queuebox.outbox WHERE id IN (6, 7) ORDER BY id;
-- a later, shorter Retry-After does not shorten the pause
SELECT paused_until AS audit_paused_until FROM queuebox.destination_state WHERE destination = 'audit' \gset
SELECT * FROM pg_temp.breaker('audit', 0, 1, retry_after_ms => 1000, error => 'HTTP 503');
SELECT paused_until = :'audit_paused_until' AS same_pause FROM queuebox.destination_state WHERE destination = 'audit';

-- ---- what the operator sees
SELECT destination, state, failures, opened_at IS NOT NULL AS opened,
       paused_until IS NOT NULL AS paused, last_error, pending, held
FROM queuebox.destination_status();
SELECT destination, state, rows, circuit FROM queuebox.outbox_stats;
-- web opens: the stats say so
SELECT * FROM pg_temp.breaker('web', 0, 3, error => 'HTTP 500');
SELECT destination, state, rows, circuit FROM queuebox.outbox_stats WHERE destination = 'web';
-- a stored state of a destination no longer configured is still listed
INSERT INTO queuebox.destination_state (destination, state) VALUES ('old', 'disabled');
SELECT destination, state FROM queuebox.destination_status();
-- resume_destination() of audit ends its pause; its held row is unparked
SELECT queuebox.resume_destination('audit');
SELECT * FROM circuit WHERE destination = 'audit';
SELECT queuebox._outbox_unpark(ARRAY['audit'], 1000);
SELECT id, claimed FROM queuebox._outbox_claim(10, 60000, 10, '77777777-7777-7777-7777-777777777777',
  1000, ARRAY['audit'], ARRAY[10]) ORDER BY id;

DROP VIEW circuit;
DELETE FROM queuebox.outbox;
DELETE FROM queuebox.destination_state;
SELECT queuebox.configure('{}');
