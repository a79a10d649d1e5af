#!/usr/bin/env bash
# Set-up if needed, build the tessera CLI, and run the main job on the default scenario:
# LLaVA-1.5-7B on 64 H100s with a variable multi-image workload — its summary, then a SimGrid
# simulation of three iterations of its plan. (With the sweep, the main job becomes the default
# what-if sweep.)
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh >/dev/null
build=${TESSERA_BUILD_DIR:-build}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" --parallel "$(nproc)" --target tessera >/dev/null
"$build/sim/tessera" show scenarios/default.json "$@"
echo
"$build/sim/tessera" simulate scenarios/default.json --iterations 3
