#!/usr/bin/env bash
# bench/crash/run.sh: how long after a crash every key delivers again
# (issue 24), with takeover against the same run with takeover off.
#
#   bench/crash/run.sh [--record] [N_ROWS]          (default 20000)
#
# Run from the repository root after `make && make install` (as root, or as
# a user who can run initdb).  See bench/README.md ("bench/crash").
#
# One temporary PostgreSQL cluster, queuebox.outbox_workers = 2 (the
# default queuebox.worker_async_commit = on), an HTTP sink answering after
# QB_BENCH_DELAY_MS (5) ms, N rows over QB_BENCH_KEYS (500) keys.  Two runs,
# in this order, each on an emptied outbox and a fresh sink log:
#   T   takeover on (outbox.takeover: true), claimTimeoutMs 600000 (10 min,
#       so nothing in this run can be a lease ending);
#   L   the anchor, takeover off (outbox.takeover: false): today's lease
#       wait, with claimTimeoutMs QB_BENCH_LEASE_MS (30000) instead of the
#       5-minute default, to keep the run short.
# In each: fill, wait until a fifth of the rows are sent, kill -9 the
# postmaster and all its children (a machine crash, as the operator's
# measure), start the cluster again (pg_ctl -w: t0 = it accepts
# connections), wait until every row is sent.  From the sink's log (the
# time each request was read): per key that still had rows, the delay from
# t0 to its first 2xx; the last row's delay; rows delivered twice; rows not
# sent (lost).  The ratio is T's slowest key against L's.
#
# Environment knobs: QB_BENCH_KEYS, QB_BENCH_DELAY_MS, QB_BENCH_LEASE_MS,
# QB_BENCH_SHARED_BUFFERS, QB_BENCH_KEEP=1, QB_BENCH_RECORD=1 (as --record),
# QB_BENCH_TIMEOUT (900 s per wait).
set -euo pipefail

RECORD=${QB_BENCH_RECORD:-0}
if [[ "${1:-}" == "--record" ]]; then RECORD=1; shift; fi
N=${1:-20000}
[[ "$N" =~ ^[0-9]+$ && "$N" -ge 100 && $# -le 1 ]] || { echo "usage: bench/crash/run.sh [--record] [N_ROWS >= 100]" >&2; exit 2; }
CMDLINE="bench/crash/run.sh"; [[ "$RECORD" == 1 ]] && CMDLINE+=" --record"; CMDLINE+=" $N"

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
PGBIN=${PGBIN:-$("${PG_CONFIG:-pg_config}" --bindir)}
KEYS=${QB_BENCH_KEYS:-500}
DELAY=${QB_BENCH_DELAY_MS:-5}
LEASE_OFF=${QB_BENCH_LEASE_MS:-30000}
LEASE_ON=600000
TIMEOUT=${QB_BENCH_TIMEOUT:-900}
MEM_KB=$(awk '/^MemTotal:/ {print $2}' /proc/meminfo)
if [[ -n "${QB_BENCH_SHARED_BUFFERS:-}" ]]; then SB=$QB_BENCH_SHARED_BUFFERS
elif (( MEM_KB >= 16 * 1024 * 1024 )); then SB=4GB; else SB=2GB; fi
for v in "$KEYS" "$DELAY" "$LEASE_OFF"; do [[ "$v" =~ ^[0-9]+$ ]] || { echo "QB_BENCH_KEYS, _DELAY_MS, _LEASE_MS: numbers" >&2; exit 2; }; done

# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"
qb_bench_prereqs
qb_bench_sink_build
qb_bench_workdir crash
qb_bench_cluster crash 50 off 2
declare -A R
now() { python3 -c 'import time; print(f"{time.time():.6f}")'; }

configure() { # configure TAKEOVER LEASE_MS
	q bench "SELECT queuebox.configure(\$yaml\$
outbox: { batchSize: 100, claimTimeoutMs: $2, takeover: $1 }
destinations:
  sink: { type: http, baseUrl: \"http://127.0.0.1:$SINK_PORT\", path: /events, timeoutMs: 900 }
routes:
  - { topicPattern: \"**\", destination: sink }
\$yaml\$)" >/dev/null
}

# crash: kill -9 the postmaster and every child, wait until all are gone
crash() {
	local pm children
	pm=$(head -1 "$WORK/data/postmaster.pid")
	children=$( (awk -v pm="$pm" '{ if ($4 == pm) print $1 }' /proc/[0-9]*/stat 2>/dev/null || true) | tr '\n' ' ')
	kill -KILL "$pm" $children 2>/dev/null || true
	for _ in $(seq 1 600); do
		local alive=0
		for p in $pm $children; do kill -0 "$p" 2>/dev/null && alive=1; done
		(( alive == 0 )) && return 0
		sleep 0.05
	done
	die "server processes still alive 30 s after kill -9"
}

wait_sent() { # wait_sent COUNT: until at least COUNT rows are sent
	local deadline=$((SECONDS + TIMEOUT))
	until (( $(q bench "SELECT count(*) FROM queuebox.outbox WHERE state = 'sent'") >= $1 )); do
		(( SECONDS < deadline )) || die "fewer than $1 rows sent after ${TIMEOUT}s"
		sleep 0.1
	done
}

q postgres "CREATE DATABASE bench"
q bench "CREATE EXTENSION queuebox"

for mode in T L; do
	if [[ $mode == T ]]; then takeover=true; lease=$LEASE_ON; else takeover=false; lease=$LEASE_OFF; fi
	SINK_LOG="$WORK/sink-$mode.jsonl"
	start_sink "$mode" --delay-ms "$DELAY" --log "$SINK_LOG"
	port_var="SINK_PORT_$mode"; SINK_PORT=${!port_var}
	q bench "TRUNCATE queuebox.outbox"
	configure "$takeover" "$lease"
	sleep 1	# the workers load the configuration
	log "run $mode (takeover $takeover, claimTimeoutMs $lease): $N rows over $KEYS keys"
	q bench "$(fill_sql "$N" bench.crash)"
	wait_sent $((N / 5))
	R[${mode}_processing]=$(q bench "SELECT count(*) FROM queuebox.outbox WHERE state = 'processing'")
	R[${mode}_sent_before]=$(q bench "SELECT count(*) FROM queuebox.outbox WHERE state = 'sent'")
	log "run $mode: kill -9 the postmaster and its children (${R[${mode}_processing]} rows processing, ${R[${mode}_sent_before]} sent)"
	t_kill=$(now)
	crash
	as_pg "$PGBIN/pg_ctl" -D "$WORK/data" -l "$WORK/pg.log" -w -t 120 start >/dev/null || die "the cluster did not start again"
	t0=$(now)
	R[${mode}_down]=$(python3 -c "print(f'{$t0 - $t_kill:.1f}')")
	R[${mode}_stuck]=$(q bench "SELECT count(*) FROM queuebox.outbox WHERE state = 'processing'")
	wait_sent "$N"
	R[${mode}_lost]=$(q bench "SELECT count(*) FROM queuebox.outbox WHERE state <> 'sent'")
	R[${mode}_taken]=$(q bench "SELECT count(*) FROM queuebox.outbox WHERE last_error LIKE 'taken over:%'")
	R[${mode}_expired]=$(q bench "SELECT count(*) FROM queuebox.outbox WHERE last_error LIKE 'lease expired:%'")
	q bench "COPY (SELECT message_id, key FROM queuebox.outbox) TO STDOUT" >"$WORK/keys-$mode.tsv"
	out=$(python3 - "$SINK_LOG" "$WORK/keys-$mode.tsv" "$t0" <<'EOF'
import json, statistics, sys
log, keys, t0 = sys.argv[1], sys.argv[2], float(sys.argv[3])
key_of = dict(l.rstrip("\n").split("\t", 1) for l in open(keys))
ok = {}
first_after = {}
last = 0.0
for line in open(log, encoding="utf-8", errors="replace"):
    r = json.loads(line)
    if not (200 <= r["status"] < 300):
        continue
    mid = r["headers"].get("x-message-id")
    if mid not in key_of:
        continue
    ok[mid] = ok.get(mid, 0) + 1
    t = r["t_us"] / 1e6
    if t >= t0:
        k = key_of[mid]
        first_after[k] = min(first_after.get(k, t), t)
        last = max(last, t)
d = sorted(v - t0 for v in first_after.values())
dups = sum(1 for n in ok.values() if n > 1)
print(f"{len(d)}|{statistics.median(d):.2f}|{d[-1]:.2f}|{last - t0:.2f}|{dups}")
EOF
)
	IFS='|' read -r R[${mode}_keys] R[${mode}_p50] R[${mode}_max] R[${mode}_last] R[${mode}_dups] <<<"$out"
	log "run $mode: ${R[${mode}_keys]} keys delivered again: median ${R[${mode}_p50]} s, slowest ${R[${mode}_max]} s after t0; last row at ${R[${mode}_last]} s; ${R[${mode}_dups]} rows twice, ${R[${mode}_lost]} not sent; taken over ${R[${mode}_taken]}, lease expired ${R[${mode}_expired]}"
	pid_var="SINK_PID_$mode"; kill -TERM "${!pid_var}" 2>/dev/null || true
done
busy_note

R[ratio]=$(fdiv "${R[T_max]}" "${R[L_max]}" 3)
SUMMARY=$(
	echo "| run | claimTimeoutMs | rows processing at the kill | server down (kill → accepting connections) | processing at t0 | keys delivering again | every key delivers again after t0 (median / slowest) | last row sent after t0 | taken over / lease expired | rows delivered twice | rows not sent |"
	echo "|---|---|---|---|---|---|---|---|---|---|---|"
	echo "| T: takeover on | $LEASE_ON | ${R[T_processing]} | ${R[T_down]} s | ${R[T_stuck]} | ${R[T_keys]} | ${R[T_p50]} / **${R[T_max]} s** | ${R[T_last]} s | ${R[T_taken]} / ${R[T_expired]} | ${R[T_dups]} | ${R[T_lost]} |"
	echo "| L: the anchor, takeover off (today's lease wait, shortened) | $LEASE_OFF | ${R[L_processing]} | ${R[L_down]} s | ${R[L_stuck]} | ${R[L_keys]} | ${R[L_p50]} / **${R[L_max]} s** | ${R[L_last]} s | ${R[L_taken]} / ${R[L_expired]} | ${R[L_dups]} | ${R[L_lost]} |"
	echo
	echo "Slowest key, takeover / anchor: **${R[ratio]}**. The anchor's wait is its lease ($LEASE_OFF ms here; 300000 by default, which the operator's 356 s measure was), less the time since each claim."
	echo "CPU busy while the benchmark was idle (%): ${BUSY[*]:-n/a} (above ~15: the machine was shared)."
)
echo
echo "== bench/crash: N=$N, keys=$KEYS, sink delay ${DELAY} ms, PostgreSQL $PGVERSION, $(nproc) cores${R_SANITIZED:+ — WARNING: $R_SANITIZED}"
echo "$SUMMARY"

if [[ "$RECORD" == 1 ]]; then
	{
		echo
		echo "## $(date -u '+%Y-%m-%d %H:%M UTC') — bench/crash, N=$N, keys=$KEYS, commit $COMMIT${R_SANITIZED:+ ($R_SANITIZED)}"
		echo
		echo "Command: \`$CMDLINE\`."
		qb_bench_machine
		echo "PostgreSQL $PGVERSION, fresh cluster: shared_buffers $SB, fsync on, synchronous_commit on, queuebox.outbox_workers 2, queuebox.worker_async_commit on (the default). Sink answering after $DELAY ms. Each run: N rows over $KEYS keys, batchSize 100; at a fifth sent, kill -9 of the postmaster and all its children, pg_ctl start -w (t0: accepting connections), until every row is sent; times from the sink's log."
		echo
		echo "$SUMMARY"
	} >>"$ROOT/bench/RESULTS.md"
	log "appended to bench/RESULTS.md"
fi
