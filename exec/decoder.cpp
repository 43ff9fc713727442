#include "exec/decoder.hpp"

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "exec/decoder_detail.hpp"
#include "model/error.hpp"
#include "partition/routing.hpp"

namespace hetflow::exec {

using namespace decoder_detail;

void DecoderChunk::StashDeleter::operator()(Stash* s) const { delete s; }

std::vector<float> TensorParallelGroup::all_to_all(std::span<const float>, std::span<const size_t>,
                                                   std::vector<size_t>&) {
  throw PlanError("this group exchanges no expert-parallel all-to-alls");
}

void TensorParallelGroup::send_recv(std::span<const float>, std::span<float>, const std::function<void()>&) {
  throw PlanError("this group passes nothing around a ring");
}

std::vector<int> ExpertGroup::holders(int experts) const {
  return placement.empty() ? partition::contiguous_placement(experts, size).rank_of : placement;
}

std::vector<int> ExpertGroup::held(int experts) const {
  std::vector<int> out;
  const std::vector<int> at = holders(experts);
  for (int e = 0; e < experts; ++e) {
    if (at[static_cast<size_t>(e)] == rank) out.push_back(e);
  }
  return out;
}

namespace {

// The experts an expert-parallel rank holds, checked against the shape; empty: every expert.
std::vector<int> held_experts(const DecoderShape& shape, const ExpertGroup& g) {
  if (g.size == 1) return {};
  const int E = shape.moe.E;
  const std::vector<int> at = g.holders(E);
  bool fits = g.rank >= 0 && g.rank < g.size && E > 0 && static_cast<int>(at.size()) == E;
  for (const int r : at) fits = fits && r >= 0 && r < g.size;
  if (!fits) {
    throw std::invalid_argument("expert rank " + std::to_string(g.rank) + " of " + std::to_string(g.size) +
                                " with a placement of " + std::to_string(at.size()) + " experts for a shape of " +
                                std::to_string(E));
  }
  return g.held(E);
}

}  // namespace

DecoderChunk::DecoderChunk(DecoderShape shape, int layer_begin, int layer_end, partition::Recompute recompute, int tp_rank,
                           int tp, const DecoderOps& ops, bool sequence_parallel, ContextSplit context,
                           ExpertGroup experts)
    : shape_(shape),
      params_(chunk_params(shape, layer_begin, layer_end, tp_rank, tp, held_experts(shape, experts))),
      recompute_(recompute),
      ops_(&ops),
      sequence_parallel_(sequence_parallel && tp > 1),
      context_(context),
      experts_(std::move(experts)) {
  if (context.size < 1 || context.rank < 0 || context.rank >= context.size ||
      (context.size > 1 && shape.S % (2 * context.size) != 0)) {
    throw std::invalid_argument("context rank " + std::to_string(context.rank) + " of " + std::to_string(context.size) +
                                " of sequences of " + std::to_string(shape.S) + " tokens: expected a rank of the group "
                                "and 2 x its size dividing the sequence");
  }
  for (const BlockParams& b : params_.blocks) {
    if (b.moe() && tp > 1 && experts_.size > 1) {  // (the plan gathers the copies over the tensor group: tp_calls.cpp)
      throw PlanError("a mixture-of-experts layer over tensor-parallel ranks in an expert group (the copies gathered "
                      "and scattered over the tensor group) is not run by the real layers: plan it without "
                      "--expert-parallel, or run it with --compute proxy");
    }
  }
}

Dims decoder_detail::dims_of(const DecoderShape& s, const ChunkParams& p, bool sequence_parallel, int samples,
                             TensorParallelGroup* group, const DecoderOps& ops, ContextSplit context,
                             TensorParallelGroup* context_group, float loss_scale) {
  const int T = s.S / context.size;  // this rank's tokens of each sequence
  Dims d{samples, T, samples * T, s.C, p.NH, p.NKV, s.HS, p.NH * s.HS, p.NKV * s.HS, p.F, p.V, p.V0,
         s.eps, s.rope, s.window, s.family == DecoderFamily::gpt2, p.tp, p.tp_rank, group, ops,
         /*sp=*/false, /*R0=*/0, /*RS=*/samples * T, /*parts=*/{}, s.S, context.size, context.rank, context.ring,
         context_group, &s.moe, p.FE, p.FS, /*experts=*/nullptr, /*egroup=*/nullptr, loss_scale};

  if (sequence_parallel && d.tp > 1) {
    if (d.N < d.tp) {
      throw std::invalid_argument("sequence parallelism over " + std::to_string(d.tp) + " ranks needs at least as many " +
                                  "tokens per micro-batch, not " + std::to_string(d.N));
    }
    d.sp = true;
    const auto row = [&](int r) { return static_cast<int>(1LL * d.N * r / d.tp); };
    d.R0 = row(d.rank);
    d.RS = row(d.rank + 1) - d.R0;
    for (int r = 0; r <= d.tp; ++r) d.parts.push_back(sz(1LL * row(r) * d.C));
  }
  return d;
}

namespace {

// A norm over the residual stream's rows.
void norm_forward(const Dims& d, Floats& y, Floats& mean, Floats& rstd, const Floats& x, const float* w, const float* b) {
  y = d.ops.floats(d.stream_floats());
  rstd = d.ops.floats(sz(d.RS));
  if (d.gpt) {
    mean = d.ops.floats(sz(d.RS));
    d.ops.layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w, b, d.RS, d.C, d.eps);
  } else {
    d.ops.rmsnorm_forward(y.data(), rstd.data(), x.data(), w, d.RS, d.C, d.eps);
  }
}

// dx += the norm's input gradient; dw (db) += its gains' gradients, which under sequence
// parallelism are this rank's rows' part until sum_norm_gains() adds the ranks'.
void norm_backward(const Dims& d, float* dx, float* dw, float* db, const float* dy, const Floats& x, const float* w,
                   const Floats& mean, const Floats& rstd) {
  if (d.gpt) {
    d.ops.layernorm_backward(dx, dw, db, dy, x.data(), w, mean.data(), rstd.data(), d.RS, d.C);
  } else {
    d.ops.rmsnorm_backward(dx, dw, dy, x.data(), w, rstd.data(), d.RS, d.C);
  }
}

// Gains every tensor-parallel rank holds whole but whose gradients each rank has only a part
// of, summed over the ranks in one all-reduce (Megatron sums them once a step, as here): the
// QK-norm gains (each rank saw its own heads) and, under sequence parallelism, the residual
// stream's norms (each rank saw its own rows).
void sum_replicated_gains(const Dims& d, const ChunkParams& cp, float* g) {
  std::vector<std::pair<size_t, size_t>> slots;  // offset, floats
  const auto add = [&slots](size_t s, int n) {
    if (s != npos) slots.emplace_back(s, sz(n));
  };
  for (const BlockParams& b : cp.blocks) {
    if (d.sp) {
      for (const size_t s : {b.norm1_w, b.norm1_b, b.norm2_w, b.norm2_b}) add(s, d.C);
    }
    add(b.q_norm_w, d.HS);
    add(b.k_norm_w, d.HS);
  }
  if (cp.has_head && d.sp) {
    for (const size_t s : {cp.final_norm_w, cp.final_norm_b}) add(s, d.C);
  }
  if (slots.empty()) return;
  size_t total = 0;
  for (const auto& [at, n] : slots) total += n;
  const Floats all = d.ops.floats(total);
  size_t k = 0;
  for (const auto& [at, n] : slots) d.ops.copy(all.data() + k, g + at, n), k += n;
  d.all_reduce(all);
  k = 0;
  for (const auto& [at, n] : slots) d.ops.copy(g + at, all.data() + k, n), k += n;
}

// Qwen3's QK-norm of one projection: `x` (rows of heads x HS) is normalised per head in place
// of what it held, which moves to `in`, with each head's 1/rms in `rstd`.
int head_rows(const Dims& d, int heads) {
  const long long rows = 1LL * d.N * heads;
  if (rows > std::numeric_limits<int>::max()) {
    throw std::invalid_argument("QK-norm over " + std::to_string(rows) + " heads of tokens: more than the kernels index");
  }
  return static_cast<int>(rows);
}

void qk_norm_forward(const Dims& d, Floats& x, Floats& in, Floats& rstd, const float* w, int heads) {
  const int rows = head_rows(d, heads);
  in = std::move(x);
  x = d.ops.floats(in.size());
  rstd = d.ops.floats(sz(rows));
  d.ops.rmsnorm_forward(x.data(), rstd.data(), in.data(), w, rows, d.HS, d.eps);
}

// dx: the gradient of the normalised projection -> the gradient of what was normalised; dw
// += the gain's gradient over this rank's heads.
void qk_norm_backward(const Dims& d, Floats& dx, float* dw, const Floats& in, const Floats& rstd, const float* w,
                      int heads) {
  const Floats d_in = d.ops.zeros(in.size());
  d.ops.rmsnorm_backward(d_in.data(), dw, dx.data(), in.data(), w, rstd.data(), head_rows(d, heads), d.HS);
  dx = d_in;
}

// A row-parallel MLP's output under sequence parallelism or an MoE's under tensor
// parallelism: this rank's part `y` of the whole [N, C] output summed over the ranks (the
// plan's reduce-scatter, or all-reduce without sequence parallelism) into `out` with the
// residual `x2` and the bias once; with `partial`, the addend the plan's collective sums.
void mlp_output(const Dims& d, const Floats& y, const Floats& x2, const float* bias, float* out, bool partial) {
  const DecoderOps& ops = d.ops;
  if (d.sp) {
    float* rows = out;
    if (partial) {  // the plan's reduce-scatter adds the ranks' addends: each adds its own rows
      ops.copy(out, y.data(), d.whole_floats());
      rows = out + d.parts[sz(d.rank)];
    } else {
      ops.copy(out, d.scatter(y).data(), d.stream_floats());
    }
    ops.bias_residual_add(rows, bias, x2.data(), d.RS, d.C);
    return;
  }
  ops.copy(out, y.data(), d.whole_floats());
  // With `partial`, the plan's all-reduce adds the ranks' parts: the residual and bias once.
  if (!partial) d.all_reduce(out, d.whole_floats());  // in place: the exchange copies what it sends
  if (!partial || d.rank == 0) ops.bias_residual_add(out, bias, x2.data(), d.N, d.C);
}

// The block's forward from a.x; writes the output (the residual stream's rows) to `out`, or,
// when `partial`, this rank's addend of the whole [N, C] output for the plan's collective:
// its last row-parallel partial sums, plus the residual and bias once (on rank 0, or under
// sequence parallelism on each rank's own rows).
void block_forward(const Dims& d, const BlockParams& p, const float* w, BlockActs& a, float* out, bool partial = false) {
  const DecoderOps& ops = d.ops;
  const bool split = d.tp > 1;  // biases after a row-parallel layer are added once, after the sum
  const size_t n = d.stream_floats(), nf = sz(1LL * d.N * d.F);
  norm_forward(d, a.n1, a.mean1, a.rstd1, a.x, at(w, p.norm1_w), at(w, p.norm1_b));
  const Floats n1 = d.whole(a.n1);
  a.q = ops.floats(sz(1LL * d.N * d.QD));
  a.k = ops.floats(sz(1LL * d.N * d.KV));
  a.v = ops.floats(sz(1LL * d.N * d.KV));
  ops.linear_forward(a.q.data(), n1.data(), w + p.q_w, at(w, p.q_b), d.N, d.C, d.QD);
  ops.linear_forward(a.k.data(), n1.data(), w + p.k_w, at(w, p.k_b), d.N, d.C, d.KV);
  ops.linear_forward(a.v.data(), n1.data(), w + p.v_w, at(w, p.v_b), d.N, d.C, d.KV);
  if (p.q_norm_w != npos) {
    qk_norm_forward(d, a.q, a.q_in, a.q_rstd, w + p.q_norm_w, d.NH);
    qk_norm_forward(d, a.k, a.k_in, a.k_rstd, w + p.k_norm_w, d.NKV);
  }
  if (d.cp > 1) {
    context_attention_forward(d, a, true);
  } else {
    if (!d.gpt) {
      ops.rope_forward(a.q.data(), d.N, d.T, d.NH, d.HS, d.rope);
      ops.rope_forward(a.k.data(), d.N, d.T, d.NKV, d.HS, d.rope);
    }
    a.att = ops.floats(sz(1LL * d.N * d.QD));
    a.probs = ops.floats(sz(1LL * d.B * d.NH * d.T * d.T));
    ops.attention_forward(a.att.data(), a.probs.data(), a.q.data(), a.k.data(), a.v.data(), d.B, d.T, d.NH, d.NKV,
                          d.HS, d.window);
  }
  const Floats o = ops.floats(d.whole_floats());
  ops.linear_forward(o.data(), a.att.data(), w + p.o_w, split ? nullptr : at(w, p.o_b), d.N, d.QD, d.C);
  a.x2 = d.reduce(o);
  ops.bias_residual_add(a.x2.data(), split ? at(w, p.o_b) : nullptr, a.x.data(), d.RS, d.C);
  norm_forward(d, a.n2, a.mean2, a.rstd2, a.x2, at(w, p.norm2_w), at(w, p.norm2_b));
  const Floats n2 = d.whole(a.n2);
  if (p.moe() && !split) {
    moe_forward(d, p, w, a.moe, n2, out);
    ops.bias_residual_add(out, nullptr, a.x2.data(), d.N, d.C);
    a.complete = true;
    return;
  }
  if (p.moe()) {  // every rank routes every token; its experts' columns give a part of each output
    const Floats y = ops.floats(d.whole_floats());
    moe_forward(d, p, w, a.moe, n2, y.data());
    mlp_output(d, y, a.x2, nullptr, out, partial);
    a.complete = true;
    return;
  }
  a.up = ops.floats(nf);
  a.act = ops.floats(nf);
  ops.linear_forward(a.up.data(), n2.data(), w + p.up_w, at(w, p.up_b), d.N, d.C, d.F);
  if (d.gpt) {
    ops.gelu_forward(a.act.data(), a.up.data(), static_cast<long>(nf));
  } else {
    a.gate = ops.floats(nf);
    ops.linear_forward(a.gate.data(), n2.data(), w + p.gate_w, nullptr, d.N, d.C, d.F);
    ops.swiglu_forward(a.act.data(), a.gate.data(), a.up.data(), static_cast<long>(nf));
  }
  if (d.sp) {
    const Floats y = ops.floats(d.whole_floats());
    ops.linear_forward(y.data(), a.act.data(), w + p.down_w, nullptr, d.N, d.F, d.C);
    mlp_output(d, y, a.x2, at(w, p.down_b), out, partial);
    a.complete = true;
    return;
  }
  ops.linear_forward(out, a.act.data(), w + p.down_w, split ? nullptr : at(w, p.down_b), d.N, d.F, d.C);
  // With `partial`, the plan's all-reduce adds the ranks' parts: the residual and bias once.
  if (!partial && split) d.all_reduce(out, n);  // in place: the exchange copies what it sends
  if (!partial || d.rank == 0) {
    ops.bias_residual_add(out, split ? at(w, p.down_b) : nullptr, a.x2.data(), d.N, d.C);  // (N = RS here)
  }
  a.complete = true;
}

// The block's backward: dy is the gradient of its output (the residual stream's rows); writes
// the gradient of its input into dx (overwritten, the same rows).
void block_backward(const Dims& d, const BlockParams& p, const float* w, float* g, BlockActs& a, const Floats& dy,
                    float* dx, WeightGrads& wg) {
  const DecoderOps& ops = d.ops;
  const size_t n = d.stream_floats(), nf = sz(1LL * d.N * d.F);
  // MLP: out = x2 + down(act)
  const Floats dout = d.whole(dy);
  const Floats dn2_whole = ops.zeros(d.whole_floats());
  const Floats n2 = d.whole(a.n2);  // gathered again, as Megatron does, rather than kept
  if (p.moe()) {
    moe_backward(d, p, w, a.moe, n2, dout, dn2_whole.data(), wg);
  } else {
    const Floats dact = ops.zeros(nf);
    ops.linear_backward_input(dact.data(), dout.data(), w + p.down_w, d.N, d.F, d.C);
    wg.add(p.down_w, p.down_b, dout, a.act, d.N, d.F, d.C);
    const Floats dup = ops.zeros(nf);
    if (d.gpt) {
      ops.gelu_backward(dup.data(), dact.data(), a.up.data(), static_cast<long>(nf));
    } else {
      const Floats dgate = ops.zeros(nf);
      ops.swiglu_backward(dgate.data(), dup.data(), dact.data(), a.gate.data(), a.up.data(), static_cast<long>(nf));
      ops.linear_backward_input(dn2_whole.data(), dgate.data(), w + p.gate_w, d.N, d.C, d.F);
      wg.add(p.gate_w, npos, dgate, n2, d.N, d.C, d.F);
    }
    ops.linear_backward_input(dn2_whole.data(), dup.data(), w + p.up_w, d.N, d.C, d.F);
    wg.add(p.up_w, p.up_b, dup, n2, d.N, d.C, d.F);
  }
  const Floats dn2 = d.reduce(dn2_whole);  // the column-parallel MLP's input gradient: a sum over the ranks
  const Floats dx2 = ops.floats(n);         // the residual
  ops.copy(dx2.data(), dy.data(), n);
  norm_backward(d, dx2.data(), g + p.norm2_w, at(g, p.norm2_b), dn2.data(), a.x2, w + p.norm2_w, a.mean2, a.rstd2);
  // Attention: x2 = x + o(attn(q, k, v))
  const Floats dx2_whole = d.whole(dx2);
  const Floats datt = ops.zeros(sz(1LL * d.N * d.QD));
  ops.linear_backward_input(datt.data(), dx2_whole.data(), w + p.o_w, d.N, d.QD, d.C);
  wg.add(p.o_w, p.o_b, dx2_whole, a.att, d.N, d.QD, d.C);
  Floats dq = ops.zeros(sz(1LL * d.N * d.QD)), dk = ops.zeros(sz(1LL * d.N * d.KV)), dv = ops.zeros(sz(1LL * d.N * d.KV));
  if (d.cp > 1) {
    context_attention_backward(d, a, datt, dq, dk, dv);
  } else {
    ops.attention_backward(dq.data(), dk.data(), dv.data(), datt.data(), a.probs.data(), a.q.data(), a.k.data(),
                           a.v.data(), d.B, d.T, d.NH, d.NKV, d.HS, d.window);
    if (!d.gpt) {
      ops.rope_backward(dq.data(), d.N, d.T, d.NH, d.HS, d.rope);
      ops.rope_backward(dk.data(), d.N, d.T, d.NKV, d.HS, d.rope);
    }
  }
  if (p.q_norm_w != npos) {
    qk_norm_backward(d, dq, g + p.q_norm_w, a.q_in, a.q_rstd, w + p.q_norm_w, d.NH);
    qk_norm_backward(d, dk, g + p.k_norm_w, a.k_in, a.k_rstd, w + p.k_norm_w, d.NKV);
  }
  const Floats dn1_whole = ops.zeros(d.whole_floats());
  ops.linear_backward_input(dn1_whole.data(), dq.data(), w + p.q_w, d.N, d.C, d.QD);
  ops.linear_backward_input(dn1_whole.data(), dk.data(), w + p.k_w, d.N, d.C, d.KV);
  ops.linear_backward_input(dn1_whole.data(), dv.data(), w + p.v_w, d.N, d.C, d.KV);
  const Floats n1 = d.whole(a.n1);
  wg.add(p.q_w, p.q_b, dq, n1, d.N, d.C, d.QD);
  wg.add(p.k_w, p.k_b, dk, n1, d.N, d.C, d.KV);
  wg.add(p.v_w, p.v_b, dv, n1, d.N, d.C, d.KV);
  const Floats dn1 = d.reduce(dn1_whole);
  ops.copy(dx, dx2.data(), n);
  norm_backward(d, dx, g + p.norm1_w, at(g, p.norm1_b), dn1.data(), a.x, w + p.norm1_w, a.mean1, a.rstd1);
}

// Cross-entropy over a vocabulary split across the ranks (Megatron's vocab-parallel loss):
// each row's maximum and sum of exponentials, and the target's logit from the rank that
// holds it, combined by all-reduces; then this rank's part of the loss gradient.
void parallel_crossentropy(const Dims& d, const Floats& logits, const int* targets, float scale, const Floats& dlogits,
                           double* loss_sum) {
  const Floats row_max = d.ops.floats(sz(d.N)), sums = d.ops.floats(2 * sz(d.N));  // sums: [sum of exp | target logit]
  d.ops.logits_row_max(row_max.data(), logits.data(), d.N, d.V);
  d.all_reduce(row_max, true);
  d.ops.logits_exp_sums(sums.data(), logits.data(), row_max.data(), targets, d.V0, d.N, d.V);
  d.all_reduce(sums);
  const double total = d.ops.vocab_crossentropy_backward(dlogits.data(), logits.data(), row_max.data(), sums.data(),
                                                         targets, d.V0, scale, d.N, d.V);
  if (loss_sum != nullptr) *loss_sum = total;
}

// targets: in the ops' memory. The head's input and norm are the residual stream's rows; the
// logits cover every token.
void head_forward(const Dims& d, const ChunkParams& cp, const float* w, HeadActs& h, const int* targets, float scale,
                  double* loss_sum) {
  norm_forward(d, h.nf, h.mean, h.rstd, h.x, w + cp.final_norm_w, at(w, cp.final_norm_b));
  const Floats nf = d.whole(h.nf);
  const Floats logits = d.ops.floats(sz(1LL * d.N * d.V));
  d.ops.linear_forward(logits.data(), nf.data(), w + cp.head_w, nullptr, d.N, d.C, d.V);
  h.dlogits = d.ops.floats(logits.size());
  if (d.tp > 1) {
    parallel_crossentropy(d, logits, targets, scale, h.dlogits, loss_sum);
  } else {
    // The loss and its gradient in one pass over the logits (each exponential taken once).
    const Floats losses = d.ops.floats(sz(d.N));
    d.ops.crossentropy_forward_backward(losses.data(), h.dlogits.data(), logits.data(), targets, scale, d.N, d.V);
    if (loss_sum != nullptr) *loss_sum = d.ops.sum(losses.data(), losses.size());
  }
  h.complete = true;
}

// The token embedding of this rank's vocabulary rows (zero for the others), positions
// added on rank 0: the ranks' outputs add up to the embedding (Megatron's vocab-parallel
// embedding).
void parallel_embedding_forward(const Dims& d, const ChunkParams& cp, const float* w, const int* tokens, float* x) {
  const float* wpe = d.rank == 0 ? at(w, cp.wpe) : nullptr;
  d.ops.vocab_embedding_forward(x, tokens, w + cp.wte, d.V0, d.V, wpe, d.N, d.T, d.C);
}

// Positions are replicated: every rank adds the same gradient.
void parallel_embedding_backward(const Dims& d, const ChunkParams& cp, float* g, const float* dx, const int* tokens) {
  d.ops.vocab_embedding_backward(g + cp.wte, at(g, cp.wpe), dx, tokens, d.V0, d.V, d.N, d.T, d.C);
}

void release(BlockActs& a) {
  Floats x = std::move(a.x);
  a = BlockActs{};
  a.x = std::move(x);
}

size_t floats_of(const BlockActs& a) {
  size_t n = 0;
  for (const Floats* f : {&a.x, &a.n1, &a.mean1, &a.rstd1, &a.q, &a.k, &a.v, &a.q_in, &a.k_in, &a.q_rstd, &a.k_rstd,
                          &a.probs, &a.lse, &a.att, &a.x2, &a.n2, &a.mean2, &a.rstd2, &a.up, &a.gate, &a.act}) {
    n += f->size();
  }
  for (const Floats* f : MoeActs::arrays(a.moe)) n += f->size();
  return n;
}

}  // namespace

size_t DecoderChunk::stash_floats(const Stash& s) {
  size_t n = s.head.x.size() + s.head.nf.size() + s.head.mean.size() + s.head.rstd.size() + s.head.dlogits.size() +
             s.dembed.size();
  for (const BlockActs& a : s.blocks) n += floats_of(a);
  for (const WeightGrad& g : s.deferred) n += g.dy.size() + g.x.size();  // (some shared with the blocks')
  return n;
}

namespace {

// Every float array handle of a stash, in a fixed order (token ids and targets are not
// visited: they stay where they are).
std::vector<Floats*> array_handles(DecoderChunk::Stash& s) {
  std::vector<Floats*> out{&s.head.x, &s.head.nf, &s.head.mean, &s.head.rstd, &s.head.dlogits, &s.dembed};
  for (BlockActs& a : s.blocks) {
    for (Floats* f : {&a.x, &a.n1, &a.mean1, &a.rstd1, &a.q, &a.k, &a.v, &a.q_in, &a.k_in, &a.q_rstd, &a.k_rstd,
                      &a.probs, &a.lse, &a.att, &a.x2, &a.n2, &a.mean2, &a.rstd2, &a.up, &a.gate, &a.act}) {
      out.push_back(f);
    }
    for (Floats* f : MoeActs::arrays(a.moe)) out.push_back(f);
  }
  for (WeightGrad& g : s.deferred) {
    out.push_back(&g.dy);
    out.push_back(&g.x);
  }
  return out;
}

// Handles that share an array (a split backward's deferred inputs share the blocks') get the
// same group, numbered in visiting order; -1 for an empty handle.
std::vector<int> array_groups(const std::vector<Floats*>& handles) {
  std::vector<int> group(handles.size(), -1);
  std::vector<const float*> seen;
  for (size_t i = 0; i < handles.size(); ++i) {
    if (handles[i]->empty()) continue;
    const auto at = std::find(seen.begin(), seen.end(), handles[i]->data());
    group[i] = static_cast<int>(at - seen.begin());
    if (at == seen.end()) seen.push_back(handles[i]->data());
  }
  return group;
}

}  // namespace

void DecoderChunk::stash_to_host(Stash& s, const DecoderOps& ops) {
  if (s.on_host) throw std::logic_error("the stash is in host memory already");
  const std::vector<Floats*> handles = array_handles(s);
  const std::vector<int> group = array_groups(handles);
  // Each distinct array once, the first time it is visited: its group's number is its place.
  for (size_t i = 0; i < handles.size(); ++i) {
    if (group[i] != static_cast<int>(s.offloaded.size())) continue;  // empty, or a group already copied
    s.offloaded.emplace_back(handles[i]->size());
    ops.download(s.offloaded.back().data(), handles[i]->data(), handles[i]->size());
  }
  s.groups = group;
  for (Floats* f : handles) *f = Floats();  // the device's arrays go
  s.on_host = true;
}

void DecoderChunk::stash_to_device(Stash& s, const DecoderOps& ops) {
  if (!s.on_host) throw std::logic_error("the stash is not in host memory");
  const std::vector<Floats*> handles = array_handles(s);
  std::vector<Floats> arrays;
  for (const std::vector<float>& host : s.offloaded) {
    arrays.push_back(ops.floats(host.size()));
    ops.upload(arrays.back().data(), host.data(), host.size());
  }
  for (size_t i = 0; i < handles.size(); ++i) {
    if (s.groups[i] >= 0) *handles[i] = arrays[static_cast<size_t>(s.groups[i])];
  }
  s.offloaded.clear();
  s.groups.clear();
  s.on_host = false;
}

bool DecoderChunk::stash_on_host(const Stash& s) { return s.on_host; }

std::pair<double, int> DecoderChunk::balance_loss(const Stash& s) { return {s.balance_sum, s.balance_layers}; }

DecoderChunk::StashPtr DecoderChunk::forward(const float* w, const Input& in, double& loss_sum) const {
  Dims d =
      dims_of(shape_, params_, sequence_parallel_, in.samples, in.group, *ops_, context_, in.context_group, in.loss_scale);
  d.experts = &experts_;
  d.egroup = in.expert_group;
  const DecoderOps& ops = *ops_;
  StashPtr s(new Stash);
  s->samples = in.samples;
  s->loss_scale = in.loss_scale;
  const size_t whole = d.whole_floats(), rows = d.stream_floats();
  const bool last_block_partial = in.output_partial && !params_.has_head;
  Floats x;  // the residual stream: this rank's rows under sequence parallelism
  if (params_.has_embedding) {
    s->tokens = d.cp > 1 ? ops.ints(context_rows(d, in.tokens).data(), sz(d.N)) : ops.ints(in.tokens, sz(d.N));
    x = ops.floats(whole);
    if (d.cp > 1) {
      context_embedding_forward(d, params_, w, s->tokens.data(), x.data());
      if (d.tp > 1 && !(in.output_partial && params_.blocks.empty())) x = d.reduce(x);
    } else if (d.tp > 1) {
      parallel_embedding_forward(d, params_, w, s->tokens.data(), x.data());
      if (!(in.output_partial && params_.blocks.empty())) x = d.reduce(x);
    } else {
      ops.embedding_forward(x.data(), s->tokens.data(), w + params_.wte, at(w, params_.wpe), d.N, d.T, d.C);
    }
  } else {
    x = ops.floats(rows);
    ops.copy(x.data(), in.input, rows);  // (this rank's rows of it under sequence parallelism)
  }
  s->blocks.resize(params_.blocks.size());
  for (size_t b = 0; b < params_.blocks.size(); ++b) {
    BlockActs& a = s->blocks[b];
    const bool partial = last_block_partial && b + 1 == params_.blocks.size();
    a.x = std::move(x);
    x = ops.floats(partial ? whole : rows);
    block_forward(d, params_.blocks[b], w, a, x.data(), partial);
    if (params_.blocks[b].moe()) {
      s->balance_sum += a.moe.balance;
      ++s->balance_layers;
    }
    if (recompute_ == partition::Recompute::full) {
      release(a);
    } else if (recompute_ == partition::Recompute::selective) {
      a.probs = Floats();
    }
  }
  loss_sum = 0;
  if (params_.has_head) {
    s->targets = d.cp > 1 ? ops.ints(context_rows(d, in.targets).data(), sz(d.N)) : ops.ints(in.targets, sz(d.N));
    s->head.x = std::move(x);
    head_forward(d, params_, w, s->head, s->targets.data(), in.loss_scale, &loss_sum);
    if (recompute_ == partition::Recompute::full) {
      Floats keep = std::move(s->head.x);
      s->head = HeadActs{};
      s->head.x = std::move(keep);
    }
  } else {
    // The whole, an addend of the plan's collective, or under sequence parallelism this
    // rank's rows; nowhere on a tensor-parallel rank whose output no one receives.
    if (in.output != nullptr) ops.copy(in.output, x.data(), x.size());
  }
  return s;
}

void DecoderChunk::backward(Stash& s, const float* w, float* g, const float* dout, float* dinput, bool split,
                            bool dinput_partial, TensorParallelGroup* group, bool last_of_step,
                            TensorParallelGroup* context_group, TensorParallelGroup* expert_group) const {
  if (s.on_host) throw std::logic_error("a backward's stash is in host memory: its copy back has not run");
  Dims d = dims_of(shape_, params_, sequence_parallel_, s.samples, group, *ops_, context_, context_group, s.loss_scale);
  d.experts = &experts_;
  d.egroup = expert_group;
  if (d.sp && dinput_partial) {
    throw std::invalid_argument("under sequence parallelism a backward writes its rows of the input gradient, not a "
                                "partial sum");
  }
  const DecoderOps& ops = *ops_;
  const size_t whole = d.whole_floats(), rows = d.stream_floats();
  s.deferred.clear();
  WeightGrads wg(ops, g, split ? &s.deferred : nullptr);
  Floats dy;  // the residual stream's gradient: this rank's rows under sequence parallelism
  if (params_.has_head) {
    HeadActs& h = s.head;
    if (!h.complete) head_forward(d, params_, w, h, s.targets.data(), s.loss_scale, nullptr);
    const Floats dnf = ops.zeros(whole);
    ops.linear_backward_input(dnf.data(), h.dlogits.data(), w + params_.head_w, d.N, d.C, d.V);
    wg.add(params_.head_w, npos, h.dlogits, d.whole(h.nf), d.N, d.C, d.V);
    h.dlogits = Floats();  // a deferred weight gradient keeps its own handle
    const Floats dnf_rows = d.reduce(dnf);  // the vocabulary-parallel head's input gradient
    dy = ops.zeros(rows);
    norm_backward(d, dy.data(), g + params_.final_norm_w, at(g, params_.final_norm_b), dnf_rows.data(), h.x,
                  w + params_.final_norm_w, h.mean, h.rstd);
  } else {
    dy = ops.floats(rows);
    ops.copy(dy.data(), dout, rows);  // (this rank's rows of it under sequence parallelism)
  }
  for (size_t b = s.blocks.size(); b-- > 0;) {
    BlockActs& a = s.blocks[b];
    if (!a.complete) {  // full recomputation: this layer's forward again, from its input
      const Floats out = ops.floats(rows);
      block_forward(d, params_.blocks[b], w, a, out.data());
    } else if (a.probs.empty() && d.cp == 1) {  // selective: the attention probabilities again (with context
                                                 // parallelism, in its backward: the keys come with it)
      a.probs = ops.floats(sz(1LL * d.B * d.NH * d.T * d.T));
      const Floats out = ops.floats(sz(1LL * d.N * d.QD));
      ops.attention_forward(out.data(), a.probs.data(), a.q.data(), a.k.data(), a.v.data(), d.B, d.T, d.NH, d.NKV,
                            d.HS, d.window);
    }
    Floats dx = ops.floats(rows);
    block_backward(d, params_.blocks[b], w, g, a, dy, dx.data(), wg);
    dy = std::move(dx);
    if (!split) release(a);  // its gradients are taken: only what a split W needs stays
  }
  if (params_.has_embedding) {
    const Floats dembed = d.whole(dy);
    if (split) {
      s.dembed = dembed;
    } else if (d.cp > 1) {
      context_embedding_backward(d, params_, g, dembed.data(), s.tokens.data());
    } else if (d.tp > 1) {
      parallel_embedding_backward(d, params_, g, dembed.data(), s.tokens.data());
    } else {
      ops.embedding_backward(g + params_.wte, at(g, params_.wpe), dembed.data(), s.tokens.data(), d.N, d.T, d.C);
    }
  } else if (dinput_partial && d.rank != 0) {
    ops.zero(dinput, whole);
  } else if (dinput != nullptr) {
    ops.copy(dinput, dy.data(), rows);  // the whole, or under sequence parallelism this rank's rows
  }
  if (d.tp > 1 && last_of_step) sum_replicated_gains(d, params_, g);
}

void DecoderChunk::backward_weight(Stash& s, float* g) const {
  if (s.on_host) throw std::logic_error("a weight gradient's stash is in host memory: its copy back has not run");
  const Dims d = dims_of(shape_, params_, false, s.samples, nullptr, *ops_, context_);  // (its exchanges are the passes')
  for (const WeightGrad& x : s.deferred) {
    ops_->linear_backward_weight(g + x.w, at(g, x.b), x.dy.data() + x.dy_at, x.x.data() + x.x_at, x.N, x.C, x.OC);
  }
  s.deferred.clear();
  if (!s.dembed.empty()) {
    if (d.cp > 1) {
      context_embedding_backward(d, params_, g, s.dembed.data(), s.tokens.data());
    } else if (d.tp > 1) {
      parallel_embedding_backward(d, params_, g, s.dembed.data(), s.tokens.data());
    } else {
      ops_->embedding_backward(g + params_.wte, at(g, params_.wpe), s.dembed.data(), s.tokens.data(), d.N, d.T, d.C);
    }
    s.dembed = Floats();
  }
}

}  // namespace hetflow::exec
