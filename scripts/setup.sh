#!/usr/bin/env bash
# Installs every Debian package Tessera's build and tests need, from a bare bookworm machine.
# Idempotent: when everything is already installed it returns at once without touching apt.
# Must run as root (or with sudo available) the first time.
# Usage: scripts/setup.sh [--fuzz] [--slurm] [--browser]
#   --fuzz   also clang 14 and its libFuzzer, for scripts/fuzz.sh
#   --browser also Chromium, whose headless mode renders and checks the sweep report
#            (scripts/bench.sh sweep and demo)
#   --slurm  also Slurm's controller, node daemon and client and munge, for the batch scripts in
#            scripts/slurm/ and their integration test (scripts/test.sh asks for it)
set -euo pipefail

packages=(
  build-essential g++ cmake ninja-build pkg-config git ca-certificates time
  libsimgrid-dev
  libtorch-dev libgloo-dev
  # libtorch's matrix products go through libblas.so.3; Debian's default is the reference BLAS,
  # 6x slower on the executor's steps. The single-threaded OpenBLAS suits one rank per core.
  libopenblas0-serial
  libeigen3-dev libcxxopts-dev nlohmann-json3-dev doctest-dev
  jq  # scripts/bench.sh reads `tessera simulate --json`
  clang-format  # the `format` test
)
for option in "$@"; do
  case $option in
    --fuzz) packages+=(clang-14 libclang-rt-14-dev) ;;
    --slurm) packages+=(slurmctld slurmd slurm-client munge) ;;
    --browser) packages+=(chromium) ;;
    *)
      echo "setup: unknown option $option (--fuzz, --slurm, --browser)" >&2
      exit 2
      ;;
  esac
done

missing=()
for p in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$p")
done

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "setup: all ${#packages[@]} packages present"
  exit 0
fi

echo "setup: installing ${missing[*]}"
sudo_cmd=()
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null || { echo "setup: need root to install packages" >&2; exit 1; }
  sudo_cmd=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -q
"${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
echo "setup: done"
