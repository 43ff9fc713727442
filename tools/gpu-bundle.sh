#!/usr/bin/env bash
# Packs what tools/gpu-check.sh runs into one archive, for a GPU machine that cannot build
# hetflow: one with the NVIDIA driver and CUDA's own libraries but none of Debian's packages
# (SimGrid, yaml-cpp, Boost, OpenBLAS, GoogleTest, OpenMPI) and no network to fetch them.
#
#   bash tools/gpu-bundle.sh [--build-dir DIR] [--jobs N]     (here, where hetflow builds)
#   bash tools/gpu-check.sh --bundle DIR/hetflow-gpu.tar.xz    (there)
#
# It builds the four programs gpu-check runs (hetflow, hetflow-gpu-probe and the kernel and
# executor tests) in Release with CUDA, strips them, and puts them in the archive beside every
# shared library they load except the C and C++ runtimes (the GPU machine's, newer, serve)
# and CUDA's (libcudart, libcublas(Lt), libnccl: gpu-check finds the GPU machine's own, which
# match its driver). The archive is xz-compressed to travel light (about 30 MB).
set -euo pipefail
cd "$(dirname "$0")/.."

build="build-gpu-bundle"
jobs=$(nproc 2>/dev/null || echo 2)
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) build="$2"; shift 2 ;;
    --jobs) jobs="$2"; shift 2 ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "gpu-bundle: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done

mkdir -p "$build"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DHETFLOW_CUDA=ON -DHETFLOW_BENCH=OFF > "$build/configure.log" 2>&1 ||
  { cat "$build/configure.log"; exit 1; }
if ! grep -q '^HETFLOW_NCCL_LIBRARY:FILEPATH=/' "$build/CMakeCache.txt"; then
  echo "gpu-bundle: this build has no CUDA back end (nvcc, cuBLAS or NCCL not found): nothing to pack" >&2
  exit 1
fi
programs=(tools/hetflow tools/hetflow-gpu-probe tests/hetflow_kernels_tests tests/hetflow_exec_tests)
cmake --build "$build" -j "$jobs" --target hetflow hetflow-gpu-probe hetflow_kernels_tests hetflow_exec_tests

stage="$build/stage"
rm -rf "$stage"
mkdir -p "$stage/bin" "$stage/lib"
for p in "${programs[@]}"; do
  cp "$build/$p" "$stage/bin/"
  strip --strip-unneeded "$stage/bin/$(basename "$p")"
done
# The libraries the programs load, by the names they ask for (their sonames), copied from
# the files those names resolve to here.
keep() {
  case "$1" in
    linux-vdso.so.*|ld-linux-*|libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*) return 1 ;;
    libstdc++.so.*|libgcc_s.so.*) return 1 ;;
    libcudart.so.*|libcublas.so.*|libcublasLt.so.*|libnccl.so.*|libcuda.so.*) return 1 ;;
  esac
  return 0
}
for p in "${programs[@]}"; do
  ldd "$build/$p" | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }'
done | sort -u | while read -r name path; do
  if keep "$name"; then cp -L "$path" "$stage/lib/$name"; fi
done
# CUDA's libraries the programs need from the GPU machine (cuBLAS is opened at first use).
{
  for p in "${programs[@]}"; do ldd "$build/$p" | awk '{ print $1 }'; done | grep -E '^lib(cudart|nccl)\.so' || true
  # (kernels/CMakeLists.txt says the name at every configure)
  cublas=$(sed -n 's/.*cuBLAS is opened at first use as \(libcublas\.so\.[0-9]*\).*/\1/p' "$build/configure.log" | head -1)
  if [ -z "$cublas" ]; then echo "gpu-bundle: the configure log does not name cuBLAS's soname" >&2; exit 1; fi
  echo "$cublas"
  echo "${cublas/libcublas/libcublasLt}"
} | sort -u > "$stage/cuda-libs"
cat > "$stage/README" <<EOF
hetflow $(git describe --always --dirty 2>/dev/null || echo unknown), packed by tools/gpu-bundle.sh on $(date -u +%F)
for tools/gpu-check.sh --bundle: bin/ the programs, lib/ what they load but for the C/C++
runtimes and CUDA's libraries, cuda-libs the CUDA libraries to find on the GPU machine.
EOF
archive="$build/hetflow-gpu.tar.xz"
tar -C "$stage" -cf - . | xz -T0 -6 > "$archive"
echo "gpu-bundle: wrote $archive ($(du -h "$archive" | cut -f1); $(find "$stage/lib" -type f | wc -l) libraries)"
echo "  on the GPU machine, from the repository's root: bash tools/gpu-check.sh --bundle $archive"
