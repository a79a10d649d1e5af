#!/usr/bin/env bash
# Builds the libFuzzer targets of fuzz/ (clang 14, AddressSanitizer + UndefinedBehaviorSanitizer)
# in build-fuzz/ and runs each for a fixed time, several at once. fuzz/README.md describes the
# targets and their properties.
#
# Usage: scripts/fuzz.sh [--seconds N] [--jobs J] [TARGET ...]
#   --seconds N  time per target (default 600)
#   --jobs J     targets run at once (default: the machine's cores)
#   TARGET       scenario hf_config run_record trace profile (default: all)
#
# The working corpus of each target grows in build-fuzz/corpus/TARGET across runs, seeded from
# fuzz/corpus/TARGET and fuzz/regressions/TARGET. An input that breaks a property (crash, leak,
# sanitizer report, a slow input over 10 s, a property check) lands in
# build-fuzz/artifacts/TARGET/; copy it to fuzz/regressions/TARGET/ once fixed, so ctest replays it.
# Each target's log is build-fuzz/logs/TARGET.log; the summary (seconds, executions, corpus,
# findings) is printed and appended to build-fuzz/summary.tsv. Exits 1 when anything was found.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=600
jobs=$(nproc)
targets=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --seconds) seconds=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    -h|--help) sed -n 2,17p "$0"; exit 0 ;;
    -*) echo "fuzz.sh: unknown option $1" >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done
all=(scenario hf_config run_record trace profile)
[[ ${#targets[@]} -gt 0 ]] || targets=("${all[@]}")
for t in "${targets[@]}"; do
  [[ " ${all[*]} " == *" $t "* ]] || { echo "fuzz.sh: unknown target $t (${all[*]})" >&2; exit 2; }
done

scripts/setup.sh --fuzz
build=build-fuzz
flags="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++-14 \
  -DTESSERA_BUILD_SIM=OFF -DTESSERA_BUILD_EXEC=OFF -DTESSERA_BUILD_TESTS=OFF -DTESSERA_FUZZ=ON \
  -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" >/dev/null
cmake --build "$build" --parallel "$(nproc)" --target "${targets[@]/#/fuzz_}"

# Seeds kept elsewhere in the tree (fuzz/CMakeLists.txt names the same ones for the replay).
extra_seeds() {
  case $1 in
    hf_config) echo tests/data/hf-corpus/configs ;;
  esac
}

# A dictionary per target: every key and string of its seeds, so mutations write JSON words.
dictionary() {
  cat "fuzz/corpus/$1"/* $(for d in $(extra_seeds "$1"); do echo "$d"/*; done) | grep -o '"[A-Za-z0-9_#.:+-]\{1,40\}"' | sort -u |
    sed 's/"/\\"/g; s/.*/"&"/'
}

run_one() {
  local t=$1
  mkdir -p "$build/corpus/$t" "$build/artifacts/$t" "$build/logs"
  dictionary "$t" >"$build/$t.dict"
  local start=$SECONDS rc=0
  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
    "$build/fuzz/fuzz_$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=4096 \
    -dict="$build/$t.dict" -artifact_prefix="$build/artifacts/$t/" -print_final_stats=1 \
    "$build/corpus/$t" "fuzz/corpus/$t" "fuzz/regressions/$t" $(extra_seeds "$t") >"$build/logs/$t.log" 2>&1 || rc=$?
  local execs corpus findings
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$build/logs/$t.log" | grep -o '[0-9]*$' || echo 0)
  corpus=$(find "$build/corpus/$t" -type f | wc -l)
  findings=$(find "$build/artifacts/$t" -type f | wc -l)
  printf '%s\t%s\t%d\t%s\t%d\t%d\t%d\n' "$(date -u +%FT%TZ)" "$t" $((SECONDS - start)) \
    "${execs:-0}" "$corpus" "$findings" "$rc" | tee -a "$build/summary.tsv"
}

echo "fuzz.sh: ${targets[*]}, ${seconds} s each, $jobs at once; logs in $build/logs/"
printf 'finished\ttarget\tseconds\texecutions\tcorpus\tfindings\texit\n'
running=0
for t in "${targets[@]}"; do
  run_one "$t" &
  running=$((running + 1))
  if [[ $running -ge $jobs ]]; then
    wait -n
    running=$((running - 1))
  fi
done
wait
found=0
for t in "${targets[@]}"; do
  n=$(find "$build/artifacts/$t" -type f | wc -l)
  [[ $n -eq 0 ]] || { echo "fuzz.sh: $t: $n finding(s) in $build/artifacts/$t/"; found=1; }
done
exit $found
