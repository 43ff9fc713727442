// The pointwise, norm, embedding, linear, loss and optimizer kernels of transformer.hpp.
// Attention and RoPE are in attention_reference.cpp.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

#include "kernels/transformer.hpp"

namespace hetflow::kernels {

namespace {

// Offsets as size_t: N * V of a language-model head passes 2^31 at modest batch sizes.
std::size_t at(long row, long width) { return static_cast<std::size_t>(row) * static_cast<std::size_t>(width); }

// sums[o] += row[o] for o < n, four columns at a time so that GCC's -O2 vectorizer (which leaves
// a loop of unknown count alone) packs them into vector instructions. Each sum still adds its
// rows in order: the results are those of a plain loop.
void add_row(double* __restrict sums, const float* __restrict row, int n) {
  int o = 0;
  for (; o + 4 <= n; o += 4) {
    for (int k = 0; k < 4; ++k) sums[o + k] += row[o + k];
  }
  for (; o < n; ++o) sums[o] += row[o];
}

// Adds per-column sums, accumulated in double over the rows, into a float gradient: one
// rounding per column whatever N is, and the same order on every call.
void add_columns(float* grad, const std::vector<double>& sums) {
  for (std::size_t c = 0; c < sums.size(); ++c) grad[c] += static_cast<float>(sums[c]);
}

}  // namespace

void linear_forward(float* y, const float* x, const float* w, const float* b, int N, int C, int OC) {
  if (N <= 0 || OC <= 0) return;
  if (b != nullptr) {
    for (int n = 0; n < N; ++n) std::copy(b, b + OC, y + at(n, OC));
  }
  // beta = 0 lets sgemm overwrite y without reading it; with a bias it adds onto the copies.
  const float beta = b != nullptr ? 1.0f : 0.0f;
  if (C <= 0) {
    if (b == nullptr) std::fill(y, y + at(N, OC), 0.0f);
    return;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1.0f, x, C, w, C, beta, y, OC);
}

void linear_backward_input(float* dx, const float* dy, const float* w, int N, int C, int OC) {
  if (dx == nullptr || N <= 0 || C <= 0 || OC <= 0) return;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC, 1.0f, dy, OC, w, C, 1.0f, dx, C);
}

void linear_backward_weight(float* dw, float* db, const float* dy, const float* x, int N, int C, int OC) {
  if (N <= 0 || OC <= 0) return;
  if (dw != nullptr && C > 0) {
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N, 1.0f, dy, OC, x, C, 1.0f, dw, C);
  }
  if (db != nullptr) {
    std::vector<double> sums(static_cast<std::size_t>(OC), 0.0);
    for (int n = 0; n < N; ++n) add_row(sums.data(), dy + at(n, OC), OC);
    add_columns(db, sums);
  }
}

void embedding_forward(float* y, const int* tokens, const float* wte, const float* wpe, int N, int T, int C) {
  for (int n = 0; n < N; ++n) {
    float* out = y + at(n, C);
    const float* word = wte + at(tokens[n], C);
    if (wpe == nullptr) {
      std::copy(word, word + C, out);
      continue;
    }
    const float* position = wpe + at(n % T, C);
    for (int c = 0; c < C; ++c) out[c] = word[c] + position[c];
  }
}

void embedding_backward(float* dwte, float* dwpe, const float* dy, const int* tokens, int N, int T, int C) {
  // Rows in order, so a repeated token's (or position's) gradients add in the same order every call.
  for (int n = 0; n < N; ++n) {
    const float* grad = dy + at(n, C);
    if (dwte != nullptr) {
      float* word = dwte + at(tokens[n], C);
      for (int c = 0; c < C; ++c) word[c] += grad[c];
    }
    if (dwpe != nullptr) {
      float* position = dwpe + at(n % T, C);
      for (int c = 0; c < C; ++c) position[c] += grad[c];
    }
  }
}

void layernorm_forward(float* y, float* mean, float* rstd, const float* x, const float* w, const float* b, int N, int C,
                       float eps) {
  for (int n = 0; n < N; ++n) {
    const float* in = x + at(n, C);
    float* out = y + at(n, C);
    double sum = 0;
    for (int c = 0; c < C; ++c) sum += in[c];
    const double m = sum / C;
    // Two passes: the variance from deviations, not E[x^2] - m^2, which cancels badly when |m| >> std.
    double squares = 0;
    for (int c = 0; c < C; ++c) squares += (in[c] - m) * (in[c] - m);
    const double s = 1.0 / std::sqrt(squares / C + eps);
    for (int c = 0; c < C; ++c) out[c] = static_cast<float>((in[c] - m) * s * w[c] + b[c]);
    mean[n] = static_cast<float>(m);
    rstd[n] = static_cast<float>(s);
  }
}

void layernorm_backward(float* dx, float* dw, float* db, const float* dy, const float* x, const float* w,
                        const float* mean, const float* rstd, int N, int C) {
  const std::size_t width = static_cast<std::size_t>(C);
  std::vector<double> dw_sums(dw != nullptr ? width : 0, 0.0), db_sums(db != nullptr ? width : 0, 0.0);
  for (int n = 0; n < N; ++n) {
    const float* in = x + at(n, C);
    const float* grad = dy + at(n, C);
    const double m = mean[n], s = rstd[n];
    for (int c = 0; c < C; ++c) {
      if (dw != nullptr) dw_sums[static_cast<std::size_t>(c)] += grad[c] * (in[c] - m) * s;
      if (db != nullptr) db_sums[static_cast<std::size_t>(c)] += grad[c];
    }
    if (dx == nullptr) continue;
    // dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = w * dy, xhat the normalized row.
    double g_mean = 0, g_xhat_mean = 0;
    for (int c = 0; c < C; ++c) {
      const double g = static_cast<double>(w[c]) * grad[c];
      g_mean += g;
      g_xhat_mean += g * (in[c] - m) * s;
    }
    g_mean /= C;
    g_xhat_mean /= C;
    float* out = dx + at(n, C);
    for (int c = 0; c < C; ++c) {
      const double g = static_cast<double>(w[c]) * grad[c];
      out[c] += static_cast<float>(s * (g - g_mean - (in[c] - m) * s * g_xhat_mean));
    }
  }
  if (dw != nullptr) add_columns(dw, dw_sums);
  if (db != nullptr) add_columns(db, db_sums);
}

void rmsnorm_forward(float* y, float* rstd, const float* x, const float* w, int N, int C, float eps) {
  for (int n = 0; n < N; ++n) {
    const float* in = x + at(n, C);
    float* out = y + at(n, C);
    double squares = 0;
    for (int c = 0; c < C; ++c) squares += static_cast<double>(in[c]) * in[c];
    const double s = 1.0 / std::sqrt(squares / C + eps);
    for (int c = 0; c < C; ++c) out[c] = static_cast<float>(in[c] * s * w[c]);
    rstd[n] = static_cast<float>(s);
  }
}

void rmsnorm_backward(float* dx, float* dw, const float* dy, const float* x, const float* w, const float* rstd, int N,
                      int C) {
  std::vector<double> dw_sums(dw != nullptr ? static_cast<std::size_t>(C) : 0, 0.0);
  for (int n = 0; n < N; ++n) {
    const float* in = x + at(n, C);
    const float* grad = dy + at(n, C);
    const double s = rstd[n];
    if (dw != nullptr) {
      for (int c = 0; c < C; ++c) dw_sums[static_cast<std::size_t>(c)] += grad[c] * in[c] * s;
    }
    if (dx == nullptr) continue;
    // d/dx_j of x_i * s * w_i, with s = (mean(x^2) + eps)^(-1/2): s w_j [i == j] - s^3 x_i w_i x_j / C.
    double g_x = 0;
    for (int c = 0; c < C; ++c) g_x += static_cast<double>(grad[c]) * w[c] * in[c];
    const double correction = s * s * s * g_x / C;
    float* out = dx + at(n, C);
    for (int c = 0; c < C; ++c) out[c] += static_cast<float>(s * w[c] * grad[c] - correction * in[c]);
  }
  if (dw != nullptr) add_columns(dw, dw_sums);
}

namespace {
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluCube = 0.044715f;

// 0.5 (1 + tanh(u)) for GELU's u = sqrt(2/pi) (x + 0.044715 x^3), as the sigmoid 1 / (1 + exp(-2u)):
// the same function, one exp instead of a tanh (several times faster), and no cancellation in
// 1 + tanh(u) where tanh(u) is near -1. exp overflowing to inf gives 0, as it should.
float gelu_gate(float x) {
  const float u = kGeluScale * (x + kGeluCube * x * x * x);
  return 1.0f / (1.0f + std::exp(-2.0f * u));
}
}  // namespace

void residual_add(float* y, const float* x, long n) {
  for (long i = 0; i < n; ++i) y[i] += x[i];
}

void bias_add(float* y, const float* b, int N, int C) {
  for (long n = 0; n < N; ++n) {
    float* row = y + n * C;
    for (int c = 0; c < C; ++c) row[c] += b[c];
  }
}

void bias_residual_add(float* y, const float* b, const float* residual, int N, int C) {
  if (b == nullptr) {  // y + 0 would turn a -0 into +0: no bias is no add
    residual_add(y, residual, static_cast<long>(N) * C);
    return;
  }
  for (long n = 0; n < N; ++n) {
    float* row = y + n * C;
    const float* r = residual + n * C;
    for (int c = 0; c < C; ++c) row[c] = (row[c] + b[c]) + r[c];  // bias_add's add, then residual_add's
  }
}

void scale(float* x, float factor, long n) {
  for (long i = 0; i < n; ++i) x[i] *= factor;
}

double sum_of_squares(const float* x, long n, double start) {
  // Eight running sums, not one: a single sum is a chain of dependent additions (about four
  // cycles each, whatever the memory can deliver); eight independent ones overlap and
  // vectorise. In double, the order changes the result by rounding alone.
  constexpr long kLanes = 8;
  double part[kLanes] = {};
  long i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (long k = 0; k < kLanes; ++k) part[k] += static_cast<double>(x[i + k]) * x[i + k];
  }
  for (; i < n; ++i) part[i % kLanes] += static_cast<double>(x[i]) * x[i];
  const double sum = ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
  return start + sum;
}

void gelu_forward(float* y, const float* x, long n) {
  for (long i = 0; i < n; ++i) y[i] = x[i] * gelu_gate(x[i]);
}

void gelu_backward(float* dx, const float* dy, const float* x, long n) {
  if (dx == nullptr) return;
  for (long i = 0; i < n; ++i) {
    const float v = x[i];
    // d/dx [x s(u)] with s the gate: s + x s (1 - s) 2 u', since 0.5 sech^2(u) = 2 s (1 - s).
    const float s = gelu_gate(v);
    const float local = s + 2.0f * v * s * (1.0f - s) * kGeluScale * (1.0f + 3.0f * kGeluCube * v * v);
    dx[i] += local * dy[i];
  }
}

void swiglu_forward(float* y, const float* gate, const float* up, long n) {
  for (long i = 0; i < n; ++i) {
    const float g = gate[i];
    // exp(-g) overflows to inf for very negative g, and then the sigmoid is 0, as it should be.
    y[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

void swiglu_backward(float* dgate, float* dup, const float* dy, const float* gate, const float* up, long n) {
  for (long i = 0; i < n; ++i) {
    const float g = gate[i];
    const float sig = 1.0f / (1.0f + std::exp(-g));
    // silu'(g) = sig + g sig (1 - sig)
    if (dgate != nullptr) dgate[i] += dy[i] * up[i] * sig * (1.0f + g * (1.0f - sig));
    if (dup != nullptr) dup[i] += dy[i] * g * sig;
  }
}

void crossentropy_forward(float* losses, const float* logits, const int* targets, int N, int V) {
  for (int n = 0; n < N; ++n) {
    const float* row = logits + at(n, V);
    // exp(x - max) in float (it cannot overflow), summed in double.
    const float m = *std::max_element(row, row + V);
    double sum = 0;
    for (int i = 0; i < V; ++i) sum += std::exp(row[i] - m);
    losses[n] = static_cast<float>(std::log(sum) + (static_cast<double>(m) - row[targets[n]]));
  }
}

void crossentropy_backward(float* dlogits, const float* logits, const int* targets, float dloss, int N, int V) {
  if (dlogits == nullptr || N <= 0 || V <= 0) return;
  // The max and the sum as the forward computes them; the row's exponentials are kept so each is taken once.
  std::vector<float> e(static_cast<std::size_t>(V));
  for (int n = 0; n < N; ++n) {
    const float* row = logits + at(n, V);
    float* grad = dlogits + at(n, V);
    const float m = *std::max_element(row, row + V);
    double sum = 0;
    for (int i = 0; i < V; ++i) sum += (e[static_cast<std::size_t>(i)] = std::exp(row[i] - m));
    const double inv = 1.0 / sum;
    const int target = targets[n];
    for (int i = 0; i < V; ++i) {
      const double p = e[static_cast<std::size_t>(i)] * inv;
      grad[i] += static_cast<float>((p - (i == target ? 1.0 : 0.0)) * dloss);
    }
  }
}

void crossentropy_forward_backward(float* losses, float* dlogits, const float* logits, const int* targets, float dloss,
                                   int N, int V) {
  if (N <= 0 || V <= 0) return;
  for (int n = 0; n < N; ++n) {
    const float* row = logits + at(n, V);
    float* grad = dlogits + at(n, V);
    const float m = *std::max_element(row, row + V);
    double sum = 0;
    for (int i = 0; i < V; ++i) sum += (grad[i] = std::exp(row[i] - m));  // the exponentials, kept in place
    losses[n] = static_cast<float>(std::log(sum) + (static_cast<double>(m) - row[targets[n]]));
    const double inv = 1.0 / sum;
    const int target = targets[n];
    for (int i = 0; i < V; ++i) {
      const double p = grad[i] * inv;
      grad[i] = 0.0f + static_cast<float>((p - (i == target ? 1.0 : 0.0)) * dloss);
    }
  }
}

void adamw_update(float* p, const float* g, float* m, float* v, long n, float lr, float beta1, float beta2, float eps,
                  float weight_decay, int step) {
  // The scalars in double, as PyTorch computes them in Python before the elementwise ops.
  const double step_size = lr / (1.0 - std::pow(static_cast<double>(beta1), step));
  const double bias2_sqrt = std::sqrt(1.0 - std::pow(static_cast<double>(beta2), step));
  const double decay = static_cast<double>(lr) * weight_decay;
  for (long i = 0; i < n; ++i) {
    const double grad = g[i];
    m[i] = static_cast<float>(beta1 * static_cast<double>(m[i]) + (1.0 - beta1) * grad);
    v[i] = static_cast<float>(beta2 * static_cast<double>(v[i]) + (1.0 - beta2) * grad * grad);
    double param = p[i];
    param -= decay * param;
    param -= step_size * m[i] / (std::sqrt(static_cast<double>(v[i])) / bias2_sqrt + eps);
    p[i] = static_cast<float>(param);
  }
}

}  // namespace hetflow::kernels
