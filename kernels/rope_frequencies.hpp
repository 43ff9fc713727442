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
// - yarn (Peng et al. 2023, YaRN; Qwen's long-context and DeepSeek-V3's configs): with d the
//   rotary size and L the original context, the correction range of pairs
//   [low, high] = [d ln(L / (2 pi beta_fast)) / (2 ln theta), the same with beta_slow], floored
//   and ceiled unless `truncate` is false, clamped to [0, d - 1] (high + 0.001 where they meet);
//   pair i's ramp r = clamp((i - low) / (high - low), 0, 1) blends the kept frequency with the
//   interpolated one: (1 - r) inv_freq + r inv_freq / factor. This is transformers' current
//   form (the range over original_max_position_embeddings; its 4.4x releases took
//   max_position_embeddings). cos and sin are then scaled by `attention_factor`.
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
  enum class Scaling { none, linear, llama3, yarn };
  double theta = 10000;
  Scaling scaling = Scaling::none;
  double factor = 1;                   // linear, llama3: > 0
  double low_freq_factor = 1;          // llama3: < high_freq_factor
  double high_freq_factor = 4;         // llama3
  double original_positions = 8192;    // llama3, yarn: L, > 0
  double beta_fast = 32, beta_slow = 1;  // yarn: the turns over L that bound the ramp, > 0
  bool truncate = true;                // yarn: the range's ends rounded outward to whole pairs
  double attention_factor = 1;         // cos and sin scaled by it (yarn's; 1 for the others), > 0
  // yarn: the correction range in pairs, resolved once on the host for a rotary size
  // (rope_resolved), so the CUDA kernel takes the host's range as is: a range end at a whole
  // pair cannot floor or ceil apart on the device. Unresolved, rope_inv_freq computes it.
  bool ramp_resolved = false;
  double ramp_low = 0, ramp_high = 0;
  int rotary_dims = 0;                 // the leading values of a head that turn, even; 0: all of it
};

// The values of each head of head_dim that turn: rotary_dims, or the whole head where it is 0.
HETFLOW_HOST_DEVICE inline int rope_rotary_dims(const RopeFrequencies& r, int head_dim) {
  return r.rotary_dims > 0 ? r.rotary_dims : head_dim;
}

// Whether the frequencies are finite and positive: theta, factor, attention_factor > 0; for
// llama3, L > 0 and low_freq_factor < high_freq_factor (both > 0); for yarn, theta > 1 (its
// range divides by ln theta), L > 0 and both betas > 0.
inline bool rope_frequencies_valid(const RopeFrequencies& r) {
  const bool base = r.theta > 0 && isfinite(r.theta) && r.factor > 0 && isfinite(r.factor) &&
                    r.attention_factor > 0 && isfinite(r.attention_factor);
  const bool context = r.original_positions > 0 && isfinite(r.original_positions);
  switch (r.scaling) {
    case RopeFrequencies::Scaling::llama3:
      return base && context && r.low_freq_factor > 0 && r.low_freq_factor < r.high_freq_factor &&
             isfinite(r.high_freq_factor);
    case RopeFrequencies::Scaling::yarn:
      return base && context && r.theta > 1 && r.beta_fast > 0 && isfinite(r.beta_fast) && r.beta_slow > 0 &&
             isfinite(r.beta_slow);
    default:
      return base;
  }
}

// YaRN's correction range over the pairs of a rotary part of `dims` values: transformers'
// find_correction_range, and linear_ramp_factor's nudge where the two ends meet (kept for
// fidelity: the clamp below would also take 0 / 0 as 0).
HETFLOW_HOST_DEVICE inline void rope_yarn_range(const RopeFrequencies& r, int dims, double& low, double& high) {
  const double d = dims, two_pi = 2 * 3.14159265358979323846;
  low = d * ::log(r.original_positions / (r.beta_fast * two_pi)) / (2 * ::log(r.theta));
  high = d * ::log(r.original_positions / (r.beta_slow * two_pi)) / (2 * ::log(r.theta));
  if (r.truncate) {
    low = ::floor(low);
    high = ::ceil(high);
  }
  low = ::fmax(low, 0.0);
  high = ::fmin(high, d - 1);
  if (low == high) high += 0.001;
}

// `r` with yarn's range resolved for a rotary part of `dims` values (as it is for the others).
inline RopeFrequencies rope_resolved(RopeFrequencies r, int dims) {
  if (r.scaling == RopeFrequencies::Scaling::yarn && !r.ramp_resolved) {
    rope_yarn_range(r, dims, r.ramp_low, r.ramp_high);
    r.ramp_resolved = true;
  }
  return r;
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
    case RopeFrequencies::Scaling::yarn: {
      double low = r.ramp_low, high = r.ramp_high;
      if (!r.ramp_resolved) rope_yarn_range(r, head_dim, low, high);
      const double ramp = ::fmin(::fmax((i - low) / (high - low), 0.0), 1.0);
      return (1 - ramp) * inv_freq + ramp * inv_freq / r.factor;
    }
  }
  return inv_freq;
}

}  // namespace hetflow::kernels
