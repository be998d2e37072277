#!/usr/bin/env bash
# bench/relay/run.sh: the relay worker (push inbox rows -> queuebox.outbox)
# against the same forward done by SQL alone, measured in the same run.
#
#   bench/relay/run.sh [--record] [N_ROWS]          (default 100000)
#
# Run from anywhere after `make && make install` (as root, or as a user who
# can run initdb).  See bench/README.md ("bench/relay").
#
# One temporary PostgreSQL cluster with shared_preload_libraries=queuebox,
# queuebox.outbox_workers=0 (the outbox rows are never delivered) and
# queuebox.relay_worker=on.  Configuration: push source `hooks` (topic
# "relay.{{ eventType }}"), route ** to an http destination that is never
# called.  For each aggregate mode (QB_BENCH_AGGS, default "1000 null": the
# rows spread over 1000 aggregate ids, then all aggregate ids NULL) and each
# inbox.relay.batchSize (QB_BENCH_BATCHES, default "100"):
#   R   relay (db bench): TRUNCATE inbox and outbox, CHECKPOINT, then N pending
#       push rows in one INSERT ... SELECT generate_series; the relay is woken
#       at commit.  The clock runs from the return of the INSERT until no push
#       row is pending or processing (polled every 100 ms).  rows/s = N / time.
#   S   the anchor (db sqlonly, which the relay does not serve): the same rows,
#       forwarded by a PL/pgSQL procedure looping queuebox._relay_claim(batch)
#       then queuebox._relay_forward(...) with a COMMIT after each, as the
#       worker does, with no client round trip; once with synchronous_commit
#       on (S: like for like, the relay commits synchronously whatever
#       queuebox.worker_async_commit says, src/pgext/engine_worker.c) and once
#       off (SA: the limit if those commits were asynchronous).
# Ratios: relay / S, relay / SA, and relay / the outbox SQL-only limit, a
# figure cited from the latest section of bench/RESULTS.md written by
# bench/outbox-http (not measured in this run).
#
# Environment knobs (all optional):
#   QB_BENCH_AGGS="1000 null"  aggregate ids per run ("null": all NULL)
#   QB_BENCH_BATCHES="100"     inbox.relay.batchSize values (and the anchor's batch)
#   QB_BENCH_SHARED_BUFFERS    default 4GB (2GB when RAM < 16 GiB)
#   QB_BENCH_KEEP=1            keep the temp dir (cluster data, logs) on exit
#   QB_BENCH_RECORD=1          same as --record: append a section to bench/RESULTS.md
#   QB_BENCH_TIMEOUT=600       bound (s) of every wait
#   QB_BENCH_OUTBOX_LIMIT      rows/s to cite instead of the one read from RESULTS.md
set -euo pipefail

RECORD=${QB_BENCH_RECORD:-0}
if [[ "${1:-}" == "--record" ]]; then RECORD=1; shift; fi
N=${1:-100000}
[[ "$N" =~ ^[0-9]+$ && "$N" -ge 1 && $# -le 1 ]] || { echo "usage: bench/relay/run.sh [--record] [N_ROWS]" >&2; exit 2; }
CMDLINE="bench/relay/run.sh"; [[ "$RECORD" == 1 ]] && CMDLINE+=" --record"; CMDLINE+=" $N"

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
PGBIN=${PGBIN:-$("${PG_CONFIG:-pg_config}" --bindir)}
AGGS=${QB_BENCH_AGGS:-1000 null}
BATCHES=${QB_BENCH_BATCHES:-100}
TIMEOUT=${QB_BENCH_TIMEOUT:-600}
MEM_KB=$(awk '/^MemTotal:/ {print $2}' /proc/meminfo)
if [[ -n "${QB_BENCH_SHARED_BUFFERS:-}" ]]; then SB=$QB_BENCH_SHARED_BUFFERS
elif (( MEM_KB >= 16 * 1024 * 1024 )); then SB=4GB; else SB=2GB; fi
for a in $AGGS; do [[ "$a" == null || ( "$a" =~ ^[0-9]+$ && "$a" -ge 1 ) ]] || { echo "QB_BENCH_AGGS: numbers >= 1 or null" >&2; exit 2; }; done
for b in $BATCHES; do [[ "$b" =~ ^[0-9]+$ && "$b" -ge 1 ]] || { echo "QB_BENCH_BATCHES: numbers >= 1" >&2; exit 2; }; done


# ---------------------------------------------------------------- the cited outbox limit
# The latest "SQL-only limit: the extension's _outbox_claim(100) + _outbox_settle"
# row of bench/RESULTS.md (bench/outbox-http), with its section's title.
CITE=$(python3 - "$ROOT/bench/RESULTS.md" <<'EOF'
import re, sys
sec, val, src = None, "n/a", "none"
try:
    for line in open(sys.argv[1], encoding="utf-8"):
        if line.startswith("## "):
            sec = line[3:].strip()
        m = re.match(r"\| SQL-only limit: the extension's _outbox_claim\(100\) \+ _outbox_settle, 2 clients \(rows/s\) \| (\d+)", line)
        if m:
            val, src = m.group(1), sec
except OSError:
    pass
print(f"{val}\t{src}")
EOF
) || CITE=$'n/a\tnone'
if [[ -n "${QB_BENCH_OUTBOX_LIMIT:-}" ]]; then
	OUTBOX_LIMIT=$QB_BENCH_OUTBOX_LIMIT; OUTBOX_LIMIT_FROM="QB_BENCH_OUTBOX_LIMIT"
else
	OUTBOX_LIMIT=${CITE%%$'\t'*}
	OUTBOX_LIMIT_FROM="bench/RESULTS.md, section \"${CITE#*$'\t'}\""
fi

# ---------------------------------------------------------------- prerequisites
# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"
qb_bench_prereqs
POLL_PID=
bench_cleanup_extra() { [[ -n "${POLL_PID:-}" ]] && kill -TERM "$POLL_PID" 2>/dev/null; }
qb_bench_workdir relay

# ---------------------------------------------------------------- the cluster
qb_bench_cluster relay "50" on
if grep -i 'relay_worker' "$WORK/pg.log" | grep -qi 'warning\|invalid\|unrecognized'; then
	die "queuebox.relay_worker is not a setting of this build of queuebox.so (no relay worker yet?)"
fi

configure() { # configure DB BATCH
	q "$1" "SELECT queuebox.configure(\$yaml\$
inbox:
  relay: { enabled: true, batchSize: $2 }
sources:
  hooks:
    type: http
    path: /hooks
    idempotencyKeyHeader: X-Id
    eventTypeHeader: X-Event-Type
    topic: \"relay.{{ eventType }}\"
destinations:
  nowhere: { type: http, baseUrl: \"http://127.0.0.1:9\", path: /never }
routes:
  - { topicPattern: \"**\", destination: nowhere }
\$yaml\$)" >/dev/null
}

for db in bench sqlonly; do
	q postgres "CREATE DATABASE $db"
	q "$db" "CREATE EXTENSION queuebox"
	configure "$db" "${BATCHES%% *}"
done
# The anchor: the worker's two statements in a loop, a COMMIT after each, no
# client round trip.  The topic is rendered as the source's template would.
q sqlonly "CREATE PROCEDURE bench_relay_sql(batch int, INOUT moved bigint DEFAULT 0, INOUT claims int DEFAULT 0, INOUT claimed bigint DEFAULT 0)
LANGUAGE plpgsql AS \$\$
DECLARE
	tok uuid;
	ids bigint[];
	topics text[];
BEGIN
	LOOP
		tok := gen_random_uuid();
		SELECT array_agg(c.id), array_agg('relay.' || c.event_type)
		  INTO ids, topics
		  FROM queuebox._relay_claim(batch, 300000, tok) c;
		COMMIT;
		EXIT WHEN ids IS NULL;
		claims := claims + 1;
		claimed := claimed + cardinality(ids);
		moved := moved + queuebox._relay_forward(tok, ids, topics, NULL);
		COMMIT;
	END LOOP;
END \$\$"

# the relay worker is up
for _ in $(seq 1 100); do
	RELAY_PID=$(q bench "SELECT pid FROM pg_stat_activity WHERE backend_type = 'queuebox relay' LIMIT 1")
	[[ -n "$RELAY_PID" ]] && break
	sleep 0.1
done
[[ -n "$RELAY_PID" ]] || die "no 'queuebox relay' backend in pg_stat_activity"
if c=$(grep -m1 'terminated by signal' "$WORK/pg.log"); then die "a server process crashed: $c"; fi
log "relay worker pid $RELAY_PID"

# ---------------------------------------------------------------- helpers
now() { echo "$EPOCHREALTIME"; }

PAD=$(printf 'x%.0s' $(seq 1 175))
fill_sql() { # fill_sql AGGS: N pending push rows of source hooks
	local agg
	if [[ "$1" == null ]]; then agg="NULL"; else agg="'agg-' || (g % $1)"; fi
	echo "INSERT INTO queuebox.inbox (source, idempotency_key, event_type, aggregate_id, payload, headers)
	      SELECT 'hooks', 'k-' || g, 'e', $agg,
	             jsonb_build_object('n', g, 'tid', 1, 'pad', '$PAD'),
	             '{\"Content-Type\": \"application/json\", \"X-Event-Type\": \"e\"}'::jsonb
	      FROM generate_series(1, $N) g"
}
reset_db() { # reset_db DB
	q "$1" "TRUNCATE queuebox.inbox, queuebox.outbox"
	q postgres "CHECKPOINT"
}
check_db() { # check_db DB PREFIX: outbox rows, processed, dead, left
	local s
	s=$(q "$1" "SELECT (SELECT count(*) FROM queuebox.outbox) || ' ' || count(*) FILTER (WHERE state = 'processed') || ' ' || count(*) FILTER (WHERE state = 'dead') || ' ' || count(*) FILTER (WHERE state IN ('pending', 'processing')) FROM queuebox.inbox")
	read -r "R[${2}_outbox]" "R[${2}_processed]" "R[${2}_dead]" "R[${2}_left]" <<<"$s"
	[[ "${R[${2}_outbox]}" == "$N" && "${R[${2}_processed]}" == "$N" ]] \
		&& R[${2}_check]="ok" || R[${2}_check]="FAIL"
}

# Poll every 100 ms from one psql session until no push row is pending or
# processing.  Echoes the time.
wait_drained() { # wait_drained DEADLINE_EPOCH
	qb_bench_poll_until_false "$1" "SELECT EXISTS (SELECT 1 FROM queuebox.inbox WHERE state IN ('pending', 'processing') AND consumption = 'push');"
}

# ================================================================ the runs
for BATCH in $BATCHES; do
	configure bench "$BATCH"
	sleep 1   # let the relay load the configuration
	for AGG in $AGGS; do
		k="b${BATCH}_a${AGG}"
		# R: the relay
		reset_db bench
		busy_note
		log "relay: $N push rows, aggregates $AGG, batchSize $BATCH"
		q bench "$(fill_sql "$AGG")"
		t0=$(now)
		t1=$(wait_drained $(( EPOCHSECONDS + TIMEOUT )))
		[[ "$t1" =~ ^[0-9] ]] || die "the relay did not drain within ${TIMEOUT}s ($t1): $(q bench "SELECT state, count(*) FROM queuebox.inbox GROUP BY 1" | tr '\n' ' ')"
		R[${k}_r_elapsed]=$(python3 -c "print(f'{$t1 - $t0:.3f}')")
		R[${k}_r_rows_s]=$(python3 -c "print(round($N / ($t1 - $t0)))")
		check_db bench "${k}_r"
		log "relay: $N rows in ${R[${k}_r_elapsed]}s -> ${R[${k}_r_rows_s]} rows/s; outbox rows ${R[${k}_r_outbox]}, processed ${R[${k}_r_processed]}, dead ${R[${k}_r_dead]} (${R[${k}_r_check]})"

		# S / SA: the same forward by SQL alone
		for mode in s sa; do
			reset_db sqlonly
			busy_note
			opts=""; [[ "$mode" == sa ]] && opts="-c synchronous_commit=off"
			pgopts="-c statement_timeout=${TIMEOUT}s${opts:+ $opts}"
			q sqlonly "$(fill_sql "$AGG")"
			log "anchor ($mode${opts:+, $opts}): _relay_claim($BATCH) + _relay_forward loop"
			t0=$(now)
			out=$(PGOPTIONS="$pgopts" q sqlonly "CALL bench_relay_sql($BATCH)")
			t1=$(now)
			IFS='|' read -r moved claims claimed <<<"$out"
			R[${k}_${mode}_elapsed]=$(python3 -c "print(f'{$t1 - $t0:.3f}')")
			R[${k}_${mode}_rows_s]=$(python3 -c "print(round($moved / ($t1 - $t0)))")
			R[${k}_${mode}_per_claim]=$(fdiv "$claimed" "$claims" 1)
			check_db sqlonly "${k}_${mode}"
			log "anchor ($mode): $moved rows in ${R[${k}_${mode}_elapsed]}s -> ${R[${k}_${mode}_rows_s]} rows/s; $claims claims, ${R[${k}_${mode}_per_claim]} rows per claim; outbox rows ${R[${k}_${mode}_outbox]} (${R[${k}_${mode}_check]})"
		done
		R[${k}_ratio_s]=$(fdiv "${R[${k}_r_rows_s]}" "${R[${k}_s_rows_s]}" 2)
		R[${k}_ratio_sa]=$(fdiv "${R[${k}_r_rows_s]}" "${R[${k}_sa_rows_s]}" 2)
		if [[ "$OUTBOX_LIMIT" =~ ^[0-9]+$ ]]; then
			R[${k}_ratio_ob]=$(fdiv "${R[${k}_r_rows_s]}" "$OUTBOX_LIMIT" 2)
		else
			R[${k}_ratio_ob]=n/a
		fi
	done
done
busy_note

# The relay logs its own account when it stops.
as_pg "$PGBIN/pg_ctl" -D "$WORK/data" -m fast -w -t 60 stop >/dev/null 2>&1 && PG_STARTED=0
R[relay_stop]=$(grep -A1 'queuebox relay stopped' "$WORK/pg.log" | sed -n 's/.*LOG: *\(queuebox relay stopped: .*\)/\1/p; s/.*DETAIL: *\(.*\)/  \1/p' | paste -sd' ' - || true)
[[ -n "${R[relay_stop]}" ]] && log "${R[relay_stop]}"

# ================================================================ summary
SUMMARY=$(
	echo "| aggregates | batchSize | relay (rows/s) | SQL-only anchor, sync commit (rows/s) | same, synchronous_commit off (rows/s) | relay / anchor sync | relay / anchor async | relay / outbox SQL-only limit (cited: $OUTBOX_LIMIT rows/s) | checks (outbox rows = processed = N, dead) |"
	echo "|---|---|---|---|---|---|---|---|---|"
	for BATCH in $BATCHES; do
		for AGG in $AGGS; do
			k="b${BATCH}_a${AGG}"
			echo "| $AGG | $BATCH | ${R[${k}_r_rows_s]} (${R[${k}_r_elapsed]} s) | ${R[${k}_s_rows_s]} (${R[${k}_s_elapsed]} s, ${R[${k}_s_per_claim]} rows per claim) | ${R[${k}_sa_rows_s]} (${R[${k}_sa_elapsed]} s) | ${R[${k}_ratio_s]} | ${R[${k}_ratio_sa]} | ${R[${k}_ratio_ob]} | relay ${R[${k}_r_check]} (dead ${R[${k}_r_dead]}), anchors ${R[${k}_s_check]} / ${R[${k}_sa_check]} |"
		done
	done
	echo
	echo "The outbox SQL-only limit ($OUTBOX_LIMIT rows/s: _outbox_claim(100) + _outbox_settle, 2 pgbench clients, sync commit) is cited from $OUTBOX_LIMIT_FROM, not measured in this run."
	[[ -n "${R[relay_stop]}" ]] && echo "The relay's own account at stop (all runs): ${R[relay_stop]}."
	echo "CPU busy while the benchmark was idle, before each run and at the end (%): ${BUSY[*]} (above ~15: the machine was shared, figures are low)."
)
echo
echo "== bench/relay: N=$N, PostgreSQL $PGVERSION, $(nproc) cores${R_SANITIZED:+ — WARNING: $R_SANITIZED}"
echo "$SUMMARY"

if [[ "$RECORD" == 1 ]]; then
	{
		echo
		echo "## $(date -u '+%Y-%m-%d %H:%M UTC') — bench/relay, N=$N, commit $COMMIT${R_SANITIZED:+ ($R_SANITIZED)}"
		echo
		echo "Command: \`$CMDLINE\` (aggregates \"$AGGS\", batchSize \"$BATCHES\")."
		qb_bench_machine
		echo "PostgreSQL $PGVERSION, fresh cluster: shared_buffers $SB, max_wal_size 16GB, checkpoint_timeout 30min, fsync on, synchronous_commit on; queuebox.outbox_workers 0, queuebox.relay_worker on."
		echo "Relay: N pending push rows (source hooks, event_type e, ~200-byte payload) in one INSERT ... SELECT generate_series after TRUNCATE + CHECKPOINT; time from the INSERT's return until no push row is pending or processing. Anchor: the same rows in a database the relay does not serve, forwarded by a PL/pgSQL loop of queuebox._relay_claim(batchSize) + queuebox._relay_forward with a COMMIT after each (no client round trips)."
		echo
		echo "$SUMMARY"
	} >>"$ROOT/bench/RESULTS.md"
	log "appended to bench/RESULTS.md"
fi
