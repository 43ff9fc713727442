// Built instead of cuda_backend.cpp, cuda_backend_run.cpp and cuda_probes.cpp where nvcc, cuBLAS or NCCL was not found at configure
// time: the back end exists, and every call that would need a GPU says why it cannot.
#include "exec/cuda_backend.hpp"

#include <cmath>
#include <utility>

namespace hetflow::exec {

namespace {

const char* const kNotBuilt =
    "this build has no CUDA back end (nvcc, cuBLAS or NCCL was not found at configure time); the cpu back end runs without it";

}  // namespace

struct CudaBackend::State {};

bool cuda_backend_built() { return false; }

CudaBackend::CudaBackend(CudaBackendOptions options) : options_(std::move(options)) {
  if (!(options_.flop_scale >= 0) || !std::isfinite(options_.flop_scale)) {
    throw InputError("<options>", 0, "flop_scale", "expected a finite number >= 0");
  }
}

CudaBackend::~CudaBackend() = default;

void CudaBackend::prepare(const partition::Plan& /*plan*/) { throw Error(kNotBuilt); }
std::optional<size_t> CudaBackend::buffer_bytes(int /*tensor*/) const { return std::nullopt; }
std::optional<double> CudaBackend::model_peak_bytes(int /*device*/) const { return std::nullopt; }
void CudaBackend::run(TaskContext& /*task*/) { throw Error(kNotBuilt); }
void CudaBackend::stop() { stop_.store(true); }
void CudaBackend::all_reduce(TaskContext& /*task*/, int /*communicator*/, std::span<float> /*data*/, bool /*max*/) {
  throw Error(kNotBuilt);
}
void CudaBackend::all_gather(TaskContext& /*task*/, int /*communicator*/, std::span<float> /*data*/,
                             std::span<const size_t> /*parts*/) {
  throw Error(kNotBuilt);
}
void CudaBackend::reduce_scatter(TaskContext& /*task*/, int /*communicator*/, std::span<float> /*data*/,
                                 std::span<const size_t> /*parts*/) {
  throw Error(kNotBuilt);
}
std::optional<double> CudaBackend::gpu_time_s(int /*task*/, int /*iteration*/) const { return std::nullopt; }

GemmProbe probe_gemm(int /*gpu*/, model::Precision /*precision*/, int /*n*/, int /*repeats*/) { throw Error(kNotBuilt); }
AllReduceProbe probe_all_reduce(int /*gpus*/, double /*bytes*/, int /*repeats*/) { throw Error(kNotBuilt); }

}  // namespace hetflow::exec
