#!/usr/bin/env bash
# bench/reclaim/run.sh: what the takeover test of the reclaim costs on a
# server whose lock manager is busy (issue 38: "the reclaim reads pg_locks
# once a second per worker: measure it with 32 workers and a busy lock
# manager").
#
#   bench/reclaim/run.sh [--record]
#
# Run from the repository root after `make && make install`, as root or as a
# user who can run initdb.  One temporary cluster.  The scene:
#   - 2,000 outbox rows processing under 32 live claimers (32 sessions each
#     holding its claimer's advisory lock, as 32 workers would), leases an
#     hour long: every reclaim must test every claimer, and takes nothing;
#   - $QB_BENCH_HOLDERS (100) sessions idle in a transaction that holds
#     ACCESS SHARE on 500 tables each: 50,000 locks in the shared lock table
#     (a server with partitioned tables and long transactions).
# Measured, each with pgbench -T $QB_BENCH_T (10):
#   1. the reclaim (SELECT queuebox._outbox_reclaim(1000)) back to back,
#      against the anchor: the pg_locks read that each reclaim made before
#      commit 'the reclaim tests each claimer' (QB_PG_CLAIMER_GONE's
#      subquery, verbatim), in the same run;
#   2. a lock-heavy application (8 clients, each transaction locks 32
#      tables: past the 16 fast-path slots, into the shared lock table)
#      alone, then beside the reclaim at 32 a second (32 workers' rounds),
#      then beside the old pg_locks read at 32 a second: its tps beside
#      each / alone.
set -euo pipefail

RECORD=${QB_BENCH_RECORD:-0}
if [[ "${1:-}" == "--record" ]]; then RECORD=1; shift; fi
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PGBIN=${PGBIN:-$("${PG_CONFIG:-pg_config}" --bindir)}
T=${QB_BENCH_T:-10}
HOLDERS=${QB_BENCH_HOLDERS:-100}
SB=256MB

# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"
qb_bench_prereqs
PGBENCH=$PGBIN/pgbench; [[ -x "$PGBENCH" ]] || PGBENCH=$(command -v pgbench) || die "pgbench not found"
qb_bench_workdir reclaim
QB_BENCH_PG_CONF="max_locks_per_transaction = 256${QB_BENCH_PG_CONF:+
$QB_BENCH_PG_CONF}" qb_bench_cluster reclaim $(( HOLDERS + 80 )) off 0
q postgres "CREATE DATABASE bench"
q bench "CREATE EXTENSION queuebox" 2>/dev/null
q bench "DO \$\$BEGIN FOR i IN 1..500 LOOP EXECUTE format('CREATE TABLE lt%s (a int)', i); END LOOP; END\$\$"
q bench "INSERT INTO queuebox.outbox (topic, key, payload) SELECT 't', 'k' || (g % 500), '{}' FROM generate_series(1, 2000) g"
q bench "UPDATE queuebox.outbox SET state = 'processing', claim_token = gen_random_uuid(), lease_until = now() + interval '1 hour', claimer = 1000 + id % 32, destination = 'd', hold = NULL"

# background SQL: a psql that runs FILE and stays (its pid killed at exit)
hold() {
	as_pg "$PSQL" "$CONN_BASE dbname=bench" -X -q -f "$1" >/dev/null 2>&1 &
	PIDS_TO_KILL+=("$!")
}
for c in $(seq 1000 1031); do
	printf 'SELECT pg_advisory_lock(%s);\nSELECT pg_sleep(7200);\n' "$c" >"$WORK/claimer-$c.sql"
	hold "$WORK/claimer-$c.sql"
done
{
	echo "BEGIN;"
	echo "DO \$\$BEGIN FOR i IN 1..500 LOOP EXECUTE format('LOCK TABLE lt%s IN ACCESS SHARE MODE', i); END LOOP; END\$\$;"
	echo "SELECT pg_sleep(7200);"
} >"$WORK/holder.sql"
chmod 644 "$WORK"/*.sql
for _ in $(seq 1 "$HOLDERS"); do hold "$WORK/holder.sql"; done
want=$(( HOLDERS * 500 ))
for _ in $(seq 1 600); do
	[[ $(q bench "SELECT count(*) FROM pg_locks WHERE locktype = 'relation' AND relation IN (SELECT oid FROM pg_class WHERE relname ~ '^lt[0-9]+\$')") -ge $want \
		&& $(q bench "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted") -ge 32 ]] && break
	sleep 0.2
done
LOCKS=$(q bench "SELECT count(*) FROM pg_locks")
log "the scene: $LOCKS locks held, 32 live claimers of 2,000 processing rows"

echo "SELECT queuebox._outbox_reclaim(1000);" >"$WORK/reclaim.sql"
# the old reclaim's read, verbatim (QB_PG_CLAIMER_GONE before this bench)
echo "SELECT ARRAY(SELECT (l.classid::int8 << 32) | l.objid::int8 FROM pg_catalog.pg_locks l WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted AND l.database = (SELECT oid FROM pg_catalog.pg_database WHERE datname = current_database()));" >"$WORK/pglocks.sql"
{
	echo "BEGIN;"
	printf 'LOCK TABLE %s IN ACCESS SHARE MODE;\n' "$(seq -s, -f 'lt%g' 401 432)"
	echo "COMMIT;"
} >"$WORK/app.sql"
chmod 644 "$WORK"/*.sql

# bench OUT ARGS...: one pgbench run into $WORK/OUT.out
bench() {
	local out=$1; shift
	as_pg "$PGBENCH" -h 127.0.0.1 -p "$PGPORT" -U postgres -n -T "$T" "$@" bench >"$WORK/$out.out" 2>&1 \
		|| { cat "$WORK/$out.out" >&2; die "pgbench $out failed"; }
}
lat() { sed -n 's/^latency average = \([0-9.]*\) ms/\1/p' "$WORK/$1.out"; }

bench reclaim -M prepared -f "$WORK/reclaim.sql"
bench pglocks -M prepared -f "$WORK/pglocks.sql"
[[ $(q bench "SELECT count(*) FROM queuebox.outbox WHERE state = 'processing'") == 2000 ]] \
	|| die "the reclaim took rows of live claimers"
log "reclaim $(lat reclaim) ms, the old pg_locks read $(lat pglocks) ms"

# beside RATE_FILE: the application's tps with RATE_FILE at 32 a second beside it
beside() {
	as_pg "$PGBENCH" -h 127.0.0.1 -p "$PGPORT" -U postgres -n -M prepared -R 32 -c 2 -j 1 -T "$T" \
		-f "$WORK/$1.sql" bench >"$WORK/beside-$1.out" 2>&1 &
	local bg=$!
	bench "app-$1" -M prepared -c 8 -j 2 -f "$WORK/app.sql"
	wait "$bg" || { cat "$WORK/beside-$1.out" >&2; die "pgbench beside $1 failed"; }
	printf '%.0f' "$(pgbench_tps "$WORK/app-$1.out")"
}
bench app-alone -M prepared -c 8 -j 2 -f "$WORK/app.sql"
A0=$(printf '%.0f' "$(pgbench_tps "$WORK/app-alone.out")")
A1=$(beside reclaim)
A2=$(beside pglocks)
log "the application alone $A0 tps, beside the reclaim $A1, beside the old read $A2"

HEADER="## $(date -u '+%Y-%m-%d %H:%M UTC') — bench/reclaim, commit $COMMIT

Command: \`bench/reclaim/run.sh --record\`. $LOCKS locks held ($HOLDERS sessions idle in a transaction holding 500 tables each), 2,000 outbox rows processing under 32 live claimers (32 sessions holding their advisory locks). pgbench -n -M prepared -T $T.
$(qb_bench_machine)
PostgreSQL $PGVERSION, a fresh cluster (shared_buffers $SB, max_locks_per_transaction 256).

| measure | figure | anchor in the same run | ratio |
|---|---|---|---|
| the reclaim, \`SELECT queuebox._outbox_reclaim(1000)\` back to back: mean latency | $(lat reclaim) ms | the old reclaim's pg_locks read alone: $(lat pglocks) ms | $(fdiv "$(lat reclaim)" "$(lat pglocks)" 3) |
| an application locking 32 tables per transaction (8 clients), beside the reclaim at 32/s | $A1 tps | alone: $A0 tps | $(fdiv "$A1" "$A0" 2) |
| the same beside the old pg_locks read at 32/s | $A2 tps | alone: $A0 tps | $(fdiv "$A2" "$A0" 2) |"
printf '%s\n' "$HEADER"
if [[ "$RECORD" == 1 ]]; then
	printf '\n%s\n' "$HEADER" >>"$ROOT/bench/RESULTS.md"
fi
