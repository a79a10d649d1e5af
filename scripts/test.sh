#!/usr/bin/env bash
# Set-up if needed, configure, build on every core, run every test through ctest.
# Exits non-zero on any failure. Usage: scripts/test.sh [--sanitize] [extra ctest arguments]
#   --sanitize  shared/ and sim/ (not the LibTorch executor) built with AddressSanitizer and
#               UndefinedBehaviorSanitizer in build-sanitize/, and their tests run (ir, sim, the
#               cli suite on the sanitized binary, the fuzz corpus replays); any report fails
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh --slurm
jobs=$(nproc)
if [[ ${1:-} == --sanitize ]]; then
  shift
  build=${TESSERA_BUILD_DIR:-build-sanitize}
  # -Wno-maybe-uninitialized: GCC 12 warns inside libstdc++'s <regex> once ASan instruments it.
  flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
  flags+=" -Wno-maybe-uninitialized"
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTESSERA_BUILD_EXEC=OFF \
    -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined"
  cmake --build "$build" --parallel "$jobs"
  export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
  export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
  ctest --test-dir "$build" --output-on-failure --parallel "$jobs" "$@"
  exit
fi
build=${TESSERA_BUILD_DIR:-build}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build "$build" --parallel "$jobs"
ctest --test-dir "$build" --output-on-failure --parallel "$jobs" "$@"
