// The Mixture-of-Experts reference kernels against oracles: the router's softmax and top-k
// against their definitions (ties to the lower index, weights renormalised or not), every
// backward against central finite differences of its forward, the permutation's backward as
// its adjoint (<P x, r> = <x, P^T r> exactly), and the op-table conventions (backwards add,
// nullptr gradients skipped, forwards write every output).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/transformer.hpp"
#include "tests/kernels/gradient_check.hpp"

using namespace hetflow::kernels;
using namespace hetflow::test_support;

namespace {

using Ints = std::vector<int>;

// Router logits whose sorted values are at least 0.2 apart in every row, so that a finite
// difference's step (at most 0.06 here) never changes which experts are chosen.
Vec spaced_logits(int N, int E, std::mt19937& rng) {
  Vec z(static_cast<size_t>(N) * E);
  Ints order(static_cast<size_t>(E));
  std::uniform_real_distribution<float> jitter(-0.05f, 0.05f);
  for (int n = 0; n < N; ++n) {
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    for (int e = 0; e < E; ++e) z[static_cast<size_t>(n * E + e)] = 0.3f * order[static_cast<size_t>(e)] - 1 + jitter(rng);
  }
  return z;
}

// The copies' order as the decoder builds it: expert by expert, tokens in order.
void order_copies(const Ints& experts, int N, int K, int E, Ints& rows, Ints& slots) {
  rows.assign(static_cast<size_t>(N) * K, 0);
  slots.assign(rows.size(), 0);
  int m = 0;
  for (int e = 0; e < E; ++e) {
    for (int i = 0; i < N * K; ++i) {
      if (experts[static_cast<size_t>(i)] != e) continue;
      rows[static_cast<size_t>(m)] = i / K;
      slots[static_cast<size_t>(i)] = m++;
    }
  }
}

TEST(MoeRouter, ChoosesTheLargestProbabilitiesLargestFirst) {
  std::mt19937 rng(1);
  const int N = 9, E = 7, K = 3;
  for (const int normalize : {0, 1}) {
    const Vec z = random_vec(static_cast<size_t>(N) * E, rng, -2, 2);
    Vec probs = unwritten(z.size()), weights = unwritten(static_cast<size_t>(N) * K);
    Ints experts(weights.size(), -1);
    moe_router_forward(probs.data(), weights.data(), experts.data(), z.data(), N, E, K, normalize);
    for (int n = 0; n < N; ++n) {
      double sum = 0, top = 0;
      for (int e = 0; e < E; ++e) sum += std::exp(static_cast<double>(z[static_cast<size_t>(n * E + e)]));
      std::vector<std::pair<float, int>> ranked;
      for (int e = 0; e < E; ++e) {
        const double p = std::exp(static_cast<double>(z[static_cast<size_t>(n * E + e)])) / sum;
        EXPECT_NEAR(probs[static_cast<size_t>(n * E + e)], p, 1e-6) << "row " << n;
        ranked.emplace_back(-probs[static_cast<size_t>(n * E + e)], e);
      }
      std::sort(ranked.begin(), ranked.end());
      for (int k = 0; k < K; ++k) top += -ranked[static_cast<size_t>(k)].first;
      for (int k = 0; k < K; ++k) {
        const size_t i = static_cast<size_t>(n * K + k);
        EXPECT_EQ(experts[i], ranked[static_cast<size_t>(k)].second) << "row " << n << " choice " << k;
        const double p = -ranked[static_cast<size_t>(k)].first;
        EXPECT_NEAR(weights[i], normalize ? p / top : p, 1e-6) << "row " << n << " choice " << k;
      }
    }
  }
}

TEST(MoeRouter, ATieGoesToTheLowerExpert) {
  const Vec z{0.5f, 2.0f, 0.5f, 2.0f, -1.0f};
  Vec probs(5), weights(3);
  Ints experts(3);
  moe_router_forward(probs.data(), weights.data(), experts.data(), z.data(), 1, 5, 3, 1);
  EXPECT_EQ(experts, (Ints{1, 3, 0}));
  EXPECT_EQ(weights[0], weights[1]);
  EXPECT_NEAR(weights[0] + weights[1] + weights[2], 1.0, 1e-6);
}

TEST(MoeRouter, GradientMatchesFiniteDifferences) {
  std::mt19937 rng(2);
  const int N = 6, E = 5, K = 2;
  for (const int normalize : {0, 1}) {
    Vec z = spaced_logits(N, E, rng);
    const Vec rw = random_vec(static_cast<size_t>(N) * K, rng), aux = random_vec(static_cast<size_t>(E), rng);
    Vec probs(z.size()), weights(rw.size());
    Ints experts(rw.size());
    moe_router_forward(probs.data(), weights.data(), experts.data(), z.data(), N, E, K, normalize);
    // L = sum(rw . weights) + sum over rows of aux . probs: dweights = rw, dprobs = aux.
    const auto loss = [&] {
      Vec p(z.size()), w(rw.size());
      Ints chosen(rw.size());
      moe_router_forward(p.data(), w.data(), chosen.data(), z.data(), N, E, K, normalize);
      EXPECT_EQ(chosen, experts) << "a step changed the choice";
      double l = weighted_sum(rw, w);
      for (int n = 0; n < N; ++n) {
        for (int e = 0; e < E; ++e) l += static_cast<double>(aux[static_cast<size_t>(e)]) * p[static_cast<size_t>(n * E + e)];
      }
      return l;
    };
    const std::vector<Vec> g = check_convention("router backward", {z.size()}, [&](const std::vector<float*>& d) {
      moe_router_backward(d[0], rw.data(), aux.data(), probs.data(), weights.data(), experts.data(), N, E, K, normalize);
    });
    expect_gradient(normalize ? "dlogits (renormalised)" : "dlogits", z, g[0], loss);
  }
}

TEST(MoePermute, BackwardIsTheAdjoint) {
  std::mt19937 rng(3);
  const int N = 11, E = 4, K = 2, C = 5;
  Vec probs(static_cast<size_t>(N) * E), weights(static_cast<size_t>(N) * K);
  Ints experts(weights.size()), rows, slots;
  const Vec z = random_vec(probs.size(), rng);
  moe_router_forward(probs.data(), weights.data(), experts.data(), z.data(), N, E, K, 1);
  order_copies(experts, N, K, E, rows, slots);
  const int M = N * K;
  const Vec x = random_vec(static_cast<size_t>(N) * C, rng), r = random_vec(static_cast<size_t>(M) * C, rng);
  Vec y = unwritten(r.size());
  moe_permute(y.data(), x.data(), rows.data(), M, C);
  const std::vector<Vec> g = check_convention("permute backward", {x.size()}, [&](const std::vector<float*>& d) {
    moe_permute_backward(d[0], r.data(), slots.data(), N, K, C);
  });
  EXPECT_NEAR(weighted_sum(r, y), weighted_sum(x, g[0]), 1e-5);
  for (int m = 0; m < M; ++m) {  // each copy is its token's row
    for (int c = 0; c < C; ++c) EXPECT_EQ(y[static_cast<size_t>(m * C + c)], x[static_cast<size_t>(rows[static_cast<size_t>(m)] * C + c)]);
  }
}

TEST(MoeCombine, WeighsEachTokensCopiesAndSkipsDroppedOnes) {
  const int N = 2, K = 2, C = 3;
  const Vec x{1, 2, 3, 10, 20, 30, 100, 200, 300};  // three copies
  const Ints slots{2, 0, -1, 1};                     // token 1's first choice was dropped
  const Vec weights{0.25f, 0.75f, 0.5f, 0.5f};
  Vec y = unwritten(static_cast<size_t>(N) * C);
  moe_combine(y.data(), x.data(), slots.data(), weights.data(), N, K, C);
  EXPECT_EQ(y, (Vec{25.75f, 51.5f, 77.25f, 5, 10, 15}));
}

TEST(MoeCombine, GradientsMatchFiniteDifferences) {
  std::mt19937 rng(4);
  const int N = 5, K = 3, C = 4, M = N * K;
  Ints slots(static_cast<size_t>(M));
  std::iota(slots.begin(), slots.end(), 0);
  std::shuffle(slots.begin(), slots.end(), rng);
  slots[4] = -1;  // a dropped copy: no gradient reaches or leaves it
  Vec x = random_vec(static_cast<size_t>(M) * C, rng), weights = random_vec(static_cast<size_t>(M), rng);
  const Vec r = random_vec(static_cast<size_t>(N) * C, rng);
  const auto loss = [&] {
    Vec y(r.size());
    moe_combine(y.data(), x.data(), slots.data(), weights.data(), N, K, C);
    return weighted_sum(r, y);
  };
  const std::vector<Vec> g = check_convention("combine backward", {x.size(), weights.size()}, [&](const std::vector<float*>& d) {
    moe_combine_backward(d[0], d[1], r.data(), x.data(), slots.data(), weights.data(), N, K, C);
  });
  expect_gradient("dx", x, g[0], loss);
  expect_gradient("dweights", weights, g[1], loss);
  EXPECT_EQ(g[1][4], 0.0f);
}

TEST(MoeGatedAdd, GradientsMatchFiniteDifferences) {
  std::mt19937 rng(5);
  const int N = 4, C = 6;
  Vec x = random_vec(static_cast<size_t>(N) * C, rng), gate = random_vec(static_cast<size_t>(N), rng, -3, 3);
  const Vec base = random_vec(x.size(), rng), r = random_vec(x.size(), rng);
  Vec y = base;
  gated_add(y.data(), x.data(), gate.data(), N, C);
  for (int n = 0; n < N; ++n) {
    const float s = 1 / (1 + std::exp(-gate[static_cast<size_t>(n)]));
    for (int c = 0; c < C; ++c) {
      const size_t i = static_cast<size_t>(n * C + c);
      EXPECT_NEAR(y[i], base[i] + s * x[i], 1e-6);
    }
  }
  const auto loss = [&] {
    Vec out(x.size(), 0.0f);
    gated_add(out.data(), x.data(), gate.data(), N, C);
    return weighted_sum(r, out);
  };
  const std::vector<Vec> g = check_convention("gated add backward", {x.size(), gate.size()}, [&](const std::vector<float*>& d) {
    gated_add_backward(d[0], d[1], r.data(), x.data(), gate.data(), N, C);
  });
  expect_gradient("dx", x, g[0], loss);
  expect_gradient("dgate", gate, g[1], loss);
}

}  // namespace
