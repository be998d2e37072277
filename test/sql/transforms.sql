-- transform: a jq program on a route, a destination and a source, compiled
-- by configure(): a compile error is refused with the key path and jq's
-- message, and changes nothing.
SELECT queuebox.configure($yaml$
destinations:
  web: { type: http, baseUrl: "http://127.0.0.1:9000", transform: '. + {via: "web"}' }
routes:
  - topicPattern: "orders.**"
    destination: web
    transform: |
      def cents: (.amount * 100 | floor);
      {id: .order, cents: cents, topic: $topic, key: $key}
sources:
  shop: { type: http, path: /shop, idempotencyKeyPath: $.id, eventTypePath: $.type,
          transform: '{id, type, source: $source, eventType: $eventType}' }
$yaml$);

-- a route
SELECT queuebox.configure($yaml$
destinations:
  web: { type: http, baseUrl: "http://127.0.0.1:9000" }
routes:
  - { topicPattern: "orders.**", destination: web, transform: "{id: .order" }
$yaml$);
-- a destination
SELECT queuebox.configure($yaml$
destinations:
  web: { type: http, baseUrl: "http://127.0.0.1:9000", transform: "nosuch(.a)" }
routes:
  - { topicPattern: "orders.**", destination: web }
$yaml$);
-- a source (an unbound variable)
SELECT queuebox.configure($yaml$
sources:
  shop:
    type: http
    path: /shop
    idempotencyKeyPath: $.id
    topic: "shop.{{ source }}"
    transform: "{id, tenant: $tenant}"
$yaml$);
-- not a string
SELECT queuebox.validate($yaml$
destinations:
  web: { type: http, baseUrl: "http://127.0.0.1:9000", transform: { a: 1 } }
$yaml$);

-- the refusals changed nothing: the first document is still stored
SELECT document LIKE '%via: "web"%' AS first_document_kept FROM queuebox.config;
