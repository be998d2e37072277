-- The outbox table, its constraints and enqueue().
CREATE EXTENSION queuebox;

\d queuebox.outbox

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
\set VERBOSITY default
SELECT count(*) AS rows_after_refusals FROM queuebox.outbox;

-- the claim uses the partial indexes, not a scan of sent rows
SET enable_seqscan = off;
EXPLAIN (COSTS OFF)
SELECT o.id FROM queuebox.outbox o
WHERE o.state = 'pending' AND o.scheduled_at <= now()
ORDER BY o.scheduled_at, o.id LIMIT 100;
EXPLAIN (COSTS OFF)
SELECT 1 FROM queuebox.outbox e
WHERE e.key = 'k' AND e.id < 10 AND e.state IN ('pending', 'processing');
RESET enable_seqscan;

DELETE FROM queuebox.outbox;
