// LayerNorm and RMSNorm on the GPU (transformer_cuda.hpp), and the fixed-order column sums
// their weight gradients and linear's bias gradient share.
//
// A row's statistics and its dx: one block of kRowThreads per row, each thread striding over
// the columns, fp32 sums reduced by block_sum (a fixed order). Column sums (dw, db): a block
// of 32 columns x kColumnLanes threads takes a chunk of kChunkRows rows, writes the chunk's
// sums to scratch, and a second kernel adds the chunks in order into the gradient. Both
// launch shapes depend on N and C only, so the sums are bitwise repeatable.
#include "kernels/cuda_common.cuh"
#include "kernels/transformer_cuda_launch.hpp"

namespace hetflow::kernels {

namespace {

using cuda::block_sum;

constexpr int kRowThreads = 256;
constexpr int kColumnTile = 32;   // columns per block: one warp reads 128 contiguous bytes of a row
constexpr int kColumnLanes = 8;   // rows read at once per block
constexpr int kChunkRows = 256;   // rows per partial sum

__global__ void layernorm_forward_kernel(float* y, float* mean, float* rstd, const float* x, const float* w,
                                         const float* b, int C, float eps) {
  __shared__ float shared[32];
  const std::size_t row = blockIdx.x;
  const float* in = x + row * C;
  float* out = y + row * C;
  float sum = 0;
  for (int c = threadIdx.x; c < C; c += blockDim.x) sum += in[c];
  const float m = block_sum(sum, shared) / C;
  // The variance from deviations (two passes), as the reference.
  float squares = 0;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    const float d = in[c] - m;
    squares += d * d;
  }
  const float s = 1.0f / sqrtf(block_sum(squares, shared) / C + eps);
  for (int c = threadIdx.x; c < C; c += blockDim.x) out[c] = (in[c] - m) * s * w[c] + b[c];
  if (threadIdx.x == 0) {
    mean[row] = m;
    rstd[row] = s;
  }
}

// dx += rstd * (g - mean(g) - xhat * mean(g * xhat)), g = w * dy.
__global__ void layernorm_backward_dx_kernel(float* dx, const float* dy, const float* x, const float* w,
                                             const float* mean, const float* rstd, int C) {
  __shared__ float shared[32];
  const std::size_t row = blockIdx.x;
  const float* in = x + row * C;
  const float* grad = dy + row * C;
  const float m = mean[row], s = rstd[row];
  float g_sum = 0, g_xhat_sum = 0;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    const float g = w[c] * grad[c];
    g_sum += g;
    g_xhat_sum += g * ((in[c] - m) * s);
  }
  const float g_mean = block_sum(g_sum, shared) / C;
  const float g_xhat_mean = block_sum(g_xhat_sum, shared) / C;
  float* out = dx + row * C;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    const float g = w[c] * grad[c];
    out[c] += s * (g - g_mean - (in[c] - m) * s * g_xhat_mean);
  }
}

__global__ void rmsnorm_forward_kernel(float* y, float* rstd, const float* x, const float* w, int C, float eps) {
  __shared__ float shared[32];
  const std::size_t row = blockIdx.x;
  const float* in = x + row * C;
  float squares = 0;
  for (int c = threadIdx.x; c < C; c += blockDim.x) squares += in[c] * in[c];
  const float s = 1.0f / sqrtf(block_sum(squares, shared) / C + eps);
  float* out = y + row * C;
  for (int c = threadIdx.x; c < C; c += blockDim.x) out[c] = in[c] * s * w[c];
  if (threadIdx.x == 0) rstd[row] = s;
}

// dx += s w dy - s^3 x sum(dy w x) / C.
__global__ void rmsnorm_backward_dx_kernel(float* dx, const float* dy, const float* x, const float* w,
                                           const float* rstd, int C) {
  __shared__ float shared[32];
  const std::size_t row = blockIdx.x;
  const float* in = x + row * C;
  const float* grad = dy + row * C;
  const float s = rstd[row];
  float g_x = 0;
  for (int c = threadIdx.x; c < C; c += blockDim.x) g_x += grad[c] * w[c] * in[c];
  const float correction = s * s * s * block_sum(g_x, shared) / C;
  float* out = dx + row * C;
  for (int c = threadIdx.x; c < C; c += blockDim.x) out[c] += s * w[c] * grad[c] - correction * in[c];
}

// What a column sum adds up, for row n and column c.
struct PlainTerm {  // dy: db of LayerNorm and of linear
  const float* dy;
  int C;
  __device__ float operator()(int n, int c) const { return dy[static_cast<std::size_t>(n) * C + c]; }
};

struct LayerNormWeightTerm {  // dy * xhat
  const float *dy, *x, *mean, *rstd;
  int C;
  __device__ float operator()(int n, int c) const {
    const std::size_t i = static_cast<std::size_t>(n) * C + c;
    return dy[i] * ((x[i] - mean[n]) * rstd[n]);
  }
};

struct RmsNormWeightTerm {  // dy * x * rstd
  const float *dy, *x, *rstd;
  int C;
  __device__ float operator()(int n, int c) const {
    const std::size_t i = static_cast<std::size_t>(n) * C + c;
    return dy[i] * x[i] * rstd[n];
  }
};

// partial[chunk][c] = sum of term(n, c) over the chunk's rows. Grid: (chunks, column tiles);
// block: kColumnTile x kColumnLanes. Lane y sums rows y, y + kColumnLanes, ... of the chunk,
// then lane 0 adds the lanes' sums in order.
template <class Term>
__global__ void column_partials_kernel(float* partial, int N, int C, Term term) {
  __shared__ float sums[kColumnLanes][kColumnTile + 1];
  const int c = blockIdx.y * kColumnTile + threadIdx.x;
  // (Row bounds in 64 bits: the last chunk's end may pass INT_MAX where N nears it.)
  const long long n0 = static_cast<long long>(blockIdx.x) * kChunkRows;
  const long long n1 = n0 + kChunkRows < N ? n0 + kChunkRows : N;
  float sum = 0;
  if (c < C) {
    for (long long n = n0 + threadIdx.y; n < n1; n += kColumnLanes) sum += term(static_cast<int>(n), c);
  }
  sums[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float total = 0;
    for (int lane = 0; lane < kColumnLanes; ++lane) total += sums[lane][threadIdx.x];
    partial[static_cast<std::size_t>(blockIdx.x) * C + c] = total;
  }
}

// out[c] += the chunks' partial sums of column c, added in chunk order.
__global__ void add_partials_kernel(float* out, const float* partial, int chunks, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float total = 0;
  for (int chunk = 0; chunk < chunks; ++chunk) total += partial[static_cast<std::size_t>(chunk) * C + c];
  out[c] += total;
}

// out[c] += sum over the N rows of term(n, c), through scratch on the stream.
template <class Term>
Status add_column_sums(float* out, int N, int C, Term term, cudaStream_t stream) {
  const int chunks = static_cast<int>((static_cast<long long>(N) + kChunkRows - 1) / kChunkRows);
  const int tiles = (C + kColumnTile - 1) / kColumnTile;
  if (!launch::column_sums_fit(C)) return Status::invalid_value;
  cuda::Scratch scratch(stream);
  if (const Status status = scratch.allocate(sizeof(float) * static_cast<std::size_t>(chunks) * C);
      status != Status::success) {
    return status;
  }
  float* partial = scratch.at<float>(0);
  column_partials_kernel<<<dim3(chunks, tiles), dim3(kColumnTile, kColumnLanes), 0, stream>>>(partial, N, C, term);
  if (const Status status = cuda::launched(); status != Status::success) return status;
  add_partials_kernel<<<(C + 255) / 256, 256, 0, stream>>>(out, partial, chunks, C);
  return cuda::launched();
}

}  // namespace

namespace launch {

// gridDim.y's limit on the column tiles: C up to 2 million columns.
bool column_sums_fit(int C) { return (C + kColumnTile - 1) / kColumnTile <= 65535; }

Status layernorm_forward(float* y, float* mean, float* rstd, const float* x, const float* w, const float* b, int N,
                         int C, float eps, CudaStream stream) {
  layernorm_forward_kernel<<<N, kRowThreads, 0, stream>>>(y, mean, rstd, x, w, b, C, eps);
  return cuda::launched();
}

Status layernorm_backward(float* dx, float* dw, float* db, const float* dy, const float* x, const float* w,
                          const float* mean, const float* rstd, int N, int C, CudaStream stream) {
  if ((dw != nullptr || db != nullptr) && !column_sums_fit(C)) return Status::invalid_value;
  if (dx != nullptr) {
    layernorm_backward_dx_kernel<<<N, kRowThreads, 0, stream>>>(dx, dy, x, w, mean, rstd, C);
    if (const Status status = cuda::launched(); status != Status::success) return status;
  }
  if (dw != nullptr) {
    const Status status = add_column_sums(dw, N, C, LayerNormWeightTerm{dy, x, mean, rstd, C}, stream);
    if (status != Status::success) return status;
  }
  if (db != nullptr) return add_column_sums(db, N, C, PlainTerm{dy, C}, stream);
  return Status::success;
}

Status rmsnorm_forward(float* y, float* rstd, const float* x, const float* w, int N, int C, float eps,
                       CudaStream stream) {
  rmsnorm_forward_kernel<<<N, kRowThreads, 0, stream>>>(y, rstd, x, w, C, eps);
  return cuda::launched();
}

Status rmsnorm_backward(float* dx, float* dw, const float* dy, const float* x, const float* w, const float* rstd, int N,
                        int C, CudaStream stream) {
  if (dw != nullptr && !column_sums_fit(C)) return Status::invalid_value;
  if (dx != nullptr) {
    rmsnorm_backward_dx_kernel<<<N, kRowThreads, 0, stream>>>(dx, dy, x, w, rstd, C);
    if (const Status status = cuda::launched(); status != Status::success) return status;
  }
  if (dw != nullptr) return add_column_sums(dw, N, C, RmsNormWeightTerm{dy, x, rstd, C}, stream);
  return Status::success;
}

Status column_sums(float* out, const float* dy, int N, int C, CudaStream stream) {
  return add_column_sums(out, N, C, PlainTerm{dy, C}, stream);
}

}  // namespace launch

}  // namespace hetflow::kernels
