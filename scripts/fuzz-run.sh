#!/usr/bin/env bash
# Run each libFuzzer harness given (build/fuzz/<name>) on a copy of its seed
# corpus (test/fuzz/corpus/<name>), so the tree never gains corpus files.
#   scripts/fuzz-run.sh SECONDS RUNS harness...
# SECONDS bounds each harness's run (-max_total_time); RUNS, when not empty,
# bounds it in inputs (-runs) instead, and FUZZ_MAX_SECONDS then caps each
# such run in time.  A harness's extra libFuzzer flags are
# in test/fuzz/<name>.options (one line), its dictionary test/fuzz/<name>.dict.
# A crash, leak, UBSan report or timeout fails the run; the input is kept in
# build/fuzz/artifacts/<name>/ and the command that reproduces it is printed.
# Leaks inside libjq itself are suppressed (test/fuzz/lsan.supp says why).
# FUZZ_SEED=N fixes libFuzzer's random seed.
# FUZZ_KEEP=1 keeps each run's grown corpus (build/fuzz/grown/<name>) and log.
# The last line per harness is a summary: executions, exec/s, corpus size.
set -uo pipefail
cd "$(dirname "$0")/.."
secs=$1
runs=$2
shift 2
status=0
for bin in "$@"; do
  name=$(basename "$bin")
  seeds=test/fuzz/corpus/$name
  art=build/fuzz/artifacts/$name
  work=$(mktemp -d "/tmp/qb-fuzz-$name.XXXXXX")
  mkdir -p "$art"
  [ -d "$seeds" ] && cp "$seeds"/* "$work"/ 2>/dev/null
  # 10 s for one input: jq compiles and runs are the slowest (fuzz_config, fuzz_ingress)
  opts=(-timeout=10)
  # FUZZ_SEED: the same inputs at every run (CI: a failure is a regression of
  # the corpus or of the code, not a new find of the day)
  [ -n "${FUZZ_SEED:-}" ] && opts+=("-seed=$FUZZ_SEED")
  [ -f "test/fuzz/$name.dict" ] && opts+=("-dict=test/fuzz/$name.dict")
  [ -f "test/fuzz/$name.options" ] && read -r -a extra < "test/fuzz/$name.options" && opts+=("${extra[@]}")
  if [ -n "$runs" ]; then
    opts+=("-runs=$runs")
    # a cap in time for the slow harnesses of a long run
    [ -n "${FUZZ_MAX_SECONDS:-}" ] && opts+=("-max_total_time=$FUZZ_MAX_SECONDS")
  else
    opts+=("-max_total_time=$secs")
  fi
  log=$work.log
  bound="$secs s"
  [ -n "$runs" ] && bound="$runs runs"
  echo "== $name ($bound, $(ls "$work" | wc -l) seeds)"
  ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1} \
  LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$PWD/test/fuzz/lsan.supp:print_suppressions=0} \
  UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1} \
    "$bin" -print_final_stats=1 -artifact_prefix="$art/" "${opts[@]}" "$work" > "$log" 2>&1
  rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  size=$(ls "$work" | wc -l)
  if [ $rc -ne 0 ]; then
    status=1
    grep -aE "ERROR|runtime error|fuzz check failed|SUMMARY|Test unit written" "$log" | head -20
    for f in "$art"/*; do
      [ -f "$f" ] && echo "   reproduce: $bin $f"
    done
    echo "   log: $log"
  fi
  echo "   $name: rc=$rc executions=${execs:-?} exec/s=${rate:-?} corpus=$size"
  if [ "${FUZZ_KEEP:-0}" = 1 ]; then
    rm -rf "build/fuzz/grown/$name" && mkdir -p build/fuzz/grown && mv "$work" "build/fuzz/grown/$name"
  else
    rm -rf "$work"
    [ $rc -eq 0 ] && rm -f "$log"
  fi
done
exit $status
