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
# shared library they load but CUDA's (libcudart, libcublas(Lt), libnccl, libcuda: gpu-check
# finds the GPU machine's own, which match its driver). The C and C++ runtimes and the dynamic
# loader go in lib/runtime: the GPU machine's serve when they are as new as these, and
# gpu-check runs the programs through the packed loader when they are not (an older glibc).
# The archive is xz-compressed to travel light (about 20 MB). It records the commit it was
# built from; gpu-check fails the run (still showing its results) in a checkout of another
# commit.
set -euo pipefail
cd "$(dirname "$0")/.."

build="build-gpu-bundle"
jobs=$(nproc 2>/dev/null || echo 2)
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) build="$2"; shift 2 ;;
    --jobs) jobs="$2"; shift 2 ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
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
mkdir -p "$stage/bin" "$stage/lib/runtime"
for p in "${programs[@]}"; do
  cp "$build/$p" "$stage/bin/"
  strip --strip-unneeded "$stage/bin/$(basename "$p")"
done
# The libraries the programs load, by the names they ask for (their sonames), copied from
# the files those names resolve to here.
where() {
  case "$1" in
    linux-vdso.so.*) echo none ;;
    libcudart.so.*|libcublas.so.*|libcublasLt.so.*|libnccl.so.*|libcuda.so.*) echo none ;;
    ld-linux-*|libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*) echo runtime ;;
    libstdc++.so.*|libgcc_s.so.*) echo runtime ;;
    *) echo lib ;;
  esac
}
for p in "${programs[@]}"; do
  ldd "$build/$p" | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 } $1 ~ /^\/.*ld-linux/ { print "ld-linux-x86-64.so.2", $1 }'
done | sort -u | while read -r name path; do
  case "$(where "$name")" in
    runtime) cp -L "$path" "$stage/lib/runtime/$name" ;;
    lib) cp -L "$path" "$stage/lib/$name" ;;
  esac
done
if [ ! -x "$stage/lib/runtime/ld-linux-x86-64.so.2" ]; then
  echo "gpu-bundle: the dynamic loader was not found among the programs' libraries" >&2
  exit 1
fi
# CUDA's libraries the programs need from the GPU machine (cuBLAS is opened at first use).
{
  for p in "${programs[@]}"; do ldd "$build/$p" | awk '{ print $1 }'; done | grep -E '^lib(cudart|nccl)\.so' || true
  # (kernels/CMakeLists.txt says the name at every configure)
  cublas=$(sed -n 's/.*cuBLAS is opened at first use as \(libcublas\.so\.[0-9]*\).*/\1/p' "$build/configure.log" | head -1)
  if [ -z "$cublas" ]; then echo "gpu-bundle: the configure log does not name cuBLAS's soname" >&2; exit 1; fi
  echo "$cublas"
  echo "${cublas/libcublas/libcublasLt}"
} | sort -u > "$stage/cuda-libs"
git rev-parse HEAD 2>/dev/null > "$stage/commit" || echo unknown > "$stage/commit"
if [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then echo "$(cat "$stage/commit")-dirty" > "$stage/commit"; fi
cat > "$stage/README" <<EOF
hetflow $(git describe --always --dirty 2>/dev/null || echo unknown), packed by tools/gpu-bundle.sh on $(date -u +%F)
for tools/gpu-check.sh --bundle: bin/ the programs, lib/ what they load but for CUDA's
libraries, lib/runtime the C and C++ runtimes and the loader (used where the machine's are
older), cuda-libs the CUDA libraries to find on the GPU machine, commit the commit packed.
EOF
archive="$build/hetflow-gpu.tar.xz"
tar -C "$stage" -cf - . | xz -T0 -6 > "$archive"
echo "gpu-bundle: wrote $archive ($(du -h "$archive" | cut -f1); $(find "$stage/lib" -type f | wc -l) libraries), commit $(cat "$stage/commit")"
echo "  on the GPU machine, from the repository's root: bash tools/gpu-check.sh --bundle $archive"
