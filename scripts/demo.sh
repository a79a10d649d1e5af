#!/usr/bin/env bash
# Set-up if needed, build the tessera CLI, and run the main job: the default what-if sweep —
# LLaVA-1.5-7B on 64 H100s with a variable multi-image workload, every placement family
# searched, the best plans simulated on SimGrid — then print the table and the report's path.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh >/dev/null
build=${TESSERA_BUILD_DIR:-build}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" --parallel "$(nproc)" --target tessera >/dev/null
"$build/sim/tessera" sweep scenarios/default.json --out out/sweep-default "$@"
