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
#   bash tools/gpu-check.sh --bundle ARCHIVE [--build-dir DIR]
#
# --bundle runs the programs packed by tools/gpu-bundle.sh instead of building them: for a
# GPU machine without Debian's packages. Their libraries come from the archive, CUDA's
# (cudart, cuBLAS, NCCL) from that machine: the loader's cache, else the first match under
# /usr/local, /opt and /usr/lib (the CUDA toolkit, or Python's nvidia-* wheels).
#
# Without a visible GPU it says so and exits 0: there is nothing to check. Exit 1 when a check
# fails (the summary says which), 2 for a bad option.
set -euo pipefail
cd "$(dirname "$0")/.."

build="build-gpu"
bundle=""
jobs=$(nproc 2>/dev/null || echo 2)
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) build="$2"; shift 2 ;;
    --jobs) jobs="$2"; shift 2 ;;
    --bundle) bundle="$2"; shift 2 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
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

if [ -n "$bundle" ]; then
  # The packed programs, and CUDA's libraries from this machine.
  # shellcheck disable=SC2317  # called through step
  unpack() {
    rm -rf "$build/bundle" && mkdir -p "$build/bundle" || return 1
    if command -v xz >/dev/null 2>&1; then
      xz -dc "$bundle" | tar -C "$build/bundle" -xf - || return 1
    else  # no xz-utils: Python's lzma
      python3 -c 'import sys, tarfile
safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
tarfile.open(sys.argv[1], "r:xz").extractall(sys.argv[2], **safe)' "$bundle" "$build/bundle" || return 1
    fi
    cat "$build/bundle/README"
  }
  step unpack unpack
  # shellcheck disable=SC2317  # called through step
  find_cuda_libraries() {
    local lib dir missing=0 dirs=""
    while read -r lib; do
      if ldconfig -p 2>/dev/null | grep -q " $lib "; then echo "$lib: the loader's cache"; continue; fi
      dir=$(find /usr/local /opt /usr/lib -name "$lib" -printf '%h\n' -quit 2>/dev/null)
      if [ -z "$dir" ]; then echo "$lib: NOT FOUND on this machine"; missing=1; continue; fi
      echo "$lib: $dir"
      dirs="$dirs:$dir"
    done < "$build/bundle/cuda-libs"
    echo "$dirs" > "$build/bundle/cuda-dirs"
    return "$missing"
  }
  step cuda-libraries find_cuda_libraries
  cuda_dirs=$(cat "$build/bundle/cuda-dirs" 2>/dev/null || true)
  LD_LIBRARY_PATH="$(realpath "$build/bundle/lib")$cuda_dirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export LD_LIBRARY_PATH
  bin_tests="$build/bundle/bin"
  bin_tools="$build/bundle/bin"
else
  step configure cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DHETFLOW_CUDA=ON -DHETFLOW_BENCH=OFF
  if ! grep -q "building the CUDA back end" "$log_dir/configure.log" && ! grep -q '^HETFLOW_NCCL_LIBRARY:FILEPATH=/' "$build/CMakeCache.txt"; then
    summary+=("FAIL  the CUDA back end is not in this build (nvcc, cuBLAS or NCCL not found: see $log_dir/configure.log; without Debian's packages, pack the programs elsewhere with tools/gpu-bundle.sh and pass --bundle)")
    failed=1
  fi
  step build cmake --build "$build" -j "$jobs" --target hetflow hetflow-gpu-probe hetflow_kernels_tests hetflow_exec_tests
  bin_tests="$build/tests"
  bin_tools="$build/tools"
fi

# GPU tests: they skip (saying why) without a GPU, so a skip here is a failure (but for the
# 2-device tests on a machine with one GPU).
# shellcheck disable=SC2317  # called through step
gpu_tests() {
  local binary="$1" filter="$2" out
  out=$("$bin_tests/$binary" --gtest_filter="$filter" --gtest_brief=0 2>&1) || { echo "$out"; return 1; }
  echo "$out" | tail -n 40
  # A test that needs one GPU skipping here means the programs see none of the listed GPUs
  # (a driver older than the CUDA runtime, CUDA_VISIBLE_DEVICES, a build without CUDA).
  if echo "$out" | grep -qE 'skipped, needs a GPU|, 0 visible|not built|has no CUDA|has no cuBLAS'; then
    echo "GPU tests skipped although nvidia-smi lists $gpus GPU(s): the programs see none (see the skip reasons above)"
    return 1
  fi
  if echo "$out" | grep -q '\[  SKIPPED \]' && [ "$gpus" -ge 2 ]; then
    echo "GPU tests skipped on a machine with $gpus GPUs"
    return 1
  fi
  return 0
}
step kernel-tests gpu_tests hetflow_kernels_tests 'TransformerCuda.*:MatmulCuda.*'
step backend-tests gpu_tests hetflow_exec_tests 'CudaBackend.*:CudaPlan.*:DecoderOps.Cuda*'

step gemm "$bin_tools/hetflow-gpu-probe" gemm --gpu 0 --n 4096 --precision bf16
if [ "$gpus" -ge 2 ]; then
  step nccl "$bin_tools/hetflow-gpu-probe" all-reduce --gpus "$gpus" --bytes 268435456
else
  summary+=("----  one GPU: no NCCL bandwidth")
fi

devices=$(( gpus >= 2 ? 2 : 1 ))
step run "$bin_tools/hetflow" run --backend cuda --compute proxy --cluster "cpu-$devices" --pipeline "$devices" \
  --model gpt:layers=4,hidden=512,heads=8,seq=256,vocab=8192 --microbatches 4 --workspace 0 --steps 3 --warmup 1
# The same plan as two MPI processes, one GPU each (NCCL's unique id sent over MPI).
if [ "$gpus" -ge 2 ] && command -v mpirun >/dev/null 2>&1; then
  step mpi-run env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe -np 2 \
    "$bin_tools/hetflow" run --backend cuda --compute proxy --cluster cpu-2 --pipeline 2 \
    --model gpt:layers=4,hidden=512,heads=8,seq=256,vocab=8192 --microbatches 4 --workspace 0 --steps 3 --warmup 1
else
  summary+=("----  fewer than two GPUs (or no mpirun): the CUDA back end across processes is not run")
fi

# Real training math: a small GPT on one GPU and on the cpu back end, the same seed and data:
# every step's loss within 1e-3 relative (fp32 sums on the GPU, double ones on the CPU).
# shellcheck disable=SC2054  # the commas are the model spec's
small_real=(run --compute real --cluster cpu-1 --model gpt:layers=4,hidden=256,heads=4,seq=256,vocab=8192
            --microbatches 2 --workspace 0 --steps 4 --warmup 1)
step real-run "$bin_tools/hetflow" "${small_real[@]}" --backend cuda
step real-run-cpu "$bin_tools/hetflow" "${small_real[@]}" --backend cpu
# shellcheck disable=SC2317  # called through step
same_losses() {
  paste <(grep -oE 'loss [0-9.]+' "$log_dir/real-run.log" | cut -d' ' -f2) \
        <(grep -oE 'loss [0-9.]+' "$log_dir/real-run-cpu.log" | cut -d' ' -f2) |
    awk -F'\t' 'BEGIN { n = 0; bad = 0 }
         { n++; printf "step %d: cuda %s cpu %s\n", n - 1, ($1 == "" ? "-" : $1), ($2 == "" ? "-" : $2);
           if ($1 == "" || $2 == "") { bad++; next }
           d = $1 - $2; if (d < 0) d = -d; if (d > 1e-3 * $2) bad++ }
         END { if (n == 0) { print "no losses to compare"; exit 1 } exit bad > 0 }'
}
step real-losses same_losses
# GPT-2 124M, real math in FP32 on one GPU: tokens/s and MFU against the GPU's peak.
step gpt2-real timeout 240 "$bin_tools/hetflow" run --backend cuda --compute real --cluster cpu-1 --model gpt2-124m \
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
