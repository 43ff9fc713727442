#!/usr/bin/env bash
# Megatron-LM's weak-scaling table (Narayanan et al., SC'21, "Efficient Large-Scale Language
# Model Training on GPU Clusters Using Megatron-LM", Table 1: GPT models of 1.7B to 1T
# parameters on 32 to 3,072 A100 80 GB GPUs of NVIDIA's Selene) against hetflow's simulator.
# Each row is simulated as the authors ran it (examples/sc21/run_table_1.sh of Megatron-LM:
# tensor, pipeline and data parallel sizes, micro-batch and global batch sizes, interleaved
# stages where the script gives --num-layers-per-virtual-pipeline-stage, full recomputation,
# sequence 2048, vocabulary 51,200, fp16) on `selene-N`, folded (--fold: one data-parallel
# replica simulated for all, which Selene's non-blocking fabric allows), and its TFLOP/s per GPU are counted
# as the paper counts them:
#     F = 96 B s l h^2 (1 + s / 6h + V / 16lh)   per iteration (with recomputation)
#     TFLOP/s per GPU = F / (iteration time x GPUs)
# Prints per row the predicted and published TFLOP/s per GPU, the error, and the
# simulation's own wall time and peak memory; a row that exceeds --timeout is reported so.
#
#   bash tools/validate-table1.sh [--rows 1,2,3] [--timeout S] [--json] [--calibration FILE]
# Environment: HETFLOW (default build/tools/hetflow).
set -euo pipefail
cd "$(dirname "$0")/.."

rows="1,2,3,4,5,6,7,8,9,10"
timeout_s=300
json=0
calibration=()
while [ $# -gt 0 ]; do
  case "$1" in
    --rows) rows="$2"; shift 2 ;;
    --timeout) timeout_s="$2"; shift 2 ;;
    --json) json=1; shift ;;
    --calibration) calibration=(--calibration "$2"); shift 2 ;;
    -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "validate-table1: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
hetflow="${HETFLOW:-build/tools/hetflow}"
[ -x "$hetflow" ] || { echo "validate-table1: $hetflow not built" >&2; exit 2; }

# row: params(B) heads hidden layers TP PP GPUs MBS GBS layers-per-virtual-stage(0: none) published TFLOP/s per GPU
table=(
  "1.7   24  2304  24 1  1   32 16  512 0 137"
  "3.6   32  3072  30 2  1   64 16  512 0 138"
  "7.5   32  4096  36 4  1  128 16  512 0 142"
  "18.4  48  6144  40 8  1  256  8 1024 0 135"
  "39.1  64  8192  48 8  2  512  4 1536 0 138"
  "76.1  80 10240  60 8  4 1024  2 1792 5 140"
  "145.6 96 12288  80 8  8 1536  2 2304 5 148"
  "310.1 128 16384 96 8 16 1920  1 2160 3 155"
  "529.6 128 20480 105 8 35 2520 1 2520 1 163"
  "1008 160 25600 128 8 64 3072  1 3072 0 163"
)
seq=2048
vocab=51200
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

results=()
IFS=',' read -r -a wanted <<< "$rows"
for r in "${wanted[@]}"; do
  row="${table[$((r - 1))]:-}"
  [ -n "$row" ] || { echo "validate-table1: no row $r (1 to ${#table[@]})" >&2; exit 2; }
  read -r params heads hidden layers tp pp gpus mbs gbs lpvs published <<< "$row"
  dp=$((gpus / (tp * pp)))
  nodes=$((gpus / 8))
  interleave=()
  if [ "$lpvs" -gt 0 ]; then
    interleave=(--schedule interleaved --virtual-stages $((layers / pp / lpvs)))
  fi
  args=(simulate --cluster "selene-$nodes" --model "gpt:layers=$layers,hidden=$hidden,heads=$heads,seq=$seq,vocab=$vocab"
        --precision fp16 --tensor "$tp" --pipeline "$pp" --data "$dp" --micro-batch "$mbs" --global-batch "$gbs"
        --recompute full --iterations 2 --fold "${interleave[@]}" "${calibration[@]}" --json)
  status=0
  /usr/bin/time -f "%e %M" -o "$work/time" timeout "$timeout_s" "$hetflow" "${args[@]}" > "$work/out.json" 2> "$work/err" || status=$?
  read -r wall_s rss_kb < <(tail -1 "$work/time")
  if [ "$status" = 0 ]; then
    iteration_s=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['iteration_time_s'])" "$work/out.json")
  else
    iteration_s=""
    [ "$status" = 124 ] && note="over ${timeout_s} s" || note="exit $status: $(head -c 300 "$work/err" | tr '\n' ' ')"
  fi
  results+=("$r|$params|$gpus|$tp|$pp|$dp|$mbs|$gbs|$lpvs|$layers|$hidden|$published|$iteration_s|$wall_s|$rss_kb|${note:-}")
  note=""
done

printf '%s\n' "${results[@]}" > "$work/results"
/usr/bin/python3 - "$work/results" "$seq" "$vocab" "$json" <<'EOF'
import json, sys
path, seq, vocab, as_json = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
rows = []
for line in open(path).read().splitlines():
    r, params, gpus, tp, pp, dp, mbs, gbs, lpvs, l, h, published, it, wall, rss, note = line.split("|")
    gpus, l, h, gbs = int(gpus), int(l), int(h), int(gbs)
    flops = 96 * gbs * seq * l * h * h * (1 + seq / (6 * h) + vocab / (16 * l * h))
    row = {"row": int(r), "params_b": float(params), "gpus": gpus, "tensor": int(tp), "pipeline": int(pp), "data": int(dp),
           "micro_batch": int(mbs), "global_batch": gbs, "published_tflops_per_gpu": float(published),
           "sim_wall_s": float(wall), "sim_peak_rss_bytes": int(rss) * 1024, "note": note}
    if it:
        row["iteration_time_s"] = float(it)
        row["predicted_tflops_per_gpu"] = flops / float(it) / gpus / 1e12
        row["error_pct"] = (row["predicted_tflops_per_gpu"] - row["published_tflops_per_gpu"]) / row["published_tflops_per_gpu"] * 100
    rows.append(row)
errors = [abs(r["error_pct"]) for r in rows if "error_pct" in r]
summary = {"rows": rows, "mean_abs_error_pct": sum(errors) / len(errors) if errors else None,
           "max_abs_error_pct": max(errors) if errors else None, "rows_simulated": len(errors)}
if as_json:
    print(json.dumps(summary))
    sys.exit(0)
print("Narayanan et al. (SC21) Table 1 on selene-N, simulated: TFLOP/s per GPU = 96 B s l h^2 (1 + s/6h + V/16lh) / (iteration time x GPUs)")
print("  row  params  GPUs  t   p   d  iteration  predicted  published    error  sim wall   sim RSS")
for r in rows:
    done = "error_pct" in r
    it = f"{r['iteration_time_s']:9.2f}s" if done else f"{'-':>10}"
    pred = f"{r['predicted_tflops_per_gpu']:10.1f}" if done else f"{'-':>10}"
    err = f"{r['error_pct']:+7.1f}%" if done else f"{'-':>8}"
    print(f"  {r['row']:>3} {r['params_b']:>6}B {r['gpus']:>5} {r['tensor']:>2} {r['pipeline']:>3} {r['data']:>3} {it} {pred}"
          f" {r['published_tflops_per_gpu']:10.0f} {err} {r['sim_wall_s']:8.1f}s {r['sim_peak_rss_bytes'] / 2**30:8.2f}G  {r['note']}")
if errors:
    print(f"  mean |error| {summary['mean_abs_error_pct']:.1f}% over {len(errors)} rows, largest {summary['max_abs_error_pct']:.1f}%")
EOF
