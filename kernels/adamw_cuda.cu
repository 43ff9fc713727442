// The AdamW step on the GPU (transformer_cuda.hpp): adamw_update's double operations, in its
// order, with explicitly rounded intrinsics so that nvcc fuses none of them into an FMA; the
// scalars come from the host (transformer_cuda.cpp) computed as the reference computes them.
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

}  // namespace

namespace launch {

Status adamw_update(float* p, const float* g, float* m, float* v, long n, const AdamwScalars& scalars,
                    CudaStream stream) {
  adamw_kernel<<<cuda::stride_blocks(n, kThreads), kThreads, 0, stream>>>(p, g, m, v, n, scalars);
  return cuda::launched();
}

}  // namespace launch

}  // namespace hetflow::kernels
