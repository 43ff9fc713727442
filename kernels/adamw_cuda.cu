// The AdamW step on the GPU (transformer_cuda.hpp): adamw_update's double operations, in its
// order, with explicitly rounded intrinsics so that nvcc fuses none of them into an FMA; the
// scalars come from the host (transformer_cuda.cpp) computed as the reference computes them.
// And the gradient clipping's helpers: the rescale and the squared norm's partial sums.
#include "kernels/cuda_common.cuh"
#include "kernels/transformer_cuda_launch.hpp"

namespace hetflow::kernels {

namespace {

constexpr int kThreads = 256;

__global__ void adamw_kernel(float* p, const float* g, float* m, float* v, long n, launch::AdamwScalars s) {
  for (long i = static_cast<long>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<long>(gridDim.x) * blockDim.x) {
    const double grad = g[i];
    // m and v are rounded to fp32 before the parameter's update reads them.
    const float mi = static_cast<float>(__dadd_rn(__dmul_rn(s.beta1, m[i]), __dmul_rn(s.one_minus_beta1, grad)));
    const float vi =
        static_cast<float>(__dadd_rn(__dmul_rn(s.beta2, v[i]), __dmul_rn(__dmul_rn(s.one_minus_beta2, grad), grad)));
    m[i] = mi;
    v[i] = vi;
    double param = p[i];
    param = __dsub_rn(param, __dmul_rn(s.decay, param));
    const double denominator = __dadd_rn(__ddiv_rn(__dsqrt_rn(vi), s.bias2_sqrt), s.eps);
    param = __dsub_rn(param, __ddiv_rn(__dmul_rn(s.step_size, mi), denominator));
    p[i] = static_cast<float>(param);
  }
}

__global__ void scale_kernel(float* x, float factor, long n) {
  for (long i = static_cast<long>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<long>(gridDim.x) * blockDim.x) {
    x[i] *= factor;
  }
}

// Block b of kSumOfSquaresParts sums the elements b*256 + t + k*(256 * parts) in thread t's
// order of k, then its threads' sums in the block's fixed order: the same shape for every n.
__global__ void sum_of_squares_kernel(double* parts, const float* x, long n) {
  __shared__ double shared[kThreads];
  double local = 0;
  for (long i = static_cast<long>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<long>(gridDim.x) * blockDim.x) {
    local += static_cast<double>(x[i]) * x[i];
  }
  shared[threadIdx.x] = local;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (static_cast<int>(threadIdx.x) < half) shared[threadIdx.x] += shared[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) parts[blockIdx.x] = shared[0];
}

}  // namespace

namespace launch {

Status scale(float* x, float factor, long n, CudaStream stream) {
  scale_kernel<<<cuda::stride_blocks(n, kThreads), kThreads, 0, stream>>>(x, factor, n);
  return cuda::launched();
}

Status sum_of_squares(double* parts, const float* x, long n, CudaStream stream) {
  sum_of_squares_kernel<<<kSumOfSquaresParts, kThreads, 0, stream>>>(parts, x, n);
  return cuda::launched();
}

Status adamw_update(float* p, const float* g, float* m, float* v, long n, const AdamwScalars& scalars,
                    CudaStream stream) {
  adamw_kernel<<<cuda::stride_blocks(n, kThreads), kThreads, 0, stream>>>(p, g, m, v, n, scalars);
  return cuda::launched();
}

}  // namespace launch

}  // namespace hetflow::kernels
