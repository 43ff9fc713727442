#!/usr/bin/env bash
# One-stop set-up for a Debian bookworm machine (run as root, or with sudo available):
#   bash tools/setup.sh run    install what is missing, build, run the main job on the defaults
#   bash tools/setup.sh test   install what is missing, build, run the whole test suite
# Idempotent: installs only missing packages, and reuses the build directory.
set -euo pipefail
cd "$(dirname "$0")/.."

mode="${1:-}"
case "$mode" in
  run|test) ;;
  *) echo "usage: bash tools/setup.sh run|test" >&2; exit 2 ;;
esac

bash tools/install-deps.sh

jobs="${HETFLOW_JOBS:-$(nproc 2>/dev/null || echo 2)}"
mkdir -p build
if ! cmake --preset default > build/configure.log 2>&1; then
  cat build/configure.log >&2
  exit 1
fi
grep "hetflow:" build/configure.log || true  # says whether the CUDA parts are built or skipped
cmake --build --preset default -j "$jobs"

if [ "$mode" = run ]; then
  # The main job: simulate the default cluster and model, write the trace.
  # (4 pipeline stages with selective recomputation: gpt2-xl does not fit a 16 GB V100 whole.)
  ./build/tools/hetflow simulate --pipeline 4 --recompute selective \
    --trace hetflow-trace.csv --chrome hetflow-trace.json
else
  ctest --preset default -j "$jobs"
fi
