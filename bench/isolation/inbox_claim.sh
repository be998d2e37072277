#!/usr/bin/env bash
# bench/isolation/inbox_claim.sh: the time of one inbox claim of 100 rows
# with N rows that cannot be claimed now, against its time with none
# (docs/design/claim.md, "The inbox: pull and relay").  Target: ratio <= 2.
#
#   bench/isolation/inbox_claim.sh [N_BLOCKED]       (default 1000000)
#
# Run from anywhere after `make && make install` (as root, or as a user who
# can run initdb); PGBIN (default: PG_CONFIG's --bindir) picks the binaries (pg_config, psql,
# pgbench are taken from there).  Prints the figures; records nothing.
#
# One temporary cluster, queuebox preloaded, no outbox worker, no relay
# worker.  Two claims, each measured twice:
#   pull   SELECT count(*) FROM queuebox.inbox_claim('orders', 100, 60000)
#   relay  SELECT count(*) FROM queuebox._relay_claim(100, 60000, gen_random_uuid())
# each as BEGIN; claim; ROLLBACK by pgbench -n -T $QB_BENCH_SECONDS (10) -c 1,
# so every run claims the same 100 rows:
#   none     TRUNCATE; 100,000 claimable rows (one aggregate each, due now);
#   blocked  TRUNCATE; 1,000 failing aggregates: a head retried with
#            scheduled_at a day ahead (attempt 1) and N/1000 rows behind
#            each, all created before the claimable rows; a warm-up of
#            committed claims (batch 10,000) until a claim finds nothing,
#            which parks the rows behind the heads; then the same 100,000
#            claimable rows.
# VACUUM ANALYZE, then an unmeasured pgbench run of the same script
# (QB_BENCH_SECONDS / 2) and a VACUUM, then the measured run: a table fresh
# from its INSERT makes the first seconds of rolled-back claims several
# times slower (seen at ~30-45 ms instead of ~3-5 ms), whatever is blocked,
# so both cases start from the same settled table.  ratio = latency blocked
# / none.
set -euo pipefail
N=${1:-1000000}
[[ "$N" =~ ^[0-9]+$ && "$N" -ge 1000 ]] || { echo "usage: bench/isolation/inbox_claim.sh [N_BLOCKED >= 1000]" >&2; exit 2; }
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
PGBIN=${PGBIN:-$("${PG_CONFIG:-pg_config}" --bindir)}
export PATH="$PGBIN:$PATH"
SECONDS_RUN=${QB_BENCH_SECONDS:-10}
SB=${QB_BENCH_SHARED_BUFFERS:-1GB}
HEADS=1000
OK_ROWS=100000

# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"
qb_bench_prereqs
command -v "$PGBIN/pgbench" >/dev/null || die "no $PGBIN/pgbench"
qb_bench_workdir inbox-claim
qb_bench_cluster inbox-claim 20 off
q postgres "CREATE DATABASE bench"
q bench "CREATE EXTENSION queuebox"

# fill MODE CONSUMPTION: the rows of one measurement (source orders for pull,
# hooks for push)
fill() {
	local mode=$1 cons=$2 src
	if [[ $cons == pull ]]; then src=orders; else src=hooks; fi
	q bench "TRUNCATE queuebox.inbox RESTART IDENTITY"
	if [[ $mode == blocked ]]; then
		q bench "INSERT INTO queuebox.inbox (source, idempotency_key, aggregate_id, payload, consumption,
		           attempt, scheduled_at, created_at)
		         SELECT '$src', 'h' || g, 'bad-' || g, '{}', '$cons', 1, now() + interval '1 day',
		                now() - interval '2 days' + g * interval '1 ms'
		         FROM generate_series(1, $HEADS) g"
		q bench "INSERT INTO queuebox.inbox (source, idempotency_key, aggregate_id, payload, consumption, created_at)
		         SELECT '$src', 'b' || g, 'bad-' || (g % $HEADS + 1), '{}', '$cons',
		                now() - interval '1 day' + g * interval '1 ms'
		         FROM generate_series(1, $N) g"
		local t0 n=1 rounds=0
		t0=$(date +%s.%N)
		while (( n > 0 )); do
			if [[ $cons == pull ]]; then
				n=$(q bench "SELECT count(*) FROM queuebox.inbox_claim('orders', 10000, 60000)")
			else
				n=$(q bench "SELECT count(*) FROM queuebox._relay_claim(10000, 60000, gen_random_uuid())")
			fi
			# a claim returns only the rows it claimed: stop when nothing is left unparked
			n=$(q bench "SELECT count(*) FROM queuebox.inbox WHERE state = 'pending' AND hold IS NULL
			             AND scheduled_at <= now()")
			rounds=$((rounds + 1))
		done
		log "$cons warm-up: $rounds committed claims parked $(q bench "SELECT count(*) FROM queuebox.inbox WHERE hold = 'aggregate'") rows in $(fdiv "$(echo "$(date +%s.%N) - $t0" | bc)" 1 1) s"
	fi
	q bench "INSERT INTO queuebox.inbox (source, idempotency_key, aggregate_id, payload, consumption)
	         SELECT '$src', 'k' || g, 'ok-' || g, '{}', '$cons' FROM generate_series(1, $OK_ROWS) g"
	q bench "VACUUM ANALYZE queuebox.inbox"
}

# measure NAME SQL: pgbench latency average (ms) of BEGIN; SQL; ROLLBACK
measure() {
	local f=$WORK/$1.sql out lat
	printf 'BEGIN;\n%s;\nROLLBACK;\n' "$2" >"$f"
	chmod 644 "$f"
	"$PGBIN/pgbench" -n -T $(( (SECONDS_RUN + 1) / 2 )) -c 1 -f "$f" "$CONN_BASE dbname=bench" >/dev/null 2>&1 \
		|| die "the pgbench warm-up failed"
	q bench "VACUUM queuebox.inbox"
	out=$("$PGBIN/pgbench" -n -T "$SECONDS_RUN" -c 1 -f "$f" "$CONN_BASE dbname=bench" 2>&1) \
		|| { echo "$out" >&2; die "pgbench failed"; }
	lat=$(sed -n 's/^latency average = \([0-9.]*\) ms$/\1/p' <<<"$out")
	[[ -n "$lat" ]] || { echo "$out" >&2; die "no latency in the pgbench output"; }
	echo "$lat"
}

PULL_SQL="SELECT count(*) FROM queuebox.inbox_claim('orders', 100, 60000)"
RELAY_SQL="SELECT count(*) FROM queuebox._relay_claim(100, 60000, gen_random_uuid())"
busy_note
for cons in pull push; do
	if [[ $cons == pull ]]; then sql=$PULL_SQL; else sql=$RELAY_SQL; fi
	for mode in none blocked; do
		fill "$mode" "$cons"
		got=$(q bench "BEGIN; $sql; ROLLBACK")
		[[ "$got" == 100 ]] || die "$cons $mode: the claim returned $got rows, not 100"
		R[$cons.$mode]=$(measure "$cons-$mode" "$sql")
		log "$cons $mode: ${R[$cons.$mode]} ms per claim of 100"
	done
done

echo
echo "inbox claim of 100 rows, $N rows behind $HEADS failing aggregates vs none (commit $COMMIT, PostgreSQL $PGVERSION)"
printf '%-34s %10s %10s %7s\n' claim "none (ms)" "blocked" ratio
printf '%-34s %10s %10s %7s\n' "queuebox.inbox_claim (pull)" "${R[pull.none]}" "${R[pull.blocked]}" "$(fdiv "${R[pull.blocked]}" "${R[pull.none]}" 2)"
printf '%-34s %10s %10s %7s\n' "queuebox._relay_claim (relay)" "${R[push.none]}" "${R[push.blocked]}" "$(fdiv "${R[push.blocked]}" "${R[push.none]}" 2)"
echo "target: ratio <= 2"
