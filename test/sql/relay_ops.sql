-- replay_inbox: a new outbox row from an inbox row, through the relay's
-- mapping, with the topic rendered from the CURRENT configuration.
TRUNCATE queuebox.outbox RESTART IDENTITY;
TRUNCATE queuebox.inbox RESTART IDENTITY;
DELETE FROM queuebox.config;

INSERT INTO queuebox.inbox (source, idempotency_key, event_type, aggregate_id, payload, headers, consumption, state, created_at) VALUES
  ('stripe', 'evt_1', 'invoice.paid', 'cus_1', '{"n": 1}',
   '{"Content-Type": "application/json", "X-CORRELATION-ID": "corr-7", "X-Source": "forged", "x-inbox-id": "forged", "X-Idempotency-Key": "forged"}',
   'push', 'processed', now() - interval '5 min'),
  ('github', 'del_1', 'push', 'cus_1', '{"n": 2}', '{}', 'push', 'dead', now() - interval '4 min'),
  ('stripe', 'evt_2', NULL, 'cus_2', '{"n": 3}', '{}', 'push', 'dead', now() - interval '3 min'),
  ('stripe', 'evt_3', 'charge.failed', NULL, '{"n": 4}', '{}', 'push', 'dead', now() - interval '2 min'),
  ('orders', 'o_1', 'order.created', 'cus_1', '{"n": 5}', '{}', 'pull', 'dead', now() - interval '6 min');

-- no configuration stored yet
SELECT queuebox.replay_inbox(1::bigint);

SELECT queuebox.configure($yaml$
outbox: { maxAttempts: 4 }
sources:
  stripe: { type: http, path: /stripe, idempotencyKeyPath: $.id, eventTypePath: $.type }
  github: { type: http, path: /github, idempotencyKeyPath: $.id, topic: "{{ source }}.events" }
inbox: { relay: { maxAttempts: 6 } }
$yaml$);

-- one row: the headers QueueBox sets replace the received ones in any letter case
SELECT queuebox.replay_inbox(1::bigint) AS new_id;
SELECT id, topic, key, payload, headers, max_attempts, state FROM queuebox.outbox ORDER BY id;
-- the inbox row is unchanged
SELECT id, state FROM queuebox.inbox WHERE id = 1;

-- errors: an unknown id, an empty topic (stripe's default "{{ eventType }}",
-- no event type on the row)
SELECT queuebox.replay_inbox(99::bigint);
SELECT queuebox.replay_inbox(3::bigint);
-- a source no longer configured renders with the default "{{ eventType }}"
SELECT queuebox.replay_inbox(5::bigint) AS orders_row;
SELECT topic, key, headers FROM queuebox.outbox WHERE id = 2;

-- bulk: every dead row in created_at, id order; the empty topic is skipped
TRUNCATE queuebox.outbox RESTART IDENTITY;
SELECT queuebox.replay_inbox('dead') AS replayed;
SELECT o.id, o.topic, o.key, o.headers->>'x-inbox-id' AS inbox_id, o.max_attempts
FROM queuebox.outbox o ORDER BY o.id;

-- filters: source, time range, any state
SELECT queuebox.replay_inbox('dead', 'github') AS github_dead;
SELECT queuebox.replay_inbox('processed', 'github') AS none;
SELECT queuebox.replay_inbox(NULL, 'stripe', now() - interval '150 seconds', now()) AS recent_stripe;
SELECT queuebox.replay_inbox(NULL, 'stripe', NULL, now() - interval '4 min') AS old_stripe;
SELECT count(*) AS outbox_rows FROM queuebox.outbox;
SELECT state, count(*) FROM queuebox.inbox GROUP BY state ORDER BY state;

-- the inbox trigger is in place (it arms the relay's wake at commit)
SELECT tgname FROM pg_trigger WHERE tgrelid = 'queuebox.inbox'::regclass AND NOT tgisinternal;

-- requeue_inbox and parking: a dead row goes back unparked, and the relay
-- claims it before the later rows of its aggregate, which wait parked
-- behind it and are released one by one as each forward ends its row
DELETE FROM queuebox.inbox;
INSERT INTO queuebox.inbox (source, idempotency_key, aggregate_id, payload, consumption, state, created_at) VALUES
  ('github', 'q_1', 'cus_9', '{"n": 1}', 'push', 'dead', now() - interval '3 min'),
  ('stripe', 'q_2', 'cus_9', '{"n": 2}', 'push', 'pending', now() - interval '2 min'),
  ('github', 'q_3', 'cus_9', '{"n": 3}', 'push', 'pending', now() - interval '1 min');
SELECT queuebox.requeue_inbox('github') AS requeued;
SELECT idempotency_key FROM queuebox._relay_claim(10, 60000, 'cccccccc-0000-0000-0000-000000000001') c
JOIN queuebox.inbox i USING (id);
SELECT idempotency_key, state, hold FROM queuebox.inbox ORDER BY created_at;
SELECT queuebox._relay_forward('cccccccc-0000-0000-0000-000000000001',
  ARRAY(SELECT id FROM queuebox.inbox WHERE idempotency_key = 'q_1'), ARRAY['github.x'], NULL);
SELECT idempotency_key, state, hold FROM queuebox.inbox ORDER BY created_at;
SELECT idempotency_key FROM queuebox._relay_claim(10, 60000, 'cccccccc-0000-0000-0000-000000000002') c
JOIN queuebox.inbox i USING (id);

DELETE FROM queuebox.outbox;
DELETE FROM queuebox.inbox;
DELETE FROM queuebox.config;
