#!/usr/bin/env bash
# Benchmarks that print figures (never pass/fail). Usage: scripts/bench.sh [lower|dip-search|scale|sim|demo|sweep|comm|cli|exec|moe|moe-ep|reproduce-hetero|reproduce-cornstarch|stage-split|cornstarch-exec|reproduce-variability|variability-exec|published|accuracy|tune|all]
# Builds tessera and tessera-train in $TESSERA_BUILD_DIR (default build/) first; with TESSERA_BIN
# set, times that simulator binary instead and builds nothing.
#   lower  lowering + evaluation of one iteration of a 1024-rank plan with 64 micro-batches
#   dip-search  DIP's per-batch schedule search on one batch of each variability scenario: the
#          candidates scored, the search's time (two runs) and the step it found
#   scale  (not in all) wall time and peak RSS of estimate, simulate and sweep at 1k-8k GPUs: the
#          default plan at 1,024 and 8,192 devices, GPT 530B on 2,520 and 1T on 3,072 A100s (Narayanan et al. 2021);
#          each cut at SCALE_TIMEOUT seconds (default 600)
#   sim    tessera simulate, one iteration of the default plan at 64, 1024 and 8192 devices
#   demo   scripts/demo.sh as a newcomer runs it; its report rendered in headless Chromium: a
#          screenshot, and which of the families and techniques the rendered page shows
#   sweep  the default sweep with -j 1 and -j 2, and a headless-Chromium screenshot of its report
#          (needs the Debian package chromium; skipped without it)
#   comm   the Gloo all-reduce of tessera-train across message sizes (2 ranks on loopback)
#   cli    tessera validate/show on the scenario library
#   exec   tessera-train on scenarios/cpu-tiny.json: single-rank step against a plain LibTorch
#          loop of the same model and batch, tracing on/off — rounds of the three back to back,
#          the median and range of each round's ratio (TESSERA_BENCH_PAIRS rounds, default 7) —
#          and the parallel plans' step times
#   moe    mixture of experts: Llama 4 Scout (scenarios/llama-4-scout.json, 64 H100s) on TP 2 x
#          PP 4 x DP 8 with EP 1, 2, 4, 8 under router skews 0, 0.5, 1 (estimated step time and
#          peak memory: `moe-ep` alone, a second), the sweep's best plans at skew 0 and 1, and the
#          executor's step time on scenarios/cpu-tiny-moe.json with EP 2 against one rank (median
#          of steps 2..20)
#   reproduce-hetero  (not in all) the heterogeneous-parallelism regime: ViT-L/14 + 7B and
#          InternViT-6B + 70B at 8k-128k fused tokens on 64, 256 and 1,024 H100s; the best
#          homogeneous, colocated and non-colocated plans by full sweeps (HETERO_PAIRS,
#          HETERO_LENGTHS, HETERO_GPUS narrow it), and where each family's best step goes
#   reproduce-cornstarch  Cornstarch simulated: the nine Cornstarch model pairs (scenarios/cornstarch/,
#          16 H100 as 8 stages of TP 2, 24 micro-batches) planned freeze-unaware vs frozen-aware by
#          `tessera stages`, and the CP table: one image-and-text sequence of 8k-128k tokens on
#          TP 4 x CP 2-8, attention-work max/mean and simulated step for uniform/zigzag/makespan
#   stage-split  frozen-aware vs uniform stage split on the library scenarios' own plans (estimates,
#          seconds)
#   cornstarch-exec  Cornstarch with the executor: frozen-aware vs uniform stage split
#          (scenarios/cpu-tiny-big-vit.json, PP2; analytic, and priced with a profile calibrated
#          on a run of that model; and PP4 on 4 ranks), stage counts per module on 4 ranks (`tessera stages`: the
#          frozen-aware vs the freeze-unaware choice) and makespan vs zigzag CP (CP2 and TP2 x CP2,
#          one packed micro-batch),
#          20 steps, median of steps 2.., 3 repeats
#   reproduce-variability  Entrain and DIP simulated: the variable workload (0-8 images of 224-1344 px,
#          64-4096 text tokens, some audio) on LLaVA-1.5-7B and a 14B model with InternViT-6B, 64
#          and 256 H100 (scenarios/variability/), 100 drawn iterations per micro-batching policy:
#          step time, throughput and per-micro-batch stage-time CV for arrival, sorted, entrain; DIP
#          and DIP + Entrain on a homogeneous layout (the 14B scenarios: TP1 x PP4 beside its 1F1B),
#          VARIABILITY_DIP_ITERATIONS (default 20) iterations, each re-planned
#   variability-exec  Entrain and DIP with the executor: scenarios/cpu-tiny-variable.json (0-4 images,
#          8-100 text tokens per sample) on PP4, 4 ranks, arrival vs sorted vs entrain vs dip vs
#          dip + entrain: median and p10-p90 of steps 2-20, 3 repeats, beside the estimate; for
#          DIP how often the background schedule search was late and how long it took
#   published  the GPU cost model against published training runs (scenarios/published/, `tessera
#          fidelity --fit`): predicted vs published step time per row at the defaults and at the
#          fit, mean and max |error| and Spearman of per-GPU throughput per series, the fitted
#          and the held-out rows (Narayanan et al. 2021, Table 1: never fitted) apart, and
#          leave-one-source-out; PUBLISHED_SKIP_LARGE=1 leaves out rows of more than 1024 GPUs
#   tune   (not in all) `tessera tune` on the CPU scenarios (TUNE_CASES: scenario:gpus pairs;
#          TUNE_TOP finalists, default 4, of TUNE_STEPS steps, default 8): per case whether the
#          analytic first choice was the measured fastest and the measured gain of the fastest
#          over it, and the finalists' mean |error| analytic, calibrated and held out
#   accuracy  calibration: records the cpu-local calibration set 3 times, fits a profile
#          on half of the plans each time, and replays every plan with it and without it
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p out  # every benchmark writes its figures and reports here (a fresh clone has none)
what=${1:-all}
build=${TESSERA_BUILD_DIR:-build}
if [[ -n ${TESSERA_BIN:-} ]]; then
  # A given simulator binary (a copy, so that the tree can be rebuilt while a long benchmark
  # runs, or another commit's to compare with): nothing is built.
  tessera=$TESSERA_BIN
else
  scripts/setup.sh >/dev/null
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  cmake --build "$build" --parallel "$(nproc)" --target tessera tessera-train >/dev/null
  tessera="$build/sim/tessera"
fi

elapsed() { awk -v s="$1" -v e="$2" 'BEGIN { printf "%.3f", e - s }'; }
# An awk function for the tables: grouped(n), an integer with thousands separators (707328 ->
# 707,328).
awk_grouped='function grouped(n,   s) {
  s = sprintf("%d", n)
  while (s ~ /[0-9][0-9][0-9][0-9]/) sub(/[0-9][0-9][0-9]($|,)/, ",&", s)
  return s
}'
# "median p10 p90" of a tessera-train run's step_s over steps 2.. (the first warms up)
step_stats() {
  grep -o '"step_s":[0-9.e-]*' "$1/loss.jsonl" | tail -n +2 | cut -d: -f2 | sort -g |
    awk '{ v[NR] = $1 } END { printf "%.4f %.4f %.4f\n",
           (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2, v[int(NR * 0.1) + 1], v[int(NR * 0.9)] }'
}

if [[ $what == lower || $what == all ]]; then
  echo "== lower + evaluate: scenarios/cornstarch-vlm-large-1024.json (1024 ranks, 64 micro-batches) =="
  echo "| run | ops | lower | evaluate | together | ops/s | whole command |"
  echo "|---|---|---|---|---|---|---|"
  for run in 1 2 3; do
    start=$(date +%s.%N)
    out=$("$tessera" estimate scenarios/cornstarch-vlm-large-1024.json)
    end=$(date +%s.%N)
    # "(438272 ops lowered in 0.114 s, evaluated in 0.105 s)"
    echo "$out" | awk -v run="$run" -v wall="$(elapsed "$start" "$end")" "$awk_grouped"'
      /ops lowered in/ {
        gsub(/[(),]/, ""); ops = $1; lower = $5; eval = $9;
        printf "| %d | %s | %.3f s | %.3f s | %.3f s | %.2f M | %s s |\n",
               run, grouped(ops), lower, eval, lower + eval, ops / (lower + eval) / 1e6, wall }'
  done
fi

if [[ $what == dip-search || $what == all ]]; then
  echo "== DIP's per-batch schedule search: one batch of each variability scenario, two runs =="
  echo "| scenario (\`scenarios/variability/\`) | Program | candidates (cached) | search | step found vs start |"
  echo "|---|---|---|---|---|"
  root=$(mktemp -d)
  for scenario in llava-7b-64 llava-7b-256 internvl-14b-64 internvl-14b-256; do
    if [[ $scenario == internvl-14b-* ]]; then
      # The reproduce-variability bench's DIP layout for the 14B model (its ViT's 25 heads rule
      # out TP 2 and 4).
      devices=${scenario##*-}
      echo "{\"placement\": \"homogeneous\", \"layout\": {\"tp\": 1, \"pp\": 4, \"dp\": $((devices / 4))}, \"micro_batch_size\": 1, \"schedule\": \"dip\", \"distributed_optimizer\": true, \"recompute\": \"full\"}" >"$root/plan.json"
      extra=(--plan "$root/plan.json")
      label="$scenario, TP1×PP4×DP$((devices / 4)) MBS1"
    else
      extra=(--set plan.schedule=dip)
      label="$scenario, $(jq -r '.plan.layout | "TP\(.tp)×PP\(.pp)×DP\(.dp)"' "scenarios/variability/$scenario.json")"
    fi
    : >"$root/runs.txt"
    for run in 1 2; do
      # "note: dip schedule search: 28 scored (6 cached) in 0.361 s; step 3.772 s (start 6.273 s): ..."
      # "(11104 ops lowered in 0.369 s, evaluated in 0.004 s)"
      "$tessera" estimate "scenarios/variability/$scenario.json" "${extra[@]}" 2>&1 |
        perl -ne 'print "$1 $2 $3 $4 $5\n" if /dip schedule search: (\d+) scored \((\d+) cached\) in ([\d.]+) s; step ([\d.]+) s \(start ([\d.]+) s\)/;
                  print "ops $1\n" if /^\((\d+) ops lowered/' >>"$root/runs.txt"
    done
    awk -v label="$label" "$awk_grouped"'
      $1 == "ops" { ops = $2; next }
      { scored = $1; cached = $2; found = $4; start = $5; t[++n] = $3 }
      END { lo = t[1] < t[2] ? t[1] : t[2]; hi = t[1] < t[2] ? t[2] : t[1]
            printf "| %s | %s ops | %d (%d) | %s s | %.4g s vs %.4g s |\n", label, grouped(ops), scored, cached,
                   sprintf("%.2f", lo) == sprintf("%.2f", hi) ? sprintf("%.2f", lo) : sprintf("%.2f–%.2f", lo, hi), found, start }' \
      "$root/runs.txt"
  done
  rm -rf "$root"
fi

if [[ $what == sim || $what == all ]]; then
  echo "== simulate: default LLaVA-1.5-7B plan, TP4 x PP2, 1F1B, 32 micro-batches, one iteration =="
  echo "| devices | nested collectives | step | SimGrid activities | actors | simulation | command | activities/s | peak RSS |"
  echo "|---|---|---|---|---|---|---|---|---|"
  for nested in flows timed; do
    for scenario in default default-1024 default-8192; do
      /usr/bin/time -o /tmp/tessera-bench-sim.time -f "%e %M" "$tessera" simulate "scenarios/$scenario.json" \
        --iterations 1 --nested "$nested" >/tmp/tessera-bench-sim.txt 2>/dev/null
      read -r wall rss <<<"$(tail -1 /tmp/tessera-bench-sim.time)"
      devices=$(sed -n 's/.* plan on \([0-9]*\) ranks.*/\1/p' /tmp/tessera-bench-sim.txt | head -1)
      # the per-iteration row: iteration step samples/s TFLOP/s MFU idle ops activities actors wall
      awk -v devices="$devices" -v nested="$nested" -v wall="$wall" -v rss="$rss" "$awk_grouped"'
        $1 == "0" && NF == 10 {
          printf "| %s | %s | %.3f s | %s | %d | %.3f s | %.2f s | %.0f k | %.0f MiB |\n",
                 grouped(devices), nested == "flows" ? "ring flows" : nested, $2, grouped($8), $9, $10, wall,
                 $8 / $10 / 1e3, rss / 1024 }' /tmp/tessera-bench-sim.txt
    done
  done
fi

if [[ $what == demo || $what == all ]]; then
  # The main job as a newcomer runs it, and its report as a browser renders it.
  echo "== demo: scripts/demo.sh, its report rendered and checked in headless Chromium =="
  start=$(date +%s.%N)
  scripts/demo.sh >out/bench-demo.txt 2>/dev/null
  end=$(date +%s.%N)
  awk -v s="$start" -v e="$end" 'BEGIN { printf "scripts/demo.sh: %.1f s wall (set-up and build checks included)\n", e - s }'
  grep -A4 '^best of each placement family' out/bench-demo.txt
  if command -v chromium >/dev/null; then
    browser=(chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run
      --disable-background-networking --disable-component-update --disable-sync
      --user-data-dir="$(mktemp -d)")
    report="file://$PWD/out/sweep-default/report.html"
    "${browser[@]}" --window-size=1300,1900 --screenshot="$PWD/out/bench-demo-report.png" "$report" >/dev/null 2>&1
    echo "report screenshot: out/bench-demo-report.png ($(stat -c %s out/bench-demo-report.png) bytes)"
    "${browser[@]}" --dump-dom "$report" 2>/dev/null >out/bench-demo-report.dom
    for text in "Best plan of each placement family" ">homogeneous<" ">colocated<" ">non_colocated<" \
      "less time per step than" "One step, op by op" "What the second stage" "entrain" "sorted" "dip"; do
      if grep -q -- "$text" out/bench-demo-report.dom; then echo "rendered report shows: $text"; else echo "rendered report lacks: $text"; fi
    done
  else
    echo "chromium not installed (scripts/setup.sh --browser): report check skipped"
  fi
fi

if [[ $what == sweep || $what == all ]]; then
  echo "== sweep: scenarios/default.json, all three families, top 50 simulated =="
  echo "| -j | wall | enumerated and validated | estimated (analytic) | refined | simulated (SimGrid) |"
  echo "|---|---|---|---|---|---|"
  for jobs in 1 2; do
    start=$(date +%s.%N)
    "$tessera" sweep scenarios/default.json --top 50 -j "$jobs" --out "out/bench-sweep-j$jobs" >"out/bench-sweep-j$jobs.txt" 2>/dev/null
    end=$(date +%s.%N)
    # "timing: enumerated and validated 3788 in 0.02 s (189 k/s), estimated 1264 in 13.10 s (96/s),
    #  refined 52 in 1.65 s, simulated 19 in 0.60 s (32/s)"
    JOBS=$jobs WALL=$(elapsed "$start" "$end") perl -ne 'printf "| %s | %.1f s | %s in %s s (%s) | %s in %s s (%s) | %s in %s s | %s in %s s (%s) |\n", $ENV{JOBS}, $ENV{WALL}, $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11
      if /^timing: enumerated and validated (\d+) in ([\d.]+) s \(([^)]*)\), estimated (\d+) in ([\d.]+) s \(([^)]*)\), refined (\d+) in ([\d.]+) s, simulated (\d+) in ([\d.]+) s \(([^)]*)\)$/' \
      <"out/bench-sweep-j$jobs.txt"
  done
  cmp <(cut -d, -f1-14 out/bench-sweep-j1/results.csv) <(cut -d, -f1-14 out/bench-sweep-j2/results.csv) \
    && echo "-j 1 and -j 2 rank identically"
  if command -v chromium >/dev/null; then
    chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking \
      --disable-component-update --disable-sync --user-data-dir="$(mktemp -d)" --window-size=1300,1500 \
      --screenshot="$PWD/out/bench-sweep-report.png" "file://$PWD/out/bench-sweep-j2/report.html" >/dev/null 2>&1
    echo "report screenshot: out/bench-sweep-report.png ($(stat -c %s out/bench-sweep-report.png) bytes)"
  else
    echo "chromium not installed: report screenshot skipped"
  fi
fi

if [[ $what == scale ]]; then
  # Not part of `all`: a few minutes.
  limit=${SCALE_TIMEOUT:-600}
  echo "== scale: wall time and peak RSS of estimate, simulate and sweep on the largest plans (each cut at $limit s) =="
  measure() {  # label, then the tessera command line
    local label=$1 wall rss code
    shift
    /usr/bin/time -o /tmp/tessera-bench-scale.time -f "%e %M" timeout "$limit" "$tessera" "$@" \
      >/dev/null 2>/tmp/tessera-bench-scale.err && code=0 || code=$?
    read -r wall rss <<<"$(tail -1 /tmp/tessera-bench-scale.time)"
    if [[ $code -eq 124 ]]; then
      printf "| %s | did not finish in %s s | |\n" "$label" "$limit"
    elif [[ $code -ne 0 ]]; then
      printf "| %s | failed (exit %s): %s | |\n" "$label" "$code" "$(tail -1 /tmp/tessera-bench-scale.err)"
    else
      printf "| %s | %.2f s | %s MiB |\n" "$label" "$wall" "$((rss / 1024))"
    fi
  }
  echo "| command | wall | peak RSS |"
  echo "|---|---|---|"
  for scenario in default-1024 published/narayanan-529.6b published/narayanan-1008b default-8192; do
    measure "\`estimate\` $scenario" estimate "scenarios/$scenario.json"
  done
  for scenario in default-1024 published/narayanan-529.6b published/narayanan-1008b default-8192; do
    measure "\`simulate\` $scenario" simulate "scenarios/$scenario.json" --iterations 1
  done
  for scenario in published/narayanan-529.6b published/narayanan-1008b; do
    measure "\`simulate --periodic off\` $scenario" simulate "scenarios/$scenario.json" --iterations 1 --periodic off
  done
  # Megatron's 1T plan with interleaved 1F1B (VP 2): 8 groups of pp micro-batches, too few for
  # the periodic folding.
  measure "\`simulate\` published/narayanan-1008b, interleaved (VP 2)" simulate scenarios/published/narayanan-1008b.json \
    --iterations 1 --set plan.layout.vpp=2 --set plan.schedule=interleaved_1f1b
  measure "\`simulate --nested flows\` default-8192" simulate scenarios/default-8192.json --iterations 1 --nested flows
  out=$(mktemp -d)
  measure "\`sweep default.json --gpus 1024 --top 10\`" sweep scenarios/default.json --gpus 1024 --top 10 --out "$out/1024"
  measure "\`sweep narayanan-1008b --gpus 3072 --top 10\`" sweep scenarios/published/narayanan-1008b.json --gpus 3072 --top 10 --out "$out/3072"
  rm -rf "$out"
fi

if [[ $what == comm || $what == all ]]; then
  echo "== Gloo all-reduce over loopback, 2 ranks (tessera-train comm-check, median of 10) =="
  echo "| size | time | bus bandwidth |"
  echo "|---|---|---|"
  for bytes in 65536 1048576 16777216 67108864; do
    # "all-reduce of 65536 bytes over 2 ranks (gloo): 0.849 ms, algbw 0.077 GB/s, busbw 0.077 GB/s"
    "$build/exec/tessera-train" comm-check --nproc 2 --bytes "$bytes" --iters 10 |
      awk -v b="$bytes" '/all-reduce of/ {
        size = b >= 1048576 ? sprintf("%d MiB", b / 1048576) : sprintf("%d KiB", b / 1024)
        for (i = 1; i <= NF; i++) { if ($(i + 1) == "ms,") ms = $i; if ($i == "busbw") bus = $(i + 1) }
        printf "| %s | %s ms | %s GB/s |\n", size, ms, bus }'
  done
fi

if [[ $what == cli || $what == all ]]; then
  echo "== CLI on the scenario library =="
  start=$(date +%s.%N)
  count=0
  for f in scenarios/*.json; do
    "$tessera" validate "$f" >/dev/null
    count=$((count + 1))
  done
  end=$(date +%s.%N)
  validate=$(awk -v s="$start" -v e="$end" -v n="$count" 'BEGIN { printf "%.1f ms", (e - s) / n * 1e3 }')
  start=$(date +%s.%N)
  "$tessera" show scenarios/default.json --batches 16 >/dev/null
  end=$(date +%s.%N)
  echo "| what | figure |"
  echo "|---|---|"
  echo "| \`tessera validate\` per library scenario ($count of them) | $validate |"
  echo "| \`tessera show scenarios/default.json --batches 16\` (4096 drawn samples) | $(awk -v s="$start" -v e="$end" 'BEGIN { printf "%.0f ms", (e - s) * 1e3 }') |"
fi

if [[ $what == exec || $what == all ]]; then
  train="$build/exec/tessera-train"
  scenario=scenarios/cpu-tiny.json
  plans=$(mktemp -d)
  plan() { echo "{\"placement\": \"homogeneous\", \"micro_batch_size\": 1, \"schedule\": \"1f1b\", \"layout\": $1}" >"$plans/$2.json"; echo "$plans/$2.json"; }
  # median of column $2 (a JSON field) of loss.jsonl $1, steps 5 and later (warm-up excluded)
  median() { grep -o "\"$2\":[0-9.e-]*" "$1" | tail -n +6 | cut -d: -f2 | sort -g |
             awk '{ v[NR] = $1 } END { printf "%.5f", (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
  steps=${TESSERA_BENCH_STEPS:-40}
  pairs=${TESSERA_BENCH_PAIRS:-7}
  echo "== tessera-train on $scenario (fp32, CPU, Gloo, one thread per rank), $steps steps, medians of steps 5.. =="
  echo "-- overhead: $pairs rounds of plain loop, tessera-train and tessera-train traced, back to back"
  echo "   (order reversed every other round, so drift of a noisy machine falls on both sides) --"
  single=$(plan '{"tp": 1}' single)
  rm -rf out/bench-exec && mkdir -p out/bench-exec
  run_plain() {
    "$train" plain-loop "$scenario" --plan "$single" --steps "$steps" |
      awk '{ print $5 }' | tail -n +6 | sort -g |
      awk '{ v[NR] = $1 } END { printf "%.5f", (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
  }
  run_train() {  # $1: traced steps
    "$train" "$scenario" --plan "$single" --steps "$steps" --trace-steps "$1" --out out/bench-exec/run >/dev/null
    median out/bench-exec/run/loss.jsonl wall_s
  }
  : >"$plans/ratios.txt"
  echo "| round | plain LibTorch loop (\`tessera-train plain-loop\`) | \`tessera-train\`, no trace | traced every step |"
  echo "|---|---|---|---|"
  for round in $(seq "$pairs"); do
    if ((round % 2)); then
      p=$(run_plain) u=$(run_train 0) t=$(run_train "$steps")
    else
      t=$(run_train "$steps") u=$(run_train 0) p=$(run_plain)
    fi
    echo "$p $u $t" | tee -a "$plans/ratios.txt" |
      awk -v r="$round" '{ printf "| %d | %.4f s | %.4f s (%+.1f%%) | %.4f s (%+.1f%%) |\n", r, $1, $2, 100 * ($2 / $1 - 1), $3, 100 * ($3 / $2 - 1) }' |
      sed 's/(-/(−/g'
  done
  # Median and range over the rounds of each round's own ratio.
  summary() {
    sort -g | awk '{ v[NR] = $1 } END {
      m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
      printf "**%+.1f%%** (%+.1f%% .. %+.1f%%)", 100 * (m - 1), 100 * (v[1] - 1), 100 * (v[NR] - 1) }' | sed 's/-/−/g'
  }
  echo "| **median (range)** | | $(awk '{ print $2 / $1 }' "$plans/ratios.txt" | summary) | $(awk '{ print $3 / $2 }' "$plans/ratios.txt" | summary) |"
  echo
  echo "-- parallel plans, 15 steps (step: the slowest rank's ops; 2 cores shared by all ranks) --"
  echo "| plan | ranks | step | loss after 15 steps |"
  echo "|---|---|---|---|"
  for entry in 'single|1|{"tp": 1}' 'TP2|2|{"tp": 2}' 'PP2 (1F1B)|2|{"pp": 2}' 'DP2|2|{"dp": 2}' 'CP2|2|{"cp": 2}' \
    'TP2 x PP2|4|{"tp": 2, "pp": 2}'; do
    IFS='|' read -r label ranks layout <<<"$entry"
    name=$(echo "$layout" | tr -dc 'a-z0-9')
    "$train" "$scenario" --plan "$(plan "$layout" "$name")" --steps 15 --trace-steps 0 --out "out/bench-exec/$name" >/dev/null
    printf "| %s | %s | %.3f s | %s |\n" "$label" "$ranks" "$(median "out/bench-exec/$name/loss.jsonl" step_s)" \
      "$(tail -1 "out/bench-exec/$name/loss.jsonl" | grep -o '"loss":[0-9.]*' | cut -d: -f2)"
  done
  rm -rf "$plans"
fi

if [[ $what == moe || $what == moe-ep || $what == all ]]; then
  root=$(mktemp -d /tmp/tessera-moe.XXXXXX)
  echo "== Llama 4 Scout, 64 H100s, TP 2 x PP 4 x DP 8, micro-batch 1: estimated step and peak memory =="
  echo "| router_skew | EP 1 | EP 2 | EP 4 | EP 8 |"
  echo "|---|---|---|---|---|"
  memory="| peak memory per GPU |"
  for skew in 0 0.5 1; do
    row="| $skew |"
    if [[ $skew == 0 ]]; then row="| 0 (even) |"; fi
    for ep in 1 2 4 8; do
      echo "{\"placement\": \"homogeneous\", \"layout\": {\"tp\": 2, \"pp\": 4, \"dp\": 8, \"ep\": $ep}, \"micro_batch_size\": 1, \"schedule\": \"1f1b\", \"sequence_parallel\": true, \"distributed_optimizer\": true}" >"$root/ep$ep.json"
      out=$("$tessera" estimate scenarios/llama-4-scout.json --plan "$root/ep$ep.json" --set workload.router_skew=$skew)
      row+=" $(echo "$out" | awk '/^step time/ { print $3 " s" }') |"
      # "peak memory      106 GiB on rank 18 (...) of 79.6 GiB": the same at every skew
      if [[ $skew == 0 ]]; then
        memory+=" $(echo "$out" | awk '/^peak memory/ {
          note = ($3 + 0 > $(NF - 1) + 0 && $4 == $NF) ? " (does not fit)" : ""; print $3 " " $4 note }') |"
      fi
    done
    echo "$row"
  done
  echo "$memory"
  rm -rf "$root"
fi

if [[ $what == moe || $what == all ]]; then
  root=$(mktemp -d /tmp/tessera-moe.XXXXXX)
  start=$(date +%s.%N)
  "$tessera" sweep scenarios/llama-4-scout.json --top 4 --refine 0 --set workload.router_skew=0,1 \
    --out "$root/sweep" >"$root/sweep.txt" 2>&1
  end=$(date +%s.%N)
  echo "sweep over both skews: $(elapsed "$start" "$end") s; best of each family:"
  sed -n '/^best of each placement family/,/^$/p' "$root/sweep.txt" | grep -E '^best|^  (homogeneous|colocated|non_colocated) '
  # Kimi-VL-A3B: latent attention, one dense layer before 26 MoE layers, 64 experts.
  start=$(date +%s.%N)
  "$tessera" sweep scenarios/kimi-vl-a3b.json --top 4 --refine 0 --set workload.router_skew=0,1 \
    --out "$root/sweep-kimi" >"$root/sweep-kimi.txt" 2>&1
  end=$(date +%s.%N)
  echo "Kimi-VL-A3B sweep over both skews: $(elapsed "$start" "$end") s; best of each family:"
  sed -n '/^best of each placement family/,/^$/p' "$root/sweep-kimi.txt" | grep -E '^best|^  (homogeneous|colocated|non_colocated) '
  plans=$root
  echo '{"placement": "homogeneous", "layout": {"tp": 1}, "micro_batch_size": 1, "schedule": "1f1b"}' >"$plans/one.json"
  echo '{"placement": "homogeneous", "layout": {"dp": 2, "ep": 2}, "micro_batch_size": 1, "schedule": "1f1b"}' >"$plans/ep2.json"
  for p in one ep2; do
    "$build/exec/tessera-train" scenarios/cpu-tiny-moe.json --plan "$plans/$p.json" --steps 20 --trace-steps 0 \
      --no-checkpoint --out "$root/$p" >/dev/null
    echo "cpu-tiny-moe $p: step_s median p10 p90 over steps 2..20: $(step_stats "$root/$p")"
  done
  rm -rf "$root"
fi

if [[ $what == published || $what == all ]]; then
  echo "== published training runs: predicted (tessera fidelity) vs published step time, the fit and leave-one-source-out =="
  max_gpus=0
  [[ ${PUBLISHED_SKIP_LARGE:-0} == 1 ]] && max_gpus=1024
  start=$(date +%s.%N)
  "$tessera" fidelity --fit --max-gpus "$max_gpus" scenarios/published/*.json 2>/dev/null
  echo "(fidelity --fit took $(elapsed "$start" "$(date +%s.%N)") s)"
fi

if [[ $what == accuracy || $what == all ]]; then
  fit=(cpu-tiny-tp2-pp2 cpu-tiny-colocated cpu-tiny-valm-non-colocated)
  held=(cpu-tiny-non-colocated cpu-tiny-dp2-pp2 cpu-tiny-valm-tp2-dp2)
  root=$(mktemp -d /tmp/tessera-accuracy.XXXXXX)
  echo "== accuracy: record the calibration set (scripts/record-calibration.sh), calibrate on"
  echo "   ${fit[*]}, replay every plan; 3 recordings; errors of the mean step time over the"
  echo "   warm iterations (1..19), and the mean |error| of single iterations =="
  # "... mean |error| 9.5%, max |error| 24.9%, mean +1.2%" -> "9.5 +1.2"
  errors() { sed -nE 's/.*mean \|error\| ([0-9.]+)%, max \|error\| [0-9.]+%, mean ([-+0-9.]+)%.*/\1 \2/p'; }
  # mean measured step time of iterations 1.. of a run
  measured() { grep -o '"step_s":[0-9.e-]*' "$1/loss.jsonl" | tail -n +2 | cut -d: -f2 |
               awk '{ s += $1 } END { printf "%.4f", s / NR }'; }
  echo "| recording | set | plan | measured step | calibrated error (mean, \\|iter\\|) | uncalibrated (mean, \\|iter\\|) |"
  echo "|---|---|---|---|---|---|"
  for rep in 1 2 3; do
    dir="$root/rep$rep"
    scripts/record-calibration.sh "$dir" >/dev/null
    dirs=()
    for p in "${fit[@]}"; do dirs+=("$dir/$p"); done
    "$tessera" calibrate "${dirs[@]}" -o "$dir/profile.json" >/dev/null
    for p in "${fit[@]}" "${held[@]}"; do
      set=held-out
      [[ " ${fit[*]} " == *" $p "* ]] && set=fitting
      read -r cal_iter cal_mean < <("$tessera" replay "$dir/$p" --profile "$dir/profile.json" | errors)
      read -r raw_iter raw_mean < <("$tessera" replay "$dir/$p" | errors)
      step=$(measured "$dir/$p")
      echo "$rep $set $p $step $cal_mean $cal_iter $raw_mean $raw_iter" >>"$root/rows.txt"
      printf "| %s | %s | %s | %.3f s | %+.1f%%, %.1f%% | %+.1f%%, %.1f%% |\n" "$rep" "$set" "$p" \
        "$step" "$cal_mean" "$cal_iter" "$raw_mean" "$raw_iter" | sed 's/| -/| −/g'
    done
  done
  echo
  echo "-- per set: mean over its plans of |error of the mean step|, then min / mean / max over the 3 recordings --"
  echo "| set | calibrated | uncalibrated | goal |"
  echo "|---|---|---|---|"
  awk '{ k = $2; c = ($5 < 0 ? -$5 : $5); u = ($7 < 0 ? -$7 : $7)
         cs[k, $1] += c; us[k, $1] += u; n[k, $1]++; sets[k] = 1; reps[$1] = 1 }
       END { for (k in sets) { cmin = umin = 1e9; cmax = umax = csum = usum = 0; r = 0
               for (rep in reps) { c = cs[k, rep] / n[k, rep]; u = us[k, rep] / n[k, rep]; r++
                 csum += c; usum += u; if (c < cmin) cmin = c; if (c > cmax) cmax = c
                 if (u < umin) umin = u; if (u > umax) umax = u }
               goal = (k == "fitting") ? 3 : 8
               printf "| %s | %.1f / **%.1f** / %.1f %% | %.1f / %.1f / %.1f %% | ≤ %d %% — %s |\n",
                      k == "fitting" ? "fitting (replay)" : "held-out (prediction)", cmin, csum / r, cmax,
                      umin, usum / r, umax, goal, csum / r <= goal ? "met" : "not met" } }' "$root/rows.txt" | sort
  echo
  echo "-- run-to-run spread of the measured mean step time: (max - min) / mean over the 3 recordings --"
  echo "| plan | spread |"
  echo "|---|---|"
  awk '{ t[$3] = t[$3] " " $4 } END { for (p in t) { n = split(t[p], v, " "); lo = 1e9; hi = s = 0
         for (i = 1; i <= n; i++) { s += v[i]; if (v[i] < lo) lo = v[i]; if (v[i] > hi) hi = v[i] }
         printf "| %s | %.1f %% |\n", p, 100 * (hi - lo) / (s / n) } }' "$root/rows.txt" | sort
  rm -rf "$root"
fi

if [[ $what == reproduce-hetero ]]; then
  # Not part of `all`: about 40 minutes at 64-1024 GPUs. The heterogeneous-parallelism regime: fused
  # sequences of L tokens, half of them image tokens (each image a bounded encoder sequence),
  # 16k tokens per GPU and step; per (pair, L, GPUs) the best homogeneous and colocated plans by
  # a sweep of both families (their bests are simulated), and the best non-colocated plan with
  # an eighth more GPUs for the encoders, so that the LLM keeps the homogeneous plans' grid.
  echo "== reproduce-hetero: best homogeneous vs colocated vs non-colocated (simulated), H100s =="
  echo "| pair | tokens | GPUs | homogeneous | TFLOP/s/GPU | colocated | TFLOP/s/GPU | colocated gain | non-colocated (+1/8 GPUs for the encoder) | tokens/s gain | TFLOP/s/GPU gain |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|"
  mkdir -p out/hetero
  : >out/hetero/parts.txt
  for pair in vitl-7b:576 internvit6b-70b:256; do
    name=${pair%%:*} per_image=${pair##*:}
    [[ " ${HETERO_PAIRS:-vitl-7b internvit6b-70b} " == *" $name "* ]] || continue
    for tokens in ${HETERO_LENGTHS:-8192 16384 32768 65536 131072}; do
      images=$((tokens / 2 / per_image))
      text=$((tokens - images * per_image))
      for gpus in ${HETERO_GPUS:-64 256 1024}; do
        batch=$((2 * gpus * 8192 / tokens))
        sets=(--set "workload.max_seq_len=$tokens" --set "workload.global_batch=$batch"
          --set "workload.samples.text_tokens=$text" --set "workload.samples.image.count=$images")
        dir=out/hetero/$name-$tokens-$gpus
        "$tessera" sweep "scenarios/hetero/$name.json" --gpus "$gpus" -j 2 --out "$dir" "${sets[@]}" \
          --placements homogeneous,colocated >"$dir.txt" 2>/dev/null || true
        "$tessera" sweep "scenarios/hetero/$name.json" --gpus $((gpus + gpus / 8)) -j 2 \
          --placements non_colocated --out "$dir-nc" "${sets[@]}" >"$dir-nc.txt" 2>/dev/null || true
        # "  colocated   <layout>  <step> s  <tokens/s>  tokens/s  <TFLOP/s>  TFLOP/s/GPU  ..."
        # (module layouts joined by " + " in the table)
        family() { awk -F'  +' -v f="$2" '$2 == f { l = $3; gsub(/ \| /, " + ", l); print l "\t" $5 "\t" $7; exit }' "$1"; }
        awk -v p="$name" -v l="$tokens" -v g="$gpus" -v h="$(family "$dir.txt" homogeneous)" \
            -v c="$(family "$dir.txt" colocated)" \
            -v e="$(family "$dir-nc.txt" non_colocated)" 'function num(s) { sub(/ .*/, "", s); return s + 0 }
          BEGIN { split(h, H, "\t"); split(c, C, "\t"); split(e, E, "\t")
            ht = num(H[3]); hr = num(H[2]); ct = num(C[3]); er = num(E[2]); et = num(E[3])
            printf "| %s | %d | %d | %s | %s | %s | %s | %s | %s | %s | %s |\n", p, l, g,
              (h == "" ? "none fits" : H[1]), (ht ? sprintf("%.1f", ht) : ""),
              (c == "" ? "none fits" : C[1]), (ct ? sprintf("%.1f", ct) : ""),
              (ht && ct ? sprintf("%+.1f%%", 100 * (ct / ht - 1)) : ""),
              (e == "" ? "none fits" : E[1]), (hr && er ? sprintf("%+.1f%%", 100 * (er / hr - 1)) : ""),
              (ht && et ? sprintf("%+.1f%%", 100 * (et / ht - 1)) : "") }'
        # Where each family's best step goes, per rank (the sweep's "a + b + c + d + e" column).
        for f in "$dir.txt:homogeneous" "$dir.txt:colocated" "$dir-nc.txt:non_colocated"; do
          awk -F'  +' -v f="${f##*:}" -v p="$name" -v l="$tokens" -v g="$gpus" '$2 == f {
            n = split($9, v, / \+ /); if (n != 5) exit
            printf "%s | %d | %d | %s | %s | %s | %s | %s | %s | %s\n", p, l, g, f, $4, v[1], v[2], v[3], v[4], v[5]
            exit }' "${f%:*}" >>out/hetero/parts.txt
        done
      done
    done
  done | tee out/bench-hetero.md
  echo
  echo "where the best step of each family goes (simulated, s per rank: the five parts add up to the step)"
  echo "| pair | tokens | GPUs | family | step | compute | imbalance | bubble and waits | exposed comm | boundary |"
  echo "|---|---|---|---|---|---|---|---|---|---|"
  sed 's/^/| /; s/$/ |/' out/hetero/parts.txt | tee -a out/bench-hetero.md
fi

if [[ $what == reproduce-cornstarch || $what == all ]]; then
  echo "== Cornstarch pairs: frozen encoders and LLM, trainable projectors; 16 H100 = 8 stages of TP 2 =="
  echo "== step (s), simulated with SimGrid; throughput ratio = freeze-unaware step / frozen-aware step =="
  echo "| pair | freeze-unaware stages | frozen-aware stages | freeze-unaware (s) | aware split on unaware counts (s, estimate) | frozen-aware (s) | gain | from counts | from split | LLM-centric (s) | gain over LLM-centric |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|"
  for pair in vlm alm valm; do
    for size in small medium large; do
      out=$("$tessera" stages "scenarios/cornstarch/$pair-$size.json" --tp 2 --top 0 --simulate)
      # "freeze-unaware choice   vision 2 + llm 6     estimate ..." -> "vision 2 + llm 6"
      choice() { echo "$out" | sed -n "s/^$1 choice  *\(.*[0-9]\)  *estimate.*/\1/p"; }
      read -r unaware aware < <(echo "$out" |
        sed -n 's/^simulated gain: .*freeze-unaware \([0-9.e-]*\) s, frozen-aware \([0-9.e-]*\) s.*/\1 \2/p')
      split_only=$(echo "$out" |
        sed -n 's/^frozen-aware boundaries on the freeze-unaware counts: estimate \([0-9.e-]*\) s/\1/p')
      centric=$(echo "$out" | sed -n 's/^simulated LLM-centric: \([0-9.e-]*\) s.*/\1/p')
      awk -v p="$pair-$size" -v us="$(choice freeze-unaware)" -v as="$(choice frozen-aware)" -v u="$unaware" \
          -v a="$aware" -v so="$split_only" -v c="${centric:-}" 'BEGIN {
        printf "| %s | %s | %s | %.4f | %.4f | %.4f | %.3fx | %.3fx | %.3fx | %s | %s |\n", p, us, as, u, so, a,
               u / a, so / a, u / so, (c == "" ? "invalid: ViT heads 25 vs TP 2" : sprintf("%.4f", c)),
               (c == "" ? "" : sprintf("%.3fx", c / a)) }'
    done
  done | tee /tmp/tessera-cornstarch-pairs.txt
  awk -F'|' '{ g = $8; sub(/x/, "", g); sum += g; n++
         c = $12; gsub(/[ x]/, "", c); if (c != "") { csum += c; cn++ } }
       END { if (n) printf "mean gain of frozen-aware over freeze-unaware (simulated), %d pairs: %.3fx (Cornstarch: 2.26x over other systems, on average)\n", n, sum / n
             if (cn) printf "mean gain of frozen-aware over the LLM-centric layout (homogeneous TP 2 x PP 8, encoders in stage 1, equal layers: the layout of the systems Cornstarch compared with), %d pairs where it is valid: %.3fx\n", cn, csum / cn }' \
    /tmp/tessera-cornstarch-pairs.txt | tail -2

  echo "== CP: Qwen2-VL ViT + Llama-3.1-8B, one sequence per micro-batch: L/4096 images of 1196 tokens, then text =="
  echo "== TP 4 x CP n, recompute full; attention work max/mean over the CP ranks, and simulated step (s) =="
  echo "| tokens | CP | uniform | zigzag | makespan | makespan vs zigzag (step) |"
  echo "|---|---|---|---|---|---|"
  for tokens in 8192 16384 32768 65536 131072; do
    images=$((tokens / 4096))
    text=$((tokens - images * 1196))
    for cp in 2 4 8; do
      line="| $((tokens / 1024))k | $cp |"
      steps=()
      for policy in uniform zigzag makespan; do
        out=$("$tessera" simulate scenarios/cornstarch/cp-long.json --iterations 1 \
                --set workload.max_seq_len="$tokens" --set workload.samples.text_tokens="$text" \
                --set workload.samples.image.count="$images" --set plan.layout.cp="$cp" \
                --set cluster.nodes=$((cp / 2)) --set plan.cp_split="$policy")
        balance=$(echo "$out" | sed -n 's/^note: cp_split [a-z]*: attention work max\/mean over the CP ranks \([0-9.]*\).*/\1/p')
        step=$(echo "$out" | awk '$1 == "0" && NF == 10 { print $2 }')
        steps+=("$step")
        line+=" $balance / ${step} s |"
      done
      echo "$line $(awk -v z="${steps[1]}" -v m="${steps[2]}" 'BEGIN { printf "%.3fx", z / m }') |"
    done
  done
fi

if [[ $what == stage-split || $what == all ]]; then
  echo "== frozen-aware vs uniform stage split on the library scenarios' own plans (tessera estimate) =="
  echo "| scenario | frozen-aware split's layers | uniform | frozen-aware | gain |"
  echo "|---|---|---|---|---|"
  for scenario in cornstarch-vlm-large-1024 cornstarch-valm-medium llava-1.5-13b-captioning \
    qwen2-vl-7b-video default default-1024 default-8192; do
    uniform=$("$tessera" estimate "scenarios/$scenario.json" --set plan.stage_split=uniform |
      awk '/^step time/ { print $3 }')
    out=$("$tessera" estimate "scenarios/$scenario.json" --set plan.stage_split=frozen_aware)
    aware=$(echo "$out" | awk '/^step time/ { print $3 }')
    # "stage layers     vision even | llm 15,13 (cost-balanced; nothing is frozen)"
    stages=$(echo "$out" | sed -n 's/^stage layers *//p' | sed 's/ | /; /g')
    echo "| $scenario | $stages | $uniform s | $aware s | $(awk -v u="$uniform" -v a="$aware" 'BEGIN { printf "%.3fx", u / a }') |"
  done
fi

if [[ $what == reproduce-variability || $what == all ]]; then
  iterations=${VARIABILITY_ITERATIONS:-100}
  # DIP searches a schedule for every iteration (1-3 s each at 64-256 devices here): fewer of them.
  dip_iterations=${VARIABILITY_DIP_ITERATIONS:-20}
  root=$(mktemp -d /tmp/tessera-variability.XXXXXX)
  echo "== data variability: micro-batching policies and DIP over drawn iterations (SimGrid, nested collectives timed) =="
  echo "| scenario | layout | policy | iterations | step mean (s) | step mean, first $dip_iterations (s) | samples/s | LLM CV | LLM max/mean | first encoder CV |"
  echo "|---|---|---|---|---|---|---|---|---|---|"
  # row <scenario> <layout label> <policy label> <iterations> <tessera simulate options...>
  row() {
    local scenario=$1 layout=$2 policy=$3 count=$4
    shift 4
    # The JSON on stdout; progress and errors on stderr (a long run reports each iteration there).
    if ! out=$("$tessera" simulate "scenarios/variability/$scenario.json" --iterations "$count" \
                 --nested timed --json "$@" 2>"$root/stderr"); then
      echo "| $scenario | $layout | $policy | $count | $(tail -1 "$root/stderr") | | | | | |"
      return
    fi
    echo "$out" | jq -r --arg s "$scenario" --arg l "$layout" --arg p "$policy" --argjson n "$dip_iterations" '
      def mean(f): (map(f) | add) / length;
      def r3: . * 1000 | round / 1000;
      if (.feasible | not) then "| \($s) | \($l) | \($p) | | \(.reason) | | | | | |" else
      .iterations as $it
      | ($it[0].microbatch_variability | keys_unsorted | map(select(. != "llm")) | first) as $enc
      | "| \($s) | \($l) | \($p) | \($it | length) | \(.step_mean_s | r3) | \($it[:$n] | mean(.step_s) | r3) | \($it | mean(.samples_per_s) * 10 | round / 10) | \($it | mean(.microbatch_variability.llm.cv) | r3) | \($it | mean(.microbatch_variability.llm.max_over_mean) | r3) | \(if $enc then ($it | mean(.microbatch_variability[$enc].cv) | r3 | tostring) + " (" + $enc + ")" else "" end) |" end'
  }
  for scenario in llava-7b-64 llava-7b-256 internvl-14b-64 internvl-14b-256; do
    own=$(jq -r '.plan | if .placement == "homogeneous" then
      "TP\(.layout.tp)×PP\(.layout.pp)×DP\(.layout.dp)" else (.placement | sub("_"; "-")) end' \
      "scenarios/variability/$scenario.json")
    for policy in arrival sorted entrain; do
      row "$scenario" "$own" "$policy" "$iterations" --set plan.microbatching="$policy"
    done
    # DIP interleaves the encoders onto the LLM's pipeline ranks: a homogeneous layout. The LLaVA
    # scenarios are homogeneous already; the 14B ones get TP1 x PP4 (the ViT's 25 heads rule out
    # TP 2 and 4), one sample per micro-batch, beside 1F1B on the same layout.
    extra=()
    layout=$own
    if [[ $scenario == internvl-14b-* ]]; then
      devices=${scenario##*-}
      for schedule in 1f1b dip; do
        echo "{\"placement\": \"homogeneous\", \"layout\": {\"tp\": 1, \"pp\": 4, \"dp\": $((devices / 4))}, \"micro_batch_size\": 1, \"schedule\": \"$schedule\", \"distributed_optimizer\": true, \"recompute\": \"full\"}" >"$root/$scenario-$schedule.json"
      done
      layout="TP1×PP4×DP$((devices / 4)), MBS 1"
      row "$scenario" "$layout" "arrival (1F1B)" "$iterations" --plan "$root/$scenario-1f1b.json"
      extra=(--plan "$root/$scenario-dip.json")
    else
      extra=(--set plan.schedule=dip)
    fi
    row "$scenario" "$layout" "dip" "$dip_iterations" "${extra[@]}"
    row "$scenario" "$layout" "dip + entrain" "$dip_iterations" "${extra[@]}" --set plan.microbatching=entrain
  done
  rm -rf "$root"
fi

if [[ $what == variability-exec || $what == all ]]; then
  train="$build/exec/tessera-train"
  root=$(mktemp -d /tmp/tessera-variability.XXXXXX)
  echo "== data variability with the executor: cpu-tiny-variable, PP4 on 4 ranks, steps 2-20, three repeats =="
  policies="arrival sorted entrain dip dip+entrain"
  declare -A estimated measured
  for policy in $policies; do
    schedule=1f1b microbatching=$policy
    case $policy in
      dip) schedule=dip microbatching=arrival ;;
      dip+entrain) schedule=dip microbatching=entrain ;;
    esac
    echo "{\"placement\": \"homogeneous\", \"layout\": {\"pp\": 4}, \"micro_batch_size\": 2, \"schedule\": \"$schedule\", \"microbatching\": \"$microbatching\"}" >"$root/$policy.json"
    estimated[$policy]=$("$tessera" estimate scenarios/cpu-tiny-variable.json --plan "$root/$policy.json" |
      sed -n 's/^step time *\(.*\)/\1/p')
  done
  echo "| policy | repeat 1 | repeat 2 | repeat 3 | estimated step (first batch) |"
  echo "|---|---|---|---|---|"
  searches="| run | schedules used | late | steps | search time, mean | search time, max |"$'\n'"|---|---|---|---|---|---|"
  for rep in 1 2 3; do
    for policy in $policies; do
      "$train" scenarios/cpu-tiny-variable.json --plan "$root/$policy.json" --nproc 4 --steps 20 --trace-steps 0 --no-checkpoint --out "$root/$policy-$rep" >/dev/null
      read -r median p10 p90 < <(step_stats "$root/$policy-$rep")
      measured[$policy]+=$(printf " | %.3f (%.3f–%.3f) s" "$median" "$p10" "$p90")
      if [[ $policy == dip* ]]; then
        searches+=$'\n'$(jq -r --arg run "${policy/+/ + }, repeat $rep" '.dip_search |
          "| \($run) | \(.searches_used) | \(.late) | \(.steps) | \(.search_s_mean * 1000 | round) ms | \(.search_s_max * 1000 | round) ms |"' \
          "$root/$policy-$rep/run.json")
      fi
    done
  done
  for policy in $policies; do
    echo "| ${policy/+/ + }${measured[$policy]} | ${estimated[$policy]} |"
  done
  echo
  echo "-- DIP's background schedule search, per run --"
  echo "$searches"
  rm -rf "$root"
fi

if [[ $what == cornstarch-exec || $what == all ]]; then
  train="$build/exec/tessera-train"
  root=$(mktemp -d /tmp/tessera-cornstarch.XXXXXX)
  med() { step_stats "$1" | cut -d' ' -f1; }
  echo "== Cornstarch with the executor: median step time of steps 2-20, three repeats =="
  for split in frozen_aware uniform; do
    echo "{\"placement\": \"homogeneous\", \"layout\": {\"pp\": 2}, \"micro_batch_size\": 1, \"schedule\": \"1f1b\", \"stage_split\": \"$split\"}" >"$root/$split.json"
    echo "{\"placement\": \"homogeneous\", \"layout\": {\"pp\": 4}, \"micro_batch_size\": 1, \"schedule\": \"1f1b\", \"stage_split\": \"$split\"}" >"$root/pp4-$split.json"
  done
  # The frozen-aware split priced with a profile calibrated on this model: one traced run of the
  # uniform split, `tessera calibrate`, then the split `estimate --profile` chooses.
  "$train" scenarios/cpu-tiny-big-vit.json --plan "$root/uniform.json" --steps 10 --trace-steps 5 \
    --no-checkpoint --out "$root/calibration-run" >/dev/null
  "$tessera" calibrate "$root/calibration-run" -o "$root/profile.json" >/dev/null
  layers=$("$tessera" estimate scenarios/cpu-tiny-big-vit.json --plan "$root/frozen_aware.json" \
             --profile "$root/profile.json" | sed -n 's/^stage layers *llm \([0-9,]*\) .*/\1/p')
  echo "{\"placement\": \"homogeneous\", \"layout\": {\"pp\": 2, \"stage_layers\": [$layers]}, \"micro_batch_size\": 1, \"schedule\": \"1f1b\"}" >"$root/profiled.json"
  # Stage counts per module on 4 ranks (tessera stages): the frozen-aware and the freeze-unaware choice.
  "$tessera" stages scenarios/cpu-tiny-big-vit.json --gpus 4 --tp 1 -o "$root/frozen_aware_counts.json" \
    --baseline-out "$root/freeze_unaware_counts.json" >"$root/stages.txt"
  for cps in makespan zigzag; do
    echo "{\"placement\": \"homogeneous\", \"layout\": {\"cp\": 2}, \"micro_batch_size\": 8, \"schedule\": \"1f1b\", \"cp_split\": \"$cps\"}" >"$root/$cps.json"
    echo "{\"placement\": \"homogeneous\", \"layout\": {\"cp\": 2, \"tp\": 2}, \"micro_batch_size\": 8, \"schedule\": \"1f1b\", \"cp_split\": \"$cps\"}" >"$root/tp2-$cps.json"
  done
  # The runs: plan file, scenario, ranks and the row's label, where "%s" stands for the LLM's
  # stage layers as `estimate` lowers them.
  big=scenarios/cpu-tiny-big-vit.json tiny=scenarios/cpu-tiny.json
  runs=(
    "frozen_aware|$big|1|PP2, stage_split frozen_aware (%s)"
    "uniform|$big|1|PP2, stage_split uniform (%s)"
    "profiled|$big|1|PP2, frozen-aware priced with a profile of this model (%s)"
    "pp4-frozen_aware|$big|4|PP4 (4 ranks), stage_split frozen_aware (%s)"
    "pp4-uniform|$big|4|PP4 (4 ranks), stage_split uniform (%s)"
    "frozen_aware_counts|$big|4|4 ranks, frozen-aware stage counts: $(sed -n 's/^frozen-aware choice *\(.*[0-9]\) *estimate.*/\1/p' "$root/stages.txt")"
    "freeze_unaware_counts|$big|4|4 ranks, freeze-unaware stage counts: $(sed -n 's/^freeze-unaware choice *\(.*[0-9]\) *estimate.*/\1/p' "$root/stages.txt")"
    "makespan|$tiny|1|CP2 (8 samples packed), cp_split makespan"
    "zigzag|$tiny|1|CP2 (8 samples packed), cp_split zigzag"
    "tp2-makespan|$tiny|4|TP2 x CP2 (4 ranks), cp_split makespan"
    "tp2-zigzag|$tiny|4|TP2 x CP2 (4 ranks), cp_split zigzag"
  )
  declare -A steps
  for rep in 1 2 3; do
    for run in "${runs[@]}"; do
      IFS='|' read -r plan scenario ranks label <<<"$run"
      nproc=()
      [[ $ranks == 1 ]] || nproc=(--nproc "$ranks")
      "$train" "$scenario" --plan "$root/$plan.json" "${nproc[@]}" --steps 20 --trace-steps 0 --no-checkpoint \
        --out "$root/$plan-$rep" >/dev/null
      steps[$plan]+=$(printf " | %.3f s" "$(med "$root/$plan-$rep")")
    done
  done
  echo "| run | repeat 1 | repeat 2 | repeat 3 | estimated step |"
  echo "|---|---|---|---|---|"
  for run in "${runs[@]}"; do
    IFS='|' read -r plan scenario ranks label <<<"$run"
    profile=()
    [[ $plan == profiled ]] && profile=(--profile "$root/profile.json")
    estimate=$("$tessera" estimate "$scenario" --plan "$root/$plan.json" "${profile[@]}")
    layers=$(sed -n 's/^stage layers *llm \([0-9a-z,]*\) .*/\1/p' <<<"$estimate" | tr , /)
    label=${label//%s/$layers}
    echo "| ${label//|/\\|}${steps[$plan]} | $(sed -n 's/^step time *\(.*\)/\1/p' <<<"$estimate") |"
  done
  rm -rf "$root"
fi

if [[ $what == tune ]]; then
  cases=${TUNE_CASES:-"cpu-tiny:2 cpu-tiny:4 cpu-tiny-big-vit:4 cpu-tiny-moe:4"}
  top=${TUNE_TOP:-4} steps=${TUNE_STEPS:-8}
  echo "== tune: sweep, train the $top best plans ($steps steps), calibrate, re-rank =="
  echo "| scenario at GPUs | analytic first = measured fastest finalist? | finalists' mean \\|error\\|: analytic / calibrated / held out | tune's choice | its measured step against the analytic first choice | the profile's error on it |"
  echo "|---|---|---|---|---|---|"
  root=out/bench-tune
  mkdir -p "$root"
  for c in $cases; do
    scenario=${c%%:*} gpus=${c##*:}
    dir=$root/$scenario-$gpus
    rm -rf "$dir"
    "$tessera" tune "scenarios/$scenario.json" --gpus "$gpus" --top "$top" --steps "$steps" \
      --train "$build/exec/tessera-train" --out "$dir" >"$dir.txt" 2>"$dir.log" ||
      { echo "| $scenario at $gpus | tune failed (see $dir.log) | | | | |"; continue; }
    python3 - "$dir/tune.json" "$scenario" "$gpus" <<'EOF2'
import json, sys
t = json.load(open(sys.argv[1]))
m = [f for f in t["finalists"] if f["status"] == "measured"]
mean = lambda key: sum(abs(f[key]) for f in m if key in f) / max(1, sum(key in f for f in m))
first, fastest = t["analytic_first_rank"], t["measured_fastest_rank"]
same = "yes" if first == fastest else (
    f"no: rank {fastest} is {t['gain_over_analytic_first_pct']:.1f}% faster")
errors = " / ".join(f"{mean(k):.1f}%" for k in ("analytic_error_pct", "calibrated_error_pct", "held_out_error_pct"))
r = t.get("recommended")
if r:
    held = f"{r['held_out_error_pct']:+.1f}%".replace("-", "\u2212") if "held_out_error_pct" in r else "(a finalist)"
    choice = r["layout"].replace("|", "\\|")
    print(f"| {sys.argv[2]} at {sys.argv[3]} | {same} | {errors} | {choice} | "
          f"{r['gain_over_analytic_first_pct']:.1f}% faster | {held} |")
else:
    print(f"| {sys.argv[2]} at {sys.argv[3]} | {same} | {errors} | none | | |")
EOF2
  done
fi
