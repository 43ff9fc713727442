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

Layer transformer_layer(const TransformerConfig& c, const Shape& x, double e, int index) {
  Layer l;
  l.name = "layer" + std::to_string(index);
  l.kind = "transformer";
  l.shape = "h=" + std::to_string(c.hidden) + " heads=" + std::to_string(c.heads) +
            (c.kv_heads > 0 && c.kv_heads != c.heads ? " kv_heads=" + std::to_string(c.kv_heads) : "") +
            (c.head_dim > 0 ? " head_dim=" + std::to_string(c.head_dim) : "") + (c.qk_norm ? " qk_norm" : "") +
            " ffn=" + std::to_string(static_cast<long long>(x.f)) + " s=" + std::to_string(c.seq) +
            (c.sliding_window > 0 ? " window=" + std::to_string(c.sliding_window) : "");
  const double mlp_matrices = c.gated_mlp ? 3 : 2;
  // Parameters: Q is h x q and O q x h (q = heads x head size: h unless head_dim widens the
  // heads), K and V are h x kv_dim; the MLP has 2 or 3 h x f matrices.
  l.params = 2 * x.h * x.q + 2 * x.h * x.kv_dim + mlp_matrices * x.h * x.f + 2 * norm_params(c, x.h);
  if (c.biases) l.params += (x.q + 2 * x.kv_dim + x.h) + (c.gated_mlp ? 2 * x.f + x.h : x.f + x.h);
  if (!c.biases && c.attention_bias != TransformerConfig::AttentionBias::none) l.params += x.q + 2 * x.kv_dim;
  if (!c.biases && c.attention_bias == TransformerConfig::AttentionBias::qkvo) l.params += x.h;
  if (c.qk_norm) l.params += 2 * norm_params(c, x.d);  // one gain vector (and shift) for q, one for k

  const double qkv = 2 * x.s * x.h * (x.q + 2 * x.kv_dim);
  // Each query against every key of the sequence (the convention counts the masked half too),
  // or against its window's keys under sliding-window attention.
  const double keys = c.sliding_window > 0 ? std::min(x.s, static_cast<double>(c.sliding_window)) : x.s;
  const double scores = 2 * x.s * keys * x.q;   // Q K^T over all heads
  const double context = 2 * x.s * keys * x.q;  // softmax(.) V
  const double out_proj = 2 * x.s * x.q * x.h;
  const double mlp = 2 * x.s * x.h * x.f * mlp_matrices;
  l.forward_flops = qkv + scores + context + out_proj + mlp;
  l.backward_flops = 2 * l.forward_flops;
  l.attention_core_flops = scores + context;
  l.output_elems = x.s * x.h;

  const double mask = c.dropout ? 1 : 0;  // a dropout mask costs one byte per element
  // Attention: QKV input, Q, K, V, output-projection input, output dropout mask; with
  // QK-norm, the norms' inputs too.
  const double attention = e * x.s * x.h + e * x.s * (x.q + x.kv_dim) + e * x.s * x.kv_dim + e * x.s * x.q +
                           mask * x.s * x.h + (c.qk_norm ? e * x.s * (x.q + x.kv_dim) : 0);
  // Scores: softmax output, plus its dropout mask and dropout output when there is dropout.
  const double score_elems = x.a * x.s * x.s;
  l.attention_stash_bytes = e * score_elems + (c.dropout ? (1 + e) * score_elems : 0);
  // MLP: input, then GeLU input and output (2 f-wide tensors) or gate, up, silu(gate) and
  // their product (4), then the output dropout mask.
  const double mlp_stash = e * x.s * x.h + (c.gated_mlp ? 4 : 2) * e * x.s * x.f + mask * x.s * x.h;
  const double norms = 2 * e * x.s * x.h;
  l.stashed_bytes = attention + l.attention_stash_bytes + mlp_stash + norms;
  l.tp_splittable = true;
  l.tp_units = c.kv_head_count();  // Megatron splits whole heads (query groups)
  l.tp_allreduce_elems = 2 * x.s * x.h;  // after attention and after the MLP (Megatron, row-parallel)
  l.tp_allreduces = 2;
  l.tp_backward_allreduce_elems = 2 * x.s * x.h;  // the QKV and MLP inputs' gradients (column-parallel)
  l.tp_backward_allreduces = 2;
  // In forward order: f before the QKV projections, g after the output projection, f before
  // the MLP, g after it; the attention's share of the layer's FLOPs places the middle two.
  const double attention_share = (qkv + scores + context + out_proj) / l.forward_flops;
  l.tp_calls = {{TpCall::Op::f, x.s * x.h, 0},
                {TpCall::Op::g, x.s * x.h, attention_share},
                {TpCall::Op::f, x.s * x.h, attention_share},
                {TpCall::Op::g, x.s * x.h, 1}};
  l.tp_summed_gains = c.qk_norm ? 2 * norm_params(c, x.d) : 0;  // the q and k gains
  l.tp_summed_gains_sequence_parallel = 2 * norm_params(c, x.h);  // the two norms
  // Korthikanti et al. section 4.2: without sequence parallelism the two norm inputs, the
  // QKV and MLP inputs and the two dropout masks (10 s h bytes in fp16) are not split.
  l.tp_replicated_bytes = 2 * e * x.s * x.h + 2 * e * x.s * x.h + 2 * mask * x.s * x.h;
  return l;
}

Layer head_layer(const TransformerConfig& c, const Shape& x, double e) {
  Layer l;
  l.name = "head";
  l.kind = "head";
  l.params = norm_params(c, x.h) + (c.tied_embeddings ? 0 : x.v * x.h);
  l.tied_params = c.tied_embeddings ? x.v * x.h : 0;
  double flops = 2 * x.s * x.h * x.v;  // logits
  if (c.encoder) {
    // BERT: pooler on the first token, MLM transform (dense + LayerNorm), decoder bias.
    l.params += (x.h * x.h + x.h) + (x.h * x.h + x.h + 2 * x.h) + x.v;
    flops += 2 * x.h * x.h + 2 * x.s * x.h * x.h;
  }
  l.shape = "vocab=" + std::to_string(c.vocab) + " h=" + std::to_string(c.hidden) +
            (c.tied_embeddings ? " (tied to the embedding)" : "");
  l.forward_flops = flops;
  l.backward_flops = 2 * flops;
  l.output_elems = x.s * x.v;
  // Norm input, head input, and fp32 logits for the cross-entropy (computed in fp32).
  l.stashed_bytes = 2 * e * x.s * x.h + 4 * x.s * x.v;
  l.tp_splittable = true;    // vocab-parallel logits
  // Vocab-parallel cross-entropy (Megatron's _VocabParallelCrossEntropy): each token's
  // maximum logit, then its sum of exponentials and target logit, all-reduced: 3 s values in
  // two collectives.
  l.tp_allreduce_elems = 3 * x.s;
  l.tp_allreduces = 2;
  l.tp_backward_allreduce_elems = x.s * x.h;  // the column-parallel logits' input gradient
  l.tp_backward_allreduces = 1;
  // f before the logits; after them each token's maximum, then [sum of exponentials | target
  // logit] (exec/decoder.cpp, parallel_crossentropy).
  l.tp_calls = {{TpCall::Op::f, x.s * x.h, 0}, {TpCall::Op::loss, x.s, 1}, {TpCall::Op::loss, 2 * x.s, 1}};
  l.tp_summed_gains_sequence_parallel = norm_params(c, x.h);  // the final norm
  l.tp_replicated_bytes = 2 * e * x.s * x.h;  // norm and head inputs; logits are split
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
  if (c.head_dim == 0 && c.hidden % c.heads != 0) {
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
  if (c.biases && c.attention_bias != TransformerConfig::AttentionBias::none) {
    throw InputError("<spec>", 0, "attention_bias", "names the biases of layers that otherwise have none, but biases is true");
  }
  if (c.sliding_window > 0 && (c.learned_positions || c.encoder)) {
    throw InputError("<spec>", 0, "sliding_window", "is a LLaMA-family decoder's; these layers learn their positions");
  }
  if (c.learned_positions && !c.rope_scaling.type.empty()) {
    throw InputError("<spec>", 0, "rope_scaling", "scales rotary positions, but these layers learn their positions");
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
  if (r.type != "linear" && r.type != "dynamic" && r.type != "llama3") {
    fail("type", "expected linear, dynamic or llama3, found '" + r.type + "'");
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
  net.layers.reserve(static_cast<size_t>(config.layers) + 2);
  net.layers.push_back(embedding_layer(config, x));
  for (int i = 0; i < config.layers; ++i) {
    net.layers.push_back(transformer_layer(config, x, e, i));
    net.layers.back().inputs = {i};
  }
  net.layers.push_back(head_layer(config, x, e));
  net.layers.back().inputs = {config.layers};
  return net;
}

}  // namespace hetflow::model
