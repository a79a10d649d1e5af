#!/usr/bin/env bash
# Rewrites the generated blocks of the docs: every block between
#   <!-- generated: tessera ARGS -->          (the output of `tessera ARGS`)
#   <!-- generated: bench NAME table N -->    (the N-th markdown table `scripts/bench.sh NAME` prints)
# and
#   <!-- end generated -->
# in docs/*.md and README.md, run from the repository root (the arguments' globs expanded there).
# Bench blocks are kept for benchmarks that take seconds (their figures are deterministic).
# Usage: scripts/docs-tables.sh [--check]   (TESSERA names the binary; default build/sim/tessera)
#   --check  write nothing: name every doc whose blocks are not what their commands print now
#            and exit 1 if there is one (the CLI test runs this), else count the blocks
set -euo pipefail
cd "$(dirname "$0")/.."
check=0
[[ ${1:-} == --check ]] && check=1
tessera=${TESSERA:-build/sim/tessera}
[[ -x $tessera ]] || { echo "docs-tables: no $tessera (build it first)" >&2; exit 1; }
benches=$(mktemp -d)
trap 'rm -rf "$benches"' EXIT
# The N-th table (a run of lines starting with '|') of bench NAME's output, each bench run once.
bench_table() {
  local name=$1 n=$2
  [[ -f $benches/$name ]] || TESSERA_BIN=$tessera scripts/bench.sh "$name" >"$benches/$name" 2>/dev/null
  awk -v n="$n" '/^\|/ { if (!inside) { count++; inside = 1 } if (count == n) print; next } { inside = 0 }' \
    "$benches/$name"
}
blocks=0 bench_blocks=0 stale=0
for doc in docs/*.md README.md; do
  grep -q '^<!-- generated: ' "$doc" || continue
  tmp=$(mktemp)
  while IFS= read -r line; do
    if [[ $line =~ ^\<!--\ generated:\ tessera\ (.*)\ --\>$ ]]; then
      printf '%s\n' "$line"
      # shellcheck disable=SC2086  # the arguments' globs expand here, as the block says
      "$tessera" ${BASH_REMATCH[1]} 2>/dev/null
      skipping=1
      blocks=$((blocks + 1))
    elif [[ $line =~ ^\<!--\ generated:\ bench\ ([a-z-]+)\ table\ ([0-9]+)\ --\>$ ]]; then
      printf '%s\n' "$line"
      bench_table "${BASH_REMATCH[1]}" "${BASH_REMATCH[2]}"
      skipping=1
      blocks=$((blocks + 1)) bench_blocks=$((bench_blocks + 1))
    elif [[ $line == '<!-- end generated -->' ]]; then
      printf '%s\n' "$line"
      skipping=0
    elif [[ ${skipping:-0} == 0 ]]; then
      printf '%s\n' "$line"
    fi
  done <"$doc" >"$tmp"
  if cmp -s "$tmp" "$doc"; then
    :
  elif [[ $check == 1 ]]; then
    echo "docs-tables: $doc is stale:"
    diff "$doc" "$tmp" || true
    stale=$((stale + 1))
  else
    cat "$tmp" >"$doc" && echo "docs-tables: rewrote $doc"
  fi
  rm "$tmp"
done
if [[ $check == 1 ]]; then
  [[ $stale == 0 ]] || exit 1
  echo "docs-tables: $blocks blocks, $bench_blocks of them from benches, every one current"
fi
