// Context parallelism in the decoder math (exec/decoder.hpp's ContextSplit): a rank's rows are
// two runs of each sequence, its queries meet the whole sequence's keys and values, gathered
// from the group, and the keys' and values' gradients go back to their ranks. The attention
// kernels take one sequence length for queries and keys, so the reference runs them over the
// whole sequence with the other ranks' query rows zero and drops those rows' outputs: exact
// (a query's output depends on its own row alone), at the group size times the work.
// Rotary positions likewise: this rank's rows are rotated in a whole-sequence buffer, where
// each row's position is its own.
//
// Under a ring (Dims::ring) no rank holds the whole sequence: its queries meet one rank's
// block of keys and values at a time (kernels/attention_block.hpp, merged by their
// log-sum-exps), while the group passes the blocks on, one send_recv a step, in the order
// partition/axis_context.cpp plans: the forward's C - 1 blocks; the backward's blocks again,
// each step's message also carrying the key and value gradient sums of the block the rank
// worked on in the step before, and a last hop that brings each block's sums home. The
// block kernels are CPU references, so the ring runs on host-addressable ops.
#include <algorithm>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>

#include "exec/decoder_detail.hpp"
#include "kernels/attention_block.hpp"
#include "model/error.hpp"

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

// Each row's position in its sequence, for rank `rank`'s rows of a sample (its two runs).
std::vector<int> positions_of(const Dims& d, int rank) {
  std::vector<int> out;
  for (const ContextRun& r : context_runs(d.S, d.cp, rank)) {
    for (int i = 0; i < r.length; ++i) out.push_back(r.position + i);
  }
  return out;
}

void require_host(const Dims& d) {
  if (!d.ops.host_addressable()) {
    throw PlanError("ring attention (layout.context_comm ring) runs its blocks on the CPU's ops, not on " +
                    d.ops.name() + ": plan it with --cp-comm allgather");
  }
}

// The ring's forward (the file's comment): a.att and a.lse from this rank's rotated a.q and
// every rank's block of a.k and a.v, its own first, then the previous rank's, and so on.
void ring_attention_forward(const Dims& d, BlockActs& a) {
  require_host(d);
  const DecoderOps& ops = d.ops;
  const size_t own = sz(1LL * d.N * d.KV);
  Floats held = ops.floats(2 * own), next = ops.floats(2 * own);
  ops.copy(held.data(), a.k.data(), own);
  ops.copy(held.data() + own, a.v.data(), own);
  a.att = ops.zeros(sz(1LL * d.N * d.QD));
  a.lse = ops.floats(sz(1LL * d.B * d.NH * d.T));
  std::fill(a.lse.data(), a.lse.data() + a.lse.size(), -std::numeric_limits<float>::infinity());
  const Floats out = ops.floats(a.att.size()), lse = ops.floats(a.lse.size());
  const std::vector<int> queries = positions_of(d, d.cp_rank);
  for (int step = 0; step < d.cp; ++step) {
    const std::vector<int> keys = positions_of(d, (d.cp_rank - step + d.cp) % d.cp);
    const auto attend = [&] {
      kernels::attention_block_forward(out.data(), lse.data(), a.q.data(), held.data(), held.data() + own,
                                       queries.data(), keys.data(), d.B, d.T, d.T, d.NH, d.NKV, d.HS, d.window);
      kernels::attention_block_merge(a.att.data(), a.lse.data(), out.data(), lse.data(), d.B, d.T, d.NH, d.HS);
    };
    if (step + 1 == d.cp) {
      attend();
      break;
    }
    group_of(d).send_recv(held.span(), next.span(), attend);  // this block on, the next one in
    std::swap(held, next);
  }
}

// The ring's backward: dq gathers this rank's queries' gradient block by block; each block's
// key and value gradients start at its owner and gain a rank's part a step, the sum of the
// step before travelling with the next block, and come home in the last hop (dk, dv).
void ring_attention_backward(const Dims& d, BlockActs& a, const Floats& datt, Floats& dq, Floats& dk, Floats& dv) {
  require_host(d);
  const DecoderOps& ops = d.ops;
  const size_t own = sz(1LL * d.N * d.KV);
  const Floats delta = ops.floats(sz(1LL * d.B * d.NH * d.T));
  kernels::attention_block_delta(delta.data(), datt.data(), a.att.data(), d.B, d.T, d.NH, d.HS);
  Floats held = ops.floats(2 * own);
  ops.copy(held.data(), a.k.data(), own);
  ops.copy(held.data() + own, a.v.data(), own);
  Floats sums;  // [dk, dv] of the block of the step before, this rank's part in
  const std::vector<int> queries = positions_of(d, d.cp_rank);
  for (int step = 0; step < d.cp; ++step) {
    const std::vector<int> keys = positions_of(d, (d.cp_rank - step + d.cp) % d.cp);
    const Floats part = ops.zeros(2 * own);
    const auto attend = [&] {
      kernels::attention_block_backward(dq.data(), part.data(), part.data() + own, datt.data(), a.lse.data(),
                                        delta.data(), a.q.data(), held.data(), held.data() + own, queries.data(),
                                        keys.data(), d.B, d.T, d.T, d.NH, d.NKV, d.HS, d.window);
    };
    // Out: the next step's block (but from the last step), then the sums of the step before
    // (but from the first); in: the same from the previous rank.
    const size_t block = step + 1 < d.cp ? 2 * own : 0, carried = step > 0 ? 2 * own : 0;
    const Floats out = ops.floats(block + carried), in = ops.floats(block + carried);
    ops.copy(out.data(), held.data(), block);
    if (carried > 0) ops.copy(out.data() + block, sums.data(), carried);
    group_of(d).send_recv(out.span(), in.span(), attend);
    // This block's sum so far: the previous ranks' parts (in), then this rank's.
    if (carried > 0) {
      const float* before = in.data() + block;
      for (size_t i = 0; i < 2 * own; ++i) part.data()[i] = before[i] + part.data()[i];
    }
    sums = part;
    if (block > 0) {
      held = ops.floats(2 * own);
      ops.copy(held.data(), in.data(), block);
    }
  }
  const Floats home = ops.floats(2 * own);
  group_of(d).send_recv(sums.span(), home.span(), {});
  ops.copy(dk.data(), home.data(), own);
  ops.copy(dv.data(), home.data() + own, own);
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
  if (d.ring) {
    ring_attention_forward(d, a);
    return;
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
  if (d.ring) {
    ring_attention_backward(d, a, datt, dq, dk, dv);
    if (!d.gpt) {
      rotate(d, dq, d.NH, true);
      rotate(d, dk, d.NKV, true);
    }
    return;
  }
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
