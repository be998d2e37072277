#!/usr/bin/env bash
# bench/insert-cost/run.sh: what an application's single-row INSERT into
# queuebox.outbox pays while the workers run (issue 26, target 1), against a
# plain twin table of the same columns and indexes in the same run.
#
#   bench/insert-cost/run.sh [--record]
#
# Run from the repository root after `make && make install`, as root or as a
# user who can run initdb (or PATH=<pg>/bin:$PATH PGBIN=<pg>/bin for a
# private install).  One temporary cluster (fsync and synchronous_commit on,
# as an application has them).  public.twin is CREATE TABLE ... (LIKE
# queuebox.outbox INCLUDING ALL): the same columns, defaults and indexes,
# without the routing trigger and the wake.  pgbench -n -M prepared -c
# $QB_BENCH_CLIENTS (4) -j 2 -T $QB_BENCH_T (15) inserts one row per
# transaction; each scenario runs twin, outbox, twin, outbox (both tables
# emptied before each run) and takes each table's median tps.  The ratio is
# outbox / twin.  Scenarios:
#   workers 0         queuebox.outbox_workers = 0: the trigger alone
#   workers 0, traced the same, each statement with a sqlcommenter comment
#                     (traceparent, tracestate) in both tables: the trigger
#                     stores the context in each row's headers (issue 27)
#   no configuration  2 outbox workers, nothing configured: nothing claimable
#   all held          2 outbox workers, the only destination paused a day
#   delivering        2 outbox workers delivering each row to a loopback sink
#                     (test/sink/qb_sink) as it commits: what the application
#                     pays while its rows go out (the workers share the cores)
# and it reports the outbox workers' CPU per 1,000 inserts in each, the
# machine's CPU per row inserted into each table (every process, from
# /proc/stat) and the CPUs' idle share, and in the last the sink's CPU and
# requests per row (must be >= 1), and what delivering may cost a row at
# issue 37's target (0.87 of the twin) against what it costs.
set -euo pipefail

RECORD=${QB_BENCH_RECORD:-0}
if [[ "${1:-}" == "--record" ]]; then RECORD=1; shift; fi
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PGBIN=${PGBIN:-$("${PG_CONFIG:-pg_config}" --bindir)}
T=${QB_BENCH_T:-15}
C=${QB_BENCH_CLIENTS:-4}
SB=1GB

# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"
qb_bench_prereqs
PGBENCH=$PGBIN/pgbench; [[ -x "$PGBENCH" ]] || PGBENCH=$(command -v pgbench) || die "pgbench not found"
qb_bench_workdir insert-cost
qb_bench_cluster insert-cost 30 off 2
q postgres "CREATE DATABASE bench"
q bench "CREATE EXTENSION queuebox"
q bench "CREATE TABLE public.twin (LIKE queuebox.outbox INCLUDING ALL)"
for t in queuebox.outbox public.twin; do
	echo "INSERT INTO $t (topic, key, payload) VALUES ('bench.event', 'k' || (random() * 1000)::int, '{\"n\": 1}');" \
		>"$WORK/insert-${t#*.}.sql"
	# the same statement as a traced application sends it (sqlcommenter)
	echo "INSERT INTO $t (topic, key, payload) VALUES ('bench.event', 'k' || (random() * 1000)::int, '{\"n\": 1}') /*db_driver='node-postgres',traceparent='00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01',tracestate='congo%3Dt61rcWkgMzE'*/;" \
		>"$WORK/insert-${t#*.}-traced.sql"
done
chmod 644 "$WORK"/insert-*.sql

# run TABLE: one pgbench run into it, both tables emptied first; echoes tps.
# The machine's CPU over the pgbench run ("busy idle", ms) goes to
# $WORK/cpu-TABLE (machine_cpu).
run() {
	local m0 m1
	q bench "TRUNCATE queuebox.outbox, public.twin" >/dev/null
	q bench "CHECKPOINT" >/dev/null
	read -ra m0 < <(machine_cpu)
	as_pg "$PGBENCH" -h 127.0.0.1 -p "$PGPORT" -U postgres -n -M prepared -c "$C" -j 2 -T "$T" \
		-f "$WORK/insert-$1.sql" bench >"$WORK/pgbench-$1.out" 2>&1 || { cat "$WORK/pgbench-$1.out" >&2; die "pgbench failed"; }
	read -ra m1 < <(machine_cpu)
	echo "$(( m1[0] - m0[0] )) $(( m1[1] - m0[1] ))" >"$WORK/cpu-$1"
	pgbench_tps "$WORK/pgbench-$1.out"
}

worker_pids() { q bench "SELECT string_agg(pid::text, ' ') FROM pg_stat_activity WHERE backend_type LIKE 'queuebox outbox%'"; }

ROWS=()
# scenario NAME: twin, outbox, twin, outbox; a row of the summary.  Besides
# the tps: the machine's CPU a row inserted into each table (every process:
# pgbench, the backends, the workers, the sink), the share of the CPUs idle
# meanwhile, and the outbox workers' (and with SINK_PID set, the sink's) CPU
# a row
scenario() {
	local twin=() out=() cpu=0 sink=0 n=0 nt=0 tps pids c0 s0 m
	local tb=0 ti=0 ob=0 oi=0
	for _ in 1 2; do
		twin+=("$(run "twin${FLAVOR:-}")")
		read -ra m <"$WORK/cpu-twin${FLAVOR:-}"; tb=$(( tb + m[0] )); ti=$(( ti + m[1] ))
		nt=$(( nt + $(q bench "SELECT count(*) FROM public.twin") ))
		pids=$(worker_pids)
		# shellcheck disable=SC2086
		c0=$(cpu_ms $pids); s0=$(cpu_ms ${SINK_PID:-})
		tps=$(run "outbox${FLAVOR:-}")
		out+=("$tps")
		read -ra m <"$WORK/cpu-outbox${FLAVOR:-}"; ob=$(( ob + m[0] )); oi=$(( oi + m[1] ))
		# shellcheck disable=SC2086
		cpu=$(( cpu + $(cpu_ms $pids) - c0 )); sink=$(( sink + $(cpu_ms ${SINK_PID:-}) - s0 ))
		n=$(( n + $(q bench "SELECT count(*) FROM queuebox.outbox") ))
	done
	local mt mo
	mt=$(median "${twin[@]}"); mo=$(median "${out[@]}")
	log "$1: twin ${twin[*]} tps, outbox ${out[*]} tps, workers' CPU $cpu ms for $n rows; the machine busy $tb ms (idle $ti) for $nt twin rows, $ob ms (idle $oi) for $n outbox rows; the sink's CPU $sink ms"
	# per row, kept for the budget line after the last scenario
	MACHINE_TWIN=$(fdiv $(( tb * 1000 )) "$nt" 1); MACHINE_OUT=$(fdiv $(( ob * 1000 )) "$n" 1)
	WORKERS_ROW=$(fdiv $(( cpu * 1000 )) "$n" 1); SINK_ROW=$(fdiv $(( sink * 1000 )) "$n" 1)
	ROWS+=("| $1 | $mt | $mo | $(fdiv "$mo" "$mt" 2) | $WORKERS_ROW | $(fdiv "$MACHINE_TWIN" 1 0) / $(fdiv "$MACHINE_OUT" 1 0) | $(fdiv $(( ti * 100 )) $(( tb + ti )) 0) / $(fdiv $(( oi * 100 )) $(( ob + oi )) 0) | ${SINK_PID:+$SINK_ROW} |")
}

set_guc outbox_workers 0
wait_role outbox 0
scenario "workers 0 (the trigger alone)"
# issue 27: the trigger takes the trace context of each statement's comment
FLAVOR=-traced scenario "workers 0, each INSERT with a sqlcommenter traceparent (stored in the row)"
q bench "SELECT count(*) FROM queuebox.outbox WHERE headers ? 'traceparent'" | grep -qv '^0$' || die "the traced rows carry no traceparent"

set_guc outbox_workers 2
wait_role outbox 2
scenario "2 workers, no configuration"

q bench "SELECT queuebox.configure('{\"destinations\": {\"d\": {\"type\": \"http\", \"baseUrl\": \"http://127.0.0.1:9\"}}, \"routes\": [{\"topicPattern\": \"**\", \"destination\": \"d\"}]}')" >/dev/null
q bench "SELECT queuebox.pause_destination('d', now() + interval '1 day')" >/dev/null
sleep 2
scenario "2 workers, the only destination paused"

qb_bench_sink_build
start_sink d
q bench "SELECT queuebox.configure('{\"destinations\": {\"d\": {\"type\": \"http\", \"baseUrl\": \"http://127.0.0.1:$SINK_PORT_d\"}}, \"routes\": [{\"topicPattern\": \"**\", \"destination\": \"d\"}]}')" >/dev/null
q bench "SELECT queuebox.resume_destination('d')" >/dev/null
sleep 2
r0=$(sink_stats "$SINK_PORT_d" | python3 -c 'import json,sys; print(json.load(sys.stdin)["requests"])')
SINK_PID=$SINK_PID_d scenario "2 workers, delivering every row"
r1=$(sink_stats "$SINK_PORT_d" | python3 -c 'import json,sys; print(json.load(sys.stdin)["requests"])')
left=$(q bench "SELECT count(*) FROM queuebox.outbox WHERE state <> 'sent'")
log "delivering: the sink answered $(( r1 - r0 )) requests; rows not sent at the end of the last run: $left"

HEADER="## $(date -u '+%Y-%m-%d %H:%M UTC') — bench/insert-cost, commit $COMMIT

Command: \`bench/insert-cost/run.sh --record\`. pgbench -n -M prepared -c $C -j 2 -T $T, one single-row INSERT per transaction (fsync and synchronous_commit on), into queuebox.outbox and into public.twin (LIKE queuebox.outbox INCLUDING ALL: no trigger, no wake), alternately, twice each, both tables emptied before each run; the median tps of each. The ratio is outbox / twin of the same scenario.
$(qb_bench_machine)
PostgreSQL $PGVERSION, a fresh cluster (shared_buffers $SB).

| scenario | twin tps | outbox tps | outbox / twin | outbox workers' CPU ms per 1,000 rows | the machine's CPU µs a row, twin / outbox | CPUs idle %, twin / outbox | the sink's CPU µs a row |
|---|---|---|---|---|---|---|---|"
# What delivering may cost at the target, if the runs are bound by the CPU
# (the idle column says how nearly): a twin row costs the machine
# MACHINE_TWIN, so at 0.87 of its rate an outbox row may cost MACHINE_TWIN /
# 0.87, that is ALLOW more; delivering costs EXTRA more.
read -r EXTRA ALLOW < <(python3 -c "import sys; t, o = map(float, sys.argv[1:]); print(f'{o - t:.0f} {t / 0.87 - t:.0f}')" \
	"$MACHINE_TWIN" "$MACHINE_OUT")
BUDGET="Delivering every row, the machine spent $MACHINE_OUT µs of CPU a row inserted into the outbox and $MACHINE_TWIN a row into the twin: $EXTRA µs more, of which the outbox workers $WORKERS_ROW and the sink $SINK_ROW. At 0.87 of the twin's rate (issue 37's target 3), on CPUs as busy as the twin's runs, an outbox row may cost $ALLOW µs more than a twin row."
printf '%s\n' "$HEADER" "${ROWS[@]}" "" "$BUDGET"
if [[ "$RECORD" == 1 ]]; then
	printf '\n%s\n' "$HEADER" >>"$ROOT/bench/RESULTS.md"
	printf '%s\n' "${ROWS[@]}" "" "$BUDGET" >>"$ROOT/bench/RESULTS.md"
fi
