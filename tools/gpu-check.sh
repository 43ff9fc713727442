#!/usr/bin/env bash
# The checks that need a GPU, in one go, on a machine with NVIDIA GPUs: configures and builds
# hetflow with CUDA (nvcc, cuBLAS, NCCL), runs the GPU tests (the CUDA kernels against their
# CPU references, the CUDA back end on 1- and 2-device plans), measures cublasGemmEx BF16
# throughput beside the part's catalog peak and, with two GPUs or more, NCCL all-reduce bus
# bandwidth (nccl-tests' formulas), runs `hetflow run --backend cuda` on a small plan (with
# two GPUs, also as two MPI processes), real training math on one GPU against the cpu back
# end (the same losses) and a GPT-2 124M real-math step (tokens/s, MFU), and prints a
# summary. Meant to take under 5 minutes (the build dominates; a second run reuses it).
#
#   bash tools/gpu-check.sh [--build-dir DIR] [--jobs N]
#
# Without a visible GPU it says so and exits 0: there is nothing to check. Exit 1 when a check
# fails (the summary says which), 2 for a bad option.
set -euo pipefail
cd "$(dirname "$0")/.."

build="build-gpu"
jobs=$(nproc 2>/dev/null || echo 2)
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) build="$2"; shift 2 ;;
    --jobs) jobs="$2"; shift 2 ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "gpu-check: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done

# GPUs this process may use: nvidia-smi's list, narrowed by CUDA_VISIBLE_DEVICES when set.
gpus=0
if command -v nvidia-smi >/dev/null 2>&1; then
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
fi
if [ "${CUDA_VISIBLE_DEVICES+set}" = set ] && [ "$gpus" -gt 0 ]; then
  if [ -z "$CUDA_VISIBLE_DEVICES" ] || [ "$CUDA_VISIBLE_DEVICES" = "-1" ]; then
    gpus=0
  else
    listed=$(echo "$CUDA_VISIBLE_DEVICES" | tr ',' '\n' | grep -c . || true)
    gpus=$(( listed < gpus ? listed : gpus ))
  fi
fi
if [ "$gpus" -eq 0 ]; then
  echo "no GPU visible: nothing to check"
  exit 0
fi

summary=()
failed=0
started=$(date +%s)
log_dir="$build/gpu-check"
# step NAME COMMAND...: runs it with its output in $log_dir/NAME.log (and on the terminal),
# records PASS or FAIL and the seconds it took; the script goes on either way.
step() {
  local name="$1"; shift
  local t0; t0=$(date +%s)
  mkdir -p "$log_dir"
  echo "== $name: $*"
  if "$@" 2>&1 | tee "$log_dir/$name.log"; then
    summary+=("PASS  $name ($(( $(date +%s) - t0 )) s)")
  else
    summary+=("FAIL  $name ($(( $(date +%s) - t0 )) s): see $log_dir/$name.log")
    failed=1
  fi
}

nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm --format=csv,noheader || true

step configure cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DHETFLOW_CUDA=ON -DHETFLOW_BENCH=OFF
if ! grep -q "building the CUDA back end" "$log_dir/configure.log" && ! grep -q '^HETFLOW_NCCL_LIBRARY:FILEPATH=/' "$build/CMakeCache.txt"; then
  summary+=("FAIL  the CUDA back end is not in this build (nvcc, cuBLAS or NCCL not found: see $log_dir/configure.log)")
  failed=1
fi
step build cmake --build "$build" -j "$jobs" --target hetflow hetflow-gpu-probe hetflow_kernels_tests hetflow_exec_tests

# GPU tests: they skip (saying why) without a GPU, so a skip here is a failure (but for the
# 2-device tests on a machine with one GPU).
# shellcheck disable=SC2317  # called through step
gpu_tests() {
  local binary="$1" filter="$2" out
  out=$("$build/tests/$binary" --gtest_filter="$filter" --gtest_brief=0 2>&1) || { echo "$out"; return 1; }
  echo "$out" | tail -n 40
  if echo "$out" | grep -q '\[  SKIPPED \]' && [ "$gpus" -ge 2 ]; then
    echo "GPU tests skipped on a machine with $gpus GPUs"
    return 1
  fi
  return 0
}
step kernel-tests gpu_tests hetflow_kernels_tests 'TransformerCuda.*:MatmulCuda.*'
step backend-tests gpu_tests hetflow_exec_tests 'CudaBackend.*:CudaPlan.*:DecoderOps.Cuda*'

step gemm "$build/tools/hetflow-gpu-probe" gemm --gpu 0 --n 4096 --precision bf16
if [ "$gpus" -ge 2 ]; then
  step nccl "$build/tools/hetflow-gpu-probe" all-reduce --gpus "$gpus" --bytes 268435456
else
  summary+=("----  one GPU: no NCCL bandwidth")
fi

devices=$(( gpus >= 2 ? 2 : 1 ))
step run "$build/tools/hetflow" run --backend cuda --compute proxy --cluster "cpu-$devices" --pipeline "$devices" \
  --model gpt:layers=4,hidden=512,heads=8,seq=256,vocab=8192 --microbatches 4 --workspace 0 --steps 3 --warmup 1
# The same plan as two MPI processes, one GPU each (NCCL's unique id sent over MPI).
if [ "$gpus" -ge 2 ] && command -v mpirun >/dev/null 2>&1; then
  step mpi-run env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe -np 2 \
    "$build/tools/hetflow" run --backend cuda --compute proxy --cluster cpu-2 --pipeline 2 \
    --model gpt:layers=4,hidden=512,heads=8,seq=256,vocab=8192 --microbatches 4 --workspace 0 --steps 3 --warmup 1
else
  summary+=("----  fewer than two GPUs (or no mpirun): the CUDA back end across processes is not run")
fi

# Real training math: a small GPT on one GPU and on the cpu back end, the same seed and data:
# every step's loss within 1e-3 relative (fp32 sums on the GPU, double ones on the CPU).
small_real=(run --compute real --cluster cpu-1 --model gpt:layers=4,hidden=256,heads=4,seq=256,vocab=8192
            --microbatches 2 --workspace 0 --steps 4 --warmup 1)
step real-run "$build/tools/hetflow" "${small_real[@]}" --backend cuda
step real-run-cpu "$build/tools/hetflow" "${small_real[@]}" --backend cpu
# shellcheck disable=SC2317  # called through step
same_losses() {
  paste <(grep -oE 'loss [0-9.]+' "$log_dir/real-run.log" | cut -d' ' -f2) \
        <(grep -oE 'loss [0-9.]+' "$log_dir/real-run-cpu.log" | cut -d' ' -f2) |
    awk 'BEGIN { n = 0; bad = 0 }
         { n++; d = $1 - $2; if (d < 0) d = -d; printf "step %d: cuda %s cpu %s\n", n - 1, $1, $2;
           if (d > 1e-3 * $2) bad++ }
         END { if (n == 0) { print "no losses to compare"; exit 1 } exit bad > 0 }'
}
step real-losses same_losses
# GPT-2 124M, real math in FP32 on one GPU: tokens/s and MFU against the GPU's peak.
step gpt2-real timeout 240 "$build/tools/hetflow" run --backend cuda --compute real --cluster cpu-1 --model gpt2-124m \
  --micro-batch 4 --microbatches 1 --workspace 0 --steps 3 --warmup 1

echo
echo "gpu-check summary ($gpus GPU(s), $(( $(date +%s) - started )) s):"
for line in "${summary[@]}"; do echo "  $line"; done
for name in gemm nccl run mpi-run real-losses gpt2-real; do
  if [ -f "$log_dir/$name.log" ]; then
    grep -E '^(gemm|all-reduce|ran|step [0-9]+:) |iteration time|tokens/s|MFU' "$log_dir/$name.log" | sed 's/^/  /' || true
  fi
done
exit "$failed"
