#!/usr/bin/env bash
# bench/isolation/run.sh: how well one destination, one key or one old
# snapshot is kept from slowing the rest of the outbox (issue 9).  Each
# figure is a ratio against its anchor measured in the same run.
#
#   bench/isolation/run.sh [--record] [--phases "down keyfail slow limited parked hot xmin claim insert"]
#
# Run from anywhere after `make && make install` (as root, or as a user who
# can run initdb); on a shared machine install and run under the install
# lock, so that what runs is what you installed:
#   flock /tmp/qb-install.lock -c 'make -s install && bench/isolation/run.sh'
# See bench/README.md ("bench/isolation") for what each phase measures.
#
# One temporary PostgreSQL cluster (bench/lib.sh's settings, 2 outbox
# workers for database bench), sink A (test/sink/qb_sink) for destination a,
# and per phase a destination b.  Routes: a.** -> a, b.** -> b.
#   down    A's rows/s alone, and again behind B's backlog in retry (b posts
#           to a loopback port where nothing listens)
#   keyfail the same with B's circuit kept closed (circuitBreaker.failures
#           1000000), as when B fails for some keys and succeeds for others:
#           B's failing heads are retried for the whole window
#   slow    A's rows/s alone, and again beside B's deep backlog (b is a sink
#           answering after QB_BENCH_SLOW_MS)
#   limited A's rows/s alone, and again beside B's deep backlog held to
#           QB_BENCH_LIMITED_RATE requests a second by B's rateLimit (b is a
#           sink answering at once): a limited destination's rows wait in
#           the table and cost the others nothing
#   parked  the same beside B's backlog of the same size whose destination
#           is paused: no row of B is claimed or sent, they only lie in the
#           table.  What rows waiting in the table cost A (a larger table,
#           its indexes), against which the limited phase is read: limited
#           less than parked is what the limit itself costs
#   hot     the rows/s of rows of other keys, alone and behind the pending
#           rows of one hot key inserted before them
#   xmin    rows/s with a REPEATABLE READ transaction held open since before
#           the rows were inserted, against without; dead tuples at the end
#   claim   the time of one _outbox_claim(100) (rolled back) with 1M rows
#           that cannot be sent now ahead of the claimable ones, against
#           none (database claimdb, which the workers do not serve)
#   insert  pgbench single-row INSERTs into queuebox.outbox against a plain
#           copy of the table without the trigger, alternating runs, medians
#
# Environment knobs (all optional; the defaults take about 6 minutes on 2
# cores against 0.1.0, most of it the fills and the measurement windows):
#   QB_BENCH_PHASES="down keyfail slow hot xmin claim insert"   (also --phases)
#   QB_BENCH_A_ROWS=100000 QB_BENCH_A_KEYS=10000  A's timed rows (down, slow)
#   QB_BENCH_DOWN_ROWS=200000 QB_BENCH_DOWN_KEYS=1000   B's rows in retry
#   QB_BENCH_SLOW_ROWS=300000 QB_BENCH_SLOW_KEYS=1000 QB_BENCH_SLOW_MS=50
#   QB_BENCH_SLOW_ROUNDS=3   slow: alone/with rounds, the medians compared
#   QB_BENCH_LIMITED_ROWS=100000 QB_BENCH_LIMITED_KEYS=1000 QB_BENCH_LIMITED_RATE=100
#   QB_BENCH_LIMITED_ROUNDS=3   limited, parked: alone/with rounds, medians compared
#   QB_BENCH_HOT_ROWS=300000   the hot key's rows
#   QB_BENCH_HOT_OTHER=20000 QB_BENCH_HOT_OTHER_KEYS=1000   the timed rows
#   QB_BENCH_XMIN_ROWS=100000
#   QB_BENCH_CLAIM_HEADS=1000 QB_BENCH_CLAIM_FOLLOWERS=999   blocked rows
#   QB_BENCH_CLAIM_POOL=200000  claimable rows (one key each)
#   QB_BENCH_CLAIM_T=10         pgbench -T of the claim timing
#   QB_BENCH_INSERT_T=10 QB_BENCH_INSERT_ROUNDS=2 QB_BENCH_INSERT_CLIENTS=4
#   QB_BENCH_WINDOW=30          a timed delivery stops after this many
#                               seconds: rows/s = rows delivered / elapsed
#   QB_BENCH_BATCH=100 QB_BENCH_WORKERS=2
#   QB_BENCH_BACKOFF_MS=200 QB_BENCH_BACKOFF_MAX_MS=2000 QB_BENCH_MAX_ATTEMPTS=1000
#   QB_BENCH_DEST_EXTRA         extra YAML keys for both destinations, e.g.
#                               "maxInFlight: 64" (empty: only keys 0.1.0 has)
#   QB_BENCH_SHARED_BUFFERS     default 4GB (2GB when RAM < 16 GiB)
#   QB_BENCH_KEEP=1             keep the temp dir (cluster, logs) on exit
#   QB_BENCH_RECORD=1           same as --record: append to bench/RESULTS.md
#   QB_BENCH_NOTE               a sentence for the RESULTS.md section
#   QB_BENCH_RATIOS=FILE        also write the ratio table as TSV to FILE
#                               (bench/isolation/compare.sh reads it)
#   QB_BENCH_TIMEOUT=300        bound (s) of every wait that is not timed
set -euo pipefail

RECORD=${QB_BENCH_RECORD:-0}
ALL_PHASES="down keyfail slow limited parked hot xmin claim insert"
PHASES=${QB_BENCH_PHASES:-$ALL_PHASES}
CMDLINE="bench/isolation/run.sh"
while (( $# )); do
	case $1 in
		--record) RECORD=1; CMDLINE+=" --record" ;;
		--phases) [[ $# -ge 2 ]] || { echo "--phases needs a list" >&2; exit 2; }; PHASES=$2; CMDLINE+=" --phases \"$2\""; shift ;;
		*) echo "usage: bench/isolation/run.sh [--record] [--phases \"$ALL_PHASES\"]" >&2; exit 2 ;;
	esac
	shift
done
PHASES=${PHASES//,/ }
for p in $PHASES; do
	[[ " $ALL_PHASES " == *" $p "* ]] || { echo "unknown phase $p ($ALL_PHASES)" >&2; exit 2; }
done
has_phase() { [[ " $PHASES " == *" $1 "* ]]; }

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
PGBIN=${PGBIN:-$("${PG_CONFIG:-pg_config}" --bindir)}
A_ROWS=${QB_BENCH_A_ROWS:-100000}
A_KEYS=${QB_BENCH_A_KEYS:-10000}
DOWN_ROWS=${QB_BENCH_DOWN_ROWS:-200000}
DOWN_KEYS=${QB_BENCH_DOWN_KEYS:-1000}
SLOW_ROWS=${QB_BENCH_SLOW_ROWS:-300000}
SLOW_KEYS=${QB_BENCH_SLOW_KEYS:-1000}
SLOW_MS=${QB_BENCH_SLOW_MS:-50}
SLOW_ROUNDS=${QB_BENCH_SLOW_ROUNDS:-3}
LIMITED_ROWS=${QB_BENCH_LIMITED_ROWS:-100000}
LIMITED_KEYS=${QB_BENCH_LIMITED_KEYS:-1000}
LIMITED_RATE=${QB_BENCH_LIMITED_RATE:-100}
LIMITED_ROUNDS=${QB_BENCH_LIMITED_ROUNDS:-3}
HOT_ROWS=${QB_BENCH_HOT_ROWS:-300000}
HOT_OTHER=${QB_BENCH_HOT_OTHER:-20000}
HOT_OTHER_KEYS=${QB_BENCH_HOT_OTHER_KEYS:-1000}
XMIN_ROWS=${QB_BENCH_XMIN_ROWS:-100000}
CLAIM_HEADS=${QB_BENCH_CLAIM_HEADS:-1000}
CLAIM_FOLLOWERS=${QB_BENCH_CLAIM_FOLLOWERS:-999}
CLAIM_POOL=${QB_BENCH_CLAIM_POOL:-200000}
CLAIM_T=${QB_BENCH_CLAIM_T:-10}
INSERT_T=${QB_BENCH_INSERT_T:-10}
INSERT_ROUNDS=${QB_BENCH_INSERT_ROUNDS:-2}
INSERT_CLIENTS=${QB_BENCH_INSERT_CLIENTS:-4}
WINDOW=${QB_BENCH_WINDOW:-30}
BATCH=${QB_BENCH_BATCH:-100}
WORKERS=${QB_BENCH_WORKERS:-2}
BACKOFF_MS=${QB_BENCH_BACKOFF_MS:-200}
BACKOFF_MAX_MS=${QB_BENCH_BACKOFF_MAX_MS:-2000}
MAX_ATTEMPTS=${QB_BENCH_MAX_ATTEMPTS:-1000}
# >>> the keys a destination gains in the next version (maxInFlight,
# circuitBreaker) go here, as YAML flow-mapping entries; empty by default
# because configure() refuses keys it does not know.
DEST_EXTRA=${QB_BENCH_DEST_EXTRA:-}
# <<<
TIMEOUT=${QB_BENCH_TIMEOUT:-300}
MEM_KB=$(awk '/^MemTotal:/ {print $2}' /proc/meminfo)
if [[ -n "${QB_BENCH_SHARED_BUFFERS:-}" ]]; then SB=$QB_BENCH_SHARED_BUFFERS
elif (( MEM_KB >= 16 * 1024 * 1024 )); then SB=4GB; else SB=2GB; fi
for v in "$A_ROWS" "$A_KEYS" "$DOWN_ROWS" "$DOWN_KEYS" "$SLOW_ROWS" "$SLOW_KEYS" "$SLOW_MS" "$HOT_ROWS" \
	"$LIMITED_ROWS" "$LIMITED_KEYS" "$LIMITED_RATE" "$LIMITED_ROUNDS" \
	"$HOT_OTHER" "$HOT_OTHER_KEYS" "$XMIN_ROWS" "$CLAIM_HEADS" "$CLAIM_FOLLOWERS" "$CLAIM_POOL" "$CLAIM_T" \
	"$INSERT_T" "$INSERT_ROUNDS" "$INSERT_CLIENTS" "$WINDOW" "$BATCH" "$WORKERS" "$BACKOFF_MS" "$BACKOFF_MAX_MS" \
	"$MAX_ATTEMPTS" "$TIMEOUT"; do
	[[ "$v" =~ ^[0-9]+$ && "$v" -ge 1 ]] || { echo "size knobs must be numbers >= 1 (got '$v')" >&2; exit 2; }
done

# ---------------------------------------------------------------- prerequisites
# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"
qb_bench_prereqs
PGBENCH=$PGBIN/pgbench; [[ -x "$PGBENCH" ]] || PGBENCH=$(command -v pgbench) || die "pgbench not found"
qb_bench_sink_build
POLL_PID="" RR_PID=""
bench_cleanup_extra() {
	[[ -n "${POLL_PID:-}" ]] && kill -TERM "$POLL_PID" 2>/dev/null
	if [[ -n "${RR_PID:-}" ]]; then
		{ exec 8>&-; } 2>/dev/null
		kill -TERM "$RR_PID" 2>/dev/null
	fi
	return 0
}
qb_bench_workdir isolation

# ---------------------------------------------------------------- the cluster
qb_bench_cluster isolation 50 off "$WORKERS"
q postgres "CREATE DATABASE bench"
q bench "CREATE EXTENSION queuebox"
EXTVERSION=$(q bench "SELECT extversion FROM pg_extension WHERE extname = 'queuebox'")
start_sink a
DOWN_PORT=$(free_port) || die "no free port"
# shellcheck disable=SC2154  # start_sink sets SINK_PORT_a
[[ "$DOWN_PORT" != "$SINK_PORT_a" ]] || die "free_port gave sink A's port; run again"
if has_phase slow; then start_sink b --delay-ms "$SLOW_MS"; fi
if has_phase limited || has_phase parked; then start_sink l; fi
log "queuebox $EXTVERSION; sink A 127.0.0.1:$SINK_PORT_a${SINK_PORT_b:+, slow sink B 127.0.0.1:$SINK_PORT_b (${SLOW_MS} ms)}; down port $DOWN_PORT"

# configure B_URL [B_EXTRA]: destinations a (sink A) and b (B_URL, with the
# YAML flow-mapping entries B_EXTRA), routes by topic
configure() {
	q bench "SELECT queuebox.configure(\$yaml\$
outbox:
  batchSize: $BATCH
  maxAttempts: $MAX_ATTEMPTS
  backoff: { initialMs: $BACKOFF_MS, maxMs: $BACKOFF_MAX_MS }
destinations:
  a: { type: http, baseUrl: \"http://127.0.0.1:$SINK_PORT_a\", path: /a${DEST_EXTRA:+, $DEST_EXTRA} }
  b: { type: http, baseUrl: \"$1\", path: /b${DEST_EXTRA:+, $DEST_EXTRA}${2:+, $2} }
routes:
  - { topicPattern: \"a.**\", destination: a }
  - { topicPattern: \"b.**\", destination: b }
\$yaml\$)" >/dev/null
	sleep 1	# the workers load it
}
configure "http://127.0.0.1:$DOWN_PORT"
wait_role outbox "$WORKERS"
# the last row of each key of the timed rows: the poll joins them to the outbox
q bench "CREATE TABLE bench_last (id bigint PRIMARY KEY)"

# ---------------------------------------------------------------- helpers
# fill TOPIC ROWS KEY_SQL: the INSERT of ROWS rows (g = 1..ROWS) with key KEY_SQL
fill() {
	echo "INSERT INTO queuebox.outbox (topic, key, payload, headers)
	      SELECT '$1', $3, $PAYLOAD_SQL, $HEADERS_SQL FROM generate_series(1, $2) g"
}
# reset_outbox: an empty outbox that looks never analyzed, as a fresh one:
# TRUNCATE keeps the column statistics, and those of the phase before (one
# hot key, say) gave the next phase's claims a bad plan until autovacuum's
# ANALYZE came
reset_outbox() {
	q bench "TRUNCATE queuebox.outbox, bench_last;
	         DELETE FROM pg_statistic WHERE starelid = 'queuebox.outbox'::regclass"
	q postgres "CHECKPOINT"
	busy_note
}
max_id() { q bench "SELECT coalesce(max(id), 0) FROM queuebox.outbox"; }
check_crash() { if c=$(grep -m1 'terminated by signal' "$WORK/pg.log"); then die "a server process crashed: $c"; fi; }

# timed TAG TOPIC ROWS KEY_SQL: insert ROWS rows in one transaction (the
# workers are woken at its commit) and time their delivery, from the return
# of the INSERT until none of them is pending or processing, or until
# QB_BENCH_WINDOW seconds.  R[TAG_rows_s] = rows delivered / elapsed; also
# R[TAG_elapsed], R[TAG_done] (delivered of ROWS), R[TAG_drained] (yes/no).
timed() {
	local tag=$1 topic=$2 rows=$3 keysql=$4 lo t0 t1 done_rows
	lo=$(max_id)
	q bench "$(fill "$topic" "$rows" "$keysql");
	         INSERT INTO bench_last SELECT max(id) FROM queuebox.outbox WHERE id > $lo GROUP BY key"
	t0=$EPOCHREALTIME
	# each last row by its primary key (OFFSET 0 keeps the subquery a probe
	# per row): as a join, the planner, without statistics after the reset,
	# read the whole outbox every 100 ms (160 ms a poll, twice that beside a
	# backlog: the measurement took a core, more in the measure than the anchor)
	t1=$(qb_bench_poll_until_false $(( ${t0%.*} + WINDOW )) \
		"SELECT EXISTS (SELECT 1 FROM bench_last l CROSS JOIN LATERAL (SELECT 1 FROM queuebox.outbox o WHERE o.id = l.id AND o.state IN ('pending', 'processing') OFFSET 0) x);")
	case $t1 in
		timeout) t1=$EPOCHREALTIME; R[${tag}_drained]=no ;;
		fail|crash) check_crash; die "$tag: the poll failed ($t1)" ;;
		*) R[${tag}_drained]=yes ;;
	esac
	done_rows=$(q bench "SELECT count(*) FROM queuebox.outbox WHERE id > $lo AND state IN ('sent', 'dead')")
	R[${tag}_elapsed]=$(python3 -c "print(f'{$t1 - $t0:.2f}')")
	R[${tag}_done]="$done_rows of $rows"
	R[${tag}_rows_s]=$(python3 -c "print(round($done_rows / ($t1 - $t0)))")
	log "$tag: $done_rows of $rows rows delivered in ${R[${tag}_elapsed]} s (drained: ${R[${tag}_drained]}) -> ${R[${tag}_rows_s]} rows/s"
}

# wait_true WHAT SQL [DB]: poll SQL (a boolean) every 0.2 s until true,
# within QB_BENCH_TIMEOUT, or fail the phase
wait_true() {
	local what=$1 sql=$2 db=${3:-bench} end=$(( EPOCHSECONDS + TIMEOUT ))
	until [[ "$(q "$db" "$sql")" == t ]]; do
		(( EPOCHSECONDS < end )) || die "$what: not within ${TIMEOUT}s"
		check_crash
		sleep 0.2
	done
}

# conclude PHASE NUM DEN DIGITS TARGET ANCHOR MEASURED: R[PHASE_ratio] =
# NUM / DEN, logged, and a row (phase, anchor, measured, ratio, target) of
# the summary and of compare.sh's table
ROWS_TSV=()
conclude() {
	R[$1_ratio]=$(fdiv "$2" "$3" "$4")
	log "$1: ratio ${R[$1_ratio]} (target $5)"
	ROWS_TSV+=("$(printf '%s\t' "$1" "$6" "$7" "${R[$1_ratio]}" "$5")")
	check_crash
}
sink_requests() { sink_stats "$1" | python3 -c 'import json,sys; print(json.load(sys.stdin)["requests"])'; }

busy_note

# alone_and_with PHASE ROWS KEY_SQL SETUP: the timed rows alone
# (R[PHASE_alone_*]), then again after SETUP, a function that puts the
# disturbance in place (R[PHASE_with_*]); each from an empty outbox
alone_and_with() {
	reset_outbox
	timed "$1_alone" a.event "$2" "$3"
	reset_outbox
	$4	# a function and its arguments
	timed "$1_with" a.event "$2" "$3"
}
head_line() { echo "${R[$1_with_rows_s]} rows/s (${R[$1_with_done]} in ${R[$1_with_elapsed]} s"; }

# ================================================================ down
down_setup() { # B's rows, until every B key's head has failed once, or (0.2.0 on) B's circuit is open
	local t=$EPOCHREALTIME
	q bench "$(fill b.event "$DOWN_ROWS" "'b' || (g % $DOWN_KEYS)")"
	if [[ ${1:-down} != keyfail && $(q bench "SELECT to_regclass('queuebox.destination_state') IS NOT NULL") == t ]]; then
		# 0.2.0 holds the rows of an open destination (0.3.0 leaves them in its intake)
		wait_true "down: B's circuit is open" \
			"SELECT EXISTS (SELECT 1 FROM queuebox.destination_state WHERE destination = 'b' AND state = 'open')"
	else
		wait_true "down: every B key's head failed once" \
			"SELECT count(*) = $(( DOWN_KEYS < DOWN_ROWS ? DOWN_KEYS : DOWN_ROWS )) FROM (SELECT DISTINCT ON (key) attempt FROM queuebox.outbox o
			  WHERE topic = 'b.event' AND state IN ('pending', 'processing') ORDER BY key, id) h WHERE attempt > 0"
	fi
	log "${1:-down}: B is down with its rows waiting, $(python3 -c "print(f'{$EPOCHREALTIME - $t:.1f}')") s after the insert began"
}
if has_phase down; then
	log "phase down: A's $A_ROWS rows alone, then behind B's $DOWN_ROWS rows over $DOWN_KEYS keys in retry (127.0.0.1:$DOWN_PORT refuses)"
	configure "http://127.0.0.1:$DOWN_PORT"
	alone_and_with down "$A_ROWS" "'a' || (g % $A_KEYS)" down_setup
	R[down_b]=$(q bench "SELECT count(*) FILTER (WHERE state IN ('pending', 'processing')) || ' waiting, ' || count(*) FILTER (WHERE state = 'dead') || ' dead, max attempt ' || max(attempt) FROM queuebox.outbox WHERE topic = 'b.event'")
	log "down: B's rows at the end: ${R[down_b]}; a last_error: $(q bench "SELECT coalesce(last_error, '(none)') FROM queuebox.outbox WHERE topic = 'b.event' AND attempt > 0 LIMIT 1")"
	conclude down "${R[down_with_rows_s]}" "${R[down_alone_rows_s]}" 2 ">= 0.8" "A alone ${R[down_alone_rows_s]} rows/s" \
		"with B down $(head_line down); B: ${R[down_b]})"
fi

# ================================================================ keyfail
if has_phase keyfail; then
	log "phase keyfail: A's $A_ROWS rows alone, then behind B's $DOWN_ROWS rows over $DOWN_KEYS keys in retry with B's circuit kept closed"
	configure "http://127.0.0.1:$DOWN_PORT" "circuitBreaker: { failures: 1000000 }"
	alone_and_with keyfail "$A_ROWS" "'a' || (g % $A_KEYS)" "down_setup keyfail"
	R[keyfail_b]=$(q bench "SELECT count(*) FILTER (WHERE state IN ('pending', 'processing')) || ' waiting, ' || count(*) FILTER (WHERE state = 'dead') || ' dead, max attempt ' || max(attempt) FROM queuebox.outbox WHERE topic = 'b.event'")
	R[keyfail_circuit]=$(q bench "SELECT coalesce((SELECT state FROM queuebox.destination_state WHERE destination = 'b'), 'closed')")
	log "keyfail: B's rows at the end: ${R[keyfail_b]}; B's circuit: ${R[keyfail_circuit]}"
	[[ ${R[keyfail_circuit]} == closed ]] || log "WARNING: B's circuit opened: this measured the down phase again"
	conclude keyfail "${R[keyfail_with_rows_s]}" "${R[keyfail_alone_rows_s]}" 2 ">= 0.8" "A alone ${R[keyfail_alone_rows_s]} rows/s" \
		"with B failing per key $(head_line keyfail); B: ${R[keyfail_b]}, circuit ${R[keyfail_circuit]})"
fi

# ================================================================ slow, limited
# backlog_fill PHASE ROWS KEYS PORT: B's backlog of ROWS rows over KEYS
# keys (B's sink at PORT reset first)
backlog_fill() {
	sink_reset "$4"
	q bench "$(fill b.event "$2" "'b' || (g % $3)")"
}
# backlog_setup PHASE ROWS KEYS PORT: the backlog, until B's sink has
# answered; R[PHASE_b0] its requests then
backlog_setup() {
	backlog_fill "$@"
	wait_true "$1: B's sink answered" "SELECT EXISTS (SELECT 1 FROM queuebox.outbox WHERE topic = 'b.event' AND state = 'sent')"
	R[$1_b0]=$(sink_requests "$4")
}
# beside_rounds PHASE ROUNDS PORT SETUP...: ROUNDS rounds of A's rows alone,
# then beside B's backlog (SETUP, a function and its arguments; B's sink at
# PORT), alternating: a single anchor run here varied from 22k to 28k rows/s
# with where it fell in the run, so the medians are compared.  Sets
# R[PHASE_alone_rows_s], R[PHASE_with_rows_s], R[PHASE_b_rate] (medians),
# R[PHASE_b_left] (the last round's), ALONE, WITH and RATIOS (by round)
beside_rounds() {
	local phase=$1 n=$2 port=$3 r brate=()
	shift 3
	ALONE=(); WITH=(); RATIOS=()
	for r in $(seq 1 "$n"); do
		alone_and_with "$phase" "$A_ROWS" "'a' || (g % $A_KEYS)" "$*"
		ALONE+=("${R[${phase}_alone_rows_s]}"); WITH+=("${R[${phase}_with_rows_s]}")
		brate+=("$(python3 -c "print(round(($(sink_requests "$port") - ${R[${phase}_b0]}) / ${R[${phase}_with_elapsed]}))")")
		RATIOS+=("$(fdiv "${R[${phase}_with_rows_s]}" "${R[${phase}_alone_rows_s]}" 2)")
		R[${phase}_b_left]=$(q bench "SELECT count(*) FROM queuebox.outbox WHERE topic = 'b.event' AND state IN ('pending', 'processing')")
		log "$phase round $r: ratio ${RATIOS[-1]}; B's sink answered ${brate[-1]} requests/s meanwhile; B's rows still waiting at the end: ${R[${phase}_b_left]}"
		(( R[${phase}_b_left] > 0 )) || log "WARNING: B's backlog ran out during the measurement; give B more rows"
	done
	R[${phase}_alone_rows_s]=$(median "${ALONE[@]}"); R[${phase}_with_rows_s]=$(median "${WITH[@]}"); R[${phase}_b_rate]=$(median "${brate[@]}")
}
if has_phase slow; then
	log "phase slow: A's $A_ROWS rows alone, then beside B's backlog of $SLOW_ROWS rows over $SLOW_KEYS keys (sink B answers after $SLOW_MS ms), $SLOW_ROUNDS rounds"
	configure "http://127.0.0.1:$SINK_PORT_b"
	beside_rounds slow "$SLOW_ROUNDS" "$SINK_PORT_b" backlog_setup slow "$SLOW_ROWS" "$SLOW_KEYS" "$SINK_PORT_b"
	conclude slow "${R[slow_with_rows_s]}" "${R[slow_alone_rows_s]}" 2 ">= 0.8" \
		"A alone, median of ${ALONE[*]}: ${R[slow_alone_rows_s]} rows/s" \
		"beside slow B, median of ${WITH[*]}: ${R[slow_with_rows_s]} rows/s (ratios by round ${RATIOS[*]}; B meanwhile ${R[slow_b_rate]} req/s, ${R[slow_b_left]} rows still waiting)"
fi
if has_phase limited; then
	log "phase limited: A's $A_ROWS rows alone, then beside B's backlog of $LIMITED_ROWS rows over $LIMITED_KEYS keys held to $LIMITED_RATE/s by its rateLimit (sink L answers at once), $LIMITED_ROUNDS rounds"
	# shellcheck disable=SC2154  # start_sink sets SINK_PORT_l
	configure "http://127.0.0.1:$SINK_PORT_l" "rateLimit: { perSecond: $LIMITED_RATE }"
	beside_rounds limited "$LIMITED_ROUNDS" "$SINK_PORT_l" backlog_setup limited "$LIMITED_ROWS" "$LIMITED_KEYS" "$SINK_PORT_l"
	R[limited_b_claimed]=$(q bench "SELECT count(*) FROM queuebox.outbox WHERE topic = 'b.event' AND state = 'processing'")
	conclude limited "${R[limited_with_rows_s]}" "${R[limited_alone_rows_s]}" 2 ">= 0.9" \
		"A alone, median of ${ALONE[*]}: ${R[limited_alone_rows_s]} rows/s" \
		"beside B limited to $LIMITED_RATE/s, median of ${WITH[*]}: ${R[limited_with_rows_s]} rows/s (ratios by round ${RATIOS[*]}; B meanwhile ${R[limited_b_rate]} req/s, ${R[limited_b_left]} rows still waiting, ${R[limited_b_claimed]} of them claimed)"
fi
# parked_setup: B paused for the hour, then its backlog (nothing of it is sent)
parked_setup() {
	q bench "SELECT queuebox.pause_destination('b', now() + interval '1 hour')" >/dev/null
	backlog_fill parked "$LIMITED_ROWS" "$LIMITED_KEYS" "$SINK_PORT_l"
	R[parked_b0]=$(sink_requests "$SINK_PORT_l")
}
if has_phase parked; then
	log "phase parked: A's $A_ROWS rows alone, then beside B's backlog of $LIMITED_ROWS rows over $LIMITED_KEYS keys that wait for B's pause, $LIMITED_ROUNDS rounds"
	configure "http://127.0.0.1:$SINK_PORT_l"
	beside_rounds parked "$LIMITED_ROUNDS" "$SINK_PORT_l" parked_setup
	R[parked_b_sent]=$(q bench "SELECT count(*) FROM queuebox.outbox WHERE topic = 'b.event' AND state <> 'pending'")
	q bench "SELECT queuebox.resume_destination('b')" >/dev/null
	conclude parked "${R[parked_with_rows_s]}" "${R[parked_alone_rows_s]}" 2 "-" \
		"A alone, median of ${ALONE[*]}: ${R[parked_alone_rows_s]} rows/s" \
		"beside B's rows paused, median of ${WITH[*]}: ${R[parked_with_rows_s]} rows/s (ratios by round ${RATIOS[*]}; ${R[parked_b_left]} of B's rows waiting, ${R[parked_b_sent]} claimed or sent)"
fi

# ================================================================ hot
hot_setup() { q bench "$(fill a.hot "$HOT_ROWS" "'hot'")"; }
if has_phase hot; then
	log "phase hot: $HOT_OTHER rows over $HOT_OTHER_KEYS keys alone, then behind $HOT_ROWS pending rows of one key"
	configure "http://127.0.0.1:$DOWN_PORT"
	alone_and_with hot "$HOT_OTHER" "'o' || (g % $HOT_OTHER_KEYS)" hot_setup
	R[hot_sent]=$(q bench "SELECT count(*) FILTER (WHERE state = 'sent') || ' hot rows sent meanwhile, ' || CASE WHEN coalesce(max(id) FILTER (WHERE state = 'sent') < min(id) FILTER (WHERE state <> 'sent'), true) THEN 'in order' ELSE 'OUT OF ORDER' END FROM queuebox.outbox WHERE key = 'hot'")
	log "hot: ${R[hot_sent]}"
	conclude hot "${R[hot_with_rows_s]}" "${R[hot_alone_rows_s]}" 2 "-" "other keys alone ${R[hot_alone_rows_s]} rows/s" \
		"behind the hot key $(head_line hot); ${R[hot_sent]})"
fi

# ================================================================ xmin
dead_tup() { # pg_stat_user_tables' n_dead_tup of the outbox, after the stats are flushed
	sleep 1.5
	q bench "SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = 'queuebox.outbox'::regclass"
}
xmin_setup() { # the dead tuples of the run without; a REPEATABLE READ snapshot held
	R[xmin_alone_dead]=$(dead_tup)
	mkfifo "$WORK/rr.in"
	"$PSQL" "$CONN_BASE dbname=bench application_name=bench_rr" -X -At -q <"$WORK/rr.in" >"$WORK/rr.out" 2>&1 &
	RR_PID=$!
	exec 8>"$WORK/rr.in"
	echo "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1 FROM queuebox.config LIMIT 1;" >&8
	wait_true "xmin: the REPEATABLE READ snapshot is held" \
		"SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE application_name = 'bench_rr' AND state = 'idle in transaction' AND backend_xmin IS NOT NULL)"
}
if has_phase xmin; then
	log "phase xmin: $XMIN_ROWS rows without, then with a REPEATABLE READ transaction held open"
	configure "http://127.0.0.1:$DOWN_PORT"
	alone_and_with xmin "$XMIN_ROWS" "'a' || (g % $A_KEYS)" xmin_setup
	R[xmin_with_dead]=$(dead_tup)
	R[xmin_age]=$(q bench "SELECT round(extract(epoch FROM now() - xact_start)) FROM pg_stat_activity WHERE application_name = 'bench_rr'")
	echo "ROLLBACK;" >&8
	exec 8>&-
	wait "$RR_PID" 2>/dev/null || true
	RR_PID=
	log "xmin: n_dead_tup without ${R[xmin_alone_dead]}, with the snapshot held ${R[xmin_with_dead]} (held ${R[xmin_age]} s)"
	conclude xmin "${R[xmin_with_rows_s]}" "${R[xmin_alone_rows_s]}" 2 ">= 0.7" "without ${R[xmin_alone_rows_s]} rows/s (n_dead_tup ${R[xmin_alone_dead]})" \
		"REPEATABLE READ held $(head_line xmin); n_dead_tup ${R[xmin_with_dead]})"
fi

# ================================================================ claim
if has_phase claim; then
	BLOCKED=$(( CLAIM_HEADS * (CLAIM_FOLLOWERS + 1) ))
	log "phase claim: one _outbox_claim(100), $CLAIM_POOL claimable rows, none / $BLOCKED blocked ahead of them (db claimdb)"
	q postgres "CREATE DATABASE claimdb"
	q claimdb "CREATE EXTENSION queuebox"
	# The rows that are due, pending and blocked behind an earlier row of
	# their key, and that the claim has not set aside yet (0.2.0 parks them:
	# its column hold is set).  The warm-up runs until this stops falling.
	if [[ "$(q claimdb "SELECT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = 'queuebox.outbox'::regclass AND attname = 'hold' AND NOT attisdropped)")" == t ]]; then
		UNSEEN="AND c.hold IS NULL"
	else
		UNSEEN=""
	fi
	UNSEEN_SQL="SELECT count(*) FROM queuebox.outbox c WHERE c.state = 'pending' AND c.scheduled_at <= now() $UNSEEN
	  AND c.key IS NOT NULL AND EXISTS (SELECT 1 FROM queuebox.outbox e WHERE e.key = c.key AND e.id < c.id AND e.state IN ('pending', 'processing'))"
	cat >"$WORK/claim.sql" <<'EOF'
BEGIN;
SELECT count(*) FROM queuebox._outbox_claim(100, 300000, 10, gen_random_uuid());
ROLLBACK;
EOF
	chmod 644 "$WORK/claim.sql"
	for case in none blocked; do
		q claimdb "TRUNCATE queuebox.outbox RESTART IDENTITY"
		if [[ $case == blocked ]]; then
			# the heads: retrying (attempt 1), due tomorrow; then their followers, due now
			q claimdb "INSERT INTO queuebox.outbox (topic, key, payload, headers, attempt, scheduled_at)
			           SELECT 'a.event', 'h' || g, $PAYLOAD_SQL, $HEADERS_SQL, 1, now() + interval '1 day' FROM generate_series(1, $CLAIM_HEADS) g"
			q claimdb "INSERT INTO queuebox.outbox (topic, key, payload, headers)
			           SELECT 'a.event', 'h' || (1 + (g - 1) % $CLAIM_HEADS), $PAYLOAD_SQL, $HEADERS_SQL FROM generate_series(1, $(( CLAIM_HEADS * CLAIM_FOLLOWERS ))) g"
		else
			# the same ids for the claimable rows as in the blocked case
			q claimdb "SELECT setval(pg_get_serial_sequence('queuebox.outbox', 'id'), $BLOCKED)" >/dev/null
		fi
		q claimdb "$(fill a.event "$CLAIM_POOL" "'c' || g")"
		q claimdb "VACUUM ANALYZE queuebox.outbox"
		# warm-up: rounds of committed claims of 1000 (1, 2, 4, ... claims: a
		# claim that sets aside only part of the blocked rows costs few
		# counts) until none is unseen, or a round after the first leaves
		# them where they were (on 0.1.0 no claim changes them; on 0.2.0 the
		# first round takes the retrying heads, which are new rows too)
		t=$EPOCHREALTIME; tw=$EPOCHSECONDS; n=0; k=1; u0=$(q claimdb "$UNSEEN_SQL")
		R[claim_${case}_unseen]=$u0
		while :; do
			for _ in $(seq 1 "$k"); do
				q claimdb "SELECT count(*) FROM queuebox._outbox_claim(1000, 300000, 10, gen_random_uuid())" >/dev/null
			done
			n=$(( n + k )); k=$(( k * 2 ))
			u1=$(q claimdb "$UNSEEN_SQL")
			(( u1 > 0 )) || break
			(( u1 < u0 || n == 1 )) || break
			u0=$u1
			(( EPOCHSECONDS - tw <= TIMEOUT )) || die "claim: the warm-up did not settle within ${TIMEOUT}s ($u1 unseen blocked rows left)"
		done
		left=$(q claimdb "SELECT count(*) FROM queuebox.outbox WHERE key LIKE 'c%' AND state = 'pending'")
		R[claim_${case}_warm]="$n claims of 1000 in $(python3 -c "print(f'{$EPOCHREALTIME - $t:.1f}')") s, unseen blocked rows ${R[claim_${case}_unseen]} -> $u1, $left claimable rows left"
		log "claim ($case): warm-up: ${R[claim_${case}_warm]}"
		(( left >= 100 * 2 )) || die "claim ($case): the warm-up used up the claimable rows; raise QB_BENCH_CLAIM_POOL"
		q claimdb "VACUUM ANALYZE queuebox.outbox"
		q postgres "CHECKPOINT"
		R[claim_${case}_rows]=$(q claimdb "BEGIN; SELECT count(*) FROM queuebox._outbox_claim(100, 300000, 10, gen_random_uuid()); ROLLBACK;")
		busy_note
		"$PGBENCH" -h 127.0.0.1 -p "$PGPORT" -U postgres -n -M prepared -T "$CLAIM_T" -c 1 -j 1 \
			-f "$WORK/claim.sql" claimdb >"$WORK/pgbench-claim-$case.out" 2>&1 \
			|| { cat "$WORK/pgbench-claim-$case.out" >&2; die "pgbench failed (claim $case)"; }
		R[claim_${case}_ms]=$(sed -n 's/^latency average = \([0-9.]*\) ms/\1/p' "$WORK/pgbench-claim-$case.out")
		R[claim_${case}_txns]=$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' "$WORK/pgbench-claim-$case.out")
		[[ -n "${R[claim_${case}_ms]}" ]] || { cat "$WORK/pgbench-claim-$case.out" >&2; die "could not read pgbench's latency (claim $case)"; }
		log "claim ($case): ${R[claim_${case}_ms]} ms per claim (${R[claim_${case}_txns]} claims, ${R[claim_${case}_rows]} rows each)"
	done
	q postgres "DROP DATABASE claimdb"
	conclude claim "${R[claim_blocked_ms]}" "${R[claim_none_ms]}" 1 "<= 2" "none blocked ${R[claim_none_ms]} ms (${R[claim_none_rows]} rows)" \
		"$BLOCKED blocked ${R[claim_blocked_ms]} ms (${R[claim_blocked_rows]} rows; warm-up ${R[claim_blocked_warm]})"
fi

# ================================================================ insert
if has_phase insert; then
	log "phase insert: pgbench single-row INSERT, $INSERT_CLIENTS clients, ${INSERT_T}s, outbox / plain table alternating x$INSERT_ROUNDS"
	# the workers are stopped: the rows are not delivered while the inserts run
	set_guc outbox_workers 0
	wait_role outbox 0
	q bench "CREATE TABLE public.plain_outbox (LIKE queuebox.outbox INCLUDING ALL)"
	opts=$(q bench "SELECT array_to_string(reloptions, ', ') FROM pg_class WHERE oid = 'queuebox.outbox'::regclass")
	[[ -n "$opts" ]] && q bench "ALTER TABLE public.plain_outbox SET ($opts)"
	PAYLOAD_LIT=$(q bench "SELECT ($PAYLOAD_SQL)::text FROM generate_series(1, 1) g")
	for t in queuebox.outbox public.plain_outbox; do
		printf '%s\n' "\\set k random(0, 999)" \
			"INSERT INTO $t (topic, key, payload) VALUES ('a.event', 'k' || :k, '$PAYLOAD_LIT');" >"$WORK/insert-${t#*.}.sql"
	done
	chmod 644 "$WORK"/insert-*.sql
	for r in $(seq 1 "$INSERT_ROUNDS"); do
		for t in outbox plain_outbox; do
			q bench "TRUNCATE queuebox.outbox, public.plain_outbox"
			q postgres "CHECKPOINT"
			"$PGBENCH" -h 127.0.0.1 -p "$PGPORT" -U postgres -n -M prepared -T "$INSERT_T" -c "$INSERT_CLIENTS" -j 2 \
				-f "$WORK/insert-$t.sql" bench >"$WORK/pgbench-insert-$t-$r.out" 2>&1 \
				|| { cat "$WORK/pgbench-insert-$t-$r.out" >&2; die "pgbench failed (insert $t)"; }
			tps=$(sed -n 's/^tps = \([0-9.]*\) (without initial connection time)/\1/p' "$WORK/pgbench-insert-$t-$r.out")
			[[ -n "$tps" ]] || { cat "$WORK/pgbench-insert-$t-$r.out" >&2; die "could not read pgbench's tps (insert $t)"; }
			R[insert_${t}_all]+="$(printf '%.0f' "$tps") "
			log "insert round $r, $t: $(printf '%.0f' "$tps") tps"
			# to_jsonb: 0.1.0 has no hold column; 0.3.0 routes at insert
			[[ $t == outbox ]] && log "insert round $r: rows routed at insert (hold intake): $(q bench \
				"SELECT count(*) FILTER (WHERE to_jsonb(o) ->> 'hold' = 'intake') || ' of ' || count(*) FROM queuebox.outbox o")"
		done
	done
	# shellcheck disable=SC2086
	R[insert_outbox]=$(median ${R[insert_outbox_all]})
	# shellcheck disable=SC2086
	R[insert_plain]=$(median ${R[insert_plain_outbox_all]})
	q bench "TRUNCATE queuebox.outbox"
	set_guc outbox_workers "$WORKERS"
	# the cost ratio: how much longer an outbox INSERT takes than a plain one
	conclude insert "${R[insert_plain]}" "${R[insert_outbox]}" 2 "<= 1.15" "plain table ${R[insert_plain]} tps (runs: ${R[insert_plain_outbox_all]% })" \
		"queuebox.outbox ${R[insert_outbox]} tps (runs: ${R[insert_outbox_all]% })"
fi
busy_note

# ================================================================ summary
SUMMARY=$(
	echo "| phase | anchor | measured | ratio | target |"
	echo "|---|---|---|---|---|"
	for row in "${ROWS_TSV[@]}"; do
		IFS=$'\t' read -r p a m r t <<<"$row"
		echo "| $p | $a | $m | $r | $t |"
	done
	echo
	echo "Ratios: down, keyfail, slow, limited, parked, hot and xmin = rows/s measured / rows/s of the anchor; claim = ms per claim with the blocked rows / without; insert = plain-table tps / outbox tps (what the outbox costs per INSERT)."
	echo "CPU busy while the benchmark was idle, at the start, before each measurement and at the end (%): ${BUSY[*]} (above ~15: the machine was shared, figures are low)."
)
echo
echo "== bench/isolation: queuebox $EXTVERSION, commit $COMMIT, PostgreSQL $PGVERSION, $(nproc) cores${R_SANITIZED:+ — WARNING: $R_SANITIZED}"
echo "$SUMMARY"
if [[ -n "${QB_BENCH_RATIOS:-}" ]]; then
	{
		printf 'version\t%s\t%s\t%s\t\n' "$EXTVERSION" "$COMMIT" ""
		printf '%s\n' "${ROWS_TSV[@]}"
	} >"$QB_BENCH_RATIOS"
fi

if [[ "$RECORD" == 1 ]]; then
	{
		echo
		echo "## $(date -u '+%Y-%m-%d %H:%M UTC') — bench/isolation, queuebox $EXTVERSION, commit $COMMIT${R_SANITIZED:+ ($R_SANITIZED)}"
		echo
		[[ -n "${QB_BENCH_NOTE:-}" ]] && { echo "$QB_BENCH_NOTE"; echo; }
		echo "Command: \`$CMDLINE\` (phases \"$PHASES\")."
		qb_bench_machine
		echo "PostgreSQL $PGVERSION, fresh cluster: shared_buffers $SB, max_wal_size 16GB, checkpoint_timeout 30min, fsync on, synchronous_commit on; queuebox.outbox_workers $WORKERS (0 during insert)."
		echo "Configuration: outbox.batchSize $BATCH, maxAttempts $MAX_ATTEMPTS, backoff initialMs $BACKOFF_MS, maxMs $BACKOFF_MAX_MS; destinations a (qb_sink) and b (down: a refused port; keyfail: the same with circuitBreaker.failures 1000000; slow: qb_sink --delay-ms $SLOW_MS; limited: qb_sink, rateLimit perSecond $LIMITED_RATE)${DEST_EXTRA:+, each with $DEST_EXTRA}; routes a.** -> a, b.** -> b."
		echo "Sizes: A $A_ROWS rows over $A_KEYS keys; down B $DOWN_ROWS rows over $DOWN_KEYS keys; slow B $SLOW_ROWS over $SLOW_KEYS ($SLOW_ROUNDS rounds, medians); limited B $LIMITED_ROWS over $LIMITED_KEYS ($LIMITED_ROUNDS rounds, medians); hot $HOT_ROWS rows of one key, $HOT_OTHER timed rows over $HOT_OTHER_KEYS keys; xmin $XMIN_ROWS rows; claim $CLAIM_HEADS heads x $CLAIM_FOLLOWERS followers blocked, $CLAIM_POOL claimable, pgbench -T $CLAIM_T -c 1; insert $INSERT_ROUNDS x (outbox, plain) pgbench -T $INSERT_T -c $INSERT_CLIENTS. A timed delivery stops after ${WINDOW} s (rows/s = rows delivered / elapsed)."
		echo
		echo "$SUMMARY"
	} >>"$ROOT/bench/RESULTS.md"
	log "appended to bench/RESULTS.md"
fi
