#!/usr/bin/env bash
# bench/mssql/run.sh: QueueBox on SQL Server against QueueBox on PostgreSQL, in one run.
#
#   QUEUEBOX_TEST_MSSQL_URL=sqlserver://... bench/mssql/run.sh [--record]
#
# Run from the repository root after `make && make install`, as root or as a
# user who can run initdb.  The SQL Server side is the database the URL names
# (the benchmark drops and recreates schema queuebox in it, as TAP 031 does);
# the PostgreSQL side is a temporary cluster with the daemon's schema
# (queuebox-mssqld --migrate), so both run the same daemon and statements.
# Without the URL the benchmark says so and exits 0.  Phases:
#   P  pull: claims per second, CLIENTS claimers each looping claim (batch 1,
#      its own transaction) + complete: 1 client on one source, 4 on one
#      source (SQL Server serialises them behind the source's app lock), 4
#      on four sources.  SQL Server: bench/mssql/pull.pl (DBD::ODBC, the
#      statements of examples/pull/sql/sqlserver); PostgreSQL: pgbench with
#      the same two statements.  The spec's figure for SQL Server: 110 to
#      140 claims per second per source.
#   E  end to end: queuebox-mssqld (QB_BENCH_WORKERS outbox workers)
#      delivering N rows, inserted in one transaction, to a qb_sink; rows/s
#      from commit to none pending or processing, on each database.
#
# Knobs: QB_BENCH_PULL_T=10 (s per pull run), QB_BENCH_PULL_ROWS (rows per
# source, default 20000 on SQL Server, 100000 on PostgreSQL: a claimer that
# runs out of rows measures nothing, and the run says so), QB_BENCH_N=20000
# (phase E rows), QB_BENCH_KEYS=0 (phase E rows over that many keys, k0,
# k1, ...: each key's rows in order, so a settle promotes the key's next
# row; 0: no key), QB_BENCH_WORKERS=1, QB_BENCH_PHASES=PE, QB_BENCH_TIMEOUT=600.
set -euo pipefail

RECORD=${QB_BENCH_RECORD:-0}
if [[ "${1:-}" == "--record" ]]; then RECORD=1; shift; fi
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PGBIN=${PGBIN:-$("${PG_CONFIG:-pg_config}" --bindir)}
URL=${QUEUEBOX_TEST_MSSQL_URL:-}
if [[ -z "$URL" ]]; then
	echo "bench/mssql: skipped: QUEUEBOX_TEST_MSSQL_URL is not set (no SQL Server to measure)"
	exit 0
fi
PULL_T=${QB_BENCH_PULL_T:-10}
MS_ROWS=${QB_BENCH_PULL_ROWS:-20000}
PG_ROWS=${QB_BENCH_PULL_ROWS:-100000}
N=${QB_BENCH_N:-20000}
KEYS=${QB_BENCH_KEYS:-0}
WORKERS=${QB_BENCH_WORKERS:-1}
PHASES=${QB_BENCH_PHASES:-PE}
TIMEOUT=${QB_BENCH_TIMEOUT:-600}
DAEMON=$ROOT/queuebox-mssqld
PULL="perl $ROOT/bench/mssql/pull.pl"
SB=1GB
has() { [[ "$PHASES" == *"$1"* ]]; }

# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"
qb_bench_prereqs
PGBENCH=$PGBIN/pgbench; [[ -x "$PGBENCH" ]] || PGBENCH=$(command -v pgbench) || die "pgbench not found"
[[ -x "$DAEMON" ]] || die "no $DAEMON (make)"
ldd "$DAEMON" | grep -q 'libasan\|libubsan' && die "$DAEMON is a sanitizer build (make clean && make)"
qb_bench_sink_build
DAEMON_PID=""
daemon_stop() { [[ -n "$DAEMON_PID" ]] && { kill -TERM "$DAEMON_PID" 2>/dev/null; wait "$DAEMON_PID" 2>/dev/null || true; }; DAEMON_PID=""; }
bench_cleanup_extra() { daemon_stop; return 0; }
qb_bench_workdir mssql
qb_bench_cluster mssql 100 on 1
q postgres "CREATE DATABASE pbench"
PG_URL="postgres://postgres@127.0.0.1:$PGPORT/pbench"
ENGINE=$($PULL count "$URL" "SELECT CASE WHEN SERVERPROPERTY('BabelfishVersion') IS NULL THEN CONCAT(N'SQL Server ', CAST(SERVERPROPERTY('ProductVersion') AS NVARCHAR(40))) ELSE CONCAT(N'Babelfish ', CAST(SERVERPROPERTY('BabelfishVersion') AS NVARCHAR(40)), N' (a TDS engine, not SQL Server)') END")
log "SQL Server side: $ENGINE"
start_sink ms
start_sink pg

conf() { # conf URL SINK_PORT
	cat <<EOC
database: {url: "$1", idlePollMaxMs: 200}
daemon: {outboxWorkers: $WORKERS}
outbox: {batchSize: 100, pollIntervalMs: 50}
destinations:
  sink: {type: http, baseUrl: "http://127.0.0.1:$2", path: /events}
routes:
  - {topicPattern: "**", destination: sink}
EOC
}
conf "$URL" "$SINK_PORT_ms" >"$WORK/ms.yaml"
conf "$PG_URL" "$SINK_PORT_pg" >"$WORK/pg.yaml"
# a fresh schema on both
"$DAEMON" --config "$WORK/pg.yaml" --migrate >/dev/null 2>&1 || die "migrate on PostgreSQL failed"
$PULL reset "$URL" >/dev/null
"$DAEMON" --config "$WORK/ms.yaml" --migrate >/dev/null 2>&1 || die "migrate on SQL Server failed: run $DAEMON --config $WORK/ms.yaml --migrate"

declare -a OUT_ROWS
row() { OUT_ROWS+=("| $1 | $2 | $3 | $4 |"); }

if has P; then
	cat >"$WORK/claim1.sql" <<'EOC'
SELECT id, claim_token FROM queuebox.inbox_claim(:src, 1, 30000) \gset
SELECT queuebox.inbox_complete(:id, :claim_token);
EOC
	for s in one s1 s2 s3 s4; do
		$PULL fill "$URL" "$s" "$MS_ROWS" >/dev/null
		q pbench "INSERT INTO queuebox.inbox (source, idempotency_key, payload, consumption) SELECT '$s', '$s-' || g, jsonb_build_object('n', g), 'pull' FROM generate_series(1, $PG_ROWS) g"
	done
	q pbench "VACUUM ANALYZE queuebox.inbox"
	q pbench "CHECKPOINT"
	for run in "1 one" "4 one" "4 s1,s2,s3,s4"; do
		read -r C SRCS <<<"$run"
		log "pull: $C client(s) on $SRCS"
		out=$($PULL run "$URL" "$SRCS" "$C" "$PULL_T")
		ms_claims=$(awk '{print $2}' <<<"$out"); ms_busy=$(awk '{print $4}' <<<"$out")
		ms_rate=$(python3 -c "print(round($ms_claims / $PULL_T, 1))")
		if [[ "$SRCS" == *,* ]]; then
			sed "s/:src/'s' || (:client_id + 1)/" "$WORK/claim1.sql" >"$WORK/claim.sql"
		else
			sed "s/:src/'one'/" "$WORK/claim1.sql" >"$WORK/claim.sql"
		fi
		chmod 644 "$WORK/claim.sql"
		as_pg "$PGBENCH" -h "$WORK" -p "$PGPORT" -U postgres -n -M prepared -T "$PULL_T" -c "$C" -j 2 \
			-f "$WORK/claim.sql" pbench >"$WORK/pgb.out" 2>&1 || { cat "$WORK/pgb.out" >&2; die "pgbench failed"; }
		pg_rate=$(pgbench_tps "$WORK/pgb.out"); pg_rate=$(python3 -c "print(round($pg_rate, 1))")
		left=$($PULL count "$URL" "SELECT COUNT(*) FROM queuebox.inbox WHERE state = N'pending'")
		pg_left=$(q pbench "SELECT count(*) FROM queuebox.inbox WHERE state = 'pending'")
		row "pull claims/s, $C client(s) on $( [[ "$SRCS" == *,* ]] && echo "4 sources" || echo "1 source")" \
			"$ms_rate ($ms_busy Msg 51000; $left rows left)" "$pg_rate ($pg_left rows left)" \
			"$(python3 -c "print(round($ms_rate / $pg_rate, 3))")"
	done
fi

deliver() { # deliver NAME YAML COUNT_CMD: rows/s of N rows, commit -> all sent
	local name=$1 yaml=$2; shift 2
	"$DAEMON" --config "$yaml" >"$WORK/daemon-$name.log" 2>&1 &
	DAEMON_PID=$!
	sleep 3
	local t0 t1 left
	if [[ "$name" == ms ]]; then
		$PULL outbox "$URL" bench.e "$N" "$KEYS"
	else
		q pbench "INSERT INTO queuebox.outbox (topic, key, payload) SELECT 'bench.e', CASE WHEN $KEYS > 0 THEN 'k' || ((g - 1) % $KEYS) END, jsonb_build_object('seq', g, 'type', 'order.created', 'note', 'padding padding padding') FROM generate_series(1, $N) g"
	fi
	t0=$(date +%s.%N)
	for _ in $(seq 1 $(( TIMEOUT * 10 ))); do
		left=$("$@")
		[[ "$left" == 0 ]] && break
		sleep 0.1
	done
	t1=$(date +%s.%N)
	[[ "$left" == 0 ]] || die "phase E on $name: $left rows left after ${TIMEOUT}s"
	daemon_stop
	python3 -c "print(round($N / ($t1 - $t0)))"
}
if has E; then
	log "end to end: $N rows on SQL Server"
	ms_e=$(deliver ms "$WORK/ms.yaml" $PULL count "$URL" "SELECT COUNT(*) FROM queuebox.outbox WHERE state IN (N'pending', N'processing')")
	log "end to end: $N rows on PostgreSQL"
	pg_e=$(deliver pg "$WORK/pg.yaml" q pbench "SELECT count(*) FROM queuebox.outbox WHERE state IN ('pending', 'processing')")
	row "end to end, $N rows in one transaction$( ((KEYS > 0)) && echo " over $KEYS keys"), $WORKERS outbox worker(s) (rows/s)" "$ms_e" "$pg_e" \
		"$(python3 -c "print(round($ms_e / $pg_e, 3))")"
fi

{
	echo "## $(date -u '+%Y-%m-%d %H:%M UTC') — bench/mssql, commit $COMMIT"
	echo
	echo "Command: \`QUEUEBOX_TEST_MSSQL_URL=... QB_BENCH_PHASES=$PHASES QB_BENCH_N=$N QB_BENCH_KEYS=$KEYS QB_BENCH_WORKERS=$WORKERS bench/mssql/run.sh$( ((RECORD)) && echo " --record")\`."
	qb_bench_machine
	echo "SQL Server side: $ENGINE. PostgreSQL side: $(q postgres 'SHOW server_version'), a fresh cluster (shared_buffers $SB), the daemon's schema. Both served by queuebox-mssqld $(${DAEMON} --version | awk '{print $2}')."
	echo
	echo "| measure | SQL Server side | PostgreSQL | SQL Server / PostgreSQL |"
	echo "|---|---|---|---|"
	printf "%s\n" "${OUT_ROWS[@]}"
	echo
} | tee "$WORK/section.md"
if ((RECORD)); then cat "$WORK/section.md" >>"$ROOT/bench/RESULTS.md"; log "recorded in bench/RESULTS.md"; fi
