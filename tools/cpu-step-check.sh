#!/usr/bin/env bash
# Step-time calibration on the CPU executor, end to end (issue 41): 18 plans of one GPT on
# the two devices of cpu-2, all with a global batch of 16 samples (pipeline or data
# parallelism, micro-batch sizes 1-8, 1F1B, GPipe and interleaved schedules; two of them with
# the optimizer offloaded). `hetflow calibrate --measured --design 6` chooses which 6 of the
# 16 others to measure; all 18 run on the executor,
# round by round (each plan once a round, so a slow spell of a shared host falls on all);
# `calibrate --measured` fits the 6 chosen plans' step times (medians over the rounds);
# `simulate --calibration` predicts the other 12, which are compared with what they measured,
# and the plan predicted fastest with the plan measured fastest.
#
#   bash tools/cpu-step-check.sh [--rounds 5] [--steps 6] [--keep DIR]
#
# A plan's measured step time: each run's mean over its steps after one warm-up step, the
# median over the rounds; its noise: half the range of its runs over that median. Exit 0 when
# every one of the 12 is predicted within 10 % and the plan predicted fastest is measured
# fastest (or within the noise of the fastest); 1 otherwise; 2 on bad arguments.
# Environment: HETFLOW (default build/tools/hetflow).
set -euo pipefail
cd "$(dirname "$0")/.."
HETFLOW=${HETFLOW:-build/tools/hetflow}
rounds=5
steps=6
keep=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --keep) keep=$2; shift 2 ;;
    -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "cpu-step-check: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
case "$rounds,$steps" in *[!0-9,]*|,*|*,) echo "cpu-step-check: --rounds and --steps take whole numbers" >&2; exit 2 ;; esac
if [ "$rounds" -lt 1 ] || [ "$steps" -lt 2 ]; then echo "cpu-step-check: expected --rounds >= 1, --steps >= 2" >&2; exit 2; fi
[ -x "$HETFLOW" ] || { echo "cpu-step-check: $HETFLOW not built" >&2; exit 2; }
if [ -n "$keep" ]; then work="$keep"; mkdir -p "$work"; else work=$(mktemp -d); trap 'rm -rf "$work"' EXIT; fi

exec /usr/bin/python3 - "$HETFLOW" "$work" "$rounds" "$steps" <<'PY'
import json, statistics, subprocess, sys
hetflow, work, rounds, steps = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
cluster, model = "cpu-2", "gpt:layers=4,hidden=128,heads=4,seq=64,vocab=512"
common = "--workspace 0 --precision fp32"
layouts = [f"--pipeline 2 --micro-batch {b} --microbatches {16 // b} --schedule {s}"
           for s in ["1f1b", "gpipe"] for b in [1, 2, 4, 8]]
layouts += [f"--pipeline 2 --micro-batch {b} --microbatches {16 // b} --schedule interleaved --virtual-stages 2"
            for b in [1, 2, 4]]
layouts += [f"--pipeline 1 --data 2 --micro-batch {b} --microbatches {8 // b}" for b in [1, 2, 4, 8]]
layouts += ["--pipeline 2 --stage-layers 4,2 --micro-batch 2 --microbatches 8"]
assert len(layouts) == 16
# Offloaded optimizers (issue 38), never fitted: their host steps and copies are predicted from
# the cluster's host figures, the rest as for the others.
offloaded = ["--pipeline 1 --data 2 --micro-batch 2 --microbatches 4 --offload-optimizer",
             "--pipeline 2 --micro-batch 2 --microbatches 8 --schedule 1f1b --offload-optimizer"]

def hf(*args):
    return subprocess.run([hetflow, *args], check=True, capture_output=True, text=True).stdout

# The candidates' table, and the 6 the design chooses.
with open(f"{work}/candidates.csv", "w") as f:
    f.write("cluster,model,options\n")
    for l in layouts:
        f.write(f'{cluster},"{model}","{l} {common}"\n')
design = json.loads(hf("calibrate", "--measured", f"{work}/candidates.csv", "--design", "6",
                       "-o", f"{work}/chosen.csv", "--json"))
train = sorted(c["index"] for c in design["chosen"])
layouts += offloaded  # (after the design: it chooses among the 16)
test = [i for i in range(len(layouts)) if i not in train]
print(f"calibrate --design chose plans {', '.join(str(i + 1) for i in train)} of the 16 to measure for the fit")

# Every plan on the executor, round by round.
for i, l in enumerate(layouts):
    hf("plan", "--cluster", cluster, "--model", model, *l.split(), *common.split(), "--out", f"{work}/p{i}.json")
times = [[] for _ in layouts]
for r in range(rounds):
    for i in range(len(layouts)):
        j = json.loads(hf("run", "--plan", f"{work}/p{i}.json", "--steps", str(steps), "--warmup", "1", "--json"))
        times[i].append(j["iteration_time_s"])
measured = [statistics.median(t) for t in times]
noise = [(max(t) - min(t)) / 2 / m for t, m in zip(times, measured)]
print(f"ran all {len(layouts)} plans {rounds} times ({steps} steps after a warm-up step each); noise, the median over plans of half "
      f"the range of a plan's runs over their median: {100 * statistics.median(noise):.1f} %")

# Fit the chosen 6, predict the other 10.
with open(f"{work}/runs.csv", "w") as f:
    f.write("cluster,model,options,step_s\n")
    for i in train:
        f.write(f'{cluster},"{model}","{layouts[i]} {common}",{measured[i]!r}\n')
fit = json.loads(hf("calibrate", "--measured", f"{work}/runs.csv", "--folds", "3", "-o", f"{work}/fitted.yaml", "--json"))
print("fitted: " + ", ".join(f"{p['name']} {p['value']:.4g}" for p in fit["parameters"]) +
      f"; in-sample MAPE {100 * fit['mape']:.2f} %, 3-fold cross-validated {100 * fit['cv_mape']:.2f} %")
for w in fit["warnings"]:
    print(f"  warning: {w}")
predicted = {}
for i in range(len(layouts)):
    predicted[i] = json.loads(hf("simulate", "--plan", f"{work}/p{i}.json", "--calibration", f"{work}/fitted.yaml",
                                 "--json"))["iteration_time_s"]

print(f"\n  {'#':>2}  {'plan':72}  {'measured':>9} {'noise':>6}  {'predicted':>9}  {'error':>8}")
for i, l in enumerate(layouts):
    mark = "fit" if i in train else ""
    print(f"  {i + 1:2}  {l:72}  {1e3 * measured[i]:6.2f} ms {100 * noise[i]:4.1f} %  {1e3 * predicted[i]:6.2f} ms"
          f"  {100 * (predicted[i] / measured[i] - 1):+6.2f} %  {mark}")
errors = [abs(predicted[i] / measured[i] - 1) for i in test]
within = sum(e <= 0.10 for e in errors)
fastest_measured = min(range(len(layouts)), key=lambda i: measured[i])
fastest_predicted = min(range(len(layouts)), key=lambda i: predicted[i])
# Picked right: the same plan, or one whose measured time is within the noise of the fastest's.
picked = fastest_predicted == fastest_measured or \
    measured[fastest_predicted] <= measured[fastest_measured] * (1 + max(noise[fastest_predicted], noise[fastest_measured]))
print(f"\nthe {len(test)} not fitted: {within} of {len(test)} within 10 %, MAPE {100 * statistics.mean(errors):.2f} %, worst "
      f"{100 * max(errors):.2f} %")
print(f"fastest measured: plan {fastest_measured + 1} ({1e3 * measured[fastest_measured]:.2f} ms); predicted fastest: plan "
      f"{fastest_predicted + 1} (measured {1e3 * measured[fastest_predicted]:.2f} ms)"
      + ("" if fastest_predicted == fastest_measured else (", within the noise" if picked else ", NOT within the noise")))
ok = within == len(test) and picked
goals = f"({len(test)} of {len(test)} within 10 %, the fastest picked)"
print("within the goals " + goals if ok else "NOT within the goals " + goals)
sys.exit(0 if ok else 1)
PY
