#!/usr/bin/env bash
# bench/brokers/run.sh: the outbox publishing into a broker (Kafka, NATS)
# against the same library publishing the same messages with no database,
# measured in the same run.
#
#   bench/brokers/run.sh [--record] [N_ROWS]        (default 100000)
#
# Run from anywhere after `make && make install` (as root, or as a user who
# can run initdb).  See bench/README.md ("bench/brokers").
#
# One temporary PostgreSQL 15 cluster (bench/lib.sh's settings), one Kafka
# cluster (test/brokers/kafka_mock: librdkafka's mock cluster on loopback TCP,
# one broker, topics qb.bench and plain.bench with QB_BENCH_KAFKA_PARTITIONS
# partitions) and one nats-server -js (streams QB on qb.> and PLAIN on
# plain.>, file storage, made by test/brokers/nats_tool).  Configuration:
# outbox.batchSize 500; destination kafka (topic qb.bench, config linger.ms 5,
# the rest as QueueBox sets it: idempotent, acks=all, message.timeout.ms
# 30000) for rows of topic kafka.bench, destination nats (subject qb.bench,
# jetstream: true) for rows of topic nats.bench.  For each broker:
#   preload  with queuebox.outbox_workers = 0: TRUNCATE, N rows in one
#            INSERT ... SELECT generate_series (QB_BENCH_KEYS keys, the
#            ~340-byte payload and the X-Correlation-Id header of
#            bench/outbox-http), VACUUM ANALYZE, CHECKPOINT.
#   P1       the anchor: bench/brokers/plain_producer (built here with cc)
#            publishes N messages of the rows' average payload size, same
#            keys, same headers, same library and settings, from one process.
#   Q        QueueBox: ALTER SYSTEM queuebox.outbox_workers = QB_BENCH_WORKERS,
#            pg_reload_conf(); the clock runs from the reload until no row is
#            pending or processing (polled every 100 ms).  rows/s = N / time.
#            Then the workers are stopped again (their stop line gives their
#            own account of the phase) and the broker is asked how many
#            messages it holds (Kafka: also how many distinct message-ids).
#   P2       the anchor again.
# Ratio: QueueBox rows/s / the mean of P1 and P2.
#
# Environment knobs (all optional):
#   QB_BENCH_BROKERS="kafka nats"   brokers to measure
#   QB_BENCH_KEYS=1000              distinct keys
#   QB_BENCH_BATCH=500              outbox.batchSize
#   QB_BENCH_WORKERS=2              queuebox.outbox_workers during Q
#   QB_BENCH_KAFKA_PARTITIONS=3     partitions of each mock topic
#   QB_BENCH_LINGER_MS=5            linger.ms (QueueBox's config and the anchor's)
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
PGBIN=${PGBIN:-/usr/lib/postgresql/15/bin}
BROKERS=${QB_BENCH_BROKERS:-kafka nats}
KEYS=${QB_BENCH_KEYS:-1000}
BATCH=${QB_BENCH_BATCH:-500}
WORKERS=${QB_BENCH_WORKERS:-2}
PARTS=${QB_BENCH_KAFKA_PARTITIONS:-3}
LINGER=${QB_BENCH_LINGER_MS:-5}
TIMEOUT=${QB_BENCH_TIMEOUT:-600}
NATS_SERVER=${NATS_SERVER:-/usr/sbin/nats-server}
MEM_KB=$(awk '/^MemTotal:/ {print $2}' /proc/meminfo)
if [[ -n "${QB_BENCH_SHARED_BUFFERS:-}" ]]; then SB=$QB_BENCH_SHARED_BUFFERS
elif (( MEM_KB >= 16 * 1024 * 1024 )); then SB=4GB; else SB=2GB; fi
for b in $BROKERS; do [[ "$b" == kafka || "$b" == nats ]] || { echo "QB_BENCH_BROKERS: kafka and/or nats" >&2; exit 2; }; done
for v in "$KEYS" "$BATCH" "$WORKERS" "$PARTS"; do [[ "$v" =~ ^[0-9]+$ && "$v" -ge 1 ]] || { echo "knobs must be numbers >= 1" >&2; exit 2; }; done

# ---------------------------------------------------------------- prerequisites
# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"
qb_bench_prereqs
[[ -x "$NATS_SERVER" ]] || [[ "$BROKERS" != *nats* ]] || die "$NATS_SERVER is not installed"
if [[ ! -x "$ROOT/test/brokers/kafka_mock" || ! -x "$ROOT/test/brokers/nats_tool" ]]; then
	log "building test/brokers (make sink)"
	make -s -C "$ROOT" sink >/dev/null || die "make sink failed"
fi
KAFKA_MOCK=$ROOT/test/brokers/kafka_mock
NATS_TOOL=$ROOT/test/brokers/nats_tool

POLL_PID="" KM_PID="" NATS_RUN_PID=""
bench_cleanup_extra() {
	[[ -n "${POLL_PID:-}" ]] && kill -TERM "$POLL_PID" 2>/dev/null
	if [[ -n "${KM_PID:-}" ]]; then
		{ echo quit >&7; } 2>/dev/null
		exec 7>&- 2>/dev/null
		for _ in $(seq 1 50); do kill -0 "$KM_PID" 2>/dev/null || break; sleep 0.1; done
		kill -KILL "$KM_PID" 2>/dev/null
	fi
	if [[ -s "$WORK/nats.pid" ]]; then
		local np; np=$(cat "$WORK/nats.pid")
		kill -TERM "$np" 2>/dev/null
		for _ in $(seq 1 100); do kill -0 "$np" 2>/dev/null || break; sleep 0.1; done
		kill -KILL "$np" 2>/dev/null
	fi
	[[ -n "${NATS_RUN_PID:-}" ]] && wait "$NATS_RUN_PID" 2>/dev/null
	return 0
}
qb_bench_workdir brokers

log "building bench/brokers/plain_producer"
PLAIN=$WORK/plain_producer
cc -std=gnu11 -O2 -Wall -o "$PLAIN" "$HERE/plain_producer.c" -lrdkafka -lnats || die "cannot build plain_producer"

# ---------------------------------------------------------------- the brokers
if [[ "$BROKERS" == *kafka* ]]; then
	mkfifo "$WORK/km.in"
	"$KAFKA_MOCK" --bootstrap-file "$WORK/km.bootstrap" --topic "qb.bench:$PARTS" --topic "plain.bench:$PARTS" \
		<"$WORK/km.in" >"$WORK/km.out" 2>"$WORK/km.err" &
	KM_PID=$!
	exec 7>"$WORK/km.in"
	for _ in $(seq 1 300); do [[ -s "$WORK/km.bootstrap" ]] && break; kill -0 "$KM_PID" 2>/dev/null || break; sleep 0.1; done
	[[ -s "$WORK/km.bootstrap" ]] || die "kafka_mock did not start: $(cat "$WORK/km.err")"
	KAFKA_BOOT=$(head -1 "$WORK/km.bootstrap")
	log "kafka mock cluster at $KAFKA_BOOT (pid $KM_PID, $PARTS partitions per topic)"
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

if [[ "$BROKERS" == *nats* ]]; then
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
	NATS_VERSION=$("$NATS_SERVER" --version 2>&1 | head -1)
	log "nats-server at $NATS_URL (pid $(cat "$WORK/nats.pid"), $NATS_VERSION), streams QB (qb.>) and PLAIN (plain.>)"
fi

# ---------------------------------------------------------------- the cluster
qb_bench_cluster brokers 50 off
q postgres "CREATE DATABASE bench"
q bench "CREATE EXTENSION queuebox"
q bench "SELECT queuebox.configure(\$yaml\$
outbox: { batchSize: $BATCH }
destinations:
  kafka: { type: kafka, brokers: \"${KAFKA_BOOT:-127.0.0.1:9}\", topic: qb.bench, config: { \"linger.ms\": \"$LINGER\" } }
  nats: { type: nats, url: \"${NATS_URL:-nats://127.0.0.1:9}\", subject: qb.bench, jetstream: true }
routes:
  - { topicPattern: \"kafka.**\", destination: kafka }
  - { topicPattern: \"nats.**\", destination: nats }
\$yaml\$)" >/dev/null

worker_count() { q bench "SELECT count(*) FROM pg_stat_activity WHERE backend_type LIKE 'queuebox outbox%'"; }
set_workers() { # set_workers K: ALTER SYSTEM + reload, returns at once
	q postgres "ALTER SYSTEM SET queuebox.outbox_workers = $1"
	q postgres "SELECT pg_reload_conf()" >/dev/null
}
wait_workers() { # wait_workers K: until K outbox workers run
	for _ in $(seq 1 300); do [[ "$(worker_count)" == "$1" ]] && return 0; sleep 0.1; done
	die "expected $1 outbox workers, pg_stat_activity shows $(worker_count)"
}

# ---------------------------------------------------------------- helpers
now() { echo "$EPOCHREALTIME"; }
PAYLOAD_SQL="jsonb_build_object('seq', g, 'type', 'order.created', 'orderId', 'ord-' || g,
  'customer', jsonb_build_object('id', 'cus-' || (g % 9973), 'name', 'Jane Example', 'email', 'jane@example.com'),
  'items', jsonb_build_array(jsonb_build_object('sku', 'A-100', 'qty', 2, 'price', '19.90'),
                              jsonb_build_object('sku', 'B-200', 'qty', 1, 'price', '5.00')),
  'total', '44.80', 'currency', 'EUR', 'note', 'padding padding padding padding padding pad')"
HEADERS_SQL="'{\"X-Correlation-Id\":\"c\"}'::jsonb"

# Poll every 100 ms from one psql session until no row is pending or
# processing.  Echoes the time.
wait_drained() { # wait_drained DEADLINE_EPOCH
	qb_bench_poll_until_false "$1" "SELECT EXISTS (SELECT 1 FROM queuebox.outbox WHERE state = 'pending') OR EXISTS (SELECT 1 FROM queuebox.outbox WHERE state = 'processing');"
}

plain_run() { # plain_run BROKER KEY SIZE: the anchor, into R[KEY_*]
	local out rc=0
	if [[ "$1" == kafka ]]; then
		out=$("$PLAIN" kafka "$KAFKA_BOOT" plain.bench "$N" "$KEYS" "$3" "$LINGER") || rc=$?
	else
		out=$("$PLAIN" nats "$NATS_URL" plain.bench "$N" "$KEYS" "$3") || rc=$?
	fi
	log "plain $1: $out"
	(( rc == 0 )) || die "plain_producer $1 failed (exit $rc): $out"
	read -r _ R[${2}_acked] _ R[${2}_elapsed] _ R[${2}_rows_s] _ R[${2}_setup_ms] _ R[${2}_errors] _ <<<"$out"
}

# ================================================================ the runs
busy_note
for B in $BROKERS; do
	# preload, workers off
	set_workers 0
	wait_workers 0
	q bench "TRUNCATE queuebox.outbox"
	log "$B: preloading $N rows ($KEYS keys, topic $B.bench)"
	q bench "INSERT INTO queuebox.outbox (topic, key, payload, headers)
	         SELECT '$B.bench', 'k' || (g % $KEYS), $PAYLOAD_SQL, $HEADERS_SQL FROM generate_series(1, $N) g"
	R[${B}_size]=$(q bench "SELECT round(avg(octet_length(payload::text))) FROM queuebox.outbox")
	q bench "VACUUM ANALYZE queuebox.outbox"
	q postgres "CHECKPOINT"
	log "$B: payload $(( R[${B}_size] )) bytes on average"

	# P1: the anchor
	busy_note
	plain_run "$B" "${B}_p1" "${R[${B}_size]}"

	# Q: QueueBox
	busy_note
	logline=$(wc -l <"$WORK/pg.log")
	log "$B: starting $WORKERS outbox workers (batchSize $BATCH)"
	t0=$(now)
	set_workers "$WORKERS"
	t1=$(wait_drained $(( EPOCHSECONDS + TIMEOUT )))
	[[ "$t1" =~ ^[0-9] ]] || die "$B: the outbox did not drain within ${TIMEOUT}s ($t1): $(q bench "SELECT state, count(*) FROM queuebox.outbox GROUP BY 1" | tr '\n' ' '); last_error: $(q bench "SELECT last_error FROM queuebox.outbox WHERE last_error IS NOT NULL LIMIT 1")"
	R[${B}_q_elapsed]=$(python3 -c "print(f'{$t1 - $t0:.3f}')")
	R[${B}_q_rows_s]=$(python3 -c "print(round($N / ($t1 - $t0)))")
	read -r R[${B}_sent] R[${B}_dead] R[${B}_retried] <<<"$(q bench "SELECT count(*) FILTER (WHERE state = 'sent'), count(*) FILTER (WHERE state = 'dead'), count(*) FILTER (WHERE attempt > 1) FROM queuebox.outbox" | tr '|' ' ')"
	R[${B}_last_error]=$(q bench "SELECT last_error || ' (' || count(*) || ' rows)' FROM queuebox.outbox WHERE last_error IS NOT NULL GROUP BY last_error ORDER BY count(*) DESC LIMIT 2" | paste -sd';' -)
	log "$B: QueueBox $N rows in ${R[${B}_q_elapsed]}s -> ${R[${B}_q_rows_s]} rows/s; sent ${R[${B}_sent]}, dead ${R[${B}_dead]}, retried ${R[${B}_retried]}${R[${B}_last_error]:+; last_error: ${R[${B}_last_error]}}"
	set_workers 0
	wait_workers 0
	sleep 0.5
	R[${B}_account]=$(tail -n +$(( logline + 1 )) "$WORK/pg.log" | grep -A1 'queuebox outbox [0-9]* stopped' | sed -n 's/.*LOG: *queuebox outbox \([0-9]*\) stopped: \(.*\)/worker \1: \2/p; s/.*DETAIL: *\(.*\)/  \1/p' | paste -sd' ' - || true)
	[[ -n "${R[${B}_account]}" ]] && log "$B: ${R[${B}_account]}"
	if [[ "$B" == kafka ]]; then
		read -r written msgs ids end <<<"$(km_consume qb.bench)"
		R[${B}_broker]="topic qb.bench: $written messages written (sum of the partitions' end offsets), the last $msgs kept by the mock (it keeps about 5 MB per partition) with $ids distinct message-ids ($end)"
	else
		R[${B}_broker]="stream QB holds $("$NATS_TOOL" "$NATS_URL" count QB 2>&1) messages"
	fi
	log "$B: ${R[${B}_broker]}"

	# P2: the anchor again
	busy_note
	plain_run "$B" "${B}_p2" "${R[${B}_size]}"
	R[${B}_p_mean]=$(python3 -c "print(round((${R[${B}_p1_rows_s]} + ${R[${B}_p2_rows_s]}) / 2))")
	R[${B}_ratio]=$(fdiv "${R[${B}_q_rows_s]}" "${R[${B}_p_mean]}" 3)
	if [[ "${R[${B}_sent]}" == "$N" && "${R[${B}_dead]}" == 0 ]]; then R[${B}_check]=ok; else R[${B}_check]=FAIL; fi
done
busy_note
if c=$(grep -m1 'terminated by signal' "$WORK/pg.log"); then die "a server process crashed: $c"; fi

# ================================================================ summary
RABBIT="not measured: no RabbitMQ publisher at HEAD (src/common/qb_pub_amqp.c)"
git -C "$ROOT" cat-file -e HEAD:src/common/qb_pub_amqp.c 2>/dev/null && RABBIT="not measured yet by this script (HEAD has a RabbitMQ publisher: add it here)"
SUMMARY=$(
	echo "| broker | QueueBox (rows/s) | plain producer, before / after (rows/s) | QueueBox / plain (mean) | checks |"
	echo "|---|---|---|---|---|"
	for B in $BROKERS; do
		echo "| $B | ${R[${B}_q_rows_s]} (${R[${B}_q_elapsed]} s) | ${R[${B}_p1_rows_s]} (${R[${B}_p1_elapsed]} s) / ${R[${B}_p2_rows_s]} (${R[${B}_p2_elapsed]} s) | ${R[${B}_ratio]} | ${R[${B}_check]}: sent ${R[${B}_sent]}, dead ${R[${B}_dead]}, rows retried ${R[${B}_retried]}; ${R[${B}_broker]}; plain: ${R[${B}_p1_acked]} + ${R[${B}_p2_acked]} acknowledged |"
	done
	echo "| rabbitmq | $RABBIT | | | |"
	echo
	echo "Consumer (inbox) rows/s: not measured yet."
	for B in $BROKERS; do
		[[ -n "${R[${B}_last_error]}" ]] && echo "$B rows retried, most common last_error: ${R[${B}_last_error]}."
		[[ -n "${R[${B}_account]}" ]] && echo "$B, the outbox workers' own account at stop: ${R[${B}_account]}"
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
		echo "Command: \`$CMDLINE\` (brokers \"$BROKERS\", keys $KEYS, batchSize $BATCH, workers $WORKERS)."
		echo "Machine: $(nproc) cores, $(( MEM_KB / 1024 / 1024 )) GiB RAM, $(. /etc/os-release 2>/dev/null; echo "${PRETTY_NAME:-linux}"), kernel $(uname -r)."
		echo "PostgreSQL $PGVERSION, fresh cluster: shared_buffers $SB, max_wal_size 16GB, checkpoint_timeout 30min, fsync on, synchronous_commit on; queuebox.outbox_workers 0 while preloading, $WORKERS while measured."
		echo "Brokers on the same machine: Kafka = librdkafka $(dpkg-query -W -f '${Version}' librdkafka1 2>/dev/null || echo '?')'s mock cluster (test/brokers/kafka_mock, 1 broker, $PARTS partitions, in memory; not a real Kafka broker); NATS = ${NATS_VERSION:-n/a} -js, file storage, cnats $(dpkg-query -W -f '${Version}' libnats3.4 2>/dev/null || echo '?')."
		echo "QueueBox: N rows preloaded with the workers off (~${R[${BROKERS%% *}_size]}-byte payload, $KEYS keys, header X-Correlation-Id), VACUUM ANALYZE + CHECKPOINT, then the workers started by ALTER SYSTEM + pg_reload_conf(); time from the reload until no row is pending or processing. Kafka destination: topic qb.bench, linger.ms $LINGER, idempotent, acks=all (QueueBox's settings); NATS destination: subject qb.bench, jetstream true. Anchor: bench/brokers/plain_producer, one process, the same library and settings, N messages of the same size, keys and headers (Kafka: produce all, flush; NATS: js_PublishMsgAsync all, js_PublishAsyncComplete), run before and after QueueBox; its time includes making the connection, as QueueBox's includes starting the workers."
		echo
		echo "$SUMMARY"
	} >>"$ROOT/bench/RESULTS.md"
	log "appended to bench/RESULTS.md"
fi
