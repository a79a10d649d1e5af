#!/usr/bin/env bash
# Installs every Debian package Tessera's build and tests need, from a bare bookworm machine.
# Idempotent: when everything is already installed it returns at once without touching apt.
# Must run as root (or with sudo available) the first time.
# Usage: scripts/setup.sh [--fuzz] [--slurm] [--browser] [--torch2]
#   --fuzz   also clang 14 and its libFuzzer, for scripts/fuzz.sh
#   --torch2 also a CUDA build of torch 2.x from PyPI in .venv-torch2/ (git-ignored), for the
#            executor's torch 2 build (scripts/test.sh --torch2); see install_torch2 below
#   --browser also Chromium, whose headless mode renders and checks the sweep report
#            (scripts/bench.sh sweep and demo)
#   --slurm  also Slurm's controller, node daemon and client and munge, for the batch scripts in
#            scripts/slurm/ and their integration test (scripts/test.sh asks for it)
set -euo pipefail
cd "$(dirname "$0")/.."

torch2=0
packages=(
  build-essential g++ cmake ninja-build pkg-config git ca-certificates time
  ccache  # scripts/test.sh: the stages share what they compile alike
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
    --torch2) packages+=(python3-venv); torch2=1 ;;
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

# torch 2.11.0+cu130: the version and CUDA of the GPU machines, so that what CI compiles and
# tests is what runs there. Only the wheel itself comes from PyPI (--no-deps): the CUDA 13
# toolkit, cuDNN and NCCL it links against are installed with the machine (/usr/local/cuda), and
# of the CUDA libraries libtorch_cuda.so loads, only cuSPARSELt, NVSHMEM and cuFile are missing
# there; they come from PyPI at the versions torch 2.11.0 pins. Beside it, megatron-core (also
# --no-deps) and the Python packages torch and it import, for the check that megatron-core accepts
# `tessera export` (scripts/check-megatron-export.py).
install_torch2() {
  local venv=.venv-torch2 version=2.11.0
  if [[ -x $venv/bin/python ]] &&
    [[ $("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("torch"))' 2>/dev/null) == "$version"* ]]; then
    echo "setup: torch $version present in $venv"
  else
    echo "setup: installing torch $version (CUDA 13.0) into $venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --no-deps "torch==$version" nvidia-cusparselt-cu13==0.8.0 \
      nvidia-nvshmem-cu13==3.4.5 nvidia-cufile==1.15.1.6
    echo "setup: torch $version in $venv"
  fi
  if "$venv/bin/python" -c 'import importlib.metadata as m; assert m.version("megatron-core") == "0.16.1"; import typing_extensions, sympy, networkx, jinja2, fsspec, filelock, numpy, packaging' 2>/dev/null; then
    echo "setup: megatron-core 0.16.1 present in $venv"
    return
  fi
  "$venv/bin/pip" install -q --no-deps megatron-core==0.16.1 typing_extensions==4.16.0 \
    sympy==1.14.0 mpmath==1.3.0 networkx==3.6.1 Jinja2==3.1.6 MarkupSafe==3.0.4 \
    fsspec==2026.9.0 filelock==4.3.1 numpy==2.4.6 packaging==26.4
  echo "setup: megatron-core 0.16.1 in $venv"
}

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "setup: all ${#packages[@]} packages present"
else
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
fi
[[ $torch2 -eq 0 ]] || install_torch2
