#!/usr/bin/env bash
# bench/fanout/run.sh: what the application pays to send one event to three
# destinations (issue 39, fan-out), against what it pays today: three rows.
#
#   bench/fanout/run.sh [--record]
#
# Run from the repository root after `make && make install`, as root or as a
# user who can run initdb.  One temporary cluster (fsync and
# synchronous_commit on, as an application has them), the extension with
# queuebox.outbox_workers = 0 (the INSERT's own cost: the trigger, not the
# workers that share the cores), three destinations and the routes
#   fan.**  destinations: [a, b, c]      (fan-out: one row, copied at its claim)
#   one.a.** / one.b.** / one.c.**       (one destination each)
# pgbench -n -M prepared -c $QB_BENCH_CLIENTS (4) -j 2 -T $QB_BENCH_T (15),
# one transaction per event, in three forms:
#   fan-out    one INSERT of a fan.created row
#   three      three INSERTs, one.a, one.b, one.c, in one transaction (what
#              an application writes without fan-out)
#   one        one INSERT of a one.a row (the anchor of a single destination)
# Each runs twice, alternated, the outbox emptied before each; the median
# events/s of each.  Ratios: fan-out / three (> 1: fan-out costs the
# application less per event) and fan-out / one (what the mark costs).
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
qb_bench_workdir fanout
qb_bench_cluster fanout 30 off 2
q postgres "CREATE DATABASE bench"
q bench "CREATE EXTENSION queuebox"
set_guc outbox_workers 0
wait_role outbox 0
q bench "SELECT queuebox.configure('{\"destinations\": {\"a\": {\"type\": \"http\", \"baseUrl\": \"http://127.0.0.1:9\"}, \"b\": {\"type\": \"http\", \"baseUrl\": \"http://127.0.0.1:9\"}, \"c\": {\"type\": \"http\", \"baseUrl\": \"http://127.0.0.1:9\"}}, \"routes\": [{\"topicPattern\": \"fan.**\", \"destinations\": [\"a\", \"b\", \"c\"]}, {\"topicPattern\": \"one.a.**\", \"destination\": \"a\"}, {\"topicPattern\": \"one.b.**\", \"destination\": \"b\"}, {\"topicPattern\": \"one.c.**\", \"destination\": \"c\"}]}')" >/dev/null

ins() { echo "INSERT INTO queuebox.outbox (topic, key, payload) VALUES ('$1', 'k' || (random() * 1000)::int, '{\"n\": 1}');"; }
# one transaction per event, as the application's business transaction
{ echo "BEGIN;"; ins fan.created; echo "COMMIT;"; } >"$WORK/fan-out.sql"
{ echo "BEGIN;"; ins one.a.created; ins one.b.created; ins one.c.created; echo "COMMIT;"; } >"$WORK/three.sql"
{ echo "BEGIN;"; ins one.a.created; echo "COMMIT;"; } >"$WORK/one.sql"
chmod 644 "$WORK"/*.sql

# run FORM: one pgbench run, the outbox emptied first; echoes events/s
run() {
	q bench "TRUNCATE queuebox.outbox" >/dev/null
	q bench "CHECKPOINT" >/dev/null
	as_pg "$PGBENCH" -h 127.0.0.1 -p "$PGPORT" -U postgres -n -M prepared -c "$C" -j 2 -T "$T" \
		-f "$WORK/$1.sql" bench >"$WORK/pgbench-$1.out" 2>&1 || { cat "$WORK/pgbench-$1.out" >&2; die "pgbench failed"; }
	pgbench_tps "$WORK/pgbench-$1.out"
}

declare -A R
for form in fan-out three one fan-out three one; do
	R[$form]="${R[$form]:-} $(run "$form")"
	if [[ "$form" == fan-out ]]; then
		# the rows are marked (origin = id) and left for the claim to copy
		q bench "SELECT count(*) FILTER (WHERE origin = id) = count(*) FROM queuebox.outbox" | grep -qx t \
			|| die "fan-out rows were not marked at insert"
	fi
done
mf=$(median ${R[fan-out]}); m3=$(median ${R[three]}); m1=$(median ${R[one]})
log "events/s: fan-out${R[fan-out]}; three${R[three]}; one${R[one]}"

HEADER="## $(date -u '+%Y-%m-%d %H:%M UTC') — bench/fanout, commit $COMMIT

Command: \`bench/fanout/run.sh --record\`. pgbench -n -M prepared -c $C -j 2 -T $T, one transaction per event, BEGIN ... COMMIT (fsync and synchronous_commit on), queuebox.outbox_workers = 0: what the application's transaction pays. fan-out: one INSERT routed to three destinations; three: three INSERTs, one per destination; one: one INSERT to one destination. Each form twice, alternated, the outbox emptied before each; the median events/s.
$(qb_bench_machine)
PostgreSQL $PGVERSION, a fresh cluster (shared_buffers $SB).

| form | events/s | fan-out / form |
|---|---|---|"
ROWS=("| fan-out (1 INSERT, 3 destinations) | $mf | 1.00 |"
	"| three (3 INSERTs) | $m3 | $(fdiv "$mf" "$m3" 2) |"
	"| one (1 INSERT, 1 destination) | $m1 | $(fdiv "$mf" "$m1" 2) |")
printf '%s\n' "$HEADER" "${ROWS[@]}"
if [[ "$RECORD" == 1 ]]; then
	printf '\n%s\n' "$HEADER" >>"$ROOT/bench/RESULTS.md"
	printf '%s\n' "${ROWS[@]}" >>"$ROOT/bench/RESULTS.md"
fi
