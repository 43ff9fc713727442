#!/usr/bin/env bash
# The checks that need a GPU, in one go, on a machine with NVIDIA GPUs: configures and builds
# hetflow with CUDA (nvcc, cuBLAS, NCCL), runs the GPU tests (the CUDA kernels against their
# CPU references, the CUDA back end on 1- and 2-device plans), measures cublasGemmEx BF16 and
# FP32 throughput beside the part's catalog peak and, with two GPUs or more, NCCL all-reduce
# bus bandwidth (nccl-tests' formulas), runs `hetflow run --backend cuda` on a small plan (with
# two GPUs, also as two MPI processes), times the attention kernels, runs real training math
# in FP32 on one GPU against the cpu back end (the same losses), and GPT-2 124M real-math
# steps in FP32 and with BF16 GEMMs
# (tokens/s, and MFU against this machine's GPU as `hetflow-gpu-probe cluster` names it), and
# prints a summary. Meant to take under 5 minutes (the build dominates; a second run reuses it).
#
#   bash tools/gpu-check.sh [--build-dir DIR] [--jobs N] [--step-limit S]
#   bash tools/gpu-check.sh --bundle ARCHIVE [--build-dir DIR] [--step-limit S]
#
# --bundle runs the programs packed by tools/gpu-bundle.sh instead of building them: for a
# GPU machine without Debian's packages. Their libraries come from the archive, CUDA's
# (cudart, cuBLAS, NCCL) from that machine: the loader's cache, else the first match under
# /usr/local, /opt and /usr/lib (the CUDA toolkit, or Python's nvidia-* wheels). Where the
# machine's C library is older than the one the programs were built against, they run
# through the archive's own loader and C runtime. An archive of another commit than this
# checkout's is a failure (its results are still shown); one packed from uncommitted changes
# is only said to be, since the copy brought here may carry the same changes.
#
# Every program a step runs is stopped after S seconds (default 150), so that one hang costs
# one step, not the summary. Without a visible GPU it says so and exits 0 (1 with --bundle,
# which is only packed for a GPU machine). Exit 1 when a check fails (the summary says which),
# 2 for a bad option.
set -euo pipefail
cd "$(dirname "$0")/.."

build="build-gpu"
bundle=""
limit=150
jobs=$(nproc 2>/dev/null || echo 2)
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) build="$2"; shift 2 ;;
    --jobs) jobs="$2"; shift 2 ;;
    --bundle) bundle="$2"; shift 2 ;;
    --step-limit) limit="$2"; shift 2 ;;
    -h|--help) sed -n '2,28p' "$0"; exit 0 ;;
    *) echo "gpu-check: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
case "$limit" in ''|*[!0-9]*) echo "gpu-check: --step-limit takes whole seconds, not '$limit'" >&2; exit 2 ;; esac

summary=()
failed=0
started=$(date +%s)
log_dir="$build/gpu-check"
mkdir -p "$log_dir"

# GPUs this process may use: nvidia-smi's list, narrowed by CUDA_VISIBLE_DEVICES when set.
# Without nvidia-smi (a container without the driver's tools) one is assumed: the GPU tests
# then say what the programs themselves see.
gpus=0
if command -v nvidia-smi >/dev/null 2>&1; then
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
  if [ "${CUDA_VISIBLE_DEVICES+set}" = set ] && [ "$gpus" -gt 0 ]; then
    if [ -z "$CUDA_VISIBLE_DEVICES" ] || [ "$CUDA_VISIBLE_DEVICES" = "-1" ]; then
      gpus=0
    else
      listed=$(echo "$CUDA_VISIBLE_DEVICES" | tr ',' '\n' | grep -c . || true)
      gpus=$(( listed < gpus ? listed : gpus ))
    fi
  fi
  nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm --format=csv,noheader || true
else
  gpus=1
  summary+=("----  nvidia-smi not found: one GPU assumed (the GPU tests say what the programs see)")
fi
if [ "$gpus" -eq 0 ]; then
  if [ -n "$bundle" ]; then
    echo "gpu-check: no GPU visible on the machine the bundle was brought to" >&2
    exit 1
  fi
  echo "no GPU visible: nothing to check"
  exit 0
fi

# step NAME COMMAND...: runs it with its output in $log_dir/NAME.log (and on the terminal),
# records PASS or FAIL and the seconds it took; the script goes on either way. A program (not
# a function of this script) is stopped after $limit seconds.
step() {
  local name="$1"; shift
  local t0 rc=0; t0=$(date +%s)
  echo "== $name: $*"
  if [ "$(type -t "$1")" = file ]; then
    timeout -k 10 "$limit" "$@" 2>&1 | tee "$log_dir/$name.log" || rc=$?
  else
    "$@" 2>&1 | tee "$log_dir/$name.log" || rc=$?
  fi
  local took=$(( $(date +%s) - t0 ))
  if [ "$rc" -eq 0 ]; then
    summary+=("PASS  $name ($took s)")
  elif [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    summary+=("FAIL  $name: stopped after $limit s: see $log_dir/$name.log")
    failed=1
  else
    summary+=("FAIL  $name ($took s): see $log_dir/$name.log")
    failed=1
  fi
  echo "-- ${summary[-1]}"
}

# How programs start: directly, or through the bundle's loader (`runner`, a prefix).
runner=()
if [ -n "$bundle" ]; then
  root="$build/bundle"
  # shellcheck disable=SC2317  # called through step
  unpack() {
    rm -rf "$root" && mkdir -p "$root" || return 1
    if command -v xz >/dev/null 2>&1; then
      xz -dc "$bundle" | tar -C "$root" -xf - || return 1
    else  # no xz-utils: Python's lzma
      python3 -c 'import sys, tarfile
safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
tarfile.open(sys.argv[1], "r:xz").extractall(sys.argv[2], **safe)' "$bundle" "$root" || return 1
    fi
    cat "$root/README"
  }
  step unpack unpack
  # shellcheck disable=SC2317  # called through step
  same_commit() {
    local packed here
    packed=$(cat "$root/commit" 2>/dev/null || echo unknown)
    here=$(git rev-parse HEAD 2>/dev/null || echo "")
    echo "packed from $packed; this checkout ${here:-has no git history here}"
    if [ -z "$here" ]; then return 0; fi  # (a copy without .git: nothing to compare)
    [ "${packed%-dirty}" = "$here" ]
  }
  step bundle-commit same_commit
  if grep -q -- '-dirty$' "$root/commit" 2>/dev/null; then
    summary+=("----  the bundle was packed from uncommitted changes: its commit names them only in part")
  fi
  # shellcheck disable=SC2317  # called through step
  find_cuda_libraries() {
    local lib dir missing=0 dirs=""
    while read -r lib; do
      # (ldconfig -p indents each entry with a tab)
      if ldconfig -p 2>/dev/null | grep -qE "^[[:space:]]+$lib "; then echo "$lib: the loader's cache"; continue; fi
      dir=$(find /usr/local /opt /usr/lib -name "$lib" -printf '%h\n' -quit 2>/dev/null)
      if [ -z "$dir" ]; then echo "$lib: NOT FOUND on this machine"; missing=1; continue; fi
      echo "$lib: $dir"
      case ":$dirs:" in *":$dir:"*) ;; *) dirs="$dirs:$dir" ;; esac
    done < "$root/cuda-libs"
    echo "$dirs" > "$root/cuda-dirs"
    return "$missing"
  }
  step cuda-libraries find_cuda_libraries
  cuda_dirs=$(cat "$root/cuda-dirs" 2>/dev/null || true)
  lib=$(realpath "$root/lib")
  # Only the bundle's programs get its libraries (a host mpirun keeps the machine's own).
  paths="$lib$cuda_dirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  native=(env "LD_LIBRARY_PATH=$paths")
  packed=("$lib/runtime/ld-linux-x86-64.so.2" --library-path "$lib/runtime:$paths")
  # The machine's C runtime when the programs start with it; else the packed one.
  # shellcheck disable=SC2317  # called through step
  choose_loader() {
    local out lines
    if out=$("${native[@]}" "$root/bin/hetflow" --version 2>&1); then
      echo "$out"
      echo "the machine's C runtime serves"
      return 0
    fi
    echo "$out" | head -n 3
    lines=$(echo "$out" | wc -l)
    if [ "$lines" -gt 3 ]; then echo "(and $(( lines - 3 )) lines more like these)"; fi
    echo "the programs do not start with this machine's C runtime: the packed loader and C runtime"
    "${packed[@]}" "$root/bin/hetflow" --version && echo packed > "$root/loader"
  }
  step loader choose_loader
  runner=("${native[@]}")
  if [ -f "$root/loader" ]; then runner=("${packed[@]}"); fi
  bin_tests="$root/bin"
  bin_tools="$root/bin"
else
  limit_runs=$limit limit=3600  # configuring and building are the long steps
  step configure cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DHETFLOW_CUDA=ON -DHETFLOW_BENCH=OFF
  if ! grep -q "building the CUDA back end" "$log_dir/configure.log" && ! grep -q '^HETFLOW_NCCL_LIBRARY:FILEPATH=/' "$build/CMakeCache.txt"; then
    summary+=("FAIL  the CUDA back end is not in this build (nvcc, cuBLAS or NCCL not found: see $log_dir/configure.log; without Debian's packages, pack the programs elsewhere with tools/gpu-bundle.sh and pass --bundle)")
    failed=1
  fi
  step build cmake --build "$build" -j "$jobs" --target hetflow hetflow-gpu-probe hetflow_kernels_tests hetflow_exec_tests
  limit=$limit_runs
  bin_tests="$build/tests"
  bin_tools="$build/tools"
fi
hetflow=("${runner[@]}" "$bin_tools/hetflow")
probe=("${runner[@]}" "$bin_tools/hetflow-gpu-probe")

# GPU tests: they skip (saying why) without a GPU, so a skip here is a failure (but for the
# 2-device tests on a machine with one GPU).
# shellcheck disable=SC2317  # called through step
gpu_tests() {
  local binary="$1" filter="$2" out rc=0
  out=$(timeout -k 10 "$limit" "${runner[@]}" "$bin_tests/$binary" --gtest_filter="$filter" --gtest_brief=0 2>&1) || rc=$?
  if [ "$rc" -ne 0 ]; then
    echo "$out"
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then echo "stopped after $limit s"; fi
    return 1
  fi
  echo "$out" | tail -n 40
  # A test that needs one GPU skipping here means the programs see none of the listed GPUs
  # (a driver older than the CUDA runtime, CUDA_VISIBLE_DEVICES, a build without CUDA).
  if echo "$out" | grep -qE 'skipped, needs a GPU|, 0 visible|not built|has no CUDA|has no cuBLAS'; then
    echo "GPU tests skipped although $gpus GPU(s) should be visible: the programs see none (see the skip reasons above)"
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

step gemm "${probe[@]}" gemm --gpu 0 --n 4096 --precision bf16
step gemm-fp32 "${probe[@]}" gemm --gpu 0 --n 4096 --precision fp32
# The attention kernels: GPT-2 124M's layer at micro-batch 4, and a LLaMA-style one (grouped
# heads of 128, 4096 positions: the backward's dS in chunks of kv groups).
step attention "${probe[@]}" attention
step attention-gqa "${probe[@]}" attention --batch 1 --seq 4096 --heads 32 --kv-heads 8 --head-size 128
if [ "$gpus" -ge 2 ]; then
  step nccl "${probe[@]}" all-reduce --gpus "$gpus" --bytes 268435456
else
  summary+=("----  one GPU: no NCCL bandwidth")
fi

# This machine's first N GPUs as a cluster (as the catalog knows the part), so that runs are
# simulated, and their MFU taken, against its own peak: sets `cluster` to the file's path, or
# to cpu-N (N nominal CPU devices of 50 GFLOP/s) for a part the catalog does not know (an NVL
# board, say), which the summary says rather than fails.
this_machine() {
  local n="$1" file="$log_dir/this-machine-$1.yaml" log="$log_dir/cluster-$1.log"
  echo "== cluster: ${probe[*]} cluster --gpus $n"
  if timeout -k 10 "$limit" "${probe[@]}" cluster --gpus "$n" > "$file" 2> "$log"; then
    cat "$file"
    cluster="$file"
  else
    cat "$log"
    summary+=("----  runs on $n GPU(s) are simulated, and their MFU taken, on nominal CPU devices, not this GPU: $(head -c 200 "$log")")
    cluster="cpu-$n"
  fi
}
devices=$(( gpus >= 2 ? 2 : 1 ))
this_machine 1
machine=$cluster  # one GPU
machines=$cluster  # the runs' $devices GPUs
if [ "$devices" -gt 1 ]; then this_machine "$devices"; machines=$cluster; fi

# Proxies (FLOP-matched GEMMs, the plan's transfers): completion, on one or two devices.
step run "${hetflow[@]}" run --backend cuda --compute proxy --cluster "$machines" --pipeline "$devices" \
  --model gpt:layers=4,hidden=512,heads=8,seq=256,vocab=8192 --microbatches 4 --workspace 0 --steps 3 --warmup 1
# The same plan as two MPI processes, one GPU each (NCCL's unique id sent over MPI).
if [ "$gpus" -ge 2 ] && command -v mpirun >/dev/null 2>&1; then
  step mpi-run env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe -np 2 \
    "${hetflow[@]}" run --backend cuda --compute proxy --cluster "$machines" --pipeline 2 \
    --model gpt:layers=4,hidden=512,heads=8,seq=256,vocab=8192 --microbatches 4 --workspace 0 --steps 3 --warmup 1
else
  summary+=("----  fewer than two GPUs (or no mpirun): the CUDA back end across processes is not run")
fi

# Real training math in FP32: a small GPT on one GPU and on the cpu back end, the same seed and
# data: every step's loss within 1e-3 relative (fp32 sums on the GPU, double ones on the CPU).
# (An fp16 plan would multiply fp16 operands under dynamic loss scaling, whose first steps
# Megatron's 2^32 start skips.)
# shellcheck disable=SC2054  # the commas are the model spec's
small_real=(run --compute real --cluster "$machine" --precision fp32 --model gpt:layers=4,hidden=256,heads=4,seq=256,vocab=8192
            --microbatches 2 --workspace 0 --steps 4 --warmup 1)
step real-run "${hetflow[@]}" "${small_real[@]}" --backend cuda
step real-run-cpu "${hetflow[@]}" "${small_real[@]}" --backend cpu
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

# GPT-2 124M, real math on one GPU: tokens/s and MFU. A run that trained nothing fails: every
# step (warm-up included) must print a finite loss, and none may be skipped.
# shellcheck disable=SC2317  # called through step
trained() {
  local log="$log_dir/$1.log" steps="$2" losses
  losses=$(grep -cE 'loss [0-9]+\.[0-9]+' "$log" || true)
  echo "$losses finite losses of $steps steps"
  if grep -E 'loss -?(nan|inf)' "$log"; then return 1; fi
  if grep -E '[1-9][0-9]* step\(s\) skipped' "$log"; then return 1; fi
  [ "$losses" -eq "$steps" ]
}
gpt2=(run --backend cuda --compute real --cluster "$machine" --model gpt2-124m --micro-batch 4 --microbatches 1
      --workspace 0 --steps 3 --warmup 1)
step gpt2-fp32 "${hetflow[@]}" "${gpt2[@]}" --precision fp32
step gpt2-fp32-trained trained gpt2-fp32 4
step gpt2-bf16 "${hetflow[@]}" "${gpt2[@]}" --precision bf16
step gpt2-bf16-trained trained gpt2-bf16 4

echo
echo "gpu-check summary ($gpus GPU(s), $(( $(date +%s) - started )) s):"
for line in "${summary[@]}"; do echo "  $line"; done
for name in gemm gemm-fp32 attention attention-gqa nccl run mpi-run real-losses gpt2-fp32 gpt2-bf16; do
  if [ -f "$log_dir/$name.log" ]; then
    echo "  $name:"
    grep -E '^(gemm|all-reduce|attention|ran|step [0-9]+:) |^  (forward|backward) |iteration time|tokens/s|MFU' "$log_dir/$name.log" | sed 's/^/    /' || true
  fi
done
exit "$failed"
