// The fp32 <-> bf16 / fp16 conversions of cast.hpp, on the bit patterns.
#include <cmath>
#include <cstring>

#include "kernels/cast.hpp"

namespace hetflow::kernels {

namespace {

std::uint32_t bits_of(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

float float_of(std::uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

}  // namespace

std::uint16_t float_to_bf16(float x) {
  const std::uint32_t u = bits_of(x);
  if (std::isnan(x)) return static_cast<std::uint16_t>((u >> 16) | 0x0040u);  // keep the sign, set the quiet bit
  // Add half an ulp of bf16, less one unless the kept part is odd: ties go to even. A carry
  // out of the mantissa steps the exponent, up to infinity past the largest finite value.
  const std::uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>((u + rounding) >> 16);
}

float bf16_to_float(std::uint16_t h) { return float_of(static_cast<std::uint32_t>(h) << 16); }

std::uint16_t float_to_fp16(float x) {
  const std::uint32_t u = bits_of(x);
  const auto sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  const std::uint32_t magnitude = u & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u);  // NaN: quiet
  if (magnitude >= 0x47800000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // >= 2^16 (or inf): inf
  if (magnitude < 0x38800000u) {
    // Below 2^-14: a subnormal binary16 (or zero), a multiple of 2^-24. Adding 0.5 (2^-1)
    // to the magnitude lines its bits up so that 2^-24 is the float's last mantissa bit: the
    // float addition rounds to nearest even exactly as wanted, and the low mantissa bits are
    // the binary16 pattern.
    const float aligned = float_of(magnitude) + 0.5f;
    return static_cast<std::uint16_t>(sign | (bits_of(aligned) - 0x3f000000u));
  }
  // Normal: rebias the exponent (127 -> 15) and drop 13 mantissa bits rounding to nearest
  // even; a carry out of the mantissa steps the exponent, up to infinity from 65520 on.
  const std::uint32_t odd = (magnitude >> 13) & 1u;
  const std::uint32_t rebiased = magnitude - (static_cast<std::uint32_t>(127 - 15) << 23) + 0x0fffu + odd;
  return static_cast<std::uint16_t>(sign | (rebiased >> 13));
}

float fp16_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24, exact in float
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return float_of(sign | bits_of(magnitude));
  }
  if (exponent == 31) return float_of(sign | 0x7f800000u | (mantissa << 13));  // inf or NaN
  return float_of(sign | ((exponent + 127 - 15) << 23) | (mantissa << 13));
}

void cast_fp32_to_bf16(std::uint16_t* out, const float* in, long n) {
  for (long i = 0; i < n; ++i) out[i] = float_to_bf16(in[i]);
}

void cast_bf16_to_fp32(float* out, const std::uint16_t* in, long n) {
  for (long i = 0; i < n; ++i) out[i] = bf16_to_float(in[i]);
}

void cast_fp32_to_fp16(std::uint16_t* out, const float* in, long n) {
  for (long i = 0; i < n; ++i) out[i] = float_to_fp16(in[i]);
}

void cast_fp16_to_fp32(float* out, const std::uint16_t* in, long n) {
  for (long i = 0; i < n; ++i) out[i] = fp16_to_float(in[i]);
}

}  // namespace hetflow::kernels
