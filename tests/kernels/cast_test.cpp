// The fp32 <-> bf16 / fp16 references (cast.hpp): known values, round trips over every 16-bit
// pattern, and round-to-nearest-even checked against the neighbouring 16-bit values.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>

#include "kernels/cast.hpp"

using namespace hetflow::kernels;

namespace {

float from_bits(std::uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

TEST(CastReference, KnownBf16Values) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(float_to_bf16(-2.0f), 0xc000);
  EXPECT_EQ(float_to_bf16(0.0f), 0x0000);
  EXPECT_EQ(float_to_bf16(-0.0f), 0x8000);
  EXPECT_EQ(float_to_bf16(1.0f + 0x1p-8f), 0x3f80);      // a tie: to the even 0x3f80
  EXPECT_EQ(float_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);  // a tie: to the even 0x3f82
  EXPECT_EQ(float_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);  // past the tie: up
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::max()), 0x7f80);  // rounds past the largest bf16
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(from_bits(0x7f800001u)))));  // a NaN whose payload is cut off
  EXPECT_EQ(bf16_to_float(0x3f80), 1.0f);
  EXPECT_EQ(bf16_to_float(0x0001), from_bits(0x00010000u));  // a subnormal, exact
}

TEST(CastReference, KnownFp16Values) {
  EXPECT_EQ(float_to_fp16(1.0f), 0x3c00);
  EXPECT_EQ(float_to_fp16(-0.0f), 0x8000);
  EXPECT_EQ(float_to_fp16(0.1f), 0x2e66);
  EXPECT_EQ(float_to_fp16(1.0f / 3), 0x3555);
  EXPECT_EQ(float_to_fp16(65504.0f), 0x7bff);  // the largest finite
  EXPECT_EQ(float_to_fp16(65519.0f), 0x7bff);
  EXPECT_EQ(float_to_fp16(65520.0f), 0x7c00);  // the tie above it rounds to infinity
  EXPECT_EQ(float_to_fp16(1e10f), 0x7c00);
  EXPECT_EQ(float_to_fp16(-std::numeric_limits<float>::infinity()), 0xfc00);
  EXPECT_EQ(float_to_fp16(0x1p-14f), 0x0400);  // the smallest normal
  EXPECT_EQ(float_to_fp16(0x1p-24f), 0x0001);  // the smallest subnormal
  EXPECT_EQ(float_to_fp16(0x1p-25f), 0x0000);  // a tie: to the even 0
  EXPECT_EQ(float_to_fp16(0x1.8p-25f), 0x0001);
  EXPECT_EQ(float_to_fp16(0x1.8p-24f), 0x0002);  // a tie: to the even 2
  EXPECT_EQ(float_to_fp16(0x1.ffcp-15f), 0x0400);  // the largest subnormal's tie upward: the smallest normal
  EXPECT_TRUE(std::isnan(fp16_to_float(float_to_fp16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(fp16_to_float(0x3c00), 1.0f);
  EXPECT_EQ(fp16_to_float(0x0001), 0x1p-24f);
  EXPECT_EQ(fp16_to_float(0x7bff), 65504.0f);
  EXPECT_EQ(fp16_to_float(0xfc00), -std::numeric_limits<float>::infinity());
}

TEST(CastReference, EverySixteenBitValueRoundTrips) {
  for (std::uint32_t h = 0; h <= 0xffffu; ++h) {
    const auto bits = static_cast<std::uint16_t>(h);
    const float b = bf16_to_float(bits), f = fp16_to_float(bits);
    if (std::isnan(b)) {
      EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(b)))) << h;
    } else {
      EXPECT_EQ(float_to_bf16(b), bits) << h;
    }
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(fp16_to_float(float_to_fp16(f)))) << h;
    } else {
      EXPECT_EQ(float_to_fp16(f), bits) << h;
    }
  }
}

// For random floats in fp16's range: the result is the nearest fp16 value (no neighbour is
// closer), and of two equally near the one with the even pattern.
TEST(CastReference, Fp16RoundsToNearestEven) {
  std::mt19937 rng(1);
  std::uniform_int_distribution<std::uint32_t> magnitudes(0, 0x477fe000u);  // up to 65504
  const auto distance = [](float x, std::uint32_t h) { return std::fabs(static_cast<double>(x) - fp16_to_float(static_cast<std::uint16_t>(h))); };
  for (int i = 0; i < 200000; ++i) {
    const float x = from_bits(magnitudes(rng));
    const std::uint32_t h = float_to_fp16(x);
    ASSERT_LT(h, 0x7c00u) << x;
    const double d = distance(x, h);
    for (const std::uint32_t neighbour : {h - 1, h + 1}) {
      if (neighbour > 0x7bffu) continue;  // below 0 (wrapped) or past the largest finite
      const double dn = distance(x, neighbour);
      ASSERT_LE(d, dn) << "x=" << x << " h=" << h;
      if (d == dn) {
        ASSERT_EQ(h % 2, 0u) << "a tie must go to the even pattern, x=" << x;
      }
    }
  }
}

TEST(CastReference, ArraysCastElementByElement) {
  const float in[] = {1.0f, -0.5f, 3.14159f, 1e-6f};
  std::uint16_t bf[4], hf[4];
  float back[4];
  cast_fp32_to_bf16(bf, in, 4);
  cast_fp32_to_fp16(hf, in, 4);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(bf[i], float_to_bf16(in[i]));
    EXPECT_EQ(hf[i], float_to_fp16(in[i]));
  }
  cast_bf16_to_fp32(back, bf, 4);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(back[i], bf16_to_float(bf[i]));
  cast_fp16_to_fp32(back, hf, 4);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(back[i], fp16_to_float(hf[i]));
}

}  // namespace
