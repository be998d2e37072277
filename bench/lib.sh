# shellcheck shell=bash
# bench/lib.sh: what the benchmarks share (sourced, not run).
#
# Before sourcing, a script sets PGBIN (and ROOT) and defines nothing else of
# these.  After it: log, die, free_port; qb_bench_prereqs (installed
# extension, not an ASan build; R_SANITIZED names a UBSan build); COMMIT
# (read at the start: the tree may move on while a benchmark runs;
# QB_BENCH_COMMIT overrides it, for bench/isolation/compare.sh);
# qb_bench_workdir NAME (WORK, as_pg, and an EXIT trap that stops the sinks
# in PIDS_TO_KILL and the cluster when PG_STARTED=1, prints the server log
# tail on failure, and calls bench_cleanup_extra when the script defines it);
# qb_bench_cluster; q; the sinks (qb_bench_sink_build, start_sink,
# sink_stats, sink_reset); the brokers (qb_bench_kafka_start, km_answer,
# qb_bench_rabbit_start, rabbit, qb_bench_brokers_stop); the rows (PAYLOAD_SQL, HEADERS_SQL, fill_sql);
# pgbench (pgbench_tps, the SQL-only claim + settle cycle:
# qb_bench_claim_settle_script, qb_bench_claim_settle); latency
# (qb_bench_latency_build, qb_bench_latency); cpu_ms; QB_BENCH_STATEMENTS
# (qb_bench_statements_conf, qb_bench_statements_reset, qb_bench_statements,
# QB_BENCH_POLL_LIKE); the workers (role_count, set_guc, wait_role,
# stop_line); qb_bench_machine.

log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

qb_bench_prereqs() {
	[[ -x "$PGBIN/initdb" ]] || die "no $PGBIN/initdb (PGBIN, or PG_CONFIG's --bindir)"
	PSQL=$PGBIN/psql	# used by the scripts that source this file
	export PSQL
	command -v python3 >/dev/null || die "python3 is needed for the summaries"
	PKGLIBDIR=$("${PG_CONFIG:-$PGBIN/pg_config}" --pkglibdir)
	[[ -f "$PKGLIBDIR/queuebox.so" ]] || die "queuebox.so is not installed in $PKGLIBDIR (make && make install)"
	[[ -f "$("${PG_CONFIG:-$PGBIN/pg_config}" --sharedir)/extension/queuebox.control" ]] || die "queuebox.control is not installed"
	if ldd "$PKGLIBDIR/queuebox.so" 2>/dev/null | grep -q 'libasan'; then
		die "$PKGLIBDIR/queuebox.so is an ASan build; reinstall a plain build (make clean && make && make install)"
	fi
	R_SANITIZED=
	if ldd "$PKGLIBDIR/queuebox.so" 2>/dev/null | grep -q 'libubsan'; then
		R_SANITIZED="UBSan build of queuebox.so"
		log "WARNING: $PKGLIBDIR/queuebox.so is a UBSan build: QueueBox figures will be somewhat low"
	fi
	if [[ -n "${QB_BENCH_COMMIT:-}" ]]; then COMMIT=$QB_BENCH_COMMIT; return 0; fi
	COMMIT=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo "no commit")
	if [[ -n "$(git -C "$ROOT" status --porcelain -- src sql 2>/dev/null)" ]]; then
		COMMIT+=" (uncommitted changes in src/ or sql/)"
	fi
}

qb_bench_workdir() {
	WORK=$(mktemp -d "/tmp/qb-bench-$1.XXXXXX")
	chmod 755 "$WORK"
	if [[ $(id -u) -eq 0 ]]; then
		id postgres >/dev/null 2>&1 || die "running as root needs a postgres user"
		chown postgres: "$WORK"
		as_pg() { runuser -u postgres -- "$@"; }
	else
		as_pg() { "$@"; }
	fi
	PG_STARTED=0
	PIDS_TO_KILL=()
	trap qb_bench_cleanup EXIT
	trap 'exit 130' INT
	trap 'exit 143' TERM
}

qb_bench_cleanup() {
	local rc=$?
	set +e
	if declare -F bench_cleanup_extra >/dev/null; then bench_cleanup_extra; fi
	for p in "${PIDS_TO_KILL[@]:-}"; do
		[[ -n "$p" ]] && kill -TERM "$p" 2>/dev/null && wait "$p" 2>/dev/null
	done
	if (( PG_STARTED )); then
		as_pg "$PGBIN/pg_ctl" -D "$WORK/data" -m fast -w -t 60 stop >/dev/null 2>&1
	fi
	if (( rc != 0 )) && [[ -f "$WORK/pg.log" ]]; then
		echo "---- last lines of the server log ($WORK/pg.log)" >&2
		tail -n 30 "$WORK/pg.log" >&2
	fi
	if [[ "${QB_BENCH_KEEP:-0}" == 1 || $rc -ne 0 ]]; then
		echo "kept $WORK" >&2
	else
		rm -rf "$WORK"
	fi
	exit $rc
}

# qb_bench_cluster NAME MAX_CONNECTIONS RELAY(on|off) [OUTBOX_WORKERS]: initdb
# and start a cluster in $WORK/data with queuebox preloaded for database
# bench, OUTBOX_WORKERS outbox workers (default 0), synchronous commit; sets
# PGPORT, CONN_BASE, PGVERSION and q DB SQL.
qb_bench_cluster() {
	PGPORT=$(free_port) || die "no free port"
	log "initdb in $WORK/data (port $PGPORT, shared_buffers $SB)"
	as_pg "$PGBIN/initdb" -D "$WORK/data" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 >"$WORK/initdb.log" 2>&1 \
		|| { cat "$WORK/initdb.log" >&2; die "initdb failed"; }
	{
		echo "# bench/$1"
		echo "listen_addresses = '127.0.0.1'"
		echo "port = $PGPORT"
		echo "unix_socket_directories = '$WORK'"
		echo "max_connections = $2"
		echo "shared_buffers = $SB"
		echo "max_wal_size = 16GB"
		echo "checkpoint_timeout = 30min"
		echo "fsync = on"
		echo "synchronous_commit = on"
		echo "shared_preload_libraries = 'queuebox'"
		echo "queuebox.database = 'bench'"
		echo "queuebox.outbox_workers = ${4:-0}"
		echo "queuebox.relay_worker = $3"
		echo "max_worker_processes = 16"	# bench/soak runs up to 9 QueueBox workers
		# QB_BENCH_PG_CONF: more postgresql.conf lines, to study a run (say
		# shared_preload_libraries = 'queuebox, pg_stat_statements')
		[[ -z ${QB_BENCH_PG_CONF:-} ]] || printf '%s\n' "$QB_BENCH_PG_CONF"
	} | as_pg tee -a "$WORK/data/postgresql.conf" >/dev/null
	as_pg "$PGBIN/pg_ctl" -D "$WORK/data" -l "$WORK/pg.log" -w -t 120 start >/dev/null \
		|| die "the cluster did not start"
	PG_STARTED=1
	CONN_BASE="host=127.0.0.1 port=$PGPORT user=postgres"
	PGVERSION=$(q postgres "SHOW server_version")
	log "PostgreSQL $PGVERSION up"
}

q() { # q DB SQL...: one statement, tuples only
	local db=$1; shift
	"$PSQL" "$CONN_BASE dbname=$db" -X -v ON_ERROR_STOP=1 -At -q -c "$*"
}

# cpu_busy, busy_note (a warning when the machine is not idle, kept in BUSY),
# median X..., fdiv A B DIGITS, and the results array R
cpu_busy() { # share of the CPUs busy over one second (all processes: machine_cpu)
	local a b
	read -ra a < <(machine_cpu); sleep 1; read -ra b < <(machine_cpu)
	fdiv $(( (b[0] - a[0]) * 100 )) $(( b[0] - a[0] + b[1] - a[1] )) 0
}
declare -A R   # results
BUSY=()
busy_note() {
	local b; b=$(cpu_busy)
	BUSY+=("$b")
	(( b <= 15 )) || log "WARNING: the CPUs are ${b}% busy while this benchmark is idle: another process is using the machine; figures will be low"
}
# median N...: the rounded median of the numbers given
median() { python3 -c "import statistics,sys; print(round(statistics.median(map(float, sys.argv[1:]))))" "$@"; }
fdiv() { # fdiv A B DIGITS: A / B, or n/a when either is not a number or B is 0
	python3 -c "import sys
try: a,b=float(sys.argv[1]),float(sys.argv[2])
except ValueError: a,b=0,0
print(f'{a/b:.{int(sys.argv[3])}f}' if b else 'n/a')" "$@"; }

# qb_bench_poll_until_false DEADLINE_EPOCH SQL [DB]: run SQL (a boolean)
# every 100 ms from one psql session on DB (default bench) until it is
# false; echoes the time then, or timeout / fail / crash.  The session's
# pid is POLL_PID while it runs.  It plans as the workers do, sequential and
# bitmap scans off: the statistics autovacuum takes after a fill say every
# row is pending, so an EXISTS over the outbox ran as a sequential scan that
# stops at the first pending row, reading every page already drained, every
# poll: time taken from the workers it measures.  Where no index holds the
# rows a poll looks for, it is still a sequential scan (qb_bench_wait_drained
# asks for keyed rows, which one index holds).
qb_bench_poll_until_false() {
	local deadline=$1 sql=$2 db=${3:-bench} line
	coproc POLL { "$PSQL" "$CONN_BASE dbname=$db" -X -At -q 2>&1; }
	echo "SET enable_seqscan = off; SET enable_bitmapscan = off;" >&"${POLL[1]}"
	while :; do
		echo "$sql" >&"${POLL[1]}"
		IFS= read -r -t 30 line <&"${POLL[0]}" || { line=timeout; }
		if [[ "$line" == f ]]; then echo "$EPOCHREALTIME"; break; fi
		if [[ "$line" != t ]]; then echo "poll failed: $line" >&2; echo fail; break; fi
		if (( EPOCHSECONDS > deadline )); then echo timeout; break; fi
		if grep -q 'terminated by signal' "$WORK/pg.log"; then echo crash; break; fi
		sleep 0.1
	done
	{ echo '\q' >&"${POLL[1]}"; } 2>/dev/null || true
	wait "$POLL_PID" 2>/dev/null || true
	POLL_PID=
}

free_port() { # a free TCP port on 127.0.0.1: nothing answers a connect to it
	local p _
	for _ in $(seq 1 50); do
		p=$(( 20000 + RANDOM % 40000 ))
		if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then echo "$p"; return 0; fi
	done
	return 1
}

# ---------------------------------------------------------------- the sinks
# qb_bench_sink_build: SINK, test/sink/qb_sink, built (make sink) if missing
# or older than its source.
qb_bench_sink_build() {
	SINK=$ROOT/test/sink/qb_sink
	if [[ ! -x "$SINK" || "$ROOT/test/sink/qb_sink.c" -nt "$SINK" ]]; then
		log "building the sink (make sink)"
		make -s -C "$ROOT" sink >&2
	fi
}
start_sink() { # start_sink NAME [extra args]: sets SINK_PORT_<NAME>, SINK_PID_<NAME>
	local name=$1; shift
	local pf="$WORK/sink-$name.port"
	"$SINK" --port 0 --port-file "$pf" --quiet "$@" >"$WORK/sink-$name.out" 2>&1 &
	local pid=$!
	PIDS_TO_KILL+=("$pid")
	for _ in $(seq 1 100); do
		[[ -s "$pf" ]] && break
		kill -0 "$pid" 2>/dev/null || die "sink $name exited: $(cat "$WORK/sink-$name.out")"
		sleep 0.05
	done
	[[ -s "$pf" ]] || die "sink $name did not start"
	printf -v "SINK_PORT_$name" '%s' "$(cat "$pf")"
	printf -v "SINK_PID_$name" '%s' "$pid"
}
sink_stats() { curl -s --max-time 5 "http://127.0.0.1:$1/_sink/stats"; }
sink_reset() { curl -s --max-time 5 -X POST "http://127.0.0.1:$1/_sink/reset" >/dev/null; }

# ---------------------------------------------------------------- the brokers
# The brokers of bench/brokers and bench/soak, on loopback, under $WORK.
# qb_bench_brokers_stop (from bench_cleanup_extra) stops whatever was started.
#
# qb_bench_kafka_start TOPIC:PARTITIONS...: test/brokers/kafka_mock
# (librdkafka's mock cluster, in memory) with these topics, driven through
# fd 7; sets KM_PID and KAFKA_BOOT.  km_answer COMMAND: its one-line answer.
KM_PID="" RMQ_ENV=()
qb_bench_kafka_start() {
	local t args=()
	for t in "$@"; do args+=(--topic "$t"); done
	mkfifo "$WORK/km.in"
	"$ROOT/test/brokers/kafka_mock" --bootstrap-file "$WORK/km.bootstrap" "${args[@]}" \
		<"$WORK/km.in" >"$WORK/km.out" 2>"$WORK/km.err" &
	KM_PID=$!
	exec 7>"$WORK/km.in"
	for _ in $(seq 1 300); do [[ -s "$WORK/km.bootstrap" ]] && break; kill -0 "$KM_PID" 2>/dev/null || break; sleep 0.1; done
	[[ -s "$WORK/km.bootstrap" ]] || die "kafka_mock did not start: $(cat "$WORK/km.err")"
	KAFKA_BOOT=$(head -1 "$WORK/km.bootstrap")
}
km_answer() { # km_answer COMMAND: kafka_mock's one-line answer to it
	local off; off=$(stat -c %s "$WORK/km.out")
	echo "$1" >&7
	for _ in $(seq 1 300); do
		[[ $(stat -c %s "$WORK/km.out") -gt $off ]] && tail -c +$(( off + 1 )) "$WORK/km.out" | grep -q . && break
		sleep 0.1
	done
	sleep 0.1
	tail -c +$(( off + 1 )) "$WORK/km.out" | head -1
}

# qb_bench_rabbit_start: a private rabbitmq-server, as
# test/perl/QueueBoxRabbit.pm starts one: its own node name, loopback ports
# (AMQP, distribution, epmd), cookie, mnesia, logs and config under
# $WORK/rabbitmq, no plugins; run as postgres when the script runs as root.
# Sets RABBIT_URL, RABBIT_VERSION, RMQ_NODE; rabbit CMD... runs a command in
# the broker's environment.  RABBIT_SERVER overrides the server's path.
qb_bench_rabbit_start() {
	RABBIT_SERVER=${RABBIT_SERVER:-/usr/lib/rabbitmq/bin/rabbitmq-server}
	RABBIT_CTL=$(dirname "$RABBIT_SERVER")/rabbitmqctl
	[[ -x "$RABBIT_SERVER" && -x "$RABBIT_CTL" ]] || die "$RABBIT_SERVER is not installed (scripts/setup.sh installs it)"
	local RD=$WORK/rabbitmq t_rmq ready=0
	RMQ_NODE=qbbench$$@localhost
	RMQ_PORT=$(free_port) || die "no free port"
	RMQ_DIST_PORT=$(free_port) || die "no free port"
	RMQ_EPMD_PORT=$(free_port) || die "no free port"
	(( RMQ_PORT != RMQ_DIST_PORT && RMQ_PORT != RMQ_EPMD_PORT && RMQ_DIST_PORT != RMQ_EPMD_PORT )) || die "free_port gave the same port twice; run again"
	mkdir -p "$RD/home" "$RD/mnesia" "$RD/log"
	chmod 700 "$RD/home"
	python3 -c 'import random, string; print("".join(random.choice(string.ascii_uppercase) for _ in range(20)), end="")' >"$RD/home/.erlang.cookie"
	chmod 400 "$RD/home/.erlang.cookie"
	: >"$RD/enabled_plugins"; : >"$RD/rabbitmq-env.conf"
	printf '%s\n' "listeners.tcp.default = 127.0.0.1:$RMQ_PORT" "disk_free_limit.absolute = 1MB" \
		"log.console = false" "log.file.level = info" >"$RD/rabbitmq.conf"
	[[ $(id -u) -eq 0 ]] && chown -R postgres: "$RD"
	RMQ_ENV=(HOME="$RD/home" RABBITMQ_NODENAME="$RMQ_NODE" RABBITMQ_NODE_IP_ADDRESS=127.0.0.1
		RABBITMQ_NODE_PORT="$RMQ_PORT" RABBITMQ_DIST_PORT="$RMQ_DIST_PORT"
		ERL_EPMD_PORT="$RMQ_EPMD_PORT" ERL_EPMD_ADDRESS=127.0.0.1
		"RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS=-kernel inet_dist_use_interface {127,0,0,1}"
		RABBITMQ_MNESIA_BASE="$RD/mnesia" RABBITMQ_LOG_BASE="$RD/log" RABBITMQ_CONFIG_FILE="$RD/rabbitmq.conf"
		RABBITMQ_ENABLED_PLUGINS_FILE="$RD/enabled_plugins" RABBITMQ_CONF_ENV_FILE="$RD/rabbitmq-env.conf"
		RABBITMQ_PID_FILE="$RD/rabbitmq.pid" RABBITMQ_ALLOW_INPUT= LANG=C.UTF-8 LC_ALL=C.UTF-8)
	t_rmq=$EPOCHREALTIME
	# its own session (the cleanup stops all of it); sid: the session's id
	rabbit setsid bash -c 'echo $$ >"$1/sid"; exec "$2"' - "$RD" "$RABBIT_SERVER" </dev/null >"$RD/server.out" 2>&1 &
	for _ in $(seq 1 120); do
		if rabbit timeout 40 "$RABBIT_CTL" -n "$RMQ_NODE" await_startup --timeout 30 >"$RD/await.out" 2>&1; then ready=1; break; fi
		[[ -s "$RD/sid" && -n "$(ps -o pid= -s "$(cat "$RD/sid")")" ]] || break
		sleep 0.5
	done
	(( ready )) || die "rabbitmq-server did not start: $(tail -5 "$RD/server.out") $(tail -3 "$RD/await.out")"
	RABBIT_URL=amqp://guest:guest@127.0.0.1:$RMQ_PORT/
	RABBIT_VERSION=$(dpkg-query -W -f '${Version}' rabbitmq-server 2>/dev/null || echo '?')
	RABBIT_UP_S=$(python3 -c "print(round($EPOCHREALTIME - $t_rmq, 1))")
}
rabbit() { as_pg env "${RMQ_ENV[@]}" "$@"; }	# rabbit CMD...: in the broker's environment

qb_bench_brokers_stop() {
	if [[ -n "${KM_PID:-}" ]]; then
		{ echo quit >&7; } 2>/dev/null
		exec 7>&- 2>/dev/null
		for _ in $(seq 1 50); do kill -0 "$KM_PID" 2>/dev/null || break; sleep 0.1; done
		kill -KILL "$KM_PID" 2>/dev/null
	fi
	if [[ -s "$WORK/rabbitmq/sid" ]]; then
		# a graceful stop, then whatever is left of its session, then its epmd
		local sid; sid=$(cat "$WORK/rabbitmq/sid")
		rabbit timeout 60 "$RABBIT_CTL" -n "$RMQ_NODE" stop >"$WORK/rabbitmq/stop.out" 2>&1
		for _ in $(seq 1 300); do [[ -n "$(ps -o pid= -s "$sid")" ]] || break; sleep 0.1; done
		kill -KILL -- "-$sid" 2>/dev/null
		rabbit /usr/lib/erlang/bin/epmd -port "$RMQ_EPMD_PORT" -kill >/dev/null 2>&1
	fi
	return 0
}

# ---------------------------------------------------------------- the rows
# ~300 bytes of JSON per row (bench/outbox-http checks it), 2 fields vary with g.
PAYLOAD_SQL="jsonb_build_object('seq', g, 'type', 'order.created', 'orderId', 'ord-' || g,
  'customer', jsonb_build_object('id', 'cus-' || (g % 9973), 'name', 'Jane Example', 'email', 'jane@example.com'),
  'items', jsonb_build_array(jsonb_build_object('sku', 'A-100', 'qty', 2, 'price', '19.90'),
                              jsonb_build_object('sku', 'B-200', 'qty', 1, 'price', '5.00')),
  'total', '44.80', 'currency', 'EUR', 'note', 'padding padding padding padding padding pad')"
HEADERS_SQL="'{\"X-Correlation-Id\":\"c\"}'::jsonb"

# fill_sql ROWS TOPIC: ROWS outbox rows in one INSERT, round-robin over
# $KEYS keys, with the payload and headers above
fill_sql() {
	echo "INSERT INTO queuebox.outbox (topic, key, payload, headers)
	      SELECT '$2', 'k' || (g % $KEYS), $PAYLOAD_SQL, $HEADERS_SQL
	      FROM generate_series(1, $1) g"
}

# qb_bench_wait_drained DEADLINE_EPOCH [DB]: the time when no keyed row is
# pending or processing (qb_bench_poll_until_false), the drain of keyed rows
# (fill_sql's).  outbox_key_open_idx holds every open keyed row, where no
# partial index holds every pending row: without it the poll is a
# sequential scan over the rows already sent (560 ms and 60,000 blocks a
# poll at 10^6 rows, 9 in 10 sent: bench/RESULTS.md, 2026-12-07).
qb_bench_wait_drained() {
	qb_bench_poll_until_false "$1" "SELECT EXISTS (SELECT 1 FROM queuebox.outbox WHERE state IN ('pending', 'processing') AND key IS NOT NULL);" "${2:-bench}"
}

# ---------------------------------------------------------------- pgbench
# pgbench_tps FILE: the tps pgbench printed (without initial connection time)
pgbench_tps() { sed -n 's/^tps = \([0-9.]*\) (without initial connection time)/\1/p' "$1"; }

# qb_bench_claim_settle_script FILE: the SQL-only cycle of the extension's
# own functions, as its workers run it: one queuebox._outbox_claim(100, ...)
# and one queuebox._outbox_settle(...) of the rows claimed, each in its own
# transaction.  The claim token is derived from client_id and a random
# number, so no extra round trip is spent to make one.
qb_bench_claim_settle_script() {
	cat >"$1" <<'EOF'
\set r random(1, 1000000000000)
SELECT coalesce(array_agg(id), '{}')::text AS ids, count(*) AS n FROM queuebox._outbox_claim(100, 300000, 10, md5(:client_id::text || '-' || :r::text)::uuid) \gset
SELECT queuebox._outbox_settle(md5(:client_id::text || '-' || :r::text)::uuid, :ids::bigint[], array_fill('sent'::text, ARRAY[:n::int]), array_fill(1, ARRAY[:n::int]), array_fill(0::bigint, ARRAY[:n::int]), array_fill(NULL::text, ARRAY[:n::int]));
EOF
	chmod 644 "$1"
}

# qb_bench_claim_settle PREFIX SCRIPT [TABLE]: VACUUM ANALYZE TABLE
# (queuebox.outbox), CHECKPOINT, then pgbench -n -M prepared -T $PGBENCH_T
# -c 2 -j 2 of SCRIPT on database $SQL_DB (default sqlonly), with
# PGOPTIONS=$PGB_OPTIONS.  Sets R[PREFIX_tps, _txns, _settled,
# _rows_per_claim, _rows_s, _left]; rows/s = rows that became sent / the
# run's elapsed time; n/a when the run ran out of pending rows.
qb_bench_claim_settle() {
	local pre=$1 script=$2 tbl=${3:-queuebox.outbox} db=${SQL_DB:-sqlonly} sent0 sent1 left tps txns settled
	q "$db" "VACUUM ANALYZE $tbl"
	q postgres "CHECKPOINT"
	sent0=$(q "$db" "SELECT count(*) FROM $tbl WHERE state = 'sent'")
	PGOPTIONS="${PGB_OPTIONS:-}" "$PGBENCH" -h 127.0.0.1 -p "$PGPORT" -U postgres -n -M prepared -T "$PGBENCH_T" -c 2 -j 2 \
		-f "$script" "$db" >"$WORK/pgbench-$pre.out" 2>&1 \
		|| { cat "$WORK/pgbench-$pre.out" >&2; die "pgbench failed ($pre)"; }
	sent1=$(q "$db" "SELECT count(*) FROM $tbl WHERE state = 'sent'")
	left=$(q "$db" "SELECT count(*) FROM $tbl WHERE state IN ('pending', 'processing')")
	tps=$(pgbench_tps "$WORK/pgbench-$pre.out")
	txns=$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' "$WORK/pgbench-$pre.out")
	settled=$(( sent1 - sent0 ))
	R[${pre}_tps]=$(printf '%.1f' "$tps"); R[${pre}_txns]=$txns; R[${pre}_settled]=$settled
	R[${pre}_rows_per_claim]=$(fdiv "$settled" "$txns" 1)
	# rows/s = rows settled / the run's elapsed time (= txns / tps)
	R[${pre}_rows_s]=$(python3 -c "print(round($settled * $tps / $txns))")
	R[${pre}_left]=$left
	log "SQL-only ($pre): tps=${R[${pre}_tps]} txns=$txns rows settled=$settled (${R[${pre}_rows_per_claim]} per claim) -> ${R[${pre}_rows_s]} rows/s; pending left $left"
	# a run that ran out of rows measured its rows, not the limit: no figure
	(( left > 0 )) || { log "WARNING: SQL-only ($pre) ran out of pending rows, so it gives no figure; raise QB_BENCH_SQL_ROWS"; R[${pre}_rows_s]=n/a; }
}

# ---------------------------------------------------------------- latency
# qb_bench_latency_build: $WORK/latency, from bench/latency.c
qb_bench_latency_build() {
	cc -std=gnu11 -O2 -Wall -Wextra -o "$WORK/latency" "$ROOT/bench/latency.c" \
		-I"$(pg_config --includedir)" -I/usr/include/postgresql -L"$(pg_config --libdir)" -lpq
}

# qb_bench_latency PRE DB SINK_LOG [COUNT [RATE]]: one run of $WORK/latency
# (COUNT single-row transactions at RATE/s, default LAT_COUNT / LAT_RATE,
# topic latency.event) into DB, joined by seq with the lines a qb_sink
# --log wrote to SINK_LOG since; latency = the sink's t_us (body received)
# - the time just before COMMIT.  Sets R[PRE_n, _sent, _p50, _p99, _max,
# _commit, _a50, _a99] (ms; _commit: the COMMIT round trip alone, p50;
# _a50 and _a99: from COMMIT's return to the sink, one clock, as an
# application that commits then waits would see it).
qb_bench_latency() {
	local pre=$1 db=$2 slog=$3 count=${4:-$LAT_COUNT} rate=${5:-$LAT_RATE} lines0 i
	lines0=$(wc -l <"$slog")
	"$WORK/latency" "$CONN_BASE dbname=$db" "$count" "$rate" latency.event >"$WORK/latency-$pre.out" \
		|| die "the latency client failed"
	# wait (bounded: 30 s, longer than any idle poll) for every row to reach the sink
	for i in $(seq 1 300); do
		(( $(wc -l <"$slog") - lines0 >= count )) && break
		sleep 0.1
	done
	R[${pre}_summary]=$(python3 - "$WORK/latency-$pre.out" "$slog" "$lines0" <<-'EOF'
	import json, sys
	sent = {}
	commit = []
	after = {}
	for line in open(sys.argv[1]):
	    seq, t, c = line.split()
	    sent[int(seq)] = int(t)
	    after[int(seq)] = int(t) + int(c)
	    commit.append(int(c) / 1000.0)
	first = {}
	with open(sys.argv[2]) as f:
	    for i, line in enumerate(f):
	        if i < int(sys.argv[3]):
	            continue
	        d = json.loads(line)
	        if not 200 <= d["status"] < 300:
	            continue
	        try:
	            b = json.loads(d["body"])
	        except ValueError:
	            continue
	        seq = b.get("seq")
	        if seq is None and isinstance(b.get("payload"), dict):
	            seq = b["payload"].get("seq")
	        if isinstance(seq, int) and seq in sent and seq not in first:
	            first[seq] = d["t_us"]
	lat = sorted((first[s] - sent[s]) / 1000.0 for s in first)
	aft = sorted((first[s] - after[s]) / 1000.0 for s in first)
	def pct(v, p):
	    return v[min(len(v) - 1, int(round(p / 100.0 * (len(v) - 1))))]
	commit.sort()
	c50 = commit[len(commit) // 2] if commit else float("nan")
	if lat:
	    print(f"{len(lat)} {len(sent)} {pct(lat, 50):.2f} {pct(lat, 99):.2f} {lat[-1]:.2f} {c50:.2f} {pct(aft, 50):.2f} {pct(aft, 99):.2f}")
	else:
	    print(f"0 {len(sent)} n/a n/a n/a n/a n/a n/a")
	EOF
	)
	read -r "R[${pre}_n]" "R[${pre}_sent]" "R[${pre}_p50]" "R[${pre}_p99]" "R[${pre}_max]" "R[${pre}_commit]" \
		"R[${pre}_a50]" "R[${pre}_a99]" <<<"${R[${pre}_summary]}"
	log "latency ($pre): ${R[${pre}_n]}/${R[${pre}_sent]} delivered; p50 ${R[${pre}_p50]} ms, p99 ${R[${pre}_p99]} ms, max ${R[${pre}_max]} ms; COMMIT round trip p50 ${R[${pre}_commit]} ms; from COMMIT's return p50 ${R[${pre}_a50]} ms, p99 ${R[${pre}_a99]} ms"
}

# cpu_ms PID...: the CPU time (user + system, ms) the processes have used
# so far; a process that is gone counts 0
cpu_ms() {
	local t=0 p f
	for p in "$@"; do
		# fields 14 and 15 of /proc/PID/stat, after the ")" that ends the name
		f=$(sed 's/.*) //' "/proc/$p/stat" 2>/dev/null) || continue
		read -ra f <<<"$f"
		t=$(( t + f[11] + f[12] ))
	done
	echo $(( t * 1000 / $(getconf CLK_TCK) ))
}

# machine_cpu: the machine's CPU time since boot, in ms: "busy idle" (busy:
# user, nice, system, irq, softirq and steal of every CPU; idle: idle and
# iowait), for a share or a cost per row over a span of a run
machine_cpu() {
	local c
	read -ra c < <(head -1 /proc/stat)
	echo $(( (c[1] + c[2] + c[3] + c[6] + c[7] + c[8]) * 1000 / $(getconf CLK_TCK) )) \
		$(( (c[4] + c[5]) * 1000 / $(getconf CLK_TCK) ))
}

# ---------------------------------------------------------------- statements
# QB_BENCH_STATEMENTS=1: pg_stat_statements with track = all (the extension's
# workers run their statements inside them).  qb_bench_statements_conf, called
# before the cluster starts, adds its lines to QB_BENCH_PG_CONF; later lines
# of postgresql.conf win, so its preload line replaces the cluster's.
qb_bench_statements_conf() {
	[[ "${QB_BENCH_STATEMENTS:-0}" == 1 ]] || return 0
	QB_BENCH_PG_CONF="shared_preload_libraries = 'queuebox, pg_stat_statements'
pg_stat_statements.track = all
pg_stat_statements.max = 1000${QB_BENCH_PG_CONF:+
$QB_BENCH_PG_CONF}"
	export QB_BENCH_PG_CONF
}

# qb_bench_statements_reset DB: counts from now (every database's)
qb_bench_statements_reset() {
	q "$1" "CREATE EXTENSION IF NOT EXISTS pg_stat_statements" >/dev/null
	q "$1" "SELECT pg_stat_statements_reset()" >/dev/null
}

# QB_BENCH_POLL_LIKE: qb_bench_wait_drained's poll, which the report leaves out
QB_BENCH_POLL_LIKE="query LIKE 'SELECT EXISTS (SELECT % FROM queuebox.outbox WHERE state %'"

# qb_bench_statements DB ROWS: the 6 costliest statements of DB since the
# reset, per row delivered: time, shared blocks (read from the kernel, and
# the time reading them with track_io_timing), blocks dirtied and written
# (and the time writing), WAL bytes.  Both hosts' promotion, settle and
# claim are named; any other statement by the start of its text.
qb_bench_statements() {
	q "$1" "
		SELECT string_agg(format('%s: %s calls, %s rows, %s µs, %s blocks (%s read, %s µs reading; %s dirtied, %s written, %s µs writing), %s WAL bytes',
		                         what, calls, rows, us, blks, rd, rd_us, dirt, wr, wr_us, wal), '; ' ORDER BY us DESC)
		FROM (SELECT CASE WHEN query LIKE 'UPDATE queuebox.outbox o SET state = CASE WHEN \$2::uuid%' THEN 'promote'
		                  WHEN query LIKE '%s(token, id, outcome%' THEN 'settle'
		                  WHEN query LIKE 'WITH c_dest AS%' THEN 'claim'
		                  ELSE left(regexp_replace(query, '\s+', ' ', 'g'), 40) END AS what,
		             calls, rows,
		             round((total_exec_time * 1000 / $2)::numeric, 1) AS us,
		             round(((shared_blks_hit + shared_blks_read) / $2::numeric), 1) AS blks,
		             round((shared_blks_read / $2::numeric), 2) AS rd,
		             round((blk_read_time * 1000 / $2)::numeric, 1) AS rd_us,
		             round((shared_blks_dirtied / $2::numeric), 2) AS dirt,
		             round((shared_blks_written / $2::numeric), 2) AS wr,
		             round((blk_write_time * 1000 / $2)::numeric, 1) AS wr_us,
		             round(wal_bytes / $2, 0) AS wal
		      FROM pg_stat_statements
		      WHERE dbid = (SELECT oid FROM pg_database WHERE datname = '$1')
		        AND NOT $QB_BENCH_POLL_LIKE
		        AND query NOT LIKE '%pg_stat_statements%'
		      ORDER BY total_exec_time DESC LIMIT 6) s"
}

# ---------------------------------------------------------------- the workers
role_count() { q bench "SELECT count(*) FROM pg_stat_activity WHERE backend_type LIKE 'queuebox $1%'"; }
set_guc() { # set_guc NAME VALUE: ALTER SYSTEM + reload, returns at once
	q postgres "ALTER SYSTEM SET queuebox.$1 = $2"
	q postgres "SELECT pg_reload_conf()" >/dev/null
}
wait_role() { # wait_role ROLE K: until K workers of the role (outbox, consumer) run
	for _ in $(seq 1 300); do [[ "$(role_count "$1")" == "$2" ]] && return 0; sleep 0.1; done
	die "expected $2 $1 workers, pg_stat_activity shows $(role_count "$1")"
}
# stop_line ROLE FROM_LINE: the stop lines the role's workers logged since
stop_line() {
	tail -n +$(( $2 + 1 )) "$WORK/pg.log" | grep -A1 "queuebox $1 [0-9]* stopped" \
		| sed -n "s/.*LOG: *queuebox $1 \([0-9]*\) stopped: \(.*\)/worker \1: \2/p; s/.*DETAIL: *\(.*\)/  \1/p" | paste -sd' ' - || true
}

# qb_bench_machine: the "Machine:" line of a RESULTS.md section
qb_bench_machine() {
	echo "Machine: $(nproc) cores, $(( $(awk '/^MemTotal:/ {print $2}' /proc/meminfo) / 1024 / 1024 )) GiB RAM, $(. /etc/os-release 2>/dev/null; echo "${PRETTY_NAME:-linux}"), kernel $(uname -r)."
}
