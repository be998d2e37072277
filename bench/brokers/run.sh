#!/usr/bin/env bash
# bench/brokers/run.sh: QueueBox against a message broker, both ways, each
# beside an anchor measured in the same run:
#   publish  the outbox publishing into the broker (Kafka, NATS, RabbitMQ)
#            against the same library publishing the same messages with no
#            database;
#   consume  a broker source's consumer storing a preloaded backlog into the
#            inbox against pgbench inserting the same inbox rows.
#
#   bench/brokers/run.sh [--record] [N_ROWS]        (default 100000)
#
# Run from anywhere after `make && make install` (as root, or as a user who
# can run initdb).  See bench/README.md ("bench/brokers").
#
# One temporary PostgreSQL cluster (bench/lib.sh's settings, outbox and
# consumer workers off until measured, relay off), one Kafka cluster
# (test/brokers/kafka_mock: librdkafka's mock cluster on loopback TCP, one
# broker, topics qb.bench and plain.bench with QB_BENCH_KAFKA_PARTITIONS
# partitions, src.bench with enough partitions to hold N messages: the mock
# keeps about 5 MB per partition), one nats-server -js (streams QB on qb.>,
# PLAIN on plain.>, SRC on src.>, file storage, made by
# test/brokers/nats_tool) and one private rabbitmq-server (loopback ports,
# its own node name, cookie, mnesia and logs in the temp dir, as
# test/perl/QueueBoxRabbit.pm starts it; direct exchange bench with durable
# queues qb.bench, plain.bench and src.bench bound by their names, qb.bench
# by rabbitmq.bench, the rows' topic).  Configuration: outbox.batchSize 500;
# destinations kafka (topic qb.bench, config linger.ms 5, the rest as
# QueueBox sets it: idempotent, acks=all, message.timeout.ms 30000), nats
# (subject qb.bench, jetstream: true) and rabbitmq (exchange bench, routing
# key the row's topic, persistent, mandatory, publisher confirms), routed by
# the rows' topics kafka.bench, nats.bench and rabbitmq.bench.
#
# publish, for each broker:
#   preload  with queuebox.outbox_workers = 0: TRUNCATE, N rows in one
#            INSERT ... SELECT generate_series (QB_BENCH_KEYS keys, the
#            ~340-byte payload and the X-Correlation-Id header of
#            bench/outbox-http), VACUUM ANALYZE, CHECKPOINT.
#   P1       the anchor: bench/brokers/plain_producer (built here with cc)
#            publishes N messages of the rows' average payload size, same
#            keys, same headers, same library and settings, from one process
#            (RabbitMQ: confirm mode, persistent, mandatory, at most
#            QB_BENCH_RABBIT_WINDOW messages unconfirmed).
#   Q        QueueBox: ALTER SYSTEM queuebox.outbox_workers = QB_BENCH_WORKERS,
#            pg_reload_conf(); the clock runs from the reload until no row is
#            pending or processing (polled every 100 ms).  rows/s = N / time.
#            Then the workers are stopped again (their stop line gives their
#            own account of the phase) and the broker is asked how many
#            messages it holds (Kafka: also how many distinct message-ids).
#   P2       the anchor again.
#   Ratio: QueueBox rows/s / the mean of P1 and P2.
#   RabbitMQ queues are purged before each of P1, Q and P2, so each starts
#   on an empty queue.
#
# consume: first the anchors A1, then for each broker:
#   preload  the consumer off (queuebox.max_consumer_workers = 0): TRUNCATE
#            the inbox, store a configuration whose only source is this
#            broker's (kafka_in: topic src.bench; nats_in: stream SRC,
#            subject src.>; rabbitmq_in: queue src.bench; batchSize
#            QB_BENCH_SRC_BATCH, RabbitMQ prefetch QB_BENCH_RABBIT_PREFETCH),
#            then plain_producer publishes N messages into it (each with a
#            unique 36-character id the source takes as idempotency key),
#            CHECKPOINT.
#   C        ALTER SYSTEM queuebox.max_consumer_workers = 1, pg_reload_conf();
#            the clock runs from the reload until the source has N inbox rows
#            (polled every 100 ms: the inbox id sequence, then count(*) once
#            it reaches N).  rows/s = N / time; also N / (time since the
#            first id was taken), which leaves out the worker's start and
#            its connect (a Kafka group join).  Then the worker is stopped
#            (its stop line: batches, stored, dead, duplicates) and the broker
#            is asked what is left (RabbitMQ: ready messages; Kafka: the
#            group's committed offsets; NATS: the durable's state).
#   and the anchors again (A2).  One outbox worker runs, idle, throughout:
#   the launcher starts a consumer for each broker source that a worker
#   counted when it loaded the configuration, and with no outbox worker and
#   the relay off no worker loads it.  Anchors, pgbench -n -M prepared, one client
#   (the consumer is one worker), synchronous_commit on (the consumer
#   commits synchronously), rows like the consumer's (36-character key,
#   payload of the same size parsed as jsonb, a two-header object):
#     single   one INSERT ... ON CONFLICT DO NOTHING of one row per
#              transaction, for QB_BENCH_PGBENCH_T seconds (one fsync per
#              row: N rows would take minutes on a slow disk);
#     batched  QB_BENCH_SRC_BATCH rows per INSERT ... SELECT ... ON CONFLICT
#              DO NOTHING RETURNING, one per transaction, as the consumer's
#              store does, until N rows.
#   Ratios: consumer rows/s / the mean of each anchor's A1 and A2.
#
# Environment knobs (all optional):
#   QB_BENCH_BROKERS="kafka nats rabbitmq"   brokers to measure
#   QB_BENCH_SIDES="publish consume"         which directions
#   QB_BENCH_KEYS=1000              distinct keys
#   QB_BENCH_BATCH=500              outbox.batchSize
#   QB_BENCH_WORKERS=2              queuebox.outbox_workers during Q
#   QB_BENCH_KAFKA_PARTITIONS=3     partitions of qb.bench and plain.bench
#   QB_BENCH_LINGER_MS=5            linger.ms (QueueBox's config and the anchor's)
#   QB_BENCH_RABBIT_WINDOW=500      the RabbitMQ anchor's unconfirmed messages
#                                   (default: QB_BENCH_BATCH, one outbox batch)
#   QB_BENCH_SRC_BATCH=100          the sources' batchSize (their default)
#   QB_BENCH_RABBIT_PREFETCH=100    the RabbitMQ source's prefetch (its default)
#   QB_BENCH_PGBENCH_T=15           seconds of the single-row anchor
#   QB_BENCH_SHARED_BUFFERS         default 4GB (2GB when RAM < 16 GiB)
#   QB_BENCH_KEEP=1                 keep the temp dir (cluster, logs) on exit
#   QB_BENCH_RECORD=1               same as --record: append to bench/RESULTS.md
#   QB_BENCH_TIMEOUT=600            bound (s) of every wait
set -euo pipefail

RECORD=${QB_BENCH_RECORD:-0}
if [[ "${1:-}" == "--record" ]]; then RECORD=1; shift; fi
N=${1:-100000}
[[ "$N" =~ ^[0-9]+$ && "$N" -ge 1 && $# -le 1 ]] || { echo "usage: bench/brokers/run.sh [--record] [N_ROWS]" >&2; exit 2; }
CMDLINE="bench/brokers/run.sh"; [[ "$RECORD" == 1 ]] && CMDLINE+=" --record"; CMDLINE+=" $N"

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
PGBIN=${PGBIN:-$("${PG_CONFIG:-pg_config}" --bindir)}
BROKERS=${QB_BENCH_BROKERS:-kafka nats rabbitmq}
SIDES=${QB_BENCH_SIDES:-publish consume}
KEYS=${QB_BENCH_KEYS:-1000}
BATCH=${QB_BENCH_BATCH:-500}
WORKERS=${QB_BENCH_WORKERS:-2}
PARTS=${QB_BENCH_KAFKA_PARTITIONS:-3}
LINGER=${QB_BENCH_LINGER_MS:-5}
WINDOW=${QB_BENCH_RABBIT_WINDOW:-$BATCH}
SRC_BATCH=${QB_BENCH_SRC_BATCH:-100}
PREFETCH=${QB_BENCH_RABBIT_PREFETCH:-100}
PGBENCH_T=${QB_BENCH_PGBENCH_T:-15}
TIMEOUT=${QB_BENCH_TIMEOUT:-600}
STALL=60	# the consumer stores nothing for this long: fail
NATS_SERVER=${NATS_SERVER:-/usr/sbin/nats-server}
RABBIT_SERVER=${RABBIT_SERVER:-/usr/lib/rabbitmq/bin/rabbitmq-server}
RABBIT_CTL=$(dirname "$RABBIT_SERVER")/rabbitmqctl
MEM_KB=$(awk '/^MemTotal:/ {print $2}' /proc/meminfo)
if [[ -n "${QB_BENCH_SHARED_BUFFERS:-}" ]]; then SB=$QB_BENCH_SHARED_BUFFERS
elif (( MEM_KB >= 16 * 1024 * 1024 )); then SB=4GB; else SB=2GB; fi
for b in $BROKERS; do [[ "$b" == kafka || "$b" == nats || "$b" == rabbitmq ]] || { echo "QB_BENCH_BROKERS: kafka, nats and/or rabbitmq" >&2; exit 2; }; done
for v in $SIDES; do [[ "$v" == publish || "$v" == consume ]] || { echo "QB_BENCH_SIDES: publish and/or consume" >&2; exit 2; }; done
for v in "$KEYS" "$BATCH" "$WORKERS" "$PARTS" "$WINDOW" "$SRC_BATCH" "$PREFETCH" "$PGBENCH_T"; do [[ "$v" =~ ^[0-9]+$ && "$v" -ge 1 ]] || { echo "knobs must be numbers >= 1" >&2; exit 2; }; done
# src.bench holds the N preloaded messages: the mock keeps about 5 MB (some
# 12,000 of these messages) per partition and drops the oldest beyond
SRC_PARTS=$(( (N + 7999) / 8000 )); (( SRC_PARTS >= PARTS )) || SRC_PARTS=$PARTS
has() { [[ " $1 " == *" $2 "* ]]; }	# has LIST WORD

# ---------------------------------------------------------------- prerequisites
# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"
qb_bench_prereqs
[[ -x "$NATS_SERVER" ]] || ! has "$BROKERS" nats || die "$NATS_SERVER is not installed"
[[ -x "$RABBIT_SERVER" && -x "$RABBIT_CTL" ]] || ! has "$BROKERS" rabbitmq || die "$RABBIT_SERVER is not installed (scripts/setup.sh installs it)"
PGBENCH=$PGBIN/pgbench; [[ -x "$PGBENCH" ]] || PGBENCH=$(command -v pgbench) || die "pgbench not found"
if [[ ! -x "$ROOT/test/brokers/kafka_mock" || ! -x "$ROOT/test/brokers/nats_tool" || ! -x "$ROOT/test/brokers/amqp_tool" ]]; then
	log "building test/brokers (make sink)"
	make -s -C "$ROOT" sink >/dev/null || die "make sink failed"
fi
NATS_TOOL=$ROOT/test/brokers/nats_tool
AMQP_TOOL=$ROOT/test/brokers/amqp_tool

POLL_PID="" NATS_RUN_PID=""
bench_cleanup_extra() {
	[[ -n "${POLL_PID:-}" ]] && kill -TERM "$POLL_PID" 2>/dev/null
	if [[ -s "$WORK/nats.pid" ]]; then
		local np; np=$(cat "$WORK/nats.pid")
		kill -TERM "$np" 2>/dev/null
		for _ in $(seq 1 100); do kill -0 "$np" 2>/dev/null || break; sleep 0.1; done
		kill -KILL "$np" 2>/dev/null
	fi
	[[ -n "${NATS_RUN_PID:-}" ]] && wait "$NATS_RUN_PID" 2>/dev/null
	qb_bench_brokers_stop
}
qb_bench_workdir brokers

log "building bench/brokers/plain_producer"
PLAIN=$WORK/plain_producer
cc -std=gnu11 -O2 -Wall -o "$PLAIN" "$HERE/plain_producer.c" -lrdkafka -lnats -lrabbitmq || die "cannot build plain_producer"

# ---------------------------------------------------------------- the brokers
if has "$BROKERS" kafka; then
	qb_bench_kafka_start "qb.bench:$PARTS" "plain.bench:$PARTS" "src.bench:$SRC_PARTS"
	log "kafka mock cluster at $KAFKA_BOOT (pid $KM_PID, $PARTS partitions for qb.bench and plain.bench, $SRC_PARTS for src.bench)"
fi
km_consume() { # km_consume TOPIC: "written kept distinct_message_ids_kept end_line"
	local off; off=$(stat -c %s "$WORK/km.out")
	echo "consume $1" >&7
	for _ in $(seq 1 $(( TIMEOUT * 10 ))); do
		tail -c +$(( off + 1 )) "$WORK/km.out" | grep '^end ' >/dev/null && break
		sleep 0.1
	done
	tail -c +$(( off + 1 )) "$WORK/km.out" | python3 -c '
import json, sys
n, ids, end, hw = 0, set(), "no end line", {}
for line in sys.stdin:
    if line.startswith("{"):
        m = json.loads(line); n += 1; ids.add(m["headers"].get("message-id"))
        hw[m["partition"]] = max(hw.get(m["partition"], 0), m["offset"] + 1)
    elif line.startswith("end "):
        end = line.strip()
print(sum(hw.values()), n, len(ids), end.replace(" ", "_"))'
}
if has "$BROKERS" nats; then
	NATS_PORT=$(free_port) || die "no free port"
	NATS_URL=nats://127.0.0.1:$NATS_PORT
	as_pg mkdir -p "$WORK/nats"
	as_pg "$NATS_SERVER" -js -a 127.0.0.1 -p "$NATS_PORT" -sd "$WORK/nats" -P "$WORK/nats.pid" >"$WORK/nats.log" 2>&1 &
	NATS_RUN_PID=$!
	ready=0
	for _ in $(seq 1 300); do
		probe=$("$NATS_TOOL" "$NATS_URL" count __probe__ 2>&1 || true)
		if grep -qi '10059\|not found' <<<"$probe"; then ready=1; break; fi
		kill -0 "$NATS_RUN_PID" 2>/dev/null || break
		sleep 0.1
	done
	(( ready )) || die "nats-server did not become ready: $(tail -5 "$WORK/nats.log")"
	"$NATS_TOOL" "$NATS_URL" add-stream QB 'qb.>' || die "add-stream QB"
	"$NATS_TOOL" "$NATS_URL" add-stream PLAIN 'plain.>' || die "add-stream PLAIN"
	"$NATS_TOOL" "$NATS_URL" add-stream SRC 'src.>' || die "add-stream SRC"
	NATS_VERSION=$("$NATS_SERVER" --version 2>&1 | head -1)
	log "nats-server at $NATS_URL (pid $(cat "$WORK/nats.pid"), $NATS_VERSION), streams QB (qb.>), PLAIN (plain.>) and SRC (src.>)"
fi

if has "$BROKERS" rabbitmq; then
	qb_bench_rabbit_start
	"$AMQP_TOOL" "$RABBIT_URL" exchange bench direct queue qb.bench queue plain.bench queue src.bench \
		bind qb.bench bench rabbitmq.bench bind plain.bench bench plain.bench bind src.bench bench src.bench \
		|| die "cannot declare the RabbitMQ exchange and queues"
	log "rabbitmq-server $RABBIT_VERSION at $RABBIT_URL (node $RMQ_NODE, up in $RABBIT_UP_S s); exchange bench, queues qb.bench, plain.bench, src.bench"
fi
rmq_count() { "$AMQP_TOOL" "$RABBIT_URL" count "$1"; }
rmq_purge() { "$AMQP_TOOL" "$RABBIT_URL" purge "$1" >/dev/null || die "cannot purge $1"; }

# ---------------------------------------------------------------- the cluster
qb_bench_cluster brokers 50 off
q postgres "CREATE DATABASE bench"
q bench "CREATE EXTENSION queuebox"

# configure [SOURCE_YAML]: the destinations and routes, and at most one
# broker source (the consumer side measures one at a time)
configure() {
	q bench "SELECT queuebox.configure(\$yaml\$
outbox: { batchSize: $BATCH }
destinations:
  kafka: { type: kafka, brokers: \"${KAFKA_BOOT:-127.0.0.1:9}\", topic: qb.bench, config: { \"linger.ms\": \"$LINGER\" } }
  nats: { type: nats, url: \"${NATS_URL:-nats://127.0.0.1:9}\", subject: qb.bench, jetstream: true }
  rabbitmq: { type: rabbitmq, url: \"${RABBIT_URL:-amqp://guest:guest@127.0.0.1:9/}\", exchange: bench, persistent: true, mandatory: true }
routes:
  - { topicPattern: \"kafka.**\", destination: kafka }
  - { topicPattern: \"nats.**\", destination: nats }
  - { topicPattern: \"rabbitmq.**\", destination: rabbitmq }
${1:+sources:
  $1}
\$yaml\$)" >/dev/null
}
configure

set_guc max_consumer_workers 0

# ---------------------------------------------------------------- helpers
now() { echo "$EPOCHREALTIME"; }
# the rows' average payload size as PostgreSQL prints it: every message's size
SIZE=$(q bench "SELECT round(avg(octet_length(($PAYLOAD_SQL)::text))) FROM generate_series(1, $N) g")

# wait_inbox N SOURCE DEADLINE_EPOCH: poll every 100 ms from one psql
# session until SOURCE has N inbox rows.  Cheap while it runs: the inbox id
# sequence (taken by every insert, before it commits); count(*) only once it
# reaches N.  Echoes "T_FIRST T_END" (the first poll that saw an id taken,
# the poll that saw N rows), or "fail: why".
wait_inbox() {
	local n=$1 src=$2 deadline=$3 line t s c t_first="" last=-1 changed=$EPOCHSECONDS
	local sql="SELECT s || ' ' || CASE WHEN s >= $n THEN (SELECT count(*) FROM queuebox.inbox WHERE source = '$src')::text ELSE '-' END FROM (SELECT coalesce(pg_sequence_last_value(pg_get_serial_sequence('queuebox.inbox', 'id')::regclass), 0) AS s) x;"
	coproc POLL { "$PSQL" "$CONN_BASE dbname=bench" -X -At -q 2>&1; }
	while :; do
		echo "$sql" >&"${POLL[1]}"
		IFS= read -r -t 30 line <&"${POLL[0]}" || line=timeout
		t=$EPOCHREALTIME
		if [[ ! "$line" =~ ^([0-9]+)\ ([0-9]+|-)$ ]]; then echo "fail: the poll answered: $line"; break; fi
		s=${BASH_REMATCH[1]} c=${BASH_REMATCH[2]}
		[[ -z "$t_first" ]] && (( s > 0 )) && t_first=$t
		if [[ "$c" != - ]] && (( c >= n )); then echo "$t_first $t"; break; fi
		(( s != last )) && { last=$s; changed=$EPOCHSECONDS; }
		if (( EPOCHSECONDS - changed > STALL )); then echo "fail: nothing stored for ${STALL}s: $s ids taken, $c rows"; break; fi
		if (( EPOCHSECONDS > deadline )); then echo "fail: timeout: $s ids taken"; break; fi
		if grep -q 'terminated by signal' "$WORK/pg.log"; then echo "fail: a server process crashed"; break; fi
		sleep 0.1
	done
	{ echo '\q' >&"${POLL[1]}"; } 2>/dev/null || true
	wait "$POLL_PID" 2>/dev/null || true
	POLL_PID=
}

# plain_run BROKER KEY TARGET: plain_producer publishes N messages of SIZE
# bytes to TARGET (topic, subject, or routing key on exchange bench); the
# figures go into R[KEY_*]
plain_run() {
	local out rc=0
	case $1 in
		kafka) out=$("$PLAIN" kafka "$KAFKA_BOOT" "$3" "$N" "$KEYS" "$SIZE" "$LINGER") || rc=$? ;;
		nats) out=$("$PLAIN" nats "$NATS_URL" "$3" "$N" "$KEYS" "$SIZE") || rc=$? ;;
		rabbitmq) out=$("$PLAIN" rabbitmq "$RABBIT_URL" bench "$3" "$N" "$KEYS" "$SIZE" "$WINDOW") || rc=$? ;;
	esac
	log "plain $1 -> $3: $out"
	(( rc == 0 )) || die "plain_producer $1 failed (exit $rc): $out"
	read -r _ R[${2}_acked] _ R[${2}_elapsed] _ R[${2}_rows_s] _ R[${2}_setup_ms] _ R[${2}_errors] _ <<<"$out"
}

# the consumer's anchors: pgbench, one client, rows like the consumer's
q bench "CREATE SEQUENCE anchor_seq"
python3 - "$WORK" "$SIZE" "$SRC_BATCH" <<'PY'
import sys
work, size, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
# payload {"seq":n,"pad":"x..."}: about SIZE bytes for a 6-digit n
pad = max(1, size - 23)
row = ("SELECT 'anchor', k, ('{\"seq\":' || n || ',\"pad\":\"' || repeat('x', %d) || '\"}')::jsonb, "
       "('{\"X-Correlation-Id\":\"c\",\"message-id\":\"' || k || '\"}')::jsonb "
       "FROM (SELECT n, '00000000-0000-4000-8000-' || lpad(n::text, 12, '0') AS k "
       "FROM (SELECT nextval('anchor_seq') AS n FROM generate_series(1, %d)) s) r ")
with open(work + "/anchor-single.sql", "w") as f:
    f.write("INSERT INTO queuebox.inbox (source, idempotency_key, payload, headers) "
            + row % (pad, 1) + "ON CONFLICT (source, idempotency_key) DO NOTHING;\n")
with open(work + "/anchor-batched.sql", "w") as f:
    f.write("INSERT INTO queuebox.inbox (source, idempotency_key, payload, headers) "
            + row % (pad, batch) + "ON CONFLICT (source, idempotency_key) DO NOTHING RETURNING id, source, idempotency_key;\n")
PY
chmod 644 "$WORK"/anchor-*.sql

# anchor_runs TAG: the single-row and the batched anchor, into R[TAG_*]
anchor_runs() {
	local tag=$1 kind tps rows args
	for kind in single batched; do
		q bench "TRUNCATE queuebox.inbox RESTART IDENTITY"
		q postgres "CHECKPOINT"
		busy_note
		if [[ $kind == single ]]; then args=(-T "$PGBENCH_T"); else args=(-t $(( (N + SRC_BATCH - 1) / SRC_BATCH ))); fi
		"$PGBENCH" -h 127.0.0.1 -p "$PGPORT" -U postgres -n -M prepared -c 1 -j 1 "${args[@]}" \
			-f "$WORK/anchor-$kind.sql" bench >"$WORK/pgbench-$tag-$kind.out" 2>&1 \
			|| { cat "$WORK/pgbench-$tag-$kind.out" >&2; die "pgbench failed ($tag $kind)"; }
		tps=$(sed -n 's/^tps = \([0-9.]*\) (without initial connection time)/\1/p' "$WORK/pgbench-$tag-$kind.out")
		[[ -n "$tps" ]] || { cat "$WORK/pgbench-$tag-$kind.out" >&2; die "could not read pgbench's tps ($tag $kind)"; }
		rows=$(q bench "SELECT count(*) FROM queuebox.inbox WHERE source = 'anchor'")
		if [[ $kind == single ]]; then R[${tag}_${kind}]=$(printf '%.0f' "$tps"); else R[${tag}_${kind}]=$(python3 -c "print(round($tps * $SRC_BATCH))"); fi
		R[${tag}_${kind}_rows]=$rows
		log "anchor $tag $kind: ${R[${tag}_${kind}]} rows/s ($rows rows, pgbench: $(grep -E '^(number of transactions actually|latency average)' "$WORK/pgbench-$tag-$kind.out" | paste -sd';' -))"
	done
}

# ================================================================ publish
busy_note
if has "$SIDES" publish; then
for B in $BROKERS; do
	# preload, workers off
	set_guc outbox_workers 0
	wait_role outbox 0
	q bench "TRUNCATE queuebox.outbox"
	log "$B: preloading $N rows ($KEYS keys, topic $B.bench)"
	q bench "INSERT INTO queuebox.outbox (topic, key, payload, headers)
	         SELECT '$B.bench', 'k' || (g % $KEYS), $PAYLOAD_SQL, $HEADERS_SQL FROM generate_series(1, $N) g"
	q bench "VACUUM ANALYZE queuebox.outbox"
	q postgres "CHECKPOINT"
	log "$B: payload $SIZE bytes on average"

	# P1: the anchor
	[[ $B == rabbitmq ]] && rmq_purge plain.bench
	busy_note
	plain_run "$B" "${B}_p1" plain.bench
	[[ $B == rabbitmq ]] && R[${B}_p1_queue]=$(rmq_count plain.bench)

	# Q: QueueBox
	[[ $B == rabbitmq ]] && rmq_purge qb.bench
	busy_note
	logline=$(wc -l <"$WORK/pg.log")
	log "$B: starting $WORKERS outbox workers (batchSize $BATCH)"
	t0=$(now)
	set_guc outbox_workers "$WORKERS"
	t1=$(qb_bench_wait_drained $(( EPOCHSECONDS + TIMEOUT )))
	[[ "$t1" =~ ^[0-9] ]] || die "$B: the outbox did not drain within ${TIMEOUT}s ($t1): $(q bench "SELECT state, count(*) FROM queuebox.outbox GROUP BY 1" | tr '\n' ' '); last_error: $(q bench "SELECT last_error FROM queuebox.outbox WHERE last_error IS NOT NULL LIMIT 1")"
	R[${B}_q_elapsed]=$(python3 -c "print(f'{$t1 - $t0:.3f}')")
	R[${B}_q_rows_s]=$(python3 -c "print(round($N / ($t1 - $t0)))")
	read -r R[${B}_sent] R[${B}_dead] R[${B}_retried] <<<"$(q bench "SELECT count(*) FILTER (WHERE state = 'sent'), count(*) FILTER (WHERE state = 'dead'), count(*) FILTER (WHERE attempt > 1) FROM queuebox.outbox" | tr '|' ' ')"
	R[${B}_last_error]=$(q bench "SELECT last_error || ' (' || count(*) || ' rows)' FROM queuebox.outbox WHERE last_error IS NOT NULL GROUP BY last_error ORDER BY count(*) DESC LIMIT 2" | paste -sd';' -)
	log "$B: QueueBox $N rows in ${R[${B}_q_elapsed]}s -> ${R[${B}_q_rows_s]} rows/s; sent ${R[${B}_sent]}, dead ${R[${B}_dead]}, retried ${R[${B}_retried]}${R[${B}_last_error]:+; last_error: ${R[${B}_last_error]}}"
	set_guc outbox_workers 0
	wait_role outbox 0
	sleep 0.5
	R[${B}_account]=$(stop_line outbox "$logline")
	[[ -n "${R[${B}_account]}" ]] && log "$B: ${R[${B}_account]}"
	case $B in
		kafka)
			read -r written msgs ids end <<<"$(km_consume qb.bench)"
			R[${B}_broker]="topic qb.bench: $written messages written (sum of the partitions' end offsets), the last $msgs kept by the mock (it keeps about 5 MB per partition) with $ids distinct message-ids ($end)" ;;
		nats) R[${B}_broker]="stream QB holds $("$NATS_TOOL" "$NATS_URL" count QB 2>&1) messages" ;;
		rabbitmq) R[${B}_broker]="queue qb.bench holds $(rmq_count qb.bench) messages" ;;
	esac
	log "$B: ${R[${B}_broker]}"

	# P2: the anchor again
	[[ $B == rabbitmq ]] && rmq_purge plain.bench
	busy_note
	plain_run "$B" "${B}_p2" plain.bench
	if [[ $B == rabbitmq ]]; then
		R[${B}_p2_queue]=$(rmq_count plain.bench)
		R[${B}_broker]+="; plain.bench held ${R[${B}_p1_queue]} and ${R[${B}_p2_queue]}"
		rmq_purge plain.bench; rmq_purge qb.bench
	fi
	R[${B}_p_mean]=$(python3 -c "print(round((${R[${B}_p1_rows_s]} + ${R[${B}_p2_rows_s]}) / 2))")
	R[${B}_ratio]=$(fdiv "${R[${B}_q_rows_s]}" "${R[${B}_p_mean]}" 3)
	if [[ "${R[${B}_sent]}" == "$N" && "${R[${B}_dead]}" == 0 ]]; then R[${B}_check]=ok; else R[${B}_check]=FAIL; fi
done
set_guc outbox_workers 0
wait_role outbox 0
q bench "TRUNCATE queuebox.outbox"
fi

# ================================================================ consume
if has "$SIDES" consume; then
# One idle outbox worker runs throughout (the outbox is empty).  It was
# needed before d1f197a (only a worker that loaded the configuration told
# the launcher about broker sources; configure() does now) and is kept so
# the figures compare with the earlier sections.
set_guc outbox_workers 1
wait_role outbox 1
anchor_runs a1
for B in $BROKERS; do
	SRC=${B}_in
	case $B in
		kafka) yaml="$SRC: { type: kafka, brokers: \"$KAFKA_BOOT\", topics: [src.bench], batchSize: $SRC_BATCH }"; target=src.bench ;;
		nats) yaml="$SRC: { type: nats, url: \"$NATS_URL\", stream: SRC, subject: \"src.>\", batchSize: $SRC_BATCH }"; target=src.bench ;;
		rabbitmq) yaml="$SRC: { type: rabbitmq, url: \"$RABBIT_URL\", queue: src.bench, prefetch: $PREFETCH, batchSize: $SRC_BATCH }"; target=src.bench ;;
	esac
	# preload, the consumer off
	set_guc max_consumer_workers 0
	wait_role consumer 0
	q bench "TRUNCATE queuebox.inbox RESTART IDENTITY"
	configure "$yaml"
	log "$B: preloading $N messages into $target"
	plain_run "$B" "${B}_pre" "$target"
	q postgres "CHECKPOINT"

	# C: the consumer
	busy_note
	logline=$(wc -l <"$WORK/pg.log")
	log "$B: starting the consumer of source $SRC (batchSize $SRC_BATCH)"
	t0=$(now)
	set_guc max_consumer_workers 1
	res=$(wait_inbox "$N" "$SRC" $(( EPOCHSECONDS + TIMEOUT )))
	[[ "$res" =~ ^[0-9.]+\ [0-9.]+$ ]] || die "$B: the consumer did not store $N rows ($res)$([[ $B == kafka ]] && echo "; the mock keeps about 5 MB per partition of src.bench ($SRC_PARTS partitions): a shortfall may be messages it dropped"); $(grep -m3 'queuebox consumer' "$WORK/pg.log" | tail -3 | paste -sd' ' -)"
	read -r tf t1 <<<"$res"
	R[c_${B}_elapsed]=$(python3 -c "print(f'{$t1 - $t0:.3f}')")
	R[c_${B}_rows_s]=$(python3 -c "print(round($N / ($t1 - $t0)))")
	R[c_${B}_start]=$(python3 -c "print(f'{$tf - $t0:.2f}')")
	R[c_${B}_steady]=$(python3 -c "print(round($N / ($t1 - $tf)) if $t1 > $tf else 'n/a')")
	read -r R[c_${B}_rows] R[c_${B}_dead] <<<"$(q bench "SELECT count(*), count(*) FILTER (WHERE state = 'dead') FROM queuebox.inbox WHERE source = '$SRC'" | tr '|' ' ')"
	log "$B: consumer $N rows in ${R[c_${B}_elapsed]}s -> ${R[c_${B}_rows_s]} rows/s (first id after ${R[c_${B}_start]}s; ${R[c_${B}_steady]} rows/s from there); rows ${R[c_${B}_rows]}, dead ${R[c_${B}_dead]}"
	set_guc max_consumer_workers 0
	wait_role consumer 0
	sleep 0.5
	R[c_${B}_account]=$(stop_line consumer "$logline")
	[[ -n "${R[c_${B}_account]}" ]] && log "$B: ${R[c_${B}_account]}"
	case $B in
		kafka) R[c_${B}_broker]="group queuebox-$SRC committed offsets summing to $(km_answer "committed queuebox-$SRC src.bench" | awk '$1 == "ok" {s = 0; for (i = 2; i <= NF; i++) s += $i; print s; next} {print "? (" $0 ")"}') on src.bench ($SRC_PARTS partitions)" ;;
		nats) R[c_${B}_broker]="durable queuebox-$SRC: $("$NATS_TOOL" "$NATS_URL" consumer SRC "queuebox-$SRC" 2>&1)" ;;
		rabbitmq) R[c_${B}_broker]="queue src.bench: $(rmq_count src.bench) ready left" ;;
	esac
	log "$B: ${R[c_${B}_broker]}"
	if [[ "${R[c_${B}_rows]}" == "$N" && "${R[c_${B}_dead]}" == 0 ]]; then R[c_${B}_check]=ok; else R[c_${B}_check]=FAIL; fi
done
configure
anchor_runs a2
set_guc outbox_workers 0
wait_role outbox 0
for kind in single batched; do
	R[a_${kind}]=$(python3 -c "print(round((${R[a1_${kind}]} + ${R[a2_${kind}]}) / 2))")
done
for B in $BROKERS; do
	R[c_${B}_r_single]=$(fdiv "${R[c_${B}_rows_s]}" "${R[a_single]}" 2)
	R[c_${B}_r_batched]=$(fdiv "${R[c_${B}_rows_s]}" "${R[a_batched]}" 2)
done
fi
busy_note
if c=$(grep -m1 'terminated by signal' "$WORK/pg.log"); then die "a server process crashed: $c"; fi

# ================================================================ summary
SUMMARY=$(
	if has "$SIDES" publish; then
		echo "Publish: the outbox into the broker."
		echo
		echo "| broker | QueueBox (rows/s) | plain producer, before / after (rows/s) | QueueBox / plain (mean) | checks |"
		echo "|---|---|---|---|---|"
		for B in $BROKERS; do
			echo "| $B | ${R[${B}_q_rows_s]} (${R[${B}_q_elapsed]} s) | ${R[${B}_p1_rows_s]} (${R[${B}_p1_elapsed]} s) / ${R[${B}_p2_rows_s]} (${R[${B}_p2_elapsed]} s) | ${R[${B}_ratio]} | ${R[${B}_check]}: sent ${R[${B}_sent]}, dead ${R[${B}_dead]}, rows retried ${R[${B}_retried]}; ${R[${B}_broker]}; plain: ${R[${B}_p1_acked]} + ${R[${B}_p2_acked]} acknowledged |"
		done
		echo
	fi
	if has "$SIDES" consume; then
		echo "Consume: a broker source's backlog into the inbox (one consumer worker, batchSize $SRC_BATCH)."
		echo
		echo "| source | consumer (rows/s) from the reload | from the first id taken | single-row INSERT, before / after (rows/s) | batched INSERT of $SRC_BATCH, before / after (rows/s) | consumer / single-row | consumer / batched | checks |"
		echo "|---|---|---|---|---|---|---|---|"
		for B in $BROKERS; do
			echo "| $B | ${R[c_${B}_rows_s]} (${R[c_${B}_elapsed]} s) | ${R[c_${B}_steady]} (first id after ${R[c_${B}_start]} s) | ${R[a1_single]} / ${R[a2_single]} | ${R[a1_batched]} / ${R[a2_batched]} | ${R[c_${B}_r_single]} | ${R[c_${B}_r_batched]} | ${R[c_${B}_check]}: rows ${R[c_${B}_rows]}, dead ${R[c_${B}_dead]}; ${R[c_${B}_broker]}; preload by plain_producer ${R[${B}_pre_rows_s]} msg/s |"
		done
		echo
		echo "Anchors, pgbench -n -M prepared -c 1 over TCP: single-row = one INSERT ... ON CONFLICT DO NOTHING per transaction for ${PGBENCH_T} s (${R[a1_single_rows]} and ${R[a2_single_rows]} rows); batched = $SRC_BATCH rows per INSERT ... SELECT ... ON CONFLICT DO NOTHING RETURNING per transaction, as the consumer's store, ${R[a1_batched_rows]} and ${R[a2_batched_rows]} rows."
	fi
	for B in $BROKERS; do
		[[ -n "${R[${B}_last_error]:-}" ]] && echo "$B rows retried, most common last_error: ${R[${B}_last_error]}."
		[[ -n "${R[${B}_account]:-}" ]] && echo "$B, the outbox workers' own account at stop: ${R[${B}_account]}"
		[[ -n "${R[c_${B}_account]:-}" ]] && echo "$B, the consumer's own account at stop: ${R[c_${B}_account]}"
	done
	echo "CPU busy while the benchmark was idle, at the start, before each measurement and at the end (%): ${BUSY[*]} (above ~15: the machine was shared, figures are low)."
)
echo
echo "== bench/brokers: N=$N, keys $KEYS, batchSize $BATCH, PostgreSQL $PGVERSION, $(nproc) cores${R_SANITIZED:+ — WARNING: $R_SANITIZED}"
echo "$SUMMARY"

if [[ "$RECORD" == 1 ]]; then
	{
		echo
		echo "## $(date -u '+%Y-%m-%d %H:%M UTC') — bench/brokers, N=$N, commit $COMMIT${R_SANITIZED:+ ($R_SANITIZED)}"
		echo
		echo "Command: \`$CMDLINE\` (brokers \"$BROKERS\", sides \"$SIDES\", keys $KEYS, batchSize $BATCH, workers $WORKERS, source batchSize $SRC_BATCH)."
		qb_bench_machine
		echo "PostgreSQL $PGVERSION, fresh cluster: shared_buffers $SB, max_wal_size 16GB, checkpoint_timeout 30min, fsync on, synchronous_commit on; queuebox.outbox_workers 0 and queuebox.max_consumer_workers 0 except while measured, relay off."
		echo "Brokers on the same machine: Kafka = librdkafka $(dpkg-query -W -f '${Version}' librdkafka1 2>/dev/null || echo '?')'s mock cluster (test/brokers/kafka_mock, 1 broker, $PARTS partitions for the outbox's topics, $SRC_PARTS for the source's, in memory; not a real Kafka broker); NATS = ${NATS_VERSION:-n/a} -js, file storage, cnats $(dpkg-query -W -f '${Version}' libnats3.4 2>/dev/null || echo '?'); RabbitMQ = rabbitmq-server ${RABBIT_VERSION:-n/a} (Erlang $(dpkg-query -W -f '${Version}' erlang-base 2>/dev/null || echo '?')), durable classic queues, librabbitmq $(dpkg-query -W -f '${Version}' librabbitmq4 2>/dev/null || echo '?')."
		if has "$SIDES" publish; then
			echo "Publish: N rows preloaded with the workers off (~$SIZE-byte payload, $KEYS keys, header X-Correlation-Id), VACUUM ANALYZE + CHECKPOINT, then the workers started by ALTER SYSTEM + pg_reload_conf(); time from the reload until no row is pending or processing. Kafka destination: topic qb.bench, linger.ms $LINGER, idempotent, acks=all (QueueBox's settings); NATS destination: subject qb.bench, jetstream true; RabbitMQ destination: exchange bench, routing key the topic, persistent, mandatory, publisher confirms. Anchor: bench/brokers/plain_producer, one process, the same library and settings, N messages of the same size, keys and headers (Kafka: produce all, flush; NATS: js_PublishMsgAsync all, js_PublishAsyncComplete; RabbitMQ: confirm mode, persistent, mandatory, at most $WINDOW unconfirmed), run before and after QueueBox; its time includes making the connection, as QueueBox's includes starting the workers."
		fi
		if has "$SIDES" consume; then
			echo "Consume: N messages (~$SIZE bytes, a unique 36-character id each) preloaded by plain_producer with the consumer off, then queuebox.max_consumer_workers 1 by ALTER SYSTEM + pg_reload_conf(); time from the reload until the source has N inbox rows. Sources: kafka (topic src.bench, a new group), nats (stream SRC, a new durable pull consumer), rabbitmq (queue src.bench, prefetch $PREFETCH), each batchSize $SRC_BATCH. Anchors measured before and after the consumers; the ratios use their mean."
		fi
		echo
		echo "$SUMMARY"
	} >>"$ROOT/bench/RESULTS.md"
	log "appended to bench/RESULTS.md"
fi
