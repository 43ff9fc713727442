#!/usr/bin/env bash
# HetPipe's virtual-worker policies next to Horovod-style data parallelism on the HetPipe
# testbed (4 nodes x 4 GPUs of four types), VGG-19 and ResNet-152, simulated.
# Usage: bash tools/compare-hetpipe.sh [path/to/hetflow]     (prints a Markdown table)
set -euo pipefail
hetflow="${1:-./build/tools/hetflow}"
common=(--cluster hetpipe-testbed --micro-batch 32 --iterations 6 --json)
echo "| policy | sync | VGG-19 samples/s | ResNet-152 samples/s |"
echo "|---|---|---|---|"
row() {
  local name="$1" sync="$2"; shift 2
  local cells=()
  for model in vgg19 resnet152; do
    if out=$("$hetflow" simulate --model "$model" "${common[@]}" "$@" 2>/dev/null); then
      cells+=("$(sed -n 's/.*"throughput_samples_per_s": \([0-9.e+-]*\).*/\1/p' <<<"$out" | head -1 | xargs printf '%.1f')")
    else
      cells+=("does not fit / fails")
    fi
  done
  echo "| $name | $sync | ${cells[0]} | ${cells[1]} |"
}
row "Horovod-style DP (16 replicas)" "ring all-reduce" --policy uniform --pipeline 1 --data 16 --microbatches 1
for policy in hetpipe-np hetpipe-ed hetpipe-hd hetpipe-ed-local; do
  row "$policy" "WSP D=0" --policy "$policy" --microbatches 4
done
row "hetpipe-ed-local" "WSP D=2" --policy hetpipe-ed-local --microbatches 4 --sync wsp --staleness 2
