#!/usr/bin/env bash
# Submits a sweep as a Slurm job array of SHARDS tasks and a merge that runs when all succeed;
# prints the two job ids. The results land in OUT/merged, the jobs' logs in OUT/logs.
#   scripts/slurm/submit-sweep.sh SHARDS OUT scenario.json [tessera sweep options]
# SBATCH_* variables and TESSERA pass through (e.g. SBATCH_PARTITION, TESSERA=build/sim/tessera).
set -euo pipefail
if [[ $# -lt 3 ]] || ! [[ $1 =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: $0 SHARDS OUT scenario.json [tessera sweep options]" >&2
  exit 2
fi
here=$(cd "$(dirname "$0")" && pwd)
shards=$1 out=$2
shift 2
mkdir -p "$out/logs"
array=$(sbatch --parsable --array="1-$shards" --output="$out/logs/shard-%a.log" \
  "$here/sweep.sbatch" "$out" "$@")
array=${array%%;*}  # "id;cluster" on federated clusters
merge=$(sbatch --parsable --dependency="afterok:$array" --output="$out/logs/merge.log" \
  "$here/merge.sbatch" "$out")
echo "sweep array $array, merge ${merge%%;*}"
