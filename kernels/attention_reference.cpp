// Rotary position embedding and causal grouped-query attention of transformer.hpp.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

#include "kernels/transformer.hpp"

namespace hetflow::kernels {

namespace {

std::size_t at(long row, long width) { return static_cast<std::size_t>(row) * static_cast<std::size_t>(width); }

// Rotates every pair of every head by sign * its angle and scales it by the attention factor:
// +1 is the forward, -1 the gradient (the transpose of a scaled rotation is the scaled rotation
// back; the factor is 1 but for YaRN, and x * 1 is x).
void rope_rotate(float* x, int N, int T, int heads, int head_dim, const RopeFrequencies& rope, double sign) {
  if (N <= 0 || T <= 0) return;
  const int rotary = rope_rotary_dims(rope, head_dim), half = rotary / 2;  // values rotary.. pass through
  const int positions = std::min(N, T);
  // One table of cos and sin per (position, pair), shared by every row and head at that position.
  std::vector<double> cosines(at(positions, half)), sines(at(positions, half));
  std::vector<double> inv_freq(static_cast<std::size_t>(half));
  const RopeFrequencies resolved = rope_resolved(rope, rotary);  // (as the CUDA launcher resolves it)
  for (int i = 0; i < half; ++i) inv_freq[static_cast<std::size_t>(i)] = rope_inv_freq(resolved, i, rotary);
  for (int pos = 0; pos < positions; ++pos) {
    for (int i = 0; i < half; ++i) {
      const double angle = pos * inv_freq[static_cast<std::size_t>(i)];
      cosines[at(pos, half) + static_cast<std::size_t>(i)] = std::cos(angle) * rope.attention_factor;
      sines[at(pos, half) + static_cast<std::size_t>(i)] = sign * (std::sin(angle) * rope.attention_factor);
    }
  }
  for (int n = 0; n < N; ++n) {
    const double* c = cosines.data() + at(n % T, half);
    const double* s = sines.data() + at(n % T, half);
    for (int h = 0; h < heads; ++h) {
      float* head = x + at(n, heads) * static_cast<std::size_t>(head_dim) + at(h, head_dim);
      for (int i = 0; i < half; ++i) {
        const double x1 = head[i], x2 = head[i + half];
        head[i] = static_cast<float>(x1 * c[i] - x2 * s[i]);
        head[i + half] = static_cast<float>(x2 * c[i] + x1 * s[i]);
      }
    }
  }
}

// Queries are taken in blocks of this many rows: a block's products with the keys before it
// are sgemm calls (masking nothing), and only the triangle on the diagonal is looped, so no
// masked entry is ever multiplied in, and of the masked half of T x T only the diagonal
// blocks' scores are computed (by the sgemm, then discarded).
constexpr int kBlock = 64;

// Where (batch b, head h)'s rows start in a [B,T,heads,HS] array; rows are heads*HS apart.
std::size_t head_offset(int b, int T, int h, int heads, int HS) {
  return (at(b, T) * static_cast<std::size_t>(heads) + static_cast<std::size_t>(h)) * static_cast<std::size_t>(HS);
}

// The first key query row t sees: t - window + 1 under a sliding window, else 0.
int first_key(int t, int window) { return window > 0 ? std::max(0, t - window + 1) : 0; }

// Softmax of row t's scores of keys [lo, t] in place (sum in double); zeros for the rest of the row.
void causal_softmax(float* row, int lo, int t, int T) {
  const float m = *std::max_element(row + lo, row + t + 1);
  double sum = 0;
  for (int j = lo; j <= t; ++j) {
    row[j] = std::exp(row[j] - m);
    sum += row[j];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int j = lo; j <= t; ++j) row[j] *= inv;
  std::fill(row, row + lo, 0.0f);
  std::fill(row + t + 1, row + T, 0.0f);
}

// o[d] += weight * r[d] for d < n, four elements at a time so that GCC's -O2 vectorizer (which
// leaves a loop of unknown count alone) packs them into vector instructions; each element is
// computed exactly as a plain loop computes it. As a plain loop it stayed scalar, and the
// triangles below cost more than the attention's sgemm calls.
void add_scaled(float* __restrict o, float weight, const float* __restrict r, int n) {
  int d = 0;
  for (; d + 4 <= n; d += 4) {
    for (int k = 0; k < 4; ++k) o[d + k] += weight * r[d + k];
  }
  for (; d < n; ++d) o[d] += weight * r[d];
}

// out[t] += sum over t' in [t0, t] (and in t's window) of a[t][t'] * in[t'] for the rows t of
// [t0, t1): the diagonal triangle of a row block. `a` holds the block's rows (row t at
// a + (t - t0) * T), in's and out's rows are ld apart.
void add_triangle(float* out, int ld_out, const float* a, int T, const float* in, int ld_in, int t0, int t1, int HS,
                  int window) {
  for (int t = t0; t < t1; ++t) {
    float* o = out + at(t, ld_out);
    for (int j = std::max(t0, first_key(t, window)); j <= t; ++j) {
      add_scaled(o, a[at(t - t0, T) + static_cast<std::size_t>(j)], in + at(j, ld_in), HS);
    }
  }
}

// out[t'] += sum over t in [t', t1) of a[t][t'] * in[t] for t' in [t0, t1): the transpose of add_triangle.
void add_triangle_transposed(float* out, int ld_out, const float* a, int T, const float* in, int ld_in, int t0, int t1,
                             int HS, int window) {
  for (int t = t0; t < t1; ++t) {
    const float* r = in + at(t, ld_in);
    for (int j = std::max(t0, first_key(t, window)); j <= t; ++j) {
      add_scaled(out + at(j, ld_out), a[at(t - t0, T) + static_cast<std::size_t>(j)], r, HS);
    }
  }
}

}  // namespace

void rope_forward(float* x, int N, int T, int heads, int head_dim, const RopeFrequencies& rope) {
  rope_rotate(x, N, T, heads, head_dim, rope, 1.0);
}

void rope_backward(float* dx, int N, int T, int heads, int head_dim, const RopeFrequencies& rope) {
  if (dx == nullptr) return;
  rope_rotate(dx, N, T, heads, head_dim, rope, -1.0);
}

void attention_forward(float* out, float* probs, const float* q, const float* k, const float* v, int B, int T, int NH,
                       int NKV, int HS, int window) {
  if (B <= 0 || T <= 0 || NH <= 0 || HS <= 0) return;
  const int ldq = NH * HS, ldk = NKV * HS, group = NH / NKV;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(HS)));
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      const float* qh = q + head_offset(b, T, h, NH, HS);
      const float* kh = k + head_offset(b, T, h / group, NKV, HS);
      const float* vh = v + head_offset(b, T, h / group, NKV, HS);
      float* oh = out + head_offset(b, T, h, NH, HS);
      float* ph = probs + at(b * NH + h, T) * static_cast<std::size_t>(T);
      for (int t0 = 0; t0 < T; t0 += kBlock) {
        const int t1 = std::min(T, t0 + kBlock), rows = t1 - t0;
        const int k0 = first_key(t0, window);  // the block's first key; later rows' windows start later
        float* block = ph + at(t0, T);
        // Scores against keys [k0, t1): the block's own upper triangle, and under a window the
        // keys before a row's own first, are computed too and then overwritten by the
        // softmax's zeros; they are never read.
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, t1 - k0, HS, scale, qh + at(t0, ldq), ldq,
                    kh + at(k0, ldk), ldk, 0.0f, block + k0, T);
        for (int t = t0; t < t1; ++t) causal_softmax(ph + at(t, T), first_key(t, window), t, T);
        if (t0 > k0) {
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, HS, t0 - k0, 1.0f, block + k0, T,
                      vh + at(k0, ldk), ldk, 0.0f, oh + at(t0, ldq), ldq);
        } else {
          for (int t = t0; t < t1; ++t) std::fill(oh + at(t, ldq), oh + at(t, ldq) + HS, 0.0f);
        }
        add_triangle(oh, ldq, block, T, vh, ldk, t0, t1, HS, window);
      }
    }
  }
}

void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* probs, const float* q,
                        const float* k, const float* v, int B, int T, int NH, int NKV, int HS, int window) {
  if (B <= 0 || T <= 0 || NH <= 0 || HS <= 0) return;
  if (dq == nullptr && dk == nullptr && dv == nullptr) return;
  const int ldq = NH * HS, ldk = NKV * HS, group = NH / NKV;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(HS)));
  // Gradients of one row block's scores, rows T apart like probs' (row t of the block is row t - t0).
  std::vector<float> dscores(at(std::min(T, kBlock), T));
  for (int b = 0; b < B; ++b) {
    // Query heads in order, so the heads of a group add into dk and dv in the same order every call.
    for (int h = 0; h < NH; ++h) {
      const std::size_t qo = head_offset(b, T, h, NH, HS), ko = head_offset(b, T, h / group, NKV, HS);
      const float *qh = q + qo, *kh = k + ko, *vh = v + ko, *doh = dout + qo;
      const float* ph = probs + at(b * NH + h, T) * static_cast<std::size_t>(T);
      for (int t0 = 0; t0 < T; t0 += kBlock) {
        const int t1 = std::min(T, t0 + kBlock), rows = t1 - t0;
        const int k0 = first_key(t0, window);  // keys before k0 are outside every row's window
        const float* pblock = ph + at(t0, T);
        if (dv != nullptr) {  // dv[t'] += sum over t >= t' of probs[t][t'] dout[t]
          float* dvh = dv + ko;
          if (t0 > k0) {
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, t0 - k0, HS, rows, 1.0f, pblock + k0, T,
                        doh + at(t0, ldq), ldq, 1.0f, dvh + at(k0, ldk), ldk);
          }
          add_triangle_transposed(dvh, ldk, pblock, T, doh, ldq, t0, t1, HS, window);
        }
        if (dq == nullptr && dk == nullptr) continue;
        // dprobs = dout v^T on keys [k0, t1); then the softmax's backward, scaled, in place:
        // dscores[t][t'] = scale * p[t][t'] (dprobs[t][t'] - sum over t'' of p[t][t''] dprobs[t][t'']),
        // and zero for the keys in [k0, t) before row t's window (the sgemm calls below read them).
        float* ds = dscores.data();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, t1 - k0, HS, 1.0f, doh + at(t0, ldq), ldq,
                    vh + at(k0, ldk), ldk, 0.0f, ds + k0, T);
        for (int t = t0; t < t1; ++t) {
          const float* p = ph + at(t, T);
          float* d = ds + at(t - t0, T);
          const int lo = first_key(t, window);
          double dot = 0;
          for (int j = lo; j <= t; ++j) dot += static_cast<double>(p[j]) * d[j];
          for (int j = lo; j <= t; ++j) d[j] = static_cast<float>(scale * p[j] * (d[j] - dot));
          std::fill(d + k0, d + lo, 0.0f);
        }
        if (dq != nullptr) {  // dq[t] += sum over t' <= t of dscores[t][t'] k[t']
          float* dqh = dq + qo;
          if (t0 > k0) {
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, HS, t0 - k0, 1.0f, ds + k0, T,
                        kh + at(k0, ldk), ldk, 1.0f, dqh + at(t0, ldq), ldq);
          }
          add_triangle(dqh, ldq, ds, T, kh, ldk, t0, t1, HS, window);
        }
        if (dk != nullptr) {  // dk[t'] += sum over t >= t' of dscores[t][t'] q[t]
          float* dkh = dk + ko;
          if (t0 > k0) {
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, t0 - k0, HS, rows, 1.0f, ds + k0, T,
                        qh + at(t0, ldq), ldq, 1.0f, dkh + at(k0, ldk), ldk);
          }
          add_triangle_transposed(dkh, ldk, ds, T, qh, ldq, t0, t1, HS, window);
        }
      }
    }
  }
}

}  // namespace hetflow::kernels
