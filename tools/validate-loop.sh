#!/usr/bin/env bash
# The measurement loop end to end, on the CPU executor:
#   1. run plan A several times (traces), 2. calibrate from A's traces, 3. replay A with the
#   calibration, 4. predict plans B-E (another schedule, another micro-batch count, another
#   stage count on the same devices, data parallelism) from A alone, 5. run B-E for real,
#   6. print predicted against measured iteration time, medians of --runs runs each.
# Two predictions per plan: "replayed" runs the plan with A's measured durations moved to
# the layers they computed (hetflow replay --as-plan, with the calibration's links and
# dispatch), "calibrated" simulates it with the calibration alone (hetflow simulate
# --calibration). The error is the replayed one's. Noise: for each plan half the range of
# its runs over their median; the median of that over the plans.
#
#   bash tools/validate-loop.sh [--runs N] [--steps N] [--json] [--keep DIR]
# Environment: HETFLOW (default build/tools/hetflow), PYTHON (default /usr/bin/python3).
set -euo pipefail
cd "$(dirname "$0")/.."

runs=5
steps=8
json=0
keep=""
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) runs="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --json) json=1; shift ;;
    --keep) keep="$2"; shift 2 ;;
    -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "validate-loop: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
case "$runs$steps" in *[!0-9]*|'') echo "validate-loop: --runs and --steps take whole numbers" >&2; exit 2 ;; esac
if [ "$runs" -lt 1 ] || [ "$steps" -lt 2 ]; then echo "validate-loop: expected --runs >= 1, --steps >= 2" >&2; exit 2; fi

hetflow="${HETFLOW:-build/tools/hetflow}"
python="${PYTHON:-/usr/bin/python3}"
[ -x "$hetflow" ] || { echo "validate-loop: $hetflow not built (cmake --build --preset default)" >&2; exit 2; }

if [ -n "$keep" ]; then dir="$keep"; mkdir -p "$dir"; else dir="$(mktemp -d)"; trap 'rm -rf "$dir"' EXIT; fi
say() { if [ "$json" = 0 ]; then echo "$@"; fi; }

# Every plan: the same network on the same two CPU devices, micro-batches of 2 samples.
common="--cluster cpu-2 --model gpt:layers=4,hidden=128,heads=4,seq=64,vocab=512 --workspace 0 --precision fp32 --micro-batch 2"
names=(A B C D E)
declare -A layout=(
  [A]="--pipeline 2 --microbatches 4"
  [B]="--pipeline 2 --microbatches 4 --schedule gpipe"
  [C]="--pipeline 2 --microbatches 8"
  [D]="--pipeline 2 --microbatches 4 --schedule interleaved --virtual-stages 2"
  [E]="--pipeline 1 --data 2 --microbatches 2"
)
for n in "${names[@]}"; do
  # shellcheck disable=SC2086
  "$hetflow" plan $common ${layout[$n]} --out "$dir/$n.json" > /dev/null
done

# 1 and 5: the runs, interleaved plan by plan so that slow spells of the machine spread over all.
say "running plans A-E on the CPU executor, $runs runs of $steps steps each (+1 warm-up)"
for r in $(seq 1 "$runs"); do
  for n in "${names[@]}"; do
    "$hetflow" run --plan "$dir/$n.json" --steps "$steps" --warmup 1 --json --trace "$dir/$n.$r.csv" > "$dir/$n.$r.run.json"
  done
done

# 2: calibrate from A's traces alone.
traces=()
for r in $(seq 1 "$runs"); do traces+=("$dir/A.$r.csv"); done
"$hetflow" calibrate "${traces[@]}" --plan "$dir/A.json" -o "$dir/calibration.yaml" > "$dir/calibrate.txt"
say "calibrated from A's $runs traces: $dir/calibration.yaml"

# 3 and 4: replays of A, and predictions of B-E from each of A's traces.
for r in $(seq 1 "$runs"); do
  "$hetflow" replay "$dir/A.$r.csv" --plan "$dir/A.json" --calibration "$dir/calibration.yaml" --json > "$dir/A.$r.replay.json"
  for n in B C D E; do
    "$hetflow" replay "$dir/A.$r.csv" --plan "$dir/A.json" --calibration "$dir/calibration.yaml" \
      --as-plan "$dir/$n.json" --json > "$dir/$n.$r.predicted.json"
  done
done
for n in "${names[@]}"; do
  "$hetflow" simulate --plan "$dir/$n.json" --calibration "$dir/calibration.yaml" --json > "$dir/$n.calibrated.json"
done

# 6: the table.
"$python" - "$dir" "$runs" "$json" <<'EOF'
import json, statistics, sys
dir, runs, as_json = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
load = lambda path: json.load(open(path))
names = ["A", "B", "C", "D", "E"]
what = {"A": "1F1B, 2 stages, 4 micro-batches (calibrates)", "B": "GPipe", "C": "8 micro-batches",
        "D": "interleaved, 4 stages on 2 devices", "E": "data parallel, 2 workers"}
measured = {n: [load(f"{dir}/{n}.{r}.run.json")["iteration_time_s"] for r in range(1, runs + 1)] for n in names}
median = {n: statistics.median(v) for n, v in measured.items()}
noise = statistics.median((max(v) - min(v)) / 2 / statistics.median(v) for v in measured.values()) * 100
replays = [load(f"{dir}/A.{r}.replay.json") for r in range(1, runs + 1)]
replay_error = statistics.median(j["iteration_time_error"] for j in replays) * 100
plans = []
for n in names[1:]:
    predicted = statistics.median(load(f"{dir}/{n}.{r}.predicted.json")["what_if"]["what_if"]["iteration_time_s"]
                                  for r in range(1, runs + 1))
    calibrated = load(f"{dir}/{n}.calibrated.json")["iteration_time_s"]
    plans.append({"name": n, "plan": what[n], "predicted_s": predicted, "calibrated_s": calibrated,
                  "measured_s": median[n], "error_pct": (predicted - median[n]) / median[n] * 100,
                  "calibrated_error_pct": (calibrated - median[n]) / median[n] * 100})
if as_json:
    print(json.dumps({"replay_error_pct": replay_error, "plans": plans, "noise_pct": noise, "runs": runs,
                      "measured_a_s": median["A"]}))
    sys.exit(0)
ms = lambda s: f"{s * 1e3:8.2f} ms"
print(f"\nA, {what['A']}: measured {ms(median['A'])}, replayed with the calibration: {replay_error:+.2f} % "
      f"(median over its {runs} traces)")
print(f"\n  plan  {'':36}  measured     predicted   error    calibrated   error")
for p in plans:
    print(f"  {p['name']:4}  {p['plan']:36}  {ms(p['measured_s'])}  {ms(p['predicted_s'])}  {p['error_pct']:+6.2f} %"
          f"  {ms(p['calibrated_s'])}  {p['calibrated_error_pct']:+6.2f} %")
print(f"\n  measured: median of {runs} runs; predicted: replayed with A's layer durations (hetflow replay --as-plan),"
      f" median over A's traces;\n  calibrated: simulated with the calibration alone. Noise: half the range of a plan's"
      f" runs over their median, median over the plans: {noise:.2f} %")
EOF
