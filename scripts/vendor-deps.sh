#!/usr/bin/env bash
# Copies the header-only dependencies (nlohmann_json, cxxopts, Eigen, doctest) with their CMake
# package files from this Debian machine into a git-ignored prefix, default third_party/prefix,
# for a machine that has no package registry (the GPU machine). There:
#   cmake -S . -B build-cuda -G Ninja -DTESSERA_BUILD_SIM=OFF \
#     -DCMAKE_PREFIX_PATH="$PWD/third_party/prefix;$(python3 -c 'import os, torch; print(os.path.dirname(torch.__file__))')"
# The package files locate their headers relative to themselves, so the prefix can move.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=${1:-third_party/prefix}
copy() {  # copy SRC into DEST/REL (a file or a folder)
  local src=$1 rel=$2
  [[ -e $src ]] || { echo "vendor-deps: $src is missing (run scripts/setup.sh)" >&2; exit 1; }
  mkdir -p "$dest/$(dirname "$rel")"
  rm -rf "${dest:?}/$rel"
  cp -r "$src" "$dest/$rel"
}
copy /usr/include/nlohmann include/nlohmann
copy /usr/share/cmake/nlohmann_json share/cmake/nlohmann_json
copy /usr/include/cxxopts.hpp include/cxxopts.hpp
copy /usr/lib/cmake/cxxopts lib/cmake/cxxopts
copy /usr/include/eigen3 include/eigen3
copy /usr/share/eigen3/cmake share/eigen3/cmake
copy /usr/include/doctest include/doctest
copy /usr/lib/cmake/doctest lib/cmake/doctest
echo "vendored into $dest ($(du -sh "$dest" | cut -f1))"
