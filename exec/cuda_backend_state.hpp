#pragma once
// Inside the CUDA back end only (cuda_backend.cpp: the checked calls and prepare();
// cuda_backend_run.cpp: the tasks and the in-task exchanges; cuda_probes.cpp): the objects
// prepare() makes per plan device and device stream, and the helpers that check CUDA,
// cuBLAS and NCCL calls. Built only where NCCL is found.

#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "exec/cuda_backend.hpp"
#include "exec/cuda_decoder_ops.hpp"
#include "exec/cuda_plan.hpp"
#include "exec/training.hpp"
#include "kernels/cublas_loader.hpp"
#include "kernels/transformer_cuda.hpp"

namespace hetflow::exec {
namespace cuda_detail {

using partition::Plan;
using partition::TaskKind;
using Clock = std::chrono::steady_clock;
namespace cublas = kernels::cublas;  // opened at first use: kernels/cublas_loader.hpp

// The proxy GEMM's shapes and the lanes' buffers.
inline constexpr int kProxyN = 1024;       // the proxy multiplies [1024 x 1024] by [1024 x rows]
inline constexpr int kMinRows = 64;        // rows come in multiples of this, as sums of powers of two:
inline constexpr int kMaxRows = 8192;      // 8 shapes, 64 to 8192 rows (17 GFLOP per call at most)
inline constexpr int kCallsPerGroup = 4;   // GEMM calls between two looks at stop()
inline constexpr size_t kBlasWorkspaceBytes = size_t{32} << 20;  // cuBLAS's recommendation for Hopper
inline constexpr size_t kPatternPeriod = 97;
inline constexpr double kInitTimeoutS = 300;  // NCCL communicator creation, at most

// Checked calls: an Error naming the call, why and `where` ("GPU 1 (plan device 1, gpu1)").
[[noreturn]] void failed(const std::string& call, const std::string& why, const std::string& where);
void cuda(cudaError_t e, const char* call, const std::string& where);
void blas(cublasStatus_t s, const char* call, const std::string& where);
std::string nccl_error(ncclResult_t r, ncclComm_t comm);
// Non-blocking communicators answer ncclInProgress for work they go on with: not a failure.
void nccl(ncclResult_t r, const char* call, const std::string& where, ncclComm_t comm = nullptr);
// Between two polls: spin a little (much GPU work takes microseconds), then sleep briefly.
void pause(int& polls);
// Aborting ends the rank's NCCL kernels even when its peer never comes; the handle is gone.
void abort_rank(ncclComm_t* comm);
// Polls a rank until its last call has left ncclInProgress (non-blocking communicators), or
// fails, or stop is set (Stopped), or the deadline passes (Error).
void settle(ncclComm_t* comm, const std::atomic<bool>& stop, const char* call, const std::string& where,
            Clock::time_point deadline = Clock::time_point::max());
// Polls until `event` has happened; meanwhile stop (Stopped), with a rank NCCL's
// asynchronous errors (Error), and the deadline (Error; only while preparing) end the wait,
// the rank aborted first.
void await(cudaEvent_t event, ncclComm_t* comm, const std::atomic<bool>& stop, const std::string& where,
           Clock::time_point deadline = Clock::time_point::max());

struct GemmTypes {
  cudaDataType data;
  size_t bytes;
};
GemmTypes gemm_types(model::Precision p);
// `count` elements of (i mod 17 - 8) / 8 in the GEMM's type (exact in all three), so the
// multiplies run on ordinary numbers rather than zeros.
std::vector<std::uint16_t> gemm_input16(size_t count, model::Precision p);
void fill_gemm_input(void* device, size_t count, model::Precision p, const std::string& where);
void* device_alloc(size_t bytes, const std::string& what, const std::string& where);
size_t aligned(size_t bytes);

// One device stream's objects: what its engine thread uses, and nobody else.
struct GpuLane {
  int stream = -1;
  cudaStream_t cuda = nullptr;
  cublasHandle_t blas = nullptr;
  void* blas_workspace = nullptr;
  void* c = nullptr;        // the proxy GEMM's output
  void* staging = nullptr;  // its tasks' largest message or collective buffer (staging_bytes)
  cudaEvent_t start = nullptr, end = nullptr;       // timing
  cudaEvent_t message = nullptr;                    // timing: an in-task message's start
  cudaEvent_t group[2] = {nullptr, nullptr};        // GEMM groups in flight
  cudaEvent_t ops_done = nullptr;                   // real math: the compute stream's work so far
};

// One plan device.
struct Gpu {
  int ordinal = -1;
  std::string where;               // "GPU 1 (plan device 1, gpu1)"
  void* a = nullptr;               // the proxy GEMM's inputs, read by all lanes
  void* b = nullptr;
  float* pattern = nullptr;        // j mod 97 + 1 at j, for j < cap floats + 97
  void* arena = nullptr;           // the device copies of the tensors on this device
  std::vector<GpuLane> lanes;      // one per stream program of the device
  std::mutex* issue = nullptr;     // NCCL calls on this GPU (shared by plan devices on it)
  std::unique_ptr<CudaDecoderOps> ops;  // real math: on the compute stream (the forward tasks')
};

// The GEMM of `rows` on a lane: C[1024 x rows] = A[1024 x 1024] B[1024 x rows], column-major.
void gemm(const GpuLane& lane, const Gpu& gpu, model::Precision p, int rows, const std::string& where);

}  // namespace cuda_detail

struct CudaBackend::State {
  const partition::Plan* plan = nullptr;
  Training* training = nullptr;             // real math; null: proxies
  CudaPlan nccl_plan;
  model::Precision precision = model::Precision::fp32;
  size_t cap = 0;                              // proxies: bytes per device copy, message and collective
  std::map<int, std::unique_ptr<std::mutex>> issue_on_gpu;  // by ordinal: Gpu::issue
  std::map<int, std::uint64_t> pool_thresholds;  // by ordinal: the default pool's, as it was
  std::vector<cuda_detail::Gpu> gpus;          // per plan device
  std::vector<void*> copy;                     // per tensor: its device copy
  std::vector<size_t> copy_bytes;              // and its size
  std::vector<size_t> send_bytes;              // real math, per channel: what its sends carry
  std::vector<std::vector<ncclComm_t>> comms;  // per NCCL group, per rank
  mutable std::mutex times_mutex;
  std::map<std::pair<int, int>, double> gpu_s;  // (task, iteration) -> seconds

  State() = default;
  State(const State&) = delete;
  State& operator=(const State&) = delete;
  // Communicators first (their kernels end), then the streams drain, then memory goes.
  // Errors are ignored: this runs after failures too, and must not throw.
  ~State() {
    abort_comms();
    for (cuda_detail::Gpu& g : gpus) {
      if (g.ordinal < 0 || cudaSetDevice(g.ordinal) != cudaSuccess) continue;
      for (cuda_detail::GpuLane& l : g.lanes) {
        if (l.cuda != nullptr) cudaStreamSynchronize(l.cuda);
        if (l.blas != nullptr) cuda_detail::cublas::destroy(l.blas);
        if (l.cuda != nullptr) kernels::release_linear_handles(l.cuda);  // the real math's, for this stream
        for (cudaEvent_t e : {l.start, l.end, l.message, l.group[0], l.group[1], l.ops_done}) {
          if (e != nullptr) cudaEventDestroy(e);
        }
        if (l.cuda != nullptr) cudaStreamDestroy(l.cuda);
        for (void* p : {l.blas_workspace, l.c, l.staging}) cudaFree(p);
      }
      for (void* p : {g.a, g.b, static_cast<void*>(g.pattern), g.arena}) cudaFree(p);
      g.ops.reset();  // its blocks back, before the pool gives what it kept to the driver
    }
    for (const auto& [ordinal, threshold] : pool_thresholds) {
      cudaMemPool_t pool = nullptr;
      if (cudaSetDevice(ordinal) != cudaSuccess || cudaDeviceGetDefaultMemPool(&pool, ordinal) != cudaSuccess) continue;
      std::uint64_t before = threshold;
      cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &before);
      cudaMemPoolTrimTo(pool, 0);
    }
    cudaGetLastError();
  }

  // Ends every rank's NCCL work, done or not (a kernel waiting for a peer that stopped).
  void abort_comms() {
    for (auto& ranks : comms) {
      for (ncclComm_t& c : ranks) cuda_detail::abort_rank(&c);
    }
  }

  cuda_detail::GpuLane& lane(int device, int stream) {
    for (cuda_detail::GpuLane& l : gpus[static_cast<size_t>(device)].lanes) {
      if (l.stream == stream) return l;
    }
    throw Error("the cuda back end has no stream " + std::to_string(stream) + " on device " + std::to_string(device) +
                " (the task is in none of its programs)");
  }
};

}  // namespace hetflow::exec
