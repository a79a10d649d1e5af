#!/usr/bin/env bash
# Rewrites the generated blocks of the docs: every block between
#   <!-- generated: tessera ARGS -->
#   <!-- end generated -->
# in docs/*.md and README.md gets the output of `tessera ARGS`, run from the repository root
# (its globs expanded there). A CLI test fails when a block is not what its command prints now.
# Usage: scripts/docs-tables.sh   (TESSERA names the binary; default build/sim/tessera)
set -euo pipefail
cd "$(dirname "$0")/.."
tessera=${TESSERA:-build/sim/tessera}
[[ -x $tessera ]] || { echo "docs-tables: no $tessera (build it first)" >&2; exit 1; }
for doc in docs/*.md README.md; do
  grep -q '^<!-- generated: tessera ' "$doc" || continue
  tmp=$(mktemp)
  while IFS= read -r line; do
    if [[ $line =~ ^\<!--\ generated:\ tessera\ (.*)\ --\>$ ]]; then
      printf '%s\n' "$line"
      # shellcheck disable=SC2086  # the arguments' globs expand here, as the block says
      "$tessera" ${BASH_REMATCH[1]} 2>/dev/null
      skipping=1
    elif [[ $line == '<!-- end generated -->' ]]; then
      printf '%s\n' "$line"
      skipping=0
    elif [[ ${skipping:-0} == 0 ]]; then
      printf '%s\n' "$line"
    fi
  done <"$doc" >"$tmp"
  if ! cmp -s "$tmp" "$doc"; then cat "$tmp" >"$doc" && echo "docs-tables: rewrote $doc"; fi
  rm "$tmp"
done
