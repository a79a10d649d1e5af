#!/usr/bin/env bash
# Rewrites the generated blocks of the docs: every block between
#   <!-- generated: tessera ARGS -->          (the output of `tessera ARGS`)
#   <!-- generated: bench NAME table N -->    (the N-th markdown table `scripts/bench.sh NAME` prints)
#   <!-- generated: long bench NAME table N VAR=VALUE... -->
#                                             (the same, the bench run with those variables set)
#   <!-- generated: timed bench NAME table N -->
#                                             (the same, of a bench that measures wall-clock time)
# and
#   <!-- end generated -->
# in docs/*.md and README.md, run from the repository root (the arguments' globs expanded there).
# Plain and long bench figures are deterministic. Plain bench blocks are for benchmarks that take
# seconds; long ones (minutes to hours) are rerun only with --long and otherwise left as they are.
# Timed blocks hold what this machine measured when they were last rerun, closed by the date and
# machine of the run: no two runs agree, so --check never compares them (it only asks that each
# holds a run), and they are rerun only when named (--timed NAME), with nothing else running.
# Usage: scripts/docs-tables.sh [--check] [--long] [--long-bench NAME]... [--timed NAME]...
#        (TESSERA names the binary; default build/sim/tessera)
#   --check  write nothing: name every doc whose blocks are not what their commands print now
#            and exit 1 if there is one (the CLI test runs this), else count the blocks
#   --long   also rerun the long benches' blocks
#   --timed NAME  also rerun the timed blocks of bench NAME (repeatable)
#   --long-bench NAME  also rerun the long blocks of bench NAME (repeatable)
set -euo pipefail
cd "$(dirname "$0")/.."
check=0 long=0 timed=" " long_named=" "
while [[ $# -gt 0 ]]; do
  case $1 in
    --check) check=1; shift ;;
    --long) long=1; shift ;;
    --timed)
      [[ $# -ge 2 ]] || { echo "docs-tables: --timed needs a bench name" >&2; exit 2; }
      timed+="$2 "; shift 2 ;;
    --long-bench)
      [[ $# -ge 2 ]] || { echo "docs-tables: --long-bench needs a bench name" >&2; exit 2; }
      long_named+="$2 "; shift 2 ;;
    *) echo "docs-tables: unknown option $1" >&2; exit 2 ;;
  esac
done
[[ $check == 0 || $timed == " " ]] || { echo "docs-tables: --timed rewrites; not with --check" >&2; exit 2; }
[[ $check == 0 || $long_named == " " ]] || { echo "docs-tables: --long-bench rewrites; not with --check" >&2; exit 2; }
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
blocks=0 bench_blocks=0 long_blocks=0 timed_blocks=0 unmeasured_blocks=0 stale=0
# What a timed block says of where it was measured (the block holds it, below its table).
host_line="(Measured $(date -u +%Y-%m-%d) on $(nproc) cores of $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1 | sed 's/ *$//').)"
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
      if [[ $long == 1 || $long_named == *" ${BASH_REMATCH[1]} "* ]]; then
        bench_table "${BASH_REMATCH[1]}" "${BASH_REMATCH[2]}" "${BASH_REMATCH[3]# }"
        skipping=1
      fi
    elif [[ $line =~ ^\<!--\ generated:\ timed\ bench\ ([a-z-]+)\ table\ ([0-9]+)\ --\>$ ]]; then
      printf '%s\n' "$line"
      blocks=$((blocks + 1)) timed_blocks=$((timed_blocks + 1))
      if [[ $timed == *" ${BASH_REMATCH[1]} "* ]]; then
        bench_table "${BASH_REMATCH[1]}" "${BASH_REMATCH[2]}"
        printf '\n%s\n' "$host_line"
        skipping=1
      else
        # Kept as it is, but it must hold a run: a table and the line saying where it was taken.
        unmeasured="bench ${BASH_REMATCH[1]} table ${BASH_REMATCH[2]}" measured_rows=0 measured_line=0
      fi
    elif [[ $line == '<!-- end generated -->' ]]; then
      printf '%s\n' "$line"
      skipping=0
      if [[ -n ${unmeasured:-} && ($measured_rows == 0 || $measured_line == 0) ]]; then
        echo "docs-tables: $doc: the timed block of $unmeasured holds no measurement (rerun it with --timed)" >&2
        unmeasured_blocks=$((unmeasured_blocks + 1))
      fi
      unmeasured=""
    elif [[ ${skipping:-0} == 0 ]]; then
      printf '%s\n' "$line"
      if [[ -n ${unmeasured:-} ]]; then
        [[ $line == '|'* ]] && measured_rows=1
        [[ $line == '(Measured '* ]] && measured_line=1
      fi
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
  [[ $stale == 0 && $unmeasured_blocks == 0 ]] || exit 1
  if [[ $long == 1 ]]; then
    echo "docs-tables: $blocks blocks, $bench_blocks of them from benches and $long_blocks from long benches, every one current ($timed_blocks timings not compared)"
  else
    echo "docs-tables: $blocks blocks, $bench_blocks of them from benches, every one current ($long_blocks from long benches not rerun: --long; $timed_blocks timings not compared)"
  fi
fi
