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
void CpuDecoderOps::download_ints(int* host, const int* src, size_t n) const {
  if (n > 0) std::memmove(host, src, n * sizeof(int));
}

void CpuDecoderOps::zero(float* dst, size_t n) const { std::fill(dst, dst + n, 0.0f); }

double CpuDecoderOps::sum(const float* x, size_t n) const {
  double total = 0;
  for (size_t i = 0; i < n; ++i) total += x[i];
  return total;
}

// The op table's ops: the reference, as it is.
#define HETFLOW_OP(name, tail, params, args, ...) \
  void CpuDecoderOps::name params const { hetflow::kernels::name args; }
#define HETFLOW_KERNEL(...)
#include "kernels/decoder_ops.def"

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
