#!/usr/bin/env bash
# Run every QueueBox test on this machine, from a bare Debian 12:
#   0. the core's folders include downward only (scripts/check-includes.sh);
#      test/README.md names every test file (scripts/check-test-map.pl);
#      one prefix per module (scripts/check-prefixes.sh, src/README.md)
#   1. install the packages (scripts/setup.sh, idempotent)
#   2. build with warnings as errors, install the extension; every T-SQL
#      text sent to SQL Server parsed by Microsoft's parser (tools/tsql-check)
#   3. cmocka unit tests of the core (no PostgreSQL header), then the
#      libFuzzer harnesses of test/fuzz for a few seconds each
#   4. pg_regress + isolation specs + TAP on temp clusters (make installcheck;
#      two TAP files at a time, QB_PROVE_JOBS=N for N),
#      the pull libraries' runners among them (TAP 032 to 035 and 039: cmocka,
#      node --test, go test, dotnet test; the C# tests only where the .NET 10
#      SDK is installed, else TAP 039 says they were skipped and what to install)
#   5. the other PostgreSQL majors (scripts/pg-majors.sh): each one this
#      machine can build from Debian's source packages, built once into a
#      cache (in the background from step 1 on), runs pg_regress, the
#      isolation specs and a subset of TAP;
#      one whose source cannot be had is said loudly and skipped
#      (QB_PG_MAJORS names the majors, default 16 17 18; empty: none)
# With SANITIZE=1 the core's unit tests run under ASan + UBSan, and the
# extension is built with UBSan for the cluster tests, the daemon with ASan +
# UBSan (its LeakSanitizer reports fail the run).  (ASan cannot be used
# inside the server here: with libasan preloaded, Debian's postgres binary
# hangs at start, even for `postgres -V`.)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

echo "== includes of the core point down only"
scripts/check-includes.sh
echo "== test/README.md maps every test file (scripts/check-test-map.pl)"
scripts/check-test-map.pl
echo "== one prefix per module (src/README.md)"
scripts/check-prefixes.sh

scripts/setup.sh

# the other majors' PostgreSQL builds (step 5) are built meanwhile, niced,
# in the background: on a fresh machine they take minutes of CPU, and the
# TAP files below leave most of a core idle
PGB_LOG=$(mktemp /tmp/queuebox-pgbuild.XXXXXX)
setsid scripts/pg-majors.sh --build-only >"$PGB_LOG" 2>&1 </dev/null &
PGB=$!
WORK=""
# on any exit: the background build stopped, the temporary files removed
cleanup() { kill -TERM -- -"$PGB" 2>/dev/null || true; rm -f "$PGB_LOG"; [ -z "$WORK" ] || rm -rf "$WORK"; }
trap cleanup EXIT

# make reads the environment: a SANITIZE=1 given to this script must reach
# only the makes that ask for it (an ASan core linked into queuebox.so would
# not load in the server)
SAN=${SANITIZE:-0}
unset SANITIZE

SAN_CFLAGS=""
SAN_LDFLAGS=""
if [ "$SAN" = 1 ]; then
  SAN_CFLAGS="-fsanitize=undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
  SAN_LDFLAGS="-fsanitize=undefined"
fi

echo "== build (warnings are errors)"
make -s clean >/dev/null
make -s QB_EXTRA_CFLAGS="$SAN_CFLAGS" QB_EXTRA_LDFLAGS="$SAN_LDFLAGS"
make -s install >/dev/null
make -s sink QB_EXTRA_CFLAGS="$SAN_CFLAGS" QB_EXTRA_LDFLAGS="$SAN_LDFLAGS"
if [ "$SAN" = 1 ]; then
  # The daemon is an ordinary process: it runs under ASan + UBSan (and
  # LeakSanitizer) in full, not only UBSan as the extension must.
  rm -f queuebox-mssqld
  make -s SANITIZE=1 queuebox-mssqld
fi

# every T-SQL text sent to SQL Server, through Microsoft's own parser
# (ScriptDom's TSql150Parser, SQL Server 2019; tools/tsql-check): fails
# the run when one does not parse, and when dotnet is missing
echo "== T-SQL texts through Microsoft's parser (make tsql-check)"
make -s tsql-check

echo "== unit tests (cmocka)"
make -s unit SANITIZE="$SAN"
if [ "$SAN" != 1 ]; then
  # valgrind cannot run ASan binaries; the plain ones, no definite leak
  echo "== unit tests under valgrind memcheck"
  make -s unit-valgrind
fi

# libFuzzer harnesses (clang, ASan + UBSan): a few seconds each on a copy of
# their seed corpora, so a regression on any parser shows here
# a fixed seed and a fixed count: every seed and reproducer of the corpus,
# then the same 20,000 mutated inputs each time (a failure is a regression;
# the long runs that find new inputs: test/fuzz/README.md)
echo "== fuzz harnesses (make fuzz-run: the corpus, then 20,000 inputs each, seed 1)"
make -s fuzz-run FUZZ_RUNS=20000 FUZZ_SEED=1 FUZZ_MAX_SECONDS=30

# initdb refuses to run as root: run the cluster tests as the postgres user
# in a copy of the tree it owns.
echo "== pg_regress, isolation and TAP (make installcheck)"
if ! command -v dotnet >/dev/null; then
  echo "== C#: TAP 039 (clients/dotnet) is skipped: dotnet is not installed (install the .NET 10 SDK, dotnet-sdk-10.0)"
fi
WORK=$(mktemp -d /tmp/queuebox-test.XXXXXX)
cp -a "$ROOT/." "$WORK/src"
RUNAS=()
if [ "$(id -u)" -eq 0 ]; then
  chown -R postgres:postgres "$WORK"
  RUNAS=(runuser -u postgres --)
fi
ENV=()
if [ "$SAN" = 1 ]; then
  mkdir -p "$WORK/asan" && chmod 777 "$WORK/asan"
  ENV=(env UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
       ASAN_OPTIONS="log_path=$WORK/asan/daemon:detect_leaks=1")
fi
# SQL Server cannot run here: its suites (TAP 031, and 035 for the TypeScript
# worker) run against the server QUEUEBOX_TEST_MSSQL_URL names, and say they
# were skipped otherwise
if [ -n "${QUEUEBOX_TEST_MSSQL_URL:-}" ]; then
  echo "== SQL Server: TAP 031 and 035 run against $(sed -E 's#://([^:@/]*):[^@]*@#://\1:***@#' <<<"$QUEUEBOX_TEST_MSSQL_URL")"
else
  echo "== SQL Server: TAP 031 and 035 are skipped: QUEUEBOX_TEST_MSSQL_URL is not set (docs/sqlserver.md: Testing)"
fi
status=0
# two TAP files at once (QB_PROVE_JOBS, default 2; 1: one at a time): each
# file has its own clusters, ports, sinks and brokers, and waits more than
# it computes (2026-12-05: 588 s for every file against about 1,000 s)
( cd "$WORK/src" && "${RUNAS[@]}" "${ENV[@]}" make -s installcheck \
    PROVE_FLAGS="--timer -j${QB_PROVE_JOBS:-2}" ) 2>&1 \
  | tee "$WORK/installcheck.out" || status=$?
if [ $status -ne 0 ]; then
  for f in "$WORK"/src/regression.diffs "$WORK"/src/output_iso/regression.diffs; do
    [ -f "$f" ] && { echo "---- $f"; cat "$f"; }
  done
  # the logs of the TAP files that failed (prove's "Test Summary Report" names
  # them: "test/t/<group>/0xx_name.pl (Wstat: ...)"), not of all of them
  failed=$(sed -n '/^Test Summary Report/,$p' "$WORK/installcheck.out" | grep -oE '^test/t/[a-z]+/[0-9]+_[A-Za-z0-9_]+\.pl' | sort -u || true)
  for t in $failed; do
    n=$(basename "$t" .pl)
    for f in "$WORK"/src/tmp_check/log/regress_log_"$n" "$WORK"/src/tmp_check/log/"$n"_*.log; do
      [ -f "$f" ] && { echo "---- $f (last 80 lines)"; tail -n 80 "$f"; }
    done
  done
  # last, what failed, so the tail of a CI log names it
  echo "== FAILED: make installcheck exited $status"
  grep -E 'not ok|Dubious|Wstat|^ *Failed test|FAILED|failed \(' "$WORK/installcheck.out" | tail -n 40 || true
  for t in $failed; do
    grep -hE '^\[[0-9:.]+\]\([0-9.]+s\) not ok|^not ok' "$WORK/src/tmp_check/log/regress_log_$(basename "$t" .pl)" 2>/dev/null \
      | sed "s#^#$t: #" | tail -n 10 || true
  done
  exit $status
fi
# UBSan's own format (file:line:column: runtime error:), so a test that is
# merely named after a "runtime error" does not count
if [ "$SAN" = 1 ] && grep -rlE "\.[ch]:[0-9]+:[0-9]+: runtime error:" "$WORK"/src/tmp_check "$WORK"/src/log 2>/dev/null; then
  echo "UBSan reported runtime errors in the server logs above"; exit 1
fi
# the daemon's reports (ASan, LeakSanitizer) go to files: a leak does not fail a test by itself
if [ "$SAN" = 1 ] && [ -n "$(ls -A "$WORK/asan" 2>/dev/null)" ]; then
  cat "$WORK"/asan/*; echo "ASan or LeakSanitizer reported errors in queuebox-mssqld (above)"; exit 1
fi
# TAP 059 installs the Debian packages (dpkg -i) and removes them: that
# needs root, so under make installcheck above (as postgres) it checked only
# META.json; here, as root, it runs alone on the packages make deb built from
# this tree (its root half does the dpkg and unit steps, its postgres half the rest)
if [ "$(id -u)" -eq 0 ]; then
  echo "== Debian packages: make deb, then TAP 059 installs, runs and removes them (as root)"
  make -s deb >"$WORK/deb.out" 2>&1 || { cat "$WORK/deb.out"; echo "== FAILED: make deb"; exit 1; }
  mkdir -p "$WORK/src/build" && cp -a build/deb "$WORK/src/build/"
  ( cd "$WORK/src" && make -s installcheck REGRESS= ISOLATION= PROVE_TESTS=test/t/packages/059_packages.pl PROVE_FLAGS=--timer ) || {
    tail -n 80 "$WORK/src/tmp_check/log/regress_log_059_packages" 2>/dev/null; echo "== FAILED: TAP 059 (the packages)"; exit 1; }
else
  echo "== Debian packages: TAP 059 installs them with dpkg: run scripts/test.sh as root for it"
fi
# the whole suite ran on 15 above; the other majors run a subset
echo "== the other PostgreSQL majors (scripts/pg-majors.sh)"
if ! wait $PGB; then
  cat "$PGB_LOG"; echo "== FAILED: building the other PostgreSQL majors (above)"; exit 1
fi
grep -E '^(==|!!|   )' "$PGB_LOG" || true
# the core's objects it keeps were built with the flags above: its
# extension links with the same (with SANITIZE=1, UBSan's runtime)
if ! QB_EXTRA_CFLAGS="$SAN_CFLAGS" QB_EXTRA_LDFLAGS="$SAN_LDFLAGS" scripts/pg-majors.sh; then
  echo "== FAILED: scripts/pg-majors.sh (its summary above names the major)"
  exit 1
fi
echo "== all tests passed"
