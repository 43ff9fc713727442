// Cross-entropy with its softmax fused in (transformer_cuda.hpp): one block per row; the max
// and the sum of exponentials are block reductions in a fixed order; nothing of size V is
// stored between the passes but the logits themselves. Then the vocabulary-parallel loss's
// three steps, also a block per row.
#include "kernels/cuda_common.cuh"
#include "kernels/transformer_cuda_launch.hpp"

namespace hetflow::kernels {

namespace {

using cuda::block_max;
using cuda::block_sum;

constexpr int kThreads = 512;

// The row's max and its sum of exp(x - max), in every thread.
__device__ inline float2 softmax_statistics(const float* x, int V, float* shared) {
  float local_max = -INFINITY;
  for (int i = threadIdx.x; i < V; i += blockDim.x) local_max = fmaxf(local_max, x[i]);
  const float m = block_max(local_max, shared);
  float local_sum = 0;
  for (int i = threadIdx.x; i < V; i += blockDim.x) local_sum += expf(x[i] - m);
  return make_float2(m, block_sum(local_sum, shared));
}

__global__ void crossentropy_forward_kernel(float* losses, const float* logits, const int* targets, int V) {
  __shared__ float shared[32];
  const std::size_t row = blockIdx.x;
  const float* x = logits + row * V;
  const float2 stats = softmax_statistics(x, V, shared);
  if (threadIdx.x == 0) {
    // The last step in double, as the reference: log(sum) + (max - x[target]).
    losses[row] = static_cast<float>(log(static_cast<double>(stats.y)) +
                                     (static_cast<double>(stats.x) - static_cast<double>(x[targets[row]])));
  }
}

__global__ void crossentropy_backward_kernel(float* dlogits, const float* logits, const int* targets, float dloss,
                                             int V) {
  __shared__ float shared[32];
  const std::size_t row = blockIdx.x;
  const float* x = logits + row * V;
  const float2 stats = softmax_statistics(x, V, shared);
  const float inv = 1.0f / stats.y;
  const int target = targets[row];
  float* grad = dlogits + row * V;
  for (int i = threadIdx.x; i < V; i += blockDim.x) {
    const float p = expf(x[i] - stats.x) * inv;
    grad[i] += (p - (i == target ? 1.0f : 0.0f)) * dloss;
  }
}

// Block-wide sum of doubles (blockDim.x a multiple of 32) in a fixed order; every thread
// gets it. `shared` holds 32 doubles.
__device__ inline double block_sum_double(double value, double* shared) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  for (int offset = 16; offset > 0; offset /= 2) value += __shfl_xor_sync(cuda::kFullMask, value, offset);
  __syncthreads();
  if (lane == 0) shared[warp] = value;
  __syncthreads();
  value = lane < warps ? shared[lane] : 0.0;
  for (int offset = 16; offset > 0; offset /= 2) value += __shfl_xor_sync(cuda::kFullMask, value, offset);
  return value;
}

// Megatron's vocabulary-parallel loss, one block per row of this rank's V logits.
__global__ void logits_row_max_kernel(float* row_max, const float* logits, int V) {
  __shared__ float shared[32];
  const std::size_t row = blockIdx.x;
  const float* x = logits + row * V;
  float local_max = -INFINITY;
  for (int i = threadIdx.x; i < V; i += blockDim.x) local_max = fmaxf(local_max, x[i]);
  const float m = block_max(local_max, shared);
  if (threadIdx.x == 0) row_max[row] = m;
}

// The exponentials in double, as the reference.
__global__ void logits_exp_sums_kernel(float* sums, const float* logits, const float* row_max, const int* targets,
                                       int V0, int N, int V) {
  __shared__ double shared[32];
  const std::size_t row = blockIdx.x;
  const float* x = logits + row * V;
  const double m = row_max[row];
  double local = 0;
  for (int i = threadIdx.x; i < V; i += blockDim.x) local += exp(static_cast<double>(x[i]) - m);
  const double total = block_sum_double(local, shared);
  if (threadIdx.x == 0) {
    sums[row] = static_cast<float>(total);
    const int t = targets[row] - V0;
    sums[N + row] = t >= 0 && t < V ? x[t] : 0.0f;
  }
}

__global__ void vocab_crossentropy_backward_kernel(float* dlogits, double* losses, const float* logits,
                                                   const float* row_max, const float* sums, const int* targets, int V0,
                                                   float dloss, int N, int V) {
  const std::size_t row = blockIdx.x;
  const float* x = logits + row * V;
  float* grad = dlogits + row * V;
  const double m = row_max[row], s = sums[row];
  const int target = targets[row] - V0;
  for (int i = threadIdx.x; i < V; i += blockDim.x) {
    const double p = exp(static_cast<double>(x[i]) - m) / s;
    grad[i] = static_cast<float>((p - (i == target ? 1.0 : 0.0)) * dloss);
  }
  if (threadIdx.x == 0) losses[row] = log(s) + m - sums[N + row];
}

}  // namespace

namespace launch {

Status logits_row_max(float* row_max, const float* logits, int N, int V, CudaStream stream) {
  logits_row_max_kernel<<<N, kThreads, 0, stream>>>(row_max, logits, V);
  return cuda::launched();
}

Status logits_exp_sums(float* sums, const float* logits, const float* row_max, const int* targets, int V0, int N, int V,
                       CudaStream stream) {
  logits_exp_sums_kernel<<<N, kThreads, 0, stream>>>(sums, logits, row_max, targets, V0, N, V);
  return cuda::launched();
}

Status vocab_crossentropy_backward(float* dlogits, double* losses, const float* logits, const float* row_max,
                                   const float* sums, const int* targets, int V0, float dloss, int N, int V,
                                   CudaStream stream) {
  vocab_crossentropy_backward_kernel<<<N, kThreads, 0, stream>>>(dlogits, losses, logits, row_max, sums, targets, V0,
                                                                 dloss, N, V);
  return cuda::launched();
}

Status crossentropy_forward(float* losses, const float* logits, const int* targets, int N, int V, CudaStream stream) {
  crossentropy_forward_kernel<<<N, kThreads, 0, stream>>>(losses, logits, targets, V);
  return cuda::launched();
}

Status crossentropy_backward(float* dlogits, const float* logits, const int* targets, float dloss, int N, int V,
                             CudaStream stream) {
  crossentropy_backward_kernel<<<N, kThreads, 0, stream>>>(dlogits, logits, targets, dloss, V);
  return cuda::launched();
}

}  // namespace launch

}  // namespace hetflow::kernels
