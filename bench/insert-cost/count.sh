#!/usr/bin/env bash
# bench/insert-cost/count.sh: what one single-row INSERT into queuebox.outbox
# does beyond the same INSERT into public.twin (LIKE queuebox.outbox
# INCLUDING ALL, no trigger): counted, not timed (issue 37, target 3).
#
#   bench/insert-cost/count.sh [N]
#
# Run as root from the repository root after `make && make install` (perf
# probe needs root).  One temporary cluster (autovacuum off, so nothing else
# writes WAL; queuebox.outbox_workers $QB_BENCH_WORKERS, default 0).  For
# each table: N (10,000) rows inserted first, untimed, as bench/insert-cost
# leaves a table after a few seconds (1,000 keys, each with open rows: every
# new outbox row is parked behind its key), a CHECKPOINT, then N more
# single-row INSERTs, each its own transaction (synchronous_commit off in
# that session only), by one psql session running
# a prepared INSERT (as pgbench -M prepared does), with the same statement
# as bench/insert-cost.  For those N it reports, per INSERT, the WAL bytes
# and records (pg_current_wal_lsn, pg_stat_wal) and what the inserting
# backend called (perf uprobes on the postgres binary, counted by perf stat
# on that backend alone, with its CPU time, cpu_ns): catalog cache searches, heavyweight lock
# acquisitions, index scans begun, heap fetches by TID, row locks, relation
# size look-ups (an lseek each), SPI connections, parses, plans, WAL records
# inserted, contexts and hash tables created, lseek and kill calls.  The probes are removed at the end.
set -euo pipefail

N=${1:-10000}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PGBIN=${PGBIN:-$("${PG_CONFIG:-pg_config}" --bindir)}
SB=1GB
PROBES=(SearchCatCache1 SearchCatCache2 SearchCatCache3 SearchCatCacheList LockAcquireExtended
	index_beginscan heap_fetch heap_lock_tuple smgrnblocks SPI_connect raw_parser planner
	XLogInsert hash_create AllocSetContextCreateInternal)
# and two system calls: lseek (a relation's size), kill (a latch set on a waiting process)
SYSCALLS=(lseek kill)
# QB_BENCH_PROBES=0: the CPU alone (each probe hit costs the backend a trap:
# with them, cpu_ns is not what an INSERT costs)
if [[ "${QB_BENCH_PROBES:-1}" == 0 ]]; then PROBES=(); SYSCALLS=(); fi

[[ $(id -u) -eq 0 ]] || { echo "count.sh: perf probe needs root" >&2; exit 1; }
command -v perf >/dev/null || { echo "count.sh: perf is not installed" >&2; exit 1; }
# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"
qb_bench_prereqs
qb_bench_workdir insert-count
ADDED=()
bench_cleanup_extra() {
	for p in "${ADDED[@]:-}"; do [[ -n "$p" ]] && perf probe -q -d "probe_postgres:$p" 2>/dev/null; done
}
for p in "${PROBES[@]:-}"; do
	[[ -n "$p" ]] || continue
	if ! perf probe -l 2>/dev/null | grep -q "probe_postgres:$p "; then
		perf probe -q -x "$PGBIN/postgres" --add "$p" >/dev/null 2>&1 || die "perf probe $p failed"
		ADDED+=("$p")
	fi
done
QB_BENCH_PG_CONF="autovacuum = off" qb_bench_cluster insert-count 30 off "${QB_BENCH_WORKERS:-0}"
q postgres "CREATE DATABASE bench"
q bench "CREATE EXTENSION queuebox"
q bench "CREATE TABLE public.twin (LIKE queuebox.outbox INCLUDING ALL)"

# count TABLE: N inserts into TABLE after N untimed ones; a line of key=value
count() {
	local t=$1 f="$WORK/count-${1#*.}.sql" pidf="$WORK/pid-${1#*.}" ev
	q bench "TRUNCATE queuebox.outbox, public.twin" >/dev/null
	q bench "INSERT INTO $t (topic, key, payload) SELECT 'bench.event', 'k' || (random() * 1000)::int, '{\"n\": 1}' FROM generate_series(1, $N)" >/dev/null
	q bench "CHECKPOINT" >/dev/null
	{
		echo "\\pset tuples_only on"
		echo "\\pset format unaligned"
		echo "SELECT pg_backend_pid() \\g $pidf"
		# no WAL flush per commit: its fdatasync is kernel CPU of the backend's,
		# as large as the rest and as noisy; the WAL written is the same
		echo "SET synchronous_commit = off;"
		echo "PREPARE ins AS INSERT INTO $t (topic, key, payload) VALUES ('bench.event', 'k' || (random() * 1000)::int, '{\"n\": 1}');"
		echo "EXECUTE ins;"	# the plan and the caches warm
		echo "SELECT pg_sleep(3);"	# perf stat attaches meanwhile
		echo "SELECT pg_current_wal_lsn() AS l0, wal_records AS r0 FROM pg_stat_wal \\gset"
		for _ in $(seq "$N"); do echo "EXECUTE ins;"; done
		echo "SELECT pg_stat_force_next_flush();"
		echo "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), :'l0') AS bytes, wal_records - :r0 AS records FROM pg_stat_wal \\gset"
		echo "\\echo wal_bytes=:bytes wal_records=:records"
	} >"$f"
	chmod 644 "$f"; rm -f "$pidf"
	"$PSQL" "$CONN_BASE dbname=bench" -X -q -v ON_ERROR_STOP=1 -f "$f" >"$WORK/psql-${1#*.}.out" 2>&1 &
	local psql=$!
	for _ in $(seq 100); do [[ -s "$pidf" ]] && break; sleep 0.05; done
	[[ -s "$pidf" ]] || die "no backend pid"
	ev=task-clock
	(( ${#PROBES[@]} == 0 )) || ev+=,$(printf 'probe_postgres:%s,' "${PROBES[@]}")$(printf 'syscalls:sys_enter_%s,' "${SYSCALLS[@]}")
	perf stat -x, -e "${ev%,}" -p "$(tr -dc 0-9 <"$pidf")" -o "$WORK/perf-${1#*.}.csv" &
	local ps=$!
	wait "$psql" || { cat "$WORK/psql-${1#*.}.out" >&2; die "psql failed"; }
	sleep 0.5; kill -INT "$ps" 2>/dev/null || true	# it may have ended with the backend
	wait "$ps" 2>/dev/null || true
	grep -o 'wal_bytes=[0-9]* wal_records=[0-9]*' "$WORK/psql-${1#*.}.out"
	# task-clock: the backend's CPU in ms (with a fraction): cpu_us, in ns for the integer sums below
	awk -F, '$3 == "task-clock" {printf "cpu_ns=%.0f\n", $1 * 1000000}' "$WORK/perf-${1#*.}.csv"
	awk -F, '/probe_postgres|sys_enter/ {split($3, a, ":"); sub(/^sys_enter_/, "", a[2]); printf "%s=%s\n", a[2], $1}' "$WORK/perf-${1#*.}.csv"
}

declare -A V
for t in public.twin queuebox.outbox; do
	count "$t" >"$WORK/kv-${t#*.}"
	for x in $(cat "$WORK/kv-${t#*.}"); do V["$t.${x%%=*}"]=${x#*=}; done
done
printf '| per INSERT (%s after %s) | twin | outbox | outbox - twin |\n|---|---|---|---|\n' "$N" "$N"
for k in cpu_ns wal_bytes wal_records "${PROBES[@]:-}" "${SYSCALLS[@]:-}"; do
	[[ -n "$k" ]] || continue
	a=${V[public.twin.$k]:-0}; b=${V[queuebox.outbox.$k]:-0}
	[[ "$a" =~ ^[0-9]+$ ]] || a=0; [[ "$b" =~ ^[0-9]+$ ]] || b=0
	printf '| %s | %s | %s | %s |\n' "$k" "$(fdiv "$a" "$N" 2)" "$(fdiv "$b" "$N" 2)" "$(fdiv $(( b - a )) "$N" 2)"
done
q bench "SELECT 'outbox rows parked: ' || count(*) FILTER (WHERE hold = 'key') || ' of ' || count(*) FROM queuebox.outbox" >&2
