#!/usr/bin/env bash
# Benchmarks that print figures (never pass/fail): the Gloo all-reduce of tessera-train across
# message sizes, and how long the CLI takes on the scenario library.
# Usage: scripts/bench.sh [--nproc N]
set -euo pipefail
cd "$(dirname "$0")/.."
nproc_ranks=2
[[ "${1:-}" == "--nproc" ]] && nproc_ranks=$2

build=${TESSERA_BUILD_DIR:-build}
scripts/setup.sh >/dev/null
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" --parallel "$(nproc)" --target tessera tessera-train >/dev/null

echo "== Gloo all-reduce over loopback, $nproc_ranks ranks (tessera-train comm-check) =="
for bytes in 65536 1048576 16777216 67108864; do
  "$build/exec/tessera-train" comm-check --nproc "$nproc_ranks" --bytes "$bytes" --iters 10
done

echo "== CLI on the scenario library =="
start=$(date +%s.%N)
count=0
for f in scenarios/*.json; do
  "$build/sim/tessera" validate "$f" >/dev/null
  count=$((count + 1))
done
end=$(date +%s.%N)
awk -v s="$start" -v e="$end" -v n="$count" 'BEGIN { printf "validate: %d scenarios in %.3f s (%.1f ms each)\n", n, e - s, 1000 * (e - s) / n }'
start=$(date +%s.%N)
"$build/sim/tessera" show scenarios/default.json --batches 16 >/dev/null
end=$(date +%s.%N)
awk -v s="$start" -v e="$end" 'BEGIN { printf "show default.json with 16 batches (4096 samples): %.3f s\n", e - s }'
