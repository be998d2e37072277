#!/usr/bin/env bash
# bench/chaos/run.sh: chaos with a checker (issue 38) for SECONDS (default
# 600), every fault type, then bench/chaos/check.pl's report.
#
#   bench/chaos/run.sh [--record] [SECONDS]
#
# It runs TAP 061 (test/t/faults/061_chaos.pl, the suite's 2-minute mode)
# through `make installcheck`, for SECONDS instead of 120, and keeps its
# history (the writers' logs, the receivers' records, the faults, the
# business rows read after the run) and the checker's report in a
# /tmp/qb-bench-chaos.XXXXXX directory.  See bench/chaos/README.md for what
# runs and what the checker asserts.
#
# Run from the repository root after `make && make install` (as root, or as
# a user who can run initdb).  As root, the test runs as postgres, which
# must own the tree (chown -R postgres .), as for `make installcheck`.  The
# installed extension is shared: hold /tmp/qb-install.lock around it
# (flock /tmp/qb-install.lock bench/chaos/run.sh) when others use it.
#
# Environment knobs (the test's): QB_CHAOS_WRITERS (2, into the extension's
# cluster), QB_CHAOS_DAEMON_WRITERS (1, into the daemon's), QB_CHAOS_TX_RATE
# (10 transactions a second per writer), QB_CHAOS_ROWS (8 rows each),
# QB_CHAOS_KEYS (200 keys per cluster).  QB_BENCH_RECORD=1 is --record.
set -euo pipefail

RECORD=${QB_BENCH_RECORD:-0}
if [[ "${1:-}" == "--record" ]]; then RECORD=1; shift; fi
SECS=${1:-600}
[[ "$SECS" =~ ^[0-9]+$ && "$SECS" -ge 30 && $# -le 1 ]] || { echo "usage: bench/chaos/run.sh [--record] [SECONDS >= 30]" >&2; exit 2; }
CMDLINE="bench/chaos/run.sh"; [[ "$RECORD" == 1 ]] && CMDLINE+=" --record"; CMDLINE+=" $SECS"

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
PGBIN=${PGBIN:-$("${PG_CONFIG:-pg_config}" --bindir)}

# the tree is postgres's when run as root: git would call it dubious
if [[ -z "${QB_BENCH_COMMIT:-}" ]]; then
	QB_BENCH_COMMIT=$(git -c safe.directory="$ROOT" -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo "no commit")
	[[ -z "$(git -c safe.directory="$ROOT" -C "$ROOT" status --porcelain -- src sql test bench/chaos 2>/dev/null)" ]] ||
		QB_BENCH_COMMIT+=" (uncommitted changes in src/, sql/, test/ or bench/chaos/)"
fi
# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"
qb_bench_prereqs
cd "$ROOT"
make -s -j2 all sink >/dev/null

OUT=$(mktemp -d /tmp/qb-bench-chaos.XXXXXX)
chmod 755 "$OUT"
if [[ $(id -u) -eq 0 ]]; then
	chown postgres: "$OUT"
	as_pg() { runuser -u postgres -- "$@"; }
else
	as_pg() { "$@"; }
fi

log "chaos for $SECS s (TAP 061), history in $OUT"
rc=0
QB_CHAOS_SECONDS=$SECS QB_CHAOS_OUT=$OUT \
	as_pg make -s installcheck REGRESS= ISOLATION= PROVE_TESTS=test/t/faults/061_chaos.pl PROVE_FLAGS=--timer || rc=$?
[[ -s "$OUT/report.txt" ]] || die "no report in $OUT (the run failed before the checker: see tmp_check/log/regress_log_061_chaos)"
cat "$OUT/report.txt"
META=$(perl -MJSON::PP -e 'local $/; open(my $f, "<", $ARGV[0]) or die; my $m = decode_json(<$f>);
	print "$m->{writers} writers into the extension\x27s cluster and $m->{daemon_writers} into the daemon\x27s, 1 to NATS, 1 to RabbitMQ, 1 webhook sender, "
	  . "$m->{tx_rate} transactions a second each of $m->{rows_per_tx} rows, $m->{keys} keys per cluster; "
	  . "timeoutMs $m->{timeout_ms}, claimTimeoutMs $m->{claim_timeout_ms}"' "$OUT/meta.json")

if [[ "$RECORD" == 1 ]]; then
	{
		echo
		echo "## $(date -u '+%Y-%m-%d %H:%M UTC') — bench/chaos, $SECS s, commit $COMMIT${R_SANITIZED:+ ($R_SANITIZED)}"
		echo
		echo "Command: \`$CMDLINE\` (as root: \`chown -R postgres . && flock /tmp/qb-install.lock bench/chaos/run.sh --record $SECS\`)."
		qb_bench_machine
		echo "PostgreSQL $("$PGBIN/postgres" --version | awk '{print $3}'), the test's clusters (fsync off, as every TAP test). $META. Faults one at a time, 2 to 5 s apart once deliveries resumed; each lasting one 3 to 6 s (bench/chaos/README.md). The checker's report:"
		echo
		echo '```'
		cat "$OUT/report.txt"
		echo '```'
	} >>"$ROOT/bench/RESULTS.md"
	log "appended to bench/RESULTS.md"
fi
log "history and report kept in $OUT"
exit "$rc"
