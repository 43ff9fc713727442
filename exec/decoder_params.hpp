#pragma once
// Where the parameters of one chunk of a decoder transformer live: the network's layers
// [layer_begin, layer_end) (layer 0 the embedding, 1..L the blocks, L+1 the head, as
// model/zoo_transformer.cpp numbers them) laid out in one flat FP32 array, each parameter a
// slot with its HuggingFace name and shape.
//
// Two families, named as HuggingFace names them:
//  - GPT-2 (LayerNorm, GELU, biases, learned positions, tied head): `transformer.wte.weight`,
//    `transformer.h.3.attn.c_attn.weight`, ... Conv1D matrices are stored [in, out] in files;
//    here every matrix is [out, in] (nn.Linear's layout), so those slots are `transposed`.
//  - LLaMA (RMSNorm, SwiGLU, no biases, rotary positions): `model.embed_tokens.weight`,
//    `model.layers.3.self_attn.q_proj.weight` [out, in], ..., `lm_head.weight`; Mistral's,
//    Qwen2's (q/k/v biases) and Qwen3's (`self_attn.q_norm.weight` and `k_norm.weight`, of
//    the head size) are LLaMA's with more. A mixture of experts replaces a block's MLP: the
//    router and experts of Mixtral (`block_sparse_moe.gate.weight`,
//    `block_sparse_moe.experts.3.w1.weight`) or of Qwen-MoE (`mlp.gate.weight`,
//    `mlp.experts.3.gate_proj.weight`, `mlp.shared_expert.*`, `mlp.shared_expert_gate.weight`).
// The slot counts add up to partition::params_per_device (the plan's weight tensor): a chunk
// that has the head but not the embedding keeps its own copy of a tied embedding.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kernels/rope_frequencies.hpp"
#include "model/network.hpp"
#include "partition/shard.hpp"

namespace hetflow::exec {

enum class DecoderFamily { gpt2, llama };

// A rectangle of a parameter's whole matrix in this project's [out, in] layout (a vector is
// [n, 1]): what one tensor-parallel rank holds of it.
struct Piece {
  std::int64_t row = 0, rows = 0, col = 0, cols = 0;
};

struct ParamSlot {
  std::string name;                 // HuggingFace's
  std::vector<std::int64_t> shape;  // the whole tensor, as HuggingFace stores it
  size_t offset = 0;                // in the chunk's flat array
  size_t count = 0;                 // floats this rank holds
  bool transposed = false;  // stored [in, out] in files (GPT-2 Conv1D); [out, in] here
  bool decays = false;      // weight decay applies: two or more dimensions
  bool tied_copy = false;   // the head's copy of a tied embedding (not written to files)
  bool split = false;       // Megatron's split divides it (false: every rank holds it whole)
  int layer = 0;            // the network layer it belongs to
  int expert = -1;          // the routed expert it belongs to (-1: none)
  // A sigmoid router's balancing bias (DeepSeek-V3's e_score_correction_bias): no loss
  // gradient reaches it. Its gradient array gathers each expert's load below the mean (the
  // step's tokens, E mean - count, summed like any gradient), and the optimizer moves it by
  // OptimizerOptions::moe_router_bias_update_rate times that sign; the gradient norm and
  // AdamW leave it out.
  bool balancing = false;
  // Tensor parallelism (Megatron): the rectangles of the whole [out, in] matrix this rank
  // holds, in array order (one whole rectangle when the parameter is replicated).
  std::int64_t full_rows = 0, full_cols = 0;
  std::vector<Piece> pieces;
};

// This slot's share of a whole tensor in the file's layout, and back.
std::vector<float> shard_of(const ParamSlot& slot, const float* file_tensor);
void place_shard(const ParamSlot& slot, const float* shard, float* file_tensor);

// Offsets of one block's parameters in the flat array (npos: absent in this family).
struct BlockParams {
  static constexpr size_t npos = static_cast<size_t>(-1);
  size_t norm1_w = npos, norm1_b = npos;
  size_t q_w = npos, k_w = npos, v_w = npos;  // [NH*HS, C], [NKV*HS, C], [NKV*HS, C]
  size_t q_b = npos, k_b = npos, v_b = npos;
  size_t q_norm_w = npos, k_norm_w = npos;    // Qwen3's QK-norm gains [HS], shared by the heads
  size_t o_w = npos, o_b = npos;              // [C, NH*HS]
  size_t norm2_w = npos, norm2_b = npos;
  size_t up_w = npos, up_b = npos;            // GPT-2's c_fc [F, C]; LLaMA's up_proj
  size_t gate_w = npos;                       // LLaMA's gate_proj [F, C]
  size_t down_w = npos, down_b = npos;        // [C, F]
  // A mixture of experts in place of the MLP (DecoderShape::Moe): the router [E, C]; each
  // routed expert's gate and up [FE, C] and down [C, FE], by expert (npos for an expert an
  // expert-parallel rank does not hold); the shared experts' gate and up
  // [FS, C] and down [C, FS], and Qwen2-MoE's gate on them [1, C].
  size_t router_w = npos;
  size_t router_bias = npos;  // a sigmoid router's balancing bias [E] (ParamSlot::balancing)
  std::vector<size_t> expert_gate_w, expert_up_w, expert_down_w;
  size_t shared_gate_w = npos, shared_up_w = npos, shared_down_w = npos, shared_scale_w = npos;
  bool moe() const { return router_w != npos; }
};

struct ChunkParams {
  int layer_begin = 0, layer_end = 0;
  // Tensor parallelism: this rank's share (Megatron's split: attention by heads, the MLP by
  // its inner width, the vocabulary in contiguous ranges; norms, biases added after a
  // row-parallel layer, and position embeddings replicated).
  int tp = 1, tp_rank = 0;
  int NH = 0, NKV = 0;  // heads and key/value heads on this rank
  int F0 = 0, F = 0;    // MLP columns [F0, F0 + F)
  int V0 = 0, V = 0;    // vocabulary rows [V0, V0 + V)
  // Mixtures of experts: each routed expert's SwiGLU columns [FE0, FE0 + FE), the shared
  // experts' [FS0, FS0 + FS) (split as the MLP's; the router and a shared gate whole).
  int FE0 = 0, FE = 0, FS0 = 0, FS = 0;
  bool has_embedding = false, has_head = false;
  std::vector<ParamSlot> slots;  // in array order
  size_t count = 0;              // floats in the flat array
  // layer_start[l - layer_begin]: where layer l's parameters begin; the last entry is count.
  std::vector<size_t> layer_start;
  size_t wte = BlockParams::npos, wpe = BlockParams::npos;  // embedding (first chunk)
  std::vector<BlockParams> blocks;                          // layer_begin.. in order
  size_t final_norm_w = BlockParams::npos, final_norm_b = BlockParams::npos;
  size_t head_w = BlockParams::npos;  // [V, C]: lm_head, the tied copy, or wte itself
  size_t head_slot = BlockParams::npos;  // index in slots of what the head multiplies by
};

struct DecoderShape {
  DecoderFamily family = DecoderFamily::gpt2;
  int layers = 0;  // transformer blocks (the network has layers + 2)
  int C = 0, NH = 0, NKV = 0, HS = 0, F = 0, V = 0, S = 0;
  int P = 0;  // GPT-2's learned positions: the table's rows (>= S; the first S are used)
  float eps = 1e-5f;
  kernels::RopeFrequencies rope;  // LLaMA's rotary frequencies, rope_scaling resolved for S
  int window = 0;                 // sliding-window attention's keys per query (< S); 0: none
  bool qkv_bias = false, out_bias = false;  // LLaMA family: biases of q, k, v (Qwen2) and o
  bool qk_norm = false;                     // LLaMA family: q and k RMS-normalised per head (Qwen3)
  bool tied = true;
  // Mixture-of-Experts MLPs (model::MoeConfig, softmax routers): E routed SwiGLU experts FE
  // wide, each token through its top K; FS: the shared experts' widths together (one SwiGLU
  // as wide is their sum), 0 for none, with Qwen2-MoE's sigmoid gate on them when
  // shared_gate. aux_coef weighs Megatron's load-balancing loss of each MoE layer.
  struct Moe {
    int E = 0, K = 0, FE = 0, FS = 0;
    bool normalize = true, shared_gate = false;
    // DeepSeek-V3's router (MoeConfig::Router::sigmoid): sigmoid scores, a balancing bias
    // that chooses, the choice within the best groups_chosen of `groups`, weights scaled.
    bool sigmoid = false;
    int groups = 1, groups_chosen = 1;
    double scale = 1;
    double aux_coef = 0;
    bool per_sequence = false;  // the balance loss over each sequence (MoeConfig::sequence_aux_loss)
    // Megatron-Core's token dropping: an expert keeps at most ceil(N K / E x capacity_factor)
    // of a micro-batch's N K copies, those of the largest weights (its "probs" policy; a tie to
    // the earlier token); 0: dropless.
    double capacity_factor = 0;
    int first_dense = 0, every = 1;  // block b is MoE when b >= first_dense, (b - first_dense) % every == 0
    bool mixtral_names = false;      // block_sparse_moe.experts.j.w1 (MoeConfig::tensor_names) or mlp.experts.j.gate_proj
    bool layer(int block) const { return E > 0 && block >= first_dense && (block - first_dense) % every == 0; }
  } moe;
};

// Throws PlanError (naming what) when the config is not one the real math covers.
DecoderShape decoder_shape(const model::TransformerConfig& c);

// The rotary frequencies of a config's rope_theta and rope_scaling for sequences of `seq`
// tokens and head_dim rotary values a head (the rotary part of a partial rotary's heads;
// dynamic NTK scaling resolves to a larger theta when seq exceeds the trained context).
// Throws PlanError when they are not usable.
kernels::RopeFrequencies rope_frequencies(double theta, const model::RopeScaling& scaling, int seq, int head_dim);

// Rank `tp_rank` of `tp` (throws PlanError when tp does not divide the key/value heads).
// `experts`: the routed experts this rank holds, ascending (an expert-parallel rank's); empty:
// every expert. The others' slots are absent (their offsets npos).
ChunkParams chunk_params(const DecoderShape& shape, int layer_begin, int layer_end, int tp_rank = 0, int tp = 1,
                         const std::vector<int>& experts = {});

// A part [lo, hi) of Megatron's split, as a fraction of every split dimension (heads,
// key/value heads, MLP width, vocabulary): rank j of t holds [j / t, (j + 1) / t). Ranks of
// different degrees hold parts in common; a data-parallel all-reduce between such workers
// sums one such part at a time.
using SplitPart = partition::SplitPart;  // the one split partition/shard.hpp counts

// The rectangles of each parameter that `part` covers: split parameters' pieces, replicated
// ones whole (the slots, their order and names are chunk_params's; offsets count this
// part's floats). Throws PlanError when the part does not cut the heads into whole heads.
ChunkParams chunk_params_part(const DecoderShape& shape, int layer_begin, int layer_end, SplitPart part);

// Floats [at, at + count) of a chunk's flat array; `replicated`: of a parameter every rank
// holds whole.
struct FloatRun {
  size_t at = 0, count = 0;
  bool replicated = false;
};

// Where the floats of `part` (chunk_params_part over `mine`'s layers) sit in `mine`'s array,
// in the part's order: slot by slot (those `use` accepts, by index), each rectangle row by
// row, adjacent runs merged. Throws PlanError when `mine` does not hold all of them.
std::vector<FloatRun> runs_of_part(const ChunkParams& mine, const ChunkParams& part,
                                   const std::function<bool(size_t slot)>& use);
// The floats [from, to) of the runs' concatenation, as runs.
std::vector<FloatRun> slice_runs(const std::vector<FloatRun>& runs, size_t from, size_t to);
size_t floats_of(const std::vector<FloatRun>& runs);
// Whether the chunk holds routed experts of layers [begin, end).
bool has_routed_experts(const ChunkParams& p, int begin, int end);
// The floats of layers [begin, end) that are routed experts' (`routed`), or all the others, in
// array order, adjacent runs merged: an expert-parallel gradient piece.
std::vector<FloatRun> expert_piece_runs(const ChunkParams& p, int begin, int end, bool routed);

// A seeded initialisation (GPT-2's: matrices and embeddings N(0, 0.02), output projections
// N(0, 0.02 / sqrt(2 L)), norm gains 1, biases 0). Each element is a function of the seed,
// the slot's name and its index, so every device, replica and tied copy holding a parameter
// starts with the same values whatever the plan's partition.
void init_params(const ChunkParams& params, const DecoderShape& shape, std::uint64_t seed, float* data);

}  // namespace hetflow::exec
