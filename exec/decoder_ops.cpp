#include "exec/decoder_ops.hpp"

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/transformer.hpp"

namespace hetflow::exec {

namespace k = hetflow::kernels;

namespace {

template <class T>
OpsArray<T> host_array(size_t n, bool zero, const std::shared_ptr<OpsMemory>& memory) {
  if (n == 0) return {};
  T* data = zero ? new T[n]() : new T[n];
  memory->allocated(n * sizeof(T));
  return OpsArray<T>(std::shared_ptr<T>(data,
                                        [memory, n](T* p) {
                                          delete[] p;
                                          memory->freed(n * sizeof(T));
                                        }),
                     n);
}

size_t sz(long long n) { return static_cast<size_t>(n); }

}  // namespace

void OpsMemory::allocated(size_t bytes) {
  const size_t live = live_.fetch_add(bytes) + bytes;
  size_t peak = peak_.load();
  while (live > peak && !peak_.compare_exchange_weak(peak, live)) {
  }
}

void OpsMemory::freed(size_t bytes) { live_.fetch_sub(bytes); }

OpsFloats CpuDecoderOps::floats(size_t n) const { return host_array<float>(n, false, memory_); }
OpsFloats CpuDecoderOps::zeros(size_t n) const { return host_array<float>(n, true, memory_); }

OpsInts CpuDecoderOps::ints(const int* host, size_t n) const {
  OpsInts a = host_array<int>(n, false, memory_);
  if (n > 0) std::memcpy(a.data(), host, n * sizeof(int));
  return a;
}

void CpuDecoderOps::copy(float* dst, const float* src, size_t n) const {
  if (n > 0) std::memmove(dst, src, n * sizeof(float));
}

void CpuDecoderOps::upload(float* dst, const float* host, size_t n) const { copy(dst, host, n); }
void CpuDecoderOps::download(float* host, const float* src, size_t n) const { copy(host, src, n); }

void CpuDecoderOps::zero(float* dst, size_t n) const { std::fill(dst, dst + n, 0.0f); }

double CpuDecoderOps::sum(const float* x, size_t n) const {
  double total = 0;
  for (size_t i = 0; i < n; ++i) total += x[i];
  return total;
}

void CpuDecoderOps::residual_add(float* y, const float* x, long n) const { k::residual_add(y, x, n); }
void CpuDecoderOps::bias_add(float* y, const float* b, int N, int C) const { k::bias_add(y, b, N, C); }

void CpuDecoderOps::linear_forward(float* y, const float* x, const float* w, const float* b, int N, int C,
                                   int OC) const {
  k::linear_forward(y, x, w, b, N, C, OC);
}
void CpuDecoderOps::linear_backward_input(float* dx, const float* dy, const float* w, int N, int C, int OC) const {
  k::linear_backward_input(dx, dy, w, N, C, OC);
}
void CpuDecoderOps::linear_backward_weight(float* dw, float* db, const float* dy, const float* x, int N, int C,
                                           int OC) const {
  k::linear_backward_weight(dw, db, dy, x, N, C, OC);
}
void CpuDecoderOps::embedding_forward(float* y, const int* tokens, const float* wte, const float* wpe, int N, int T,
                                      int C) const {
  k::embedding_forward(y, tokens, wte, wpe, N, T, C);
}
void CpuDecoderOps::embedding_backward(float* dwte, float* dwpe, const float* dy, const int* tokens, int N, int T,
                                       int C) const {
  k::embedding_backward(dwte, dwpe, dy, tokens, N, T, C);
}
void CpuDecoderOps::layernorm_forward(float* y, float* mean, float* rstd, const float* x, const float* w,
                                      const float* b, int N, int C, float eps) const {
  k::layernorm_forward(y, mean, rstd, x, w, b, N, C, eps);
}
void CpuDecoderOps::layernorm_backward(float* dx, float* dw, float* db, const float* dy, const float* x,
                                       const float* w, const float* mean, const float* rstd, int N, int C) const {
  k::layernorm_backward(dx, dw, db, dy, x, w, mean, rstd, N, C);
}
void CpuDecoderOps::rmsnorm_forward(float* y, float* rstd, const float* x, const float* w, int N, int C,
                                    float eps) const {
  k::rmsnorm_forward(y, rstd, x, w, N, C, eps);
}
void CpuDecoderOps::rmsnorm_backward(float* dx, float* dw, const float* dy, const float* x, const float* w,
                                     const float* rstd, int N, int C) const {
  k::rmsnorm_backward(dx, dw, dy, x, w, rstd, N, C);
}
void CpuDecoderOps::gelu_forward(float* y, const float* x, long n) const { k::gelu_forward(y, x, n); }
void CpuDecoderOps::gelu_backward(float* dx, const float* dy, const float* x, long n) const {
  k::gelu_backward(dx, dy, x, n);
}
void CpuDecoderOps::swiglu_forward(float* y, const float* gate, const float* up, long n) const {
  k::swiglu_forward(y, gate, up, n);
}
void CpuDecoderOps::swiglu_backward(float* dgate, float* dup, const float* dy, const float* gate, const float* up,
                                    long n) const {
  k::swiglu_backward(dgate, dup, dy, gate, up, n);
}
void CpuDecoderOps::rope_forward(float* x, int N, int T, int heads, int head_dim,
                                 const kernels::RopeFrequencies& rope) const {
  k::rope_forward(x, N, T, heads, head_dim, rope);
}
void CpuDecoderOps::rope_backward(float* dx, int N, int T, int heads, int head_dim,
                                  const kernels::RopeFrequencies& rope) const {
  k::rope_backward(dx, N, T, heads, head_dim, rope);
}
void CpuDecoderOps::attention_forward(float* out, float* probs, const float* q, const float* kk, const float* v,
                                      int B, int T, int NH, int NKV, int HS, int window) const {
  k::attention_forward(out, probs, q, kk, v, B, T, NH, NKV, HS, window);
}
void CpuDecoderOps::attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* probs,
                                       const float* q, const float* kk, const float* v, int B, int T, int NH,
                                       int NKV, int HS, int window) const {
  k::attention_backward(dq, dk, dv, dout, probs, q, kk, v, B, T, NH, NKV, HS, window);
}
void CpuDecoderOps::crossentropy_forward_backward(float* losses, float* dlogits, const float* logits,
                                                  const int* targets, float dloss, int N, int V) const {
  k::crossentropy_forward_backward(losses, dlogits, logits, targets, dloss, N, V);
}

void CpuDecoderOps::scale(float* x, float factor, size_t n) const { k::scale(x, factor, static_cast<long>(n)); }
double CpuDecoderOps::sum_of_squares(const float* x, size_t n, double start) const {
  return k::sum_of_squares(x, static_cast<long>(n), start);
}
void CpuDecoderOps::adamw_update(float* p, const float* g, float* m, float* v, size_t n, float lr, float beta1,
                                 float beta2, float eps, float weight_decay, int step) const {
  k::adamw_update(p, g, m, v, static_cast<long>(n), lr, beta1, beta2, eps, weight_decay, step);
}

void CpuDecoderOps::vocab_embedding_forward(float* y, const int* tokens, const float* wte, int V0, int V,
                                            const float* wpe, int N, int T, int C) const {
  k::vocab_embedding_forward(y, tokens, wte, V0, V, wpe, N, T, C);
}
void CpuDecoderOps::vocab_embedding_backward(float* dwte, float* dwpe, const float* dy, const int* tokens, int V0,
                                             int V, int N, int T, int C) const {
  k::vocab_embedding_backward(dwte, dwpe, dy, tokens, V0, V, N, T, C);
}
void CpuDecoderOps::logits_row_max(float* row_max, const float* logits, int N, int V) const {
  k::logits_row_max(row_max, logits, N, V);
}
void CpuDecoderOps::logits_exp_sums(float* sums, const float* logits, const float* row_max, const int* targets,
                                    int V0, int N, int V) const {
  k::logits_exp_sums(sums, logits, row_max, targets, V0, N, V);
}
double CpuDecoderOps::vocab_crossentropy_backward(float* dlogits, const float* logits, const float* row_max,
                                                  const float* sums, const int* targets, int V0, float dloss, int N,
                                                  int V) const {
  std::vector<double> losses(sz(N));
  k::vocab_crossentropy_backward(dlogits, losses.data(), logits, row_max, sums, targets, V0, dloss, N, V);
  double total = 0;
  for (const double l : losses) total += l;
  return total;
}

const DecoderOps& cpu_decoder_ops() {
  static const CpuDecoderOps ops;
  return ops;
}

}  // namespace hetflow::exec
