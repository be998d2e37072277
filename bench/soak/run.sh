#!/usr/bin/env bash
# bench/soak/run.sh: does a worker's memory stay flat over a long life?
#
#   bench/soak/run.sh [--record] [N]          (default N = 1000000 per phase)
#
# Run from the repository root after `make && make install && make sink`, as
# root or as a user who can run initdb.  One temporary cluster with the
# extension (2 outbox workers, the relay, the ingress, one consumer worker
# per broker phase) and the brokers of the phases asked for: nats-server -js,
# test/brokers/kafka_mock (librdkafka's mock cluster, in memory), a private
# rabbitmq-server (all on loopback).  Up to six phases, one after the other,
# each moving N messages through one worker kind while a sampler reads the
# RssAnon of every QueueBox background worker (/proc/PID/status) every 2 s:
#   outbox   N outbox rows (inserted 50,000 a transaction) delivered over
#            HTTP to test/sink/qb_sink by the outbox workers;
#   relay    N push inbox rows forwarded into the outbox by the relay (and
#            delivered by the outbox workers);
#   ingress  N webhooks POSTed by wrk (bench/inbox-http/post.lua, a unique
#            key each) to a pull source, stored by the ingress worker;
#   nats     N messages published to a JetStream stream
#            (bench/brokers/plain_producer), stored by the consumer worker
#            of a pull source;
#   kafka    the same through topic src.soak of the mock cluster (N / 8000
#            partitions: the mock keeps about 5 MB a partition);
#   rabbitmq the same through queue src.soak (persistent messages, publisher
#            confirms), its consumer worker acknowledging after each commit.
# Each broker source has its own consumer worker (slot k serves the k-th
# broker source of the document); the sampler names workers as their
# process title does ("queuebox consumer 1"), so each phase reads its own.
# For each worker of a phase: RssAnon when the phase has moved 20 % of its
# messages (after warm-up: caches, pools, the first transforms) and at its
# end, and the growth between the two (the issue's target: < 5 %); and
# RssAnon at each fifth of the messages, the curve that tells a cache that
# fills once (flat after it) from a leak (a step at every fifth).  Nothing
# here is an anchor ratio: memory is compared with itself, so the figures do
# not depend on how fast the machine is that day.
#
# Knobs: QB_BENCH_SHARED_BUFFERS (default 1GB), QB_BENCH_KAFKA_PARTITIONS
# (default N / 8000, fewer lose messages), QB_BENCH_KAFKA_CHUNKS (default 1:
# all N at once; K: N / K at a time, each once the last is stored, so the
# backlog librdkafka prefetches stays small), QB_BENCH_TIMEOUT=1800 (the
# bound of each phase), QB_BENCH_KAFKA_CONFIG (librdkafka properties of the
# Kafka source, YAML flow entries: '"queued.max.messages.kbytes": "16384"'),
# QB_BENCH_PHASES="outbox relay ingress nats kafka
# rabbitmq" (any of them, in that order or another).
set -euo pipefail

RECORD=${QB_BENCH_RECORD:-0}
if [[ "${1:-}" == "--record" ]]; then RECORD=1; shift; fi
N=${1:-1000000}
[[ "$N" =~ ^[0-9]+$ && "$N" -ge 1000 ]] || { echo "usage: bench/soak/run.sh [--record] [N >= 1000]" >&2; exit 2; }
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PGBIN=${PGBIN:-$("${PG_CONFIG:-pg_config}" --bindir)}
SB=${QB_BENCH_SHARED_BUFFERS:-1GB}
TIMEOUT=${QB_BENCH_TIMEOUT:-1800}
PHASES=${QB_BENCH_PHASES:-outbox relay ingress nats kafka rabbitmq}
has() { [[ " $PHASES " == *" $1 "* ]]; }	# has PHASE
NATS_SERVER=${NATS_SERVER:-/usr/sbin/nats-server}
CHUNK=50000

# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"
qb_bench_prereqs
command -v wrk >/dev/null || die "wrk not found (apt-get install -y wrk)"
! has nats || [[ -x "$NATS_SERVER" ]] || die "$NATS_SERVER is not installed"
for t in nats_tool kafka_mock amqp_tool; do
	[[ -x "$ROOT/test/brokers/$t" ]] || die "no test/brokers/$t (make sink)"
done
SAMPLER_PID=
bench_cleanup_extra() {
	[[ -n "${SAMPLER_PID:-}" ]] && kill "$SAMPLER_PID" 2>/dev/null
	[[ -s "$WORK/nats.pid" ]] && kill "$(cat "$WORK/nats.pid")" 2>/dev/null
	qb_bench_brokers_stop
}
qb_bench_workdir soak
qb_bench_sink_build
start_sink soak
PLAIN=$WORK/plain_producer
cc -std=gnu11 -O2 -Wall -o "$PLAIN" "$ROOT/bench/brokers/plain_producer.c" -lrdkafka -lnats -lrabbitmq \
	|| die "cannot build plain_producer"

# ---- the brokers of the phases; SOURCES: their sources, one consumer slot each
SOURCES="" SLOTS="" BROKER_VERSIONS=""
add_source() { # add_source PHASE YAML
	SLOTS+="$1:$(grep -c . <<<"$SOURCES" || true) "
	SOURCES+="  $2"$'\n'
}
if has nats; then
	NATS_PORT=$(free_port)
	NATS_URL=nats://127.0.0.1:$NATS_PORT
	as_pg mkdir -p "$WORK/nats"
	as_pg "$NATS_SERVER" -js -a 127.0.0.1 -p "$NATS_PORT" -sd "$WORK/nats" -P "$WORK/nats.pid" >"$WORK/nats.log" 2>&1 &
	for _ in $(seq 1 300); do
		grep -qi '10059\|not found' <<<"$("$ROOT/test/brokers/nats_tool" "$NATS_URL" count __probe__ 2>&1 || true)" && break
		sleep 0.1
	done
	"$ROOT/test/brokers/nats_tool" "$NATS_URL" add-stream SRC 'src.>' >/dev/null || die "add-stream SRC"
	BROKER_VERSIONS+="$("$NATS_SERVER" --version 2>&1 | head -1); "
	add_source nats "natsin: { type: nats, url: \"$NATS_URL\", stream: SRC, subject: \"src.>\", batchSize: 100, consumption: pull }"
fi
if has kafka; then
	KAFKA_PARTS=${QB_BENCH_KAFKA_PARTITIONS:-$(( (N + 7999) / 8000 ))}
	KAFKA_CHUNKS=${QB_BENCH_KAFKA_CHUNKS:-1}
	qb_bench_kafka_start "src.soak:$KAFKA_PARTS"
	BROKER_VERSIONS+="Kafka: librdkafka $(dpkg-query -W -f '${Version}' librdkafka1 2>/dev/null || echo '?')'s mock cluster, $KAFKA_PARTS partitions; "
	add_source kafka "kafkain: { type: kafka, brokers: \"$KAFKA_BOOT\", topics: [src.soak], batchSize: 100, consumption: pull${QB_BENCH_KAFKA_CONFIG:+, config: { $QB_BENCH_KAFKA_CONFIG \}} }"
fi
if has rabbitmq; then
	qb_bench_rabbit_start
	"$ROOT/test/brokers/amqp_tool" "$RABBIT_URL" exchange soak direct queue src.soak bind src.soak soak src.soak >/dev/null \
		|| die "cannot declare the RabbitMQ exchange and queue"
	BROKER_VERSIONS+="rabbitmq-server $RABBIT_VERSION; "
	add_source rabbitmq "rabbitin: { type: rabbitmq, url: \"$RABBIT_URL\", queue: src.soak, batchSize: 100, consumption: pull }"
fi

# ---- the cluster: every worker kind up from the start
qb_bench_cluster soak 50 on 2
q postgres "CREATE DATABASE bench"
q bench "CREATE EXTENSION queuebox"
HTTP_PORT=$(free_port)
q bench "SELECT queuebox.configure(\$yaml\$
http: { listen: \"127.0.0.1:$HTTP_PORT\", maxConnections: 256 }
destinations:
  sink: { type: http, baseUrl: \"http://127.0.0.1:$SINK_PORT_soak\", path: /events, timeoutMs: 10000 }
routes:
  - { topicPattern: \"**\", destination: sink }
sources:
  hooks: { type: http, path: /hooks, idempotencyKeyHeader: X-Id, topic: \"soak.relay\" }
  bench: { type: http, path: /bench, idempotencyKeyHeader: X-Id, consumption: pull }
$SOURCES\$yaml\$)" >/dev/null
NCONS=$(wc -w <<<"$SLOTS")
set_guc max_consumer_workers "$NCONS"
for _ in $(seq 1 300); do
	[[ $(q bench "SELECT count(*) FROM pg_stat_activity WHERE backend_type LIKE 'queuebox %'") -ge $(( 5 + NCONS )) ]] && break
	sleep 0.2
done

# ---- the sampler: "epoch phase worker pid rss_anon_kb" every 2 s; worker:
# the process title's name ("queuebox_consumer_1"), else the backend type
echo "none" >"$WORK/phase"
(
	while :; do
		ph=$(cat "$WORK/phase")
		now=$(date +%s)
		# a server that restarts after a worker's crash must not end the sampler
		{ q bench "SELECT pid || '|' || backend_type FROM pg_stat_activity WHERE backend_type LIKE 'queuebox %'" 2>/dev/null || true; } |
			while IFS='|' read -r pid bt; do
				kb=$(awk '/^RssAnon:/ {print $2}' "/proc/$pid/status" 2>/dev/null || true)
				title=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -oE 'queuebox [a-z]+( [0-9]+)?' || true)
				bt=${title:-$bt}
				[[ -n "$kb" ]] && echo "$now $ph ${bt// /_} $pid $kb"
			done
		sleep 2
	done
) >"$WORK/rss.log" 2>/dev/null &
SAMPLER_PID=$!

# mark PHASE DONE: the moment the phase has moved DONE messages (20 % and 100 %)
mark() { echo "$(date +%s) $1 $2" >>"$WORK/marks.log"; }

wait_count() { # wait_count PHASE SQL TARGET: polls until SQL gives TARGET; marks 20, 40, 60, 80 % and the end
	local ph=$1 sql=$2 target=$3 n=0 fifth=1 deadline=$(( EPOCHSECONDS + TIMEOUT ))
	while (( EPOCHSECONDS < deadline )); do
		n=$(q bench "$sql" 2>/dev/null || echo "$n")   # the same through a crash restart
		while (( fifth < 5 && n * 5 >= fifth * target )); do
			mark "$ph" "p$(( fifth * 20 ))"
			fifth=$(( fifth + 1 ))
		done
		(( n >= target )) && { mark "$ph" end; return 0; }
		sleep 1
	done
	die "$ph: $n of $target after ${TIMEOUT}s"
}

# kafka_paced: N messages in KAFKA_CHUNKS runs of plain_producer, each after
# the worker has stored the one before (a backlog of N / KAFKA_CHUNKS at most);
# a second apart, as plain_producer's ids hold the second it started
kafka_paced() {
	local c sent=0 k
	for (( c = 1; c <= KAFKA_CHUNKS; c++ )); do
		k=$(( c == KAFKA_CHUNKS ? N - sent : N / KAFKA_CHUNKS ))
		"$PLAIN" kafka "$KAFKA_BOOT" src.soak "$k" 1000 200 >>"$WORK/plain.out" 2>&1 || return 1
		sent=$(( sent + k ))
		until (( $(q bench "SELECT count(*) FROM queuebox.inbox WHERE source = 'kafkain'" 2>/dev/null || echo 0) >= sent )); do sleep 0.5; done
		sleep 1
	done
}

insert_chunks() { # insert_chunks SQL_PREFIX: N rows, CHUNK a transaction (g = the row number)
	local done=0 k
	while (( done < N )); do
		k=$(( N - done < CHUNK ? N - done : CHUNK ))
		q bench "$1 FROM generate_series($(( done + 1 )), $(( done + k ))) g"
		done=$(( done + k ))
	done
}

for ph in $PHASES; do
	echo "$ph" >"$WORK/phase"
	log "$ph: $N messages"
	mark "$ph" start
	case $ph in
		outbox)
			insert_chunks "INSERT INTO queuebox.outbox (topic, key, payload) SELECT 'soak.outbox', 'k' || (g % 1000), jsonb_build_object('n', g, 'pad', repeat('x', 150))" &
			INS=$!
			wait_count outbox "SELECT count(*) FROM queuebox.outbox WHERE topic = 'soak.outbox' AND state = 'sent'" "$N"
			wait "$INS"
			;;
		relay)
			insert_chunks "INSERT INTO queuebox.inbox (source, idempotency_key, aggregate_id, payload) SELECT 'hooks', 'h-' || g, 'a' || (g % 1000), jsonb_build_object('n', g, 'pad', repeat('x', 150))" &
			INS=$!
			wait_count relay "SELECT count(*) FROM queuebox.inbox WHERE source = 'hooks' AND state = 'processed'" "$N"
			wait "$INS"
			;;
		ingress)
			# wrk runs by time: long enough for N at the rate of a first short run
			QB_RUN_TAG=probe wrk -t2 -c32 -d5s -s "$ROOT/bench/inbox-http/post.lua" "http://127.0.0.1:$HTTP_PORT/inbox/bench" >"$WORK/wrk-probe.out" 2>&1 || die "wrk failed"
			have=$(q bench "SELECT count(*) FROM queuebox.inbox WHERE source = 'bench'")
			secs=$(python3 -c "print(max(10, min($TIMEOUT, int(($N - $have) / max($have / 5.0, 1)) + 5)))")
			log "ingress: $have stored in the 5 s probe; wrk for ${secs}s"
			QB_RUN_TAG=soak wrk -t2 -c32 -d"${secs}s" --timeout 10s -s "$ROOT/bench/inbox-http/post.lua" "http://127.0.0.1:$HTTP_PORT/inbox/bench" >"$WORK/wrk.out" 2>&1 &
			WRK=$!
			target=$N
			wait_count ingress "SELECT count(*) FROM queuebox.inbox WHERE source = 'bench'" "$target" || true
			kill "$WRK" 2>/dev/null || true
			wait "$WRK" 2>/dev/null || true
			;;
		nats)
			"$PLAIN" nats "$NATS_URL" src.soak "$N" 1000 200 >"$WORK/plain.out" 2>&1 || die "plain_producer: $(tail -3 "$WORK/plain.out")"
			wait_count nats "SELECT count(*) FROM queuebox.inbox WHERE source = 'natsin'" "$N"
			;;
		kafka)
			if (( KAFKA_CHUNKS > 1 )); then
				kafka_paced &
				PROD=$!
				wait_count kafka "SELECT count(*) FROM queuebox.inbox WHERE source = 'kafkain'" "$N"
				wait "$PROD" || die "plain_producer: $(tail -3 "$WORK/plain.out")"
			else
				"$PLAIN" kafka "$KAFKA_BOOT" src.soak "$N" 1000 200 >"$WORK/plain.out" 2>&1 || die "plain_producer: $(tail -3 "$WORK/plain.out")"
				wait_count kafka "SELECT count(*) FROM queuebox.inbox WHERE source = 'kafkain'" "$N"
			fi
			;;
		rabbitmq)
			"$PLAIN" rabbitmq "$RABBIT_URL" soak src.soak "$N" 1000 200 >"$WORK/plain.out" 2>&1 || die "plain_producer: $(tail -3 "$WORK/plain.out")"
			wait_count rabbitmq "SELECT count(*) FROM queuebox.inbox WHERE source = 'rabbitin'" "$N"
			;;
		*) die "unknown phase $ph" ;;
	esac
	sleep 4   # a last sample after the end
done
kill "$SAMPLER_PID" 2>/dev/null; SAMPLER_PID=

# ---- the summary: per phase, each worker kind that phase drives
SUMMARY=$(python3 - "$WORK/rss.log" "$WORK/marks.log" "$SLOTS" <<'EOF'
import sys, collections
rss = [l.split() for l in open(sys.argv[1]) if len(l.split()) == 5]
marks = collections.defaultdict(dict)
for l in open(sys.argv[2]):
    t, ph, what = l.split()
    marks[ph][what] = int(t)
drives = {"outbox": ["queuebox_outbox"], "relay": ["queuebox_relay", "queuebox_outbox"],
          "ingress": ["queuebox_ingress"]}
for ps in sys.argv[3].split():   # "kafka:1": the phase's consumer slot
    ph, slot = ps.split(":")
    drives[ph] = [f"queuebox_consumer_{slot}"]
rows = []
for ph, m in marks.items():
    if "p20" not in m or "end" not in m:
        continue
    m["warm"] = m["p20"]
    for bt in drives.get(ph, []):
        pids = sorted({r[3] for r in rss if r[1] == ph and r[2].startswith(bt)})
        for pid in pids:
            s = [(int(r[0]), int(r[4])) for r in rss if r[1] == ph and r[3] == pid]
            if not s:
                continue
            warm = next((kb for t, kb in s if t >= m["warm"]), s[-1][1])
            end = [kb for t, kb in s if t <= m["end"] + 4][-1]
            peak = max(kb for t, kb in s)
            start = s[0][1]
            g = 100.0 * (end - warm) / warm if warm else 0.0
            # the curve: a cache that fills stops climbing, a leak climbs at each fifth
            curve = " / ".join(f"{next((kb for t, kb in s if t >= m[k]), s[-1][1]) / 1024:.2f}"
                               for k in ("p20", "p40", "p60", "p80") if k in m)
            curve += f" / {end / 1024:.2f}"
            rows.append(f"| {ph} | {bt.replace('_', ' ')} (pid {pid}) | {m['end'] - m['start']} | {start / 1024:.1f} | {warm / 1024:.1f} | {end / 1024:.1f} | {peak / 1024:.1f} | {g:+.1f} % | {curve} |")
print("\n".join(rows))
EOF
)
{
	echo "## $(date -u '+%Y-%m-%d %H:%M UTC') — bench/soak, commit $COMMIT"
	echo
	echo "Command: \`${QB_BENCH_KAFKA_CHUNKS:+QB_BENCH_KAFKA_CHUNKS=$QB_BENCH_KAFKA_CHUNKS }${QB_BENCH_KAFKA_PARTITIONS:+QB_BENCH_KAFKA_PARTITIONS=$QB_BENCH_KAFKA_PARTITIONS }${QB_BENCH_KAFKA_CONFIG:+QB_BENCH_KAFKA_CONFIG='$QB_BENCH_KAFKA_CONFIG' }QB_BENCH_PHASES=\"$PHASES\" bench/soak/run.sh$( ((RECORD)) && echo " --record") $N\`. $N messages per phase (outbox: HTTP to qb_sink; relay: push inbox rows forwarded and delivered; ingress: wrk POSTs, a unique key each; nats, kafka, rabbitmq: messages published by plain_producer and stored by the source's consumer worker). RssAnon read from /proc/PID/status every 2 s; warm = when the phase had moved 20 % of its messages; growth = end against warm (target < 5 %)."
	qb_bench_machine
	echo "PostgreSQL $(q postgres 'SHOW server_version'), shared_buffers $SB; ${BROKER_VERSIONS}wrk $(wrk -v 2>&1 | head -1 | awk '{print $2}')."
	echo
	echo "| phase | worker | seconds | RssAnon at start (MB) | at warm (MB) | at end (MB) | peak (MB) | growth end/warm | at 20/40/60/80/100 % (MB) |"
	echo "|---|---|---|---|---|---|---|---|---|"
	echo "$SUMMARY"
	echo
	# a worker that died and was restarted starts its memory afresh: the figures would hide it
	CRASHES=$(grep -c "was terminated by signal" "$WORK/pg.log" || true)
	echo "Workers that crashed during the run (server log, \"terminated by signal\"): $CRASHES."
	echo
} | tee "$WORK/section.md"
if ((RECORD)); then cat "$WORK/section.md" >>"$ROOT/bench/RESULTS.md"; log "recorded in bench/RESULTS.md"; fi
