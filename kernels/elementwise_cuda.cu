// The pointwise kernels of transformer_cuda.hpp: residual and bias adds (apart and in one
// pass), GELU, SwiGLU, RoPE and the fp32 <-> bf16 / fp16 casts. The adds, GELU and SwiGLU are
// grid-stride loops over the reference's fp32 formulas; RoPE takes one block per row.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/cuda_common.cuh"
#include "kernels/transformer_cuda_launch.hpp"

namespace hetflow::kernels {

namespace {

constexpr int kThreads = 256;
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluCube = 0.044715f;

// The first element of this thread's grid-stride loop, and the stride.
__device__ inline long first_index() { return static_cast<long>(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ inline long grid_stride() { return static_cast<long>(gridDim.x) * blockDim.x; }

__global__ void residual_add_kernel(float* y, const float* x, long n) {
  for (long i = first_index(); i < n; i += grid_stride()) y[i] += x[i];
}

__global__ void bias_add_kernel(float* y, const float* b, long n, int C) {
  for (long i = first_index(); i < n; i += grid_stride()) y[i] += b[i % C];
}

// The reference's two adds per element, in its order (no contraction applies to adds).
__global__ void bias_residual_add_kernel(float* y, const float* b, const float* residual, long n, int C) {
  for (long i = first_index(); i < n; i += grid_stride()) {
    y[i] = b == nullptr ? y[i] + residual[i] : (y[i] + b[i % C]) + residual[i];
  }
}

// GELU's gate 0.5 (1 + tanh(u)) as the sigmoid 1 / (1 + exp(-2u)), the reference's formula
// (transformer_reference.cpp): 1 - tanh(u)^2 cancels where tanh(u) is near -1 (x near -4),
// where tanhf's 2-ulp error alone would put the backward outside the reference's tolerance.
__device__ inline float gelu_gate(float v) {
  const float u = kGeluScale * (v + kGeluCube * v * v * v);
  return 1.0f / (1.0f + expf(-2.0f * u));  // expf overflowing to inf gives 0, as it should
}

__global__ void gelu_forward_kernel(float* y, const float* x, long n) {
  for (long i = first_index(); i < n; i += grid_stride()) {
    const float v = x[i];
    y[i] = v * gelu_gate(v);
  }
}

__global__ void gelu_backward_kernel(float* dx, const float* dy, const float* x, long n) {
  for (long i = first_index(); i < n; i += grid_stride()) {
    const float v = x[i];
    // d/dx [x s(u)] = s + x s (1 - s) 2 u', since 0.5 sech^2(u) = 2 s (1 - s).
    const float s = gelu_gate(v);
    const float local = s + 2.0f * v * s * (1.0f - s) * kGeluScale * (1.0f + 3.0f * kGeluCube * v * v);
    dx[i] += local * dy[i];
  }
}

__global__ void swiglu_forward_kernel(float* y, const float* gate, const float* up, long n) {
  for (long i = first_index(); i < n; i += grid_stride()) {
    const float g = gate[i];
    y[i] = g / (1.0f + expf(-g)) * up[i];  // expf(-g) = inf for very negative g: silu is -0, not NaN
  }
}

__global__ void swiglu_backward_kernel(float* dgate, float* dup, const float* dy, const float* gate, const float* up,
                                       long n) {
  for (long i = first_index(); i < n; i += grid_stride()) {
    const float g = gate[i];
    const float sig = 1.0f / (1.0f + expf(-g));
    if (dgate != nullptr) dgate[i] += dy[i] * up[i] * sig * (1.0f + g * (1.0f - sig));
    if (dup != nullptr) dup[i] += dy[i] * g * sig;
  }
}

// One block per row n (position n % T). The block first computes the row's cosines and sines
// in double into shared memory (cos at [0, half), sign * sin at [half, 2 half)), as the
// reference's table, then rotates every pair of every head in double, rounding once. The
// double operations are the reference's, without fused multiply-adds (nvcc may fuse those of
// rope_inv_freq's llama3 and yarn blends: a double's last bit, far below fp32's); yarn's range
// comes resolved from the host (rope_resolved), its floor and ceil the reference's.
__global__ void rope_kernel(float* x, int T, int heads, int head_dim, RopeFrequencies frequencies, double sign) {
  extern __shared__ double table[];
  const int rotary = rope_rotary_dims(frequencies, head_dim), half = rotary / 2;  // values rotary.. pass through
  const int pos = static_cast<int>(blockIdx.x % static_cast<unsigned int>(T));
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    const double angle = __dmul_rn(pos, rope_inv_freq(frequencies, i, rotary));
    double s, c;
    sincos(angle, &s, &c);
    table[i] = __dmul_rn(c, frequencies.attention_factor);
    table[half + i] = sign * __dmul_rn(s, frequencies.attention_factor);
  }
  __syncthreads();
  float* row = x + static_cast<std::size_t>(blockIdx.x) * heads * head_dim;
  for (int p = threadIdx.x; p < heads * half; p += blockDim.x) {
    const int h = p / half, i = p % half;
    float* head = row + static_cast<std::size_t>(h) * head_dim;
    const double x1 = head[i], x2 = head[i + half], c = table[i], s = table[half + i];
    head[i] = static_cast<float>(__dsub_rn(__dmul_rn(x1, c), __dmul_rn(x2, s)));
    head[i + half] = static_cast<float>(__dadd_rn(__dmul_rn(x2, c), __dmul_rn(x1, s)));
  }
}

__global__ void to_bf16_kernel(std::uint16_t* out, const float* in, long n) {
  for (long i = first_index(); i < n; i += grid_stride()) out[i] = cuda::to_bf16_bits(in[i]);
}

__global__ void from_bf16_kernel(float* out, const std::uint16_t* in, long n) {
  for (long i = first_index(); i < n; i += grid_stride()) out[i] = __bfloat162float(__ushort_as_bfloat16(in[i]));
}

__global__ void to_fp16_kernel(std::uint16_t* out, const float* in, long n) {
  for (long i = first_index(); i < n; i += grid_stride()) out[i] = cuda::to_fp16_bits(in[i]);
}

__global__ void from_fp16_kernel(float* out, const std::uint16_t* in, long n) {
  for (long i = first_index(); i < n; i += grid_stride()) out[i] = __half2float(__ushort_as_half(in[i]));
}

// sign +1: the forward rotation; -1: its inverse (the gradient).
Status rope_rotate(float* x, int N, int T, int heads, int head_dim, const RopeFrequencies& frequencies, double sign,
                   CudaStream stream) {
  // cos and sin of the rotary_dims / 2 pairs
  const std::size_t table_bytes = sizeof(double) * static_cast<std::size_t>(rope_rotary_dims(frequencies, head_dim));
  const RopeFrequencies resolved = rope_resolved(frequencies, rope_rotary_dims(frequencies, head_dim));
  rope_kernel<<<N, 128, table_bytes, stream>>>(x, T, heads, head_dim, resolved, sign);
  return cuda::launched();
}

}  // namespace

namespace launch {

Status residual_add(float* y, const float* x, long n, CudaStream stream) {
  residual_add_kernel<<<cuda::stride_blocks(n, kThreads), kThreads, 0, stream>>>(y, x, n);
  return cuda::launched();
}

Status bias_add(float* y, const float* b, int N, int C, CudaStream stream) {
  const long n = static_cast<long>(N) * C;
  bias_add_kernel<<<cuda::stride_blocks(n, kThreads), kThreads, 0, stream>>>(y, b, n, C);
  return cuda::launched();
}

Status bias_residual_add(float* y, const float* b, const float* residual, int N, int C, CudaStream stream) {
  const long n = static_cast<long>(N) * C;
  bias_residual_add_kernel<<<cuda::stride_blocks(n, kThreads), kThreads, 0, stream>>>(y, b, residual, n, C);
  return cuda::launched();
}

Status gelu_forward(float* y, const float* x, long n, CudaStream stream) {
  gelu_forward_kernel<<<cuda::stride_blocks(n, kThreads), kThreads, 0, stream>>>(y, x, n);
  return cuda::launched();
}

Status gelu_backward(float* dx, const float* dy, const float* x, long n, CudaStream stream) {
  gelu_backward_kernel<<<cuda::stride_blocks(n, kThreads), kThreads, 0, stream>>>(dx, dy, x, n);
  return cuda::launched();
}

Status swiglu_forward(float* y, const float* gate, const float* up, long n, CudaStream stream) {
  swiglu_forward_kernel<<<cuda::stride_blocks(n, kThreads), kThreads, 0, stream>>>(y, gate, up, n);
  return cuda::launched();
}

Status swiglu_backward(float* dgate, float* dup, const float* dy, const float* gate, const float* up, long n,
                       CudaStream stream) {
  swiglu_backward_kernel<<<cuda::stride_blocks(n, kThreads), kThreads, 0, stream>>>(dgate, dup, dy, gate, up, n);
  return cuda::launched();
}

Status rope_forward(float* x, int N, int T, int heads, int head_dim, const RopeFrequencies& rope, CudaStream stream) {
  return rope_rotate(x, N, T, heads, head_dim, rope, 1.0, stream);
}

Status rope_backward(float* dx, int N, int T, int heads, int head_dim, const RopeFrequencies& rope,
                     CudaStream stream) {
  return rope_rotate(dx, N, T, heads, head_dim, rope, -1.0, stream);
}

Status cast_fp32_to_bf16(std::uint16_t* out, const float* in, long n, CudaStream stream) {
  to_bf16_kernel<<<cuda::stride_blocks(n, kThreads), kThreads, 0, stream>>>(out, in, n);
  return cuda::launched();
}

Status cast_bf16_to_fp32(float* out, const std::uint16_t* in, long n, CudaStream stream) {
  from_bf16_kernel<<<cuda::stride_blocks(n, kThreads), kThreads, 0, stream>>>(out, in, n);
  return cuda::launched();
}

Status cast_fp32_to_fp16(std::uint16_t* out, const float* in, long n, CudaStream stream) {
  to_fp16_kernel<<<cuda::stride_blocks(n, kThreads), kThreads, 0, stream>>>(out, in, n);
  return cuda::launched();
}

Status cast_fp16_to_fp32(float* out, const std::uint16_t* in, long n, CudaStream stream) {
  from_fp16_kernel<<<cuda::stride_blocks(n, kThreads), kThreads, 0, stream>>>(out, in, n);
  return cuda::launched();
}

}  // namespace launch

}  // namespace hetflow::kernels
