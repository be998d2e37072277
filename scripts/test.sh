#!/usr/bin/env bash
# Run every QueueBox test on this machine, from a bare Debian 12:
#   1. install the packages (scripts/setup.sh, idempotent)
#   2. build with warnings as errors, install the extension
#   3. cmocka unit tests of the core (no PostgreSQL header)
#   4. pg_regress + isolation specs + TAP on temp clusters (make installcheck)
# With SANITIZE=1 the core's unit tests and the extension are built with
# ASan/UBSan, and the temp clusters run with the sanitizer runtime preloaded.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

scripts/setup.sh

SAN_CFLAGS=""
SAN_LDFLAGS=""
if [ "${SANITIZE:-0}" = 1 ]; then
  SAN_CFLAGS="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
  SAN_LDFLAGS="-fsanitize=address,undefined"
fi

echo "== build (warnings are errors)"
make -s clean >/dev/null
make -s QB_EXTRA_CFLAGS="$SAN_CFLAGS" QB_EXTRA_LDFLAGS="$SAN_LDFLAGS"
make -s install >/dev/null
make -s sink

echo "== unit tests (cmocka)"
make -s unit SANITIZE="${SANITIZE:-0}"

# initdb refuses to run as root: run the cluster tests as the postgres user
# in a copy of the tree it owns.
echo "== pg_regress, isolation and TAP (make installcheck)"
WORK=$(mktemp -d /tmp/queuebox-test.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
cp -a "$ROOT/." "$WORK/src"
RUNAS=()
if [ "$(id -u)" -eq 0 ]; then
  chown -R postgres:postgres "$WORK"
  RUNAS=(runuser -u postgres --)
fi
ENV=()
if [ "${SANITIZE:-0}" = 1 ]; then
  ENV=(env LD_PRELOAD="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libubsan.so)"
       ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1)
fi
status=0
( cd "$WORK/src" && "${RUNAS[@]}" "${ENV[@]}" make -s installcheck PROVE_FLAGS="--timer" ) || status=$?
if [ $status -ne 0 ]; then
  for f in "$WORK"/src/regression.diffs "$WORK"/src/output_iso/regression.diffs; do
    [ -f "$f" ] && { echo "---- $f"; cat "$f"; }
  done
  for f in "$WORK"/src/tmp_check/log/*; do
    [ -f "$f" ] && { echo "---- $f (last 60 lines)"; tail -n 60 "$f"; }
  done
  exit $status
fi
echo "== all tests passed"
