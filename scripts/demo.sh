#!/usr/bin/env bash
# The QueueBox demo: a throwaway PostgreSQL 15 cluster with the extension
# preloaded, a loopback HTTP sink, rows inserted in a business transaction
# that the sink receives, and a signed webhook that comes in through the
# inbox, is forwarded by the relay and delivered too.  Everything it starts
# it stops.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

scripts/setup.sh >/dev/null
echo "== building and installing the extension"
make -s >/dev/null
make -s install >/dev/null
make -s sink >/dev/null

PGBIN=/usr/lib/postgresql/15/bin
DIR=$(mktemp -d /tmp/queuebox-demo.XXXXXX)
chmod 755 "$DIR"
RUNAS=()
if [ "$(id -u)" -eq 0 ]; then
  chown postgres:postgres "$DIR"
  RUNAS=(runuser -u postgres --)
fi
PORT=$(( 20000 + RANDOM % 20000 ))
HTTP_PORT=$(( PORT + 1 ))
SINK_PID=""
cleanup() {
  [ -n "$SINK_PID" ] && kill "$SINK_PID" 2>/dev/null || true
  "${RUNAS[@]}" "$PGBIN/pg_ctl" -D "$DIR/data" -m fast stop >/dev/null 2>&1 || true
  rm -rf "$DIR"
}
trap cleanup EXIT

echo "== starting the sink on 127.0.0.1 (it prints what it receives)"
"$ROOT/test/sink/qb_sink" --port 0 --port-file "$DIR/sink.port" --log "$DIR/sink.log" --quiet &
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
echo "== what the sink received"
while IFS= read -r line; do
  echo "$line" | python3 -c 'import json,sys
r=json.loads(sys.stdin.read()); h=r["headers"]
print("%s %s  X-Message-Id=%s  X-Correlation-Id=%s  User-Agent=%s\n   body: %s" % (r["method"], r["path"], h.get("x-message-id"), h.get("x-correlation-id","-"), h.get("user-agent"), r["body"]))' 2>/dev/null || echo "$line"
done < "$DIR/sink.log"
run "SELECT id, topic, key, state, attempt, last_error FROM queuebox.outbox ORDER BY id"
run "SELECT id, source, idempotency_key, event_type, state FROM queuebox.inbox ORDER BY id"
run "SELECT * FROM queuebox.outbox_stats"
echo
echo "== metrics (GET /metrics, excerpt)"
curl -s "http://127.0.0.1:$HTTP_PORT/metrics" | grep -E '^queuebox_(outbox_delivered_total|inbox_received_total\{source="github",result="(accepted|duplicate|unauthorized)"|relay_forwarded_total)'
echo
echo "== demo done: 'orders.*' rows and the webhook were delivered; 'shipping.label' has no route, so it is dead with a reason"
