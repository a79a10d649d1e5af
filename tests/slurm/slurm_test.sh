#!/usr/bin/env bash
# Integration test of the Slurm batch scripts on a private one-node cluster
# (scripts/slurm/local-cluster.sh): a sweep submitted as a 3-task job array plus a merge must
# rank exactly as the unsharded sweep does, a 2-rank training job started by srun must reach
# the losses of the same plan launched by tessera-train itself, and `tessera tune --slurm` must
# train its finalists as job arrays.
# Usage: slurm_test.sh SOURCE_DIR TESSERA TESSERA_TRAIN. Exit 77 (skipped) without root or Slurm.
set -euo pipefail
src=$1
export TESSERA=$2 TESSERA_TRAIN=$3
fail() {
  echo "slurm test: $*" >&2
  exit 1
}
if [[ $(id -u) -ne 0 ]] || ! command -v slurmctld >/dev/null; then
  echo "slurm test: skipped (needs root and scripts/setup.sh --slurm)"
  exit 77
fi
work=$(mktemp -d /tmp/tessera-slurm.XXXXXX)
cleanup() {
  "$src/scripts/slurm/local-cluster.sh" stop "$work/cluster" || true
  rm -rf "$work"
}
trap cleanup EXIT
"$src/scripts/slurm/local-cluster.sh" start "$work/cluster"
export SLURM_CONF=$work/cluster/slurm.conf
scenario=$src/scenarios/cpu-tiny.json

# Submit: the sweep array and its merge, and a training job of the scenario's 2-rank plan.
submitted=$("$src/scripts/slurm/submit-sweep.sh" 3 "$work/sweep" "$scenario")
echo "$submitted"
array=$(sed -E 's/^sweep array ([0-9]+), merge ([0-9]+)$/\1/' <<<"$submitted")
merge=$(sed -E 's/^sweep array ([0-9]+), merge ([0-9]+)$/\2/' <<<"$submitted")
[[ $array =~ ^[0-9]+$ && $merge =~ ^[0-9]+$ ]] || fail "unexpected submit output: $submitted"
train=$(sbatch --parsable --ntasks=2 --output="$work/train.log" \
  "$src/scripts/slurm/train.sbatch" "$scenario" --steps 3 --out "$work/train")

# Wait for the queue to drain, then every job (each array task too) must have completed.
deadline=$((SECONDS + 600))
while [[ -n $(squeue -h -o %i) ]]; do
  ((SECONDS < deadline)) || fail "jobs still queued after 600 s: $(squeue)"
  sleep 1
done
for job in "$array" "$merge" "$train"; do
  states=$(scontrol -o show job "$job" | grep -o 'JobState=[A-Z_]*' | sort -u)
  if [[ $states != JobState=COMPLETED ]]; then
    for log in "$work"/sweep/logs/*.log "$work/train.log"; do
      [[ -f $log ]] && { echo "--- $log"; cat "$log"; }
    done
    fail "job $job ended $states"
  fi
done
[[ $(scontrol -o show job "$array" | wc -l) -eq 3 ]] || fail "the array did not run 3 tasks"

# The merged shards rank as the unsharded sweep does (without the second stage, which a shard
# cannot run: it needs the whole first ranking).
"$TESSERA" sweep "$scenario" --refine 0 --out "$work/full" >/dev/null 2>&1 ||
  fail "unsharded sweep failed"
cmp "$work/full/results.csv" "$work/sweep/merged/results.csv" ||
  fail "merged results.csv differs from the unsharded sweep's"
cmp <(sort "$work/full/results.jsonl") <(sort "$work/sweep/merged/results.jsonl") ||
  fail "merged results.jsonl holds other rows than the unsharded sweep's"
[[ -f $work/sweep/merged/report.html ]] || fail "no merged report"

# srun's two workers reach the losses of tessera-train's own launch, bit for bit.
"$TESSERA_TRAIN" "$scenario" --steps 3 --out "$work/local" >/dev/null || fail "local training failed"
[[ $(jq '.memory_per_rank | length' "$work/train/run.json") -eq 2 ]] ||
  fail "run.json of the Slurm job does not record 2 ranks"
cmp <(jq -c .loss "$work/train/loss.jsonl") <(jq -c .loss "$work/local/loss.jsonl") ||
  fail "losses under srun differ from the local launch"
[[ $(wc -l <"$work/train/loss.jsonl") -eq 3 ]] || fail "expected 3 steps of losses"
# tessera tune --slurm: the finalists trained as a job array per rank count, then calibrated.
TESSERA_SLURM_SCRIPTS=$src/scripts/slurm "$TESSERA" tune "$scenario" --gpus 2 --top 2 --steps 3 \
  --slurm --train "$TESSERA_TRAIN" --out "$work/tune" >"$work/tune.txt" 2>"$work/tune.log" ||
  { cat "$work/tune.log"; fail "tune --slurm failed"; }
grep -q "submitted job array" "$work/tune.log" || fail "tune --slurm submitted no job array"
[[ $(jq '[.finalists[] | select(.status == "measured")] | length' "$work/tune/tune.json") -eq 2 ]] ||
  fail "tune --slurm did not measure 2 finalists: $(cat "$work/tune.txt")"
[[ $(jq '.recommended.measured_s > 0' "$work/tune/tune.json") == true ]] ||
  fail "tune --slurm did not measure its choice"
ls "$work"/tune/slurm/logs/round1-ranks*-1.log >/dev/null || fail "no job array task logs"
echo "slurm test: sweep array + merge equal the unsharded sweep; srun training equals local;" \
  "tune trains its finalists as job arrays"
