#!/usr/bin/env bash
# The search's best plan, run for real on the CPU executor. Calibrates a cpu-N cluster from
# one measured data-parallel run, searches with that calibration, then runs the best plan and
# the next ranked candidates that the search predicts at least --apart (15 %) slower than the
# one before (plans that tie in prediction say nothing about its ranking) on the executor, and
# prints predicted (simulated) against measured iteration times, in the search's order, and
# whether the measured order agrees.
#
#   bash tools/search-check.sh [--cluster cpu-2:probed] [--model SPEC] [--global-batch 16] [--others 2] [--apart 0.15]
#
# Every plan runs the model's own training math (`--compute real`), so the times compare like
# with like; a ranked candidate the real math cannot train is passed over, and said so.
# The cluster's speed is probed (cpu-N:probed): the nominal cpu-N speed may understate this
# machine, and a calibration cannot raise an efficiency above 1.
#
# Exit 0 when every plan ran to completion (agreement is reported, not enforced: the machine
# is shared and a few percent apart is within its noise); 1 when a plan failed to run.
set -euo pipefail
HETFLOW=${HETFLOW:-build/tools/hetflow}
PY=/usr/bin/python3
cluster=cpu-2:probed
model="gpt:layers=4,hidden=256,heads=4,seq=128,vocab=1024"
global_batch=16
others=2
apart=0.15
steps=5
while [[ $# -gt 0 ]]; do
  case "$1" in
    --cluster) cluster=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --global-batch) global_batch=$2; shift 2 ;;
    --others) others=$2; shift 2 ;;
    --apart) apart=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    *) echo "search-check: unknown option $1" >&2; exit 2 ;;
  esac
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "1. calibrate $cluster from a measured data-parallel run of $model"
"$HETFLOW" plan --cluster "$cluster" --model "$model" --global-batch "$global_batch" -o "$work/dp.json" >/dev/null
"$HETFLOW" run --plan "$work/dp.json" --compute real --steps "$steps" --trace "$work/dp.csv" >/dev/null
"$HETFLOW" calibrate --trace "$work/dp.csv" --plan "$work/dp.json" -o "$work/calibration.yaml" >/dev/null

echo "2. search $cluster with that calibration"
"$HETFLOW" search --cluster "$cluster" --model "$model" --global-batch "$global_batch" \
  --calibration "$work/calibration.yaml" --top 200 --json --out "$work/best.json" >"$work/search.json"

echo "3. run the best plan and the next $others ranked at least $apart apart on the executor"
"$PY" - "$work" <<'EOF' >"$work/plans.txt"
import json, sys
ranked = json.load(open(f"{sys.argv[1]}/search.json"))["ranked"]
for i, r in enumerate(ranked):
    print(i, f'{r["iteration_time_s"]:.4f}', r["policy"], r["tensor"], r["pipeline"], r["micro_batch"], r["global_batch"],
          r["schedule"], r["virtual_stages"], r["recompute"], r["sync"], r["plan"].replace(" ", "_"), sep="\t")
EOF
failed=0
chosen=0
last=""
printf '  %-4s %-72s %10s %10s\n' rank plan predicted measured
while IFS=$'\t' read -r rank predicted policy tensor pipeline mb gb schedule stages recompute sync summary; do
  ((chosen > others)) && break
  if [[ -n $last ]] && ! "$PY" -c "import sys; sys.exit(float(sys.argv[1]) < float(sys.argv[2]) * (1 + float(sys.argv[3])))" \
    "$predicted" "$last" "$apart"; then
    continue
  fi
  plan="$work/plan$rank.json"
  if [[ $rank == 0 ]]; then
    cp "$work/best.json" "$plan"
  else
    "$HETFLOW" plan --cluster "$cluster" --model "$model" --policy "$policy" --tensor "$tensor" --pipeline "$pipeline" \
      --micro-batch "$mb" --global-batch "$gb" --schedule "$schedule" --virtual-stages "$stages" \
      --recompute "$recompute" --sync "$sync" -o "$plan" >/dev/null
  fi
  if "$HETFLOW" run --plan "$plan" --compute real --steps "$steps" --json >"$work/run$rank.json" 2>"$work/run$rank.err"; then
    measured=$("$PY" -c "import json,sys; print(f\"{json.load(open(sys.argv[1]))['iteration_time_s']:.4f}\")" "$work/run$rank.json")
  elif [[ $rank != 0 ]] && grep -q "plan cannot run: " "$work/run$rank.err"; then
    echo "  (passed over rank $((rank + 1)), ${summary//_/ }: $(grep -o 'plan cannot run: .*' "$work/run$rank.err"))"
    continue
  else
    measured=failed
    failed=1
    sed 's/^/    /' "$work/run$rank.err" >&2
  fi
  echo "$chosen $predicted $measured" >>"$work/times.txt"
  printf '  %-4s %-72s %10s %10s\n' $((rank + 1)) "${summary//_/ }" "$predicted" "$measured"
  chosen=$((chosen + 1))
  last=$predicted
done <"$work/plans.txt"

"$PY" - "$work/times.txt" <<'EOF'
import sys
rows = [line.split() for line in open(sys.argv[1])]
measured = [float(r[2]) for r in rows if r[2] != "failed"]
if len(measured) == len(rows):
    order = sorted(range(len(rows)), key=lambda i: measured[i])
    print("measured order (by iteration time):", " ".join(str(i + 1) for i in order),
          "- ranks as predicted" if order == list(range(len(rows))) else "- differs from the prediction")
    print("best measured / next measured:", " ".join(f"{measured[0] / m:.3f}" for m in measured[1:]))
EOF
exit $failed
