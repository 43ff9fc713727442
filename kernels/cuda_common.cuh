#pragma once
// Inside kernels/ only: what the transformer .cu files share. Status from CUDA errors, scratch
// memory ordered on a stream, and the fixed-order warp and block reductions every
// deterministic kernel here is built from.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "kernels/status.hpp"
#include "kernels/transformer_cuda.hpp"

namespace hetflow::kernels::cuda {

// A CUDA error as a Status (no_device for the errors that say there is none, alloc_failed for
// memory, execution_failed otherwise); the error state is cleared for the next call.
Status status_of(cudaError_t error);
// After a launch: the launch's error, if any.
Status launched();

// Stream-ordered scratch memory: cudaMallocAsync on the stream, cudaFreeAsync when it goes out
// of scope (after the kernels enqueued meanwhile, which the stream orders before the free).
// Where memory pools are not supported: cudaMalloc, and the stream is synchronized before
// cudaFree.
class Scratch {
 public:
  explicit Scratch(cudaStream_t stream) : stream_(stream) {}
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  ~Scratch();
  Status allocate(std::size_t bytes);
  // The allocation's byte at `offset`, as T* (offsets aligned by the caller).
  template <class T>
  T* at(std::size_t offset) const {
    return reinterpret_cast<T*>(static_cast<char*>(ptr_) + offset);
  }

 private:
  cudaStream_t stream_;
  void* ptr_ = nullptr;
  bool pooled_ = true;
};

// Rounds a byte count up to 256, so that arrays placed one after another in scratch stay aligned.
constexpr std::size_t aligned(std::size_t bytes) { return (bytes + 255) / 256 * 256; }

// Blocks for a grid-stride loop over n elements with `threads` per block: enough to fill any
// GPU, capped so the count fits gridDim.x. The loop visits every element whatever the count.
inline unsigned int stride_blocks(long n, int threads) {
  const long wanted = (n + threads - 1) / threads;
  return static_cast<unsigned int>(wanted < 65536L * 8 ? wanted : 65536L * 8);
}

// fp32 rounded to nearest even, as bf16's or fp16's bit pattern: every cast to 16 bits here.
__device__ inline std::uint16_t to_bf16_bits(float x) { return __bfloat16_as_ushort(__float2bfloat16_rn(x)); }
__device__ inline std::uint16_t to_fp16_bits(float x) { return __half_as_ushort(__float2half_rn(x)); }

constexpr unsigned int kFullMask = 0xffffffffu;

// Butterfly reductions: every lane ends with the same value (fp32 addition and fmaxf are
// commutative, so each lane's pairs add up alike), in an order fixed by the warp's shape.
__device__ inline float warp_sum(float value) {
  for (int offset = 16; offset > 0; offset /= 2) value += __shfl_xor_sync(kFullMask, value, offset);
  return value;
}

__device__ inline float warp_max(float value) {
  for (int offset = 16; offset > 0; offset /= 2) value = fmaxf(value, __shfl_xor_sync(kFullMask, value, offset));
  return value;
}

// Block-wide sum and max (blockDim.x a multiple of 32): every thread gets the result. `shared`
// holds 32 floats; it may be reused by the next call (the first barrier protects it).
__device__ inline float block_sum(float value, float* shared) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  value = warp_sum(value);
  __syncthreads();
  if (lane == 0) shared[warp] = value;
  __syncthreads();
  return warp_sum(lane < warps ? shared[lane] : 0.0f);
}

__device__ inline float block_max(float value, float* shared) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  value = warp_max(value);
  __syncthreads();
  if (lane == 0) shared[warp] = value;
  __syncthreads();
  return warp_max(lane < warps ? shared[lane] : -INFINITY);
}

}  // namespace hetflow::kernels::cuda
