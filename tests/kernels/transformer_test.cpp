// The transformer reference kernels against oracles: every backward against central finite
// differences of its forward, forwards against closed forms (normalized rows, known GELU
// values, log V, AdamW's first step) and against direct double-precision formulas, and the
// conventions every kernel promises (backwards add, nullptr gradients are skipped, calls are
// bitwise repeatable).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/matmul.hpp"
#include "kernels/transformer.hpp"
#include "tests/kernels/gradient_check.hpp"

using namespace hetflow::kernels;
using namespace hetflow::test_support;

namespace {

// ---------------------------------------------------------------------------------------------
// Linear

TEST(Linear, ForwardMatchesMatmulReference) {
  std::mt19937 rng(1);
  for (const auto& [N, C, OC] : {std::tuple{5, 7, 3}, std::tuple{33, 65, 17}}) {
    const Vec x = random_vec(N * C, rng), w = random_vec(OC * C, rng), b = random_vec(OC, rng);
    Vec wt(w.size()), want(N * OC);
    for (int o = 0; o < OC; ++o) {
      for (int c = 0; c < C; ++c) wt[c * OC + o] = w[o * C + c];
    }
    matmul_reference(x.data(), wt.data(), want.data(), N, OC, C);
    Vec y = unwritten(want.size());
    linear_forward(y.data(), x.data(), w.data(), nullptr, N, C, OC);
    for (std::size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(y[i], want[i], 1e-5) << "no bias, N=" << N << " at " << i;
    linear_forward(y.data(), x.data(), w.data(), b.data(), N, C, OC);
    for (std::size_t i = 0; i < y.size(); ++i) {
      EXPECT_NEAR(y[i], want[i] + b[i % OC], 1e-5) << "bias, N=" << N << " at " << i;
    }
  }
}

TEST(Linear, GradientsMatchFiniteDifferences) {
  const int N = 5, C = 7, OC = 3;
  std::mt19937 rng(2);
  Vec x = random_vec(N * C, rng), w = random_vec(OC * C, rng), b = random_vec(OC, rng), r = random_vec(N * OC, rng);
  const auto loss = [&] {
    Vec y(N * OC);
    linear_forward(y.data(), x.data(), w.data(), b.data(), N, C, OC);
    return weighted_sum(r, y);
  };
  const auto input = check_convention("linear_backward_input", {x.size()}, [&](const std::vector<float*>& g) {
    linear_backward_input(g[0], r.data(), w.data(), N, C, OC);
  });
  const auto weight = check_convention(
      "linear_backward_weight", {w.size(), b.size()},
      [&](const std::vector<float*>& g) { linear_backward_weight(g[0], g[1], r.data(), x.data(), N, C, OC); });
  expect_gradient("dx", x, input[0], loss);
  expect_gradient("dw", w, weight[0], loss);
  expect_gradient("db", b, weight[1], loss);
}

// ---------------------------------------------------------------------------------------------
// Embedding

TEST(Embedding, ForwardAddsTheTokenAndPositionRows) {
  const int B = 2, T = 3, C = 4, V = 5, N = B * T;
  std::mt19937 rng(3);
  const Vec wte = random_vec(V * C, rng), wpe = random_vec(T * C, rng);
  const std::vector<int> tokens = {4, 0, 4, 2, 2, 1};
  Vec y = unwritten(N * C), words = unwritten(N * C);
  embedding_forward(y.data(), tokens.data(), wte.data(), wpe.data(), N, T, C);
  embedding_forward(words.data(), tokens.data(), wte.data(), nullptr, N, T, C);
  for (int n = 0; n < N; ++n) {
    for (int c = 0; c < C; ++c) {
      const float word = wte[tokens[n] * C + c];
      EXPECT_EQ(words[n * C + c], word);
      EXPECT_EQ(y[n * C + c], word + wpe[(n % T) * C + c]);
    }
  }
}

TEST(Embedding, GradientsMatchFiniteDifferences) {
  const int T = 5, N = 10, C = 7, V = 4;  // two sequences; tokens repeat within and across them
  std::mt19937 rng(4);
  Vec wte = random_vec(V * C, rng), wpe = random_vec(T * C, rng), r = random_vec(N * C, rng);
  const std::vector<int> tokens = {1, 3, 1, 0, 1, 3, 3, 0, 1, 1};  // token 2 is never seen: its gradient stays 0
  const auto loss = [&] {
    Vec y(N * C);
    embedding_forward(y.data(), tokens.data(), wte.data(), wpe.data(), N, T, C);
    return weighted_sum(r, y);
  };
  const auto grads = check_convention(
      "embedding_backward", {wte.size(), wpe.size()},
      [&](const std::vector<float*>& g) { embedding_backward(g[0], g[1], r.data(), tokens.data(), N, T, C); });
  for (int c = 0; c < C; ++c) EXPECT_EQ(grads[0][2 * C + c], 0.0f);
  expect_gradient("dwte", wte, grads[0], loss);
  expect_gradient("dwpe", wpe, grads[1], loss);
}

// ---------------------------------------------------------------------------------------------
// LayerNorm and RMSNorm

TEST(LayerNorm, RowsHaveMeanZeroAndVarianceOne) {
  const int N = 5, C = 64;
  std::mt19937 rng(5);
  const Vec x = random_vec(N * C, rng, 2, 12);  // far from normalized: mean 7, std about 3
  const Vec ones(C, 1.0f), zeros(C, 0.0f);
  Vec y = unwritten(N * C), mean = unwritten(N), rstd = unwritten(N);
  layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), ones.data(), zeros.data(), N, C, 1e-5f);
  for (int n = 0; n < N; ++n) {
    double m = 0, squares = 0, xm = 0, xsquares = 0;
    for (int c = 0; c < C; ++c) m += y[n * C + c], xm += x[n * C + c];
    m /= C, xm /= C;
    for (int c = 0; c < C; ++c) {
      squares += std::pow(y[n * C + c] - m, 2);
      xsquares += std::pow(x[n * C + c] - xm, 2);
    }
    EXPECT_NEAR(m, 0.0, 1e-6) << "row " << n;
    EXPECT_NEAR(squares / C, 1.0, 1e-5) << "row " << n;  // var / (var + eps) with var about 8
    EXPECT_NEAR(mean[n], xm, 1e-5);
    EXPECT_NEAR(rstd[n], 1 / std::sqrt(xsquares / C + 1e-5), 1e-6);
  }
  // w and b scale and shift the normalized row.
  const Vec w = random_vec(C, rng), b = random_vec(C, rng);
  Vec affine(N * C);
  layernorm_forward(affine.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C, 1e-5f);
  for (std::size_t i = 0; i < affine.size(); ++i) {
    EXPECT_NEAR(affine[i], y[i] * w[i % C] + b[i % C], 1e-6);
  }
}

TEST(LayerNorm, GradientsMatchFiniteDifferences) {
  const int N = 5, C = 7;
  std::mt19937 rng(6);
  Vec x = random_vec(N * C, rng, -2, 3), w = random_vec(C, rng, 0.5, 1.5), b = random_vec(C, rng),
      r = random_vec(N * C, rng);
  Vec mean(N), rstd(N);
  const auto loss = [&] {
    Vec y(N * C), m(N), s(N);
    layernorm_forward(y.data(), m.data(), s.data(), x.data(), w.data(), b.data(), N, C, 1e-5f);
    return weighted_sum(r, y);
  };
  Vec y(N * C);
  layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C, 1e-5f);
  const auto grads =
      check_convention("layernorm_backward", {x.size(), w.size(), b.size()}, [&](const std::vector<float*>& g) {
        layernorm_backward(g[0], g[1], g[2], r.data(), x.data(), w.data(), mean.data(), rstd.data(), N, C);
      });
  expect_gradient("dx", x, grads[0], loss);
  expect_gradient("dw", w, grads[1], loss);
  expect_gradient("db", b, grads[2], loss);
}

TEST(RmsNorm, RowsHaveMeanSquareOne) {
  const int N = 5, C = 64;
  std::mt19937 rng(7);
  const Vec x = random_vec(N * C, rng, -4, 9), ones(C, 1.0f);
  Vec y = unwritten(N * C), rstd = unwritten(N);
  rmsnorm_forward(y.data(), rstd.data(), x.data(), ones.data(), N, C, 1e-6f);
  for (int n = 0; n < N; ++n) {
    double squares = 0, xsquares = 0;
    for (int c = 0; c < C; ++c) {
      squares += std::pow(y[n * C + c], 2);
      xsquares += std::pow(x[n * C + c], 2);
    }
    EXPECT_NEAR(squares / C, 1.0, 1e-5) << "row " << n;
    EXPECT_NEAR(rstd[n], 1 / std::sqrt(xsquares / C + 1e-6), 1e-6);
  }
}

TEST(RmsNorm, GradientsMatchFiniteDifferences) {
  const int N = 5, C = 7;
  std::mt19937 rng(8);
  Vec x = random_vec(N * C, rng, -2, 3), w = random_vec(C, rng, 0.5, 1.5), r = random_vec(N * C, rng), rstd(N);
  const auto loss = [&] {
    Vec y(N * C), s(N);
    rmsnorm_forward(y.data(), s.data(), x.data(), w.data(), N, C, 1e-5f);
    return weighted_sum(r, y);
  };
  Vec y(N * C);
  rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5f);
  const auto grads = check_convention("rmsnorm_backward", {x.size(), w.size()}, [&](const std::vector<float*>& g) {
    rmsnorm_backward(g[0], g[1], r.data(), x.data(), w.data(), rstd.data(), N, C);
  });
  expect_gradient("dx", x, grads[0], loss);
  expect_gradient("dw", w, grads[1], loss);
}

// ---------------------------------------------------------------------------------------------
// GELU and SwiGLU

TEST(Adds, ResidualAndBiasAddElementwise) {
  std::vector<float> y = {1, 2, 3, 4, 5, 6};
  const std::vector<float> x = {10, 20, 30, 40, 50, 60}, b = {0.5f, -1, 2};
  residual_add(y.data(), x.data(), 6);
  EXPECT_EQ(y, (std::vector<float>{11, 22, 33, 44, 55, 66}));
  bias_add(y.data(), b.data(), 2, 3);  // two rows of three
  EXPECT_EQ(y, (std::vector<float>{11.5f, 21, 35, 44.5f, 54, 68}));
}

TEST(Adds, ScaleAndSumOfSquares) {
  std::vector<float> x = {1, -2, 0.5f};
  scale(x.data(), 2.0f, 3);
  EXPECT_EQ(x, (std::vector<float>{2, -4, 1}));
  EXPECT_EQ(sum_of_squares(x.data(), 3), 21.0);
  EXPECT_EQ(sum_of_squares(x.data(), 3, 0.5), 21.5);  // continues a running sum
}

// Against the sum in index order in long double, at every length around the kernel's lanes
// (the tail of each) and at a gradient's: within a recursive sum's error bound in double,
// (n + 1) u of the sum for n positive terms (Higham, Accuracy and Stability of Numerical
// Algorithms, 4.2; u = 2^-53; a float's square is exact in double), whatever the order.
TEST(Adds, SumOfSquaresEqualsTheSumInIndexOrder) {
  std::mt19937 rng(7);
  const Vec x = random_vec(100003, rng, -3, 3);
  for (const long n : {0L, 1L, 7L, 8L, 9L, 15L, 17L, 64L, 100003L}) {
    long double want = 0.25L;
    for (long i = 0; i < n; ++i) want += static_cast<long double>(x[static_cast<size_t>(i)]) * x[static_cast<size_t>(i)];
    const double got = sum_of_squares(x.data(), n, 0.25);
    const double bound = static_cast<double>(n + 1) * 0x1p-53 * static_cast<double>(want);
    EXPECT_NEAR(got, static_cast<double>(want), bound) << "n = " << n;
  }
}

TEST(Gelu, KnownValues) {
  const Vec x = {0, 1, -1, 2, 10, -10};
  Vec y = unwritten(x.size());
  gelu_forward(y.data(), x.data(), static_cast<long>(x.size()));
  // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), evaluated by hand in double.
  EXPECT_EQ(y[0], 0.0f);
  EXPECT_NEAR(y[1], 0.8411919906, 1e-6);
  EXPECT_NEAR(y[2], -0.1588080094, 1e-6);
  EXPECT_NEAR(y[3], 1.9545976973, 1e-6);
  EXPECT_NEAR(y[4], 10.0, 1e-6);
  EXPECT_NEAR(y[5], 0.0, 1e-6);
}

TEST(Gelu, GradientMatchesFiniteDifferences) {
  const long n = 35;
  std::mt19937 rng(9);
  Vec x = random_vec(n, rng, -4, 4), r = random_vec(n, rng);
  const auto loss = [&] {
    Vec y(n);
    gelu_forward(y.data(), x.data(), n);
    return weighted_sum(r, y);
  };
  const auto grads = check_convention(
      "gelu_backward", {x.size()}, [&](const std::vector<float*>& g) { gelu_backward(g[0], r.data(), x.data(), n); });
  expect_gradient("dx", x, grads[0], loss);
}

TEST(SwiGlu, KnownValues) {
  const Vec gate = {0, 1, -1, -100, 100}, up = {3, 2, 2, 5, 0.5};
  Vec y = unwritten(gate.size());
  swiglu_forward(y.data(), gate.data(), up.data(), static_cast<long>(gate.size()));
  EXPECT_EQ(y[0], 0.0f);
  EXPECT_NEAR(y[1], 2 * 0.7310585786, 1e-6);   // silu(1) = 1 / (1 + e^-1)
  EXPECT_NEAR(y[2], 2 * -0.2689414214, 1e-6);  // silu(-1) = -1 / (1 + e)
  EXPECT_NEAR(y[3], 0.0, 1e-30);               // exp(100) overflows float: silu is 0, not NaN
  EXPECT_NEAR(y[4], 50.0, 1e-5);
}

TEST(SwiGlu, GradientsMatchFiniteDifferences) {
  const long n = 35;
  std::mt19937 rng(10);
  Vec gate = random_vec(n, rng, -5, 5), up = random_vec(n, rng), r = random_vec(n, rng);
  const auto loss = [&] {
    Vec y(n);
    swiglu_forward(y.data(), gate.data(), up.data(), n);
    return weighted_sum(r, y);
  };
  const auto grads = check_convention("swiglu_backward", {gate.size(), up.size()}, [&](const std::vector<float*>& g) {
    swiglu_backward(g[0], g[1], r.data(), gate.data(), up.data(), n);
  });
  expect_gradient("dgate", gate, grads[0], loss);
  expect_gradient("dup", up, grads[1], loss);
}

// ---------------------------------------------------------------------------------------------
// RoPE

TEST(Rope, RotatesEachHalfPairByItsAngle) {
  // One row per position 0..T-1 (twice: two sequences), 2 heads of head_dim 4: pair (0, 2) turns
  // by pos * theta^0, pair (1, 3) by pos * theta^(-1/2).
  const int T = 3, N = 6, heads = 2, hd = 4;
  const float theta = 10000;
  std::mt19937 rng(11);
  const Vec x = random_vec(N * heads * hd, rng);
  Vec y = x;
  rope_forward(y.data(), N, T, heads, hd, RopeFrequencies{theta});
  for (int n = 0; n < N; ++n) {
    const int pos = n % T;
    for (int h = 0; h < heads; ++h) {
      const std::size_t base = static_cast<std::size_t>((n * heads + h) * hd);
      for (int i = 0; i < hd / 2; ++i) {
        const double angle = pos * std::pow(10000.0, -2.0 * i / hd);
        const double x1 = x[base + i], x2 = x[base + i + 2];
        EXPECT_NEAR(y[base + i], x1 * std::cos(angle) - x2 * std::sin(angle), 1e-6) << "row " << n << " pair " << i;
        EXPECT_NEAR(y[base + i + 2], x2 * std::cos(angle) + x1 * std::sin(angle), 1e-6) << "row " << n << " pair " << i;
        // A rotation: each pair keeps its norm.
        EXPECT_NEAR(std::hypot(y[base + i], y[base + i + 2]), std::hypot(x1, x2), 1e-6);
      }
      if (pos == 0) {  // position 0 turns by 0: the identity
        for (int d = 0; d < hd; ++d) EXPECT_EQ(y[base + d], x[base + d]);
      }
    }
  }
}

// HuggingFace's rescaled frequencies, against values worked by hand from its formulas. theta
// 100, head_dim 8: inv_freq = 100^(-i/4) = 1, 0.316.., 0.1, 0.0316.. (wavelengths 2 pi / inv_freq
// = 6.3, 19.9, 62.8, 198.7). llama3 with L = 8, low 0.25, high 1, factor 4 bands them at
// L / high = 8 and L / low = 32: pair 0 kept, pairs 2 and 3 divided by 4, and pair 1 blended
// by s = (L / w - 0.25) / 0.75, which here makes (s + (1 - s) / 4) inv_freq = (L / w) inv_freq
// = L inv_freq^2 / (2 pi) = 0.8 / (2 pi).
TEST(Rope, ScaledFrequenciesAreHuggingFacesBands) {
  const RopeFrequencies llama3{100, RopeFrequencies::Scaling::llama3, 4, 0.25, 1, 8};
  const double want[] = {1, 0.8 / (2 * 3.141592653589793), 0.1 / 4, 0.031622776601683794 / 4};
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(rope_inv_freq(llama3, i, 8), want[i], 1e-15 * want[i]) << "pair " << i;
  const RopeFrequencies linear{100, RopeFrequencies::Scaling::linear, 2.5};
  for (int i = 0; i < 4; ++i) {
    EXPECT_DOUBLE_EQ(rope_inv_freq(linear, i, 8), rope_inv_freq(RopeFrequencies{100}, i, 8) / 2.5) << "pair " << i;
  }
  // rope_forward turns each pair by position * its frequency.
  const int T = 5, N = 10, heads = 2, hd = 8;
  std::mt19937 rng(14);
  const Vec x = random_vec(N * heads * hd, rng);
  Vec y = x;
  rope_forward(y.data(), N, T, heads, hd, llama3);
  for (int n = 0; n < N; ++n) {
    for (int h = 0; h < heads; ++h) {
      const std::size_t base = static_cast<std::size_t>((n * heads + h) * hd);
      for (int i = 0; i < hd / 2; ++i) {
        const double angle = (n % T) * want[i];
        const double x1 = x[base + i], x2 = x[base + i + 4];
        EXPECT_NEAR(y[base + i], x1 * std::cos(angle) - x2 * std::sin(angle), 1e-6) << "row " << n << " pair " << i;
        EXPECT_NEAR(y[base + i + 4], x2 * std::cos(angle) + x1 * std::sin(angle), 1e-6) << "row " << n << " pair " << i;
      }
    }
  }
  EXPECT_TRUE(rope_frequencies_valid(llama3));
  EXPECT_FALSE(rope_frequencies_valid(RopeFrequencies{100, RopeFrequencies::Scaling::llama3, 4, 1, 1, 8}));
  EXPECT_FALSE(rope_frequencies_valid(RopeFrequencies{0}));
}

// YaRN (transformers' current _compute_yarn_parameters), counted by hand: over a head of 10
// at theta 100, the pair turning b times in L = 16 positions is 5 log_100(16 / (2 pi b)):
// -1.24 for beta_fast 8 and 1.77 for beta_slow 0.5, truncated to pairs 0 and 2, so pair 0
// keeps its frequency, pair 1 is half-way to a quarter of it and pairs 2-4 are a quarter.
// Untruncated over a head of 8 with L = 11 the ends are -1.32 (clamped to 0) and
// 4 log_100(11 / pi) = 1.0885, pair 1 that far along. cos and sin are scaled by the attention
// factor, so the rotation is scaled, forward and backward.
RopeFrequencies yarn(int original, bool truncate) {
  RopeFrequencies r{100, RopeFrequencies::Scaling::yarn, 4};
  r.original_positions = original;
  r.beta_fast = 8;
  r.beta_slow = 0.5;
  r.truncate = truncate;
  r.attention_factor = 0.1 * std::log(4.0) + 1;
  return r;
}

TEST(Rope, YarnRampsFromKeptToInterpolatedFrequencies) {
  const RopeFrequencies truncated = yarn(16, true), untruncated = yarn(11, false);
  const double ramp10[] = {0, 0.5, 1, 1, 1};
  for (int i = 0; i < 5; ++i) {
    const double w = std::pow(100.0, -2.0 * i / 10);
    EXPECT_NEAR(rope_inv_freq(truncated, i, 10), w * (1 - ramp10[i]) + w / 4 * ramp10[i], 1e-15 * w) << "pair " << i;
  }
  const double end = 4 * std::log(11 / 3.141592653589793) / std::log(100.0);
  const double ramp8[] = {0, 1 / end, 1, 1};
  for (int i = 0; i < 4; ++i) {
    const double w = std::pow(100.0, -2.0 * i / 8);
    EXPECT_NEAR(rope_inv_freq(untruncated, i, 8), w * (1 - ramp8[i]) + w / 4 * ramp8[i], 1e-14 * w) << "pair " << i;
  }
  // Resolved once (as the CUDA launcher does) the range gives the same frequencies.
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(rope_inv_freq(rope_resolved(truncated, 10), i, 10), rope_inv_freq(truncated, i, 10)) << "pair " << i;
  }
  double low = 0, high = 0;
  rope_yarn_range(truncated, 10, low, high);
  EXPECT_EQ(low, 0);
  EXPECT_EQ(high, 2);
  // rope_forward turns each pair by position * its frequency and scales it.
  const int T = 5, N = 10, heads = 2, hd = 10;
  const double a = truncated.attention_factor;
  std::mt19937 rng(17);
  const Vec x = random_vec(N * heads * hd, rng);
  Vec y = x;
  rope_forward(y.data(), N, T, heads, hd, truncated);
  for (int n = 0; n < N; ++n) {
    for (int h = 0; h < heads; ++h) {
      const std::size_t base = static_cast<std::size_t>((n * heads + h) * hd);
      for (int i = 0; i < hd / 2; ++i) {
        const double w = std::pow(100.0, -2.0 * i / 10), angle = (n % T) * (w * (1 - ramp10[i]) + w / 4 * ramp10[i]);
        const double x1 = x[base + i], x2 = x[base + i + 5];
        EXPECT_NEAR(y[base + i], a * (x1 * std::cos(angle) - x2 * std::sin(angle)), 1e-6) << "row " << n;
        EXPECT_NEAR(y[base + i + 5], a * (x2 * std::cos(angle) + x1 * std::sin(angle)), 1e-6) << "row " << n;
      }
    }
  }
  // Its gradient, by central differences (the scale included), with a partial rotary part.
  RopeFrequencies partial = untruncated;
  partial.rotary_dims = 8;
  Vec z = random_vec(N * heads * hd, rng), r = random_vec(z.size(), rng);
  const auto loss = [&] {
    Vec out = z;
    rope_forward(out.data(), N, T, heads, hd, partial);
    return weighted_sum(r, out);
  };
  Vec dz = r;
  rope_backward(dz.data(), N, T, heads, hd, partial);
  expect_gradient("dx", z, dz, loss);
  EXPECT_TRUE(rope_frequencies_valid(truncated));
  for (const auto& [what, broken] :
       {std::pair{"theta 1", [] { auto f = yarn(16, true); f.theta = 1; return f; }()},
        {"beta_fast 0", [] { auto f = yarn(16, true); f.beta_fast = 0; return f; }()},
        {"beta_slow inf", [] { auto f = yarn(16, true); f.beta_slow = INFINITY; return f; }()},
        {"attention_factor 0", [] { auto f = yarn(16, true); f.attention_factor = 0; return f; }()},
        {"original 0", [] { auto f = yarn(16, true); f.original_positions = 0; return f; }()}}) {
    EXPECT_FALSE(rope_frequencies_valid(broken)) << what;
  }
}

// Partial rotary (GLM-4.5's partial_rotary_factor): the first rotary_dims values of each head
// turn exactly as a head of that size would, llama3's bands over that size included; the rest
// pass through untouched, forward and backward.
TEST(Rope, PartialRotaryTurnsTheLeadingValuesAsASmallerHead) {
  const int T = 5, N = 10, heads = 3, hd = 10, rd = 6;
  for (RopeFrequencies whole : {RopeFrequencies{10000}, RopeFrequencies{100, RopeFrequencies::Scaling::llama3, 4, 0.25, 1, 8}}) {
    RopeFrequencies partial = whole;
    partial.rotary_dims = rd;
    EXPECT_EQ(rope_rotary_dims(partial, hd), rd);
    EXPECT_EQ(rope_rotary_dims(whole, hd), hd);
    std::mt19937 rng(15);
    const Vec x = random_vec(N * heads * hd, rng, -3, 3);
    Vec lead(static_cast<std::size_t>(N * heads * rd));  // the leading values, as heads of rd
    for (int r = 0; r < N * heads; ++r) {
      for (int d = 0; d < rd; ++d) lead[static_cast<std::size_t>(r * rd + d)] = x[static_cast<std::size_t>(r * hd + d)];
    }
    for (const double sign : {1.0, -1.0}) {
      Vec y = x, want = lead;
      if (sign > 0) {
        rope_forward(y.data(), N, T, heads, hd, partial);
        rope_forward(want.data(), N, T, heads, rd, whole);
      } else {
        rope_backward(y.data(), N, T, heads, hd, partial);
        rope_backward(want.data(), N, T, heads, rd, whole);
      }
      for (int r = 0; r < N * heads; ++r) {
        for (int d = 0; d < hd; ++d) {
          const std::size_t at = static_cast<std::size_t>(r * hd + d);
          const float expected = d < rd ? want[static_cast<std::size_t>(r * rd + d)] : x[at];
          EXPECT_EQ(y[at], expected) << "head row " << r << " value " << d << " sign " << sign;
        }
      }
    }
  }
  // Its gradient, by central differences.
  RopeFrequencies partial{10000};
  partial.rotary_dims = 4;
  std::mt19937 rng(16);
  Vec x = random_vec(N * heads * 8, rng), r = random_vec(x.size(), rng);
  const auto loss = [&] {
    Vec y = x;
    rope_forward(y.data(), N, T, heads, 8, partial);
    return weighted_sum(r, y);
  };
  Vec dx = r;
  rope_backward(dx.data(), N, T, heads, 8, partial);
  expect_gradient("dx", x, dx, loss);
}

TEST(Rope, BackwardUndoesForward) {
  const int T = 5, N = 10, heads = 3, hd = 8;
  std::mt19937 rng(12);
  const Vec x = random_vec(N * heads * hd, rng, -3, 3);
  Vec y = x;
  rope_forward(y.data(), N, T, heads, hd, RopeFrequencies{500000});
  rope_backward(y.data(), N, T, heads, hd, RopeFrequencies{500000});
  for (std::size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(y[i], x[i], 1e-6) << i;
}

TEST(Rope, GradientMatchesFiniteDifferences) {
  const int T = 5, N = 10, heads = 3, hd = 4;
  std::mt19937 rng(13);
  Vec x = random_vec(N * heads * hd, rng), r = random_vec(x.size(), rng);
  const auto loss = [&] {
    Vec y = x;
    rope_forward(y.data(), N, T, heads, hd, RopeFrequencies{10000});
    return weighted_sum(r, y);
  };
  Vec dx = r;  // in place: the gradient with respect to rope's output becomes the one with respect to its input
  rope_backward(dx.data(), N, T, heads, hd, RopeFrequencies{10000});
  expect_gradient("dx", x, dx, loss);
}

// ---------------------------------------------------------------------------------------------
// Attention

struct AttentionShape {
  int B, T, NH, NKV, HS;
  int window = 0;  // sliding window: keys per query; 0 none
  std::size_t q() const { return static_cast<std::size_t>(B * T * NH * HS); }
  std::size_t kv() const { return static_cast<std::size_t>(B * T * NKV * HS); }
  std::size_t probs() const { return static_cast<std::size_t>(B * NH * T * T); }
};

// The definition, in double, one score at a time: the oracle for the blocked sgemm forward.
// Query t attends to keys [lo, t], lo = t - window + 1 under a window (HuggingFace's mask).
std::vector<double> direct_attention(const AttentionShape& s, const Vec& q, const Vec& k, const Vec& v) {
  std::vector<double> out(s.q(), 0.0);
  for (int b = 0; b < s.B; ++b) {
    for (int h = 0; h < s.NH; ++h) {
      const int kvh = h / (s.NH / s.NKV);
      for (int t = 0; t < s.T; ++t) {
        const auto row = [&](const Vec& a, int tt, int head, int heads) {
          return a.data() + ((b * s.T + tt) * heads + head) * s.HS;
        };
        const int lo = s.window > 0 ? std::max(0, t - s.window + 1) : 0;
        std::vector<double> scores(t + 1 - lo);  // scores[j - lo] for key j
        for (int j = lo; j <= t; ++j) {
          double dot = 0;
          for (int d = 0; d < s.HS; ++d) dot += static_cast<double>(row(q, t, h, s.NH)[d]) * row(k, j, kvh, s.NKV)[d];
          scores[j - lo] = dot / std::sqrt(static_cast<double>(s.HS));
        }
        const double m = *std::max_element(scores.begin(), scores.end());
        double sum = 0;
        for (double& x : scores) sum += (x = std::exp(x - m));
        double* o = out.data() + ((b * s.T + t) * s.NH + h) * s.HS;
        for (int j = lo; j <= t; ++j) {
          for (int d = 0; d < s.HS; ++d) o[d] += scores[j - lo] / sum * row(v, j, kvh, s.NKV)[d];
        }
      }
    }
  }
  return out;
}

TEST(Attention, ForwardMatchesTheDefinition) {
  // 150 tokens cross the kernel's row blocks: past keys by sgemm, the diagonal by loops.
  // Sliding windows: shorter than a block (37: a block's rows start their windows at
  // different keys), longer (100), one key (the query's own) and as long as the sequence.
  for (const AttentionShape s :
       {AttentionShape{2, 5, 6, 2, 4}, AttentionShape{2, 150, 4, 2, 8}, AttentionShape{1, 1, 2, 1, 3},
        AttentionShape{2, 150, 4, 2, 8, 37}, AttentionShape{1, 150, 2, 1, 8, 100}, AttentionShape{1, 70, 2, 1, 4, 1},
        AttentionShape{1, 9, 2, 1, 4, 9}}) {
    std::mt19937 rng(14);
    const Vec q = random_vec(s.q(), rng, -2, 2), k = random_vec(s.kv(), rng, -2, 2), v = random_vec(s.kv(), rng);
    Vec out = unwritten(s.q()), probs = unwritten(s.probs());
    attention_forward(out.data(), probs.data(), q.data(), k.data(), v.data(), s.B, s.T, s.NH, s.NKV, s.HS, s.window);
    const std::vector<double> want = direct_attention(s, q, k, v);
    for (std::size_t i = 0; i < out.size(); ++i) {
      ASSERT_NEAR(out[i], want[i], 2e-6) << "T=" << s.T << " window " << s.window << " at " << i;
    }
    if (s.T == 1) {  // one key: its value, for both heads
      EXPECT_EQ(out, (Vec{v[0], v[1], v[2], v[0], v[1], v[2]}));
    }
  }
}

TEST(Attention, ProbsAreACausalSoftmax) {
  for (const AttentionShape s : {AttentionShape{2, 70, 3, 1, 4}, AttentionShape{2, 70, 3, 1, 4, 20}}) {
  std::mt19937 rng(15);
  const Vec q = random_vec(s.q(), rng, -3, 3), k = random_vec(s.kv(), rng, -3, 3), v = random_vec(s.kv(), rng);
  Vec out = unwritten(s.q()), probs = unwritten(s.probs());
  attention_forward(out.data(), probs.data(), q.data(), k.data(), v.data(), s.B, s.T, s.NH, s.NKV, s.HS, s.window);
  for (int row = 0; row < s.B * s.NH * s.T; ++row) {
    const int t = row % s.T;
    double sum = 0;
    for (int j = 0; j < s.T; ++j) {
      const float p = probs[row * s.T + j];
      if (j > t || (s.window > 0 && j <= t - s.window)) {
        ASSERT_EQ(p, 0.0f) << "row " << row << " key " << j;
      } else {
        ASSERT_GE(p, 0.0f);
        sum += p;
      }
    }
    ASSERT_NEAR(sum, 1.0, 1e-6) << "row " << row;
  }
  }
}

// A window as long as the sequence masks nothing: bitwise the unwindowed attention, both ways.
TEST(Attention, AWindowAsLongAsTheSequenceIsBitwiseNoWindow) {
  const AttentionShape s{2, 70, 4, 2, 8};
  std::mt19937 rng(19);
  const Vec q = random_vec(s.q(), rng), k = random_vec(s.kv(), rng), v = random_vec(s.kv(), rng),
            dout = random_vec(s.q(), rng);
  std::vector<Vec> got[2];
  for (const int window : {0, s.T}) {
    Vec out(s.q()), probs(s.probs()), dq(s.q()), dk(s.kv()), dv(s.kv());
    attention_forward(out.data(), probs.data(), q.data(), k.data(), v.data(), s.B, s.T, s.NH, s.NKV, s.HS, window);
    attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), probs.data(), q.data(), k.data(), v.data(), s.B,
                       s.T, s.NH, s.NKV, s.HS, window);
    got[window == 0 ? 0 : 1] = {out, probs, dq, dk, dv};
  }
  for (std::size_t i = 0; i < got[0].size(); ++i) EXPECT_TRUE(bitwise_equal(got[0][i], got[1][i])) << "array " << i;
}

TEST(Attention, LaterKeysAndValuesDoNotReachEarlierPositions) {
  const AttentionShape s{2, 150, 4, 2, 8};
  std::mt19937 rng(16);
  const Vec q = random_vec(s.q(), rng), k = random_vec(s.kv(), rng), v = random_vec(s.kv(), rng);
  Vec out(s.q()), probs(s.probs());
  attention_forward(out.data(), probs.data(), q.data(), k.data(), v.data(), s.B, s.T, s.NH, s.NKV, s.HS, s.window);
  // Change every key and value from position `from` on: to other numbers, then to NaN and inf.
  for (const int from : {1, 64, 100, 149}) {
    for (const float poison : {0.5f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
      Vec k2 = k, v2 = v;
      for (int b = 0; b < s.B; ++b) {
        for (int t = from; t < s.T; ++t) {
          for (int i = 0; i < s.NKV * s.HS; ++i) {
            const std::size_t at = static_cast<std::size_t>((b * s.T + t) * s.NKV * s.HS + i);
            k2[at] = poison == 0.5f ? k[at] + poison : poison;
            v2[at] = poison == 0.5f ? -v[at] : poison;
          }
        }
      }
      Vec out2(s.q()), probs2(s.probs());
      attention_forward(out2.data(), probs2.data(), q.data(), k2.data(), v2.data(), s.B, s.T, s.NH, s.NKV, s.HS, s.window);
      for (int b = 0; b < s.B; ++b) {
        const std::size_t first = static_cast<std::size_t>(b * s.T * s.NH * s.HS),
                          row = static_cast<std::size_t>(s.NH * s.HS);
        const Vec before(out.begin() + static_cast<long>(first), out.begin() + static_cast<long>(first + from * row));
        const Vec after(out2.begin() + static_cast<long>(first), out2.begin() + static_cast<long>(first + from * row));
        EXPECT_TRUE(bitwise_equal(before, after)) << "from " << from << " poison " << poison << " batch " << b;
      }
    }
  }
}

TEST(Attention, GroupedQueryEqualsRepeatedKeyValueHeads) {
  const int B = 2, T = 70, NH = 6, NKV = 2, HS = 4, group = NH / NKV;
  const AttentionShape gqa{B, T, NH, NKV, HS}, mha{B, T, NH, NH, HS};
  std::mt19937 rng(17);
  const Vec q = random_vec(gqa.q(), rng), k = random_vec(gqa.kv(), rng), v = random_vec(gqa.kv(), rng),
            dout = random_vec(gqa.q(), rng);
  // repeat_kv: query head h's copy of kv head h / group.
  Vec k_rep(mha.kv()), v_rep(mha.kv());
  for (int bt = 0; bt < B * T; ++bt) {
    for (int h = 0; h < NH; ++h) {
      for (int d = 0; d < HS; ++d) {
        const std::size_t to = static_cast<std::size_t>((bt * NH + h) * HS + d),
                          from = static_cast<std::size_t>((bt * NKV + h / group) * HS + d);
        k_rep[to] = k[from];
        v_rep[to] = v[from];
      }
    }
  }
  Vec out(gqa.q()), probs(gqa.probs()), out_rep(mha.q()), probs_rep(mha.probs());
  attention_forward(out.data(), probs.data(), q.data(), k.data(), v.data(), B, T, NH, NKV, HS, 0);
  attention_forward(out_rep.data(), probs_rep.data(), q.data(), k_rep.data(), v_rep.data(), B, T, NH, NH, HS, 0);
  for (std::size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], out_rep[i], 1e-6) << i;
  for (std::size_t i = 0; i < probs.size(); ++i) ASSERT_NEAR(probs[i], probs_rep[i], 1e-7) << i;

  Vec dq(gqa.q()), dk(gqa.kv()), dv(gqa.kv()), dq_rep(mha.q()), dk_rep(mha.kv()), dv_rep(mha.kv());
  attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), probs.data(), q.data(), k.data(), v.data(), B, T, NH,
                     NKV, HS, 0);
  attention_backward(dq_rep.data(), dk_rep.data(), dv_rep.data(), dout.data(), probs_rep.data(), q.data(), k_rep.data(),
                     v_rep.data(), B, T, NH, NH, HS, 0);
  for (std::size_t i = 0; i < dq.size(); ++i) ASSERT_NEAR(dq[i], dq_rep[i], 1e-5) << i;
  // A shared kv head's gradient is the sum of its copies'.
  for (int bt = 0; bt < B * T; ++bt) {
    for (int kvh = 0; kvh < NKV; ++kvh) {
      for (int d = 0; d < HS; ++d) {
        double sum_k = 0, sum_v = 0;
        for (int h = kvh * group; h < (kvh + 1) * group; ++h) {
          sum_k += dk_rep[(bt * NH + h) * HS + d];
          sum_v += dv_rep[(bt * NH + h) * HS + d];
        }
        const std::size_t i = static_cast<std::size_t>((bt * NKV + kvh) * HS + d);
        ASSERT_NEAR(dk[i], sum_k, 1e-5) << i;
        ASSERT_NEAR(dv[i], sum_v, 1e-5) << i;
      }
    }
  }
}

TEST(Attention, GradientsMatchFiniteDifferences) {
  // Grouped heads both ways (3 and 2 query heads per kv head), and 67 tokens to cross a row
  // block; sliding windows of 2 and (across the block edge) of 5 keys.
  for (const AttentionShape s : {AttentionShape{2, 5, 6, 2, 4}, AttentionShape{2, 5, 6, 3, 4},
                                 AttentionShape{1, 67, 2, 1, 4}, AttentionShape{2, 5, 6, 2, 4, 2},
                                 AttentionShape{1, 67, 2, 1, 4, 5}}) {
    const std::string shape =
        "T=" + std::to_string(s.T) + " NKV=" + std::to_string(s.NKV) + " window=" + std::to_string(s.window) + ": ";
    std::mt19937 rng(18);
    Vec q = random_vec(s.q(), rng, -2, 2), k = random_vec(s.kv(), rng, -2, 2), v = random_vec(s.kv(), rng),
        r = random_vec(s.q(), rng);
    const auto loss = [&] {
      Vec out(s.q()), probs(s.probs());
      attention_forward(out.data(), probs.data(), q.data(), k.data(), v.data(), s.B, s.T, s.NH, s.NKV, s.HS, s.window);
      return weighted_sum(r, out);
    };
    Vec out(s.q()), probs(s.probs());
    attention_forward(out.data(), probs.data(), q.data(), k.data(), v.data(), s.B, s.T, s.NH, s.NKV, s.HS, s.window);
    const auto grads = check_convention(shape + "attention_backward", {q.size(), k.size(), v.size()},
                                        [&](const std::vector<float*>& g) {
                                          attention_backward(g[0], g[1], g[2], r.data(), probs.data(), q.data(),
                                                             k.data(), v.data(), s.B, s.T, s.NH, s.NKV, s.HS, s.window);
                                        });
    expect_gradient(shape + "dq", q, grads[0], loss);
    expect_gradient(shape + "dk", k, grads[1], loss);
    expect_gradient(shape + "dv", v, grads[2], loss);
  }
}

// ---------------------------------------------------------------------------------------------
// Cross-entropy

TEST(CrossEntropy, KnownLosses) {
  const int V = 11;
  // Uniform logits, however large: log V. Then logits (0, log 3): -log(1/4) for target 0.
  Vec logits(3 * V, 0.0f);
  std::fill(logits.begin() + V, logits.begin() + 2 * V, 1000.0f);
  std::fill(logits.begin() + 2 * V, logits.end(), -1000.0f);
  const std::vector<int> targets = {0, 10, 5};
  Vec losses = unwritten(3);
  crossentropy_forward(losses.data(), logits.data(), targets.data(), 3, V);
  for (float loss : losses) EXPECT_NEAR(loss, std::log(11.0), 1e-6);

  const Vec two = {0.0f, static_cast<float>(std::log(3.0)), 0.0f, static_cast<float>(std::log(3.0))};
  const std::vector<int> first_then_second = {0, 1};
  Vec two_losses = unwritten(2);
  crossentropy_forward(two_losses.data(), two.data(), first_then_second.data(), 2, 2);
  EXPECT_NEAR(two_losses[0], std::log(4.0), 1e-6);
  EXPECT_NEAR(two_losses[1], std::log(4.0 / 3.0), 1e-6);

  // Far apart logits stay finite: the target 1e4 below the max costs 1e4.
  const Vec apart = {1e4f, 0.0f};
  const std::vector<int> low = {1};
  float loss = 0;
  crossentropy_forward(&loss, apart.data(), low.data(), 1, 2);
  EXPECT_NEAR(loss, 1e4, 1e-3);
}

// The fused loss is the two calls, bit for bit: the losses, and the gradient the backward
// adds into zeros, on random logits of an odd vocabulary.
TEST(CrossEntropy, ForwardBackwardIsTheTwoCallsBitwise) {
  const int N = 7, V = 1001;
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 4.0f);
  Vec logits(static_cast<size_t>(N) * V);
  for (float& x : logits) x = normal(rng);
  std::vector<int> targets(N);
  for (int n = 0; n < N; ++n) targets[static_cast<size_t>(n)] = (n * 137) % V;
  Vec losses(N), grads(logits.size(), 0.0f), fused_losses = unwritten(N), fused_grads = unwritten(logits.size());
  crossentropy_forward(losses.data(), logits.data(), targets.data(), N, V);
  crossentropy_backward(grads.data(), logits.data(), targets.data(), 0.25f, N, V);
  crossentropy_forward_backward(fused_losses.data(), fused_grads.data(), logits.data(), targets.data(), 0.25f, N, V);
  EXPECT_EQ(fused_losses, losses);
  EXPECT_EQ(fused_grads, grads);
}

TEST(CrossEntropy, GradientRowsSumToZero) {
  const int N = 5, V = 11;
  std::mt19937 rng(19);
  const Vec logits = random_vec(N * V, rng, -5, 5);
  const std::vector<int> targets = {0, 10, 3, 3, 7};
  Vec dlogits(N * V, 0.0f);
  crossentropy_backward(dlogits.data(), logits.data(), targets.data(), 1.0f, N, V);
  for (int n = 0; n < N; ++n) {
    double sum = 0;
    for (int i = 0; i < V; ++i) sum += dlogits[n * V + i];
    EXPECT_NEAR(sum, 0.0, 1e-6) << "row " << n;
    EXPECT_LT(dlogits[n * V + targets[n]], 0.0f);
  }
  // Uniform logits: 1/V everywhere but the target, 1/V - 1 there.
  const Vec uniform(V, 3.0f);
  Vec duniform(V, 0.0f);
  crossentropy_backward(duniform.data(), uniform.data(), targets.data(), 1.0f, 1, V);
  for (int i = 0; i < V; ++i) EXPECT_NEAR(duniform[i], 1.0 / V - (i == 0 ? 1 : 0), 1e-7);
}

TEST(CrossEntropy, GradientMatchesFiniteDifferences) {
  const int N = 5, V = 11;
  const float dloss = 1.0f / N;  // the mean over the batch's tokens
  std::mt19937 rng(20);
  Vec logits = random_vec(N * V, rng, -3, 3);
  const std::vector<int> targets = {2, 0, 10, 2, 6};
  const auto loss = [&] {
    Vec losses(N);
    crossentropy_forward(losses.data(), logits.data(), targets.data(), N, V);
    return weighted_sum(Vec(N, dloss), losses);
  };
  const auto grads = check_convention("crossentropy_backward", {logits.size()}, [&](const std::vector<float*>& g) {
    crossentropy_backward(g[0], logits.data(), targets.data(), dloss, N, V);
  });
  expect_gradient("dlogits", logits, grads[0], loss);
}

// ---------------------------------------------------------------------------------------------
// AdamW

// Megatron's vocabulary-parallel pieces, split at every point of the vocabulary, against the
// whole-vocabulary kernels.
TEST(VocabParallel, RanksAddUpToTheWholeEmbedding) {
  const int N = 7, T = 3, C = 5, V = 11;
  std::mt19937 rng(4);
  const Vec wte = random_vec(V * C, rng), wpe = random_vec(T * C, rng), dy = random_vec(N * C, rng);
  const std::vector<int> tokens = {3, 0, 10, 3, 7, 5, 3};
  Vec want(N * C), want_dwte(V * C, 0.0f), want_dwpe(T * C, 0.0f);
  embedding_forward(want.data(), tokens.data(), wte.data(), wpe.data(), N, T, C);
  embedding_backward(want_dwte.data(), want_dwpe.data(), dy.data(), tokens.data(), N, T, C);
  for (int cut = 1; cut < V; ++cut) {
    Vec y0(N * C), y1(N * C), dwte(V * C, 0.0f), dwpe(T * C, 0.0f);
    vocab_embedding_forward(y0.data(), tokens.data(), wte.data(), 0, cut, wpe.data(), N, T, C);
    vocab_embedding_forward(y1.data(), tokens.data(), wte.data() + cut * C, cut, V - cut, nullptr, N, T, C);
    vocab_embedding_backward(dwte.data(), dwpe.data(), dy.data(), tokens.data(), 0, cut, N, T, C);
    vocab_embedding_backward(dwte.data() + cut * C, nullptr, dy.data(), tokens.data(), cut, V - cut, N, T, C);
    for (int i = 0; i < N * C; ++i) EXPECT_EQ(y0[i] + y1[i], want[i]) << "cut " << cut << " at " << i;
    EXPECT_EQ(dwte, want_dwte) << "cut " << cut;
    EXPECT_EQ(dwpe, want_dwpe) << "cut " << cut;
  }
}

TEST(VocabParallel, RanksGiveTheWholeLossAndGradient) {
  const int N = 6, V = 13;
  std::mt19937 rng(5);
  const Vec logits = random_vec(N * V, rng, -4, 4);
  const std::vector<int> targets = {0, 12, 5, 6, 7, 1};
  Vec losses(N), want(N * V);
  crossentropy_forward_backward(losses.data(), want.data(), logits.data(), targets.data(), 0.25f, N, V);
  for (const int cut : {1, 6, 7, 12}) {
    const int V1 = V - cut;
    // Each rank's logits as its own [N, V_r] array.
    Vec l0(N * cut), l1(N * V1);
    for (int n = 0; n < N; ++n) {
      for (int v = 0; v < V; ++v) (v < cut ? l0[n * cut + v] : l1[n * V1 + v - cut]) = logits[n * V + v];
    }
    Vec m0(N), m1(N), s0(2 * N), s1(2 * N), max(N), sums(2 * N), d0(N * cut), d1(N * V1);
    logits_row_max(m0.data(), l0.data(), N, cut);
    logits_row_max(m1.data(), l1.data(), N, V1);
    for (int n = 0; n < N; ++n) max[n] = std::max(m0[n], m1[n]);  // the all-reduce
    logits_exp_sums(s0.data(), l0.data(), max.data(), targets.data(), 0, N, cut);
    logits_exp_sums(s1.data(), l1.data(), max.data(), targets.data(), cut, N, V1);
    for (int i = 0; i < 2 * N; ++i) sums[i] = s0[i] + s1[i];
    std::vector<double> r0(N), r1(N);
    vocab_crossentropy_backward(d0.data(), r0.data(), l0.data(), max.data(), sums.data(), targets.data(), 0, 0.25f, N,
                                cut);
    vocab_crossentropy_backward(d1.data(), r1.data(), l1.data(), max.data(), sums.data(), targets.data(), cut, 0.25f,
                                N, V1);
    for (int n = 0; n < N; ++n) {
      EXPECT_EQ(r0[n], r1[n]) << "both ranks compute each row's loss";
      EXPECT_NEAR(r0[n], losses[n], 1e-5 * losses[n]) << "cut " << cut << " row " << n;
      for (int v = 0; v < V; ++v) {
        const float got = v < cut ? d0[n * cut + v] : d1[n * V1 + v - cut];
        EXPECT_NEAR(got, want[n * V + v], 1e-6) << "cut " << cut << " row " << n << " logit " << v;
      }
    }
  }
}

TEST(AdamW, FirstStepMovesEachParameterByAboutLr) {
  // Step 1 from m = v = 0: the bias corrections give m_hat = g and sqrt(v_hat) = |g|, so
  // p -= lr g / (|g| + eps), about lr * sign(g).
  const long n = 9;
  const float lr = 1e-3f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f;
  std::mt19937 rng(21);
  Vec p = random_vec(n, rng), g = random_vec(n, rng), m(n, 0.0f), v(n, 0.0f);
  g[0] = 1e-9f;  // a gradient near eps moves its parameter by less
  const Vec p0 = p;
  adamw_update(p.data(), g.data(), m.data(), v.data(), n, lr, b1, b2, eps, 0.0f, 1);
  for (long i = 0; i < n; ++i) {
    const double gi = g[i];
    EXPECT_NEAR(p[i], p0[i] - lr * gi / (std::fabs(gi) + eps), 1e-7) << i;
    EXPECT_NEAR(m[i], (1 - b1) * gi, 1e-7 * std::fabs(gi));
    EXPECT_NEAR(v[i], (1 - b2) * gi * gi, 1e-7 * gi * gi);
  }
}

TEST(AdamW, ConstantGradientMovesByLrEveryStep) {
  // With g constant, m_t = (1 - b1^t) g and v_t = (1 - b2^t) g^2: the bias corrections undo
  // exactly the zero start, and every step moves p by lr g / (|g| + eps).
  const long n = 4;
  const float lr = 1e-2f, eps = 1e-8f;
  const Vec g = {0.5f, -2.0f, 1e-3f, -7.0f};
  Vec p = {1, 1, 1, 1}, m(n, 0.0f), v(n, 0.0f);
  for (int step = 1; step <= 10; ++step)
    adamw_update(p.data(), g.data(), m.data(), v.data(), n, lr, 0.9f, 0.999f, eps, 0.0f, step);
  for (long i = 0; i < n; ++i) {
    const double gi = g[i];
    EXPECT_NEAR(p[i], 1 - 10 * lr * gi / (std::fabs(gi) + eps), 1e-6) << i;
  }
}

TEST(AdamW, WeightDecayShrinksParameters) {
  // No gradient: m and v stay 0 and the only change is p -= lr * wd * p.
  const long n = 5;
  const float lr = 0.1f, wd = 0.5f;
  const Vec p0 = {1, -2, 0.25, 0, 8};
  Vec p = p0, g(n, 0.0f), m(n, 0.0f), v(n, 0.0f);
  adamw_update(p.data(), g.data(), m.data(), v.data(), n, lr, 0.9f, 0.999f, 1e-8f, wd, 1);
  for (long i = 0; i < n; ++i) {
    EXPECT_NEAR(p[i], p0[i] * (1 - 0.1 * 0.5), 1e-7) << i;
    EXPECT_EQ(m[i], 0.0f);
    EXPECT_EQ(v[i], 0.0f);
  }
}

// ---------------------------------------------------------------------------------------------
// Determinism: every kernel, twice on the same inputs, bitwise the same outputs.

TEST(TransformerKernels, RepeatCallsAreBitwiseEqual) {
  const auto run = [] {
    std::mt19937 rng(22);
    std::vector<Vec> outputs;
    const auto keep = [&](const Vec& v) { outputs.push_back(v); };
    const int N = 33, C = 65, OC = 17, V = 50, T = 11;
    const Vec x = random_vec(N * C, rng), w = random_vec(OC * C, rng), b = random_vec(OC, rng),
              dy = random_vec(N * OC, rng), dc = random_vec(N * C, rng), lnw = random_vec(C, rng),
              lnb = random_vec(C, rng);
    Vec y(N * OC), dx(N * C, 0.0f), dw(OC * C, 0.0f), db(OC, 0.0f);
    linear_forward(y.data(), x.data(), w.data(), b.data(), N, C, OC);
    linear_backward_input(dx.data(), dy.data(), w.data(), N, C, OC);
    linear_backward_weight(dw.data(), db.data(), dy.data(), x.data(), N, C, OC);
    keep(y), keep(dx), keep(dw), keep(db);

    std::vector<int> tokens(N);
    for (int n = 0; n < N; ++n) tokens[n] = (n * 7) % V;
    const Vec wte = random_vec(V * C, rng), wpe = random_vec(T * C, rng);
    Vec emb(N * C), dwte(V * C, 0.0f), dwpe(T * C, 0.0f);
    embedding_forward(emb.data(), tokens.data(), wte.data(), wpe.data(), N, T, C);
    embedding_backward(dwte.data(), dwpe.data(), dc.data(), tokens.data(), N, T, C);
    keep(emb), keep(dwte), keep(dwpe);

    Vec ln(N * C), mean(N), rstd(N), dln(N * C, 0.0f), dlnw(C, 0.0f), dlnb(C, 0.0f);
    layernorm_forward(ln.data(), mean.data(), rstd.data(), x.data(), lnw.data(), lnb.data(), N, C, 1e-5f);
    layernorm_backward(dln.data(), dlnw.data(), dlnb.data(), dc.data(), x.data(), lnw.data(), mean.data(), rstd.data(),
                       N, C);
    keep(ln), keep(mean), keep(rstd), keep(dln), keep(dlnw), keep(dlnb);
    Vec rms(N * C), rrstd(N), drms(N * C, 0.0f), drmsw(C, 0.0f);
    rmsnorm_forward(rms.data(), rrstd.data(), x.data(), lnw.data(), N, C, 1e-5f);
    rmsnorm_backward(drms.data(), drmsw.data(), dc.data(), x.data(), lnw.data(), rrstd.data(), N, C);
    keep(rms), keep(rrstd), keep(drms), keep(drmsw);

    const long n = N * C;
    Vec act(n), dact(n, 0.0f), dup(n, 0.0f), sw(n), dgate(n, 0.0f);
    gelu_forward(act.data(), x.data(), n);
    gelu_backward(dact.data(), dc.data(), x.data(), n);
    swiglu_forward(sw.data(), x.data(), emb.data(), n);
    swiglu_backward(dgate.data(), dup.data(), dc.data(), x.data(), emb.data(), n);
    keep(act), keep(dact), keep(sw), keep(dgate), keep(dup);

    const AttentionShape s{2, 150, 4, 2, 16};
    Vec q = random_vec(s.q(), rng), k = random_vec(s.kv(), rng);
    const Vec v = random_vec(s.kv(), rng), dout = random_vec(s.q(), rng);
    rope_forward(q.data(), s.B * s.T, s.T, s.NH, s.HS, RopeFrequencies{10000});
    rope_forward(k.data(), s.B * s.T, s.T, s.NKV, s.HS, RopeFrequencies{10000});
    Vec out(s.q()), probs(s.probs()), dq(s.q(), 0.0f), dk(s.kv(), 0.0f), dv(s.kv(), 0.0f);
    attention_forward(out.data(), probs.data(), q.data(), k.data(), v.data(), s.B, s.T, s.NH, s.NKV, s.HS, s.window);
    attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), probs.data(), q.data(), k.data(), v.data(), s.B,
                       s.T, s.NH, s.NKV, s.HS, s.window);
    rope_backward(dq.data(), s.B * s.T, s.T, s.NH, s.HS, RopeFrequencies{10000});
    keep(q), keep(k), keep(out), keep(probs), keep(dq), keep(dk), keep(dv);

    Vec losses(N), dlogits(N * C, 0.0f);
    crossentropy_forward(losses.data(), x.data(), tokens.data(), N, C);
    crossentropy_backward(dlogits.data(), x.data(), tokens.data(), 1.0f / N, N, C);
    keep(losses), keep(dlogits);

    Vec p = w, mom(w.size(), 0.0f), var(w.size(), 0.0f);
    for (int step = 1; step <= 3; ++step) {
      adamw_update(p.data(), dw.data(), mom.data(), var.data(), static_cast<long>(p.size()), 1e-3f, 0.9f, 0.95f, 1e-8f,
                   0.1f, step);
    }
    keep(p), keep(mom), keep(var);
    return outputs;
  };
  const std::vector<Vec> first = run(), second = run();
  ASSERT_EQ(first.size(), second.size());
  for (std::size_t i = 0; i < first.size(); ++i) EXPECT_TRUE(bitwise_equal(first[i], second[i])) << "output " << i;
}

}  // namespace
