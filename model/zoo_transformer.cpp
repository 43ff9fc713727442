// Transformer stacks (GPT, LLaMA, BERT) from their shapes. FLOPs count matrix multiplies only
// (2 FLOPs per multiply-accumulate), the convention of Narayanan et al. (SC'21); norms,
// softmax and activations are O(s*h) and left out. Activation memory follows Korthikanti et
// al. (2022), "Reducing Activation Recomputation in Large Transformer Models", section 4.1,
// generalised to grouped-query attention, gated MLPs and dropout-free models.
#include <algorithm>
#include <cmath>
#include <string>

#include "model/error.hpp"
#include "model/limits.hpp"
#include "model/units.hpp"
#include "model/zoo.hpp"

namespace hetflow::model {

namespace {

struct Shape {
  double s, h, a, q, kv_dim, d, f, v;  // tokens, hidden, heads, Q width, K/V width, head size, MLP width, vocab
};

Shape shape_of(const TransformerConfig& c) {
  const double head_dim = c.head_size();
  return Shape{static_cast<double>(c.seq), static_cast<double>(c.hidden),
               static_cast<double>(c.heads), c.heads * head_dim, c.kv_head_count() * head_dim, head_dim,
               c.ffn > 0 ? static_cast<double>(c.ffn) : 4.0 * c.hidden,
               static_cast<double>(c.vocab)};
}

double norm_params(const TransformerConfig& c, double h) { return c.rms_norm ? h : 2 * h; }

Layer embedding_layer(const TransformerConfig& c, const Shape& x) {
  Layer l;
  l.name = "embedding";
  l.kind = "embedding";
  l.shape = "vocab=" + std::to_string(c.vocab) + " h=" + std::to_string(c.hidden) +
            " s=" + std::to_string(c.seq);
  l.params = x.v * x.h;
  if (c.learned_positions) l.params += (c.positions > 0 ? c.positions : x.s) * x.h;
  if (c.encoder) l.params += c.type_vocab * x.h + norm_params(c, x.h);
  // A table lookup: no multiply-accumulates. Its backward is a scatter-add into the table.
  l.forward_flops = 0;
  l.backward_flops = 0;
  l.output_elems = x.s * x.h;
  // Token ids (4-byte ints) plus the embedding dropout mask.
  l.stashed_bytes = 4 * x.s + (c.dropout ? x.s * x.h : 0);
  l.tp_splittable = true;
  l.tp_allreduce_elems = x.s * x.h;  // vocab-parallel embedding: one all-reduce of the output
  l.tp_allreduces = 1;
  l.tp_backward_allreduce_elems = 0;  // its backward scatters into the table: no input gradient
  l.tp_backward_allreduces = 0;
  l.tp_calls = {{TpCall::Op::g, x.s * x.h, 1}};
  l.tp_replicated_bytes = l.stashed_bytes;
  return l;
}

// One block of a decoder layer: its parameters, forward FLOPs and the bytes its forward pass
// keeps for the backward (per sample, no recomputation).
struct Block {
  double params = 0, flops = 0, stash = 0;
};

// Attention with heads x head_dim projections (multi-head or grouped-query): Q is h x q and O
// q x h (q = heads x head size: h unless head_dim widens the heads), K and V are h x kv_dim.
// Its stash: the QKV input, Q, K, V, the output projection's input and dropout mask (and
// with QK-norm the norms' inputs); the scores' are attention_stash_bytes.
Block head_attention(const TransformerConfig& c, const Shape& x, double e) {
  Block b;
  b.params = 2 * x.h * x.q + 2 * x.h * x.kv_dim;
  if (c.biases) b.params += x.q + 2 * x.kv_dim + x.h;
  if (!c.biases && c.attention_bias != TransformerConfig::AttentionBias::none) b.params += x.q + 2 * x.kv_dim;
  if (!c.biases && c.attention_bias == TransformerConfig::AttentionBias::qkvo) b.params += x.h;
  if (c.qk_norm) b.params += 2 * norm_params(c, x.d);  // one gain vector (and shift) for q, one for k
  b.flops = 2 * x.s * x.h * (x.q + 2 * x.kv_dim) + 2 * x.s * x.q * x.h;
  const double mask = c.dropout ? 1 : 0;
  b.stash = e * x.s * x.h + e * x.s * (x.q + x.kv_dim) + e * x.s * x.kv_dim + e * x.s * x.q + mask * x.s * x.h +
            (c.qk_norm ? e * x.s * (x.q + x.kv_dim) : 0);
  return b;
}

// Multi-head latent attention (MlaConfig): the query's down projection h x q_lora, its norm
// and up projection q_lora x heads (nope + rope) (or h x heads (nope + rope) with no query
// latent), the key/value down projection h x (kv_lora + rope), its norm and up projection
// kv_lora x heads (nope + v), the output projection heads v x h. Its stash: the input, both
// latents (each its norm's input and its up projection's), Q, K, V, the output projection's
// input and the dropout mask.
Block latent_attention(const TransformerConfig& c, const Shape& x, double e) {
  const MlaConfig& m = c.mla;
  const double a = x.a, dqk = m.qk_head_dim(), dv = m.v_head_dim, ql = m.q_lora_rank, kvl = m.kv_lora_rank;
  const double q = ql > 0 ? x.h * ql + ql * a * dqk : x.h * a * dqk;
  const double kv = x.h * (kvl + m.qk_rope_head_dim) + kvl * a * (m.qk_nope_head_dim + dv);
  const double o = a * dv * x.h;
  Block b;
  b.params = q + kv + o + (ql > 0 ? norm_params(c, ql) : 0) + norm_params(c, kvl);
  b.flops = 2 * x.s * (q + kv + o);
  const double mask = c.dropout ? 1 : 0;
  b.stash = e * x.s * (x.h + 2 * ql + (kvl + m.qk_rope_head_dim) + kvl) + e * x.s * a * (2 * dqk + dv) +
            e * x.s * a * dv + mask * x.s * x.h;
  return b;
}

// A dense MLP of width f: 2 or 3 h x f matrices. Its stash: the input, then GeLU's input and
// output (2 f-wide tensors) or gate, up, silu(gate) and their product (4), then the output
// dropout mask.
Block dense_mlp(const TransformerConfig& c, const Shape& x, double e) {
  const double matrices = c.gated_mlp ? 3 : 2;
  Block b;
  b.params = matrices * x.h * x.f + (c.biases ? (c.gated_mlp ? 2 * x.f + x.h : x.f + x.h) : 0);
  b.flops = 2 * x.s * x.h * x.f * matrices;
  b.stash = e * x.s * x.h + (c.gated_mlp ? 4 : 2) * e * x.s * x.f + (c.dropout ? x.s * x.h : 0);
  return b;
}

// A Mixture-of-Experts MLP (MoeConfig), for tokens routed as evenly as the router is trained
// to: the router (h x experts, and DeepSeek-V3's per-expert bias), the routed SwiGLU experts
// of which each token meets top-k, the shared experts every token meets (and Qwen2-MoE's
// 1-wide gate). Its stash: the input, the fp32 router probabilities, the top-k copies of each
// token as the experts read them, their gate, up, silu(gate) and product, their outputs
// (the combine's backward weighs them), the shared experts' SwiGLU tensors, the dropout mask.
Block moe_mlp(const TransformerConfig& c, const Shape& x, double e, double expert_params) {
  const MoeConfig& m = c.moe;
  const double E = m.experts, k = m.experts_per_token, fe = m.expert_ffn, S = m.shared_experts, fs = m.shared_width();
  Block b;
  b.params = E * expert_params + S * 3 * x.h * fs + x.h * E + (m.router == MoeConfig::Router::sigmoid ? E : 0) +
             (m.shared_expert_gate ? x.h : 0);
  b.flops = 2 * x.s * x.h * E + k * 2 * x.s * expert_params + S * 2 * x.s * 3 * x.h * fs +
            (m.shared_expert_gate ? 2 * x.s * x.h : 0);
  b.stash = e * x.s * x.h + 4 * x.s * E + e * x.s * k * (x.h + 4 * fe + x.h) + S * 4 * e * x.s * fs +
            (c.dropout ? x.s * x.h : 0);
  return b;
}

Layer transformer_layer(const TransformerConfig& c, const Shape& x, double e, int index) {
  Layer l;
  l.name = "layer" + std::to_string(index);
  l.kind = "transformer";
  const MoeConfig& moe = c.moe;
  const bool sparse = moe.is_moe_layer(index);
  l.shape = "h=" + std::to_string(c.hidden) + " heads=" + std::to_string(c.heads) +
            (c.kv_heads > 0 && c.kv_heads != c.heads ? " kv_heads=" + std::to_string(c.kv_heads) : "") +
            (c.head_dim > 0 ? " head_dim=" + std::to_string(c.head_dim) : "") + (c.qk_norm ? " qk_norm" : "") +
            (c.mla.enabled() ? " mla kv_lora=" + std::to_string(c.mla.kv_lora_rank) : "") +
            (sparse ? " experts=" + std::to_string(moe.experts) + " top" + std::to_string(moe.experts_per_token) +
                          " expert_ffn=" + std::to_string(moe.expert_ffn) +
                          (moe.shared_experts > 0 ? " shared=" + std::to_string(moe.shared_experts) : "")
                    : " ffn=" + std::to_string(static_cast<long long>(x.f))) +
            " s=" + std::to_string(c.seq) + (c.sliding_window > 0 ? " window=" + std::to_string(c.sliding_window) : "");
  const Block attention = c.mla.enabled() ? latent_attention(c, x, e) : head_attention(c, x, e);
  const double expert_params = 3 * x.h * moe.expert_ffn;  // one routed SwiGLU expert
  const Block mlp = sparse ? moe_mlp(c, x, e, expert_params) : dense_mlp(c, x, e);
  l.params = attention.params + mlp.params + 2 * norm_params(c, x.h);
  if (sparse) {
    l.experts = moe.experts;
    l.experts_per_token = moe.experts_per_token;
    l.expert_params = expert_params;
    l.tp_whole_bytes = 2 * e * x.s * moe.experts_per_token * x.h;  // the copies read and the outputs weighed
  }

  // Each query against every key of the sequence (the convention counts the masked half too),
  // or against its window's keys under sliding-window attention; MLA's queries and keys are
  // qk_nope + qk_rope wide a head, its values v_head_dim.
  const double keys = c.sliding_window > 0 ? std::min(x.s, static_cast<double>(c.sliding_window)) : x.s;
  const double qk_width = c.mla.enabled() ? x.a * c.mla.qk_head_dim() : x.q;
  const double v_width = c.mla.enabled() ? x.a * c.mla.v_head_dim : x.q;
  const double scores = 2 * x.s * keys * qk_width;  // Q K^T over all heads
  const double context = 2 * x.s * keys * v_width;  // softmax(.) V
  l.forward_flops = attention.flops + scores + context + mlp.flops;
  l.backward_flops = 2 * l.forward_flops;
  l.attention_core_flops = scores + context;
  l.output_elems = x.s * x.h;

  // Scores: softmax output, plus its dropout mask and dropout output when there is dropout.
  const double score_elems = x.a * x.s * x.s;
  l.attention_stash_bytes = e * score_elems + (c.dropout ? (1 + e) * score_elems : 0);
  const double norms = 2 * e * x.s * x.h;
  l.stashed_bytes = attention.stash + l.attention_stash_bytes + mlp.stash + norms;
  l.tp_splittable = true;
  l.tp_units = c.kv_head_count();  // Megatron splits whole heads (query groups)
  l.tp_allreduce_elems = 2 * x.s * x.h;  // after attention and after the MLP (Megatron, row-parallel)
  l.tp_allreduces = 2;
  l.tp_backward_allreduce_elems = 2 * x.s * x.h;  // the QKV and MLP inputs' gradients (column-parallel)
  l.tp_backward_allreduces = 2;
  // In forward order: f before the QKV projections, g after the output projection, f before
  // the MLP, g after it; the attention's share of the layer's FLOPs places the middle two.
  const double attention_share = (attention.flops + scores + context) / l.forward_flops;
  l.tp_calls = {{TpCall::Op::f, x.s * x.h, 0},
                {TpCall::Op::g, x.s * x.h, attention_share},
                {TpCall::Op::f, x.s * x.h, attention_share},
                {TpCall::Op::g, x.s * x.h, 1}};
  l.tp_summed_gains = c.qk_norm ? 2 * norm_params(c, x.d) : 0;  // the q and k gains
  l.tp_summed_gains_sequence_parallel = 2 * norm_params(c, x.h);  // the two norms
  // Korthikanti et al. section 4.2: without sequence parallelism the two norm inputs, the
  // QKV and MLP inputs and the two dropout masks (10 s h bytes in fp16) are not split.
  const double mask = c.dropout ? 1 : 0;
  l.tp_replicated_bytes = 2 * e * x.s * x.h + 2 * e * x.s * x.h + 2 * mask * x.s * x.h;
  return l;
}

// Multi-token prediction's module k (DeepSeek-V3 section 2.2; Megatron-Core's
// MultiTokenPredictionLayer): the previous depth's hidden states and the embeddings of the
// tokens k ahead, each RMS-normalised, concatenated and projected 2h -> h (eh_proj), then a
// decoder block (the config's block L + k - 1: a mixture where its layers are). The shared
// head scores its output after the module's own final norm (head_layer counts that pass;
// the norm's gain is the module's). It looks the tokens up in the embedding table, a copy
// where it runs apart from layer 0 (Megatron keeps one on the last stage for it, summed with
// the first stage's). Under tensor parallelism, as Megatron-Core splits it: the look-up is
// vocabulary-parallel (a g of s h), eh_proj column-parallel (an f of its 2 s h input) with its
// output gathered over the group (a g of s h: an all-gather's volume, or under sequence
// parallelism the reduce-scatter's), and then the block's own calls.
Layer mtp_layer(const TransformerConfig& c, const Shape& x, double e, int k) {
  Layer l = transformer_layer(c, x, e, c.layers + k - 1);
  l.name = "mtp" + std::to_string(k);
  l.kind = "mtp";
  l.shape = "depth " + std::to_string(k) + ", eh_proj 2h->h, " + l.shape;
  l.params += 2 * x.h * x.h + 3 * norm_params(c, x.h);  // eh_proj; enorm, hnorm, its final norm
  l.tied_params = x.v * x.h;  // (check_transformer_config refuses a tied table: no release has one)
  const double block = l.forward_flops, eh = 2 * x.s * (2 * x.h) * x.h;
  l.forward_flops = eh + block;
  l.backward_flops = 2 * l.forward_flops;
  for (TpCall& call : l.tp_calls) call.at = (eh + call.at * block) / l.forward_flops;
  l.tp_calls.insert(l.tp_calls.begin(), {{TpCall::Op::g, x.s * x.h, 0},
                                         {TpCall::Op::f, 2 * x.s * x.h, 0},
                                         {TpCall::Op::g, x.s * x.h, eh / l.forward_flops}});
  l.tp_allreduce_elems += 2 * x.s * x.h;
  l.tp_allreduces += 2;
  l.tp_backward_allreduce_elems += 2 * x.s * x.h;
  l.tp_backward_allreduces += 1;
  // The two norms' inputs and their concatenation (eh_proj's input), which every
  // tensor-parallel rank keeps whole unless sequence parallelism splits the norms' inputs.
  l.stashed_bytes += 2 * e * x.s * x.h + 2 * e * x.s * x.h;
  l.tp_replicated_bytes += 2 * e * x.s * x.h + 2 * e * x.s * x.h;
  l.tp_summed_gains_sequence_parallel += 3 * norm_params(c, x.h);  // enorm, hnorm, the final norm's gain
  l.output_elems = x.s * x.h;
  return l;
}

Layer head_layer(const TransformerConfig& c, const Shape& x, double e) {
  Layer l;
  l.name = "head";
  l.kind = "head";
  l.params = norm_params(c, x.h) + (c.tied_embeddings ? 0 : x.v * x.h);
  l.tied_params = c.tied_embeddings ? x.v * x.h : 0;
  // The main model's pass and, under multi-token prediction, one for each module's output
  // (their norms are the modules'): each pass its logits, its cross-entropy and its calls.
  const double passes = 1 + c.mtp_layers;
  double flops = 2 * x.s * x.h * x.v;  // logits
  if (c.encoder) {
    // BERT: pooler on the first token, MLM transform (dense + LayerNorm), decoder bias.
    l.params += (x.h * x.h + x.h) + (x.h * x.h + x.h + 2 * x.h) + x.v;
    flops += 2 * x.h * x.h + 2 * x.s * x.h * x.h;
  }
  l.shape = "vocab=" + std::to_string(c.vocab) + " h=" + std::to_string(c.hidden) +
            (c.tied_embeddings ? " (tied to the embedding)" : "");
  l.forward_flops = passes * flops;
  l.backward_flops = 2 * l.forward_flops;
  l.output_elems = x.s * x.v;
  // Norm input, head input, and fp32 logits for the cross-entropy (computed in fp32).
  l.stashed_bytes = passes * (2 * e * x.s * x.h + 4 * x.s * x.v);
  l.tp_splittable = true;    // vocab-parallel logits
  // Vocab-parallel cross-entropy (Megatron's _VocabParallelCrossEntropy): each token's
  // maximum logit, then its sum of exponentials and target logit, all-reduced: 3 s values in
  // two collectives.
  l.tp_allreduce_elems = passes * 3 * x.s;
  l.tp_allreduces = static_cast<int>(passes) * 2;
  l.tp_backward_allreduce_elems = passes * x.s * x.h;  // the column-parallel logits' input gradient
  l.tp_backward_allreduces = static_cast<int>(passes);
  // Each pass: f before the logits; after them each token's maximum, then [sum of
  // exponentials | target logit] (exec/decoder.cpp, parallel_crossentropy).
  for (int p = 0; p < static_cast<int>(passes); ++p) {
    const double begin = p / passes, end = (p + 1) / passes;
    l.tp_calls.push_back({TpCall::Op::f, x.s * x.h, begin});
    l.tp_calls.push_back({TpCall::Op::loss, x.s, end});
    l.tp_calls.push_back({TpCall::Op::loss, 2 * x.s, end});
  }
  l.tp_summed_gains_sequence_parallel = norm_params(c, x.h);  // the final norm
  l.tp_replicated_bytes = passes * 2 * e * x.s * x.h;  // norm and head inputs; logits are split
  return l;
}

}  // namespace

void check_transformer_config(const TransformerConfig& c) {
  // Each size in [minimum, maximum] (model/limits.hpp): products of them stay finite and
  // exact enough, and nothing wraps.
  auto require = [&](int value, const char* field, int minimum, int maximum) {
    if (value < minimum || value > maximum) {
      throw InputError("<spec>", 0, field,
                       "expected " + std::string(minimum == 0 ? "0 (the default) or " : "") + "a whole number " +
                           (minimum == 0 ? "up to " : "between 1 and ") + std::to_string(maximum) + ", found " +
                           std::to_string(value));
    }
  };
  require(c.layers, "layers", 1, limits::kMaxTransformerLayers);
  require(c.hidden, "hidden", 1, limits::kMaxHidden);
  require(c.heads, "heads", 1, limits::kMaxHeads);
  require(c.seq, "seq", 1, limits::kMaxSeq);
  require(c.vocab, "vocab", 1, limits::kMaxVocab);
  require(c.kv_heads, "kv_heads", 0, limits::kMaxHeads);
  require(c.ffn, "ffn", 0, limits::kMaxFfn);
  require(c.type_vocab, "type_vocab", 0, limits::kMaxVocab);
  require(c.sliding_window, "sliding_window", 0, limits::kMaxSeq);
  require(c.positions, "positions", 0, limits::kMaxSeq);
  if (c.positions > 0 && !c.learned_positions) {
    throw InputError("<spec>", 0, "positions", "is the size of a learned position table; these layers have rotary positions");
  }
  if (c.positions > 0 && c.seq > c.positions) {
    throw InputError("<spec>", 0, "seq", "expected at most the " + std::to_string(c.positions) +
                                             " positions the learned table has, found " + std::to_string(c.seq));
  }
  require(c.head_dim, "head_dim", 0, limits::kMaxHidden);
  if (c.head_dim == 0 && !c.mla.enabled() && c.hidden % c.heads != 0) {
    throw InputError("<spec>", 0, "heads", "expected a divisor of hidden=" + std::to_string(c.hidden) +
                                               " (or a head_dim), found " + std::to_string(c.heads));
  }
  if (c.head_dim > 0 && static_cast<long long>(c.heads) * c.head_dim > limits::kMaxHidden) {
    throw InputError("<spec>", 0, "head_dim", "heads=" + std::to_string(c.heads) + " x head_dim=" +
                                                  std::to_string(c.head_dim) + " exceeds " +
                                                  std::to_string(limits::kMaxHidden));
  }
  const int kv = c.kv_head_count();
  if (c.heads % kv != 0) {
    throw InputError("<spec>", 0, "kv_heads", "expected a divisor of heads=" + std::to_string(c.heads) +
                                                  ", found " + std::to_string(c.kv_heads));
  }
  check_rope_scaling(c.rope_scaling);
  if (c.rope_scaling.type == "yarn" && !(c.rope_theta > 1)) {
    // YaRN's correction range divides by ln theta.
    throw InputError("<spec>", 0, "rope_theta", "expected a number > 1 under yarn scaling, found " +
                                                    units::format_number(c.rope_theta));
  }
  check_moe(c);
  check_mla(c);
  if (c.mtp_layers < 0 || c.mtp_layers > 16) {
    throw InputError("<spec>", 0, "mtp_layers", "expected a whole number in [0, 16], found " + std::to_string(c.mtp_layers));
  }
  if (c.mtp_layers > 0 && (c.encoder || !c.gated_mlp)) {
    throw InputError("<spec>", 0, "mtp_layers", "predicts tokens ahead with decoder blocks of gated MLPs (DeepSeek-V3's), "
                                                "which these layers are not");
  }
  if (c.mtp_layers > 0 && c.tied_embeddings) {
    // The module's table copy and the tied head's would be one copy where they share a stage
    // and two apart: not modelled, and no release ties its embeddings with MTP.
    throw InputError("<spec>", 0, "mtp_layers", "with tied_embeddings is not modelled (DeepSeek-V3's and GLM-4.5's "
                                                "embeddings are untied)");
  }
  if (c.biases && c.attention_bias != TransformerConfig::AttentionBias::none) {
    throw InputError("<spec>", 0, "attention_bias", "names the biases of layers that otherwise have none, but biases is true");
  }
  if (c.sliding_window > 0 && (c.learned_positions || c.encoder)) {
    throw InputError("<spec>", 0, "sliding_window", "is a LLaMA-family decoder's; these layers learn their positions");
  }
  if (c.learned_positions && !c.rope_scaling.type.empty()) {
    throw InputError("<spec>", 0, "rope_scaling", "scales rotary positions, but these layers learn their positions");
  }
  check_partial_rotary(c);
}

void check_partial_rotary(const TransformerConfig& c) {
  const double f = c.partial_rotary_factor;
  auto fail = [](const std::string& why) { throw InputError("<spec>", 0, "partial_rotary_factor", why); };
  if (!(f > 0 && f <= 1)) fail("expected a fraction of each head in (0, 1], found " + units::format_number(f));
  if (f == 1) return;
  if (c.learned_positions) fail("turns part of each head by rotary positions, but these layers learn their positions");
  if (c.mla.enabled()) fail("is for heads with rotary positions throughout; latent attention's part is mla.qk_rope_head_dim");
  if (const int r = c.rotary_dims(); r < 2 || r % 2 != 0) {
    fail("gives int(head size " + std::to_string(c.head_size()) + " x " + units::format_number(f) + ") = " +
         std::to_string(r) + " rotary values a head; expected an even number of at least 2");
  }
}

void check_moe(const TransformerConfig& c) {
  const MoeConfig& m = c.moe;
  auto fail = [](const std::string& field, const std::string& why) { throw InputError("<spec>", 0, "moe." + field, why); };
  auto number = [](double x) { return units::format_number(x); };
  if (m.experts == 0) {
    if (!(m == MoeConfig{})) fail("experts", "is required (and above 0) when other mixture-of-experts settings are given");
    return;
  }
  if (m.experts < 0 || m.experts > limits::kMaxExperts) {
    fail("experts", "expected a whole number between 1 and " + std::to_string(limits::kMaxExperts) + ", found " +
                        std::to_string(m.experts));
  }
  if (m.experts_per_token < 1 || m.experts_per_token > m.experts) {
    fail("experts_per_token", "expected a whole number between 1 and experts=" + std::to_string(m.experts) +
                                  ", found " + std::to_string(m.experts_per_token));
  }
  if (m.expert_ffn < 1 || m.expert_ffn > limits::kMaxFfn) {
    fail("expert_ffn", "expected a whole number between 1 and " + std::to_string(limits::kMaxFfn) + ", found " +
                           std::to_string(m.expert_ffn));
  }
  if (m.shared_experts < 0 || m.shared_experts > limits::kMaxExperts) {
    fail("shared_experts", "expected a whole number up to " + std::to_string(limits::kMaxExperts) + ", found " +
                               std::to_string(m.shared_experts));
  }
  if (m.shared_expert_ffn < 0 || m.shared_expert_ffn > limits::kMaxFfn) {
    fail("shared_expert_ffn", "expected 0 (expert_ffn) or a whole number up to " + std::to_string(limits::kMaxFfn) +
                                  ", found " + std::to_string(m.shared_expert_ffn));
  }
  if (m.shared_experts == 0 && (m.shared_expert_ffn != 0 || m.shared_expert_gate)) {
    fail(m.shared_expert_gate ? "shared_expert_gate" : "shared_expert_ffn", "is a setting of shared experts; shared_experts is 0");
  }
  if (m.groups < 1 || m.groups > 64 || m.experts % m.groups != 0) {
    fail("groups", "expected a whole number between 1 and 64 that divides experts=" + std::to_string(m.experts) +
                       ", found " + std::to_string(m.groups));
  }
  if (m.groups_chosen < 1 || m.groups_chosen > m.groups ||
      m.experts_per_token > m.groups_chosen * (m.experts / m.groups)) {
    fail("groups_chosen", "expected a whole number between 1 and groups=" + std::to_string(m.groups) +
                              " whose groups hold experts_per_token=" + std::to_string(m.experts_per_token) +
                              " experts, found " + std::to_string(m.groups_chosen));
  }
  if (m.groups_chosen != m.groups && m.router != MoeConfig::Router::sigmoid) {
    fail("groups_chosen", "limits a sigmoid router's choice (DeepSeek-V3's); this router is softmax");
  }
  if (!(m.routed_scale > 0) || m.routed_scale > limits::kMaxCapacityFactor) {
    fail("routed_scale", "expected a number > 0, found " + number(m.routed_scale));
  }
  if (!(m.capacity_factor >= 0) || m.capacity_factor > limits::kMaxCapacityFactor) {
    fail("capacity_factor", "expected 0 (dropless) or a number > 0, found " + number(m.capacity_factor));
  }
  if (!(m.aux_loss_coef >= 0) || m.aux_loss_coef > limits::kMaxCapacityFactor) {
    fail("aux_loss_coef", "expected a number >= 0, found " + number(m.aux_loss_coef));
  }
  if (m.first_dense_layers < 0 || m.first_dense_layers >= c.layers) {
    fail("first_dense_layers", "expected a whole number below layers=" + std::to_string(c.layers) + ", found " +
                                   std::to_string(m.first_dense_layers));
  }
  if (m.every < 1 || m.every > c.layers) {
    fail("every", "expected a whole number between 1 and layers=" + std::to_string(c.layers) + ", found " +
                      std::to_string(m.every));
  }
  if (!c.gated_mlp) fail("experts", "expects SwiGLU layers (mlp: swiglu): the experts here are SwiGLU MLPs");
}

void check_mla(const TransformerConfig& c) {
  const MlaConfig& m = c.mla;
  auto fail = [](const std::string& field, const std::string& why) { throw InputError("<spec>", 0, "mla." + field, why); };
  if (!m.enabled()) {
    if (!(m == MlaConfig{})) fail("kv_lora_rank", "is required (and above 0) when other latent-attention settings are given");
    return;
  }
  for (const auto& [field, value] : {std::pair{"kv_lora_rank", m.kv_lora_rank}, {"q_lora_rank", m.q_lora_rank},
                                     {"qk_nope_head_dim", m.qk_nope_head_dim}, {"qk_rope_head_dim", m.qk_rope_head_dim},
                                     {"v_head_dim", m.v_head_dim}}) {
    if (value < 0 || value > limits::kMaxHidden) {
      fail(field, "expected a whole number up to " + std::to_string(limits::kMaxHidden) + ", found " + std::to_string(value));
    }
  }
  if (m.v_head_dim < 1) fail("v_head_dim", "expected a whole number above 0, found " + std::to_string(m.v_head_dim));
  if (m.qk_head_dim() < 1) fail("qk_nope_head_dim", "and qk_rope_head_dim add up to 0; a query head needs a width");
  if (m.qk_rope_head_dim % 2 != 0) {
    fail("qk_rope_head_dim", "expected an even width (rotary pairs), found " + std::to_string(m.qk_rope_head_dim));
  }
  if (static_cast<long long>(c.heads) * std::max(m.qk_head_dim(), m.v_head_dim) > limits::kMaxHidden) {
    fail("qk_nope_head_dim", "heads x head widths exceed " + std::to_string(limits::kMaxHidden));
  }
  if (m.qk_rope_head_dim > 0 && c.learned_positions) {
    fail("qk_rope_head_dim", "is a rotary part, but these layers learn their positions");
  }
  if (c.kv_heads != 0 && c.kv_heads != c.heads) {
    throw InputError("<spec>", 0, "kv_heads", "expected heads=" + std::to_string(c.heads) +
                                                  " under latent attention (every head has its keys and values), found " +
                                                  std::to_string(c.kv_heads));
  }
  if (c.head_dim != 0 || c.qk_norm || c.biases || c.attention_bias != TransformerConfig::AttentionBias::none) {
    throw InputError("<spec>", 0, c.head_dim != 0 ? "head_dim" : c.qk_norm ? "qk_norm" : c.biases ? "biases" : "attention_bias",
                     "is a setting of head projections; latent attention (mla) sizes its own and has no biases");
  }
}

void check_rope_scaling(const RopeScaling& r) {
  auto fail = [](const std::string& field, const std::string& why) {
    throw InputError("<spec>", 0, "rope_scaling." + field, why);
  };
  auto number = [](double x) { return units::format_number(x); };
  if (r.type.empty()) {
    if (!(r == RopeScaling{})) fail("type", "is required when other rope_scaling settings are given");
    return;
  }
  if (r.type != "linear" && r.type != "dynamic" && r.type != "llama3" && r.type != "yarn") {
    fail("type", "expected linear, dynamic, llama3 or yarn, found '" + r.type + "'");
  }
  if (!(r.factor > 0) || !std::isfinite(r.factor)) fail("factor", "expected a number > 0, found " + number(r.factor));
  if (r.type == "linear") {
    if (r.original_positions != 0) fail("original_positions", "is not a setting of linear scaling");
  } else if (r.original_positions <= 0 || r.original_positions > limits::kMaxSeq) {
    fail("original_positions", "expected a whole number in [1, " + std::to_string(limits::kMaxSeq) + "] for " + r.type +
                                   " scaling, found " +
                                   std::to_string(r.original_positions));
  }
  if (r.type == "llama3") {
    if (!(r.low_freq_factor > 0) || !std::isfinite(r.low_freq_factor)) {
      fail("low_freq_factor", "expected a number > 0, found " + number(r.low_freq_factor));
    }
    if (!(r.high_freq_factor > r.low_freq_factor) || !std::isfinite(r.high_freq_factor)) {
      fail("high_freq_factor", "expected a number above low_freq_factor=" + number(r.low_freq_factor) + ", found " +
                                   number(r.high_freq_factor));
    }
  } else if (r.low_freq_factor != 1 || r.high_freq_factor != 4) {
    fail(r.low_freq_factor != 1 ? "low_freq_factor" : "high_freq_factor", "is a setting of llama3 scaling only");
  }
  if (r.type == "yarn") {
    // (factor >= 1 as transformers requires; the cos and sin scale at most 100, which
    // 0.1 ln factor + 1 reaches only past any context: far beyond, q and k would overflow.)
    if (!(r.factor >= 1)) fail("factor", "expected a number >= 1 for yarn scaling, found " + number(r.factor));
    for (const auto& [field, x] : {std::pair{"beta_fast", r.beta_fast}, {"beta_slow", r.beta_slow}}) {
      if (!(x > 0) || !std::isfinite(x)) fail(field, "expected a number > 0, found " + number(x));
    }
    if (!(r.attention_factor > 0) || r.attention_factor > 100) {
      fail("attention_factor", "expected a number in (0, 100], found " + number(r.attention_factor));
    }
  } else if (r.beta_fast != 32 || r.beta_slow != 1 || r.attention_factor != 1 || !r.truncate) {
    const char* field = r.beta_fast != 32          ? "beta_fast"
                        : r.beta_slow != 1          ? "beta_slow"
                        : r.attention_factor != 1   ? "attention_factor"
                                                    : "truncate";
    fail(field, "is a setting of yarn scaling only");
  }
}

TransformerConfig canonical(TransformerConfig c) {
  if (c.head_dim > 0 && static_cast<long long>(c.head_dim) * c.heads == c.hidden) c.head_dim = 0;
  if (c.positions == c.seq) c.positions = 0;
  return c;
}

Network make_transformer(const TransformerConfig& config, Precision precision) {
  check_transformer_config(config);
  const Shape x = shape_of(config);
  const double e = element_bytes(precision);
  Network net;
  net.name = config.name.empty() ? "transformer" : config.name;
  net.precision = precision;
  net.tokens_per_sample = config.seq;
  net.architecture = canonical(config);
  net.description = std::string(config.encoder ? "encoder" : "decoder") + " L=" +
                    std::to_string(config.layers) + " h=" + std::to_string(config.hidden) +
                    " heads=" + std::to_string(config.heads) + " s=" + std::to_string(config.seq) +
                    " vocab=" + std::to_string(config.vocab);
  net.layers.reserve(static_cast<size_t>(config.layers + config.mtp_layers) + 2);
  net.layers.push_back(embedding_layer(config, x));
  for (int i = 0; i < config.layers; ++i) {
    net.layers.push_back(transformer_layer(config, x, e, i));
    net.layers.back().inputs = {i};
  }
  // Module k reads depth k - 1's hidden states (the last block's for the first); the head
  // reads the main model's and every module's.
  std::vector<int> head_inputs{config.layers};
  for (int k = 1; k <= config.mtp_layers; ++k) {
    net.layers.push_back(mtp_layer(config, x, e, k));
    net.layers.back().inputs = {config.layers + k - 1};
    head_inputs.push_back(config.layers + k);
  }
  net.layers.push_back(head_layer(config, x, e));
  net.layers.back().inputs = head_inputs;
  return net;
}

}  // namespace hetflow::model
