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

// cuBLAS's fast 16-bit kernels want every column 16-byte aligned: a 16-bit operand whose
// leading dimension is not a multiple of 8 elements, or an fp32 result's not a multiple of 4,
// sends it to slow ones (on an H200, sm_75 CUTLASS "align1" kernels: GPT-2's head over 50,257
// vocabulary rows took 7.9 of a bf16 step's 48 ms of kernels). So a 16-bit operand is rounded
// into scratch at a padded leading dimension (the padding zero), and such a result is computed
// into padded scratch, at most kResultScratchBytes of it at a time, and copied out (and in
// first, where beta != 0).
constexpr int kOperandAlign = 8;  // 16-bit elements in 16 bytes
constexpr int kResultAlign = 4;   // fp32 elements in 16 bytes
constexpr std::size_t kResultScratchBytes = std::size_t{64} << 20;

int padded(int ld, int to) { return (ld + to - 1) / to * to; }

// out's columns, out_ld apart = in's `ld`-element columns (ld apart) rounded to 16 bits, then
// zeros; total = columns x out_ld. The rounding is the cast kernels' (nearest even).
template <bool kBf16>
__global__ void to_16bit_columns_kernel(std::uint16_t* out, int out_ld, const float* in, int ld, long total) {
  for (long i = static_cast<long>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<long>(gridDim.x) * blockDim.x) {
    const long column = i / out_ld;
    const int row = static_cast<int>(i - column * out_ld);
    const float x = row < ld ? in[column * ld + row] : 0.0f;
    out[i] = kBf16 ? __bfloat16_as_ushort(__float2bfloat16_rn(x)) : __half_as_ushort(__float2half_rn(x));
  }
}

// `in` (count floats in columns of ld) rounded to 16 bits into `out`, its columns out_ld apart.
Status to_16bit(std::uint16_t* out, int out_ld, const float* in, int ld, std::size_t count, bool bf16,
                cudaStream_t stream) {
  if (out_ld == ld) {
    return bf16 ? launch::cast_fp32_to_bf16(out, in, static_cast<long>(count), stream)
                : launch::cast_fp32_to_fp16(out, in, static_cast<long>(count), stream);
  }
  const long total = static_cast<long>(count / static_cast<std::size_t>(ld)) * out_ld;
  const unsigned int blocks = cuda::stride_blocks(total, kThreads);
  if (bf16) {
    to_16bit_columns_kernel<true><<<blocks, kThreads, 0, stream>>>(out, out_ld, in, ld, total);
  } else {
    to_16bit_columns_kernel<false><<<blocks, kThreads, 0, stream>>>(out, out_ld, in, ld, total);
  }
  return cuda::launched();
}

// C[m,n] (column-major, ldc) = op(A)[m,k] * op(B)[k,n] + beta C, in `inputs`. A holds a_count
// floats in columns of lda, B b_count in columns of ldb; for 16-bit inputs both are rounded
// into scratch ordered on the stream, aligned as above (a result in blocks of columns where
// op(B) is B, whose columns then are the result's).
Status gemm(cublasHandle_t handle, cublasOperation_t op_a, cublasOperation_t op_b, int m, int n, int k, const float* a,
            int lda, std::size_t a_count, const float* b, int ldb, std::size_t b_count, float beta, float* c, int ldc,
            GemmInputs inputs, cudaStream_t stream) {
  const float one = 1.0f;
  if (inputs == GemmInputs::fp32) {
    return status_of(cublas::sgemm(handle, op_a, op_b, m, n, k, &one, a, lda, b, ldb, &beta, c, ldc));
  }
  const int lda16 = padded(lda, kOperandAlign), ldb16 = padded(ldb, kOperandAlign);
  const std::size_t a16_count = a_count / static_cast<std::size_t>(lda) * static_cast<std::size_t>(lda16);
  const std::size_t b16_count = b_count / static_cast<std::size_t>(ldb) * static_cast<std::size_t>(ldb16);
  const int ldc_padded = padded(ldc, kResultAlign);
  const bool blocked = ldc_padded != ldc && op_b == CUBLAS_OP_N;
  const std::size_t column_bytes = sizeof(float) * static_cast<std::size_t>(ldc_padded);
  const std::size_t fit = std::max<std::size_t>(kResultScratchBytes / column_bytes, 1);  // columns a block
  const int block = !blocked ? 0 : fit < static_cast<std::size_t>(n) ? static_cast<int>(fit) : n;

  cuda::Scratch scratch(stream);
  const std::size_t a_bytes = cuda::aligned(a16_count * sizeof(std::uint16_t));
  const std::size_t b_bytes = cuda::aligned(b16_count * sizeof(std::uint16_t));
  Status status = scratch.allocate(a_bytes + b_bytes + column_bytes * static_cast<std::size_t>(block));
  if (status != Status::success) return status;
  auto* a16 = scratch.at<std::uint16_t>(0);
  auto* b16 = scratch.at<std::uint16_t>(a_bytes);
  const bool bf16 = inputs == GemmInputs::bf16;
  if ((status = to_16bit(a16, lda16, a, lda, a_count, bf16, stream)) != Status::success) return status;
  if ((status = to_16bit(b16, ldb16, b, ldb, b_count, bf16, stream)) != Status::success) return status;
  const cudaDataType type = bf16 ? CUDA_R_16BF : CUDA_R_16F;
  if (!blocked) {
    return status_of(cublas::gemm_ex(handle, op_a, op_b, m, n, k, &one, a16, type, lda16, b16, type, ldb16, &beta, c,
                                     CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
  float* padded_c = scratch.at<float>(a_bytes + b_bytes);
  const std::size_t row_bytes = sizeof(float) * static_cast<std::size_t>(m);
  for (int j = 0; j < n; j += block) {
    const int columns = std::min(block, n - j);
    float* c_at = c + static_cast<std::size_t>(j) * static_cast<std::size_t>(ldc);
    if (beta != 0.0f) {
      status = cuda::status_of(cudaMemcpy2DAsync(padded_c, column_bytes, c_at, sizeof(float) * ldc, row_bytes, columns,
                                                 cudaMemcpyDeviceToDevice, stream));
      if (status != Status::success) return status;
    }
    status = status_of(cublas::gemm_ex(handle, op_a, op_b, m, columns, k, &one, a16, type, lda16,
                                       b16 + static_cast<std::size_t>(j) * static_cast<std::size_t>(ldb16), type,
                                       ldb16, &beta, padded_c, CUDA_R_32F, ldc_padded, CUBLAS_COMPUTE_32F,
                                       CUBLAS_GEMM_DEFAULT));
    if (status != Status::success) return status;
    status = cuda::status_of(cudaMemcpy2DAsync(c_at, sizeof(float) * ldc, padded_c, column_bytes, row_bytes, columns,
                                               cudaMemcpyDeviceToDevice, stream));
    if (status != Status::success) return status;
  }
  return Status::success;
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
