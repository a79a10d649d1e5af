#!/usr/bin/env bash
# Rewrites the generated blocks of the docs: every block between
#   <!-- generated: tessera ARGS -->          (the output of `tessera ARGS`)
#   <!-- generated: bench NAME table N -->    (the N-th markdown table `scripts/bench.sh NAME` prints)
#   <!-- generated: long bench NAME table N VAR=VALUE... -->
#                                             (the same, the bench run with those variables set)
# and
#   <!-- end generated -->
# in docs/*.md and README.md, run from the repository root (the arguments' globs expanded there).
# Bench figures are deterministic. Plain bench blocks are for benchmarks that take seconds; long
# ones (minutes to hours) are rerun only with --long and otherwise left as they are.
# Usage: scripts/docs-tables.sh [--check] [--long]   (TESSERA names the binary; default
#        build/sim/tessera)
#   --check  write nothing: name every doc whose blocks are not what their commands print now
#            and exit 1 if there is one (the CLI test runs this), else count the blocks
#   --long   also rerun the long benches' blocks
set -euo pipefail
cd "$(dirname "$0")/.."
check=0 long=0
for arg in "$@"; do
  case $arg in
    --check) check=1 ;;
    --long) long=1 ;;
    *) echo "docs-tables: unknown option $arg" >&2; exit 2 ;;
  esac
done
tessera=${TESSERA:-build/sim/tessera}
[[ -x $tessera ]] || { echo "docs-tables: no $tessera (build it first)" >&2; exit 1; }
benches=$(mktemp -d)
trap 'rm -rf "$benches"' EXIT
# The N-th table (a run of lines starting with '|') of bench NAME's output with the variable
# assignments VARS (shell words) set, each bench and setting run once.
bench_table() {
  local name=$1 n=$2 vars=${3:-} out
  out=$benches/$name$(printf '%s' "$vars" | md5sum | cut -c1-8)
  if [[ ! -f $out ]]; then
    [[ -z $vars ]] || echo "docs-tables: scripts/bench.sh $name with $vars (long)" >&2
    eval "env $vars TESSERA_BIN=\$tessera scripts/bench.sh \$name" >"$out" 2>/dev/null
  fi
  awk -v n="$n" '/^\|/ { if (!inside) { count++; inside = 1 } if (count == n) print; next } { inside = 0 }' \
    "$out"
}
blocks=0 bench_blocks=0 long_blocks=0 stale=0
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
    elif [[ $line =~ ^\<!--\ generated:\ long\ bench\ ([a-z-]+)\ table\ ([0-9]+)(\ .*)?\ --\>$ ]]; then
      printf '%s\n' "$line"
      blocks=$((blocks + 1)) long_blocks=$((long_blocks + 1))
      if [[ $long == 1 ]]; then
        bench_table "${BASH_REMATCH[1]}" "${BASH_REMATCH[2]}" "${BASH_REMATCH[3]# }"
        skipping=1
      fi
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
  if [[ $long == 1 ]]; then
    echo "docs-tables: $blocks blocks, $bench_blocks of them from benches and $long_blocks from long benches, every one current"
  else
    echo "docs-tables: $blocks blocks, $bench_blocks of them from benches, every one current ($long_blocks from long benches not rerun: --long)"
  fi
fi
