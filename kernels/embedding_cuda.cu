// Token and position embeddings on the GPU (transformer_cuda.hpp), whole or a vocabulary
// range of the table (Megatron's vocabulary-parallel embedding), both directions bitwise
// equal to the reference. The backward never has two threads add into one element: a
// position row's column is owned by one thread, which adds rows p, p + T, ... in order; a
// token row is owned by one block, the first of its group after a stable sort of the token
// ids (so the group lists the rows in increasing n), which adds the group's rows in order.
#include <climits>

#include <cub/device/device_radix_sort.cuh>

#include "kernels/cuda_common.cuh"
#include "kernels/transformer_cuda_launch.hpp"

namespace hetflow::kernels {

namespace {

constexpr int kThreads = 256;

__device__ inline long first_index() { return static_cast<long>(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ inline long grid_stride() { return static_cast<long>(gridDim.x) * blockDim.x; }

// Rows [V0, V0 + V) of the table: a token outside them gives a zero row (0 + the position).
__global__ void embedding_forward_kernel(float* y, const int* tokens, const float* wte, int V0, int V,
                                         const float* wpe, int T, int C, long total) {
  for (long i = first_index(); i < total; i += grid_stride()) {
    const long n = i / C, c = i % C;
    const int t = tokens[n] - V0;
    const float word = t >= 0 && t < V ? wte[static_cast<std::size_t>(t) * C + c] : 0.0f;
    y[i] = wpe == nullptr ? word : word + wpe[static_cast<std::size_t>(n % T) * C + c];
  }
}

// dwpe[p][c] += dy[p][c], dy[p + T][c], ... in that order: one thread per (p, c), p < min(N, T).
__global__ void embedding_backward_position_kernel(float* dwpe, const float* dy, int N, int T, int C, long total) {
  for (long i = first_index(); i < total; i += grid_stride()) {
    const long p = i / C, c = i % C;
    float sum = dwpe[i];
    for (long n = p; n < N; n += T) sum += dy[static_cast<std::size_t>(n) * C + c];
    dwpe[i] = sum;
  }
}

__global__ void iota_kernel(int* out, int n) {
  for (long i = first_index(); i < n; i += grid_stride()) out[i] = static_cast<int>(i);
}

// Block i of the sorted (token, row) pairs: when it starts its token's group, it adds the
// group's dy rows, in increasing row order, onto the token's gradient row (when the token is
// one of the table's rows [V0, V0 + V)).
__global__ void embedding_backward_token_kernel(float* dwte, const float* dy, const int* sorted_tokens,
                                                const int* sorted_rows, int V0, int V, int N, int C) {
  const int i = static_cast<int>(blockIdx.x);
  const int token = sorted_tokens[i];
  if (i > 0 && sorted_tokens[i - 1] == token) return;
  const int local = token - V0;
  if (local < 0 || local >= V) return;
  float* out = dwte + static_cast<std::size_t>(local) * C;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    float sum = out[c];
    for (int s = i; s < N && sorted_tokens[s] == token; ++s) sum += dy[static_cast<std::size_t>(sorted_rows[s]) * C + c];
    out[c] = sum;
  }
}

Status token_gradients(float* dwte, const float* dy, const int* tokens, int V0, int V, int N, int C,
                       cudaStream_t stream) {
  const int* no_keys = nullptr;
  int* no_out = nullptr;
  std::size_t sort_bytes = 0;
  Status status =
      cuda::status_of(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, no_keys, no_out, no_keys, no_out, N, 0,
                                                      static_cast<int>(sizeof(int) * 8), stream));
  if (status != Status::success) return status;
  const std::size_t array = cuda::aligned(sizeof(int) * static_cast<std::size_t>(N));
  cuda::Scratch scratch(stream);
  status = scratch.allocate(3 * array + sort_bytes);
  if (status != Status::success) return status;
  int* sorted_tokens = scratch.at<int>(0);
  int* rows = scratch.at<int>(array);
  int* sorted_rows = scratch.at<int>(2 * array);
  void* sort_space = scratch.at<void>(3 * array);

  iota_kernel<<<cuda::stride_blocks(N, kThreads), kThreads, 0, stream>>>(rows, N);
  if (status = cuda::launched(); status != Status::success) return status;
  // Stable: equal tokens keep their rows in increasing order.
  status = cuda::status_of(cub::DeviceRadixSort::SortPairs(sort_space, sort_bytes, tokens, sorted_tokens, rows,
                                                           sorted_rows, N, 0, static_cast<int>(sizeof(int) * 8),
                                                           stream));
  if (status != Status::success) return status;
  embedding_backward_token_kernel<<<N, kThreads, 0, stream>>>(dwte, dy, sorted_tokens, sorted_rows, V0, V, N, C);
  return cuda::launched();
}

}  // namespace

namespace launch {

Status vocab_embedding_forward(float* y, const int* tokens, const float* wte, int V0, int V, const float* wpe, int N,
                               int T, int C, CudaStream stream) {
  const long total = static_cast<long>(N) * C;
  embedding_forward_kernel<<<cuda::stride_blocks(total, kThreads), kThreads, 0, stream>>>(y, tokens, wte, V0, V, wpe,
                                                                                          T, C, total);
  return cuda::launched();
}

Status vocab_embedding_backward(float* dwte, float* dwpe, const float* dy, const int* tokens, int V0, int V, int N,
                                int T, int C, CudaStream stream) {
  if (dwpe != nullptr) {
    const long total = static_cast<long>(N < T ? N : T) * C;
    embedding_backward_position_kernel<<<cuda::stride_blocks(total, kThreads), kThreads, 0, stream>>>(dwpe, dy, N, T,
                                                                                                       C, total);
    if (const Status status = cuda::launched(); status != Status::success) return status;
  }
  if (dwte != nullptr) return token_gradients(dwte, dy, tokens, V0, V, N, C, stream);
  return Status::success;
}

// The whole table: every token is a row of it (tokens are trusted).
Status embedding_forward(float* y, const int* tokens, const float* wte, const float* wpe, int N, int T, int C,
                         CudaStream stream) {
  return vocab_embedding_forward(y, tokens, wte, 0, INT_MAX, wpe, N, T, C, stream);
}

Status embedding_backward(float* dwte, float* dwpe, const float* dy, const int* tokens, int N, int T, int C,
                          CudaStream stream) {
  return vocab_embedding_backward(dwte, dwpe, dy, tokens, 0, INT_MAX, N, T, C, stream);
}

}  // namespace launch

}  // namespace hetflow::kernels
