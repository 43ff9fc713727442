// Context parallelism in the decoder math (exec/decoder.hpp's ContextSplit): a rank's rows are
// two runs of each sequence, its queries meet the whole sequence's keys and values, gathered
// from the group, and the keys' and values' gradients go back to their ranks. The attention
// kernels take one sequence length for queries and keys, so the reference runs them over the
// whole sequence with the other ranks' query rows zero and drops those rows' outputs: exact
// (a query's output depends on its own row alone), at the group size times the work.
// Rotary positions likewise: this rank's rows are rotated in a whole-sequence buffer, where
// each row's position is its own.
#include <stdexcept>
#include <string>

#include "exec/decoder_detail.hpp"

namespace hetflow::exec::decoder_detail {

std::vector<ContextRun> context_runs(int S, int cp, int rank) {
  const int L = S / (2 * cp);
  return {{0, rank * L, L}, {L, (2 * cp - 1 - rank) * L, L}};
}

namespace {

// Rows [B, T, width] of context rank `rank` to (or from) their positions of [B, S, width].
void to_sequence(const Dims& d, float* whole, const float* rows, int rank, int width) {
  for (int b = 0; b < d.B; ++b) {
    for (const ContextRun& r : context_runs(d.S, d.cp, rank)) {
      d.ops.copy(whole + sz((1LL * b * d.S + r.position) * width), rows + sz((1LL * b * d.T + r.local) * width),
                 sz(1LL * r.length * width));
    }
  }
}
void from_sequence(const Dims& d, float* rows, const float* whole, int rank, int width) {
  for (int b = 0; b < d.B; ++b) {
    for (const ContextRun& r : context_runs(d.S, d.cp, rank)) {
      d.ops.copy(rows + sz((1LL * b * d.T + r.local) * width), whole + sz((1LL * b * d.S + r.position) * width),
                 sz(1LL * r.length * width));
    }
  }
}

TensorParallelGroup& group_of(const Dims& d) {
  if (d.cgroup == nullptr) throw std::invalid_argument("context parallelism needs the context group's exchange");
  return *d.cgroup;
}

// Rank-major parts of a staging buffer: rank r's rows of the keys, then of the values.
std::vector<size_t> kv_parts(const Dims& d) {
  std::vector<size_t> parts;
  for (int r = 0; r <= d.cp; ++r) parts.push_back(sz(2LL * r * d.N * d.KV));
  return parts;
}

// Every rank's keys and values (this rank's in k, v) at their positions of the whole sequence.
void gather_keys_values(const Dims& d, const Floats& k, const Floats& v, Floats& K, Floats& V) {
  const std::vector<size_t> parts = kv_parts(d);
  const size_t own = sz(1LL * d.N * d.KV);
  const Floats staged = d.ops.floats(parts.back());
  d.ops.copy(staged.data() + parts[sz(d.cp_rank)], k.data(), own);
  d.ops.copy(staged.data() + parts[sz(d.cp_rank)] + own, v.data(), own);
  group_of(d).all_gather(staged.span(), parts);
  K = d.ops.floats(sz(1LL * d.B * d.S * d.KV));
  V = d.ops.floats(K.size());
  for (int r = 0; r < d.cp; ++r) {
    to_sequence(d, K.data(), staged.data() + parts[sz(r)], r, d.KV);
    to_sequence(d, V.data(), staged.data() + parts[sz(r)] + own, r, d.KV);
  }
}

// Rotary positions of this rank's rows of x (`heads` wide), in place; `backward`: the inverse.
void rotate(const Dims& d, Floats& x, int heads, bool backward) {
  const int width = heads * d.HS;
  const Floats whole = d.ops.zeros(sz(1LL * d.B * d.S * width));
  to_sequence(d, whole.data(), x.data(), d.cp_rank, width);
  if (backward) {
    d.ops.rope_backward(whole.data(), d.B * d.S, d.S, heads, d.HS, d.rope);
  } else {
    d.ops.rope_forward(whole.data(), d.B * d.S, d.S, heads, d.HS, d.rope);
  }
  from_sequence(d, x.data(), whole.data(), d.cp_rank, width);
}

}  // namespace

std::vector<int> context_rows(const Dims& d, const int* whole) {
  std::vector<int> rows(sz(d.N));
  for (int b = 0; b < d.B; ++b) {
    for (const ContextRun& r : context_runs(d.S, d.cp, d.cp_rank)) {
      for (int i = 0; i < r.length; ++i) {
        rows[sz(1LL * b * d.T + r.local + i)] = whole[1LL * b * d.S + r.position + i];
      }
    }
  }
  return rows;
}

void context_attention_forward(const Dims& d, BlockActs& a, bool keep_probs) {
  const DecoderOps& ops = d.ops;
  if (!d.gpt) {
    rotate(d, a.q, d.NH, false);
    rotate(d, a.k, d.NKV, false);
  }
  Floats K, V;
  gather_keys_values(d, a.k, a.v, K, V);
  const Floats Q = ops.zeros(sz(1LL * d.B * d.S * d.QD)), out = ops.floats(Q.size());
  to_sequence(d, Q.data(), a.q.data(), d.cp_rank, d.QD);
  const Floats probs = ops.floats(sz(1LL * d.B * d.NH * d.S * d.S));
  ops.attention_forward(out.data(), probs.data(), Q.data(), K.data(), V.data(), d.B, d.S, d.NH, d.NKV, d.HS, d.window);
  a.att = ops.floats(sz(1LL * d.N * d.QD));
  from_sequence(d, a.att.data(), out.data(), d.cp_rank, d.QD);
  a.probs = keep_probs ? probs : Floats();
}

void context_attention_backward(const Dims& d, BlockActs& a, const Floats& datt, Floats& dq, Floats& dk, Floats& dv) {
  const DecoderOps& ops = d.ops;
  Floats K, V;
  gather_keys_values(d, a.k, a.v, K, V);
  const size_t whole_q = sz(1LL * d.B * d.S * d.QD), whole_kv = sz(1LL * d.B * d.S * d.KV);
  const Floats Q = ops.zeros(whole_q), dout = ops.zeros(whole_q);
  to_sequence(d, Q.data(), a.q.data(), d.cp_rank, d.QD);
  to_sequence(d, dout.data(), datt.data(), d.cp_rank, d.QD);
  if (a.probs.empty()) {  // selective recomputation: the probabilities again, from the keys just gathered
    a.probs = ops.floats(sz(1LL * d.B * d.NH * d.S * d.S));
    const Floats out = ops.floats(whole_q);
    ops.attention_forward(out.data(), a.probs.data(), Q.data(), K.data(), V.data(), d.B, d.S, d.NH, d.NKV, d.HS, d.window);
  }
  const Floats dQ = ops.zeros(whole_q), dK = ops.zeros(whole_kv), dV = ops.zeros(whole_kv);
  ops.attention_backward(dQ.data(), dK.data(), dV.data(), dout.data(), a.probs.data(), Q.data(), K.data(), V.data(), d.B,
                         d.S, d.NH, d.NKV, d.HS, d.window);
  from_sequence(d, dq.data(), dQ.data(), d.cp_rank, d.QD);
  // This rank's queries' part of every key's and value's gradient, summed over the group into
  // the rows of their ranks.
  const std::vector<size_t> parts = kv_parts(d);
  const size_t own = sz(1LL * d.N * d.KV);
  const Floats staged = ops.floats(parts.back());
  for (int r = 0; r < d.cp; ++r) {
    from_sequence(d, staged.data() + parts[sz(r)], dK.data(), r, d.KV);
    from_sequence(d, staged.data() + parts[sz(r)] + own, dV.data(), r, d.KV);
  }
  group_of(d).reduce_scatter(staged.span(), parts);
  ops.copy(dk.data(), staged.data() + parts[sz(d.cp_rank)], own);
  ops.copy(dv.data(), staged.data() + parts[sz(d.cp_rank)] + own, own);
  if (!d.gpt) {
    rotate(d, dq, d.NH, true);
    rotate(d, dk, d.NKV, true);
  }
}

void context_embedding_forward(const Dims& d, const ChunkParams& cp, const float* w, const int* tokens, float* x) {
  for (int b = 0; b < d.B; ++b) {
    for (const ContextRun& r : context_runs(d.S, d.cp, d.cp_rank)) {
      const long long row = 1LL * b * d.T + r.local;
      // Positions from the run's first: the table's rows from there, each run a "sequence".
      const float* wpe = cp.wpe == npos || (d.tp > 1 && d.rank != 0) ? nullptr : w + cp.wpe + sz(1LL * r.position * d.C);
      if (d.tp > 1) {
        d.ops.vocab_embedding_forward(x + sz(row * d.C), tokens + row, w + cp.wte, d.V0, d.V, wpe, r.length, r.length, d.C);
      } else {
        d.ops.embedding_forward(x + sz(row * d.C), tokens + row, w + cp.wte, wpe, r.length, r.length, d.C);
      }
    }
  }
}

void context_embedding_backward(const Dims& d, const ChunkParams& cp, float* g, const float* dx, const int* tokens) {
  for (int b = 0; b < d.B; ++b) {
    for (const ContextRun& r : context_runs(d.S, d.cp, d.cp_rank)) {
      const long long row = 1LL * b * d.T + r.local;
      float* dwpe = cp.wpe == npos ? nullptr : g + cp.wpe + sz(1LL * r.position * d.C);
      if (d.tp > 1) {
        d.ops.vocab_embedding_backward(g + cp.wte, dwpe, dx + sz(row * d.C), tokens + row, d.V0, d.V, r.length, r.length,
                                       d.C);
      } else {
        d.ops.embedding_backward(g + cp.wte, dwpe, dx + sz(row * d.C), tokens + row, r.length, r.length, d.C);
      }
    }
  }
}

}  // namespace hetflow::exec::decoder_detail
