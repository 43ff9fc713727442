#!/usr/bin/env bash
# Installs the Debian packages hetflow builds against, only those that are missing.
# Why these: each is Debian's own, well-kept package of a widely used library.
#   g++, cmake, ninja-build, pkg-config   the toolchain (C++20, CMake presets)
#   libsimgrid-dev                        SimGrid 3.32, the discrete-event simulator (sim/)
#   libboost-graph-dev                    the plan's task graph (partition/)
#   libboost-program-options-dev          the hetflow command line (tools/)
#   libyaml-cpp-dev                       cluster/model files, with line numbers for errors
#   nlohmann-json3-dev                    plan and trace JSON, --json output
#   libgtest-dev libgmock-dev             tests
#   libbenchmark-dev                      tests/bench (Google Benchmark)
#   libjemalloc-dev                       malloc for simulations (SimGrid allocates per activity)
#   libxxhash-dev                         xxHash: the plan's fingerprint (a hash of its canonical content)
#   python3-jsonschema                    an independent check of plan files against partition/plan.schema.json (tests)
#   libopenblas-dev                       the executor's CPU backend (BLAS matmuls)
#   libopenmpi-dev openmpi-bin            multi-process / multi-node executor bootstrap
#   python3-torch python3-numpy           the test oracle for training math (tests/exec/oracle: PyTorch)
#   librsvg2-bin                          rsvg-convert: tests render hetflow timeline's SVG to PNG with it
#   protobuf-compiler libprotobuf-dev     Chakra execution traces (export-chakra, --model chakra:DIR)
# CUDA and NCCL are not Debian packages here: the CUDA parts build when nvcc is found
# (e.g. under /usr/local/cuda) and are skipped, with a message, when it is not.
set -euo pipefail

packages=(g++ cmake ninja-build pkg-config libsimgrid-dev libboost-graph-dev
          libboost-program-options-dev libyaml-cpp-dev nlohmann-json3-dev libgtest-dev
          libgmock-dev libbenchmark-dev libjemalloc-dev libxxhash-dev python3-jsonschema libopenblas-dev libopenmpi-dev openmpi-bin
          python3-torch python3-numpy librsvg2-bin protobuf-compiler libprotobuf-dev)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
echo "install-deps: installing ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-deps: done"
