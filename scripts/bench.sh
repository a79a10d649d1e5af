#!/usr/bin/env bash
# Benchmarks that print figures (never pass/fail). Usage: scripts/bench.sh [lower|comm|cli|all]
#   lower  lowering + evaluation of one iteration of a 1024-rank plan with 64 micro-batches
#   comm   the Gloo all-reduce of tessera-train across message sizes (2 ranks on loopback)
#   cli    tessera validate/show on the scenario library
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:-all}
build=${TESSERA_BUILD_DIR:-build}
scripts/setup.sh >/dev/null
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" --parallel "$(nproc)" --target tessera tessera-train >/dev/null
tessera="$build/sim/tessera"

elapsed() { awk -v s="$1" -v e="$2" 'BEGIN { printf "%.3f", e - s }'; }

if [[ $what == lower || $what == all ]]; then
  echo "== lower + evaluate: scenarios/cornstarch-vlm-large-1024.json (1024 ranks, 64 micro-batches) =="
  for run in 1 2 3; do
    start=$(date +%s.%N)
    out=$("$tessera" estimate scenarios/cornstarch-vlm-large-1024.json)
    end=$(date +%s.%N)
    # "(438272 ops lowered in 0.114 s, evaluated in 0.105 s)"
    echo "$out" | awk -v wall="$(elapsed "$start" "$end")" '/ops lowered in/ {
      gsub(/[(),]/, ""); ops = $1; lower = $5; eval = $9;
      printf "run: %d ops, lower %.3f s, evaluate %.3f s, together %.3f s (%.2f M ops/s); whole command %s s\n",
             ops, lower, eval, lower + eval, ops / (lower + eval) / 1e6, wall }'
  done
fi

if [[ $what == comm || $what == all ]]; then
  echo "== Gloo all-reduce over loopback, 2 ranks (tessera-train comm-check) =="
  for bytes in 65536 1048576 16777216 67108864; do
    "$build/exec/tessera-train" comm-check --nproc 2 --bytes "$bytes" --iters 10
  done
fi

if [[ $what == cli || $what == all ]]; then
  echo "== CLI on the scenario library =="
  start=$(date +%s.%N)
  count=0
  for f in scenarios/*.json; do
    "$tessera" validate "$f" >/dev/null
    count=$((count + 1))
  done
  end=$(date +%s.%N)
  echo "validate: $count scenarios in $(elapsed "$start" "$end") s"
  start=$(date +%s.%N)
  "$tessera" show scenarios/default.json --batches 16 >/dev/null
  end=$(date +%s.%N)
  echo "show default.json with 16 batches (4096 samples): $(elapsed "$start" "$end") s"
fi
