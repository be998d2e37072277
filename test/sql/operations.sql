-- Operations: requeue and replay, one row and in bulk.
TRUNCATE queuebox.outbox RESTART IDENTITY;
INSERT INTO queuebox.outbox (topic, key, payload, state, attempt, last_error, created_at) VALUES
  ('orders.created', 'k1', '{"n": 1}', 'dead', 10, 'attempt 10 of 10 failed', now() - interval '3 hours'),
  ('orders.created', 'k1', '{"n": 2}', 'dead', 10, 'attempt 10 of 10 failed', now() - interval '2 hours'),
  ('audit.login',    NULL, '{"n": 3}', 'dead', 0, 'no route matches topic', now() - interval '1 hour'),
  ('orders.paid',    'k2', '{"n": 4}', 'sent', 1, NULL, now() - interval '1 hour'),
  ('orders.paid',    'k2', '{"n": 5}', 'pending', 0, NULL, now());

SELECT queuebox.topic_matches('orders.**', 'orders.created') AS a,
       queuebox.topic_matches('orders.*', 'orders.eu.paid') AS b,
       queuebox.topic_matches('**', 'x') AS c;
SELECT queuebox.topic_matches('orders..x', 'orders.x');

-- one row: only a dead row is requeued; attempts reset, id and message_id kept
SELECT message_id AS mid1 FROM queuebox.outbox WHERE id = 1 \gset
SELECT queuebox.requeue_outbox(1::bigint) AS requeued;
SELECT queuebox.requeue_outbox(1::bigint) AS again;
SELECT queuebox.requeue_outbox(4::bigint) AS sent_row;
SELECT queuebox.requeue_outbox(99::bigint) AS missing;
SELECT id, state, attempt, scheduled_at <= now() AS due, message_id = :'mid1' AS same_message_id
FROM queuebox.outbox WHERE id = 1;

-- bulk, by topic pattern and time range: k1's second row follows its first
SELECT queuebox.requeue_outbox('audit.*', now() - interval '90 minutes', now()) AS audit_rows;
SELECT queuebox.requeue_outbox('orders.**') AS order_rows;
SELECT id, topic, state, attempt FROM queuebox.outbox ORDER BY id;

-- replay: a new row, a new message_id, any state
SELECT queuebox.replay_outbox(4::bigint) AS new_id;
SELECT o.id, o.topic, o.key, o.payload, o.state, o.attempt, o.message_id <> s.message_id AS new_message_id
FROM queuebox.outbox o, queuebox.outbox s WHERE o.id = 6 AND s.id = 4;
SELECT queuebox.replay_outbox(99::bigint) AS nothing;

-- bulk replay in id order: the copies keep each key's order
SELECT queuebox.replay_outbox('pending', 'orders.**') AS replayed;
SELECT id, payload FROM queuebox.outbox WHERE id > 6 ORDER BY id;

-- inbox: requeue a dead row, one and in bulk
TRUNCATE queuebox.inbox RESTART IDENTITY;
INSERT INTO queuebox.inbox (source, idempotency_key, payload, consumption, state, attempt, last_error) VALUES
  ('orders', 'e1', '{}', 'pull', 'dead', 5, 'handler gave up'),
  ('orders', 'e2', '{}', 'pull', 'dead', 5, 'handler gave up'),
  ('stripe', 'e1', '{}', 'push', 'dead', 0, 'topic rendered empty'),
  ('stripe', 'e2', '{}', 'push', 'processed', 0, NULL);
SELECT queuebox.requeue_inbox(1::bigint) AS one, queuebox.requeue_inbox(4::bigint) AS processed_row;
SELECT queuebox.requeue_inbox('stripe') AS stripe_rows;
SELECT id, source, idempotency_key, state, attempt FROM queuebox.inbox ORDER BY id;

DELETE FROM queuebox.outbox;
DELETE FROM queuebox.inbox;
