// The Mixture-of-Experts kernels of transformer.hpp (decoder_ops.def documents each): the
// routers (the softmax and top-k; DeepSeek-V3's sigmoid, bias and group-limited top-k) with
// their backwards, the permutation of token copies into runs by expert and its backward, the
// weighted combine and its backward, and Qwen2-MoE's gated add.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

#include "kernels/transformer.hpp"

namespace hetflow::kernels {

namespace {

std::size_t at(long row, long width) { return static_cast<std::size_t>(row) * static_cast<std::size_t>(width); }

float sigmoid(float g) { return 1.0f / (1.0f + std::exp(-g)); }

}  // namespace

void moe_router_forward(float* probs, float* weights, int* experts, const float* logits, int N, int E, int K,
                        int normalize) {
  std::vector<char> taken(static_cast<std::size_t>(E));
  for (int n = 0; n < N; ++n) {
    const float* z = logits + at(n, E);
    float* p = probs + at(n, E);
    float top = z[0];
    for (int e = 1; e < E; ++e) top = std::fmax(top, z[e]);
    double sum = 0;
    for (int e = 0; e < E; ++e) sum += std::exp(static_cast<double>(z[e] - top));
    for (int e = 0; e < E; ++e) p[e] = static_cast<float>(std::exp(static_cast<double>(z[e] - top)) / sum);
    std::fill(taken.begin(), taken.end(), 0);
    int* chosen = experts + at(n, K);
    float* w = weights + at(n, K);
    double kept = 0;
    for (int k = 0; k < K; ++k) {
      int best = -1;
      for (int e = 0; e < E; ++e) {  // strictly larger: a tie goes to the lower index
        if (!taken[static_cast<std::size_t>(e)] && (best < 0 || p[e] > p[best])) best = e;
      }
      taken[static_cast<std::size_t>(best)] = 1;
      chosen[k] = best;
      w[k] = p[best];
      kept += p[best];
    }
    if (normalize != 0) {
      for (int k = 0; k < K; ++k) w[k] = static_cast<float>(w[k] / kept);
    }
  }
}

void moe_router_backward(float* dlogits, const float* dweights, const float* dprobs, const float* probs,
                         const float* weights, const int* experts, int N, int E, int K, int normalize) {
  if (dlogits == nullptr) return;
  std::vector<double> dp(static_cast<std::size_t>(E));
  for (int n = 0; n < N; ++n) {
    const float* p = probs + at(n, E);
    const int* chosen = experts + at(n, K);
    const float* w = weights + at(n, K);
    const float* dw = dweights + at(n, K);
    for (int e = 0; e < E; ++e) dp[static_cast<std::size_t>(e)] = dprobs != nullptr ? dprobs[e] : 0.0;
    // w_k = p_k / s with s the chosen probabilities' sum: dp_k = (dw_k - sum_j dw_j w_j) / s.
    double kept = 0, dot = 0;
    for (int k = 0; k < K; ++k) {
      kept += p[chosen[k]];
      dot += static_cast<double>(dw[k]) * w[k];
    }
    for (int k = 0; k < K; ++k) {
      dp[static_cast<std::size_t>(chosen[k])] += normalize != 0 ? (dw[k] - dot) / kept : dw[k];
    }
    // The softmax's: dz_e = p_e (dp_e - sum_j p_j dp_j).
    double mean = 0;
    for (int e = 0; e < E; ++e) mean += p[e] * dp[static_cast<std::size_t>(e)];
    float* dz = dlogits + at(n, E);
    for (int e = 0; e < E; ++e) dz[e] += static_cast<float>(p[e] * (dp[static_cast<std::size_t>(e)] - mean));
  }
}

namespace {

// The sigmoid router's choice for one row (moe_sigmoid_router_forward): `biased` the row's
// scores plus their bias; fills chosen[K]. `allowed` (E) and `group` (groups) are scratch.
void choose_in_groups(const std::vector<double>& biased, int E, int K, int groups, int groups_chosen, int* chosen,
                      std::vector<char>& allowed, std::vector<double>& group) {
  const int size = E / groups;
  std::fill(allowed.begin(), allowed.end(), 1);
  if (groups_chosen < groups) {
    // A group's score: its two best biased scores' sum (its one, in groups of one expert).
    for (int g = 0; g < groups; ++g) {
      const double* b = biased.data() + at(g, size);
      int first = 0;
      for (int e = 1; e < size; ++e) first = b[e] > b[first] ? e : first;
      int second = -1;
      for (int e = 0; e < size; ++e) {
        if (e != first && (second < 0 || b[e] > b[second])) second = e;
      }
      group[static_cast<std::size_t>(g)] = b[first] + (second >= 0 ? b[second] : 0.0);
    }
    for (int g = 0; g < groups; ++g) {  // kept: fewer than groups_chosen groups rank above it
      int above = 0;
      for (int h = 0; h < groups; ++h) {
        const double x = group[static_cast<std::size_t>(h)], y = group[static_cast<std::size_t>(g)];
        above += x > y || (x == y && h < g);
      }
      if (above >= groups_chosen) std::fill_n(allowed.begin() + static_cast<std::ptrdiff_t>(at(g, size)), size, 0);
    }
  }
  for (int k = 0; k < K; ++k) {
    int best = -1;
    for (int e = 0; e < E; ++e) {  // strictly larger: a tie goes to the lower index
      const auto i = static_cast<std::size_t>(e);
      if (allowed[i] && (best < 0 || biased[i] > biased[static_cast<std::size_t>(best)])) best = e;
    }
    allowed[static_cast<std::size_t>(best)] = 0;
    chosen[k] = best;
  }
}

}  // namespace

void moe_sigmoid_router_forward(float* scores, float* weights, int* experts, const float* logits, const float* bias,
                                int N, int E, int K, int groups, int groups_chosen, int normalize, float scale) {
  std::vector<double> biased(static_cast<std::size_t>(E));
  std::vector<char> allowed(static_cast<std::size_t>(E));
  std::vector<double> group(static_cast<std::size_t>(groups));
  for (int n = 0; n < N; ++n) {
    const float* z = logits + at(n, E);
    float* s = scores + at(n, E);
    for (int e = 0; e < E; ++e) {
      s[e] = static_cast<float>(1.0 / (1.0 + std::exp(-static_cast<double>(z[e]))));
      biased[static_cast<std::size_t>(e)] = static_cast<double>(s[e]) + (bias != nullptr ? bias[e] : 0.0f);
    }
    int* chosen = experts + at(n, K);
    choose_in_groups(biased, E, K, groups, groups_chosen, chosen, allowed, group);
    float* w = weights + at(n, K);
    double kept = 0;
    for (int k = 0; k < K; ++k) kept += s[chosen[k]];
    const double divisor = normalize != 0 ? kept + 1e-20 : 1.0;
    for (int k = 0; k < K; ++k) w[k] = static_cast<float>(s[chosen[k]] / divisor * scale);
  }
}

void moe_sigmoid_router_backward(float* dlogits, const float* dweights, const float* dprobs, const float* scores,
                                 const int* experts, int N, int E, int K, int normalize, float scale) {
  if (dlogits == nullptr) return;
  std::vector<double> ds(static_cast<std::size_t>(E));
  for (int n = 0; n < N; ++n) {
    const float* s = scores + at(n, E);
    const int* chosen = experts + at(n, K);
    const float* dw = dweights + at(n, K);
    std::fill(ds.begin(), ds.end(), 0.0);
    // w_k = scale s_k / S (S the chosen scores' sum): ds_k = scale (dw_k - sum_j dw_j s_j / S) / S.
    double kept = 0, dot = 0;
    for (int k = 0; k < K; ++k) kept += s[chosen[k]];
    kept += 1e-20;
    for (int k = 0; k < K; ++k) dot += static_cast<double>(dw[k]) * s[chosen[k]] / kept;
    for (int k = 0; k < K; ++k) {
      ds[static_cast<std::size_t>(chosen[k])] += normalize != 0 ? scale * (dw[k] - dot) / kept : scale * static_cast<double>(dw[k]);
    }
    // The balance loss's p_e = s_e / T (T every score's sum): ds_e += (dp_e - sum_j dp_j p_j) / T.
    if (dprobs != nullptr) {
      double total = 0, mean = 0;
      for (int e = 0; e < E; ++e) total += s[e];
      total += 1e-20;
      for (int e = 0; e < E; ++e) mean += dprobs[e] * (s[e] / total);
      for (int e = 0; e < E; ++e) ds[static_cast<std::size_t>(e)] += (dprobs[e] - mean) / total;
    }
    float* dz = dlogits + at(n, E);
    for (int e = 0; e < E; ++e) dz[e] += static_cast<float>(ds[static_cast<std::size_t>(e)] * s[e] * (1.0 - s[e]));
  }
}

void moe_permute(float* y, const float* x, const int* rows, int M, int C) {
  for (int m = 0; m < M; ++m) {
    const float* from = x + at(rows[m], C);
    std::copy(from, from + C, y + at(m, C));
  }
}

void moe_permute_backward(float* dx, const float* dy, const int* slots, int N, int K, int C) {
  if (dx == nullptr) return;
  for (int n = 0; n < N; ++n) {
    float* d = dx + at(n, C);
    for (int k = 0; k < K; ++k) {
      const int m = slots[at(n, K) + static_cast<std::size_t>(k)];
      if (m < 0) continue;
      const float* g = dy + at(m, C);
      for (int c = 0; c < C; ++c) d[c] += g[c];
    }
  }
}

void moe_combine(float* y, const float* x, const int* slots, const float* weights, int N, int K, int C) {
  for (int n = 0; n < N; ++n) {
    float* out = y + at(n, C);
    std::fill(out, out + C, 0.0f);
    for (int k = 0; k < K; ++k) {
      const std::size_t i = at(n, K) + static_cast<std::size_t>(k);
      if (slots[i] < 0) continue;
      const float* from = x + at(slots[i], C);
      for (int c = 0; c < C; ++c) out[c] += weights[i] * from[c];
    }
  }
}

void moe_combine_backward(float* dx, float* dweights, const float* dy, const float* x, const int* slots,
                          const float* weights, int N, int K, int C) {
  for (int n = 0; n < N; ++n) {
    const float* g = dy + at(n, C);
    for (int k = 0; k < K; ++k) {
      const std::size_t i = at(n, K) + static_cast<std::size_t>(k);
      if (slots[i] < 0) continue;
      if (dx != nullptr) {
        float* d = dx + at(slots[i], C);
        for (int c = 0; c < C; ++c) d[c] += weights[i] * g[c];
      }
      if (dweights != nullptr) {
        const float* from = x + at(slots[i], C);
        double dot = 0;
        for (int c = 0; c < C; ++c) dot += static_cast<double>(g[c]) * from[c];
        dweights[i] += static_cast<float>(dot);
      }
    }
  }
}

void gated_add(float* y, const float* x, const float* gate, int N, int C) {
  for (int n = 0; n < N; ++n) {
    const float s = sigmoid(gate[n]);
    float* out = y + at(n, C);
    const float* from = x + at(n, C);
    for (int c = 0; c < C; ++c) out[c] += s * from[c];
  }
}

void gated_add_backward(float* dx, float* dgate, const float* dy, const float* x, const float* gate, int N, int C) {
  for (int n = 0; n < N; ++n) {
    const float s = sigmoid(gate[n]);
    const float* g = dy + at(n, C);
    if (dx != nullptr) {
      float* d = dx + at(n, C);
      for (int c = 0; c < C; ++c) d[c] += s * g[c];
    }
    if (dgate != nullptr) {
      const float* from = x + at(n, C);
      double dot = 0;
      for (int c = 0; c < C; ++c) dot += static_cast<double>(g[c]) * from[c];
      dgate[n] += static_cast<float>(static_cast<double>(s) * (1.0 - s) * dot);
    }
  }
}

}  // namespace hetflow::kernels
