#!/usr/bin/env bash
# Fails (exit 1, naming the file and the include) when a file under shared/ includes a header
# from a layer above its own: the include graph of shared/ points one way, from top to bottom.
# Run by ctest as the `layers` test.
set -euo pipefail
cd "$(dirname "$0")/.."
# Bottom to top. A folder may include its own headers and those of folders listed before it.
layers=(base program spec model layout cost lowering search records)
declare -A rank
for i in "${!layers[@]}"; do rank[${layers[$i]}]=$i; done
bad=0
checked=0
for dir in shared/*/; do
  folder=$(basename "$dir")
  if [[ -z ${rank[$folder]+set} ]]; then
    echo "check-layers: shared/$folder is not in the layer list of $0" >&2
    bad=1
    continue
  fi
  for f in "$dir"*.hpp "$dir"*.cpp; do
    [[ -e $f ]] || continue
    while IFS= read -r used; do
      checked=$((checked + 1))
      if [[ -z ${rank[$used]+set} ]]; then
        echo "check-layers: $f includes from shared/$used, which is not a layer" >&2
        bad=1
      elif ((rank[$used] > rank[$folder])); then
        echo "check-layers: $f ($folder) includes shared/$used/, a layer above it" >&2
        bad=1
      fi
    done < <(sed -n 's|^#include "shared/\([a-z_]*\)/.*|\1|p' "$f")
  done
done
if ls shared/*.hpp shared/*.cpp >/dev/null 2>&1; then
  echo "check-layers: files directly under shared/ belong in a layer folder" >&2
  bad=1
fi
((bad == 0)) || exit 1
echo "check-layers: ${#layers[@]} layers, $checked includes, all pointing down"
