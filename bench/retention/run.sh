#!/usr/bin/env bash
# bench/retention/run.sh: what retention leaves behind (issue 37, target 4).
# A week of sent rows, in compressed time, is delivered by the outbox
# workers and removed by their retention step; the table and its indexes
# are measured after every "day" against one window's rows freshly loaded
# into a twin table in the same run.
#
#   bench/retention/run.sh [--record]
#
# Run from the repository root after `make && make install`, as root or as a
# user who can run initdb (or PATH=<pg>/bin:$PATH PGBIN=<pg>/bin for a
# private install).  One temporary cluster (bench/lib.sh's, shared_buffers
# 1GB), 2 outbox workers delivering every row to a loopback sink
# (test/sink/qb_sink) over HTTP, pg_stat_statements loaded with
# track = all (the workers' statements are nested SPI ones).
#
# Time is compressed: outbox.retention is 7 days of QB_BENCH_DAY_S
# seconds (7 x 30 = 210 s).  Each day starts on the clock: ROWS_PER_DAY
# rows are inserted in transactions of QB_BENCH_CHUNK rows (bench/lib.sh's
# ~300-byte rows over QB_BENCH_KEYS keys), the workers claim, deliver and
# settle them (each row goes through the real claim / settle cycle), the
# script waits until none is pending or processing, then until the day's
# end, and records: pg_relation_size of the heap and of each index,
# pg_total_relation_size, live and dead tuples and the autovacuum count
# (pg_stat_user_tables), the rows by state, and what the retention statement
# (QB_PG_OUTBOX_RETENTION, run by worker 0 every tenth of the retention, in
# batches of 1,000 until a batch deletes fewer) cost since the day before
# (pg_stat_statements: calls, rows, time, shared blocks).  QB_BENCH_WINDOWS
# windows (3: 21 days) are run; the first fills the table, the others are
# the steady state.
#
# Then, with retention set out of the way (36500d) so the table stays as it
# is:
#   - the anchor: anchor.outbox (LIKE queuebox.outbox INCLUDING ALL, the
#     same fillfactor and indexes) gets one window's rows (7 x
#     ROWS_PER_DAY) in one INSERT, each with the columns of a delivered row (state sent, routed,
#     attempt 1, the same payload and headers), then VACUUM ANALYZE: what a
#     window's rows take freshly loaded.  The bound is the steady-state
#     total size / the anchor's total size;
#   - the retention statement itself (its text in the tree's qb_sql_pg.h,
#     which make install put in queuebox.so), EXPLAIN (ANALYZE, BUFFERS) inside
#     BEGIN ... ROLLBACK, generic plan, with the workers' planner settings
#     (qb_pg_session_settings) and with PostgreSQL's defaults: a full batch
#     (rows older than 6 days: a day's rows to delete) and the last batch of
#     a run (rows older than the oldest: none to delete, as the call that
#     ends each run finds fewer than its limit), each
#     QB_BENCH_EXPLAIN_REPEAT (3) times, the median time; and the same for
#     the statement before this benchmark (commit 9fd330d's), beside it;
#   - the dead front: the first QB_BENCH_DEAD_ROWS (100000) ids set dead (old
#     rows retention keeps, as after an outage), in a transaction rolled
#     back, and a run of QB_BENCH_DEAD_BATCHES (20) batches back to back,
#     each batch's time: by commit 7d66426's walk, every batch from the
#     first id, and by the tree's, each from the floor the batch before
#     answered.
#
# autovacuum_naptime is QB_BENCH_NAPTIME (1s, PostgreSQL's least): the
# table's own settings vacuum it at 1 % dead tuples, which a compressed day
# reaches within a second, so the naptime decides how often it is vacuumed
# (bench/README.md says what the compression does to vacuum).
#
# Knobs: QB_BENCH_ROWS_PER_DAY (300000: a window is 2.1M rows, the size
# issue 37 quotes), QB_BENCH_DAY_S (30), QB_BENCH_WINDOWS (3),
# QB_BENCH_CHUNK (50000), QB_BENCH_KEYS (10000), QB_BENCH_EXPLAIN_REPEAT
# (3), QB_BENCH_DEAD_ROWS (100000), QB_BENCH_DEAD_BATCHES (20),
# QB_BENCH_NAPTIME (1s), QB_BENCH_PG_CONF (more postgresql.conf
# lines), QB_BENCH_KEEP=1 (keep the temp dir: days.tsv, explain-*.txt, pg.log with every autovacuum
# logged), QB_BENCH_RECORD=1 (= --record: append a section to
# bench/RESULTS.md), QB_BENCH_NOTE (a sentence for it), QB_BENCH_TIMEOUT
# (900 s, every wait).  About 13 minutes at the defaults.
set -euo pipefail

RECORD=${QB_BENCH_RECORD:-0}
if [[ "${1:-}" == "--record" ]]; then RECORD=1; shift; fi
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PGBIN=${PGBIN:-$("${PG_CONFIG:-pg_config}" --bindir)}
RPD=${QB_BENCH_ROWS_PER_DAY:-300000}
DAY_S=${QB_BENCH_DAY_S:-30}
WINDOWS=${QB_BENCH_WINDOWS:-3}
CHUNK=${QB_BENCH_CHUNK:-50000}
KEYS=${QB_BENCH_KEYS:-10000}
REPEAT=${QB_BENCH_EXPLAIN_REPEAT:-3}
NAPTIME=${QB_BENCH_NAPTIME:-1s}
TIMEOUT=${QB_BENCH_TIMEOUT:-900}
SB=1GB
DAYS=$(( 7 * WINDOWS ))
RET_S=$(( 7 * DAY_S ))
WIN_ROWS=$(( 7 * RPD ))
for v in RPD DAY_S WINDOWS CHUNK KEYS REPEAT; do
	[[ "${!v}" =~ ^[1-9][0-9]*$ ]] || { echo "bench/retention: $v must be a positive integer" >&2; exit 2; }
done
QB_BENCH_PG_CONF="shared_preload_libraries = 'queuebox, pg_stat_statements'
pg_stat_statements.track = all
log_autovacuum_min_duration = 0
autovacuum_naptime = $NAPTIME
${QB_BENCH_PG_CONF:-}"

# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"
qb_bench_prereqs
qb_bench_sink_build
qb_bench_workdir retention
qb_bench_cluster retention 30 off 2
q postgres "CREATE DATABASE bench"
q bench "CREATE EXTENSION queuebox"
q bench "CREATE EXTENSION pg_stat_statements"
start_sink d

configure() { # configure RETENTION: the sink as the only destination
	q bench "SELECT queuebox.configure(\$yaml\$
outbox:
  retention: $1
destinations:
  d:
    type: http
    baseUrl: http://127.0.0.1:$SINK_PORT_d
    path: /events
routes:
  - topicPattern: \"**\"
    destination: d
\$yaml\$)" >/dev/null
}
configure "${RET_S}s"
wait_role outbox 2
sink_requests() { sink_stats "$SINK_PORT_d" | python3 -c 'import json,sys; print(json.load(sys.stdin)["requests"])'; }

# the retention statement in pg_stat_statements (the workers prepare it as
# qb_sql_pg.h has it: one entry)
# (pg_stat_statements shows its constants as $3 and on)
# (the statement of 7d66426 and before began with the DELETE; from the
# floor on it is a WITH whose d deletes; its rows are its calls, one row
# each, so the rows deleted are counted from the table)
RET_MATCH="(query LIKE 'DELETE FROM queuebox.outbox o%' OR query LIKE 'WITH w AS (%DELETE FROM queuebox.outbox o%') AND query LIKE '%created_at < now()%'"
# the relation's sizes: heap, each index, total (bytes)
SIZES_SQL="SELECT 'heap', pg_relation_size('queuebox.outbox')
	UNION ALL SELECT 'total', pg_total_relation_size('queuebox.outbox')
	UNION ALL (SELECT c.relname, pg_relation_size(c.oid) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
	           WHERE i.indrelid = 'queuebox.outbox'::regclass ORDER BY c.relname)"
sizes() { # sizes TABLE: "name=bytes ..." of TABLE's heap, indexes and total
	q bench "${SIZES_SQL//queuebox.outbox/$1}" | tr '|' '=' | paste -sd' ' -
}

# ---------------------------------------------------------------- the week
DAYS_TSV=$WORK/days.tsv
log "a window: 7 days of $DAY_S s (outbox.retention ${RET_S}s), $RPD rows a day in transactions of $CHUNK, $WINDOWS windows ($DAYS days, $(( DAYS * DAY_S )) s)"
busy_note
T0=$EPOCHSECONDS
total=0
late=0
for (( d = 1; d <= DAYS; d++ )); do
	day_start=$(( T0 + (d - 1) * DAY_S ))
	now=$EPOCHSECONDS
	(( now <= day_start )) || { (( now - day_start < 2 )) || log "day $d starts $(( now - day_start )) s late"; }
	while (( EPOCHSECONDS < day_start )); do sleep 0.2; done
	t_in=$EPOCHREALTIME
	for (( off = 0; off < RPD; off += CHUNK )); do
		n=$(( RPD - off < CHUNK ? RPD - off : CHUNK ))
		q bench "INSERT INTO queuebox.outbox (topic, key, payload, headers)
		         SELECT 'bench.event', 'k' || (g % $KEYS), $PAYLOAD_SQL, $HEADERS_SQL
		         FROM generate_series($(( total + off + 1 )), $(( total + off + n ))) g" >/dev/null
	done
	t_ins=$EPOCHREALTIME
	total=$(( total + RPD ))
	# delivered: the sink answered every row, then none is open (the settle
	# follows the answer by a cycle)
	deadline=$(( EPOCHSECONDS + TIMEOUT ))
	while (( $(sink_requests) < total )); do
		(( EPOCHSECONDS < deadline )) || die "day $d: the sink has $(sink_requests) of $total requests after ${TIMEOUT}s"
		grep -q 'terminated by signal' "$WORK/pg.log" && die "a server process crashed"
		sleep 0.2
	done
	while [[ $(q bench "SELECT EXISTS (SELECT 1 FROM queuebox.outbox WHERE state IN ('pending', 'processing') AND key IS NOT NULL)") == t ]]; do
		(( EPOCHSECONDS < deadline )) || die "day $d: rows still open after ${TIMEOUT}s"
		sleep 0.2
	done
	t_done=$EPOCHREALTIME
	(( EPOCHSECONDS <= day_start + DAY_S )) || { late=$(( late + 1 )); log "WARNING: day $d's rows took longer than the day ($DAY_S s)"; }
	while (( EPOCHSECONDS < day_start + DAY_S )); do sleep 0.2; done
	# the day's end: sizes, tuples, states, retention so far
	states=$(q bench "SELECT coalesce(string_agg(state || '=' || n, ' ' ORDER BY state), 'none') FROM (SELECT state, count(*) n FROM queuebox.outbox GROUP BY state) s")
	oldest=$(q bench "SELECT coalesce(round(extract(epoch FROM now() - min(created_at))::numeric / $DAY_S, 2)::text, '-') FROM queuebox.outbox")
	tup=$(q bench "SELECT n_live_tup || ' ' || n_dead_tup || ' ' || autovacuum_count || ' ' || autoanalyze_count FROM pg_stat_user_tables WHERE relid = 'queuebox.outbox'::regclass")
	ret=$(q bench "SELECT coalesce(sum(calls), 0) || ' ' || coalesce(sum(rows), 0) || ' ' || round(coalesce(sum(total_exec_time), 0)::numeric, 1) || ' ' || coalesce(sum(shared_blks_hit + shared_blks_read), 0) FROM pg_stat_statements WHERE $RET_MATCH")
	printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$d" \
		"$(python3 -c "print(round($t_ins - $t_in, 1))")" "$(python3 -c "print(round($t_done - $t_in, 1))")" \
		"$states" "$oldest" "$tup" "$ret" "$(sizes queuebox.outbox)" "$(sink_requests)" >>"$DAYS_TSV"
	log "day $d: inserted in $(python3 -c "print(round($t_ins - $t_in, 1))") s, delivered by $(python3 -c "print(round($t_done - $t_in, 1))") s; $states; oldest $oldest days; live/dead/autovacuums/autoanalyzes $tup; retention calls/rows/ms/blocks $ret; total $(q bench "SELECT pg_size_pretty(pg_total_relation_size('queuebox.outbox'))")"
done
busy_note
# the workers' retention over the run, before the EXPLAINs below run the
# same text
STMT=$(q bench "SELECT calls || ' ' || rows || ' ' || round(total_exec_time::numeric, 1) || ' ' || round(mean_exec_time::numeric, 2) || ' ' || round(max_exec_time::numeric, 1) || ' ' || (shared_blks_hit + shared_blks_read) FROM pg_stat_statements WHERE $RET_MATCH ORDER BY calls DESC LIMIT 1")

# ---------------------------------------------------------------- the anchor
# retention out of the way: the table stays as the week left it
configure 36500d
sleep 2
log "the anchor: $WIN_ROWS rows in their delivered state, freshly loaded into anchor.outbox"
# the same columns and defaults, and the same indexes under the same names
# (in a schema of its own), made before the rows go in, as the outbox's were
q bench "CREATE SCHEMA anchor"
q bench "CREATE TABLE anchor.outbox (LIKE queuebox.outbox INCLUDING ALL EXCLUDING INDEXES)
         WITH (fillfactor = 80, autovacuum_enabled = false)"
q bench "SELECT indexdef FROM pg_indexes WHERE schemaname = 'queuebox' AND tablename = 'outbox'" \
	| sed 's/ ON queuebox\.outbox / ON anchor.outbox /; s/$/;/' >"$WORK/anchor-indexes.sql"
"$PSQL" "$CONN_BASE dbname=bench" -X -v ON_ERROR_STOP=1 -q -f "$WORK/anchor-indexes.sql" || die "the anchor's indexes"
cols=$(q bench "SELECT string_agg(quote_ident(attname), ', ' ORDER BY attnum) FROM pg_attribute
                WHERE attrelid = 'queuebox.outbox'::regclass AND attnum > 0 AND NOT attisdropped
                  AND attname NOT IN ('id', 'message_id', 'key', 'payload', 'headers')")
t_a=$EPOCHREALTIME
q bench "INSERT INTO anchor.outbox (key, payload, headers, $cols)
         SELECT 'k' || (g % $KEYS), $PAYLOAD_SQL, $HEADERS_SQL, t.*
         FROM (SELECT $cols FROM queuebox.outbox WHERE state = 'sent' ORDER BY id DESC LIMIT 1) t,
              generate_series(1, $WIN_ROWS) g" >/dev/null
q bench "VACUUM ANALYZE anchor.outbox"
ANCHOR=$(sizes anchor.outbox)
log "anchor loaded in $(python3 -c "print(round($EPOCHREALTIME - $t_a, 1))") s: $(q bench "SELECT pg_size_pretty(pg_total_relation_size('anchor.outbox'))") ($ANCHOR)"
q bench "DROP SCHEMA anchor CASCADE"

# ---------------------------------------------------------------- the statement
# its text as the tree has it (installed by make install before the run)
printf '#include <stdio.h>\n#include "qb_sql_pg.h"\nint main(void) { puts(QB_PG_OUTBOX_RETENTION); return 0; }\n' >"$WORK/ret.c"
cc -I"$ROOT/src/common/pgsql" -o "$WORK/ret" "$WORK/ret.c" || die "cannot read QB_PG_OUTBOX_RETENTION"
RET_SQL=$("$WORK/ret")
[[ -n "$(q bench "SELECT 1 FROM pg_stat_statements WHERE $RET_MATCH LIMIT 1")" ]] || die "pg_stat_statements has no retention statement"
WORKER_SET="SET enable_seqscan = off; SET enable_bitmapscan = off; SET enable_sort = off; SET enable_hashjoin = off; SET jit = off; SET plan_cache_mode = force_generic_plan;"
DEFAULT_SET="SET plan_cache_mode = force_generic_plan;"
q bench "ANALYZE queuebox.outbox"
# the statement before this benchmark (commit 9fd330d): any 1,000 old sent
# rows, by a filter on a scan of the table; EXPLAINed beside the tree's
OLD_SQL="DELETE FROM queuebox.outbox o WHERE o.id = ANY (ARRAY(   SELECT x.id FROM queuebox.outbox x   WHERE x.state = 'sent'     AND x.created_at < now() - \$1 * interval '1 second'   LIMIT \$2   FOR UPDATE SKIP LOCKED))"
# the walk of outbox_pkey without a floor (commit 7d66426): every batch walks
# from the first id
WALK_SQL="DELETE FROM queuebox.outbox o WHERE o.id = ANY (ARRAY(   SELECT x.id FROM queuebox.outbox x   WHERE x.id = ANY (ARRAY(     SELECT w.id FROM queuebox.outbox w     WHERE CASE WHEN w.created_at < now() - \$1 * interval '1 second'       THEN w.state = 'sent' ELSE w.created_at <= now() END     ORDER BY w.id LIMIT \$2))     AND x.state = 'sent'     AND x.created_at < now() - \$1 * interval '1 second'   FOR UPDATE SKIP LOCKED))"
# explain LABEL SETTINGS SECONDS [SQL]: REPEAT runs of EXPLAIN (ANALYZE,
# BUFFERS) of the statement (default: the tree's) with $1 = SECONDS, $2 =
# 1000, $3 (the floor; unused by the statements before it) 0, each rolled
# back; the plan
# of the last in explain-LABEL.txt; echoes "ms rows_deleted blocks
# rows_removed_by_filter heap_blocks_read" (ms: the median)
explain() {
	local label=$1 set=$2 secs=$3 sql=${4:-$RET_SQL} ms=() i out
	for (( i = 0; i < REPEAT; i++ )); do
		out=$("$PSQL" "$CONN_BASE dbname=bench" -X -v ON_ERROR_STOP=1 -At -q <<-EOF
		$set
		PREPARE ret(int8, int4, int8) AS $sql;
		BEGIN;
		EXPLAIN (ANALYZE, BUFFERS) EXECUTE ret($secs, 1000, 0);
		ROLLBACK;
		EOF
		) || die "EXPLAIN ($label) failed"
		ms+=("$(sed -n 's/^Execution Time: \([0-9.]*\) ms/\1/p' <<<"$out")")
	done
	printf '%s\n' "$out" >"$WORK/explain-$label.txt"
	python3 - "$WORK/explain-$label.txt" "${ms[*]}" <<-'EOF'
	import re, statistics, sys
	plan = open(sys.argv[1]).read()
	ms = statistics.median(float(x) for x in sys.argv[2].split())
	lock = re.search(r'LockRows\s+\(.*?actual time=[\d.]+\.\.[\d.]+ rows=(\d+)', plan)
	filt = sum(int(x) for x in re.findall(r'Rows Removed by Filter: (\d+)', plan))
	recheck = sum(int(x) for x in re.findall(r'Rows Removed by Index Recheck: (\d+)', plan))
	top = re.search(r'Buffers: shared(?: hit=(\d+))?(?: read=(\d+))?', plan)
	blocks = sum(int(x or 0) for x in top.groups()) if top else 0
	node = re.search(r'->  ((?:Index|Seq|Bitmap Heap|Index Only) Scan[^(]*?) on outbox [wx] ', plan)
	print(f"{ms:.1f} {lock.group(1) if lock else '?'} {blocks} {filt + recheck} {(node.group(1).strip().replace(' ', '_') if node else '?')}")
	EOF
}
# the last call of a retention run finds fewer rows than its limit, so it
# reads on to the end: $1 past the oldest row's age finds none at all
NONE_S=$(q bench "SELECT ceil(extract(epoch FROM now() - min(created_at)))::bigint + 60 FROM queuebox.outbox")
declare -A X
for s in worker default; do
	set_var=WORKER_SET; [[ $s == default ]] && set_var=DEFAULT_SET
	X[$s-full]=$(explain "$s-full" "${!set_var}" $(( 6 * DAY_S )))
	X[$s-last]=$(explain "$s-last" "${!set_var}" "$NONE_S")
	log "retention, $s planner settings: a full batch (ms rows blocks rows-read-not-deleted scan) ${X[$s-full]}; the last batch ${X[$s-last]}"
done
X[before-full]=$(explain before-full "$WORKER_SET" $(( 6 * DAY_S )) "$OLD_SQL")
X[before-last]=$(explain before-last "$WORKER_SET" "$NONE_S" "$OLD_SQL")
log "retention before (9fd330d's statement), workers' settings: a full batch ${X[before-full]}; the last batch ${X[before-last]}"

# the dead front: DEAD_ROWS old rows retention keeps (dead, as after an
# outage) ahead of the old sent ones: the first DEAD_ROWS ids set dead in a
# transaction rolled back, then a run of DEAD_BATCHES batches back to back
# (rows older than 6 days: a day's rows to delete), workers' settings,
# each batch's time (psql's \timing); once by 7d66426's walk, where every
# batch starts at the first id, once by the tree's, each batch from the
# floor the one before answered
DEAD_ROWS=${QB_BENCH_DEAD_ROWS:-100000}
DEAD_BATCHES=${QB_BENCH_DEAD_BATCHES:-20}
dead_run() { # dead_run SQL FLOOR(0|1): the batches' ms, one a line
	local sql=$1 floor=$2 script i
	script="$WORKER_SET
BEGIN;
UPDATE queuebox.outbox SET state = 'dead' WHERE id IN (SELECT id FROM queuebox.outbox ORDER BY id LIMIT $DEAD_ROWS);
PREPARE ret(int8, int4, int8) AS $sql;
\\set walked 0
\\timing on"
	for (( i = 0; i < DEAD_BATCHES; i++ )); do
		if [[ $floor == 1 ]]; then
			script+=$'\n'"EXECUTE ret($(( 6 * DAY_S )), 1000, :walked) \\gset"
		else
			script+=$'\n'"EXECUTE ret($(( 6 * DAY_S )), 1000, 0);"
		fi
	done
	script+=$'\n'"\\timing off"$'\n'"ROLLBACK;"
	"$PSQL" "$CONN_BASE dbname=bench" -X -v ON_ERROR_STOP=1 -At -q <<<"$script" \
		| sed -n 's/^Time: \([0-9.]*\) ms.*/\1/p' || die "the dead front run failed"
}
dead_summary() { # "first ms, median of the rest ms, total ms"
	python3 -c 'import statistics, sys; v = [float(x) for x in sys.stdin.read().split()]; print(f"{v[0]:.1f} {statistics.median(v[1:]):.1f} {sum(v):.0f} {len(v)}")'
}
DEAD_WALK=$(dead_run "$WALK_SQL" 0 | dead_summary)
DEAD_FLOOR=$(dead_run "$RET_SQL" 1 | dead_summary)
log "the dead front ($DEAD_ROWS dead rows first), $DEAD_BATCHES batches (first ms, median of the rest ms, total ms, batches): 7d66426's walk $DEAD_WALK; the tree's $DEAD_FLOOR"
# each autovacuum pass of the outbox: its elapsed time (log_autovacuum_min_duration = 0)
AV=$(awk '/automatic vacuum of table "bench.queuebox.outbox"/ { on = 1 }
	on && /elapsed: / { sub(/.*elapsed: /, ""); sub(/ s.*/, ""); print; on = 0 }' "$WORK/pg.log" \
	| python3 -c 'import sys; v = [float(x) for x in sys.stdin.read().split()]; print(f"{len(v)} passes, mean {sum(v) / len(v):.1f} s, max {max(v):.1f} s" if v else "0 passes")')

# ---------------------------------------------------------------- the summary
SUMMARY=$(python3 - "$DAYS_TSV" "$ANCHOR" "$DAY_S" "$RPD" "$STMT" "$late" \
	"${X[worker-full]}" "${X[worker-last]}" "${X[default-full]}" "${X[default-last]}" "${X[before-full]}" "${X[before-last]}" \
	"$DEAD_ROWS" "$DEAD_WALK" "$DEAD_FLOOR" <<-'EOF'
import sys
rows = [l.rstrip('\n').split('\t') for l in open(sys.argv[1])]
anchor = dict(kv.split('=') for kv in sys.argv[2].split())
day_s, rpd = int(sys.argv[3]), int(sys.argv[4])
calls, nrows, tot_ms, mean_ms, max_ms, blks = sys.argv[5].split()
late = int(sys.argv[6])
xs = {k: v.split() for k, v in zip(['worker-full', 'worker-last', 'default-full', 'default-last', 'before-full', 'before-last'], sys.argv[7:13])}
MB = 1048576.0
def mb(b): return f"{int(b) / MB:.0f}"
def idx(sz): return {k: int(v) for k, v in sz.items() if k not in ('heap', 'total')}
# outbox_created_brin: schema 0.3.7 dropped it; a tree without it shows '-'
def brin_mb(ix): return f"{ix['outbox_created_brin'] / MB:.2f}" if 'outbox_created_brin' in ix else '-'
a_total = int(anchor['total'])
out = []
out.append(f"| day | rows sent / other | oldest row (days) | heap MB | outbox_pkey MB | outbox_created_brin MB | the 12 partial indexes MB | total MB | total / anchor | live / dead tuples | autovacuums | retention calls, rows deleted, ms, shared blocks (that day) | blocks per row deleted |")
out.append("|" + "---|" * 13)
prev = ['0', '0', '0', '0']
prev_del = 0
totals = {}
for r in rows:
    d, t_ins, t_done, states, oldest, tup, ret, sizes, req = r
    st = dict(kv.split('=') for kv in states.split()) if states != 'none' else {}
    sent = int(st.get('sent', 0)); other = sum(int(v) for k, v in st.items() if k != 'sent')
    sz = {k: int(v) for k, v in (kv.split('=') for kv in sizes.split())}
    live, dead, av, aa = tup.split()
    ret = ret.split()
    dc = [float(ret[i]) - float(prev[i]) for i in range(4)]
    prev = ret
    # the rows deleted, from the table: inserted so far less those left
    # (pg_stat_statements' rows are the statement's, one a call since it
    # answers one row)
    cum_del = int(d) * rpd - (sent + other)
    dc[1], prev_del = cum_del - prev_del, cum_del
    ix = idx(sz)
    partial = sum(v for k, v in ix.items() if k not in ('outbox_pkey', 'outbox_created_brin'))
    totals[int(d)] = sz['total']
    bpr = f"{dc[3] / dc[1]:.1f}" if dc[1] else '-'
    out.append(f"| {d} | {sent} / {other} | {oldest} | {mb(sz['heap'])} | {mb(ix.get('outbox_pkey', 0))} | {brin_mb(ix)} | {mb(partial)} | {mb(sz['total'])} | {sz['total'] / a_total:.2f} | {live} / {dead} | {av} | {int(dc[0])}, {int(dc[1])}, {dc[2]:.0f}, {int(dc[3])} | {bpr} |")
out.append("")
ix_a = idx({k: int(v) for k, v in anchor.items()})
last = {k: int(v) for k, v in (kv.split('=') for kv in rows[-1][7].split())}
out.append("| relation | anchor (one window's rows freshly loaded) MB | end of the run MB | end / anchor |")
out.append("|---|---|---|---|")
for k in ['heap'] + sorted(ix_a) + ['total']:
    a = int(anchor[k]); e = last.get(k, 0)
    # an index the anchor's rows are not in (a partial one) has no ratio
    out.append(f"| {k} | {a / MB:.1f} | {e / MB:.1f} | {f'{e / a:.2f}' if a >= MB else '-'} |")
out.append("")
nd = len(rows)
wins = [(w, [totals[d] for d in range(7 * w - 6, 7 * w + 1) if d in totals]) for w in range(1, nd // 7 + 1)]
steady = [t for w, ts in wins if w >= 2 for t in ts]
k = max(steady) / a_total if steady else float('nan')
out.append("window: total MB at its end (max within it), / anchor: " + "; ".join(f"{w}: {ts[-1] / MB:.0f} ({max(ts) / MB:.0f}), {ts[-1] / a_total:.2f}" for w, ts in wins if ts))
if len(wins) >= 3:
    g = wins[-1][1][-1] / wins[-2][1][-1]
    out.append(f"growth of the last window's end over the one before: {g:.3f}x")
out.append(f"BOUND k = max steady-state total (windows 2 on) / anchor total = {k:.2f} (anchor {a_total / MB:.0f} MB)")
# the totals at the last day's end, as the days' table has them (the
# statement's own entry, read a little later, also holds the runs since)
d_calls, d_ms, d_blks = int(float(prev[0])), float(prev[2]), int(float(prev[3]))
out.append(f"retention statement over the days (pg_stat_statements at the last day's end; the rows deleted from the table): {d_calls} calls, {prev_del} rows deleted, {d_ms:.1f} ms, mean {d_ms / max(d_calls, 1):.2f} ms, {d_blks} shared blocks ({d_blks / max(prev_del, 1):.1f} per row deleted); its entry a little later: {calls} calls, {tot_ms} ms, mean {mean_ms} ms, max {max_ms} ms")
for key, what in [('worker-full', "workers' settings, a full batch"), ('worker-last', "workers' settings, the last batch of a run"),
                  ('default-full', "default settings, a full batch"), ('default-last', "default settings, the last batch of a run"),
                  ('before-full', "9fd330d's statement, workers' settings, a full batch"), ('before-last', "9fd330d's statement, workers' settings, the last batch of a run")]:
    ms, n, b, rr, node = xs[key]
    out.append(f"EXPLAIN, the tree's statement unless named, {what}: {ms} ms, {n} rows locked, {b} shared blocks, {rr} rows read and not taken, {node.replace('_', ' ')}")
dead_rows = int(sys.argv[13])
for what, v in [("7d66426's walk (every batch from the first id)", sys.argv[14]), ("the tree's statement (each batch from the floor the one before answered)", sys.argv[15])]:
    first, rest, total, nb = v.split()
    out.append(f"the dead front ({dead_rows} old dead rows ahead of the old sent ones), a run of {nb} batches of 1000, workers' settings, {what}: the first batch {first} ms, the others' median {rest} ms, {total} ms in all")
if late:
    out.append(f"WARNING: {late} days' rows took longer than the day")
print('\n'.join(out))
EOF
)
printf '%s\n' "$SUMMARY"
log "autovacuum of queuebox.outbox: $AV"

HEADER="## $(date -u '+%Y-%m-%d %H:%M UTC') — bench/retention, commit $COMMIT

Command: \`bench/retention/run.sh --record\`. A day is $DAY_S s, outbox.retention ${RET_S}s (7 days), $RPD rows a day (a window: $WIN_ROWS rows), $WINDOWS windows, keys $KEYS, inserts of $CHUNK rows a transaction; 2 outbox workers deliver every row to a loopback sink. The anchor: $WIN_ROWS rows in their delivered state in one INSERT into a fresh twin table (LIKE queuebox.outbox INCLUDING ALL, fillfactor 80), then VACUUM ANALYZE. Sizes at each day's end; autovacuum with the table's own settings and autovacuum_naptime $NAPTIME (time is compressed; PostgreSQL's least). ${QB_BENCH_NOTE:-}
$(qb_bench_machine)
PostgreSQL $PGVERSION, a fresh cluster (shared_buffers $SB); CPU busy while the benchmark was idle, before / after: ${BUSY[*]} %; autovacuum of queuebox.outbox: $AV."
if [[ "$RECORD" == 1 ]]; then
	printf '\n%s\n\n%s\n' "$HEADER" "$SUMMARY" >>"$ROOT/bench/RESULTS.md"
	log "appended to bench/RESULTS.md"
fi
