-- The inbox table and the five pull statements: claim, renew, complete,
-- retry, dead.  Every call but the claim is true only when exactly one row
-- changed.
\d queuebox.inbox

INSERT INTO queuebox.inbox (source, idempotency_key, aggregate_id, payload, consumption, created_at) VALUES
  ('orders', 'e1', 'cust-1', '{"n": 1}', 'pull', now() - interval '5 min'),
  ('orders', 'e2', 'cust-1', '{"n": 2}', 'pull', now() - interval '4 min'),
  ('orders', 'e3', 'cust-2', '{"n": 3}', 'pull', now() - interval '3 min'),
  ('orders', 'e4', NULL,     '{"n": 4}', 'pull', now() - interval '2 min'),
  ('orders', 'e5', 'cust-1', '{"n": 5}', 'push', now() - interval '1 min'),
  ('billing', 'e1', 'cust-1', '{"n": 6}', 'pull', now() - interval '6 min');

-- (source, idempotency_key) is unique; the same key on another source is not a repeat
\set VERBOSITY terse
INSERT INTO queuebox.inbox (source, idempotency_key, payload) VALUES ('orders', 'e1', '{}');
INSERT INTO queuebox.inbox (source, idempotency_key, payload, consumption) VALUES ('orders', 'e9', '{}', 'later');
INSERT INTO queuebox.inbox (source, idempotency_key, payload, state) VALUES ('orders', 'e9', '{}', 'sent');
INSERT INTO queuebox.inbox (source, idempotency_key, payload) VALUES ('orders', '', '{}');
\set VERBOSITY default

-- one message per (source, aggregate) in created_at order; push rows and
-- other sources are not claimed
CREATE TEMP TABLE c1 AS SELECT * FROM queuebox.inbox_claim('orders', 10, 60000);
SELECT idempotency_key, aggregate_id, payload, attempt, claim_token IS NOT NULL AS has_token FROM c1 ORDER BY id;
SELECT count(*) AS nothing_more FROM queuebox.inbox_claim('orders', 10, 60000);
-- e2 waits behind e1: parked at that first claim (hold 'aggregate'), so no
-- later claim reads it; the push row is not the pull claim's
SELECT idempotency_key, state, hold FROM queuebox.inbox WHERE source = 'orders' ORDER BY created_at;
-- billing's cust-1 is independent of orders' cust-1
SELECT idempotency_key, aggregate_id FROM queuebox.inbox_claim('billing', 10, 60000);

-- renew, then complete with the right token; a second complete is false
SELECT queuebox.inbox_renew(id, claim_token, 120000) FROM c1 WHERE idempotency_key = 'e1';
SELECT lease_until > now() + interval '100 seconds' AS renewed FROM queuebox.inbox WHERE source = 'orders' AND idempotency_key = 'e1';
SELECT queuebox.inbox_complete(id, claim_token) FROM c1 WHERE idempotency_key = 'e1';
SELECT queuebox.inbox_complete(id, claim_token) FROM c1 WHERE idempotency_key = 'e1';
-- a wrong token changes nothing
SELECT queuebox.inbox_complete(id, gen_random_uuid()) FROM c1 WHERE idempotency_key = 'e3';

-- cust-1's next message is claimable now that e1 is processed: the
-- completion released it (promoted) in its second statement
SELECT idempotency_key, state, hold FROM queuebox.inbox WHERE source = 'orders' AND idempotency_key = 'e2';
CREATE TEMP TABLE c2 AS SELECT * FROM queuebox.inbox_claim('orders', 10, 60000);
SELECT idempotency_key FROM c2;

-- retry: back to pending, attempt + 1, due after the delay
SELECT queuebox.inbox_retry(id, claim_token, 3600000, 'handler failed: timeout') FROM c2;
SELECT idempotency_key, state, attempt, scheduled_at > now() + interval '59 minutes' AS delayed,
       claim_token, lease_until, last_error
FROM queuebox.inbox WHERE source = 'orders' AND idempotency_key = 'e2';
SELECT queuebox.inbox_retry(id, claim_token, 0, 'again') FROM c2;
SELECT count(*) AS not_due_yet FROM queuebox.inbox_claim('orders', 10, 60000);

-- dead is final
SELECT queuebox.inbox_dead(id, claim_token, 'cannot parse') FROM c1 WHERE idempotency_key = 'e4';
SELECT queuebox.inbox_dead(id, claim_token, 'cannot parse') FROM c1 WHERE idempotency_key = 'e4';
SELECT idempotency_key, state, last_error FROM queuebox.inbox WHERE source = 'orders' AND idempotency_key = 'e4';

-- takeover: an expired lease is claimed again with a new token; the old
-- token is fenced off
UPDATE queuebox.inbox SET lease_until = now() - interval '1 second'
WHERE source = 'orders' AND idempotency_key = 'e3';
CREATE TEMP TABLE c3 AS SELECT * FROM queuebox.inbox_claim('orders', 10, 60000);
SELECT c3.idempotency_key, c3.claim_token <> c1.claim_token AS new_token
FROM c3 JOIN c1 USING (id);
SELECT queuebox.inbox_complete(id, claim_token) FROM c1 WHERE idempotency_key = 'e3';
SELECT queuebox.inbox_renew(id, claim_token, 1000) FROM c1 WHERE idempotency_key = 'e3';
SELECT queuebox.inbox_complete(id, claim_token) FROM c3;

SELECT source, idempotency_key, consumption, state, attempt, hold FROM queuebox.inbox ORDER BY source, idempotency_key;
DELETE FROM queuebox.inbox;

-- ---------------------------------------------------------------------------
-- Parking: a failing aggregate costs the others nothing
-- ---------------------------------------------------------------------------
-- h1 is a head retried a day ahead with h2, h3 behind it; n1 is another
-- aggregate's message
INSERT INTO queuebox.inbox (source, idempotency_key, aggregate_id, payload, consumption, created_at) VALUES
  ('orders', 'h1', 'H', '1', 'pull', now() - interval '5 min'),
  ('orders', 'h2', 'H', '2', 'pull', now() - interval '4 min'),
  ('orders', 'h3', 'H', '3', 'pull', now() - interval '3 min');
CREATE TEMP TABLE p1 AS SELECT * FROM queuebox.inbox_claim('orders', 10, 60000);
SELECT idempotency_key FROM p1;
SELECT queuebox.inbox_retry(id, claim_token, 86400000, 'down') FROM p1;
INSERT INTO queuebox.inbox (source, idempotency_key, aggregate_id, payload, consumption)
VALUES ('orders', 'n1', 'N', '4', 'pull');
SELECT idempotency_key FROM queuebox.inbox_claim('orders', 10, 60000);
SELECT idempotency_key, state, hold FROM queuebox.inbox WHERE source = 'orders' ORDER BY created_at;
-- the claim reads due unparked rows only: h1 (not due) and h2, h3 (parked)
-- are in no index it scans
EXPLAIN (COSTS OFF)
SELECT c.id FROM queuebox.inbox c
WHERE c.source = 'orders' AND c.consumption = 'pull' AND c.state = 'pending'
  AND c.hold IS NULL AND c.scheduled_at <= now()
ORDER BY c.scheduled_at, c.created_at, c.id LIMIT 10;

-- h1 due again and claimed; inbox_dead ends it and promotes h2 only
UPDATE queuebox.inbox SET scheduled_at = now() WHERE source = 'orders' AND idempotency_key = 'h1';
CREATE TEMP TABLE p2 AS SELECT * FROM queuebox.inbox_claim('orders', 10, 60000);
SELECT idempotency_key FROM p2;
SELECT queuebox.inbox_dead(id, claim_token, 'gave up') FROM p2;
SELECT queuebox.inbox_dead(id, claim_token, 'gave up') FROM p2;
SELECT idempotency_key, state, hold FROM queuebox.inbox WHERE aggregate_id = 'H' ORDER BY created_at;

-- takeover: h2 is claimed and its lease expires; meanwhile the operator
-- requeues h1 (dead -> pending, earlier).  The takeover candidate h2 has an
-- open earlier row now: it is parked (its expired claim ends) instead of
-- taken over, and h1 is claimed; h1's completion releases h2
CREATE TEMP TABLE p3 AS SELECT * FROM queuebox.inbox_claim('orders', 10, 60000);
SELECT idempotency_key FROM p3;
UPDATE queuebox.inbox SET lease_until = now() - interval '1 second'
WHERE source = 'orders' AND idempotency_key = 'h2';
SELECT queuebox.requeue_inbox(id) FROM queuebox.inbox WHERE source = 'orders' AND idempotency_key = 'h1';
CREATE TEMP TABLE p4 AS SELECT * FROM queuebox.inbox_claim('orders', 10, 60000);
SELECT idempotency_key FROM p4;
SELECT idempotency_key, state, hold, claim_token IS NULL AS no_token FROM queuebox.inbox
WHERE aggregate_id = 'H' ORDER BY created_at;
SELECT queuebox.inbox_complete(id, claim_token) FROM p3;
SELECT queuebox.inbox_complete(id, claim_token) FROM p4;
SELECT idempotency_key, state, hold FROM queuebox.inbox WHERE aggregate_id = 'H' ORDER BY created_at;
SELECT idempotency_key FROM queuebox.inbox_claim('orders', 10, 60000);
DELETE FROM queuebox.inbox;

-- a pull row waits for an earlier open push row of its source and
-- aggregate (the row of a source that changed to pull); the relay's
-- forward of the push row releases it
INSERT INTO queuebox.inbox (source, idempotency_key, aggregate_id, payload, consumption, created_at) VALUES
  ('orders', 'm1', 'M', '1', 'push', now() - interval '2 min'),
  ('orders', 'm2', 'M', '2', 'pull', now() - interval '1 min');
SELECT count(*) AS waits FROM queuebox.inbox_claim('orders', 10, 60000);
SELECT idempotency_key, state, hold FROM queuebox.inbox ORDER BY created_at;
SELECT count(*) AS relay_claimed FROM queuebox._relay_claim(10, 60000, 'bbbbbbbb-0000-0000-0000-000000000001');
SELECT queuebox._relay_forward('bbbbbbbb-0000-0000-0000-000000000001',
  ARRAY(SELECT id FROM queuebox.inbox WHERE idempotency_key = 'm1'), ARRAY['orders.m'], NULL);
SELECT idempotency_key, state, hold FROM queuebox.inbox ORDER BY created_at;
SELECT idempotency_key FROM queuebox.inbox_claim('orders', 10, 60000);
DELETE FROM queuebox.outbox;
DELETE FROM queuebox.inbox;
