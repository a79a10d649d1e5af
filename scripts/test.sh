#!/usr/bin/env bash
# Set-up if needed, configure, build on every core, run every test through ctest.
# Exits non-zero on any failure.
# Usage: scripts/test.sh [--sanitize | --torch2] [extra ctest arguments]
#   --sanitize  shared/ and sim/ (not the LibTorch executor) built with AddressSanitizer and
#               UndefinedBehaviorSanitizer in build-sanitize/, and their tests run (ir, sim, the
#               cli suite on the sanitized binary, the fuzz corpus replays); any report fails
#   --torch2    the executor built against torch 2.11 with CUDA 13 (scripts/setup.sh --torch2)
#               in build-torch2/ instead of Debian's LibTorch 1.13, and its tests run on the CPU;
#               then scripts/gpu-check.sh's dry run (--device cpu) on that build
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh --slurm
jobs=$(nproc)
# Line tables only (-g1): enough for backtraces, and a torch translation unit compiles in about
# 0.7 of the time of -g (exec/runtime.cpp with Debian's LibTorch: 22 s against 30 s, its
# precompiled header 42 s against 63 s; docs/PERFORMANCE.md). A build for a debugger configures
# its own folder with -DCMAKE_BUILD_TYPE=RelWithDebInfo.
optimized=(-DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG")
# One compiler cache for every build folder, in build-ccache/: the torch 2 stage's shared/ is then
# the default build's, not compiled again (same flags; the folder a unit is built in not hashed).
launcher=()
if command -v ccache >/dev/null; then
  export CCACHE_DIR=${CCACHE_DIR:-$PWD/build-ccache} CCACHE_NOHASHDIR=1
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
optimized+=("${launcher[@]}")
if [[ ${1:-} == --sanitize ]]; then
  shift
  build=${TESSERA_BUILD_DIR:-build-sanitize}
  # -O1 -g1 (line tables, enough for the reports' stack traces): the instrumented build compiles
  # in about half the time of -O2 -g (54 s against 24 s of CPU for shared/lowering/pipelines.cpp),
  # which is most of this stage on two cores; the test drivers at -O0 (tests/CMakeLists.txt).
  cmake -S . -B "$build" -G Ninja "${launcher[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DTESSERA_BUILD_EXEC=OFF -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" \
    -DTESSERA_SANITIZE=address,undefined
  cmake --build "$build" --parallel "$jobs"
  export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
  export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
  ctest --test-dir "$build" --output-on-failure --parallel "$jobs" "$@"
  exit
fi
if [[ ${1:-} == --torch2 ]]; then
  shift
  scripts/setup.sh --torch2
  build=${TESSERA_BUILD_DIR:-build-torch2}
  torch=$(echo "$PWD"/.venv-torch2/lib/python3*/site-packages/torch)
  # Its CUDA code for Hopper (sm_90), the GPUs lent here; naming it skips torch's detection of
  # the machine's GPUs, which this machine has none of.
  cmake -S . -B "$build" -G Ninja -DTORCH_CUDA_ARCH_LIST=9.0 "${optimized[@]}" -DTESSERA_BUILD_SIM=OFF \
    -DCMAKE_PREFIX_PATH="$torch" -DCUDAToolkit_ROOT=/usr/local/cuda
  cmake --build "$build" --parallel "$jobs" --target tessera_exec_tests
  # libtorch_cuda.so loads the CUDA toolkit's libraries, and cuDNN's and NCCL's beside them.
  export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  ctest --test-dir "$build" --output-on-failure --parallel "$jobs" -R '^exec$' "$@"
  # The GPU machine's script, dry: the same stages on the tiny scenarios on the CPU.
  TESSERA_BUILD_DIR=$build scripts/gpu-check.sh --device cpu --out out/gpu-check-cpu
  # Its A/B of two executors, here the same one twice.
  TESSERA_BUILD_DIR=$build TESSERA_TRAIN_B=$build/exec/tessera-train \
    scripts/gpu-check.sh --device cpu --out out/gpu-check-cpu ab
  # megatron-core's own checks on `tessera export` of every library scenario with a plan, with
  # the simulator's CLI of the default build (built before this stage in CI).
  sim=${TESSERA_SIM_BIN:-build/sim/tessera}
  [[ -x $sim ]] || { echo "test.sh --torch2: $sim missing: run scripts/test.sh first" >&2; exit 1; }
  scenarios=()
  for f in scenarios/*.json scenarios/{cornstarch,gpu,hetero,variability,published}/*.json; do
    grep -q '"plan"' "$f" && scenarios+=("$f")
  done
  .venv-torch2/bin/python scripts/check-megatron-export.py "$sim" "${scenarios[@]}"
  exit
fi
build=${TESSERA_BUILD_DIR:-build}
cmake -S . -B "$build" -G Ninja "${optimized[@]}"
cmake --build "$build" --parallel "$jobs"
ctest --test-dir "$build" --output-on-failure --parallel "$jobs" "$@"
