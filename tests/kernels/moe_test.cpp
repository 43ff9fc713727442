// The Mixture-of-Experts reference kernels against oracles: the router's softmax and top-k
// against their definitions (ties to the lower index, weights renormalised or not), the
// sigmoid router's biased, group-limited choice against DeepSeek-V3's routing written out, every
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

// DeepSeek-V3's routing written out directly: each group's two best biased scores, the
// groups_chosen best groups (ties to the lower group), then the K best biased scores in them.
Ints deepseek_choice(const Vec& s, const Vec& bias, int E, int K, int groups, int groups_chosen) {
  const int size = E / groups;
  std::vector<std::pair<double, int>> group;
  for (int g = 0; g < groups; ++g) {
    std::vector<double> b;
    for (int e = g * size; e < (g + 1) * size; ++e) b.push_back(static_cast<double>(s[size_t(e)]) + bias[size_t(e)]);
    std::sort(b.rbegin(), b.rend());
    group.emplace_back(-(b[0] + (size > 1 ? b[1] : 0.0)), g);
  }
  std::sort(group.begin(), group.end());
  std::vector<std::pair<double, int>> ranked;
  for (int j = 0; j < groups_chosen; ++j) {
    const int g = group[size_t(j)].second;
    for (int e = g * size; e < (g + 1) * size; ++e) ranked.emplace_back(-(static_cast<double>(s[size_t(e)]) + bias[size_t(e)]), e);
  }
  std::sort(ranked.begin(), ranked.end());
  Ints chosen;
  for (int k = 0; k < K; ++k) chosen.push_back(ranked[size_t(k)].second);
  return chosen;
}

TEST(MoeSigmoidRouter, ChoosesByBiasedScoresInTheBestGroupsAndWeighsUnbiased) {
  std::mt19937 rng(4);
  const int N = 13, E = 12, K = 3;
  for (const auto& [groups, chosen_groups] : {std::pair{1, 1}, {4, 2}, {6, 3}, {12, 5}}) {
    for (const int normalize : {0, 1}) {
      const Vec z = random_vec(size_t(N) * E, rng, -2, 2), bias = random_vec(size_t(E), rng, -0.3f, 0.3f);
      Vec scores = unwritten(z.size()), weights = unwritten(size_t(N) * K);
      Ints experts(weights.size(), -1);
      moe_sigmoid_router_forward(scores.data(), weights.data(), experts.data(), z.data(), bias.data(), N, E, K, groups,
                                 chosen_groups, normalize, 2.5f);
      for (int n = 0; n < N; ++n) {
        const Vec s(scores.begin() + n * E, scores.begin() + (n + 1) * E);
        for (int e = 0; e < E; ++e) EXPECT_NEAR(s[size_t(e)], 1 / (1 + std::exp(-double(z[size_t(n * E + e)]))), 1e-7);
        const Ints want = deepseek_choice(s, bias, E, K, groups, chosen_groups);
        double sum = 0;
        for (const int e : want) sum += s[size_t(e)];
        for (int k = 0; k < K; ++k) {
          EXPECT_EQ(experts[size_t(n * K + k)], want[size_t(k)]) << "groups " << groups << " row " << n << " choice " << k;
          const double w = s[size_t(want[size_t(k)])] * 2.5 / (normalize ? sum : 1.0);
          EXPECT_NEAR(weights[size_t(n * K + k)], w, 1e-6) << "row " << n << " choice " << k;
        }
      }
    }
  }
}

TEST(MoeSigmoidRouter, TheBiasChoosesAndTheScoresWeigh) {
  // Expert 0 scores highest; a bias of -1 sends the token to experts 1 and 2, weighed by
  // their own scores alone; without the bias the choice is 0 and 1.
  const Vec z{3.0f, 1.0f, 0.5f, -2.0f}, bias{-1.0f, 0.0f, 0.0f, 0.0f};
  Vec scores(4), weights(2);
  Ints experts(2);
  moe_sigmoid_router_forward(scores.data(), weights.data(), experts.data(), z.data(), bias.data(), 1, 4, 2, 1, 1, 1, 1.0f);
  EXPECT_EQ(experts, (Ints{1, 2}));
  EXPECT_NEAR(weights[0], scores[1] / (scores[1] + scores[2]), 1e-7);
  moe_sigmoid_router_forward(scores.data(), weights.data(), experts.data(), z.data(), nullptr, 1, 4, 2, 1, 1, 1, 1.0f);
  EXPECT_EQ(experts, (Ints{0, 1}));
}

TEST(MoeSigmoidRouter, GradientMatchesFiniteDifferences) {
  std::mt19937 rng(5);
  const int N = 6, E = 8, K = 3;
  for (const int normalize : {0, 1}) {
    Vec z = spaced_logits(N, E, rng);
    const Vec rw = random_vec(size_t(N) * K, rng), aux = random_vec(size_t(E), rng);
    const Vec bias = random_vec(size_t(E), rng, -0.01f, 0.01f);
    Vec scores(z.size()), weights(rw.size());
    Ints experts(rw.size());
    const auto route = [&](Vec& s, Vec& w, Ints& chosen) {
      moe_sigmoid_router_forward(s.data(), w.data(), chosen.data(), z.data(), bias.data(), N, E, K, 4, 2, normalize,
                                 1.5f);
    };
    route(scores, weights, experts);
    // L = sum(rw . weights) + sum over rows of aux . (s / sum s): dweights = rw, dprobs = aux.
    const auto loss = [&] {
      Vec s(z.size()), w(rw.size());
      Ints chosen(rw.size());
      route(s, w, chosen);
      EXPECT_EQ(chosen, experts) << "a step changed the choice";
      double l = weighted_sum(rw, w);
      for (int n = 0; n < N; ++n) {
        double total = 0;
        for (int e = 0; e < E; ++e) total += s[size_t(n * E + e)];
        for (int e = 0; e < E; ++e) l += double(aux[size_t(e)]) * s[size_t(n * E + e)] / total;
      }
      return l;
    };
    const std::vector<Vec> g = check_convention("sigmoid router backward", {z.size()}, [&](const std::vector<float*>& d) {
      moe_sigmoid_router_backward(d[0], rw.data(), aux.data(), scores.data(), experts.data(), N, E, K, normalize, 1.5f);
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
