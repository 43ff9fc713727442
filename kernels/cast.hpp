#pragma once
// fp32 <-> bf16 and fp16 (IEEE binary16) conversions on the CPU: the reference the CUDA casts
// (transformer_cuda.hpp) are compared with, bit for bit. A 16-bit value is its bit pattern.
#include <cstdint>

namespace hetflow::kernels {

// Round to nearest, ties to even; a value past the largest finite one becomes infinity; a NaN
// stays a quiet NaN of the same sign (payload not kept).
std::uint16_t float_to_bf16(float x);
std::uint16_t float_to_fp16(float x);  // binary16: subnormals below 2^-14, infinity from 65520 up
// Exact: every bf16 and fp16 value is a float.
float bf16_to_float(std::uint16_t h);
float fp16_to_float(std::uint16_t h);

// The same, element by element over n values.
void cast_fp32_to_bf16(std::uint16_t* out, const float* in, long n);
void cast_bf16_to_fp32(float* out, const std::uint16_t* in, long n);
void cast_fp32_to_fp16(std::uint16_t* out, const float* in, long n);
void cast_fp16_to_fp32(float* out, const std::uint16_t* in, long n);

}  // namespace hetflow::kernels
