#pragma once
// Inside exec/decoder*.cpp only: what the decoder math's files share (the sizes a pass sees,
// a block's and the head's activations, the stash), so that context parallelism's exchanges
// (decoder_context.cpp) sit beside the rest without making one file of them.
#include <array>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "exec/decoder.hpp"

namespace hetflow::exec {

namespace decoder_detail {

using Floats = OpsFloats;
constexpr size_t npos = BlockParams::npos;

inline const float* at(const float* base, size_t offset) { return offset == npos ? nullptr : base + offset; }
inline float* at(float* base, size_t offset) { return offset == npos ? nullptr : base + offset; }

// A weight gradient left for later: dw += dy^T x (and db += column sums of dy).
struct WeightGrad {
  size_t w = npos, b = npos;
  Floats dy;
  Floats x;  // shares the stash's array, or owns one gathered for it (sequence parallelism)
  int C = 0, OC = 0;
  int N = 0;                   // rows (an expert's: its copies')
  size_t dy_at = 0, x_at = 0;  // where the rows begin in dy and x (an expert's run)
};

// A mixture of experts' activations for one micro-batch (decoder_moe.cpp): of the N K copies
// of the tokens, M are kept (all but those past an expert's capacity).
struct MoeActs {
  Floats probs, weights;         // the router's softmax (or sigmoid scores) [N, E]; the chosen experts' weights [N, K]
  OpsInts experts, rows, slots;  // choices [N, K]; each copy's token [M]; each choice's copy [N, K]
  // (host) The copies' order: experts by holder (expert parallelism's rank), then index;
  // order[j]'s copies are [offsets[j], offsets[j + 1]), rank r's experts positions
  // [rank_begin[r], rank_begin[r + 1]).
  std::vector<int> order, offsets, rank_begin;
  // (host) What this rank's experts run on: held[j]'s rows of xe are [eoffsets[j], ..[j + 1]),
  // source s's recv_counts[s H + j] of them (H = held.size()) in source order. Without expert
  // parallelism held is order, eoffsets offsets, and xe is xp.
  std::vector<int> held, eoffsets, recv_counts;
  Floats dprobs;                 // [E] the load-balancing loss's gradient of each probability
  Floats xp;                     // [M, C] the copies, grouped by expert, tokens in order
  Floats xe;                     // [R, C] the copies this rank's experts run on
  Floats gate, up, act;          // [R, FE] each through its expert's SwiGLU
  Floats out;                    // [M, C] the experts' outputs for this rank's copies, which the combine weighs
  Floats shared_gate, shared_up, shared_act;  // [N, FS]
  Floats shared_out, scale;      // with Qwen2-MoE's gate: the shared output [N, C] and its logits [N]
  double balance = 0;            // (host) the layer's load-balancing loss, before its coefficient
  // (host) A sigmoid router's: each expert's load below the mean over this rank's tokens, in
  // units of 1/E (sum of counts - E count: whole numbers, so sums stay exact), which the
  // backward adds to its bias's gradient.
  std::vector<float> underload;
  // Every float array, for the stash's accounting and offload.
  template <class Self>
  static auto arrays(Self& m) {
    return std::array{&m.probs, &m.weights, &m.dprobs, &m.xp, &m.xe, &m.gate, &m.up, &m.act, &m.out, &m.shared_gate,
                      &m.shared_up, &m.shared_act, &m.shared_out, &m.scale};
  }
};

// One block's activations for one micro-batch. Under full recomputation only `x` survives the
// forward; the rest is rebuilt before the block's backward. Under sequence parallelism x, x2
// and the norms' arrays hold this rank's rows only.
struct BlockActs {
  Floats x;                 // input [N, C]
  Floats n1, mean1, rstd1;  // first norm
  Floats q, k, v;           // after QK-norm (Qwen3) and rotary positions (LLaMA)
  Floats q_in, k_in, q_rstd, k_rstd;  // QK-norm: the projections it normalised, per head 1/rms
  Floats probs;             // [B, NH, T, T]; dropped under selective recomputation
  Floats lse;               // ring attention, in place of probs: each query row's log-sum-exp [B, NH, T]
  Floats att;               // attention output before o_proj [N, C]
  Floats x2;                // after the attention residual
  Floats n2, mean2, rstd2;
  Floats up, gate, act;     // MLP: c_fc / up_proj (pre-activation), gate_proj, activation output
  MoeActs moe;              // in place of the MLP's on a mixture-of-experts layer
  bool complete = false;
};

struct HeadActs {
  Floats x, nf, mean, rstd;  // input, normalised
  Floats dlogits;            // [N, V]: the loss gradient, computed with the loss
  bool complete = false;
};

}  // namespace decoder_detail

struct DecoderChunk::Stash {
  using Floats = OpsFloats;
  using BlockActs = decoder_detail::BlockActs;
  using HeadActs = decoder_detail::HeadActs;
  using WeightGrad = decoder_detail::WeightGrad;
  int samples = 0;
  OpsInts tokens, targets;  // in the ops' memory
  float loss_scale = 0;
  std::vector<BlockActs> blocks;
  HeadActs head;
  std::vector<WeightGrad> deferred;  // split backward: the GEMMs backward_weight runs
  double balance_sum = 0;            // the forward's MoE layers' load-balancing losses, summed
  int balance_layers = 0;            // and how many
  Floats dembed;                     // split backward: the embedding's output gradient
  // Activation offload: each distinct array's floats while the stash is in host memory (its
  // arrays released), in the order array_handles first visits them; empty when it is not.
  std::vector<std::vector<float>> offloaded;
  std::vector<int> groups;  // per handle (array_handles' order): its array's index there, or -1
  bool on_host = false;
};


namespace decoder_detail {

inline size_t sz(long long n) { return static_cast<size_t>(n); }

// Sizes as this rank sees them: NH, NKV, F and V are its shares under tensor parallelism.
// Under sequence parallelism the residual stream is this rank's RS rows, from row R0.
struct Dims {
  int B, T, N, C, NH, NKV, HS, QD, KV, F, V, V0;
  float eps;
  kernels::RopeFrequencies rope;
  int window;  // sliding-window attention's keys per query; 0: every earlier key
  bool gpt;
  int tp, rank;
  TensorParallelGroup* group;
  const DecoderOps& ops;
  bool sp = false;
  int R0 = 0, RS = 0;
  std::vector<size_t> parts;  // float offsets of each rank's rows of an [N, C] array
  // Context parallelism (cp > 1): T is this rank's share of each sequence of S tokens, two
  // runs of S / 2cp (ContextSplit); cgroup exchanges keys and values with the group's ranks.
  // With `ring`, cgroup passes them around the group instead (ContextSplit::ring).
  int S = 0, cp = 1, cp_rank = 0;
  bool ring = false;
  TensorParallelGroup* cgroup = nullptr;
  const DecoderShape::Moe* moe = nullptr;  // the shape's mixture of experts
  int FE = 0, FS = 0;                      // its experts' columns on this rank (ChunkParams)
  const ExpertGroup* experts = nullptr;    // expert parallelism: this rank's group (size 1: none)
  TensorParallelGroup* egroup = nullptr;   // and its all-to-alls
  float loss_scale = 0;  // each token's weight in the objective (the load-balancing loss's too)

  size_t stream_floats() const { return sz(1LL * RS * C); }  // the residual stream's
  size_t whole_floats() const { return sz(1LL * N * C); }

  void all_reduce(const Floats& x, bool max = false) const {
    if (tp > 1) group->all_reduce(x.span(), max);
  }
  void all_reduce(float* x, size_t n) const {
    if (tp > 1) group->all_reduce(std::span<float>(x, n), false);
  }
  // Sequence parallelism's g: this rank's rows -> the whole [N, C] on every rank.
  Floats gather(const Floats& rows) const {
    Floats whole = ops.floats(whole_floats());
    ops.copy(whole.data() + parts[sz(rank)], rows.data(), stream_floats());
    group->all_gather(whole.span(), parts);
    return whole;
  }
  // Sequence parallelism's ḡ: every rank's addend of the whole -> the sum of this rank's rows.
  Floats scatter(const Floats& whole) const {
    group->reduce_scatter(whole.span(), parts);
    Floats rows = ops.floats(stream_floats());
    ops.copy(rows.data(), whole.data() + parts[sz(rank)], stream_floats());
    return rows;
  }
  // What a column-parallel layer reads: the whole of a norm's output.
  Floats whole(const Floats& rows) const { return sp ? gather(rows) : rows; }
  // A row-parallel layer's partial sums -> the residual stream's rows of their sum.
  Floats reduce(const Floats& whole) const {
    if (sp) return scatter(whole);
    all_reduce(whole);
    return whole;
  }
};

Dims dims_of(const DecoderShape& s, const ChunkParams& p, bool sequence_parallel, int samples,
             TensorParallelGroup* group, const DecoderOps& ops, ContextSplit context = {},
             TensorParallelGroup* context_group = nullptr, float loss_scale = 0);

// Weight gradients: now, or recorded for backward_weight.
class WeightGrads {
 public:
  WeightGrads(const DecoderOps& ops, float* grads, std::vector<WeightGrad>* deferred)
      : ops_(ops), grads_(grads), deferred_(deferred) {}
  // dw (db) += dy^T x over every token's row.
  void add(size_t w, size_t b, const Floats& dy, const Floats& x, int N, int C, int OC) {
    add_rows(w, b, dy, 0, x, 0, N, C, OC);
  }
  // Over `rows` rows from dy's float dy_at and x's float x_at (an expert's run of copies).
  void add_rows(size_t w, size_t b, const Floats& dy, size_t dy_at, const Floats& x, size_t x_at, int rows, int C,
                int OC) {
    if (deferred_ != nullptr) {
      deferred_->push_back({w, b, dy, x, C, OC, rows, dy_at, x_at});
    } else {
      ops_.linear_backward_weight(grads_ + w, at(grads_, b), dy.data() + dy_at, x.data() + x_at, rows, C, OC);
    }
  }
  // grads[at, at + n) += values (host), at once: a count, not a weight gradient to defer.
  void add_values(size_t at, const std::vector<float>& values) {
    const Floats v = ops_.floats(values.size());
    ops_.upload(v.data(), values.data(), values.size());
    ops_.residual_add(grads_ + at, v.data(), static_cast<long>(values.size()));
  }

 private:
  const DecoderOps& ops_;
  float* grads_;
  std::vector<WeightGrad>* deferred_;
};

// --- decoder_moe.cpp: mixtures of experts ---
// y [N, C] = the mixture's output for its normalised input x [N, C] (every token's rows).
void moe_forward(const Dims& d, const BlockParams& p, const float* w, MoeActs& a, const Floats& x, float* y);
// dx += the input's gradient from dy [N, C], the output's; the weights' gradients through wg.
void moe_backward(const Dims& d, const BlockParams& p, const float* w, MoeActs& a, const Floats& x, const Floats& dy,
                  float* dx, WeightGrads& wg);

// --- decoder_context.cpp: context parallelism ---
// One run of a context rank's rows of a sequence: `length` tokens from local row `local` of
// the sample, at position `position` of the sequence.
struct ContextRun {
  int local = 0, position = 0, length = 0;
};
// Context rank `rank`'s two runs (chunks rank and 2 cp - 1 - rank of 2 cp).
std::vector<ContextRun> context_runs(int S, int cp, int rank);
// This rank's tokens (or targets) of the micro-batch's whole sequences, in its row order.
std::vector<int> context_rows(const Dims& d, const int* whole);
// The attention of this rank's queries over the whole sequence: from a.q, a.k, a.v (this
// rank's rows, before their rotary positions) to a.att, with a.q and a.k rotated at their
// positions; the group's keys and values all-gathered (one exchange); a.probs the whole
// sequence's (unless `keep_probs` is false: selective recomputation). Under a ring (d.ring)
// block by block instead, C - 1 send_recvs, a.lse in place of a.probs.
void context_attention_forward(const Dims& d, BlockActs& a, bool keep_probs);
// Its backward: dq, dk, dv (this rank's rows, zeroed) get the gradients of a.q, a.k, a.v
// before their rotation; the keys and values all-gathered again and their gradients
// reduce-scattered to their ranks (two exchanges). Rebuilds a.probs when it is empty. Under
// a ring: C + 1 send_recvs, the blocks with their gradient sums (decoder_context.cpp).
void context_attention_backward(const Dims& d, BlockActs& a, const Floats& datt, Floats& dq, Floats& dk, Floats& dv);
// The token (and position) embedding of this rank's rows, forward and backward, run by run.
void context_embedding_forward(const Dims& d, const ChunkParams& cp, const float* w, const int* tokens, float* x);
void context_embedding_backward(const Dims& d, const ChunkParams& cp, float* g, const float* dx, const int* tokens);

}  // namespace decoder_detail

}  // namespace hetflow::exec
