#!/usr/bin/env bash
# Regenerates the golden simulator outputs in tests/data/golden/ (the golden test rewrites them
# when TESSERA_UPDATE_GOLDEN=1). Run it when a change of prediction is intended, and review the
# diff in the commit: the numbers are the product.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${TESSERA_BUILD_DIR:-build}
cmake --build "$build" --target tessera_sim_tests >/dev/null
TESSERA_UPDATE_GOLDEN=1 "$build/tests/tessera_sim_tests" -tc="golden*"
git status --short tests/data/golden
