// Linear layers through cuBLAS (transformer_cuda.hpp). Row-major arrays are column-major
// transposes, so y[N,OC] = x w^T is, to cuBLAS, y^T[OC,N] = w^T(op T)[OC,C] * x^T[C,N], and so
// on. fp32 math (CUBLAS_DEFAULT_MATH: no TF32); the bias gradient uses the norms' fixed-order
// column sums.
#include <cublas_v2.h>

#include <map>
#include <mutex>
#include <thread>
#include <utility>

#include "kernels/cuda_common.cuh"
#include "kernels/transformer_cuda_launch.hpp"

namespace hetflow::kernels {

namespace {

constexpr int kThreads = 256;

Status status_of(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return Status::success;
    case CUBLAS_STATUS_ALLOC_FAILED: return Status::alloc_failed;
    case CUBLAS_STATUS_INVALID_VALUE: return Status::invalid_value;
    default: return Status::execution_failed;
  }
}

// One handle per (host thread, device), created on first use and never destroyed: handles
// are cheap to keep and costly to create, and one destroyed at exit could outlive the CUDA
// runtime. The map is never freed either, so the handles stay reachable.
Status handle_for(cudaStream_t stream, cublasHandle_t* handle) {
  int device = 0;
  if (const Status status = cuda::status_of(cudaGetDevice(&device)); status != Status::success) return status;
  static std::mutex mutex;
  static auto* handles = new std::map<std::pair<std::thread::id, int>, cublasHandle_t>();
  const std::lock_guard<std::mutex> lock(mutex);
  cublasHandle_t& slot = (*handles)[{std::this_thread::get_id(), device}];
  if (slot == nullptr) {
    if (const Status status = status_of(cublasCreate(&slot)); status != Status::success) {
      handles->erase({std::this_thread::get_id(), device});
      return status;
    }
  }
  *handle = slot;
  return status_of(cublasSetStream(slot, stream));
}

// y[n][o] = b[o]: the rows the forward's GEMM then adds onto (beta = 1), as the reference.
__global__ void broadcast_bias_kernel(float* y, const float* b, int OC, long total) {
  for (long i = static_cast<long>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<long>(gridDim.x) * blockDim.x) {
    y[i] = b[i % OC];
  }
}

}  // namespace

namespace launch {

Status linear_forward(float* y, const float* x, const float* w, const float* b, int N, int C, int OC,
                      CudaStream stream) {
  const long total = static_cast<long>(N) * OC;
  if (b != nullptr) {
    broadcast_bias_kernel<<<cuda::stride_blocks(total, kThreads), kThreads, 0, stream>>>(y, b, OC, total);
    if (const Status status = cuda::launched(); status != Status::success) return status;
  }
  if (C == 0) {  // no inputs: the bias, or zeros
    if (b != nullptr) return Status::success;
    return cuda::status_of(cudaMemsetAsync(y, 0, sizeof(float) * static_cast<std::size_t>(total), stream));
  }
  cublasHandle_t handle = nullptr;
  if (const Status status = handle_for(stream, &handle); status != Status::success) return status;
  const float one = 1.0f, beta = b != nullptr ? 1.0f : 0.0f;  // beta 0: y is not read
  return status_of(cublasSgemm(handle, CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, &one, w, C, x, C, &beta, y, OC));
}

Status linear_backward_input(float* dx, const float* dy, const float* w, int N, int C, int OC, CudaStream stream) {
  // dx^T[C,N] += w^T[C,OC] * dy^T[OC,N]
  cublasHandle_t handle = nullptr;
  if (const Status status = handle_for(stream, &handle); status != Status::success) return status;
  const float one = 1.0f;
  return status_of(cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, &one, w, C, dy, OC, &one, dx, C));
}

Status linear_backward_weight(float* dw, float* db, const float* dy, const float* x, int N, int C, int OC,
                              CudaStream stream) {
  if (dw != nullptr) {
    // dw^T[C,OC] += x^T[C,N] * (dy^T[OC,N])^T
    cublasHandle_t handle = nullptr;
    if (const Status status = handle_for(stream, &handle); status != Status::success) return status;
    const float one = 1.0f;
    const Status status =
        status_of(cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, &one, x, C, dy, OC, &one, dw, C));
    if (status != Status::success) return status;
  }
  if (db != nullptr) return column_sums(db, dy, N, OC, stream);
  return Status::success;
}

}  // namespace launch

}  // namespace hetflow::kernels
