// Cross-entropy with its softmax fused in (transformer_cuda.hpp): one block per row; the max
// and the sum of exponentials are block reductions in a fixed order; nothing of size V is
// stored between the passes but the logits themselves.
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

}  // namespace

namespace launch {

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
