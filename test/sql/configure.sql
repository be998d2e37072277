-- queuebox.configure(): validate, store, refuse with the key path, change
-- nothing on a refusal.
SELECT count(*) AS stored FROM queuebox.config;

SELECT queuebox.configure($yaml$
destinations:
  payments: { type: http, baseUrl: "http://127.0.0.1:9000", path: /events }
routes:
  - topicPattern: "orders.**"
    destination: payments
$yaml$);
SELECT id, document LIKE '%payments%' AS has_doc, updated_by = current_user AS by_me
FROM queuebox.config;

-- validate() checks without storing
SELECT queuebox.validate($yaml$
outbox: { batchSize: 500, retention: 12h }
destinations:
  a: { type: http, baseUrl: "https://example.com", timeoutMs: 2000, headers: { X-Api-Key: k } }
  b: { type: rabbitmq, url: "amqp://127.0.0.1:5672/", exchange: events }
  c: { type: kafka, brokers: "127.0.0.1:9092" }
  d: { type: nats, url: "nats://127.0.0.1:4222" }
routes:
  - { topicPattern: "a.*", destination: a }
  - { topicPattern: "**", destination: b }
$yaml$);

-- every refusal names the key path (or line and column) and changes nothing
SELECT queuebox.configure($yaml$
outbox:
  batchsize: 10
$yaml$);
SELECT queuebox.configure($yaml$
outbox:
  batchSize: many
$yaml$);
SELECT queuebox.configure($yaml$
outbox: { batchSize: 0 }
$yaml$);
SELECT queuebox.configure($yaml$
outbox: { backoff: { jitter: 2 } }
$yaml$);
SELECT queuebox.configure($yaml$
destinations:
  p: { type: http, baseUrl: "ftp://example.com" }
$yaml$);
SELECT queuebox.configure($yaml$
destinations:
  p: { type: smtp, baseUrl: "http://example.com" }
$yaml$);
SELECT queuebox.configure($yaml$
destinations:
  p: { type: http }
$yaml$);
SELECT queuebox.configure($yaml$
destinations:
  p: { type: http, baseUrl: "http://example.com" }
routes:
  - { topicPattern: "a.**", destination: nope }
$yaml$);
SELECT queuebox.configure($yaml$
routes:
  - { topicPattern: "a..b", destination: p }
$yaml$);
SELECT queuebox.configure($yaml$
sources:
  stripe: { type: http }
$yaml$);
SELECT queuebox.configure($yaml$
sources:
  stripe: { type: http, path: /stripe, idempotencyKeyPath: $.id, auth: { type: stripe, secret: abc, header: X-Sig } }
$yaml$);
SELECT queuebox.configure($yaml$
sources:
  stripe: { type: http, path: /stripe, idempotencyKeyPath: $.id }
$yaml$);
SELECT queuebox.configure('http: { listen: "10.0.0.300:80" }');
SELECT queuebox.configure('admin: { token: tooshort }');
SELECT queuebox.configure('inbox: { relay: { enabled: sometimes } }');
SELECT queuebox.configure($yaml$
outbox: { batchSize: 10
$yaml$);
SELECT queuebox.configure($yaml$
destinations:
  p: { type: http, baseUrl: "http://example.com", headers: { X-Key: "${QUEUEBOX_REGRESS_UNSET_VARIABLE}" } }
$yaml$);
SELECT queuebox.configure('- just\n- a list');

-- still the first document
SELECT document LIKE '%payments%' AS unchanged FROM queuebox.config;

-- a refusal inside a transaction leaves the transaction aborted, nothing stored
BEGIN;
SELECT queuebox.configure('outbox: { pollIntervalMs: 5 }');
ROLLBACK;
SELECT document LIKE '%payments%' AS unchanged FROM queuebox.config;

-- route_of() follows the stored configuration
SELECT t, queuebox.route_of(t) FROM (VALUES ('orders'), ('orders.created'), ('orders.eu.paid'), ('payments.x')) v(t);

-- sources, inbox, http and admin
SELECT queuebox.validate($yaml$
sources:
  stripe:
    type: http
    path: /stripe
    idempotencyKeyPath: $.id
    eventTypePath: $.type
    aggregateIdPath: $.data.object.customer
    topic: "stripe.{{ eventType }}"
    auth: { type: stripe, secret: whsec_test }
  orders: { type: http, path: /orders, idempotencyKeyPath: $.id, consumption: pull }
inbox: { basePath: /hooks, relay: { batchSize: 50 } }
http: { listen: 18080 }
admin: { token: 0123456789abcdef0123 }
$yaml$);

-- an empty document is valid: every default
SELECT queuebox.validate('');
SELECT queuebox.validate('# only a comment');

-- database: and daemon: are the daemon's (queuebox-mssqld); the extension
-- checks their keys and ignores their values: a file both hosts read may
-- name a variable only the daemon's environment sets (the daemon checks
-- the values: unit test_config_check, TAP 028)
SELECT queuebox.validate($yaml$
database: { url: "postgresql://qb:Pa55word@db.internal:5432/app?sslmode=require", listen: true, idlePollMaxMs: 5000 }
daemon: { outboxWorkers: 4, shutdownGraceMs: 0, logFormat: json }
$yaml$);
SELECT queuebox.validate('database: { url: "mysql://qb:${QB_REGRESS_DAEMON_ONLY}@db/app" }');
SELECT queuebox.validate('daemon: { workers: 4 }');

-- a configure() cannot be prepared: COMMIT PREPARED would never reach the
-- workers; nothing is prepared and the stored document stays as it was
SELECT md5(document) AS doc_before FROM queuebox.config WHERE id = 1 \gset
BEGIN;
SELECT queuebox.configure('');
PREPARE TRANSACTION 'qb_configure';
SELECT count(*) AS prepared FROM pg_prepared_xacts WHERE gid = 'qb_configure';
SELECT md5(document) = :'doc_before' AS unchanged FROM queuebox.config WHERE id = 1;
