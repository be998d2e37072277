-- queuebox.outbox_stats: rows per state and per destination.
TRUNCATE queuebox.outbox RESTART IDENTITY;
SELECT queuebox.configure($yaml$
destinations:
  payments: { type: http, baseUrl: "http://127.0.0.1:9000" }
  audit: { type: http, baseUrl: "http://127.0.0.1:9001" }
routes:
  - { topicPattern: "orders.**", destination: payments }
  - { topicPattern: "audit.*", destination: audit }
$yaml$);
INSERT INTO queuebox.outbox (topic, payload, state, created_at) VALUES
  ('orders.created', '{}', 'pending', now() - interval '10 minutes'),
  ('orders.created', '{}', 'pending', now() - interval '1 minute'),
  ('orders.paid', '{}', 'sent', now()),
  ('audit.login', '{}', 'dead', now()),
  ('audit.login', '{}', 'pending', now() - interval '2 minutes'),
  ('misc', '{}', 'pending', now() - interval '1 hour');
SELECT destination, state, rows,
       date_trunc('minute', oldest_pending_age + interval '30 seconds') AS oldest_pending_age
FROM queuebox.outbox_stats
ORDER BY destination = '(all)' DESC, destination, state;
DELETE FROM queuebox.outbox;
