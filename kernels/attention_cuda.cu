// Causal grouped-query attention on the GPU (transformer_cuda.hpp) as tiled matrix products.
// Layouts as the reference: q, out [B,T,NH,HS]; k, v [B,T,NKV,HS]; probs [B,NH,T,T]. A sliding
// window W narrows query row t's keys to [first_key(t), t] = [t - W + 1, t].
//
// Forward, per (batch, head): S = scale Q K^T into probs (only the tiles holding some row's
// keys), the softmax of each row in place, then out = P V. Backward, a chunk of kv groups at a
// time: dP = dout V^T into scratch, dS = scale P (dP - D) row by row in place (D = sum P dP),
// then dq += dS K, dk += dS^T Q and dv += P^T dout, the last two summing the group's query
// heads in order. One kernel makes every product: a 64 x 64 output tile per block, staged
// through shared memory 32 deep, each thread summing a 4 x 4 block of outputs (read from shared
// memory four floats at a time) in a fixed order. It visits only the shared indices some row
// of the tile needs, and where a step holds a pair the mask excludes (a key after a query, or
// before its window) it multiplies that pair as zero rather than reading it into the sum: a
// masked key or value, even a non-finite one, never reaches an output. The scores of the
// diagonal tiles' masked pairs are computed and then overwritten by the softmax's zeros.
//
// Future work: a flash-style kernel fusing the softmax into the tiles and keeping no T x T
// probabilities, and 16-bit operands on the tensor cores for 16-bit plans.
#include "kernels/cuda_common.cuh"
#include "kernels/transformer_cuda_launch.hpp"

namespace hetflow::kernels {

namespace {

using cuda::block_max;
using cuda::block_sum;

// ---------------------------------------------------------------------------------------------
// Where things are.

struct Layout {
  int T, NH, NKV, HS;
  int window;  // 0: every earlier key
  __host__ __device__ int group() const { return NH / NKV; }
  __device__ int first_key(int t) const { return window > 0 && t - window + 1 > 0 ? t - window + 1 : 0; }
  __device__ int query_end(int j) const { return window > 0 && window < T - j ? j + window : T; }  // rows seeing key j
  __device__ bool sees(int t, int j) const { return j <= t && j >= first_key(t); }
  __device__ std::size_t query_row(int b, int t, int h) const {  // q, out, dout, dq
    return ((static_cast<std::size_t>(b) * T + t) * NH + h) * HS;
  }
  __device__ std::size_t key_row(int b, int t, int kvh) const {  // k, v, dk, dv
    return ((static_cast<std::size_t>(b) * T + t) * NKV + kvh) * HS;
  }
  __device__ long query_stride() const { return static_cast<long>(NH) * HS; }
  __device__ long key_stride() const { return static_cast<long>(NKV) * HS; }
  __host__ __device__ std::size_t square(long slice) const {  // (batch, head) slice b * NH + h of probs or dS
    return static_cast<std::size_t>(slice) * T * T;
  }
};

// A strided matrix: element (r, c) at p[r * rs + c * cs].
struct View {
  const float* p;
  long rs, cs;
  __device__ float at(long r, long c) const { return p[r * rs + c * cs]; }
};

// ---------------------------------------------------------------------------------------------
// The tiled product: C(m, n) = sum over segments s and shared indices k of A_s(m, k) B_s(k, n),
// for every slice z, handed to op.store. An op says:
//   slices, M, N, segments;  a(z, s), b(z, s): the views;
//   skip(m0, n0): the tile needs no output (every pair masked);
//   k_range(m0, &begin, &end): the shared indices rows [m0, m0 + kTile) need;
//   whole(m0, k0): every (row, k) pair of the step [k0, k0 + kDepth) counts;
//   counts(m, k): whether the pair counts (asked only where whole is false);
//   store(z, m, n, sum).
// kAContiguousInK: A's k index has stride 1 (else its m index has); kBContiguousInK likewise
// for B (else its n index has): the loads walk the contiguous index across threads.

constexpr int kTile = 64;
constexpr int kDepth = 32;  // a warp's loads along k read 128 contiguous bytes
constexpr int kTileThreads = 256;  // 16 x 16, each 4 x 4 outputs: rows 4 ty + i, columns 4 tx + j
constexpr int kPer = kTile / 16;
constexpr int kPadded = kTile + 4;  // a shared row: 16-byte aligned (stores along k: 4-way bank conflicts)
constexpr int kMaxSlicesPerLaunch = 65535;  // gridDim.z; a kernel loops over the rest

// Four consecutive floats of a shared row, in one 16-byte load.
__device__ inline void load4(float (&x)[kPer], const float* at) {
  const float4 v = *reinterpret_cast<const float4*>(at);
  x[0] = v.x, x[1] = v.y, x[2] = v.z, x[3] = v.w;
}

template <bool kAContiguousInK, bool kBContiguousInK, class Op>
__global__ void __launch_bounds__(kTileThreads, 2) tiled_product_kernel(Op op) {
  __shared__ __align__(16) float a_s[kDepth][kPadded];
  __shared__ __align__(16) float b_s[kDepth][kPadded];
  const int m0 = static_cast<int>(blockIdx.y) * kTile, n0 = static_cast<int>(blockIdx.x) * kTile;
  if (op.skip(m0, n0)) return;  // (the whole block: the test is the tile's)
  const int tid = static_cast<int>(threadIdx.x), tx = tid % 16, ty = tid / 16;
  int k_begin = 0, k_end = 0;
  op.k_range(m0, &k_begin, &k_end);

  for (long slice = blockIdx.z; slice < op.slices; slice += gridDim.z) {
    const int z = static_cast<int>(slice);
    float acc[kPer][kPer] = {};
    for (int s = 0; s < op.segments; ++s) {
      const View a = op.a(z, s), b = op.b(z, s);
      for (int k0 = k_begin; k0 < k_end; k0 += kDepth) {
        for (int e = tid; e < kTile * kDepth; e += kTileThreads) {
          const int ak = kAContiguousInK ? e % kDepth : e / kTile, am = kAContiguousInK ? e / kDepth : e % kTile;
          const int bk = kBContiguousInK ? e % kDepth : e / kTile, bn = kBContiguousInK ? e / kDepth : e % kTile;
          const bool k_in_a = k0 + ak < k_end, k_in_b = k0 + bk < k_end;
          a_s[ak][am] = k_in_a && m0 + am < op.M ? a.at(m0 + am, k0 + ak) : 0.0f;
          b_s[bk][bn] = k_in_b && n0 + bn < op.N ? b.at(k0 + bk, n0 + bn) : 0.0f;
        }
        __syncthreads();
        float x[kPer], y[kPer];
        if (op.whole(m0, k0)) {
#pragma unroll
          for (int kk = 0; kk < kDepth; ++kk) {
            load4(x, &a_s[kk][4 * ty]);
            load4(y, &b_s[kk][4 * tx]);
#pragma unroll
            for (int i = 0; i < kPer; ++i) {
#pragma unroll
              for (int j = 0; j < kPer; ++j) acc[i][j] += x[i] * y[j];
            }
          }
        } else {
          for (int kk = 0; kk < kDepth; ++kk) {
            load4(x, &a_s[kk][4 * ty]);
            load4(y, &b_s[kk][4 * tx]);
#pragma unroll
            for (int i = 0; i < kPer; ++i) {
              if (!op.counts(m0 + 4 * ty + i, k0 + kk)) continue;  // a masked pair adds nothing
#pragma unroll
              for (int j = 0; j < kPer; ++j) acc[i][j] += x[i] * y[j];
            }
          }
        }
        __syncthreads();
      }
    }
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int m = m0 + 4 * ty + i;
#pragma unroll
      for (int j = 0; j < kPer; ++j) {
        const int n = n0 + 4 * tx + j;
        if (m < op.M && n < op.N) op.store(z, m, n, acc[i][j]);
      }
    }
  }
}

template <bool kAContiguousInK, bool kBContiguousInK, class Op>
Status tiled_product(const Op& op, cudaStream_t stream) {
  if (op.slices == 0) return Status::success;
  const dim3 grid((op.N + kTile - 1) / kTile, (op.M + kTile - 1) / kTile,
                  op.slices < kMaxSlicesPerLaunch ? op.slices : kMaxSlicesPerLaunch);
  tiled_product_kernel<kAContiguousInK, kBContiguousInK><<<grid, kTileThreads, 0, stream>>>(op);
  return cuda::launched();
}

// ---------------------------------------------------------------------------------------------
// The products, by their masks. A slice z of `first + z` (batch, head) slices b * NH + h, or
// of kv groups b * NKV + kvh, as each op says.

// Scores: rows are queries t, columns keys j, k the head's dimension. A tile is skipped where
// every key comes after every query of it, or before the earliest query's window.
struct ScoresMask {
  Layout at;
  int M, N, segments = 1;
  __device__ bool skip(int m0, int n0) const { return n0 > m0 + kTile - 1 || n0 + kTile - 1 < at.first_key(m0); }
  __device__ void k_range(int, int* begin, int* end) const { *begin = 0, *end = at.HS; }
  __device__ bool whole(int, int) const { return true; }
  __device__ bool counts(int, int) const { return true; }
};

// Rows queries t, k keys j: the keys of rows [m0, m0 + kTile).
struct QueryRowsOverKeys {
  Layout at;
  int M, N, segments = 1;
  __device__ bool skip(int, int) const { return false; }
  __device__ void k_range(int m0, int* begin, int* end) const {
    *begin = at.first_key(m0);
    *end = m0 + kTile < at.T ? m0 + kTile : at.T;
  }
  __device__ bool whole(int m0, int k0) const {
    return k0 + kDepth - 1 <= m0 && k0 >= at.first_key(m0 + kTile - 1);
  }
  __device__ bool counts(int t, int j) const { return at.sees(t, j); }
};

// Rows keys j, k queries t: the queries that see keys [m0, m0 + kTile).
struct KeyRowsOverQueries {
  Layout at;
  int M, N, segments;
  __device__ bool skip(int, int) const { return false; }
  __device__ void k_range(int m0, int* begin, int* end) const {
    const int last = m0 + kTile - 1 < at.T - 1 ? m0 + kTile - 1 : at.T - 1;
    *begin = m0;
    *end = at.query_end(last);
  }
  __device__ bool whole(int m0, int k0) const {
    return k0 >= m0 + kTile - 1 && (at.window == 0 || k0 + kDepth - 1 - m0 <= at.window - 1);  // (no overflow)
  }
  __device__ bool counts(int j, int t) const { return at.sees(t, j); }
};

// S = scale Q K^T into probs (or dP = dout V^T into dS: then `queries` is dout, `keys` v).
// Slices are (batch, head) slices first + z; out's slice z holds slice first + z.
struct ScoresOp : ScoresMask {
  int slices;
  long first;
  const float* queries;
  const float* keys;
  float* out;
  float scale;
  __device__ int batch(int z) const { return static_cast<int>((first + z) / at.NH); }
  __device__ int head(int z) const { return static_cast<int>((first + z) % at.NH); }
  __device__ View a(int z, int) const {  // (t, d)
    return {queries + at.query_row(batch(z), 0, head(z)), at.query_stride(), 1};
  }
  __device__ View b(int z, int) const {  // (d, j)
    return {keys + at.key_row(batch(z), 0, head(z) / at.group()), 1, at.key_stride()};
  }
  __device__ void store(int z, int t, int j, float sum) const {
    out[at.square(z) + static_cast<std::size_t>(t) * at.T + j] = scale * sum;
  }
};

// out (=, or += with `accumulate`) = P V, or dq += dS K. P's slice z is slice first + z.
struct WeightedValuesOp : QueryRowsOverKeys {
  int slices;
  long first;
  const float* weights;  // P or dS, slice z at z
  const float* values;   // v or k
  float* out;            // out or dq
  bool accumulate;
  __device__ int batch(int z) const { return static_cast<int>((first + z) / at.NH); }
  __device__ int head(int z) const { return static_cast<int>((first + z) % at.NH); }
  __device__ View a(int z, int) const { return {weights + at.square(z), at.T, 1}; }  // (t, j)
  __device__ View b(int z, int) const {                                             // (j, d)
    return {values + at.key_row(batch(z), 0, head(z) / at.group()), at.key_stride(), 1};
  }
  __device__ void store(int z, int t, int d, float sum) const {
    float* o = out + at.query_row(batch(z), t, head(z)) + d;
    *o = accumulate ? *o + sum : sum;
  }
};

// dk += dS^T Q or dv += P^T dout: slices are kv groups first + z (b * NKV + kvh), segment s the
// group's query head kvh * group + s, whose dS or P is at weights' slice z * group + s.
struct KeyGradientOp : KeyRowsOverQueries {
  int slices;
  long first;
  const float* weights;  // dS or P
  const float* rows;     // q or dout
  float* grad;           // dk or dv
  __device__ int batch(int z) const { return static_cast<int>((first + z) / at.NKV); }
  __device__ int kv_head(int z) const { return static_cast<int>((first + z) % at.NKV); }
  __device__ View a(int z, int s) const {  // (j, t) of the slice's (t, j)
    return {weights + at.square(static_cast<long>(z) * at.group() + s), 1, at.T};
  }
  __device__ View b(int z, int s) const {  // (t, d)
    return {rows + at.query_row(batch(z), 0, kv_head(z) * at.group() + s), at.query_stride(), 1};
  }
  __device__ void store(int z, int j, int d, float sum) const {
    grad[at.key_row(batch(z), j, kv_head(z)) + d] += sum;
  }
};

// ---------------------------------------------------------------------------------------------
// Row by row, a block per row of `rows` (row r: slice r / T, query t = r % T), 128 threads.

constexpr int kRowThreads = 128;

// probs' row: the softmax of its scores over keys [first_key(t), t] in place (exponentials,
// fp32 sum, times 1/sum as the reference), zeros elsewhere.
__global__ void causal_softmax_kernel(float* probs, Layout at) {
  __shared__ float shared[32];
  const int t = static_cast<int>(blockIdx.x % at.T);
  float* row = probs + static_cast<std::size_t>(blockIdx.x) * at.T;
  const int lo = at.first_key(t);
  float local_max = -INFINITY;
  for (int j = lo + static_cast<int>(threadIdx.x); j <= t; j += kRowThreads) local_max = fmaxf(local_max, row[j]);
  const float m = block_max(local_max, shared);
  float local_sum = 0;
  for (int j = lo + static_cast<int>(threadIdx.x); j <= t; j += kRowThreads) {
    const float e = expf(row[j] - m);
    row[j] = e;
    local_sum += e;
  }
  const float inv = 1.0f / block_sum(local_sum, shared);  // (its barriers publish the exponentials)
  for (int j = static_cast<int>(threadIdx.x); j < at.T; j += kRowThreads) row[j] = at.sees(t, j) ? row[j] * inv : 0.0f;
}

// dS's row, holding dP: D = sum_j P dP over the row's keys, then dS = scale P (dP - D) there
// and zero elsewhere (dP's masked entries, never computed, are not read). Rows of slice z of
// ds are rows of probs' slice first + z.
__global__ void softmax_backward_kernel(float* ds, const float* probs, long first, Layout at, float scale) {
  __shared__ float shared[32];
  const int t = static_cast<int>(blockIdx.x % at.T);
  float* ds_row = ds + static_cast<std::size_t>(blockIdx.x) * at.T;
  const float* p_row = probs + at.square(first) + static_cast<std::size_t>(blockIdx.x) * at.T;
  const int lo = at.first_key(t);
  float local = 0;
  for (int j = lo + static_cast<int>(threadIdx.x); j <= t; j += kRowThreads) local += p_row[j] * ds_row[j];
  const float D = block_sum(local, shared);
  for (int j = static_cast<int>(threadIdx.x); j < at.T; j += kRowThreads) {
    ds_row[j] = at.sees(t, j) ? scale * p_row[j] * (ds_row[j] - D) : 0.0f;
  }
}

// 1/sqrt(HS) as the reference rounds it.
float attention_scale(int HS) { return static_cast<float>(1.0 / std::sqrt(static_cast<double>(HS))); }

unsigned int row_blocks(long slices, int T) { return static_cast<unsigned int>(slices * T); }

}  // namespace

namespace launch {

Status attention_forward(float* out, float* probs, const float* q, const float* k, const float* v, int B, int T, int NH,
                         int NKV, int HS, int window, CudaStream stream) {
  const Layout at{T, NH, NKV, HS, window};
  const int slices = B * NH;
  const ScoresOp scores{{at, T, T}, slices, 0, q, k, probs, attention_scale(HS)};
  if (const Status status = tiled_product<true, true>(scores, stream); status != Status::success) return status;
  causal_softmax_kernel<<<row_blocks(slices, T), kRowThreads, 0, stream>>>(probs, at);
  if (const Status status = cuda::launched(); status != Status::success) return status;
  const WeightedValuesOp values{{at, T, HS}, slices, 0, probs, v, out, /*accumulate=*/false};
  return tiled_product<true, false>(values, stream);
}

Status attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* probs, const float* q,
                          const float* k, const float* v, int B, int T, int NH, int NKV, int HS, int window,
                          CudaStream stream, std::size_t scratch_bytes) {
  const Layout at{T, NH, NKV, HS, window};
  const int group = at.group();
  const long groups = static_cast<long>(B) * NKV;
  const bool want_ds = dq != nullptr || dk != nullptr;
  // dS for as many kv groups as scratch_bytes holds (one group at least).
  const std::size_t group_bytes = sizeof(float) * static_cast<std::size_t>(group) * T * T;
  long chunk = static_cast<long>(scratch_bytes / group_bytes);
  chunk = chunk < 1 ? 1 : chunk > groups ? groups : chunk;
  cuda::Scratch scratch(stream);
  if (want_ds) {
    const Status status = scratch.allocate(group_bytes * static_cast<std::size_t>(chunk));
    if (status != Status::success) return status;
  }
  float* ds = want_ds ? scratch.at<float>(0) : nullptr;
  const float scale = attention_scale(HS);

  for (long first_group = 0; first_group < groups; first_group += chunk) {
    const long n = chunk < groups - first_group ? chunk : groups - first_group;
    const int slices = static_cast<int>(n * group), kv_slices = static_cast<int>(n);
    const long first = first_group * group;  // the chunk's first (batch, head) slice
    if (want_ds) {
      const ScoresOp dp{{at, T, T}, slices, first, dout, v, ds, /*scale=*/1.0f};
      if (const Status status = tiled_product<true, true>(dp, stream); status != Status::success) return status;
      softmax_backward_kernel<<<row_blocks(slices, T), kRowThreads, 0, stream>>>(ds, probs, first, at, scale);
      if (const Status status = cuda::launched(); status != Status::success) return status;
    }
    if (dq != nullptr) {
      const WeightedValuesOp grad_q{{at, T, HS}, slices, first, ds, k, dq, /*accumulate=*/true};
      if (const Status status = tiled_product<true, false>(grad_q, stream); status != Status::success) return status;
    }
    if (dk != nullptr) {
      const KeyGradientOp grad_k{{at, T, HS, group}, kv_slices, first_group, ds, q, dk};
      if (const Status status = tiled_product<false, false>(grad_k, stream); status != Status::success) return status;
    }
    if (dv != nullptr) {
      const KeyGradientOp grad_v{{at, T, HS, group}, kv_slices, first_group, probs + at.square(first), dout, dv};
      if (const Status status = tiled_product<false, false>(grad_v, stream); status != Status::success) return status;
    }
  }
  return Status::success;
}

}  // namespace launch

}  // namespace hetflow::kernels
