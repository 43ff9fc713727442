#pragma once
// The rotary frequencies of RoPE: pair i (< head_dim / 2) of a head turns by pos * inv_freq(i),
// with inv_freq(i) = theta^(-2i / head_dim), rescaled as HuggingFace's `rope_scaling` asks
// (transformers' _compute_*_parameters, in double here):
// - linear: inv_freq / factor (positions interpolated by factor);
// - llama3 (Llama 3.1 and later): with wavelength w = 2 pi / inv_freq and L the original context
//   (original_max_position_embeddings), a w longer than L / low_freq_factor is divided by factor,
//   one shorter than L / high_freq_factor is kept, and between them the two are blended by
//   s = (L / w - low_freq_factor) / (high_freq_factor - low_freq_factor):
//   (1 - s) inv_freq / factor + s inv_freq.
// Dynamic NTK scaling only changes theta (for a sequence longer than the original context), so
// callers pass the theta it gives with Scaling::none.
//
// Partial rotary (GLM-4.5's and GPT-NeoX's partial_rotary_factor, Megatron's --rotary-percent):
// only the first rotary_dims values of each head turn, as a head of that size would (pair i <
// rotary_dims / 2 is (x[i], x[i + rotary_dims / 2]) at inv_freq(i) of rotary_dims); the rest
// pass through.
//
// One definition for the CPU reference and the CUDA kernel (host and device), so the two turn
// by the same angles; the PyTorch oracle (tests/exec/oracle) computes them independently.
#include <math.h>

#if defined(__CUDACC__)
#define HETFLOW_HOST_DEVICE __host__ __device__
#else
#define HETFLOW_HOST_DEVICE
#endif

namespace hetflow::kernels {

struct RopeFrequencies {
  enum class Scaling { none, linear, llama3 };
  double theta = 10000;
  Scaling scaling = Scaling::none;
  double factor = 1;                   // linear, llama3: > 0
  double low_freq_factor = 1;          // llama3: < high_freq_factor
  double high_freq_factor = 4;         // llama3
  double original_positions = 8192;    // llama3: L, > 0
  int rotary_dims = 0;                 // the leading values of a head that turn, even; 0: all of it
};

// The values of each head of head_dim that turn: rotary_dims, or the whole head where it is 0.
HETFLOW_HOST_DEVICE inline int rope_rotary_dims(const RopeFrequencies& r, int head_dim) {
  return r.rotary_dims > 0 ? r.rotary_dims : head_dim;
}

// Whether the frequencies are finite and positive: theta, factor, L > 0 and, for llama3,
// low_freq_factor < high_freq_factor (both > 0).
inline bool rope_frequencies_valid(const RopeFrequencies& r) {
  const bool base = r.theta > 0 && isfinite(r.theta) && r.factor > 0 && isfinite(r.factor);
  if (r.scaling != RopeFrequencies::Scaling::llama3) return base;
  return base && r.low_freq_factor > 0 && r.low_freq_factor < r.high_freq_factor && isfinite(r.high_freq_factor) &&
         r.original_positions > 0 && isfinite(r.original_positions);
}

HETFLOW_HOST_DEVICE inline double rope_inv_freq(const RopeFrequencies& r, int i, int head_dim) {
  const double inv_freq = ::pow(r.theta, -2.0 * i / head_dim);
  switch (r.scaling) {
    case RopeFrequencies::Scaling::none:
      return inv_freq;
    case RopeFrequencies::Scaling::linear:
      return inv_freq / r.factor;
    case RopeFrequencies::Scaling::llama3: {
      const double wavelength = 2 * 3.14159265358979323846 / inv_freq;
      if (wavelength < r.original_positions / r.high_freq_factor) return inv_freq;
      if (wavelength > r.original_positions / r.low_freq_factor) return inv_freq / r.factor;
      const double s = (r.original_positions / wavelength - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
      return (1 - s) * inv_freq / r.factor + s * inv_freq;
    }
  }
  return inv_freq;
}

}  // namespace hetflow::kernels
