#!/usr/bin/env bash
# bench/console/run.sh: what the console's dead lists cost on 10^6 dead rows
# (issue 25; docs/operations.md, "Reading dead rows").
#
#   bench/console/run.sh [--record]
#
# Run from the repository root after `make && make install` (the extension
# installed), as root or as a user who can run initdb; or against a private
# install: PATH=<pg>/bin:$PATH PGBIN=<pg>/bin bench/console/run.sh.  One
# temporary cluster with the extension (no QueueBox worker runs).  It fills
# QB_BENCH_DEAD (10^6) dead outbox rows, as many sent rows between them (a
# dead list must not read those), over 20 destinations, 200 topics and 50,000
# keys, a few errors of which "needle" is one in 10^5; and as many dead inbox
# rows over 20 sources.  Then pgbench -n -M prepared -c 1 -T $QB_BENCH_T (5)
# runs each query alone and its mean time per call is set beside the anchor
# of the same run: the plain statement
#   SELECT <the list's columns> FROM queuebox.outbox WHERE state = 'dead'
#   ORDER BY id LIMIT 100
# straight on the table (it walks outbox_dead_idx too).  The pages: the
# first, a deep one (after= the 900,000th dead id), each filter alone, a
# rare substring (the 10,000-row bound stops it: the page is short and says
# where to go on), the inbox's first page and by source, one row.
set -euo pipefail

RECORD=${QB_BENCH_RECORD:-0}
if [[ "${1:-}" == "--record" ]]; then RECORD=1; shift; fi
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PGBIN=${PGBIN:-$("${PG_CONFIG:-pg_config}" --bindir)}
DEAD=${QB_BENCH_DEAD:-1000000}
T=${QB_BENCH_T:-5}
SB=1GB

# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"
qb_bench_prereqs
PGBENCH=$PGBIN/pgbench; [[ -x "$PGBENCH" ]] || PGBENCH=$(command -v pgbench) || die "pgbench not found"
qb_bench_workdir console
qb_bench_cluster console 20 off 0
q postgres "CREATE DATABASE bench"
q bench "CREATE EXTENSION queuebox"
q bench "SELECT queuebox.configure('{\"destinations\": {\"d0\": {\"type\": \"http\", \"baseUrl\": \"http://127.0.0.1:9\"}}}')" >/dev/null

log "filling $DEAD dead and $DEAD sent outbox rows, $DEAD dead inbox rows"
q bench "INSERT INTO queuebox.outbox (topic, key, payload, state, destination, attempt, last_error, created_at)
         SELECT 'orders.t' || (g / 2 % 200), 'k' || (g / 2 % 50000), '{\"n\": 1}',
                CASE WHEN g % 2 = 0 THEN 'dead' ELSE 'sent' END, 'd' || (g / 2 % 20), 5,
                CASE WHEN g % 2 = 1 THEN NULL WHEN g % 200000 = 100000 THEN 'HTTP 500: needle in the body'
                     WHEN g % 3 = 0 THEN 'HTTP 503 Service Unavailable' ELSE 'timeout after 10000 ms' END,
                timestamptz '2026-01-01T00:00:00Z' + g * interval '1 second'
         FROM generate_series(1, 2 * $DEAD) g"
q bench "INSERT INTO queuebox.inbox (source, idempotency_key, event_type, payload, state, last_error, created_at)
         SELECT 's' || (g % 20), 'e' || g, 'ev' || (g % 50), '{\"n\": 1}', 'dead', 'no route for ev' || (g % 50),
                timestamptz '2026-01-01T00:00:00Z' + g * interval '1 second'
         FROM generate_series(1, $DEAD) g"
q bench "VACUUM ANALYZE queuebox.outbox"
q bench "VACUUM ANALYZE queuebox.inbox"
q bench "CHECKPOINT"
DEEP=$(q bench "SELECT id FROM queuebox.outbox WHERE state = 'dead' ORDER BY id OFFSET $((DEAD * 9 / 10)) LIMIT 1")
ONE=$(q bench "SELECT id FROM queuebox.outbox WHERE state = 'dead' ORDER BY id OFFSET $((DEAD / 2)) LIMIT 1")

# ms NAME SQL: the mean ms per call of SQL alone (pgbench, one client)
ms() {
	local f=$WORK/$1.sql
	printf '%s;\n' "$2" >"$f"; chmod 644 "$f"
	"$PGBENCH" -n -M prepared -c 1 -T "$T" -f "$f" "$CONN_BASE dbname=bench" >"$WORK/$1.out" 2>&1 \
		|| { cat "$WORK/$1.out" >&2; die "pgbench $1 failed"; }
	python3 -c "print(round(1000.0 / $(pgbench_tps "$WORK/$1.out"), 3))"
}
# page NAME ARGS: rows and next_after of dead_outbox(ARGS), for the table
page() { q bench "SELECT jsonb_array_length(p->'rows') || ' rows, next_after ' || coalesce(p->>'next_after', 'none') FROM queuebox.dead_outbox($1) p"; }

declare -a NAMES SQLS NOTES
add() { NAMES+=("$1"); SQLS+=("$2"); NOTES+=("$3"); }
add "anchor: SELECT ... WHERE state = 'dead' ORDER BY id LIMIT 100" \
	"SELECT id, message_id, topic, key, destination, attempt, max_attempts, last_error, created_at, hold FROM queuebox.outbox WHERE state = 'dead' ORDER BY id LIMIT 100" "100 rows"
add "dead_outbox(): the first page" "SELECT queuebox.dead_outbox()" "$(page '')"
add "dead_outbox(after => the 900,000th dead id): a deep page" "SELECT queuebox.dead_outbox(after => $DEEP)" "$(page "after => $DEEP")"
add "dead_outbox(destination => 'd7')" "SELECT queuebox.dead_outbox(destination => 'd7')" "$(page "destination => 'd7'")"
add "dead_outbox(topic => 'orders.t42')" "SELECT queuebox.dead_outbox(topic => 'orders.t42')" "$(page "topic => 'orders.t42'")"
add "dead_outbox(key => 'k4242')" "SELECT queuebox.dead_outbox(key => 'k4242')" "$(page "key => 'k4242'")"
add "dead_outbox(error => '503'): a common substring" "SELECT queuebox.dead_outbox(error => '503')" "$(page "error => '503'")"
add "dead_outbox(error => 'needle'): a rare one, stopped by the bound" "SELECT queuebox.dead_outbox(error => 'needle')" "$(page "error => 'needle'")"
add "dead_outbox(since, until): one hour" "SELECT queuebox.dead_outbox(since => '2026-01-10T00:00:00Z', until => '2026-01-10T01:00:00Z')" "$(page "since => '2026-01-10T00:00:00Z', until => '2026-01-10T01:00:00Z'")"
add "dead_outbox(destination => 'd7', error => 'timeout', page_size => 1000)" "SELECT queuebox.dead_outbox(destination => 'd7', error => 'timeout', page_size => 1000)" "$(page "destination => 'd7', error => 'timeout', page_size => 1000")"
add "dead_inbox(): the first page" "SELECT queuebox.dead_inbox()" "100 rows"
add "dead_inbox(source => 's7', event_type => 'ev17')" "SELECT queuebox.dead_inbox(source => 's7', event_type => 'ev17')" \
	"$(q bench "SELECT jsonb_array_length(p->'rows') || ' rows, next_after ' || coalesce(p->>'next_after', 'none') FROM queuebox.dead_inbox(source => 's7', event_type => 'ev17') p")"
add "outbox_row(id): one row with its audit" "SELECT queuebox.outbox_row($ONE)" "1 row"

declare -a OUT_ROWS
ANCHOR=
for i in "${!NAMES[@]}"; do
	log "${NAMES[$i]}"
	m=$(ms "q$i" "${SQLS[$i]}")
	[[ -n "$ANCHOR" ]] || ANCHOR=$m
	OUT_ROWS+=("| ${NAMES[$i]} | ${NOTES[$i]} | $m | $(python3 -c "print(round($m / $ANCHOR, 2))") |")
done
{
	echo "## $(date -u '+%Y-%m-%d %H:%M UTC') — bench/console, $DEAD dead rows, commit $COMMIT"
	echo
	echo "Command: \`bench/console/run.sh$( ((RECORD)) && echo " --record")\`. $DEAD dead and $DEAD sent outbox rows (20 destinations, 200 topics, 50,000 keys), $DEAD dead inbox rows (20 sources); pgbench -n -M prepared -c 1 -T $T per query, mean ms per call; the ratio is to the anchor of this run."
	qb_bench_machine
	echo "PostgreSQL $(q postgres 'SHOW server_version'), a fresh cluster (shared_buffers $SB), no QueueBox worker running."
	echo
	echo "| query | answer | ms per call | / anchor |"
	echo "|---|---|---|---|"
	printf "%s\n" "${OUT_ROWS[@]}"
	echo
} | tee "$WORK/section.md"
if ((RECORD)); then cat "$WORK/section.md" >>"$ROOT/bench/RESULTS.md"; log "recorded in bench/RESULTS.md"; fi
