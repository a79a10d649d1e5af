#!/usr/bin/env bash
# Records the cpu-local calibration set: six plans of two tiny scenarios — homogeneous,
# colocated and non-colocated, different TP/PP/DP — 20 steps each, the first 5 traced.
# Usage: scripts/record-calibration.sh [out-root]   (default: traces/cpu-local)
# The fitting half and the held-out half are listed in scripts/bench.sh (accuracy).
set -euo pipefail
cd "$(dirname "$0")/.."
root=${1:-traces/cpu-local}
build=${TESSERA_BUILD_DIR:-build}
runs=(
  "cpu-tiny cpu-tiny-tp2-pp2"
  "cpu-tiny cpu-tiny-colocated"
  "cpu-tiny cpu-tiny-non-colocated"
  "cpu-tiny cpu-tiny-dp2-pp2"
  "cpu-tiny-valm cpu-tiny-valm-tp2-dp2"
  "cpu-tiny-valm cpu-tiny-valm-non-colocated"
)
for entry in "${runs[@]}"; do
  read -r scenario plan <<<"$entry"
  rm -rf "${root:?}/$plan"
  "$build/exec/tessera-train" "scenarios/$scenario.json" --plan "scenarios/plans/$plan.json" \
    --steps 20 --trace-steps 5 --no-checkpoint --out "$root/$plan" >/dev/null
  echo "recorded $root/$plan ($(du -sh "$root/$plan" | cut -f1))"
done
