#!/usr/bin/env bash
# Everything a GPU run of the executor needs, on a machine with a GPU and no package registry, in
# stages that each finish in well under 10 minutes and write their results before the next
# starts (an interrupted run keeps what the finished stages wrote).
# Usage: scripts/gpu-check.sh [--device cuda|cpu] [--out DIR] [stage...]
#   build   configures and builds tessera-train and the gpu tests with every core, against the
#           torch that python3 imports (the GPU machine's) or .venv-torch2 (scripts/setup.sh
#           --torch2), and the header-only dependencies of third_party/prefix where
#           scripts/vendor-deps.sh put them (else the system's)
#   matmul  the measured dense bf16 matrix-product rate (tessera-train matmul-rate): MFU's
#           measured ceiling, beside the datasheet peak of the device file
#   gemm    the rates behind the cost model's GEMM constants (scripts/gemm-rates.py): bf16 and
#           FP8 products (per-tensor, per-row and per-block scales) at the matmul stage's size,
#           and grouped products (8 experts, 64 to 4,096 tokens each; bf16, and FP8 with a scale
#           per token and per expert column) beside one dense product of their tokens, into
#           gemm.jsonl
#   gpu     the gpu tests: the tiny models on the device against the CPU (fp32 within 1e-4,
#           bf16 within 1e-2, never NaN) and the parallel plans on the device against its one rank
#   bench   recorded runs of the ~1B- and ~3B-class VLMs (scenarios/gpu/): micro-batch sizes and
#           sequence lengths, the encoder frozen and trainable; a table of step time, tokens/s,
#           model TFLOP/s and MFU against the measured rate and the datasheet peak
#   profile the fastest recorded run of the ~1B VLM again, one step under torch's profiler
#           (tessera-train --profile-step): GPU busy share and kernel time by kind and by name
#           (scripts/profile-summary.py), the trace gzipped beside it
#   copies  mixed precision's working copies against a cast at every use (--no-working-copies):
#           the ~1B VLM in bf16 at the middle sequence length and micro-batch 1, encoder frozen
#           and trainable, the two arms alternated on the same machine; the median steps, their
#           ratio and the peaks into copies.tsv, then one profiled step of each with the copies
#   uploads the micro-batches' inputs sent from pinned memory without waiting against copies from
#           pageable memory (TESSERA_SYNC_UPLOADS=1), on the copies stage's two runs, alternated;
#           the median steps, their ratio and the peaks into uploads.tsv
#   ab      this executor against another (TESSERA_TRAIN_B: an earlier commit's tessera-train,
#           built against the same torch and carried beside this one) on the copies stage's two
#           runs, alternated; the median steps, their ratio and the peaks into ab.tsv; then one
#           profiled step of each executor on each run, and the host operators and kernels whose
#           time differs most between the two (ab-compare-<run>.txt); then a traced run of each,
#           compared op by op: durations and the gaps between ops on the GPU's clock
#           (scripts/trace-compare.py, ab-ops-<run>.txt). AB_THIS_FLAGS: flags
#           for this executor alone (say --no-working-copies, to set it beside an executor that
#           predates them). Run only when named.
#   model   the recorded runs against the cost model: `tessera replay` uncalibrated (per step and
#           per op class), `tessera calibrate` on half the runs, `tessera replay --profile` on
#           all. Needs the SimGrid build's `tessera` (TESSERA_BIN, default build/sim/tessera);
#           without it the stage says which commands to run where it is.
# Stages default to all but ab, in that order. --device cpu is the dry run: the same stages on the
# tiny scenarios on the CPU, which CI runs (scripts/test.sh --torch2) so that the script cannot
# rot while no GPU is lent.
# Results: DIR (default out/gpu-check-<device>) holds each stage's log, matmul.json, bench.tsv
# and model/; recorded runs go to traces/<gpu>/ on a GPU (TRACES overrides) and DIR/runs on the
# CPU.
set -euo pipefail
cd "$(dirname "$0")/.."

device=cuda
out=""
stages=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --device) device=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    build|matmul|gemm|gpu|bench|profile|copies|uploads|ab|model) stages+=("$1"); shift ;;
    *) echo "gpu-check: unknown argument $1 (stages: build matmul gemm gpu bench profile copies uploads ab model)" >&2; exit 2 ;;
  esac
done
[[ $device == cuda || $device == cpu ]] || { echo "gpu-check: --device cuda or cpu" >&2; exit 2; }
[[ ${#stages[@]} -gt 0 ]] || stages=(build matmul gemm gpu bench profile copies uploads model)
out=${out:-out/gpu-check-$device}
build=${TESSERA_BUILD_DIR:-build-gpu}
mkdir -p "$out"
out=$(cd "$out" && pwd)

# What each device runs: the real shapes on a GPU, the tiny ones on the CPU.
if [[ $device == cuda ]]; then
  small=scenarios/gpu/vlm-1b-h100.json large=scenarios/gpu/vlm-3b-h100.json
  image_tokens=576 image_size=336
  seqs=${BENCH_SEQS:-"1024 2048 4096"} mbs=${BENCH_MBS:-"1 2 4 8"}
  large_mbs=${BENCH_LARGE_MBS:-"1 2"} steps=${BENCH_STEPS:-12}
  gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || true)
  # The scenarios name the H100; on an H200 the runs name the H200 they ran on.
  case $gpu_name in
    *H200*)
      traces=${TRACES:-traces/h200} gpu_tag=h200 cluster=scenarios/clusters/h200-1.json
      peak_file=scenarios/devices/h200-sxm-141gb.json
      ;;
    *)
      traces=${TRACES:-traces/h100} gpu_tag=h100 cluster=
      peak_file=scenarios/devices/h100-sxm5-80gb.json
      ;;
  esac
  peak_key=bf16
  matmul_n=8192
else
  small=scenarios/cpu-tiny.json large=scenarios/cpu-tiny-big-vit.json
  image_tokens=16 image_size=32
  seqs=${BENCH_SEQS:-"64 128"} mbs=${BENCH_MBS:-"1 2"} large_mbs=${BENCH_LARGE_MBS:-"1"}
  steps=${BENCH_STEPS:-4}
  traces=${TRACES:-$out/runs} gpu_tag= cluster=
  peak_file=scenarios/clusters/cpu-local.json peak_key=fp32
  matmul_n=256
fi
train=$build/exec/tessera-train
# On a GPU machine of 8 cores or more the recorded runs get four cores of their own: a host-bound
# step (micro-batch 1) varied by ±9% from step to step unpinned and by ±3% pinned on one H200
# lease, alike pinned or not on an H100 lease (docs/PERFORMANCE.md, "Pinning").
pin=()
if [[ $device == cuda ]] && command -v taskset >/dev/null && (($(nproc) >= 8)); then
  pin=(taskset -c 4-7)
fi

# The torch to build against: python3's (the GPU machine's image), else the project's venv. The
# package folder, not its share/cmake: its lib/ is then searched before the system's (where
# Debian's LibTorch 1.13 may be).
torch_prefix() {
  python3 -c 'import os, torch; print(os.path.dirname(torch.__file__))' 2>/dev/null && return
  local venv
  venv=$(echo "$PWD"/.venv-torch2/lib/python3*/site-packages/torch)
  [[ -d $venv ]] || { echo "gpu-check: no torch (python3 has none; run scripts/setup.sh --torch2)" >&2; exit 1; }
  echo "$venv"
}

# libtorch_cuda.so loads the CUDA toolkit's libraries; on the development machine they are in
# /usr/local/cuda (its cuDNN and NCCL beside them), on the GPU machine beside torch.
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# A build carried from another machine finds the torch libraries of python3's torch here.
if torch_lib=$(python3 -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))' 2>/dev/null); then
  export LD_LIBRARY_PATH=$torch_lib:$LD_LIBRARY_PATH
fi

stage_build() {
  local prefix
  prefix=$(torch_prefix)
  [[ -d third_party/prefix ]] && prefix="$PWD/third_party/prefix;$prefix"
  local cuda=()
  [[ -d /usr/local/cuda ]] && cuda=(-DCUDAToolkit_ROOT=/usr/local/cuda)
  # Hopper (sm_90): the GPUs lent here; naming it skips torch's probing of the machine's GPUs.
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTESSERA_BUILD_SIM=OFF \
    -DTORCH_CUDA_ARCH_LIST=9.0 -DCMAKE_PREFIX_PATH="$prefix" "${cuda[@]}"
  cmake --build "$build" --parallel "$(nproc)" --target tessera-train tessera_gpu_tests
}

stage_matmul() {
  local dtype=bf16
  [[ $device == cpu ]] && dtype=fp32
  "$train" matmul-rate --device "$device" --dtype "$dtype" --size "$matmul_n" | tee "$out/matmul.json"
}

stage_gemm() {
  local python=python3 quick=()
  python3 -c 'import torch' 2>/dev/null || python=.venv-torch2/bin/python
  [[ $device == cpu ]] && quick=(--quick)
  "$python" scripts/gemm-rates.py --device "$device" --size "$matmul_n" "${quick[@]}" \
    --out "$out/gemm.jsonl"
}

stage_gpu() {
  # The paths the tests were built with may not exist here (a build carried from another
  # machine): name this checkout and its tessera-train.
  TESSERA_TEST_DEVICE=$device TESSERA_SOURCE_DIR=$PWD TESSERA_TRAIN_BIN="$(realpath "$train")" \
    "$build/tests/tessera_gpu_tests"
}

# The runs' name for scenario file $1: its own, with the GPU it ran on.
run_base() {
  local b
  b=$(basename "$1" .json)
  [[ -n $gpu_tag ]] && b=${b/h100/$gpu_tag}
  echo "$b"
}

# The scenario `base` with one image of image_size and seq - image_tokens text tokens per sample
# (so every sample is seq long), the encoder frozen or trainable, and micro-batches of `mb`
# samples, 8 samples per step, in the model's dtype or `dtype`: written to
# $out/scenarios/NAME.json.
variant() {
  local base=$1 name=$2 seq=$3 mb=$4 frozen=$5 dtype=${6:-}
  mkdir -p "$out/scenarios"
  python3 - "$base" "$out/scenarios/$name.json" "$seq" "$mb" "$frozen" "$image_tokens" \
    "$image_size" "${cluster:+$PWD/$cluster}" "$dtype" <<'EOF'
import json, os, sys
base, dest, seq, mb, frozen, image_tokens, image_size, cluster, dtype = sys.argv[1:]
seq, mb, image_tokens, image_size = int(seq), int(mb), int(image_tokens), int(image_size)
s = json.load(open(base))
here = os.path.dirname(os.path.abspath(base))
for key in ("model", "cluster", "workload"):
    if isinstance(s.get(key), str):
        s[key] = os.path.join(here, s[key])
if cluster:
    s["cluster"] = cluster
if isinstance(s["model"], str):
    s["model"] = json.load(open(s["model"]))
for m in s["model"]["modules"]:
    if m["role"] == "encoder":
        m["frozen"] = frozen == "frozen"
if dtype:
    s["model"]["dtype"] = dtype
s["name"] = os.path.basename(dest)[:-5]
s["workload"] = {"global_batch": 8, "max_seq_len": seq, "packing": False, "seed": 1,
                 "samples": {"text_tokens": seq - image_tokens,
                             "image": {"count": 1, "width": image_size, "height": image_size}}}
s["plan"] = {"placement": "homogeneous", "layout": {"tp": 1, "pp": 1, "dp": 1},
             "micro_batch_size": mb, "num_micro_batches": 8 // mb, "schedule": "1f1b"}
json.dump(s, open(dest, "w"), indent=1)
EOF
}

# One recorded run: `steps` steps, the first 4 traced, into $traces/NAME. A run that fails (out
# of memory, say) leaves no folder; its name and reason go to $out/failed.txt.
record() {
  local name=$1
  rm -rf "${traces:?}/$name"
  mkdir -p "$traces"
  if "${pin[@]}" "$train" "$out/scenarios/$name.json" --device "$device" --steps "$steps" --trace-steps 4 \
    --no-checkpoint --out "$traces/$name" 2>"$out/$name.err"; then
    rm -f "$out/$name.err"
    return 0
  fi
  rm -rf "${traces:?}/$name"
  printf '%s\t%s\n' "$name" "$(grep -m1 -o 'out of memory\|rank [0-9]*: .*' "$out/$name.err" | cut -c1-100)" \
    >>"$out/failed.txt"
  return 1
}

# A table, aligned where the machine has `column`.
aligned() {
  if command -v column >/dev/null; then column -t -s $'\t' "$1"; else cat "$1"; fi
}

stage_bench() {
  local names=()
  rm -f "$out/failed.txt"
  for seq in $seqs; do
    for mb in $mbs; do
      name=$(run_base "$small")-s$seq-m$mb
      variant "$small" "$name" "$seq" "$mb" frozen && record "$name" && names+=("$name")
    done
  done
  local seq_mid
  seq_mid=$(echo "$seqs" | awk '{print $(int((NF + 1) / 2))}')
  name=$(run_base "$small")-s$seq_mid-m1-trainable-encoder
  variant "$small" "$name" "$seq_mid" 1 trainable && record "$name" && names+=("$name")
  for mb in $large_mbs; do
    name=$(run_base "$large")-s$seq_mid-m$mb
    variant "$large" "$name" "$seq_mid" "$mb" frozen && record "$name" && names+=("$name")
  done
  printf '%s\n' "${names[@]}" >"$out/runs.txt"
  summarize_bench
}

# Per run: the median step of those after the first two, tokens/s, model TFLOP/s and MFU against
# the measured rate (matmul stage) and the datasheet peak.
summarize_bench() {
  python3 - "$traces" "$out/runs.txt" "$out/matmul.json" "$peak_file" "$peak_key" \
    >"$out/bench.tsv" <<'EOF'
import json, statistics, sys
traces, runs, matmul, peak_file, key = sys.argv[1:]
try:
    measured = json.load(open(matmul))["flops_per_s"]
except (OSError, ValueError, KeyError):
    measured = float("nan")
d = json.load(open(peak_file))
peak = (d.get("device", d) if isinstance(d.get("device"), dict) else d)["peak_flops"][key]
print("run\tstep_s\ttokens_per_s\tmodel_tflops\tmfu_measured\tmfu_datasheet")
for name in open(runs).read().split():
    steps = [json.loads(l) for l in open(f"{traces}/{name}/loss.jsonl")]
    warm = steps[2:] or steps
    step = statistics.median(s["step_s"] for s in warm)
    tokens = statistics.median(s["llm_tokens"] for s in warm)
    flops = statistics.median(s["model_flops"] for s in warm)
    print(f"{name}\t{step:.4f}\t{tokens / step:.0f}\t{flops / step / 1e12:.2f}\t"
          f"{flops / step / measured:.3f}\t{flops / step / peak:.3f}")
EOF
  aligned "$out/bench.tsv"
  if [[ -s $out/failed.txt ]]; then
    echo "runs that failed:"
    cat "$out/failed.txt"
  fi
}

# The fastest 1B run of the bench (tokens/s), again, its fourth step under torch's profiler.
stage_profile() {
  [[ -f $out/bench.tsv ]] || { echo "profile: no bench.tsv: run the bench stage"; return 1; }
  local name
  name=$(awk -F'\t' -v base="$(run_base "$small")" \
    'NR > 1 && index($1, base) == 1 && $3 > best { best = $3; name = $1 } END { print name }' \
    "$out/bench.tsv")
  [[ -n $name ]] || { echo "profile: no run of $(run_base "$small") in bench.tsv"; return 1; }
  echo "profile of $name, step 4:"
  profile_step "$name" "$out/profile" 14 "$out/profile.txt"
}

# Run NAME for four steps, the fourth under torch's profiler, into DIR; its summary (the TOP
# kernels) into SUMMARY and on the terminal, the trace gzipped beside it. BIN, if given, is the
# tessera-train to run (default this build's), with the flags that follow it.
profile_step() {
  local name=$1 dir=$2 top=$3 summary=$4 bin=${5:-$train}
  local flags=("${@:6}")
  rm -rf "$dir"
  "$bin" "$out/scenarios/$name.json" --device "$device" --steps 4 --trace-steps 0 \
    --profile-step 3 --no-checkpoint "${flags[@]}" --out "$dir" >/dev/null
  python3 scripts/profile-summary.py "$dir/profile/rank0.json" --top "$top" | tee "$summary"
  gzip -f "$dir/profile/rank0.json"
}

# The two runs that the A/B stages compare: the ~1B VLM in bf16 at the middle sequence length and
# micro-batch 1, encoder frozen and trainable (host-bound steps, where executor changes show).
# Sets ab_names.
ab_scenarios() {
  local seq_mid
  seq_mid=$(echo "$seqs" | awk '{print $(int((NF + 1) / 2))}')
  ab_names=()
  for encoder in frozen trainable; do
    local name
    name=$(run_base "$small")-s$seq_mid-m1-$encoder-bf16
    variant "$small" "$name" "$seq_mid" 1 "$encoder" bf16
    ab_names+=("$name")
  done
}

# Each arm of an A/B twice, alternated (a, b, b, a) so that a drift of the host falls on both: arm
# a runs $bin_a with the flags of flags_a and the environment of env_a (NAME=value words, none
# unless set), arm b likewise, into DIR/<run>-<arm>-<i>. Then per arm
# the median of the steps after the first two of both its runs, the allocator's peak, and the
# last loss of its first run, into DIR.tsv under the arms' labels (equal losses on the CPU; on a
# GPU as close as two runs of one arm, whose reductions are not deterministic).
alternate() {
  local dir=$1 label_a=$2 label_b=$3
  rm -rf "${out:?}/$dir"
  mkdir -p "$out/$dir"
  for name in "${ab_names[@]}"; do
    local i=0
    for arm in a b b a; do
      local bin=$bin_a flags=("${flags_a[@]}") envs=("${env_a[@]}")
      [[ $arm == b ]] && bin=$bin_b flags=("${flags_b[@]}") envs=("${env_b[@]}")
      env "${envs[@]}" "${pin[@]}" "$bin" "$out/scenarios/$name.json" --device "$device" --steps "$steps" \
        --trace-steps 0 --no-checkpoint "${flags[@]}" --out "$out/$dir/$name-$arm-$((i++))" >/dev/null
    done
  done
  python3 - "$out/$dir" "$label_a" "$label_b" "${ab_names[@]}" >"$out/$dir.tsv" <<'EOF'
import glob, json, statistics, sys
folder, label_a, label_b, names = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
def arm(name, which):
    runs = sorted(glob.glob(f"{folder}/{name}-{which}-*"))
    steps = [[json.loads(l) for l in open(f"{r}/loss.jsonl")] for r in runs]
    times = [s["step_s"] for run in steps for s in (run[2:] or run)]
    memory = json.load(open(f"{runs[0]}/run.json"))["memory_per_rank"][0]
    peak = memory.get("gpu_peak_allocated_bytes", memory.get("peak_rss_bytes", 0)) / 1e9
    return statistics.median(times), steps[0][-1]["loss"], peak
print(f"run\t{label_a}_s\t{label_b}_s\tratio\tloss_{label_a}\tloss_{label_b}"
      f"\tpeak_{label_a}_gb\tpeak_{label_b}_gb")
for name in names:
    (a, la, pa), (b, lb, pb) = arm(name, "a"), arm(name, "b")
    print(f"{name}\t{a:.4f}\t{b:.4f}\t{b / a:.3f}\t{la:.6f}\t{lb:.6f}\t{pa:.2f}\t{pb:.2f}")
EOF
  aligned "$out/$dir.tsv"
}

# Working copies (a) against a cast at every use (b), then one profiled step of each run with the
# copies: kernels, host operators and the GPU's busy share (copies-profile-<run>.txt).
stage_copies() {
  ab_scenarios
  local bin_a=$train bin_b=$train flags_a=() flags_b=(--no-working-copies) env_a=() env_b=()
  alternate copies with_copies cast_per_use
  for name in "${ab_names[@]}"; do
    echo "profile of $name with the copies, step 4:"
    profile_step "$name" "$out/copies/$name-profiled" 8 "$out/copies-profile-$name.txt"
  done
}

# Uploads from pinned memory without waiting (a) against copies from pageable memory, each a wait
# for the GPU's queue (b: TESSERA_SYNC_UPLOADS=1), the same binary on the copies stage's runs.
stage_uploads() {
  ab_scenarios
  local bin_a=$train bin_b=$train flags_a=() flags_b=() env_a=() env_b=(TESSERA_SYNC_UPLOADS=1)
  alternate uploads pinned synchronous
}

# This executor (a) against another (b: TESSERA_TRAIN_B, say an earlier commit's tessera-train
# built against the same torch and carried beside this one), on the same runs, same flags.
stage_ab() {
  local other=${TESSERA_TRAIN_B:-}
  [[ -n $other && -x $other ]] || {
    echo "ab: TESSERA_TRAIN_B names no executable (the other tessera-train to compare)"
    return 1
  }
  ab_scenarios
  local bin_a=$train bin_b=$other flags_a=() flags_b=() env_a=() env_b=()
  read -ra flags_a <<<"${AB_THIS_FLAGS:-}"
  alternate ab this other
  # One profiled step of each executor on each run, and what differs between the two by name:
  # host operators by self time, kernels by time (ab-compare-<run>.txt).
  for name in "${ab_names[@]}"; do
    profile_step "$name" "$out/ab/$name-this-profiled" 8 "$out/ab-profile-$name-this.txt" \
      "$train" "${flags_a[@]}" >/dev/null
    profile_step "$name" "$out/ab/$name-other-profiled" 8 "$out/ab-profile-$name-other.txt" \
      "$other" >/dev/null
    echo "$name, one profiled step, this executor against the other:"
    python3 scripts/profile-summary.py "$out/ab/$name-this-profiled/profile/rank0.json.gz" \
      --compare "$out/ab/$name-other-profiled/profile/rank0.json.gz" --top 12 |
      tee "$out/ab-compare-$name.txt"
  done
  # One traced run of each (8 steps, every one traced: op times on the CUDA events at op
  # boundaries), compared op by op after the first two steps: each lane's busy time and the gaps
  # between its ops, and the ops whose duration or gap before differs most (ab-ops-<run>.txt):
  # where the unprofiled step's difference lies when the profiles agree.
  for name in "${ab_names[@]}"; do
    for arm in this other; do
      local bin=$train flags=("${flags_a[@]}")
      [[ $arm == other ]] && bin=$other flags=()
      rm -rf "${out:?}/ab/$name-$arm-traced"
      "${pin[@]}" "$bin" "$out/scenarios/$name.json" --device "$device" --steps 8 --trace-steps 8 \
        --no-checkpoint "${flags[@]}" --out "$out/ab/$name-$arm-traced" >/dev/null
    done
    echo "$name, traced steps 3-8, this executor (A) against the other (B):"
    python3 scripts/trace-compare.py "$out/ab/$name-this-traced" "$out/ab/$name-other-traced" \
      --skip 2 | tee "$out/ab-ops-$name.txt"
  done
}

stage_model() {
  local tessera=${TESSERA_BIN:-build/sim/tessera}
  if [[ ! -x $tessera ]]; then
    echo "model: no tessera binary (the SimGrid build) here; on the development machine, with"
    echo "the recorded runs of $traces fetched, run:"
    echo "  scripts/gpu-check.sh --device $device model   (TRACES=$traces)"
    return 0
  fi
  [[ -f $out/runs.txt ]] || { echo "model: no recorded runs ($out/runs.txt): run the bench stage"; return 1; }
  mkdir -p "$out/model"
  local runs=() fit=() i=0
  mapfile -t runs <"$out/runs.txt"
  for name in "${runs[@]}"; do
    "$tessera" replay "$traces/$name" >"$out/model/$name.uncalibrated.txt"
    # Every second run fits the profile; the others are held out.
    ((i++ % 2 == 0)) && fit+=("$traces/$name")
  done
  "$tessera" calibrate "${fit[@]}" -o "$out/model/profile.json" >"$out/model/calibrate.txt"
  for name in "${runs[@]}"; do
    "$tessera" replay "$traces/$name" --profile "$out/model/profile.json" \
      >"$out/model/$name.calibrated.txt"
  done
  echo "run  uncalibrated  calibrated  (mean |step time error| over the warm iterations)"
  for name in "${runs[@]}"; do
    local role=held-out
    [[ " ${fit[*]} " == *" $traces/$name "* ]] && role=fitting
    printf '%s (%s)  %s  %s\n' "$name" "$role" \
      "$(grep -o 'mean |error| [-0-9.]*%' "$out/model/$name.uncalibrated.txt" | head -1)" \
      "$(grep -o 'mean |error| [-0-9.]*%' "$out/model/$name.calibrated.txt" | head -1)"
  done | tee "$out/model/summary.txt"
}

for stage in "${stages[@]}"; do
  echo "== gpu-check: $stage ($device) =="
  start=$(date +%s)
  "stage_$stage" 2>&1 | tee "$out/$stage.log"
  echo "== $stage: done in $(($(date +%s) - start)) s; results in $out =="
done
