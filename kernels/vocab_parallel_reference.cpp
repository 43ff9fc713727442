// Megatron's vocabulary-parallel embedding and loss (transformer.hpp): a rank's share of the
// token table and of the cross-entropy's softmax.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>

#include "kernels/transformer.hpp"

namespace hetflow::kernels {

namespace {
std::size_t sz(long long n) { return static_cast<std::size_t>(n); }
}  // namespace

void vocab_embedding_forward(float* y, const int* tokens, const float* wte, int V0, int V, const float* wpe, int N,
                             int T, int C) {
  const std::size_t c_size = sz(C);
  std::fill(y, y + sz(1LL * N * C), 0.0f);
  for (std::size_t n = 0; n < sz(N); ++n) {
    const int t = tokens[n] - V0;
    float* row = y + n * c_size;
    if (t >= 0 && t < V) {
      const float* e = wte + sz(t) * c_size;
      for (std::size_t c = 0; c < c_size; ++c) row[c] = e[c];
    }
    if (wpe != nullptr) {
      const float* p = wpe + (n % sz(T)) * c_size;
      for (std::size_t c = 0; c < c_size; ++c) row[c] += p[c];
    }
  }
}

void vocab_embedding_backward(float* dwte, float* dwpe, const float* dy, const int* tokens, int V0, int V, int N,
                              int T, int C) {
  const std::size_t c_size = sz(C);
  for (std::size_t n = 0; n < sz(N); ++n) {
    const int t = tokens[n] - V0;
    const float* row = dy + n * c_size;
    if (dwte != nullptr && t >= 0 && t < V) {
      float* e = dwte + sz(t) * c_size;
      for (std::size_t c = 0; c < c_size; ++c) e[c] += row[c];
    }
    if (dwpe != nullptr) {
      float* p = dwpe + (n % sz(T)) * c_size;
      for (std::size_t c = 0; c < c_size; ++c) p[c] += row[c];
    }
  }
}

void logits_row_max(float* row_max, const float* logits, int N, int V) {
  for (std::size_t n = 0; n < sz(N); ++n) {
    const float* l = logits + n * sz(V);
    row_max[n] = V > 0 ? *std::max_element(l, l + V) : -std::numeric_limits<float>::infinity();
  }
}

void logits_exp_sums(float* sums, const float* logits, const float* row_max, const int* targets, int V0, int N, int V) {
  for (std::size_t n = 0; n < sz(N); ++n) {
    const float* l = logits + n * sz(V);
    double sum = 0;
    for (std::size_t v = 0; v < sz(V); ++v) sum += std::exp(static_cast<double>(l[v]) - row_max[n]);
    sums[n] = static_cast<float>(sum);
    const int t = targets[n] - V0;
    sums[sz(N) + n] = t >= 0 && t < V ? l[t] : 0.0f;
  }
}

void vocab_crossentropy_backward(float* dlogits, double* losses, const float* logits, const float* row_max,
                                 const float* sums, const int* targets, int V0, float dloss, int N, int V) {
  for (std::size_t n = 0; n < sz(N); ++n) {
    losses[n] = std::log(static_cast<double>(sums[n])) + row_max[n] - sums[sz(N) + n];
    const float* l = logits + n * sz(V);
    float* dl = dlogits + n * sz(V);
    for (std::size_t v = 0; v < sz(V); ++v) {
      const double p = std::exp(static_cast<double>(l[v]) - row_max[n]) / sums[n];
      dl[v] = static_cast<float>((p - (static_cast<int>(v) + V0 == targets[n] ? 1.0 : 0.0)) * dloss);
    }
  }
}

}  // namespace hetflow::kernels
