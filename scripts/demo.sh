#!/usr/bin/env bash
# The QueueBox demo: a throwaway PostgreSQL cluster (the one PG_CONFIG
# names, default the pg_config on PATH) with the extension preloaded, a
# loopback HTTP sink, rows inserted in a business transaction that the sink
# receives, and a signed webhook that comes in through the
# inbox, is forwarded by the relay and delivered too.  Then the same on a
# plain cluster (no preload, no extension, no superuser), served by the
# daemon queuebox-mssqld, as on a managed PostgreSQL.  Everything it starts
# it stops.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

scripts/setup.sh >/dev/null
echo "== building and installing the extension and the daemon"
make -s >/dev/null
make -s install >/dev/null
make -s sink >/dev/null

PGBIN=$("${PG_CONFIG:-pg_config}" --bindir)
DIR=$(mktemp -d /tmp/queuebox-demo.XXXXXX)
chmod 755 "$DIR"
RUNAS=()
if [ "$(id -u)" -eq 0 ]; then
  chown postgres:postgres "$DIR"
  RUNAS=(runuser -u postgres --)
fi
PORT=$(( 20000 + RANDOM % 20000 ))
HTTP_PORT=$(( PORT + 1 ))
PLAIN_PORT=$(( PORT + 2 ))
SINK_PID=""
DAEMON_PID=""
cleanup() {
  [ -n "$DAEMON_PID" ] && kill "$DAEMON_PID" 2>/dev/null && wait "$DAEMON_PID" 2>/dev/null || true
  [ -n "$SINK_PID" ] && kill "$SINK_PID" 2>/dev/null || true
  "${RUNAS[@]}" "$PGBIN/pg_ctl" -D "$DIR/data" -m fast stop >/dev/null 2>&1 || true
  "${RUNAS[@]}" "$PGBIN/pg_ctl" -D "$DIR/plain" -m fast stop >/dev/null 2>&1 || true
  rm -rf "$DIR"
}
trap cleanup EXIT

echo "== starting the sink on 127.0.0.1 (it prints what it receives)"
# --print: each request it answers appears below as "sink: POST ... -> 200"
"$ROOT/test/sink/qb_sink" --port 0 --port-file "$DIR/sink.port" --log "$DIR/sink.log" --print --quiet &
SINK_PID=$!
for _ in $(seq 50); do [ -s "$DIR/sink.port" ] && break; sleep 0.1; done
SINK_PORT=$(cat "$DIR/sink.port")

echo "== starting a temp cluster with shared_preload_libraries = 'queuebox'"
"${RUNAS[@]}" "$PGBIN/initdb" -D "$DIR/data" -A trust -U postgres >/dev/null
cat >> "$DIR/data/postgresql.conf" <<CONF
listen_addresses = ''
port = $PORT
unix_socket_directories = '$DIR'
shared_preload_libraries = 'queuebox'
queuebox.database = 'app'
queuebox.outbox_workers = 2
CONF
"${RUNAS[@]}" "$PGBIN/pg_ctl" -D "$DIR/data" -l "$DIR/server.log" -w start >/dev/null
PSQL=("${RUNAS[@]}" psql -X -q -h "$DIR" -p "$PORT" -U postgres -v ON_ERROR_STOP=1)
"${PSQL[@]}" -d postgres -c "CREATE DATABASE app"

run() { echo; echo "app=# $1"; "${PSQL[@]}" -d app -c "$1"; }
run "CREATE EXTENSION queuebox"
run "SELECT queuebox.configure(\$yaml\$
destinations:
  payments: { type: http, baseUrl: \"http://127.0.0.1:$SINK_PORT\", path: /events }
routes:
  - topicPattern: \"orders.**\"
    destination: payments
  - topicPattern: \"github.**\"
    destination: payments
http: { listen: $HTTP_PORT }
sources:
  github:
    type: http
    path: /github
    idempotencyKeyHeader: X-GitHub-Delivery
    eventTypeHeader: X-GitHub-Event
    topic: \"github.{{ eventType }}\"
    auth: { type: github, secret: demo-secret }
\$yaml\$)"
run "CREATE TABLE orders (id int PRIMARY KEY, customer text)"
run "BEGIN;
INSERT INTO orders VALUES (1, 'customer-42');
INSERT INTO queuebox.outbox (topic, key, payload, headers)
  VALUES ('orders.created', 'customer-42', '{\"id\": 1}', '{\"X-Correlation-Id\": \"demo-1\"}');
COMMIT"
run "SELECT queuebox.enqueue('orders.paid', '{\"id\": 1, \"amount\": 990}', 'customer-42')"
run "SELECT queuebox.enqueue('shipping.label', '{\"id\": 1}')"

for _ in $(seq 50); do
  curl -s -o /dev/null "http://127.0.0.1:$HTTP_PORT/healthz" && break
  sleep 0.1
done
BODY='{"action":"opened","pull_request":{"number":7}}'
SIG=$(printf '%s' "$BODY" | openssl dgst -sha256 -hmac demo-secret -hex | sed 's/^.* //')
echo
echo "\$ curl -X POST http://127.0.0.1:$HTTP_PORT/inbox/github -H 'X-Hub-Signature-256: sha256=$SIG' ... (signed webhook)"
curl -s -X POST "http://127.0.0.1:$HTTP_PORT/inbox/github" -H "Content-Type: application/json" \
  -H "X-GitHub-Delivery: delivery-1" -H "X-GitHub-Event: pull_request" \
  -H "X-Hub-Signature-256: sha256=$SIG" -d "$BODY"; echo
echo "\$ the same webhook again (a retry by the sender)"
curl -s -X POST "http://127.0.0.1:$HTTP_PORT/inbox/github" -H "Content-Type: application/json" \
  -H "X-GitHub-Delivery: delivery-1" -H "X-GitHub-Event: pull_request" \
  -H "X-Hub-Signature-256: sha256=$SIG" -d "$BODY"; echo
echo "\$ a webhook signed with the wrong secret"
curl -s -X POST "http://127.0.0.1:$HTTP_PORT/inbox/github" -H "X-GitHub-Delivery: delivery-2" \
  -H "X-Hub-Signature-256: sha256=0000" -d "$BODY"; echo

for _ in $(seq 100); do
  n=$("${PSQL[@]}" -d app -tAc "SELECT count(*) FROM queuebox.outbox WHERE state IN ('sent','dead')")
  [ "$n" -ge 4 ] && break
  sleep 0.1
done

echo
echo "== the sink printed each request above as it came (sink: ...); it received $(wc -l < "$DIR/sink.log")"
run "SELECT id, topic, key, state, attempt, last_error FROM queuebox.outbox ORDER BY id"
run "SELECT id, source, idempotency_key, event_type, state FROM queuebox.inbox ORDER BY id"
run "SELECT * FROM queuebox.outbox_stats"
echo
echo "== metrics (GET /metrics, excerpt)"
curl -s "http://127.0.0.1:$HTTP_PORT/metrics" | grep -E '^queuebox_(outbox_delivered_total|inbox_received_total\{source="github",result="(accepted|duplicate|unauthorized)"|relay_forwarded_total)'
echo
echo "== demo done: 'orders.*' rows and the webhook were delivered; 'shipping.label' has no route, so it is dead with a reason"

# ---------------------------------------------------------------- the daemon
echo
echo "== part 2: a plain cluster (no shared_preload_libraries, no extension), served by queuebox-mssqld"
"${RUNAS[@]}" "$PGBIN/initdb" -D "$DIR/plain" -A trust -U postgres >/dev/null
cat >> "$DIR/plain/postgresql.conf" <<CONF
listen_addresses = '127.0.0.1'
port = $PLAIN_PORT
unix_socket_directories = '$DIR'
CONF
"${RUNAS[@]}" "$PGBIN/pg_ctl" -D "$DIR/plain" -l "$DIR/plain.log" -w start >/dev/null
PLAIN=("${RUNAS[@]}" psql -X -q -h "$DIR" -p "$PLAIN_PORT" -U postgres -v ON_ERROR_STOP=1)
"${PLAIN[@]}" -d postgres -c "CREATE DATABASE shop"
prun() { echo; echo "shop=# $1"; "${PLAIN[@]}" -d shop -c "$1"; }
prun "CREATE ROLE queuebox LOGIN; GRANT CREATE ON DATABASE shop TO queuebox"
cat > "$DIR/daemon.yaml" <<YAML
database:
  url: "postgres://queuebox@127.0.0.1:$PLAIN_PORT/shop"
  listen: true
destinations:
  fulfilment: { type: http, baseUrl: "http://127.0.0.1:$SINK_PORT", path: /fulfilment }
routes:
  - topicPattern: "orders.**"
    destination: fulfilment
YAML
chmod 644 "$DIR/daemon.yaml"
echo
echo "\$ queuebox-mssqld --config daemon.yaml --check"
"$ROOT/queuebox-mssqld" --config "$DIR/daemon.yaml" --check
echo "\$ queuebox-mssqld --config daemon.yaml &"
# the daemon is a client of the database: it needs no server account
"$ROOT/queuebox-mssqld" --config "$DIR/daemon.yaml" 2>"$DIR/daemon.log" &
DAEMON_PID=$!
for _ in $(seq 100); do grep -q 'outbox 1\[[0-9]*\]: started' "$DIR/daemon.log" && break; sleep 0.1; done
sed 's/^/   /' "$DIR/daemon.log"
prun "SELECT version FROM queuebox.schema_version"
prun "CREATE TABLE orders (id int PRIMARY KEY, customer text)"
prun "BEGIN;
INSERT INTO orders VALUES (7, 'customer-7');
INSERT INTO queuebox.outbox (topic, key, payload) VALUES ('orders.created', 'customer-7', '{\"id\": 7}');
COMMIT"
for _ in $(seq 100); do
  n=$("${PLAIN[@]}" -d shop -tAc "SELECT count(*) FROM queuebox.outbox WHERE state = 'sent'")
  [ "$n" -ge 1 ] && break
  sleep 0.1
done
echo
echo "== the sink printed the daemon's request above (sink: POST /fulfilment ...)"
prun "SELECT id, topic, state, attempt FROM queuebox.outbox"
kill -TERM "$DAEMON_PID"; wait "$DAEMON_PID" || true; DAEMON_PID=""
echo
echo "== the daemon stopped (SIGTERM):"
tail -n 3 "$DIR/daemon.log" | sed 's/^/   /'
echo
echo "== demo done: the daemon delivered the 'orders.created' row from a plain PostgreSQL (docs/daemon.md)"
