// Causal grouped-query attention on the GPU (transformer_cuda.hpp): the straightforward
// kernels, one block per query row (forward, and the backward's dq) or per key row (the
// backward's dk and dv), each reduction in a fixed order and no atomics. Layouts as the
// reference: q, out [B,T,NH,HS]; k, v [B,T,NKV,HS]; probs [B,NH,T,T]. A sliding window W
// narrows query row t's keys to [t - W + 1, t]; the loops visit only those.
//
// Future work: a flash-style kernel that tiles queries and keys through shared memory, fuses
// the softmax into the tiles and keeps no T x T probabilities; here every query row re-reads
// its keys from L2, and probs is both the saved softmax and the forward's scratch.
#include "kernels/cuda_common.cuh"
#include "kernels/transformer_cuda_launch.hpp"

namespace hetflow::kernels {

namespace {

using cuda::block_max;
using cuda::block_sum;
using cuda::warp_sum;

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;

// Where things are, for batch b.
struct Layout {
  int T, NH, NKV, HS;
  int window;  // 0: every earlier key
  __device__ int first_key(int t) const { return window > 0 && t - window + 1 > 0 ? t - window + 1 : 0; }
  __device__ int query_end(int j) const { return window > 0 && window < T - j ? j + window : T; }  // rows seeing key j
  __device__ std::size_t query_row(int b, int t, int h) const {  // q, out, dout, dq
    return ((static_cast<std::size_t>(b) * T + t) * NH + h) * HS;
  }
  __device__ std::size_t key_row(int b, int t, int kvh) const {  // k, v, dk, dv
    return ((static_cast<std::size_t>(b) * T + t) * NKV + kvh) * HS;
  }
  __device__ std::size_t key_stride() const { return static_cast<std::size_t>(NKV) * HS; }
  __device__ std::size_t probs_row(int b, int h, int t) const {
    return ((static_cast<std::size_t>(b) * NH + h) * T + t) * T;
  }
};

// The output's sums use groups of HS threads (at least one group), group g taking keys g,
// g + groups, ...: every thread busy when HS < kThreads, and a fixed order.
__host__ __device__ inline int output_groups(int HS) { return HS < kThreads ? kThreads / HS : 1; }

// Block (b, h, t), numbered (b * NH + h) * T + t. Scores for keys j in [lo, t] (lo = 0 without
// a window), a warp per key, into probs' row; the softmax in place (exponentials, fp32 sum,
// times 1/sum as the reference); zeros elsewhere in the row; then out[t] = sum_j p[j] v[j]. Dynamic shared memory: q's row
// (HS), then the output groups' sums (groups * HS).
__global__ void attention_forward_kernel(float* out, float* probs, const float* q, const float* k, const float* v,
                                         Layout at, float scale) {
  extern __shared__ float smem[];
  __shared__ float shared[32];
  const int T = at.T, HS = at.HS;
  const int t = static_cast<int>(blockIdx.x % T);
  const int bh = static_cast<int>(blockIdx.x / T);
  const int h = bh % at.NH, b = bh / at.NH;
  const int kvh = h / (at.NH / at.NKV);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const std::size_t ldk = at.key_stride();
  const float* k_head = k + at.key_row(b, 0, kvh);  // key j at k_head + j * ldk
  const float* v_head = v + at.key_row(b, 0, kvh);
  float* p_row = probs + at.probs_row(b, h, t);
  float* q_s = smem;
  float* partial = smem + HS;

  const float* q_row = q + at.query_row(b, t, h);
  for (int d = threadIdx.x; d < HS; d += blockDim.x) q_s[d] = q_row[d];
  __syncthreads();

  const int lo = at.first_key(t);
  float local_max = -INFINITY;
  for (int j = lo + warp; j <= t; j += kWarps) {
    const float* k_row = k_head + j * ldk;
    float dot = 0;
    for (int d = lane; d < HS; d += 32) dot += q_s[d] * k_row[d];
    const float score = scale * warp_sum(dot);
    if (lane == 0) p_row[j] = score;
    local_max = fmaxf(local_max, score);
  }
  const float m = block_max(local_max, shared);  // its barriers also publish the scores

  float local_sum = 0;
  for (int j = lo + static_cast<int>(threadIdx.x); j <= t; j += blockDim.x) {
    const float e = expf(p_row[j] - m);
    p_row[j] = e;
    local_sum += e;
  }
  const float inv = 1.0f / block_sum(local_sum, shared);
  for (int j = threadIdx.x; j < T; j += blockDim.x) p_row[j] = j >= lo && j <= t ? p_row[j] * inv : 0.0f;
  __syncthreads();

  const int groups = output_groups(HS);
  for (int idx = threadIdx.x; idx < groups * HS; idx += blockDim.x) {
    const int g = idx / HS, d = idx % HS;
    float sum = 0;
    for (int j = lo + g; j <= t; j += groups) sum += p_row[j] * v_head[j * ldk + d];
    partial[idx] = sum;
  }
  __syncthreads();
  float* out_row = out + at.query_row(b, t, h);
  for (int d = threadIdx.x; d < HS; d += blockDim.x) {
    float total = 0;
    for (int g = 0; g < groups; ++g) total += partial[g * HS + d];
    out_row[d] = total;
  }
}

// Backward, block (b, h, t) as the forward's. dp[j] = dout[t] . v[j] (a warp per key);
// D = sum_j p[j] dp[j], kept in D[block] for the key kernel; then dq[t] += sum_j ds[j] k[j]
// with ds[j] = scale p[j] (dp[j] - D), each warp summing its keys into its own row of shared
// memory, the warps added in order. Dynamic shared memory: dout's row (HS), then kWarps * HS.
__global__ void attention_backward_query_kernel(float* dq, float* D, const float* dout, const float* probs,
                                                const float* k, const float* v, Layout at, float scale) {
  extern __shared__ float smem[];
  __shared__ float shared[32];
  const int T = at.T, HS = at.HS;
  const int t = static_cast<int>(blockIdx.x % T);
  const int bh = static_cast<int>(blockIdx.x / T);
  const int h = bh % at.NH, b = bh / at.NH;
  const int kvh = h / (at.NH / at.NKV);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const std::size_t ldk = at.key_stride();
  const float* k_head = k + at.key_row(b, 0, kvh);
  const float* v_head = v + at.key_row(b, 0, kvh);
  const float* p_row = probs + at.probs_row(b, h, t);
  float* do_s = smem;
  float* acc = smem + HS + warp * HS;

  const float* do_row = dout + at.query_row(b, t, h);
  for (int d = threadIdx.x; d < HS; d += blockDim.x) do_s[d] = do_row[d];
  for (int d = lane; d < HS; d += 32) acc[d] = 0.0f;
  __syncthreads();

  const int lo = at.first_key(t);
  float local = 0;  // the same in every lane of a warp
  for (int j = lo + warp; j <= t; j += kWarps) {
    const float* v_row = v_head + j * ldk;
    float dot = 0;
    for (int d = lane; d < HS; d += 32) dot += do_s[d] * v_row[d];
    local += p_row[j] * warp_sum(dot);
  }
  const float Dt = block_sum(lane == 0 ? local : 0.0f, shared);
  if (D != nullptr && threadIdx.x == 0) D[blockIdx.x] = Dt;
  if (dq == nullptr) return;  // the whole block: only D was wanted

  for (int j = lo + warp; j <= t; j += kWarps) {
    const float* v_row = v_head + j * ldk;
    float dot = 0;
    for (int d = lane; d < HS; d += 32) dot += do_s[d] * v_row[d];
    const float ds = scale * p_row[j] * (warp_sum(dot) - Dt);
    const float* k_row = k_head + j * ldk;
    for (int d = lane; d < HS; d += 32) acc[d] += ds * k_row[d];
  }
  __syncthreads();
  float* dq_row = dq + at.query_row(b, t, h);
  for (int d = threadIdx.x; d < HS; d += blockDim.x) {
    float total = 0;
    for (int w = 0; w < kWarps; ++w) total += smem[HS + w * HS + d];
    dq_row[d] += total;
  }
}

// Backward, block (b, kvh, j) numbered (b * NKV + kvh) * T + j: key row j of kv head kvh,
// seen by the group's query heads at rows t in [j, j + W) (every t >= j without a window). dv[j] += sum p[t][j] dout[t]; dk[j] +=
// sum ds[t][j] q[t], ds recomputed as the query kernel does (the same dot products, bitwise)
// from its D. The (head, row) pairs are dealt to warps in order, each warp summing into its
// own shared rows, the warps added in order. Dynamic shared memory: v's row (HS), then
// kWarps * HS for dk, then kWarps * HS for dv.
__global__ void attention_backward_key_kernel(float* dk, float* dv, const float* D, const float* dout,
                                              const float* probs, const float* q, const float* v, Layout at,
                                              float scale) {
  extern __shared__ float smem[];
  const int T = at.T, HS = at.HS;
  const int j = static_cast<int>(blockIdx.x % T);
  const int bk = static_cast<int>(blockIdx.x / T);
  const int kvh = bk % at.NKV, b = bk / at.NKV;
  const int group = at.NH / at.NKV;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  float* v_s = smem;
  float* acc_k = smem + HS + warp * HS;
  float* acc_v = smem + HS + kWarps * HS + warp * HS;

  const float* v_row = v + at.key_row(b, j, kvh);
  for (int d = threadIdx.x; d < HS; d += blockDim.x) v_s[d] = v_row[d];
  for (int d = lane; d < HS; d += 32) acc_k[d] = acc_v[d] = 0.0f;
  __syncthreads();

  const int rows = at.query_end(j) - j;
  const long pairs = static_cast<long>(group) * rows;
  for (long pair = warp; pair < pairs; pair += kWarps) {
    const int h = kvh * group + static_cast<int>(pair / rows);
    const int t = j + static_cast<int>(pair % rows);
    const float p = probs[at.probs_row(b, h, t) + j];
    const float* do_row = dout + at.query_row(b, t, h);
    if (dv != nullptr) {
      for (int d = lane; d < HS; d += 32) acc_v[d] += p * do_row[d];
    }
    if (dk != nullptr) {
      float dot = 0;
      for (int d = lane; d < HS; d += 32) dot += do_row[d] * v_s[d];
      const float ds = scale * p * (warp_sum(dot) - D[(static_cast<std::size_t>(b) * at.NH + h) * T + t]);
      const float* q_row = q + at.query_row(b, t, h);
      for (int d = lane; d < HS; d += 32) acc_k[d] += ds * q_row[d];
    }
  }
  __syncthreads();
  const std::size_t out_row = at.key_row(b, j, kvh);
  for (int d = threadIdx.x; d < HS; d += blockDim.x) {
    if (dk != nullptr) {
      float total = 0;
      for (int w = 0; w < kWarps; ++w) total += smem[HS + w * HS + d];
      dk[out_row + d] += total;
    }
    if (dv != nullptr) {
      float total = 0;
      for (int w = 0; w < kWarps; ++w) total += smem[HS + kWarps * HS + w * HS + d];
      dv[out_row + d] += total;
    }
  }
}

// 1/sqrt(HS) as the reference rounds it.
float attention_scale(int HS) { return static_cast<float>(1.0 / std::sqrt(static_cast<double>(HS))); }

}  // namespace

namespace launch {

Status attention_forward(float* out, float* probs, const float* q, const float* k, const float* v, int B, int T, int NH,
                         int NKV, int HS, int window, CudaStream stream) {
  const Layout at{T, NH, NKV, HS, window};
  const std::size_t smem = sizeof(float) * static_cast<std::size_t>(HS) * (1 + output_groups(HS));
  attention_forward_kernel<<<B * NH * T, kThreads, smem, stream>>>(out, probs, q, k, v, at, attention_scale(HS));
  return cuda::launched();
}

Status attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* probs, const float* q,
                          const float* k, const float* v, int B, int T, int NH, int NKV, int HS, int window,
                          CudaStream stream) {
  const Layout at{T, NH, NKV, HS, window};
  const float scale = attention_scale(HS);
  cuda::Scratch scratch(stream);
  float* D = nullptr;
  if (dk != nullptr) {  // the key kernel reads the query kernel's D
    const Status status = scratch.allocate(sizeof(float) * static_cast<std::size_t>(B) * NH * T);
    if (status != Status::success) return status;
    D = scratch.at<float>(0);
  }
  if (dq != nullptr || dk != nullptr) {
    const std::size_t smem = sizeof(float) * static_cast<std::size_t>(HS) * (1 + kWarps);
    attention_backward_query_kernel<<<B * NH * T, kThreads, smem, stream>>>(dq, D, dout, probs, k, v, at, scale);
    if (const Status status = cuda::launched(); status != Status::success) return status;
  }
  if (dk != nullptr || dv != nullptr) {
    const std::size_t smem = sizeof(float) * static_cast<std::size_t>(HS) * (1 + 2 * kWarps);
    attention_backward_key_kernel<<<B * NKV * T, kThreads, smem, stream>>>(dk, dv, D, dout, probs, q, v, at, scale);
    if (const Status status = cuda::launched(); status != Status::success) return status;
  }
  return Status::success;
}

}  // namespace launch

}  // namespace hetflow::kernels
