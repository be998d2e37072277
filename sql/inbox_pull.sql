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
-- billing's cust-1 is independent of orders' cust-1
SELECT idempotency_key, aggregate_id FROM queuebox.inbox_claim('billing', 10, 60000);

-- renew, then complete with the right token; a second complete is false
SELECT queuebox.inbox_renew(id, claim_token, 120000) FROM c1 WHERE idempotency_key = 'e1';
SELECT lease_until > now() + interval '100 seconds' AS renewed FROM queuebox.inbox WHERE source = 'orders' AND idempotency_key = 'e1';
SELECT queuebox.inbox_complete(id, claim_token) FROM c1 WHERE idempotency_key = 'e1';
SELECT queuebox.inbox_complete(id, claim_token) FROM c1 WHERE idempotency_key = 'e1';
-- a wrong token changes nothing
SELECT queuebox.inbox_complete(id, gen_random_uuid()) FROM c1 WHERE idempotency_key = 'e3';

-- cust-1's next message is claimable now that e1 is processed
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

SELECT source, idempotency_key, consumption, state, attempt FROM queuebox.inbox ORDER BY source, idempotency_key;
DELETE FROM queuebox.inbox;
