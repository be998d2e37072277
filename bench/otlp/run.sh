#!/usr/bin/env bash
# bench/otlp/run.sh: what exporting spans (telemetry.otlp) costs delivery,
# against the same delivery with no export, measured in the same run.
#
#   bench/otlp/run.sh [--record] [N_ROWS]          (default 50000)
#
# Run from anywhere after `make && make install` (as root, or as a user who
# can run initdb).  See bench/README.md ("bench/otlp").
#
# One temporary PostgreSQL cluster, 2 outbox workers; an http destination
# on a loopback sink (test/sink/qb_sink) and a second sink as the OTLP
# receiver (it answers 200 to every POST /v1/traces).  Each run: TRUNCATE the
# outbox, CHECKPOINT, N pending rows in one INSERT ... SELECT, each with a
# traceparent of its own (sampled), and the clock runs from the INSERT's
# return until no row is pending or processing.  Scenarios, alternated
# ROUNDS times (the median rows/s is reported):
#   off    no telemetry: the anchor
#   on     telemetry.otlp.endpoint = the receiver: a span per attempt
#   down   telemetry.otlp.endpoint = a port nothing listens on: every post
#          fails and its spans are dropped (delivery must not wait for it)
# Ratios: on / off and down / off.  Spans exported and dropped are read from
# /metrics (queuebox_otlp_spans_exported_total, _dropped_total) per run.
#
# Environment knobs: QB_BENCH_ROUNDS=3, QB_BENCH_SHARED_BUFFERS (default 4GB;
# 2GB below 16 GiB of RAM), QB_BENCH_KEEP=1 (keep the temp dir),
# QB_BENCH_RECORD=1 (same as --record: append a section to bench/RESULTS.md),
# QB_BENCH_TIMEOUT=600 (bound, s, of every wait).
set -euo pipefail

RECORD=${QB_BENCH_RECORD:-0}
if [[ "${1:-}" == "--record" ]]; then RECORD=1; shift; fi
N=${1:-50000}
[[ "$N" =~ ^[0-9]+$ && "$N" -ge 100 && $# -le 1 ]] || { echo "usage: bench/otlp/run.sh [--record] [N_ROWS>=100]" >&2; exit 2; }
CMDLINE="bench/otlp/run.sh"; [[ "$RECORD" == 1 ]] && CMDLINE+=" --record"; CMDLINE+=" $N"

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
PGBIN=${PGBIN:-$("${PG_CONFIG:-pg_config}" --bindir)}
ROUNDS=${QB_BENCH_ROUNDS:-3}
TIMEOUT=${QB_BENCH_TIMEOUT:-600}
MEM_KB=$(awk '/^MemTotal:/ {print $2}' /proc/meminfo)
if [[ -n "${QB_BENCH_SHARED_BUFFERS:-}" ]]; then SB=$QB_BENCH_SHARED_BUFFERS
elif (( MEM_KB >= 16 * 1024 * 1024 )); then SB=4GB; else SB=2GB; fi

# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"
qb_bench_prereqs
qb_bench_workdir otlp
qb_bench_sink_build
start_sink main
start_sink otlp
qb_bench_cluster otlp 50 off 2
q postgres "CREATE DATABASE bench"
q bench "CREATE EXTENSION queuebox" 2>/dev/null
HTTP_PORT=$(free_port) || die "no free port"
DOWN_PORT=$(free_port) || die "no free port"

configure() { # configure off|on|down
	local tel=""
	case $1 in
		on) tel="telemetry: { otlp: { endpoint: \"http://127.0.0.1:$SINK_PORT_otlp\" } }" ;;
		down) tel="telemetry: { otlp: { endpoint: \"http://127.0.0.1:$DOWN_PORT\", timeoutMs: 1000 } }" ;;
	esac
	q bench "SELECT queuebox.configure(\$yaml\$
outbox: { batchSize: 100, pollIntervalMs: 100 }
http: { listen: \"127.0.0.1:$HTTP_PORT\" }
destinations:
  web: { type: http, baseUrl: \"http://127.0.0.1:$SINK_PORT_main\", path: /in }
routes:
  - { topicPattern: \"**\", destination: web }
$tel
\$yaml\$)" >/dev/null
}
metric() { curl -s --max-time 5 "http://127.0.0.1:$HTTP_PORT/metrics" | sed -n "s/^$1 \([0-9]*\)$/\1/p"; }
now() { echo "$EPOCHREALTIME"; }

declare -A RATES EXP DROP
for ((r = 1; r <= ROUNDS; r++)); do
	for mode in off on down; do
		configure "$mode"
		sleep 1	# the workers load it at commit; the ingress starts listening
		q bench "TRUNCATE queuebox.outbox"
		q postgres "CHECKPOINT"
		busy_note
		e0=$(metric queuebox_otlp_spans_exported_total); d0=$(metric queuebox_otlp_spans_dropped_total)
		q bench "INSERT INTO queuebox.outbox (topic, key, payload, headers)
			SELECT 'bench.event', 'k' || (g % 1000), jsonb_build_object('n', g),
			       jsonb_build_object('traceparent', '00-' || md5(g::text) || '-' || substr(md5('s' || g), 1, 16) || '-01')
			FROM generate_series(1, $N) g"
		t0=$(now)
		t1=$(qb_bench_poll_until_false $(( EPOCHSECONDS + TIMEOUT )) \
			"SELECT EXISTS (SELECT 1 FROM queuebox.outbox WHERE state IN ('pending', 'processing'));")
		[[ "$t1" =~ ^[0-9] ]] || die "$mode: not delivered within ${TIMEOUT}s ($t1)"
		sent=$(q bench "SELECT count(*) FROM queuebox.outbox WHERE state = 'sent'")
		[[ "$sent" == "$N" ]] || die "$mode: $sent of $N rows sent"
		sleep 2	# the last batch of spans is posted (flushIntervalMs 1000)
		rate=$(python3 -c "print(round($N / ($t1 - $t0)))")
		RATES[$mode]+=" $rate"
		EXP[$mode]+=" $(( $(metric queuebox_otlp_spans_exported_total) - e0 ))"
		DROP[$mode]+=" $(( $(metric queuebox_otlp_spans_dropped_total) - d0 ))"
		log "round $r, $mode: $N rows in $(python3 -c "print(f'{$t1 - $t0:.2f}')") s -> $rate rows/s; spans exported ${EXP[$mode]##* }, dropped ${DROP[$mode]##* }"
	done
done
busy_note

SUMMARY=$(
	off=$(median ${RATES[off]}); on=$(median ${RATES[on]}); down=$(median ${RATES[down]})
	echo "| telemetry | delivered rows/s (median of $ROUNDS) | runs | spans exported per run | spans dropped per run | / off |"
	echo "|---|---|---|---|---|---|"
	echo "| off (the anchor) | $off |${RATES[off]} |${EXP[off]} |${DROP[off]} | 1.00 |"
	echo "| on: a receiver on loopback | $on |${RATES[on]} |${EXP[on]} |${DROP[on]} | $(fdiv "$on" "$off" 2) |"
	echo "| down: the receiver's port refuses | $down |${RATES[down]} |${EXP[down]} |${DROP[down]} | $(fdiv "$down" "$off" 2) |"
	echo
	echo "CPU busy while the benchmark was idle, before each run and at the end (%): ${BUSY[*]} (above ~15: the machine was shared, figures are low)."
)
echo
echo "== bench/otlp: N=$N, PostgreSQL $PGVERSION, $(nproc) cores${R_SANITIZED:+ — WARNING: $R_SANITIZED}"
echo "$SUMMARY"

if [[ "$RECORD" == 1 ]]; then
	{
		echo
		echo "## $(date -u '+%Y-%m-%d %H:%M UTC') — bench/otlp, N=$N, commit $COMMIT${R_SANITIZED:+ ($R_SANITIZED)}"
		echo
		echo "Command: \`$CMDLINE\` ($ROUNDS rounds)."
		qb_bench_machine
		echo "PostgreSQL $PGVERSION, fresh cluster: shared_buffers $SB, fsync on, synchronous_commit on; 2 outbox workers (batchSize 100), one http destination on a loopback sink; the OTLP receiver a second sink. N traced rows (a traceparent each, sampled) in one INSERT after TRUNCATE + CHECKPOINT; time from the INSERT's return until none is pending or processing."
		echo
		echo "$SUMMARY"
	} >>"$ROOT/bench/RESULTS.md"
	log "appended to bench/RESULTS.md"
fi
