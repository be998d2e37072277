#!/usr/bin/env bash
# bench/claims-table/run.sh: what another layout of the queue state (a narrow
# claims table, or a claim that updates no indexed column) would save the
# delivery path, priced before it is built (issue 37, targets 2 and 4).
#
#   bench/claims-table/run.sh [--record] [ROWS...]     (default 100000 10000000)
#
# Run from the repository root after `make && make install`, as root or as a
# user who can run initdb.  One temporary cluster (bench/lib.sh's,
# shared_buffers $QB_BENCH_SHARED_BUFFERS, 4GB; pg_stat_statements loaded).
# No QueueBox worker runs: pgbench runs the hot cycle of a backlog's drain
# (bench/outbox-http phase B: each key's next row is claimed by the
# promotion that follows its predecessor's settle), on copies of
# queuebox.outbox with the same columns, fillfactor, autovacuum settings and
# indexes, each in its own schema (one table per layout):
#   today    the row's life as it is: the promotion UPDATEs the parked row
#            to processing (token, lease, claimer), the settle UPDATEs it to
#            sent (each row found by its id, the settle's shape since 2026-12-07);
#            both versions are non-HOT (state and hold are in the
#            partial indexes' predicates).
#   narrow   the queue state in a table of its own, narrow.claims (id
#            primary key, token, lease_until indexed, claimer): the
#            promotion INSERTs the claim (ON CONFLICT DO NOTHING: the claims
#            key is the fence) and reads the row's content by id; the
#            settle DELETEs the claim by id and token and UPDATEs the row to
#            sent.  The outbox row is written once after its insert.  No
#            outbox_lease_idx (the lease is in claims).
#   hot      the claim an update of the row that changes no indexed column
#            (state, token, lease and claimer; an own column, open, takes
#            state's place in every index), so it can be HOT when the page
#            has room, and a row of hot.claims (id, lease_until indexed,
#            claimer) for the reclaim; the settle deletes the claim.
# QB_BENCH_LAYOUTS picks them (default all three); QB_BENCH_FILLFACTOR sets
# the tables' fillfactor (80, queuebox.outbox's).
# Each table gets ROWS rows over $QB_BENCH_KEYS (10,000) keys, all routed to
# one destination, with bench/lib.sh's ~300-byte payload: each key's first
# row in flight, the others parked behind it (hold 'key'), as the insert
# trigger leaves a bulk load; then the indexes, VACUUM ANALYZE, CHECKPOINT.
# The keys are cut into slots of $QB_BENCH_BATCH (100); a slot's rows in
# flight (ids, keys, token) are kept in a one-row-per-slot table.  One
# pgbench transaction is one cycle of one slot: the settle of its rows in
# flight (fenced by the token), then the promotion of its keys' next rows
# (returning their content, as the workers read it), which become the
# slot's rows in flight.  2 clients (the two workers), each on its own half
# of the slots in turn, -M prepared.  Per size, the runs alternate
# the layouts (QB_BENCH_ROUNDS rounds, 2): at 10^5 each run
# drains a freshly loaded table; above, each run is $QB_BENCH_CYCLES (5,000)
# cycles a client, and the tables are loaded once.
#
# Reported per run: rows/s (rows settled / elapsed), and per row from
# pg_stat_statements (reset before the run): the settle's and the
# promotion's time, shared blocks (hit + read), blocks dirtied and WAL bytes.
# The figure that matters is each layout's rows/s at ROWS against its own
# rows/s at the smallest size (target 4 asks 0.9 at 10^7), and each / today
# at each size.  What it does not price: the claim from intake, retries, the
# sweep and the reclaim reading claims, the console's join.
set -euo pipefail

RECORD=${QB_BENCH_RECORD:-0}
if [[ "${1:-}" == "--record" ]]; then RECORD=1; shift; fi
SIZES=("$@"); (( ${#SIZES[@]} )) || SIZES=(100000 10000000)
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PGBIN=${PGBIN:-$("${PG_CONFIG:-pg_config}" --bindir)}
KEYS=${QB_BENCH_KEYS:-10000}
BATCH=${QB_BENCH_BATCH:-100}
ROUNDS=${QB_BENCH_ROUNDS:-2}
CYCLES=${QB_BENCH_CYCLES:-5000}
SB=${QB_BENCH_SHARED_BUFFERS:-4GB}
LAYOUTS=${QB_BENCH_LAYOUTS:-today narrow hot}
FILLFACTOR=${QB_BENCH_FILLFACTOR:-80}	# queuebox.outbox's
SLOTS=$(( KEYS / BATCH ))
(( KEYS % BATCH == 0 && SLOTS % 2 == 0 )) || { echo "QB_BENCH_KEYS must be an even multiple of QB_BENCH_BATCH" >&2; exit 2; }

# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"
qb_bench_prereqs
PGBENCH=$PGBIN/pgbench; [[ -x "$PGBENCH" ]] || PGBENCH=$(command -v pgbench) || die "pgbench not found"
qb_bench_workdir claims-table
QB_BENCH_PG_CONF="shared_preload_libraries = 'queuebox, pg_stat_statements'
maintenance_work_mem = 1GB${QB_BENCH_PG_CONF:+
$QB_BENCH_PG_CONF}" qb_bench_cluster claims-table 20 off 0
q postgres "CREATE DATABASE bench"
q bench "CREATE EXTENSION queuebox"
q bench "CREATE EXTENSION pg_stat_statements"
BUSY=$(busy_note)
declare -A R

# the open test of the workers' statements (QB_PG_OUTBOX_OPEN); hot's is
# its own column
OPEN="(e.state IN ('pending', 'processing') OR e.hold = 'dead')"
open_of() { if [[ $1 == hot ]]; then echo "e.open"; else echo "$OPEN"; fi; }
# the key's first open row, as the promotion finds it (QB_PG_OUTBOX_PROMOTE:
# at the ended row's destination, or not routed yet)
first_open() { # first_open SCHEMA
	local open; open=$(open_of "$1")
	cat <<EOF
SELECT f.id FROM unnest(:keys::text[]) AS k(key)
  CROSS JOIN LATERAL (
    SELECT x.id FROM (
      (SELECT e.id, coalesce(e.origin, e.id) AS pos FROM $1.outbox e
       WHERE e.key = k.key AND coalesce(e.destination, '') = 'd' AND $open
       ORDER BY coalesce(e.origin, e.id) LIMIT 1)
      UNION ALL
      (SELECT e.id, coalesce(e.origin, e.id) FROM $1.outbox e
       WHERE e.key = k.key AND coalesce(e.destination, '') = '' AND $open
       ORDER BY coalesce(e.origin, e.id) LIMIT 1)) x
    ORDER BY x.pos LIMIT 1) f
EOF
}

# scripts SCHEMA: $WORK/cycle-SCHEMA.sql, one cycle of one slot.  Each
# statement is one line: pgbench reads a script's SQL up to a semicolon.
write_scripts() {
	local head settle promote
	head='\set n :n + 1
\set slot (2 * :n + :client_id) % '"$SLOTS"'
BEGIN;'
	head+=$'\n'"SELECT coalesce(ids, '{}')::text AS ids, coalesce(keys, '{}')::text AS keys, coalesce(tok::text, gen_random_uuid()::text) AS tok FROM SCHEMA.cyc WHERE slot = :slot \gset"
	# today: the settle and the promotion as the workers run them, reduced
	# to a sent row of a routed key (the settle's shape as of 2026-12-07: by
	# id from the array's row; before, "o.id = ANY (ids)" too, which the
	# planner read by the array and matched quadratically)
	settle="UPDATE today.outbox o SET state = 'sent', attempt = o.attempt + 1, hold = NULL, claim_token = NULL, lease_until = NULL, claimer = NULL FROM unnest(:ids::bigint[]) AS s(id) WHERE o.id = s.id AND o.claim_token = :tok::uuid RETURNING o.key, o.state;"
	promote="WITH t AS (SELECT gen_random_uuid() AS tok), p AS (UPDATE today.outbox o SET state = 'processing', hold = NULL, claim_token = t.tok, lease_until = now() + interval '300 s', claimer = :client_id + 1 FROM t WHERE o.id = ANY (ARRAY($(first_open today | tr '\n' ' '))) AND o.state = 'pending' AND coalesce(o.hold, '') = 'key' RETURNING o.id, o.message_id, o.topic, o.key, o.payload::text AS payload, o.headers::text AS headers, o.attempt, o.created_at, t.tok), u AS (UPDATE today.cyc c SET ids = ARRAY(SELECT id FROM p), keys = ARRAY(SELECT key FROM p), tok = (SELECT tok FROM p LIMIT 1) WHERE c.slot = :slot) SELECT id, message_id, topic, key, payload, headers, attempt, created_at FROM p;"
	printf '%s\n%s\n%s\nCOMMIT;\n' "${head//SCHEMA/today}" "$settle" "$promote" >"$WORK/cycle-today.sql"
	# narrow: the claim is a row of narrow.claims
	settle="WITH d AS (DELETE FROM narrow.claims c WHERE c.id = ANY (:ids::bigint[]) AND c.token = :tok::uuid RETURNING c.id) UPDATE narrow.outbox o SET state = 'sent', attempt = o.attempt + 1, hold = NULL WHERE o.id = ANY (ARRAY(SELECT id FROM d)) RETURNING o.key, o.state;"
	promote="WITH t AS (SELECT gen_random_uuid() AS tok), c AS (INSERT INTO narrow.claims (id, token, lease_until, claimer) SELECT o.id, t.tok, now() + interval '300 s', :client_id + 1 FROM narrow.outbox o, t WHERE o.id = ANY (ARRAY($(first_open narrow | tr '\n' ' '))) AND o.state = 'pending' AND coalesce(o.hold, '') = 'key' ON CONFLICT (id) DO NOTHING RETURNING id, token), p AS (SELECT o.id, o.message_id, o.topic, o.key, o.payload::text AS payload, o.headers::text AS headers, o.attempt, o.created_at FROM narrow.outbox o WHERE o.id = ANY (ARRAY(SELECT id FROM c))), u AS (UPDATE narrow.cyc y SET ids = ARRAY(SELECT id FROM p), keys = ARRAY(SELECT key FROM p), tok = (SELECT token FROM c LIMIT 1) WHERE y.slot = :slot) SELECT * FROM p;"
	printf '%s\n%s\n%s\nCOMMIT;\n' "${head//SCHEMA/narrow}" "$settle" "$promote" >"$WORK/cycle-narrow.sql"
	# hot: the claim is a HOT update of the row (state, token, lease and
	# claimer are in no index) and a row of hot.claims (the reclaim's index)
	settle="WITH u AS (UPDATE hot.outbox o SET state = 'sent', attempt = o.attempt + 1, hold = NULL, open = NULL, claim_token = NULL, lease_until = NULL, claimer = NULL FROM unnest(:ids::bigint[]) AS s(id) WHERE o.id = s.id AND o.claim_token = :tok::uuid RETURNING o.id, o.key, o.state), d AS (DELETE FROM hot.claims c WHERE c.id = ANY (ARRAY(SELECT id FROM u))) SELECT key, state FROM u;"
	promote="WITH t AS (SELECT gen_random_uuid() AS tok), p AS (UPDATE hot.outbox o SET state = 'processing', claim_token = t.tok, lease_until = now() + interval '300 s', claimer = :client_id + 1 FROM t WHERE o.id = ANY (ARRAY($(first_open hot | tr '\n' ' '))) AND o.state = 'pending' AND coalesce(o.hold, '') = 'key' RETURNING o.id, o.message_id, o.topic, o.key, o.payload::text AS payload, o.headers::text AS headers, o.attempt, o.created_at, o.lease_until, o.claimer, t.tok), c AS (INSERT INTO hot.claims (id, lease_until, claimer) SELECT id, lease_until, claimer FROM p), u AS (UPDATE hot.cyc y SET ids = ARRAY(SELECT id FROM p), keys = ARRAY(SELECT key FROM p), tok = (SELECT tok FROM p LIMIT 1) WHERE y.slot = :slot) SELECT id, message_id, topic, key, payload, headers, attempt, created_at FROM p;"
	printf '%s\n%s\n%s\nCOMMIT;\n' "${head//SCHEMA/hot}" "$settle" "$promote" >"$WORK/cycle-hot.sql"
	chmod 644 "$WORK"/cycle-*.sql
}

# load SCHEMA ROWS: the schema's outbox (and claims) dropped and made again,
# ROWS rows loaded, then the indexes of queuebox.outbox, VACUUM ANALYZE
load() {
	local s=$1 n=$2 ddl
	q bench "DROP SCHEMA IF EXISTS $s CASCADE"
	q bench "CREATE SCHEMA $s"
	q bench "CREATE TABLE $s.outbox (LIKE queuebox.outbox INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING IDENTITY)
	         WITH (fillfactor = $FILLFACTOR, autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 1000,
	               autovacuum_vacuum_insert_scale_factor = 0.05, autovacuum_analyze_scale_factor = 0.02,
	               vacuum_truncate = false)"
	q bench "CREATE TABLE $s.cyc (slot int PRIMARY KEY, ids bigint[], keys text[], tok uuid)"
	if [[ $s == narrow ]]; then
		q bench "CREATE TABLE narrow.claims (id bigint PRIMARY KEY, token uuid NOT NULL,
		         lease_until timestamptz NOT NULL, claimer bigint)"
		q bench "CREATE INDEX claims_lease_idx ON narrow.claims (lease_until)"
	elif [[ $s == hot ]]; then
		q bench "ALTER TABLE hot.outbox ADD COLUMN open boolean DEFAULT true"
		q bench "CREATE TABLE hot.claims (id bigint PRIMARY KEY, lease_until timestamptz NOT NULL, claimer bigint)"
		q bench "CREATE INDEX claims_lease_idx ON hot.claims (lease_until)"
	fi
	# row g: key k(g % KEYS); the first KEYS rows are the keys' heads, in
	# flight (today: processing with slot's token; narrow: a claims row)
	q bench "INSERT INTO $s.outbox (id, topic, key, payload, headers, destination, hold, state, claim_token, lease_until, claimer)
	         OVERRIDING SYSTEM VALUE
	         SELECT g, 'bench.key', 'k' || (g % $KEYS), $PAYLOAD_SQL, $HEADERS_SQL, 'd',
	                CASE WHEN g > $KEYS THEN 'key' END,
	                CASE WHEN g <= $KEYS AND '$s' <> 'narrow' THEN 'processing' ELSE 'pending' END,
	                CASE WHEN g <= $KEYS AND '$s' <> 'narrow' THEN md5('slot' || ((g - 1) / $BATCH))::uuid END,
	                CASE WHEN g <= $KEYS AND '$s' <> 'narrow' THEN now() + interval '1 day' END,
	                CASE WHEN g <= $KEYS AND '$s' <> 'narrow' THEN 1 END
	         FROM generate_series(1, $n) g"
	[[ $s == narrow ]] && q bench "INSERT INTO narrow.claims SELECT g, md5('slot' || ((g - 1) / $BATCH))::uuid, now() + interval '1 day', 1 FROM generate_series(1, $KEYS) g"
	[[ $s == hot ]] && q bench "INSERT INTO hot.claims SELECT g, now() + interval '1 day', 1 FROM generate_series(1, $KEYS) g"
	q bench "INSERT INTO $s.cyc SELECT sl, array_agg(g ORDER BY g), array_agg('k' || (g % $KEYS) ORDER BY g), md5('slot' || sl)::uuid
	         FROM generate_series(1, $KEYS) g, LATERAL (SELECT (g - 1) / $BATCH AS sl) x GROUP BY sl"
	# hot: state leaves every index (open stands for it), else no update is HOT
	ddl=$(q bench "SELECT string_agg(CASE WHEN '$s' <> 'hot' THEN d ELSE
	                 replace(replace(replace(d, '(((state)::text = ANY ((ARRAY[''pending''::character varying, ''processing''::character varying])::text[])) OR ((hold)::text = ''dead''::text))', 'open'),
	                   '((state)::text = ''pending''::text)', 'open'), '((state)::text = ''dead''::text)', '(NOT open OR hold = ''dead'')') END || ';', E'\n')
	               FROM (SELECT replace(indexdef, ' ON queuebox.outbox ', ' ON $s.outbox ') AS d, indexname
	                     FROM pg_indexes WHERE schemaname = 'queuebox' AND tablename = 'outbox') x
	               WHERE NOT ('$s' <> 'today' AND indexname = 'outbox_lease_idx')")
	[[ $s != hot || $ddl != *state* ]] || die "hot: an index still names state: $ddl"
	"$PSQL" "$CONN_BASE dbname=bench" -X -q -v ON_ERROR_STOP=1 -c "$ddl" >/dev/null
	q bench "VACUUM ANALYZE $s.outbox"
	q bench "VACUUM ANALYZE $s.cyc"
	[[ $s == narrow ]] && q bench "VACUUM ANALYZE narrow.claims"
	return 0
}

# run PRE SCHEMA CYCLES: pgbench of the schema's cycle; sets R[PRE_*]
run() {
	local pre=$1 s=$2 cyc=$3 tps txns upd0 upd1
	q postgres "CHECKPOINT"
	q bench "SELECT pg_stat_statements_reset()" >/dev/null
	upd0=$(q bench "SELECT n_tup_upd || ' ' || n_tup_hot_upd FROM pg_stat_user_tables WHERE relid = '$s.outbox'::regclass")
	"$PGBENCH" -h 127.0.0.1 -p "$PGPORT" -U postgres -n -M prepared -c 2 -j 2 -t "$cyc" -D n=0 \
		-f "$WORK/cycle-$s.sql" bench >"$WORK/pgbench-$pre.out" 2>&1 \
		|| { cat "$WORK/pgbench-$pre.out" >&2; die "pgbench failed ($pre)"; }
	tps=$(pgbench_tps "$WORK/pgbench-$pre.out")
	sleep 1	# the statistics of the run's last transactions reach the collector
	upd1=$(q bench "SELECT n_tup_upd || ' ' || n_tup_hot_upd FROM pg_stat_user_tables WHERE relid = '$s.outbox'::regclass")
	R[${pre}_hot]=$(python3 -c "a=list(map(int,'$upd0'.split())); b=list(map(int,'$upd1'.split())); u=b[0]-a[0]; print('%d of %d updates HOT' % (b[1]-a[1], u))")
	txns=$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' "$WORK/pgbench-$pre.out")
	R[${pre}_rows]=$(q bench "SELECT sum(rows) FROM pg_stat_statements WHERE $SETTLE_Q")
	R[${pre}_rows_s]=$(python3 -c "print(round(${R[${pre}_rows]} * $tps / $txns))")
	# per row settled: the settle (the statement starting with WITH d / UPDATE
	# s.outbox o SET state = 'sent') and the promotion (WITH t AS)
	R[${pre}_stmts]=$(q bench "SELECT string_agg(w || ' ' || round((total_exec_time * 1000 / ${R[${pre}_rows]})::numeric, 1) || ' us, '
	      || round((shared_blks_hit + shared_blks_read)::numeric / ${R[${pre}_rows]}, 1) || ' blocks (' || round(shared_blks_read::numeric / ${R[${pre}_rows]}, 1) || ' read), '
	      || round(shared_blks_dirtied::numeric / ${R[${pre}_rows]}, 2) || ' dirtied, '
	      || round(wal_bytes / ${R[${pre}_rows]}) || ' WAL B', '; ' ORDER BY w)
	    FROM (SELECT CASE WHEN query LIKE 'WITH t AS%' THEN 'promotion' ELSE 'settle' END AS w, *
	          FROM pg_stat_statements WHERE query LIKE 'WITH t AS%' OR $SETTLE_Q) x")
	R[${pre}_stmts]+="; ${R[${pre}_hot]}"
	log "$pre: ${R[${pre}_rows]} rows at ${R[${pre}_rows_s]} rows/s; per row: ${R[${pre}_stmts]}"
}

# the settles, as pg_stat_statements keeps their text
SETTLE_Q="(query LIKE 'UPDATE today.outbox o SET state = %' OR query LIKE 'WITH d AS%' OR query LIKE 'WITH u AS%')"
write_scripts
HEADER="## $(date -u '+%Y-%m-%d %H:%M') UTC — bench/claims-table, keys=$KEYS, batch=$BATCH, commit $COMMIT"
LINES=("" "$(qb_bench_machine) shared_buffers $SB, fillfactor $FILLFACTOR. $BUSY" "" "| rows | round | layout | rows/s | per row settled |" "|---|---|---|---|---|")
for n in "${SIZES[@]}"; do
	per_key=$(( n / KEYS ))
	if (( per_key * SLOTS / 2 <= CYCLES )); then cyc=$(( per_key * SLOTS / 2 - SLOTS / 2 )); drain=1
	else cyc=$CYCLES; drain=0; fi
	if (( ! drain )); then
		for s in $LAYOUTS; do log "loading $n rows into $s"; load "$s" "$n"; done
	fi
	for r in $(seq 1 "$ROUNDS"); do
		for s in $LAYOUTS; do
			(( drain )) && { load "$s" "$n"; }
			run "${s}_${n}_$r" "$s" "$cyc"
			LINES+=("| $n | $r | $s | ${R[${s}_${n}_${r}_rows_s]} | ${R[${s}_${n}_${r}_stmts]} |")
		done
	done
done
{ echo "$HEADER"; printf '%s\n' "${LINES[@]}"; } | tee "$WORK/results.md"
if (( RECORD )); then
	{ echo; echo "$HEADER"; printf '%s\n' "${LINES[@]}"; } >>"$ROOT/bench/RESULTS.md"
fi
