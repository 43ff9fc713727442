// Linear layers through cuBLAS (transformer_cuda.hpp). Row-major arrays are column-major
// transposes, so y[N,OC] = x w^T is, to cuBLAS, y^T[OC,N] = w^T(op T)[OC,C] * x^T[C,N], and so
// on. fp32 math (CUBLAS_DEFAULT_MATH: no TF32), or 16-bit operands (rounded into scratch by
// the cast kernels) with fp32 accumulation through cublasGemmEx; the bias gradient uses the
// norms' fixed-order column sums.
#include <cstdint>
#include <map>
#include <mutex>
#include <utility>

#include "kernels/cublas_loader.hpp"
#include "kernels/cuda_common.cuh"
#include "kernels/transformer_cuda_launch.hpp"

namespace hetflow::kernels {

namespace {

constexpr int kThreads = 256;

Status status_of(cublasStatus_t status) {
  if (status != CUBLAS_STATUS_SUCCESS) detail::note_failure(cublas::status_string(status), nullptr);
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return Status::success;
    case CUBLAS_STATUS_ALLOC_FAILED: return Status::alloc_failed;
    case CUBLAS_STATUS_INVALID_VALUE: return Status::invalid_value;
    case CUBLAS_STATUS_NOT_INITIALIZED: return cublas::available() ? Status::execution_failed : Status::library_missing;
    default: return Status::execution_failed;
  }
}

// One handle per (device, stream), created on first use and kept until release_linear_handles
// for its stream: handles are cheap to keep and costly to create. Threads may share one, as
// cuBLAS allows while nobody changes its configuration (its stream is set once, here); the
// stream orders their use of its workspace. A handle per stream because cuBLAS is bitwise
// repeatable only while one stream uses a handle's workspace (its guide, "Results
// reproducibility"). The map is never freed, so a handle never outlives it at exit.
using HandleKey = std::pair<int, cudaStream_t>;
std::mutex handles_mutex;
std::map<HandleKey, cublasHandle_t>& handles() {
  static auto* map = new std::map<HandleKey, cublasHandle_t>();
  return *map;
}

Status handle_for(cudaStream_t stream, cublasHandle_t* handle) {
  int device = 0;
  if (const Status status = cuda::status_of(cudaGetDevice(&device)); status != Status::success) return status;
  const std::lock_guard<std::mutex> lock(handles_mutex);
  const HandleKey key{device, stream};
  cublasHandle_t& slot = handles()[key];
  if (slot == nullptr) {
    if (const Status status = status_of(cublas::create(&slot)); status != Status::success) {
      handles().erase(key);
      return status;
    }
    if (const Status status = status_of(cublas::set_stream(slot, stream)); status != Status::success) {
      cublas::destroy(slot);
      handles().erase(key);
      return status;
    }
  }
  *handle = slot;
  return Status::success;
}

// y[n][o] = b[o]: the rows the forward's GEMM then adds onto (beta = 1), as the reference.
__global__ void broadcast_bias_kernel(float* y, const float* b, int OC, long total) {
  for (long i = static_cast<long>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<long>(gridDim.x) * blockDim.x) {
    y[i] = b[i % OC];
  }
}

// C[m,n] (column-major, ldc) = op(A)[m,k] * op(B)[k,n] + beta C, in `inputs`. A holds a_count
// floats, B b_count; for 16-bit inputs both are rounded into scratch ordered on the stream.
Status gemm(cublasHandle_t handle, cublasOperation_t op_a, cublasOperation_t op_b, int m, int n, int k, const float* a,
            int lda, std::size_t a_count, const float* b, int ldb, std::size_t b_count, float beta, float* c, int ldc,
            GemmInputs inputs, cudaStream_t stream) {
  const float one = 1.0f;
  if (inputs == GemmInputs::fp32) {
    return status_of(cublas::sgemm(handle, op_a, op_b, m, n, k, &one, a, lda, b, ldb, &beta, c, ldc));
  }
  cuda::Scratch scratch(stream);
  const std::size_t a_bytes = cuda::aligned(a_count * sizeof(std::uint16_t));
  Status status = scratch.allocate(a_bytes + cuda::aligned(b_count * sizeof(std::uint16_t)));
  if (status != Status::success) return status;
  auto* a16 = scratch.at<std::uint16_t>(0);
  auto* b16 = scratch.at<std::uint16_t>(a_bytes);
  const bool bf16 = inputs == GemmInputs::bf16;
  status = bf16 ? launch::cast_fp32_to_bf16(a16, a, static_cast<long>(a_count), stream)
                : launch::cast_fp32_to_fp16(a16, a, static_cast<long>(a_count), stream);
  if (status != Status::success) return status;
  status = bf16 ? launch::cast_fp32_to_bf16(b16, b, static_cast<long>(b_count), stream)
                : launch::cast_fp32_to_fp16(b16, b, static_cast<long>(b_count), stream);
  if (status != Status::success) return status;
  const cudaDataType type = bf16 ? CUDA_R_16BF : CUDA_R_16F;
  return status_of(cublas::gemm_ex(handle, op_a, op_b, m, n, k, &one, a16, type, lda, b16, type, ldb, &beta, c,
                                   CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

std::size_t count(int rows, int cols) { return static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols); }

}  // namespace

namespace launch {

Status linear_forward(float* y, const float* x, const float* w, const float* b, int N, int C, int OC,
                      CudaStream stream, GemmInputs inputs) {
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
  const float beta = b != nullptr ? 1.0f : 0.0f;  // beta 0: y is not read
  return gemm(handle, CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, w, C, count(OC, C), x, C, count(N, C), beta, y, OC, inputs,
              stream);
}

Status linear_backward_input(float* dx, const float* dy, const float* w, int N, int C, int OC, CudaStream stream,
                             GemmInputs inputs) {
  // dx^T[C,N] += w^T[C,OC] * dy^T[OC,N]
  cublasHandle_t handle = nullptr;
  if (const Status status = handle_for(stream, &handle); status != Status::success) return status;
  return gemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, w, C, count(OC, C), dy, OC, count(N, OC), 1.0f, dx, C, inputs,
              stream);
}

Status linear_backward_weight(float* dw, float* db, const float* dy, const float* x, int N, int C, int OC,
                              CudaStream stream, GemmInputs inputs) {
  if (db != nullptr && !column_sums_fit(OC)) return Status::invalid_value;  // before dw is enqueued
  if (dw != nullptr) {
    // dw^T[C,OC] += x^T[C,N] * (dy^T[OC,N])^T
    cublasHandle_t handle = nullptr;
    if (const Status status = handle_for(stream, &handle); status != Status::success) return status;
    const Status status = gemm(handle, CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, x, C, count(N, C), dy, OC, count(N, OC), 1.0f,
                               dw, C, inputs, stream);
    if (status != Status::success) return status;
  }
  if (db != nullptr) return column_sums(db, dy, N, OC, stream);
  return Status::success;
}

Status release_linear_handles(CudaStream stream) {
  const std::lock_guard<std::mutex> lock(handles_mutex);
  Status first = Status::success;
  for (auto at = handles().begin(); at != handles().end();) {
    if (at->first.second != stream) {
      ++at;
      continue;
    }
    const Status status = status_of(cublas::destroy(at->second));  // waits for the handle's work
    if (first == Status::success) first = status;
    at = handles().erase(at);
  }
  return first;
}

}  // namespace launch

}  // namespace hetflow::kernels
