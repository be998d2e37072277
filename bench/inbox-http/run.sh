#!/usr/bin/env bash
# bench/inbox-http/run.sh: the HTTP ingress (webhook -> queuebox.inbox)
# against single-row INSERTs by pgbench, measured in the same run.
#
#   bench/inbox-http/run.sh [--record]
#
# Run from anywhere after `make && make install` (as root, or as a user who
# can run initdb).  See bench/README.md ("bench/inbox-http").
#
# One temporary PostgreSQL cluster with shared_preload_libraries=queuebox,
# queuebox.outbox_workers=0 and the relay off (queuebox.relay_worker=off and
# inbox.relay.enabled false), so only the ingress works.  Source `bench`:
# POST /inbox/bench, key from the X-Id header, no auth, topic `bench`.
# For each client count C (QB_BENCH_CLIENTS, default "16 64"):
#   I  wrk -t2 -cC -d15s --latency with bench/inbox-http/post.lua (a unique
#      X-Id per request, ~200-byte JSON body); 202/s = 202s / wrk's duration,
#      p99 from wrk; rows stored are counted against the 202s answered
#   P  the anchor: pgbench -n -M prepared -T 15 -cC -j2 over TCP, one
#      single-row INSERT into queuebox.inbox per transaction (the same payload
#      and the headers the ingress stored in I), synchronous_commit on
#   TRUNCATE queuebox.inbox and CHECKPOINT before each run.
# Ratio: ingress 202/s / pgbench tps, target >= 0.80.
#
# Environment knobs (all optional):
#   QB_BENCH_CLIENTS="16 64"   client (connection) counts
#   QB_BENCH_DURATION=15       seconds per run (wrk -d, pgbench -T)
#   QB_BENCH_WRK_THREADS=2     wrk -t
#   QB_BENCH_SHARED_BUFFERS    default 4GB (2GB when RAM < 16 GiB)
#   QB_BENCH_KEEP=1            keep the temp dir (cluster data, logs) on exit
#   QB_BENCH_RECORD=1          same as --record: append a section to bench/RESULTS.md
#   QB_BENCH_TIMEOUT=300       bound (s) of every wait
set -euo pipefail

RECORD=${QB_BENCH_RECORD:-0}
if [[ "${1:-}" == "--record" ]]; then RECORD=1; shift; fi
[[ $# -eq 0 ]] || { echo "usage: bench/inbox-http/run.sh [--record]" >&2; exit 2; }
CMDLINE="bench/inbox-http/run.sh"; [[ "$RECORD" == 1 ]] && CMDLINE+=" --record"

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
PGBIN=${PGBIN:-$("${PG_CONFIG:-pg_config}" --bindir)}
CLIENTS=${QB_BENCH_CLIENTS:-16 64}
DURATION=${QB_BENCH_DURATION:-15}
WRK_THREADS=${QB_BENCH_WRK_THREADS:-2}
TIMEOUT=${QB_BENCH_TIMEOUT:-300}
MEM_KB=$(awk '/^MemTotal:/ {print $2}' /proc/meminfo)
if [[ -n "${QB_BENCH_SHARED_BUFFERS:-}" ]]; then SB=$QB_BENCH_SHARED_BUFFERS
elif (( MEM_KB >= 16 * 1024 * 1024 )); then SB=4GB; else SB=2GB; fi
MAXC=0; for c in $CLIENTS; do (( c > MAXC )) && MAXC=$c; done


# ---------------------------------------------------------------- prerequisites
# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"
qb_bench_prereqs
PGBENCH=$PGBIN/pgbench; [[ -x "$PGBENCH" ]] || PGBENCH=$(command -v pgbench) || die "pgbench not found"
command -v wrk >/dev/null || die "wrk not found (apt-get install -y wrk)"
command -v curl >/dev/null || die "curl not found"
qb_bench_workdir inbox

# ---------------------------------------------------------------- the cluster
qb_bench_cluster inbox-http "$(( MAXC + 50 ))" off
HTTP_PORT=$(free_port) || die "no free port"
grep -i 'relay_worker' "$WORK/pg.log" | grep -i 'warning\|invalid\|unrecognized' >&2 \
	&& log "WARNING: queuebox.relay_worker is not a known setting of this build (inbox.relay.enabled false still keeps the relay off)"

q postgres "CREATE DATABASE bench"
q bench "CREATE EXTENSION queuebox"
q bench "SELECT queuebox.configure(\$yaml\$
http: { listen: \"127.0.0.1:$HTTP_PORT\", maxConnections: 512 }
inbox: { relay: { enabled: false } }
sources:
  bench: { type: http, path: /bench, idempotencyKeyHeader: X-Id, topic: bench }
\$yaml\$)" >/dev/null
URL="http://127.0.0.1:$HTTP_PORT/inbox/bench"

# The ingress listens once it has loaded the configuration.
crashed() { grep -m1 'terminated by signal' "$WORK/pg.log" 2>/dev/null; }
for _ in $(seq 1 600); do
	c=$(crashed) && die "a server process crashed: $c"
	code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "http://127.0.0.1:$HTTP_PORT/readyz" || true)
	[[ "$code" == 200 ]] && break
	sleep 0.1
done
[[ "$code" == 200 ]] || die "the ingress did not answer /readyz 200 on 127.0.0.1:$HTTP_PORT within 60s (last: $code)"
# one request by hand: 202, then 200 for the same key, one row
c1=$(curl -s -o "$WORK/probe.out" -w '%{http_code}' --max-time 5 -H 'Content-Type: application/json' -H 'X-Id: probe-1' -d '{"n":0}' "$URL") || true
c2=$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 -H 'Content-Type: application/json' -H 'X-Id: probe-1' -d '{"n":0}' "$URL") || true
rows=$(q bench "SELECT count(*) FROM queuebox.inbox WHERE source = 'bench' AND idempotency_key = 'probe-1'")
[[ "$c1" == 202 && "$c2" == 200 && "$rows" == 1 ]] \
	|| die "probe: first POST $c1 ($(cat "$WORK/probe.out")), repeat $c2, rows $rows (want 202, 200, 1)"
HEADERS_STORED=$(q bench "SELECT headers::text FROM queuebox.inbox WHERE idempotency_key = 'probe-1'")
log "ingress up at $URL; probe 202 then 200 duplicate; stored headers $HEADERS_STORED"

# ---------------------------------------------------------------- helpers
reset_table() {
	q bench "TRUNCATE queuebox.inbox"
	q postgres "CHECKPOINT"
}

PAYLOAD='{"n":1,"tid":1,"pad":"'$(printf 'x%.0s' $(seq 1 175))'"}'
q bench "CREATE SEQUENCE bench_key_seq"
# pgbench's script: the row the ingress stores for one webhook
# (source, key, payload, headers; event_type, aggregate_id NULL; push).
python3 - "$WORK/insert.sql" "$PAYLOAD" "$HEADERS_STORED" <<'EOF'
import sys
lit = lambda s: "'" + s.replace("'", "''") + "'"
with open(sys.argv[1], "w") as f:
    f.write("INSERT INTO queuebox.inbox (source, idempotency_key, payload, headers) VALUES "
            "('bench', 'pgb-' || :client_id || '-' || nextval('bench_key_seq'), "
            + lit(sys.argv[2]) + ", " + lit(sys.argv[3]) + ");\n")
EOF
chmod 644 "$WORK/insert.sql"

# ================================================================ the runs
for C in $CLIENTS; do
	# I: the ingress
	reset_table
	busy_note
	log "ingress: wrk -t$WRK_THREADS -c$C -d${DURATION}s --latency POST $URL"
	QB_RUN_TAG="c$C" timeout $(( DURATION + TIMEOUT )) wrk -t"$WRK_THREADS" -c"$C" -d"${DURATION}s" --latency --timeout 10s \
		-s "$HERE/post.lua" "$URL" >"$WORK/wrk-$C.out" 2>&1 \
		|| { cat "$WORK/wrk-$C.out" >&2; die "wrk failed (c=$C)"; }
	sleep 1   # let answers in flight at wrk's end commit before counting
	read -r s202 s200 s4xx s503 sother < <(sed -n 's/^QB_STATUS 202=\([0-9]*\) 200=\([0-9]*\) 4xx=\([0-9]*\) 503=\([0-9]*\) other=\([0-9]*\)$/\1 \2 \3 \4 \5/p' "$WORK/wrk-$C.out") || true
	read -r p50 p99 pmax < <(sed -n 's/^QB_LAT p50=\([0-9.]*\) p99=\([0-9.]*\) max=\([0-9.]*\)$/\1 \2 \3/p' "$WORK/wrk-$C.out") || true
	dur=$(sed -n 's/^QB_DURATION_S //p' "$WORK/wrk-$C.out")
	errs=$(sed -n 's/^QB_ERRORS //p' "$WORK/wrk-$C.out")
	[[ -n "${s202:-}" && -n "${dur:-}" && -n "${p99:-}" ]] || { cat "$WORK/wrk-$C.out" >&2; die "could not read wrk's summary (c=$C)"; }
	c=$(crashed) && die "a server process crashed during the ingress run: $c"
	stored=$(q bench "SELECT count(*) FROM queuebox.inbox WHERE source = 'bench'")
	R[i${C}_202s]=$(python3 -c "print(round($s202 / $dur))")
	R[i${C}_p50]=$p50; R[i${C}_p99]=$p99; R[i${C}_max]=$pmax
	R[i${C}_n202]=$s202; R[i${C}_stored]=$stored
	R[i${C}_other]="200 dup $s200, 4xx $s4xx, 503 $s503, other $sother; socket errors: $errs"
	# Rows stored must equal the 202s answered.  wrk stops with up to C
	# requests in flight: their rows may be committed without wrk reading the
	# 202, so stored - 202s in 0..C is the expected range.
	diff=$(( stored - s202 ))
	if (( diff < 0 )); then R[i${C}_check]="FAIL: $(( -diff )) 202s without a row"
	elif (( diff > C )); then R[i${C}_check]="FAIL: $diff rows more than 202s (more than the $C in flight)"
	elif (( diff > 0 )); then R[i${C}_check]="ok ($diff rows for requests in flight when wrk stopped)"
	else R[i${C}_check]="ok (equal)"; fi
	log "ingress c=$C: $s202 x 202 in ${dur}s -> ${R[i${C}_202s]}/s; p50 $p50 ms, p99 $p99 ms, max $pmax ms; rows stored $stored (${R[i${C}_check]}); ${R[i${C}_other]}"

	# P: the anchor
	reset_table
	busy_note
	log "anchor: pgbench -n -M prepared -T $DURATION -c $C -j 2, single-row INSERT into queuebox.inbox"
	"$PGBENCH" -h 127.0.0.1 -p "$PGPORT" -U postgres -n -M prepared -T "$DURATION" -c "$C" -j 2 \
		-f "$WORK/insert.sql" bench >"$WORK/pgbench-$C.out" 2>&1 \
		|| { cat "$WORK/pgbench-$C.out" >&2; die "pgbench failed (c=$C)"; }
	tps=$(sed -n 's/^tps = \([0-9.]*\) (without initial connection time)/\1/p' "$WORK/pgbench-$C.out")
	lat=$(sed -n 's/^latency average = \([0-9.]*\) ms/\1/p' "$WORK/pgbench-$C.out")
	txns=$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' "$WORK/pgbench-$C.out")
	prows=$(q bench "SELECT count(*) FROM queuebox.inbox")
	[[ -n "$tps" ]] || { cat "$WORK/pgbench-$C.out" >&2; die "could not read pgbench's tps (c=$C)"; }
	R[p${C}_tps]=$(printf '%.0f' "$tps"); R[p${C}_lat]=$lat; R[p${C}_rows]=$prows; R[p${C}_txns]=$txns
	R[ratio_$C]=$(fdiv "${R[i${C}_202s]}" "$tps" 2)
	log "anchor c=$C: tps ${R[p${C}_tps]} (latency average $lat ms, $txns transactions, $prows rows); ingress / anchor = ${R[ratio_$C]}"
done
R[payload_bytes]=${#PAYLOAD}
reset_table
busy_note

# ================================================================ summary
SUMMARY=$(
	echo "| clients | ingress 202/s | p50 / p99 / max (ms) | rows stored vs 202s | other answers | pgbench INSERT tps (avg latency ms) | ingress / pgbench (target >= 0.80) |"
	echo "|---|---|---|---|---|---|---|"
	for C in $CLIENTS; do
		echo "| $C | ${R[i${C}_202s]} | ${R[i${C}_p50]} / ${R[i${C}_p99]} / ${R[i${C}_max]} | ${R[i${C}_stored]} vs ${R[i${C}_n202]}: ${R[i${C}_check]} | ${R[i${C}_other]} | ${R[p${C}_tps]} (${R[p${C}_lat]}) | ${R[ratio_$C]} |"
	done
	echo
	echo "CPU busy while the benchmark was idle, before each run and at the end (%): ${BUSY[*]} (above ~15: the machine was shared, figures are low)."
)
echo
echo "== bench/inbox-http: PostgreSQL $PGVERSION, $(nproc) cores, ${DURATION}s per run${R_SANITIZED:+ — WARNING: $R_SANITIZED}"
echo "$SUMMARY"

if [[ "$RECORD" == 1 ]]; then
	{
		echo
		echo "## $(date -u '+%Y-%m-%d %H:%M UTC') — bench/inbox-http, commit $COMMIT${R_SANITIZED:+ ($R_SANITIZED)}"
		echo
		echo "Command: \`$CMDLINE\` (clients \"$CLIENTS\", ${DURATION}s per run)."
		qb_bench_machine
		echo "PostgreSQL $PGVERSION, fresh cluster: shared_buffers $SB, max_wal_size 16GB, checkpoint_timeout 30min, fsync on, synchronous_commit on; queuebox.outbox_workers 0, relay off (only the ingress works)."
		echo "Ingress: source \`bench\` (POST /inbox/bench, key from X-Id, no auth), wrk $(wrk -v 2>&1 | head -1 | awk '{print $2}') -t$WRK_THREADS --latency with bench/inbox-http/post.lua (unique key per request, ${R[payload_bytes]}-byte JSON body). Anchor: pgbench -n -M prepared -T $DURATION -j 2 over TCP, one single-row INSERT into queuebox.inbox per transaction (same payload, the headers the ingress stored). TRUNCATE + CHECKPOINT before each run."
		echo
		echo "$SUMMARY"
	} >>"$ROOT/bench/RESULTS.md"
	log "appended to bench/RESULTS.md"
fi
