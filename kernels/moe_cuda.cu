// The Mixture-of-Experts kernels of transformer_cuda.hpp, next to moe_reference.cpp: the
// router a thread per token row (E and K are small beside the experts' GEMMs: a linear scan
// per choice, as the reference), the permutation, combine and gated add grid-stride loops
// with every sum in the reference's order (no atomics: each output element has one writer).
#include "kernels/cuda_common.cuh"
#include "kernels/transformer_cuda_launch.hpp"

namespace hetflow::kernels {

namespace {

constexpr int kThreads = 256;

__device__ inline long first_index() { return static_cast<long>(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ inline long grid_stride() { return static_cast<long>(gridDim.x) * blockDim.x; }
__device__ inline long at(long row, long width) { return row * width; }

__global__ void router_forward_kernel(float* probs, float* weights, int* experts, const float* logits, int N, int E,
                                      int K, int normalize) {
  for (long n = first_index(); n < N; n += grid_stride()) {
    const float* z = logits + at(n, E);
    float* p = probs + at(n, E);
    float top = z[0];
    for (int e = 1; e < E; ++e) top = fmaxf(top, z[e]);
    double sum = 0;
    for (int e = 0; e < E; ++e) sum += exp(static_cast<double>(z[e] - top));
    for (int e = 0; e < E; ++e) p[e] = static_cast<float>(exp(static_cast<double>(z[e] - top)) / sum);
    int* chosen = experts + at(n, K);
    float* w = weights + at(n, K);
    double kept = 0;
    for (int k = 0; k < K; ++k) {
      int best = -1;
      for (int e = 0; e < E; ++e) {
        bool taken = false;
        for (int j = 0; j < k; ++j) taken = taken || chosen[j] == e;
        if (!taken && (best < 0 || p[e] > p[best])) best = e;
      }
      chosen[k] = best;
      w[k] = p[best];
      kept += p[best];
    }
    if (normalize != 0) {
      for (int k = 0; k < K; ++k) w[k] = static_cast<float>(w[k] / kept);
    }
  }
}

__global__ void router_backward_kernel(float* dlogits, const float* dweights, const float* dprobs, const float* probs,
                                       const float* weights, const int* experts, int N, int E, int K, int normalize) {
  for (long n = first_index(); n < N; n += grid_stride()) {
    const float* p = probs + at(n, E);
    const int* chosen = experts + at(n, K);
    const float* w = weights + at(n, K);
    const float* dw = dweights + at(n, K);
    double kept = 0, dot = 0;
    for (int k = 0; k < K; ++k) {
      kept += p[chosen[k]];
      dot += static_cast<double>(dw[k]) * w[k];
    }
    // dp_e without an array: the aux part plus the chosen slot's part, if e was chosen.
    auto dp = [&](int e) {
      double v = dprobs != nullptr ? dprobs[e] : 0.0;
      for (int k = 0; k < K; ++k) {
        if (chosen[k] == e) v += normalize != 0 ? (dw[k] - dot) / kept : dw[k];
      }
      return v;
    };
    double mean = 0;
    for (int e = 0; e < E; ++e) mean += p[e] * dp(e);
    float* dz = dlogits + at(n, E);
    for (int e = 0; e < E; ++e) dz[e] += static_cast<float>(p[e] * (dp(e) - mean));
  }
}

__device__ inline double sigmoid_double(float z) { return 1.0 / (1.0 + exp(-static_cast<double>(z))); }

// The reference's choice (moe_reference.cpp) without per-row arrays: biased scores and group
// scores are recomputed where they are compared.
__global__ void sigmoid_router_forward_kernel(float* scores, float* weights, int* experts, const float* logits,
                                              const float* bias, int N, int E, int K, int groups, int groups_chosen,
                                              int normalize, float scale) {
  const int size = E / groups;
  for (long n = first_index(); n < N; n += grid_stride()) {
    const float* z = logits + at(n, E);
    float* s = scores + at(n, E);
    for (int e = 0; e < E; ++e) s[e] = static_cast<float>(sigmoid_double(z[e]));
    auto biased = [&](int e) { return static_cast<double>(s[e]) + (bias != nullptr ? bias[e] : 0.0f); };
    auto group_score = [&](int g) {
      int first = g * size;
      for (int e = g * size + 1; e < (g + 1) * size; ++e) first = biased(e) > biased(first) ? e : first;
      int second = -1;
      for (int e = g * size; e < (g + 1) * size; ++e) {
        if (e != first && (second < 0 || biased(e) > biased(second))) second = e;
      }
      return biased(first) + (second >= 0 ? biased(second) : 0.0);
    };
    unsigned long long kept_groups = ~0ULL;  // bit g: group g may be chosen from (at most 64 groups)
    if (groups_chosen < groups) {
      kept_groups = 0;
      for (int g = 0; g < groups; ++g) {
        const double mine = group_score(g);
        int above = 0;
        for (int h = 0; h < groups; ++h) {
          const double x = h == g ? mine : group_score(h);
          above += x > mine || (x == mine && h < g);
        }
        if (above < groups_chosen) kept_groups |= 1ULL << g;
      }
    }
    auto allowed = [&](int e) { return ((kept_groups >> (e / size)) & 1ULL) != 0; };
    int* chosen = experts + at(n, K);
    for (int k = 0; k < K; ++k) {
      int best = -1;
      for (int e = 0; e < E; ++e) {
        bool taken = false;
        for (int j = 0; j < k; ++j) taken = taken || chosen[j] == e;
        if (!taken && (best < 0 || biased(e) > biased(best)) && allowed(e)) best = e;
      }
      chosen[k] = best;
    }
    float* w = weights + at(n, K);
    double kept = 0;
    for (int k = 0; k < K; ++k) kept += s[chosen[k]];
    const double divisor = normalize != 0 ? kept + 1e-20 : 1.0;
    for (int k = 0; k < K; ++k) w[k] = static_cast<float>(s[chosen[k]] / divisor * scale);
  }
}

__global__ void sigmoid_router_backward_kernel(float* dlogits, const float* dweights, const float* dprobs,
                                               const float* scores, const int* experts, int N, int E, int K,
                                               int normalize, float scale) {
  for (long n = first_index(); n < N; n += grid_stride()) {
    const float* s = scores + at(n, E);
    const int* chosen = experts + at(n, K);
    const float* dw = dweights + at(n, K);
    double kept = 0, dot = 0, total = 0, mean = 0;
    for (int k = 0; k < K; ++k) kept += s[chosen[k]];
    kept += 1e-20;
    for (int k = 0; k < K; ++k) dot += static_cast<double>(dw[k]) * s[chosen[k]] / kept;
    if (dprobs != nullptr) {
      for (int e = 0; e < E; ++e) total += s[e];
      total += 1e-20;
      for (int e = 0; e < E; ++e) mean += dprobs[e] * (s[e] / total);
    }
    float* dz = dlogits + at(n, E);
    for (int e = 0; e < E; ++e) {
      double ds = 0;
      for (int k = 0; k < K; ++k) {
        if (chosen[k] == e) ds += normalize != 0 ? scale * (dw[k] - dot) / kept : scale * static_cast<double>(dw[k]);
      }
      if (dprobs != nullptr) ds += (dprobs[e] - mean) / total;
      dz[e] += static_cast<float>(ds * s[e] * (1.0 - s[e]));
    }
  }
}

__global__ void permute_kernel(float* y, const float* x, const int* rows, long n, int C) {
  for (long i = first_index(); i < n; i += grid_stride()) y[i] = x[at(rows[i / C], C) + i % C];
}

__global__ void permute_backward_kernel(float* dx, const float* dy, const int* slots, long n, int K, int C) {
  for (long i = first_index(); i < n; i += grid_stride()) {
    const long row = i / C, c = i % C;
    float d = dx[i];
    for (int k = 0; k < K; ++k) {
      const int m = slots[at(row, K) + k];
      if (m >= 0) d += dy[at(m, C) + c];
    }
    dx[i] = d;
  }
}

__global__ void combine_kernel(float* y, const float* x, const int* slots, const float* weights, long n, int K, int C) {
  for (long i = first_index(); i < n; i += grid_stride()) {
    const long row = i / C, c = i % C;
    float out = 0.0f;
    for (int k = 0; k < K; ++k) {
      const long s = at(row, K) + k;
      if (slots[s] >= 0) out = __fadd_rn(out, __fmul_rn(weights[s], x[at(slots[s], C) + c]));  // the reference's two roundings
    }
    y[i] = out;
  }
}

// dx over every copy's element (one writer each); dweights a thread per (token, choice).
__global__ void combine_backward_dx_kernel(float* dx, const float* dy, const int* slots, const float* weights, long n,
                                           int K, int C) {
  for (long i = first_index(); i < n; i += grid_stride()) {
    const long s = i / C, c = i % C;
    if (slots[s] < 0) continue;
    float* d = dx + at(slots[s], C) + c;
    *d = __fadd_rn(*d, __fmul_rn(weights[s], dy[at(s / K, C) + c]));
  }
}

__global__ void combine_backward_dweights_kernel(float* dweights, const float* dy, const float* x, const int* slots,
                                                 long n, int K, int C) {
  for (long s = first_index(); s < n; s += grid_stride()) {
    if (slots[s] < 0) continue;
    const float* g = dy + at(s / K, C);
    const float* from = x + at(slots[s], C);
    double dot = 0;
    for (int c = 0; c < C; ++c) dot += static_cast<double>(g[c]) * from[c];
    dweights[s] += static_cast<float>(dot);
  }
}

__device__ inline float sigmoid(float g) { return 1.0f / (1.0f + expf(-g)); }

__global__ void gated_add_kernel(float* y, const float* x, const float* gate, long n, int C) {
  for (long i = first_index(); i < n; i += grid_stride()) y[i] = __fadd_rn(y[i], __fmul_rn(sigmoid(gate[i / C]), x[i]));
}

__global__ void gated_add_backward_dx_kernel(float* dx, const float* dy, const float* gate, long n, int C) {
  for (long i = first_index(); i < n; i += grid_stride()) dx[i] = __fadd_rn(dx[i], __fmul_rn(sigmoid(gate[i / C]), dy[i]));
}

__global__ void gated_add_backward_dgate_kernel(float* dgate, const float* dy, const float* x, const float* gate, int N,
                                                int C) {
  for (long row = first_index(); row < N; row += grid_stride()) {
    const float s = sigmoid(gate[row]);
    double dot = 0;
    for (int c = 0; c < C; ++c) dot += static_cast<double>(dy[at(row, C) + c]) * x[at(row, C) + c];
    dgate[row] += static_cast<float>(static_cast<double>(s) * (1.0 - s) * dot);
  }
}

}  // namespace

namespace launch {

Status moe_router_forward(float* probs, float* weights, int* experts, const float* logits, int N, int E, int K,
                          int normalize, CudaStream stream) {
  router_forward_kernel<<<cuda::stride_blocks(N, kThreads), kThreads, 0, stream>>>(probs, weights, experts, logits, N, E,
                                                                                  K, normalize);
  return cuda::launched();
}

Status moe_router_backward(float* dlogits, const float* dweights, const float* dprobs, const float* probs,
                           const float* weights, const int* experts, int N, int E, int K, int normalize,
                           CudaStream stream) {
  router_backward_kernel<<<cuda::stride_blocks(N, kThreads), kThreads, 0, stream>>>(dlogits, dweights, dprobs, probs,
                                                                                   weights, experts, N, E, K, normalize);
  return cuda::launched();
}

Status moe_sigmoid_router_forward(float* scores, float* weights, int* experts, const float* logits, const float* bias,
                                  int N, int E, int K, int groups, int groups_chosen, int normalize, float scale,
                                  CudaStream stream) {
  sigmoid_router_forward_kernel<<<cuda::stride_blocks(N, kThreads), kThreads, 0, stream>>>(
      scores, weights, experts, logits, bias, N, E, K, groups, groups_chosen, normalize, scale);
  return cuda::launched();
}

Status moe_sigmoid_router_backward(float* dlogits, const float* dweights, const float* dprobs, const float* scores,
                                   const int* experts, int N, int E, int K, int normalize, float scale,
                                   CudaStream stream) {
  sigmoid_router_backward_kernel<<<cuda::stride_blocks(N, kThreads), kThreads, 0, stream>>>(
      dlogits, dweights, dprobs, scores, experts, N, E, K, normalize, scale);
  return cuda::launched();
}

Status moe_permute(float* y, const float* x, const int* rows, int M, int C, CudaStream stream) {
  const long n = static_cast<long>(M) * C;
  permute_kernel<<<cuda::stride_blocks(n, kThreads), kThreads, 0, stream>>>(y, x, rows, n, C);
  return cuda::launched();
}

Status moe_permute_backward(float* dx, const float* dy, const int* slots, int N, int K, int C, CudaStream stream) {
  const long n = static_cast<long>(N) * C;
  permute_backward_kernel<<<cuda::stride_blocks(n, kThreads), kThreads, 0, stream>>>(dx, dy, slots, n, K, C);
  return cuda::launched();
}

Status moe_combine(float* y, const float* x, const int* slots, const float* weights, int N, int K, int C,
                   CudaStream stream) {
  const long n = static_cast<long>(N) * C;
  combine_kernel<<<cuda::stride_blocks(n, kThreads), kThreads, 0, stream>>>(y, x, slots, weights, n, K, C);
  return cuda::launched();
}

Status moe_combine_backward(float* dx, float* dweights, const float* dy, const float* x, const int* slots,
                            const float* weights, int N, int K, int C, CudaStream stream) {
  const long copies = static_cast<long>(N) * K;
  if (dx != nullptr) {
    const long n = copies * C;
    combine_backward_dx_kernel<<<cuda::stride_blocks(n, kThreads), kThreads, 0, stream>>>(dx, dy, slots, weights, n, K, C);
    if (const Status s = cuda::launched(); s != Status::success) return s;
  }
  if (dweights != nullptr) {
    combine_backward_dweights_kernel<<<cuda::stride_blocks(copies, kThreads), kThreads, 0, stream>>>(dweights, dy, x,
                                                                                                    slots, copies, K, C);
  }
  return cuda::launched();
}

Status gated_add(float* y, const float* x, const float* gate, int N, int C, CudaStream stream) {
  const long n = static_cast<long>(N) * C;
  gated_add_kernel<<<cuda::stride_blocks(n, kThreads), kThreads, 0, stream>>>(y, x, gate, n, C);
  return cuda::launched();
}

Status gated_add_backward(float* dx, float* dgate, const float* dy, const float* x, const float* gate, int N, int C,
                          CudaStream stream) {
  const long n = static_cast<long>(N) * C;
  if (dx != nullptr) {
    gated_add_backward_dx_kernel<<<cuda::stride_blocks(n, kThreads), kThreads, 0, stream>>>(dx, dy, gate, n, C);
    if (const Status s = cuda::launched(); s != Status::success) return s;
  }
  if (dgate != nullptr) {
    gated_add_backward_dgate_kernel<<<cuda::stride_blocks(N, kThreads), kThreads, 0, stream>>>(dgate, dy, x, gate, N, C);
  }
  return cuda::launched();
}

}  // namespace launch

}  // namespace hetflow::kernels
