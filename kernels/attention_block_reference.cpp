// Attention by blocks of keys (attention_block.hpp): one (sample, head) at a time, its
// [Tq, Tk] scores by sgemm, the mask by positions, the rows' sums in double.
#include "kernels/attention_block.hpp"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <vector>

namespace hetflow::kernels {

namespace {

std::size_t at(long row, long width) { return static_cast<std::size_t>(row) * static_cast<std::size_t>(width); }

// Where (sample b, head h)'s rows start in a [B,T,heads,HS] array; rows are heads*HS apart.
std::size_t head_offset(int b, int T, int h, int heads, int HS) {
  return (at(b, T) * static_cast<std::size_t>(heads) + static_cast<std::size_t>(h)) * static_cast<std::size_t>(HS);
}

bool visible(int query, int key, int window) { return key <= query && (window <= 0 || query - key < window); }

constexpr float kMinusInfinity = -std::numeric_limits<float>::infinity();

// scores [Tq, Tk] = scale * q_h k_g^T for one (sample, head).
void scores_of(float* scores, const float* qh, const float* kh, int Tq, int Tk, int ldq, int ldk, int HS, float scale) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, Tq, Tk, HS, scale, qh, ldq, kh, ldk, 0.0f, scores, Tk);
}

}  // namespace

void attention_block_forward(float* out, float* lse, const float* q, const float* k, const float* v, const int* qpos,
                             const int* kpos, int B, int Tq, int Tk, int NH, int NKV, int HS, int window) {
  if (B <= 0 || Tq <= 0 || NH <= 0 || HS <= 0) return;
  const int ldq = NH * HS, ldk = NKV * HS, group = NH / NKV;
  if (Tk <= 0) {
    std::fill(out, out + at(B * Tq, ldq), 0.0f);
    std::fill(lse, lse + at(B * NH, Tq), kMinusInfinity);
    return;
  }
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(HS)));
  std::vector<float> p(at(Tq, Tk));
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      const std::size_t ko = head_offset(b, Tk, h / group, NKV, HS), qo = head_offset(b, Tq, h, NH, HS);
      scores_of(p.data(), q + qo, k + ko, Tq, Tk, ldq, ldk, HS, scale);
      float* l = lse + at(b * NH + h, Tq);
      for (int i = 0; i < Tq; ++i) {
        float* row = p.data() + at(i, Tk);
        float m = kMinusInfinity;
        for (int j = 0; j < Tk; ++j) {
          if (visible(qpos[i], kpos[j], window)) m = std::max(m, row[j]);
        }
        if (m == kMinusInfinity) {  // no key of this block: a zero row, an empty sum
          std::fill(row, row + Tk, 0.0f);
          l[i] = kMinusInfinity;
          continue;
        }
        double sum = 0;
        for (int j = 0; j < Tk; ++j) {
          row[j] = visible(qpos[i], kpos[j], window) ? std::exp(row[j] - m) : 0.0f;
          sum += row[j];
        }
        const float inv = static_cast<float>(1.0 / sum);
        for (int j = 0; j < Tk; ++j) row[j] *= inv;
        l[i] = static_cast<float>(m + std::log(sum));
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, Tq, HS, Tk, 1.0f, p.data(), Tk, v + ko, ldk, 0.0f, out + qo,
                  ldq);
    }
  }
}

void attention_block_merge(float* out, float* lse, const float* block_out, const float* block_lse, int B, int T,
                           int NH, int HS) {
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      for (int t = 0; t < T; ++t) {
        const std::size_t li = at(b * NH + h, T) + static_cast<std::size_t>(t);
        const double l1 = lse[li], l2 = block_lse[li];
        if (l2 == -std::numeric_limits<double>::infinity()) continue;
        float* o = out + head_offset(b, T, h, NH, HS) + at(t, NH * HS);
        const float* bo = block_out + head_offset(b, T, h, NH, HS) + at(t, NH * HS);
        if (l1 == -std::numeric_limits<double>::infinity()) {
          std::copy(bo, bo + HS, o);
          lse[li] = block_lse[li];
          continue;
        }
        const double m = std::max(l1, l2), l = m + std::log(std::exp(l1 - m) + std::exp(l2 - m));
        const double w1 = std::exp(l1 - l), w2 = std::exp(l2 - l);
        for (int d = 0; d < HS; ++d) o[d] = static_cast<float>(o[d] * w1 + bo[d] * w2);
        lse[li] = static_cast<float>(l);
      }
    }
  }
}

void attention_block_delta(float* delta, const float* dout, const float* out, int B, int T, int NH, int HS) {
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      for (int t = 0; t < T; ++t) {
        const std::size_t o = head_offset(b, T, h, NH, HS) + at(t, NH * HS);
        double dot = 0;
        for (int d = 0; d < HS; ++d) dot += static_cast<double>(dout[o + static_cast<std::size_t>(d)]) * out[o + static_cast<std::size_t>(d)];
        delta[at(b * NH + h, T) + static_cast<std::size_t>(t)] = static_cast<float>(dot);
      }
    }
  }
}

void attention_block_backward(float* dq, float* dk, float* dv, const float* dout, const float* lse, const float* delta,
                              const float* q, const float* k, const float* v, const int* qpos, const int* kpos, int B,
                              int Tq, int Tk, int NH, int NKV, int HS, int window) {
  if (B <= 0 || Tq <= 0 || Tk <= 0 || NH <= 0 || HS <= 0) return;
  if (dq == nullptr && dk == nullptr && dv == nullptr) return;
  const int ldq = NH * HS, ldk = NKV * HS, group = NH / NKV;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(HS)));
  std::vector<float> p(at(Tq, Tk)), ds(at(Tq, Tk));
  for (int b = 0; b < B; ++b) {
    // Query heads in order, so the heads of a group add into dk and dv in the same order every call.
    for (int h = 0; h < NH; ++h) {
      const std::size_t ko = head_offset(b, Tk, h / group, NKV, HS), qo = head_offset(b, Tq, h, NH, HS);
      scores_of(p.data(), q + qo, k + ko, Tq, Tk, ldq, ldk, HS, scale);
      const float* l = lse + at(b * NH + h, Tq);
      for (int i = 0; i < Tq; ++i) {
        float* row = p.data() + at(i, Tk);
        for (int j = 0; j < Tk; ++j) {
          const bool seen = visible(qpos[i], kpos[j], window) && l[i] != kMinusInfinity;
          row[j] = seen ? static_cast<float>(std::exp(static_cast<double>(row[j]) - l[i])) : 0.0f;
        }
      }
      if (dv != nullptr) {  // dv += p^T dout
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, Tk, HS, Tq, 1.0f, p.data(), Tk, dout + qo, ldq, 1.0f,
                    dv + ko, ldk);
      }
      if (dq == nullptr && dk == nullptr) continue;
      // ds = scale p (dout v^T - delta): the softmax's backward, with each row's sum of p dp
      // being delta (the whole row's, over every block, is the output's dot with its gradient).
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, Tq, Tk, HS, 1.0f, dout + qo, ldq, v + ko, ldk, 0.0f,
                  ds.data(), Tk);
      const float* dl = delta + at(b * NH + h, Tq);
      for (int i = 0; i < Tq; ++i) {
        for (int j = 0; j < Tk; ++j) {
          const std::size_t e = at(i, Tk) + static_cast<std::size_t>(j);
          ds[e] = scale * p[e] * (ds[e] - dl[i]);
        }
      }
      if (dq != nullptr) {  // dq += ds k
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, Tq, HS, Tk, 1.0f, ds.data(), Tk, k + ko, ldk, 1.0f,
                    dq + qo, ldq);
      }
      if (dk != nullptr) {  // dk += ds^T q
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, Tk, HS, Tq, 1.0f, ds.data(), Tk, q + qo, ldq, 1.0f,
                    dk + ko, ldk);
      }
    }
  }
}

}  // namespace hetflow::kernels
