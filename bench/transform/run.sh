#!/usr/bin/env bash
# bench/transform/run.sh: what a jq transform costs per message.
#
#   bench/transform/run.sh [--record] [RUNS]       (default 20000)
#
# Needs no database: it builds bench/transform/transform_bench.c against
# src/common/runtime/qb_transform.c (cc, libjq) in a temp dir and runs, alternating,
# ROUNDS times each (the median is reported):
#   inproc   libjq in this process on its own compiled state: the floor,
#            a run with no isolation at all
#   helper   qb_transform_run on the kept helper process (what QueueBox pays
#            per message: a request and an answer over a socketpair)
#   fork16 / fork64   fork + _exit + waitpid of a process holding 16 / 64 MB
#            of touched heap: the least a fork per message costs (the design
#            before the kept helper; a worker's private heap is in that range)
# Ratios: inproc / helper (how close the isolated run is to the floor) and
# fork / helper (what the kept helper saves).
#
# Environment knobs: QB_BENCH_ROUNDS=5, QB_BENCH_RECORD=1 (same as --record:
# append a section to bench/RESULTS.md), QB_BENCH_KEEP=1 (keep the temp dir).
set -euo pipefail

RECORD=${QB_BENCH_RECORD:-0}
if [[ "${1:-}" == "--record" ]]; then RECORD=1; shift; fi
RUNS=${1:-20000}
[[ "$RUNS" =~ ^[0-9]+$ && "$RUNS" -ge 100 && $# -le 1 ]] || { echo "usage: bench/transform/run.sh [--record] [RUNS>=100]" >&2; exit 2; }
ROUNDS=${QB_BENCH_ROUNDS:-5}
CMDLINE="bench/transform/run.sh"; [[ "$RECORD" == 1 ]] && CMDLINE+=" --record"; CMDLINE+=" $RUNS"

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

COMMIT=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo "no commit")
[[ -z "$(git -C "$ROOT" status --porcelain -- src bench/transform 2>/dev/null)" ]] || COMMIT+=" (uncommitted changes)"
WORK=$(mktemp -d /tmp/qb-bench-transform.XXXXXX)
trap '[[ "${QB_BENCH_KEEP:-0}" == 1 ]] && echo "kept $WORK" >&2 || rm -rf "$WORK"' EXIT

cc -std=gnu11 -O2 -Wall -Werror -I"$ROOT/src/common/runtime" -o "$WORK/transform_bench" \
	"$HERE/transform_bench.c" "$ROOT/src/common/runtime/qb_transform.c" -ljq
log "built; $ROUNDS rounds of $RUNS runs (fork: $((RUNS / 10)) runs)"

declare -A T
for ((r = 1; r <= ROUNDS; r++)); do
	T[inproc]+=" $("$WORK/transform_bench" inproc "$RUNS" 0 | cut -d' ' -f2)"
	T[helper]+=" $("$WORK/transform_bench" helper "$RUNS" 0 | cut -d' ' -f2)"
	T[fork16]+=" $("$WORK/transform_bench" fork $((RUNS / 10)) 16 | cut -d' ' -f2)"
	T[fork64]+=" $("$WORK/transform_bench" fork $((RUNS / 10)) 64 | cut -d' ' -f2)"
	log "round $r (µs per run): inproc ${T[inproc]##* }, helper ${T[helper]##* }, fork16 ${T[fork16]##* }, fork64 ${T[fork64]##* }"
done

SUMMARY=$(python3 - "${T[inproc]}" "${T[helper]}" "${T[fork16]}" "${T[fork64]}" <<'PY'
import statistics, sys
names = ["inproc", "helper", "fork16", "fork64"]
med = {n: statistics.median(map(float, v.split())) for n, v in zip(names, sys.argv[1:])}
what = {
    "inproc": "libjq in process, no isolation (the floor)",
    "helper": "qb_transform_run on the kept helper (QueueBox)",
    "fork16": "fork+exit+wait, 16 MB heap (least cost of a fork per message)",
    "fork64": "fork+exit+wait, 64 MB heap",
}
print("| run | µs per message (median) | messages/s, one process |")
print("|---|---|---|")
for n in names:
    print(f"| {what[n]} | {med[n]:.1f} | {1e6 / med[n]:,.0f} |")
print()
print(f"inproc / helper = {med['inproc'] / med['helper']:.2f}× (the isolated run against the floor); "
      f"fork16 / helper = {med['fork16'] / med['helper']:.1f}×, fork64 / helper = {med['fork64'] / med['helper']:.1f}× "
      "(what keeping the helper saves; the fork figures leave out the run itself)")
PY
)
echo
echo "== bench/transform: $RUNS runs × $ROUNDS rounds, $(nproc) cores"
echo "$SUMMARY"

if [[ "$RECORD" == 1 ]]; then
	{
		echo
		echo "## $(date -u '+%Y-%m-%d %H:%M UTC') — bench/transform, $RUNS runs × $ROUNDS rounds, commit $COMMIT"
		echo
		echo "Command: \`$CMDLINE\`. Machine: $(nproc) cores, $(. /etc/os-release 2>/dev/null; echo "${PRETTY_NAME:-linux}"), kernel $(uname -r), libjq $(dpkg-query -W -f='${Version}' libjq1 2>/dev/null || echo '?')."
		echo "Program \`{id: .order.id, total: (.order.lines | map(.qty * .price) | add), topic: \$topic}\` on a ~300-byte payload; each mode is one process, modes alternate, the median of the rounds is shown."
		echo
		echo "$SUMMARY"
	} >>"$ROOT/bench/RESULTS.md"
	log "appended to bench/RESULTS.md"
fi
