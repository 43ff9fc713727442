#pragma once
// The real training math of one chunk of a decoder transformer (exec/decoder_params.hpp) for
// one micro-batch: forward, backward, and the weight-gradient half of a split backward, in
// FP32, on the kernels of a DecoderOps (exec/decoder_ops.hpp): the CPU reference kernels
// (kernels/transformer.hpp) by default, or the CUDA ones. Parameters, gradients, activations
// and the stash are that ops' memory; only token ids and targets come from the host.
//
// What it promises:
//  - GPT-2 blocks: x + attn(LN(x)), then + MLP(LN(.)) with GELU (tanh); LLaMA blocks the same
//    with RMSNorm, rotary q/k (rotate-half), grouped-query attention and SwiGLU, and what
//    Mistral, Qwen2 and Qwen3 add (a sliding window, attention biases, heads wider than
//    hidden / heads, q and k RMS-normalised per head before the rotation). Causal attention
//    scaled by 1/sqrt(head size), no dropout. The head normalises, multiplies by
//    the head matrix (the tied embedding or lm_head) and takes the cross-entropy of every
//    token, each weighted by `loss_scale` (1 / tokens of the global batch, so gradients added
//    over micro-batches and workers are the gradient of the global mean loss).
//  - Mixtures of experts (DecoderShape::Moe) in place of a block's MLP: a softmax router's
//    top k (renormalised or not), each expert's SwiGLU on the tokens that chose it, the
//    weighted sum (past an expert's capacity, where the shape has one, the copies of the
//    smallest weights dropped), shared experts (gated, Qwen2-MoE) beside; Megatron-Core's load-balancing
//    loss of each MoE layer adds its gradient, each micro-batch's weighted by loss_scale
//    times its tokens (so every chunk takes Input::loss_scale). Not under tensor or context
//    parallelism (refused). Under expert parallelism (ExpertGroup) the chunk holds its rank's
//    experts: each MoE layer sends every copy to its expert's holder and takes the results
//    back through the group's all-to-alls (two a layer forward, two backward), and runs its
//    experts on every rank's copies.
//  - Recomputation really recomputes: `selective` drops the attention probabilities after
//    the forward and rebuilds them in the backward; `full` keeps only each layer's input and
//    reruns that layer's forward just before its backward.
//  - backward() accumulates (+=) weight gradients into `grads` (the chunk's flat gradient
//    array, same layout as the parameters). With split = true it computes only what the
//    input gradient needs and leaves the weight-gradient GEMMs (and the embedding's scatter)
//    for backward_weight(), zero-bubble style: the results are the same.
//  - Tensor parallelism as Megatron splits it (rank r of t holds r's heads, MLP columns and
//    vocabulary rows): the ranks all-reduce after each row-parallel layer and combine the
//    vocabulary-parallel loss through a TensorParallelGroup; replicated parameters (norms,
//    biases after a reduction, position embeddings) get the same gradients on every rank,
//    except the QK-norm gains, whose gradients each rank has for its own heads: the step's
//    last backward sums them over the ranks (backward's last_of_step).
//  - Sequence parallelism (Korthikanti et al., with tp > 1): the residual stream, the norms
//    and the residual adds of a rank cover only its rows of the micro-batch ([N·r/t,
//    N·(r+1)/t) of the N = samples·S tokens), and so does what the stash keeps of them; an
//    all-gather of the normalised rows precedes each column-parallel layer and a
//    reduce-scatter replaces the all-reduce after each row-parallel one (the backward
//    mirrors them and gathers the norm outputs again for the weight gradients, as Megatron
//    does). The norm gains' gradients then cover each rank's rows: the step's last backward
//    sums them over the ranks in one all-reduce (backward's last_of_step). A chunk's input,
//    its gradient, the output's gradient and an output that is not a partial sum are the
//    rank's rows (its sequence shard of the boundary); a partial output is whole, each
//    rank's residual rows where they belong, for the plan's reduce-scatter.
//  - Context parallelism (ContextSplit): a rank's rows are its two chunks of each sequence;
//    positions (learned or rotary) are the tokens' own, and each attention layer meets the
//    whole sequence's keys and values, all-gathered over the context group, and sends their
//    gradients back by a reduce-scatter; the group's gradients are summed by the data-parallel
//    exchange. The reference computes the attention over the whole sequence with the other
//    ranks' queries zero (their outputs dropped), which costs the context size times the
//    attention's work and keeps the whole sequence's probabilities: the math, not the cost.
//  - Deterministic: the same inputs give bitwise the same outputs (where the ops' kernels are).
#include <functional>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "exec/decoder_ops.hpp"
#include "exec/decoder_params.hpp"
#include "partition/layout.hpp"

namespace hetflow::exec {

// How the tensor-parallel ranks of a chunk combine floats between sublayers (Megatron's
// all-reduces after each row-parallel layer, the vocabulary-parallel loss's maximum and
// sums; under sequence parallelism the all-gathers and reduce-scatters that replace them).
// Every rank calls it in the same order with the same sizes; all get the same bits back.
// `data` is the chunk's DecoderOps' memory. `parts` (one more than the ranks) are float
// offsets into `data`: rank r's part is [parts[r], parts[r + 1]), parts may differ in size.
class TensorParallelGroup {
 public:
  virtual ~TensorParallelGroup() = default;
  virtual void all_reduce(std::span<float> data, bool max) = 0;
  // On entry this rank's part holds its values; on return every part holds its rank's.
  virtual void all_gather(std::span<float> data, std::span<const size_t> parts) = 0;
  // On entry `data` is this rank's addend of the whole; on return this rank's part holds the
  // ranks' sum there and the rest is unspecified. (The CPU back end adds in rank order, as its
  // all_reduce does, so the bits match; NCCL's orders are its own.)
  virtual void reduce_scatter(std::span<float> data, std::span<const size_t> parts) = 0;
  // Expert parallelism's dispatch and combine, in host memory, of sizes only the router knows:
  // this rank sends rank r the floats [send_parts[r], send_parts[r + 1]) of `send`; returns
  // what every rank sent this one, rank after rank, `recv_parts` (one more than the ranks)
  // their offsets. A group without it throws PlanError.
  virtual std::vector<float> all_to_all(std::span<const float> send, std::span<const size_t> send_parts,
                                        std::vector<size_t>& recv_parts);
  // One step of a ring (context parallelism's ring attention): `send` to the next rank of the
  // group, `receive` (its size) from the previous one, with `meanwhile` run while they are
  // in flight. A group without it throws PlanError.
  virtual void send_recv(std::span<const float> send, std::span<float> receive, const std::function<void()>& meanwhile);
};

// Context parallelism (partition::Layout's context axis): rank `rank` of a group of `size`
// computes two of each sequence's 2 size equal chunks, `rank` and 2 size - 1 - rank (which
// balances causal attention), all-gathering the group's keys and values for its attention
// and reduce-scattering their gradients back; or, with `ring` (partition::ContextComm::ring),
// passing them around the group block by block (send_recv), the attention by blocks.
struct ContextSplit {
  int size = 1;
  int rank = 0;
  bool ring = false;
};

// Expert parallelism (partition::Layout's experts): rank `rank` of a group of `size` holds the
// routed experts e with placement[e] == rank (placement empty: E / size consecutive experts a
// rank) and runs them on every member's copies routed to them, which the group's all-to-alls
// bring (the dispatch) and take back (the combine); the rest of the chunk is the rank's own.
struct ExpertGroup {
  int size = 1;
  int rank = 0;
  std::vector<int> placement;
  // The holder of each of `experts` experts, and the experts `rank` holds, ascending.
  std::vector<int> holders(int experts) const;
  std::vector<int> held(int experts) const;
};

class DecoderChunk {
 public:
  // Rank tp_rank of a tp-way tensor-parallel split (exec/decoder_params.hpp's shares), on
  // `ops` (kept by reference: it outlives the chunk and its stashes); `context` its rank in a
  // context group.
  DecoderChunk(DecoderShape shape, int layer_begin, int layer_end, partition::Recompute recompute, int tp_rank = 0,
               int tp = 1, const DecoderOps& ops = cpu_decoder_ops(), bool sequence_parallel = false,
               ContextSplit context = {}, ExpertGroup experts = {});

  const DecoderShape& shape() const { return shape_; }
  const ChunkParams& params() const { return params_; }
  bool sequence_parallel() const { return sequence_parallel_; }
  const ContextSplit& context() const { return context_; }
  const ExpertGroup& experts() const { return experts_; }
  const DecoderOps& ops() const { return *ops_; }
  // Runs on `ops` from now on: the caller moves the parameters and gradients, and no stash of
  // the old ops may be used again.
  void set_ops(const DecoderOps& ops) { ops_ = &ops; }

  struct Input {
    int samples = 0;                // sequences in the micro-batch (each of shape().S tokens)
    // First chunk: samples * S token ids (host memory): whole sequences, also under context
    // parallelism, whose rank takes its rows of them (and of `targets`).
    const int* tokens = nullptr;
    // Other chunks: [samples * S, C]; under sequence parallelism this rank's rows of it (its
    // sequence shard: the rows [N r / tp, N (r + 1) / tp) of the N = samples * S). Under
    // context parallelism S is this rank's S / size tokens of each sequence, in order.
    const float* input = nullptr;
    float* output = nullptr;        // not the last chunk: [samples * S, C] (or its rows, as input)
    const int* targets = nullptr;   // last chunk: samples * S next tokens (host memory)
    // Weight of each token's loss (the last chunk's) and of the load-balancing losses' (per
    // token of the micro-batch) of every chunk with a mixture of experts.
    float loss_scale = 0;
    // Tensor parallelism: this rank's part of the output, which the plan's all-reduce (or
    // reduce-scatter) adds up, rather than the whole output: the last row-parallel layer's
    // partial sums, plus the residual and bias on rank 0 (under sequence parallelism, on
    // each rank's own rows).
    bool output_partial = false;
    TensorParallelGroup* group = nullptr;  // required when tp > 1
    // Required under context parallelism: the context group's exchanges (it may be `group`'s
    // object when that one takes every exchange in the plan's order, as the back end's does).
    TensorParallelGroup* context_group = nullptr;
    // Required under expert parallelism: the expert group's all-to-alls (it may be `group`'s
    // object, as for context_group).
    TensorParallelGroup* expert_group = nullptr;
  };
  // What the forward keeps for the backward (opaque).
  struct Stash;
  struct StashDeleter {
    void operator()(Stash* s) const;
  };
  using StashPtr = std::unique_ptr<Stash, StashDeleter>;

  // The forward pass; on the last chunk `loss_sum` gets the sum of the token losses
  // (unweighted, in double).
  StashPtr forward(const float* params, const Input& in, double& loss_sum) const;
  // dout: gradient of the chunk's output (nullptr on the last chunk); dinput: where the
  // input's gradient goes (nullptr on the first chunk, and on a tensor-parallel rank whose
  // input gradient no one receives), overwritten. Under sequence parallelism both are this
  // rank's rows, like Input::input.
  // dinput_partial (plans of an earlier hetflow, whose B writes a partial sum; not under
  // sequence parallelism): rank 0 writes the input gradient and the others zeros, for an
  // all-reduce after the task. The planner's plans have none: every rank writes it whole.
  // last_of_step: the last backward into these gradients before they are used or scattered
  // (the step's last; each under ZeRO's per-pass scatters), so with tp > 1 the gains' that each
  // rank has a part of (QK-norm's, each rank's heads; under sequence parallelism the norms'),
  // accumulated until now, are summed over the ranks (once: call it with true exactly once
  // per accumulation).
  void backward(Stash& stash, const float* params, float* grads, const float* dout, float* dinput, bool split,
                bool dinput_partial = false, TensorParallelGroup* group = nullptr, bool last_of_step = false,
                TensorParallelGroup* context_group = nullptr, TensorParallelGroup* expert_group = nullptr) const;
  // The weight gradients a split backward left (requires backward(..., split = true) first).
  void backward_weight(Stash& stash, float* grads) const;
  // The load-balancing losses (Megatron-Core's, before the coefficient: 1 when the router
  // spreads the copies evenly) of the forward's MoE layers, summed, and how many there were.
  static std::pair<double, int> balance_loss(const Stash& stash);
  // The floats a stash holds in the ops' memory now (activations kept for the backward).
  static size_t stash_floats(const Stash& stash);
  // Activation offload: the stash's activations copied to host memory and their arrays in
  // `ops` released (token ids and targets stay), then copied back into new arrays of `ops`,
  // shared as before. A backward of a stash in host memory throws std::logic_error.
  static void stash_to_host(Stash& stash, const DecoderOps& ops);
  static void stash_to_device(Stash& stash, const DecoderOps& ops);
  static bool stash_on_host(const Stash& stash);

 private:
  DecoderShape shape_;
  ChunkParams params_;
  partition::Recompute recompute_;
  const DecoderOps* ops_;
  bool sequence_parallel_;
  ContextSplit context_;
  ExpertGroup experts_;
};

}  // namespace hetflow::exec
