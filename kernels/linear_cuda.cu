// Linear layers through cuBLAS (transformer_cuda.hpp). Row-major arrays are column-major
// transposes, so y[N,OC] = x w^T is, to cuBLAS, y^T[OC,N] = w^T(op T)[OC,C] * x^T[C,N], and so
// on. fp32 math (CUBLAS_DEFAULT_MATH: no TF32), or 16-bit operands (rounded into scratch, with
// the cast kernels' rounding, and padded there to sizes cuBLAS runs fast) with fp32
// accumulation through cublasGemmEx; the bias gradient uses the norms' fixed-order column sums.
#include <algorithm>
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

// cuBLAS's fast 16-bit kernels want every extent and leading dimension a multiple of 8
// elements: on an H200 an odd one (GPT-2's head over 50,257 vocabulary rows) sends cublasGemmEx
// to sm_75 CUTLASS "align1" kernels, which took 7.9 of a bf16 step's 48 ms of kernels. So in
// 16 bits m, n and k are padded to multiples of 8: each operand is rounded into scratch with
// its rows and columns padded by zeros (which add nothing to a sum), and a result with padded
// rows or columns, or an unaligned leading dimension, is computed into padded scratch, at most
// kResultScratchBytes of it at a time, and its real part copied out (and in first, where
// beta != 0).
constexpr int kAlign = 8;  // 16-bit elements in 16 bytes
constexpr std::size_t kResultScratchBytes = std::size_t{64} << 20;

int padded(int extent) { return (extent + kAlign - 1) / kAlign * kAlign; }
std::size_t product(int a, int b) { return static_cast<std::size_t>(a) * static_cast<std::size_t>(b); }

// out (`columns` columns of out_ld) = in (columns of ld, ld <= out_ld, in_columns <= columns)
// rounded to 16 bits, zero past in's rows and columns. The rounding is the cast kernels'
// (nearest even).
template <bool kBf16>
__global__ void to_16bit_padded_kernel(std::uint16_t* out, int out_ld, const float* in, int ld, long in_columns,
                                       long total) {
  for (long i = static_cast<long>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<long>(gridDim.x) * blockDim.x) {
    const long column = i / out_ld;
    const int row = static_cast<int>(i - column * out_ld);
    const float x = row < ld && column < in_columns ? in[column * ld + row] : 0.0f;
    out[i] = kBf16 ? cuda::to_bf16_bits(x) : cuda::to_fp16_bits(x);
  }
}

// A column-major operand of `columns` columns of ld, rounded into 16 bits at `rows` x `cols`
// (rows >= ld, cols >= columns).
Status to_16bit(std::uint16_t* out, int rows, int cols, const float* in, int ld, int columns, bool bf16,
                cudaStream_t stream) {
  if (rows == ld && cols == columns) {
    return bf16 ? launch::cast_fp32_to_bf16(out, in, static_cast<long>(product(ld, columns)), stream)
                : launch::cast_fp32_to_fp16(out, in, static_cast<long>(product(ld, columns)), stream);
  }
  const long total = static_cast<long>(product(rows, cols));
  const unsigned int blocks = cuda::stride_blocks(total, kThreads);
  if (bf16) {
    to_16bit_padded_kernel<true><<<blocks, kThreads, 0, stream>>>(out, rows, in, ld, columns, total);
  } else {
    to_16bit_padded_kernel<false><<<blocks, kThreads, 0, stream>>>(out, rows, in, ld, columns, total);
  }
  return cuda::launched();
}

// C[m,n] (column-major, ldc) = op(A)[m,k] * op(B)[k,n] + beta C, in `inputs`, every operand
// dense: A's stored rows are lda (m or k, as op_a says), B's ldb, and C's rows m = ldc. For
// 16-bit inputs both are rounded into scratch ordered on the stream, padded as above.
Status gemm(cublasHandle_t handle, cublasOperation_t op_a, cublasOperation_t op_b, int m, int n, int k, const float* a,
            int lda, const float* b, int ldb, float beta, float* c, int ldc, GemmInputs inputs, cudaStream_t stream) {
  const float one = 1.0f;
  if (inputs == GemmInputs::fp32) {
    return status_of(cublas::sgemm(handle, op_a, op_b, m, n, k, &one, a, lda, b, ldb, &beta, c, ldc));
  }
  const bool a_t = op_a == CUBLAS_OP_T, b_t = op_b == CUBLAS_OP_T;
  const int mp = padded(m), np = padded(n), kp = padded(k);
  const int a_rows = a_t ? kp : mp, a_cols = a_t ? mp : kp;  // A's padded storage, column-major
  const int b_rows = b_t ? np : kp, b_cols = b_t ? kp : np;
  const bool direct = mp == m && np == n;  // (then ldc = m is aligned too)
  // The result's blocks: whole padded columns of C, a multiple of 8 of them.
  const std::size_t column_bytes = sizeof(float) * static_cast<std::size_t>(mp);
  const std::size_t fit = std::max<std::size_t>(kResultScratchBytes / column_bytes / kAlign, 1) * kAlign;
  const int block = direct ? 0 : fit < static_cast<std::size_t>(np) ? static_cast<int>(fit) : np;

  cuda::Scratch scratch(stream);
  const std::size_t a_bytes = cuda::aligned(product(a_rows, a_cols) * sizeof(std::uint16_t));
  const std::size_t b_bytes = cuda::aligned(product(b_rows, b_cols) * sizeof(std::uint16_t));
  Status status = scratch.allocate(a_bytes + b_bytes + column_bytes * static_cast<std::size_t>(block));
  if (status != Status::success) return status;
  auto* a16 = scratch.at<std::uint16_t>(0);
  auto* b16 = scratch.at<std::uint16_t>(a_bytes);
  const bool bf16 = inputs == GemmInputs::bf16;
  if ((status = to_16bit(a16, a_rows, a_cols, a, lda, a_t ? m : k, bf16, stream)) != Status::success) return status;
  if ((status = to_16bit(b16, b_rows, b_cols, b, ldb, b_t ? k : n, bf16, stream)) != Status::success) return status;
  const cudaDataType type = bf16 ? CUDA_R_16BF : CUDA_R_16F;
  if (direct) {
    return status_of(cublas::gemm_ex(handle, op_a, op_b, m, n, kp, &one, a16, type, a_rows, b16, type, b_rows, &beta,
                                     c, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
  float* padded_c = scratch.at<float>(a_bytes + b_bytes);
  const std::size_t row_bytes = sizeof(float) * static_cast<std::size_t>(m);
  for (int j = 0; j < n; j += block) {
    const int columns = std::min(block, np - j), real = std::min(block, n - j);
    float* c_at = c + product(j, ldc);
    if (beta != 0.0f) {
      status = cuda::status_of(cudaMemcpy2DAsync(padded_c, column_bytes, c_at, sizeof(float) * ldc, row_bytes, real,
                                                 cudaMemcpyDeviceToDevice, stream));
      if (status != Status::success) return status;
    }
    // Columns j.. of op(B): B's columns j.. (op N), or its rows j.. (op T; j a multiple of 8).
    const std::uint16_t* b_at = b16 + (b_t ? static_cast<std::size_t>(j) : product(j, b_rows));
    status = status_of(cublas::gemm_ex(handle, op_a, op_b, mp, columns, kp, &one, a16, type, a_rows, b_at, type, b_rows,
                                       &beta, padded_c, CUDA_R_32F, mp, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    if (status != Status::success) return status;
    status = cuda::status_of(cudaMemcpy2DAsync(c_at, sizeof(float) * ldc, padded_c, column_bytes, row_bytes, real,
                                               cudaMemcpyDeviceToDevice, stream));
    if (status != Status::success) return status;
  }
  return Status::success;
}

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
  return gemm(handle, CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, w, C, x, C, beta, y, OC, inputs, stream);
}

Status linear_backward_input(float* dx, const float* dy, const float* w, int N, int C, int OC, CudaStream stream,
                             GemmInputs inputs) {
  // dx^T[C,N] += w^T[C,OC] * dy^T[OC,N]
  cublasHandle_t handle = nullptr;
  if (const Status status = handle_for(stream, &handle); status != Status::success) return status;
  return gemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, w, C, dy, OC, 1.0f, dx, C, inputs, stream);
}

Status linear_backward_weight(float* dw, float* db, const float* dy, const float* x, int N, int C, int OC,
                              CudaStream stream, GemmInputs inputs) {
  if (C == 0) dw = nullptr;  // an empty weight gradient (the entry point let it through)
  if (db != nullptr && !column_sums_fit(OC)) return Status::invalid_value;  // before dw is enqueued
  if (dw != nullptr) {
    // dw^T[C,OC] += x^T[C,N] * (dy^T[OC,N])^T
    cublasHandle_t handle = nullptr;
    if (const Status status = handle_for(stream, &handle); status != Status::success) return status;
    const Status status = gemm(handle, CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, x, C, dy, OC, 1.0f, dw, C, inputs, stream);
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
