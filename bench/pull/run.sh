#!/usr/bin/env bash
# bench/pull/run.sh: the pull worker libraries against the raw pull statements, in one run.
#
#   bench/pull/run.sh [--record]
#
# Run from the repository root after `make && make install && make sink` (the
# extension installed; clients/c built; clients/ts's packages installed, as
# TAP 033 does; Go for clients/go, scripts/setup.sh), as root or as a user
# who can run initdb.  One temporary
# cluster with the extension.  For batch sizes 10 and 100 and 1 and 4
# workers:
#   raw  pgbench over the five statements, two ways:
#        - the anchor: the contract's loop, unrolled in a pgbench script:
#          the claim of a batch committed alone, then each message
#          completed in a transaction of its own, as a handler's must be;
#        - the ceiling: one claim of the batch whose rows are completed in
#          the same statement, one transaction per batch (no handler can
#          work so; it shows what one commit per message costs);
#   C    clients/c (libqueuebox-inbox) in W processes (test/qbi_test_worker
#        with a no-op handler): messages/s from start to N processed;
#   TS   clients/ts (@alternayte/queuebox-inbox) the same (test/process-worker.js);
#   Go   clients/go (github.com/alternayte/queuebox/clients/go) the same (its
#        internal/testworker, built by clients/go/test.sh --build-worker);
#   C#   clients/dotnet (QueueBox.Inbox) the same (test/QueueBox.Inbox.TestWorker,
#        built here in Release from clients/dotnet/packages, which
#        scripts/setup.sh fills; "n/a" where dotnet is not installed).
# Each library figure is divided by the anchor of the same batch and workers
# (target >= 0.8).  Knobs: QB_BENCH_N=5000 (messages per library run),
# QB_BENCH_BATCHES="10 100", QB_BENCH_WORKERS="1 4" (a subset, for a look),
# QB_BENCH_PGBENCH_T=10, QB_BENCH_RAW_ROWS=300000 (per raw run; the run
# stops if pgbench drains them), QB_BENCH_KINDS="c ts go dotnet" (the
# libraries to run; the others print "-").
set -euo pipefail

RECORD=${QB_BENCH_RECORD:-0}
if [[ "${1:-}" == "--record" ]]; then RECORD=1; shift; fi
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PGBIN=${PGBIN:-$("${PG_CONFIG:-pg_config}" --bindir)}
N=${QB_BENCH_N:-5000}
PGBENCH_T=${QB_BENCH_PGBENCH_T:-10}
RAW_ROWS=${QB_BENCH_RAW_ROWS:-300000}
TIMEOUT=${QB_BENCH_TIMEOUT:-600}
SB=1GB
CW=$ROOT/clients/c/test/qbi_test_worker
TW=$ROOT/clients/ts/test/process-worker.js
GOTEST=$ROOT/clients/go/test.sh
KINDS=" ${QB_BENCH_KINDS:-c ts go dotnet} "

# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"
qb_bench_prereqs
PGBENCH=$PGBIN/pgbench; [[ -x "$PGBENCH" ]] || PGBENCH=$(command -v pgbench) || die "pgbench not found"
[[ -x "$CW" ]] || die "no $CW (make sink)"
[[ -d "$ROOT/clients/ts/node_modules/pg" ]] || die "clients/ts has no node_modules (npm ci --prefix clients/ts)"
command -v go >/dev/null || die "go is not installed (scripts/setup.sh)"
qb_bench_workdir pull
GW=$WORK/go-testworker
"$GOTEST" --build-worker "$GW" || die "clients/go/test.sh --build-worker failed"
DW=$WORK/dotnet-testworker
if ! command -v dotnet >/dev/null; then
	log "dotnet is not installed: no C# figures (install the .NET 10 SDK, then scripts/setup.sh)"
	KINDS=${KINDS/ dotnet / }
elif [[ "$KINDS" == *" dotnet "* ]]; then
	DOTNET_NOLOGO=1 DOTNET_CLI_TELEMETRY_OPTOUT=1 NUGET_PACKAGES=$ROOT/clients/dotnet/packages \
		dotnet build "$ROOT/clients/dotnet/test/QueueBox.Inbox.TestWorker" -c Release -o "$DW" --disable-build-servers \
		>"$WORK/dotnet-build.log" 2>&1 || { cat "$WORK/dotnet-build.log" >&2; die "the C# test worker did not build"; }
fi
qb_bench_cluster pull 100 on 1
q postgres "CREATE DATABASE bench"
q bench "CREATE EXTENSION queuebox"

fill() { # fill SOURCE ROWS: a table of only these rows, so every run starts alike
	q bench "TRUNCATE queuebox.inbox"
	q bench "INSERT INTO queuebox.inbox (source, idempotency_key, payload, consumption)
	         SELECT '$1', '$1-' || g, jsonb_build_object('n', g, 'note', 'padding padding padding'), 'pull'
	         FROM generate_series(1, $2) g"
	q bench "VACUUM ANALYZE queuebox.inbox"
	q bench "CHECKPOINT"
}
drain() { # drain KIND WORKERS BATCH SOURCE: messages/s of N messages
	local kind=$1 w=$2 b=$3 src=$4 pids=() t0 t1 left
	fill "$src" "$N"
	t0=$(date +%s.%N)
	for i in $(seq 1 "$w"); do
		if [[ "$kind" == c ]]; then
			"$CW" "host=$WORK port=$PGPORT dbname=bench user=postgres" "w$i" 30000 -1 "$b" "$src" >"$WORK/$kind-$i.out" 2>&1 &
		else
			local cmd=(node "$TW")
			[[ "$kind" == go ]] && cmd=("$GW")
			[[ "$kind" == dotnet ]] && cmd=("$DW/QueueBox.Inbox.TestWorker")
			QBI_TEST_PGHOST=$WORK QBI_TEST_PGPORT=$PGPORT QBI_TEST_PGDATABASE=bench QBI_TEST_PGUSER=postgres \
				"${cmd[@]}" "w$i" 30000 -1 "$b" "$src" >"$WORK/$kind-$i.out" 2>&1 &
		fi
		pids+=($!)
	done
	for _ in $(seq 1 $(( TIMEOUT * 20 ))); do
		# open rows only, through their partial index: the poll must cost the run nothing
		left=$(q bench "SELECT count(*) FROM queuebox.inbox WHERE source = '$src' AND state IN ('pending', 'processing')")
		[[ "$left" == 0 ]] && break
		sleep 0.05
	done
	t1=$(date +%s.%N)
	kill -TERM "${pids[@]}" 2>/dev/null || true
	wait "${pids[@]}" 2>/dev/null || true
	[[ "$left" == 0 ]] || die "$kind w=$w b=$b: $left messages left after ${TIMEOUT}s"
	python3 -c "print(round($N / ($t1 - $t0)))"
}
raw() { # raw MODE WORKERS BATCH SOURCE: messages/s through the raw statements
	local mode=$1 w=$2 b=$3 src=$4
	fill "$src" "$RAW_ROWS"
	if [[ "$mode" == batch ]]; then
		cat >"$WORK/raw.sql" <<EOS
SELECT count(*) FILTER (WHERE queuebox.inbox_complete(c.id, c.claim_token)) FROM queuebox.inbox_claim('$src', $b, 30000) c;
EOS
	else
		# the contract's loop, unrolled: the claim committed alone, then
		# each message completed in a transaction of its own (the
		# handler's), as the libraries must
		{
			echo "CREATE TEMP TABLE IF NOT EXISTS held (n int, id bigint, claim_token uuid);"
			echo "BEGIN;"
			echo "TRUNCATE held;"
			echo "INSERT INTO held SELECT row_number() OVER (), c.id, c.claim_token FROM queuebox.inbox_claim('$src', $b, 30000) c;"
			echo "COMMIT;"
			for n in $(seq 1 "$b"); do
				echo "BEGIN;"
				echo "SELECT queuebox.inbox_complete(id, claim_token) FROM held WHERE n = $n;"
				echo "COMMIT;"
			done
		} >"$WORK/raw.sql"
	fi
	chmod 644 "$WORK/raw.sql"
	as_pg "$PGBENCH" -h "$WORK" -p "$PGPORT" -U postgres -n -M prepared -T "$PGBENCH_T" -c "$w" -j 2 \
		-f "$WORK/raw.sql" bench >"$WORK/raw.out" 2>&1 || { cat "$WORK/raw.out" >&2; die "pgbench failed"; }
	local done_rows
	done_rows=$(q bench "SELECT count(*) FROM queuebox.inbox WHERE source = '$src' AND state = 'processed'")
	(( done_rows < RAW_ROWS )) || die "raw $mode w=$w b=$b ran out of rows: raise QB_BENCH_RAW_ROWS"
	python3 -c "print(round($done_rows / $PGBENCH_T))"
}

ratio() { python3 -c "print(round($1 / $2, 2))"; }
declare -a OUT_ROWS
k=0
for b in ${QB_BENCH_BATCHES:-10 100}; do
	for w in ${QB_BENCH_WORKERS:-1 4}; do
		k=$((k + 1))
		log "batch $b, $w worker(s): raw, one transaction per message"
		r=$(raw contract "$w" "$b" "raw$k")
		log "batch $b, $w worker(s): raw, one transaction per batch"
		rb=$(raw batch "$w" "$b" "rawb$k")
		row="| batch $b, $w worker(s) | $rb | $r |"
		for kind in c ts go dotnet; do
			if [[ "$KINDS" == *" $kind "* ]]; then
				log "batch $b, $w worker(s): $kind"
				m=$(drain "$kind" "$w" "$b" "$kind$k")
				row+=" $m | $(ratio "$m" "$r") |"
			else
				row+=" - | - |"
			fi
		done
		OUT_ROWS+=("$row")
	done
done
{
	echo "## $(date -u '+%Y-%m-%d %H:%M UTC') — bench/pull, commit $COMMIT"
	echo
	echo "Command: \`bench/pull/run.sh$( ((RECORD)) && echo " --record")\`. $N messages per library run (no-op handler, one transaction per message, renewal thread on), pgbench -T $PGBENCH_T for the raw statements: the anchor runs the contract's loop (the claim committed alone, then each message completed in a transaction of its own); the ceiling claims and completes a batch in one statement and one transaction, which no handler can."
	qb_bench_machine
	echo "PostgreSQL $(q postgres 'SHOW server_version'), a fresh cluster (shared_buffers $SB) with the extension. Node $(node --version), $(go version | cut -d' ' -f3)$(command -v dotnet >/dev/null && echo ", .NET $(dotnet --version) (SDK; the worker in Release)")."
	echo
	echo "| run | raw, a transaction per batch (msg/s) | raw, a transaction per message: the anchor (msg/s) | C library (msg/s) | C / anchor | TypeScript library (msg/s) | TS / anchor | Go library (msg/s) | Go / anchor | C# library (msg/s) | C# / anchor |"
	echo "|---|---|---|---|---|---|---|---|---|---|---|"
	printf "%s\n" "${OUT_ROWS[@]}"
	echo
} | tee "$WORK/section.md"
if ((RECORD)); then cat "$WORK/section.md" >>"$ROOT/bench/RESULTS.md"; log "recorded in bench/RESULTS.md"; fi
