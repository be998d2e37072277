#!/usr/bin/env bash
# bench/isolation/compare.sh: bench/isolation/run.sh before and after.
#
#   bench/isolation/compare.sh REV [run.sh arguments, e.g. --record]
#
# Builds REV (e.g. e104520, the 0.1.0 code) in a temporary git worktree under
# /tmp, installs it and runs this tree's bench/isolation/run.sh; then builds
# and installs this tree and runs run.sh again; then prints both ratio tables
# side by side.  Each install and the run after it hold the install lock
# (/tmp/qb-install.lock, shared with the other agents and CI) together, so
# the run measures what was installed.  Whatever happens, this tree's build
# is installed again at the end.  run.sh's knobs (QB_BENCH_*) apply to both
# runs.  Output and logs: a mktemp -d /tmp/qb-compare.XXXXXX directory,
# deleted on success unless QB_BENCH_KEEP=1.
set -euo pipefail

[[ $# -ge 1 && "$1" != -* ]] || { echo "usage: bench/isolation/compare.sh REV [run.sh arguments]" >&2; exit 2; }
REV=$1; shift
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
LOCK=${QB_INSTALL_LOCK:-/tmp/qb-install.lock}	# another path only when the caller holds this one
log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

REV_SHA=$(git -C "$ROOT" rev-parse --verify --short "$REV^{commit}") || die "unknown revision $REV"
CUR_SHA=$(git -C "$ROOT" rev-parse --short HEAD)
if [[ -n "$(git -C "$ROOT" status --porcelain -- src sql Makefile 2>/dev/null)" ]]; then CUR_SHA+=" (uncommitted changes)"; fi
TMP=$(mktemp -d /tmp/qb-compare.XXXXXX)
SRC=$TMP/src
INSTALLED=none	# what the last make install put in place: none, rev or current

cleanup() {
	local rc=$?
	set +e
	if [[ $INSTALLED == rev ]]; then
		log "installing this tree's build again"
		flock "$LOCK" make -s -C "$ROOT" install >"$TMP/install-current-again.log" 2>&1 \
			|| { cat "$TMP/install-current-again.log" >&2; log "ERROR: make install of this tree failed"; rc=1; }
	fi
	if [[ -d "$SRC" ]]; then git -C "$ROOT" worktree remove --force "$SRC" >/dev/null 2>&1; fi
	git -C "$ROOT" worktree prune >/dev/null 2>&1
	if [[ "${QB_BENCH_KEEP:-0}" == 1 || $rc -ne 0 ]]; then echo "kept $TMP" >&2; else rm -rf "$TMP"; fi
	exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

log "building $REV_SHA in $SRC"
git -C "$ROOT" worktree add --detach "$SRC" "$REV_SHA" >"$TMP/worktree.log" 2>&1 || { cat "$TMP/worktree.log" >&2; die "git worktree add failed"; }
make -s -C "$SRC" -j"$(nproc)" >"$TMP/build-rev.log" 2>&1 || { tail -30 "$TMP/build-rev.log" >&2; die "the build of $REV_SHA failed"; }
log "building this tree ($CUR_SHA)"
make -s -C "$ROOT" -j"$(nproc)" >"$TMP/build-current.log" 2>&1 || { tail -30 "$TMP/build-current.log" >&2; die "the build of this tree failed"; }

# measure WHICH DIR LABEL: install DIR's build and run run.sh, under the lock
measure() {
	local which=$1 dir=$2 label=$3 rc=0
	shift 3
	log "install $label and run bench/isolation/run.sh (waiting for $LOCK)"
	INSTALLED=$which	# from here on the install may have happened
	# shellcheck disable=SC2016  # the inner bash expands them
	QB_BENCH_RATIOS="$TMP/ratios-$which.tsv" QB_BENCH_COMMIT="$label" \
		flock "$LOCK" bash -c 'make -s -C "$1" install >"$2/install-$3.log" 2>&1 || { cat "$2/install-$3.log" >&2; exit 1; }; shift 3; exec bash "$@"' \
		- "$dir" "$TMP" "$which" "$HERE/run.sh" "$@" 2>&1 | tee "$TMP/run-$which.log" >&2 || rc=$?
	[[ $rc -eq 0 && -s "$TMP/ratios-$which.tsv" ]] || die "the run of $label failed (log: $TMP/run-$which.log)"
}
measure rev "$SRC" "$REV_SHA" "$@"
measure current "$ROOT" "$CUR_SHA" "$@"

echo
echo "== bench/isolation before / after"
python3 - "$TMP/ratios-rev.tsv" "$TMP/ratios-current.tsv" <<'EOF'
import sys
def load(path):
    head, rows = None, {}
    for line in open(path, encoding="utf-8"):
        f = line.rstrip("\n").split("\t")
        if f[0] == "version":
            head = f"queuebox {f[1]}, {f[2]}"
        else:
            rows[f[0]] = f  # phase, anchor, measured, ratio, target
    return head, rows
(hb, before), (ha, after) = load(sys.argv[1]), load(sys.argv[2])
print(f"| phase | target | before: {hb} | after: {ha} | before (anchor; measured) | after (anchor; measured) |")
print("|---|---|---|---|---|---|")
for p in list(before) + [p for p in after if p not in before]:
    b, a = before.get(p), after.get(p)
    t = (a or b)[4]
    print(f"| {p} | {t} | {b[3] if b else 'n/a'} | {a[3] if a else 'n/a'} | "
          f"{b[1] + '; ' + b[2] if b else ''} | {a[1] + '; ' + a[2] if a else ''} |")
EOF
