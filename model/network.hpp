#pragma once
// A DNN as hetflow sees it: an ordered list of layers (topological order of a DAG), each with
// the per-sample arithmetic and memory every planner and back end needs. A "sample" is one
// input example: an image, or one sequence of `tokens_per_sample` tokens for language models
// (per-token figures are per-sample ones divided by tokens_per_sample).
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "model/precision.hpp"

namespace hetflow::model {

// One operation of a convolutional network's layer as cuDNN and PyTorch run it, for the
// per-operation cost (partition/layer_ops.hpp): a convolution or a fully connected layer (an
// implicit GEMM in each pass), or a memory-bound operation. Shapes are per sample, height x
// width x channels (a fully connected layer's are 1 x 1 x features).
struct CnnOp {
  enum class Kind { conv, fc, batch_norm, relu, max_pool, avg_pool, add, bias };
  Kind kind = Kind::conv;
  std::array<std::int64_t, 3> in{}, out{};  // conv, fc, pools: input and output; others: out only
  int kernel = 1;                           // conv: kernel x kernel
  bool input_grad = true;                   // conv, fc: false for the one that reads the image
  bool operator==(const CnnOp&) const = default;
};

std::string_view to_string(CnnOp::Kind kind);                   // "conv", "batch_norm", ...
std::optional<CnnOp::Kind> cnn_op_kind(std::string_view name);  // nullopt for an unknown name
// Multiply-accumulates per sample of a convolution or a fully connected layer (every input
// feature times every output feature); 0 for the memory-bound kinds.
double cnn_op_macs(const CnnOp& op);

// One tensor-parallel collective of a layer's forward pass, in Megatron's terms (Shoeybi et al.
// 2019, figure 3): the input of a column-parallel layer (f: nothing forward, its gradient
// all-reduced backward), the output of a row-parallel one (g: all-reduced forward, nothing
// backward), or the vocabulary-parallel loss's combination (all-reduced forward only). Under
// sequence parallelism f is an all-gather forward and a reduce-scatter backward, g the reverse
// (Korthikanti et al. 2022). partition/tp_calls.hpp derives each pass's collectives from these.
struct TpCall {
  enum class Op { f, g, loss };
  Op op = Op::g;
  double elems = 0;  // elements moved per sample
  double at = 1;     // the part of the layer's forward FLOPs done before it, in [0, 1]
  bool operator==(const TpCall&) const = default;
};

struct Layer {
  std::string name;
  std::string kind;   // "embedding", "transformer", "conv", "fc", "head", ... (free text)
  std::string shape;  // human-readable shape that produced the numbers, e.g. "h=1024 s=2048"
  std::vector<int> inputs;  // indices of the layers feeding this one; empty = the network input

  double forward_flops = 0;   // per sample
  double backward_flops = 0;  // per sample (input + weight gradients)
  double params = 0;          // parameter count (elements)
  // Parameters shared with layer 0 (tied input/output embeddings): not in `params`, since
  // the model holds them once, but a device that runs this layer without layer 0 keeps its
  // own copy (Megatron keeps the word embedding on the last pipeline stage too).
  double tied_params = 0;
  double output_elems = 0;    // elements of the output activation, per sample
  // Bytes kept from the forward pass for the backward pass, per sample, at the network's
  // precision, with no recomputation.
  double stashed_bytes = 0;
  // Transformer layers only: the part of stashed_bytes that selective recomputation drops
  // (attention scores, softmax, dropout mask), and the forward FLOPs it costs to redo them.
  double attention_stash_bytes = 0;
  double attention_core_flops = 0;
  // Tensor parallelism (Megatron split). A splittable layer divides its FLOPs, parameters and
  // (with sequence parallelism) stashed bytes over the t devices of a stage; others run
  // replicated on each. tp_replicated_bytes: the part of stashed_bytes every tensor-parallel
  // rank keeps whole unless sequence parallelism splits it too (layer-norm inputs, dropout
  // masks, inputs of the first linear layers).
  bool tp_splittable = false;
  int tp_units = 0;  // heads (or KV groups) a tensor-parallel degree must divide; 0 = any degree
  // Elements all-reduced per sample in each forward pass: the row-parallel outputs (Megatron's
  // g operator; 2 s h in a decoder layer, s h in the vocab-parallel embedding).
  double tp_allreduce_elems = 0;
  // How many collectives carry tp_allreduce_elems in each pass (Megatron: 2 per decoder
  // layer, after attention and after the MLP; 1 for the vocab-parallel embedding): each pays
  // its own latency at its own size. 0 with no tensor-parallel traffic; 1 when not given.
  int tp_allreduces = 0;
  // Elements all-reduced per sample in each backward pass: the input gradients of the
  // column-parallel GEMMs (Megatron's f operator; 2 s h in a decoder layer, s h in the
  // vocab-parallel LM head, none in the embedding), in tp_backward_allreduces collectives.
  // Where a file gives neither, the forward's. Under sequence parallelism g is a reduce-scatter
  // forward and an all-gather backward, f an all-gather forward and a reduce-scatter backward,
  // and the backward gathers f's inputs again for the weight gradients (Korthikanti et al.
  // 2022, section 4.2.2: only the sequence shard is stashed).
  double tp_backward_allreduce_elems = 0;
  int tp_backward_allreduces = 0;
  double tp_replicated_bytes = 0;
  // The part of stashed_bytes every tensor-parallel rank keeps whole even under sequence
  // parallelism: a mixture of experts' routed copies (each rank's experts read the copies and
  // write their outputs whole: expert tensor parallelism splits their widths, not their rows).
  double tp_whole_bytes = 0;
  // The layer's tensor-parallel collectives in forward order; their f elements add up to
  // tp_backward_allreduce_elems, their g and loss elements to tp_allreduce_elems. Empty in a
  // layer file that gives only the totals: then tp_calls_of() spreads them evenly.
  std::vector<TpCall> tp_calls;
  // Gains every tensor-parallel rank holds whole but sees only part of the gradient of, summed
  // over the ranks once a step (Megatron's allreduce_layernorm_grads; before each scatter where
  // ZeRO scatters each pass's): QK-norm gains always (each rank saw its own heads), and
  // under sequence parallelism also the norms of the residual stream (each rank saw its rows).
  double tp_summed_gains = 0, tp_summed_gains_sequence_parallel = 0;
  // Convolutional networks: the layer's operations in forward order. Its convolutions' and
  // fully connected layers' multiply-accumulates, doubled, are forward_flops. Empty for other
  // layers (decoders get theirs from the architecture).
  std::vector<CnnOp> cnn_ops;
  // Mixture-of-Experts layers: `experts` routed experts of expert_params parameters each
  // (counted in `params`), of which each token passes through experts_per_token. 0 for a
  // layer without routed experts. What a token uses is active_params().
  int experts = 0;
  int experts_per_token = 0;
  double expert_params = 0;
  double active_params() const { return params - (experts - experts_per_token) * expert_params; }

  bool operator==(const Layer&) const = default;
};

// A layer's tensor-parallel collectives: tp_calls, or where a layer file gives only totals,
// each count's elements in equal calls, f before g, spread evenly over the layer's work.
std::vector<TpCall> tp_calls_of(const Layer& l);
std::string_view to_string(TpCall::Op op);                 // "f", "g", "loss"
std::optional<TpCall::Op> tp_call_op(std::string_view name);  // nullopt for an unknown name

// HuggingFace's `rope_scaling`: how rotary frequencies are rescaled to stretch a model's
// context. Only the rotation angles change (not the FLOPs or the shapes).
struct RopeScaling {
  // "" (plain RoPE), "linear" (frequencies / factor), "dynamic" (NTK: theta grows when seq
  // exceeds original_positions), "llama3" (Llama 3.1's bands of wavelengths) or "yarn" (YaRN's
  // ramp between kept and interpolated frequencies, cos and sin scaled by attention_factor;
  // kernels/rope_frequencies.hpp has the formulas).
  std::string type;
  double factor = 1;
  double low_freq_factor = 1, high_freq_factor = 4;  // llama3
  // llama3, yarn: original_max_position_embeddings; dynamic: the max_position_embeddings the
  // model was trained with. 0 for linear.
  int original_positions = 0;
  double beta_fast = 32, beta_slow = 1;  // yarn: the ramp's ends, in turns over original_positions
  double attention_factor = 1;           // yarn: resolved from the config (0.1 ln factor + 1 unless given)
  bool truncate = true;                  // yarn: the ramp's ends rounded outward to whole pairs
  bool operator==(const RopeScaling&) const = default;
};

// A Mixture-of-Experts MLP in place of the dense one (Shazeer et al. 2017; Fedus et al. 2022;
// Jiang et al. 2024, Mixtral; DeepSeek-AI 2024, DeepSeek-V3): a router scores each token
// against `experts` SwiGLU experts and sends it to the experts_per_token best, whose outputs
// it adds weighted by their scores; shared experts see every token. `experts` 0: no MoE.
struct MoeConfig {
  int experts = 0;            // routed experts (HF num_local_experts, num_experts, n_routed_experts)
  int experts_per_token = 0;  // top-k (HF num_experts_per_tok)
  int expert_ffn = 0;         // each routed expert's SwiGLU width (HF moe_intermediate_size)
  int shared_experts = 0;     // experts every token passes through (DeepSeek n_shared_experts)
  int shared_expert_ffn = 0;  // their width, each; 0 = expert_ffn
  // Qwen2-MoE: a 1-wide linear layer and a sigmoid scale the shared expert's output per token.
  bool shared_expert_gate = false;
  // softmax: scores are a softmax over every expert (Mixtral, Qwen); sigmoid: each expert's
  // own sigmoid, a per-expert bias added to choose but not to weigh (DeepSeek-V3's
  // auxiliary-loss-free balancing).
  enum class Router { softmax, sigmoid };
  Router router = Router::softmax;
  // Group-limited routing (DeepSeek-V3's n_group, topk_group): the experts in `groups` equal
  // groups, a token choosing only in the groups_chosen groups whose two best biased scores
  // sum highest (DeepSeek-V3 places a group on a node, so a token reaches at most 4 nodes).
  // The real layers route so; the routing model of the simulated all-to-all does not see it.
  int groups = 1;
  int groups_chosen = 1;
  bool normalize_top_k = true;  // the chosen experts' weights renormalised to sum to 1
  double routed_scale = 1;      // routed weights scaled after that (DeepSeek routed_scaling_factor)
  // Tokens an expert takes per micro-batch, as a multiple of an even share (tokens x top-k /
  // experts); past it a token's copy is dropped (its residual passes alone). 0: dropless.
  double capacity_factor = 0;
  double aux_loss_coef = 0;  // weight of the load-balancing loss (Switch Transformer's)
  // The balance loss over each sequence's tokens, averaged over the micro-batch's sequences
  // (DeepSeek-V2/V3's sequence-wise loss, their configs' seq_aux; Megatron-Core's
  // seq_aux_loss), rather than over the micro-batch's tokens at once (aux_loss).
  bool sequence_aux_loss = false;
  // Which layers are MoE: from first_dense_layers on, every `every`-th one (layer i when
  // (i - first_dense_layers) % every == 0). The others keep the dense MLP of width ffn.
  int first_dense_layers = 0;
  int every = 1;
  // A checkpoint's names for the routed experts' tensors: Qwen-MoE's and DeepSeek's
  // mlp.experts.j.{gate,up,down}_proj, or Mixtral's block_sparse_moe.experts.j.w1 (gate),
  // w3 (up), w2 (down). From the config's model_type; planning does not read it.
  enum class TensorNames { qwen, mixtral };
  TensorNames tensor_names = TensorNames::qwen;
  bool is_moe_layer(int layer) const {
    return experts > 0 && layer >= first_dense_layers && (layer - first_dense_layers) % every == 0;
  }
  int shared_width() const { return shared_expert_ffn > 0 ? shared_expert_ffn : expert_ffn; }
  bool operator==(const MoeConfig&) const = default;
};

// Multi-head latent attention (DeepSeek-AI 2024, DeepSeek-V2 section 2.1): keys and values
// come up from one kv_lora_rank-wide latent per token, queries from a q_lora_rank-wide one (or
// straight from the hidden state when q_lora_rank is 0); each head's query and key are a
// qk_nope_head_dim part without positions and a qk_rope_head_dim part with rotary positions
// (the key's shared by the heads), its value v_head_dim wide. kv_lora_rank 0: no MLA.
struct MlaConfig {
  int q_lora_rank = 0;
  int kv_lora_rank = 0;
  int qk_nope_head_dim = 0;
  int qk_rope_head_dim = 0;
  int v_head_dim = 0;
  bool enabled() const { return kv_lora_rank > 0; }
  int qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  bool operator==(const MlaConfig&) const = default;
};

// A transformer stack. Decoders (GPT, LLaMA) and encoders (BERT) share it; the flags say
// which variant of each part is used.
struct TransformerConfig {
  std::string name;
  int layers = 0;
  int hidden = 0;
  int heads = 0;
  int kv_heads = 0;        // grouped-query attention; 0 = heads (plain multi-head)
  // Width of one attention head (HF head_dim); 0 = hidden / heads. Qwen3 and Gemma widen
  // their heads: q is heads x head_dim wide, k and v kv_heads x head_dim, and o maps
  // heads x head_dim back to hidden.
  int head_dim = 0;
  int ffn = 0;             // MLP inner size; 0 = 4 * hidden
  int seq = 0;             // sequence length (tokens per sample)
  // Rows of a learned position table (HF n_positions) when it is longer than the sequence
  // trained (GPT-2's 1024 positions, trained at 256 tokens); 0 = seq. Rotary layers have none.
  int positions = 0;
  int vocab = 0;
  bool gated_mlp = false;  // SwiGLU (three matrices) instead of GeLU (two)
  bool biases = true;      // linear layers carry biases (GPT, BERT) or not (LLaMA)
  // Without `biases`, the attention's projections may still carry some: q, k and v (Qwen2) or
  // those and the output (LLaMA's attention_bias).
  enum class AttentionBias { none, qkv, qkvo };
  AttentionBias attention_bias = AttentionBias::none;
  bool rms_norm = false;   // RMSNorm (one vector) instead of LayerNorm (two)
  // Qwen3's QK-norm: each head's query and key normalised (the model's norm, gains of
  // head_dim shared by the heads) before rotary positions.
  bool qk_norm = false;
  bool tied_embeddings = true;    // the LM head reuses the token embedding matrix
  bool learned_positions = true;  // a learned position table (GPT, BERT) vs rotary (LLaMA)
  bool dropout = true;            // dropout masks are stashed for backward
  double norm_eps = 1e-5;         // LayerNorm/RMSNorm epsilon (HF layer_norm_epsilon, rms_norm_eps)
  double rope_theta = 10000;      // rotary base (HF rope_theta); unused with learned positions
  RopeScaling rope_scaling;       // plain unless a config asks for more
  // The fraction of each head that rotary positions turn (HF partial_rotary_factor, GLM-4.5's
  // 0.5): its first rotary_dims() values, as a head of that size would; the rest carry none.
  double partial_rotary_factor = 1;
  // Sliding-window attention (HF sliding_window, Mistral): each query attends to this many
  // keys, its own included, and no earlier ones. 0: every earlier key.
  int sliding_window = 0;
  // What of the source's settings these layers leave out, e.g. "rope_scaling (longrope),
  // sliding_window 4096" from a HuggingFace config.json: the cost model still counts the
  // network, but its real training math is not this (exec refuses it). Empty: nothing.
  std::string unmodelled;
  MoeConfig moe;  // Mixture-of-Experts MLPs; none unless moe.experts > 0
  MlaConfig mla;  // multi-head latent attention in place of heads x head_dim projections
  // Multi-token prediction (DeepSeek-V3's D modules; HF num_nextn_predict_layers, Megatron-Core
  // --mtp-num-layers): module k predicts the token k + 1 ahead from the previous depth's
  // hidden states and token k's embedding, through one more decoder block, and the shared
  // head scores it too. 0: none.
  int mtp_layers = 0;
  // Encoder (BERT) extras: token-type embeddings, a pooler, and an MLM head transform.
  bool encoder = false;
  int type_vocab = 0;
  int head_size() const { return head_dim > 0 ? head_dim : heads > 0 ? hidden / heads : 0; }
  int kv_head_count() const { return kv_heads > 0 ? kv_heads : heads; }
  // int(head_size() x partial_rotary_factor), transformers' truncation.
  int rotary_dims() const { return static_cast<int>(head_size() * partial_rotary_factor); }
  bool operator==(const TransformerConfig&) const = default;
};

struct Network {
  std::string name;
  std::string description;
  Precision precision = Precision::fp16;
  double tokens_per_sample = 1;  // sequence length for language models, 1 otherwise
  // Bytes one sample takes on storage (a JPEG, a row of token ids); 0: not given, see
  // stored_sample_bytes().
  double sample_bytes = 0;
  // For transformer stacks: the shapes the layers were built from, so an executor can build
  // the real layers (and a plan that embeds the network stands alone). Absent for other networks.
  std::optional<TransformerConfig> architecture;
  std::vector<Layer> layers;

  double param_count() const;
  // Parameters one token passes through: param_count() less the routed experts it skips.
  double active_param_count() const;
  double forward_flops_per_sample() const;
  double backward_flops_per_sample() const;
  // What the data loader reads per sample: sample_bytes when given, else for a transformer
  // tokens_per_sample 2-byte token ids, else a mean ImageNet JPEG (network.cpp cites both).
  double stored_sample_bytes() const;
  double training_flops_per_sample() const { return forward_flops_per_sample() + backward_flops_per_sample(); }
  double param_bytes() const { return param_count() * element_bytes(precision); }
  // Weights + gradients + Adam state: 16 B/param mixed precision (2 + 2 + 4 master + 4 + 4),
  // 16 B/param fp32 (4 + 4 + 4 + 4).
  double adam_training_state_bytes() const {
    return param_count() * (2 * element_bytes(precision) + adam_state_bytes(precision));
  }
  // Bytes of activations that cross a cut placed before layer `first_after`, per sample:
  // outputs of layers < first_after read by layers >= first_after (the network input counts
  // as nothing). This is what a pipeline stage boundary sends forward.
  double cut_bytes(size_t first_after) const;

  bool operator==(const Network&) const = default;
};

}  // namespace hetflow::model
