#include "partition/shard.hpp"

namespace hetflow::partition {

std::pair<std::int64_t, std::int64_t> split_units(std::int64_t n, const SplitPart& part) {
  return {n * part.lo_num / part.lo_den, n * part.hi_num / part.hi_den};
}

namespace {

// The two families, as the executor tells them apart (exec/decoder_params.cpp, decoder_shape).
bool gpt2(const model::TransformerConfig& c) {
  return !c.rms_norm && !c.gated_mlp && c.learned_positions && c.tied_embeddings && c.biases;
}
bool llama(const model::TransformerConfig& c) {
  return c.rms_norm && c.gated_mlp && !c.learned_positions && !c.biases;
}

}  // namespace

bool split_covers(const model::Network& net) {
  if (!net.architecture) return false;
  const model::TransformerConfig& c = *net.architecture;
  // Latent attention is not the executor's yet: its parameters split in proportion.
  // Mixtures of experts are LLaMA-style blocks (SwiGLU experts).
  return !c.encoder && (gpt2(c) || llama(c)) && (c.moe.experts == 0 || llama(c)) && !c.mla.enabled() &&
         static_cast<int>(net.layers.size()) == c.layers + 2;
}

std::optional<double> shard_params(const model::Network& net, int layer, int chunk_begin, const SplitPart& part) {
  if (!split_covers(net)) return std::nullopt;
  const model::TransformerConfig& c = *net.architecture;
  const bool gpt = gpt2(c);
  const std::int64_t C = c.hidden, HS = c.head_size(), F = c.ffn > 0 ? c.ffn : 4 * std::int64_t{c.hidden};
  const std::int64_t P = c.positions > 0 ? c.positions : c.seq;
  const auto [h0, h1] = split_units(c.heads, part);
  const auto [g0, g1] = split_units(c.kv_head_count(), part);
  const auto [f0, f1] = split_units(F, part);
  const auto [v0, v1] = split_units(c.vocab, part);
  const std::int64_t qn = (h1 - h0) * HS, kvn = (g1 - g0) * HS, fn = f1 - f0, vn = v1 - v0;
  const bool qkv_bias = !gpt && c.attention_bias != model::TransformerConfig::AttentionBias::none;
  const bool out_bias = !gpt && c.attention_bias == model::TransformerConfig::AttentionBias::qkvo;
  const std::int64_t norm = gpt ? 2 * C : C;  // LayerNorm's gain and shift, RMSNorm's gain
  std::int64_t n = 0;
  if (layer == 0) {
    n = vn * C + (gpt ? P * C : 0);  // the part's token rows; positions whole
  } else if (layer <= c.layers) {
    n = 2 * norm + (qn + 2 * kvn) * C + C * qn;
    if (const model::MoeConfig& m = c.moe; m.is_moe_layer(layer - 1)) {
      // The router (and a sigmoid router's bias) and a shared expert's gate whole; each routed
      // expert's SwiGLU and the shared experts' split by their columns, as a dense MLP.
      const auto [e0, e1] = split_units(m.expert_ffn, part);
      const auto [s0, s1] = split_units(std::int64_t{m.shared_experts} * m.shared_width(), part);
      n += std::int64_t{m.experts} * C + (m.router == model::MoeConfig::Router::sigmoid ? m.experts : 0) +
           std::int64_t{m.experts} * 3 * (e1 - e0) * C + 3 * (s1 - s0) * C + (m.shared_expert_gate ? C : 0);
    } else {
      n += (gpt ? 2 : 3) * fn * C;
    }
    if (gpt) n += (qn + 2 * kvn) + C + fn + C;  // c_attn's and c_fc's biases split, the projections' whole
    if (qkv_bias) n += qn + 2 * kvn;
    if (out_bias) n += C;  // added once, after the sum: whole
    if (!gpt && c.qk_norm) n += 2 * HS;
  } else {
    n = norm;  // the final norm
    if (!c.tied_embeddings || chunk_begin > 0) n += vn * C;  // the head, or the tied embedding's copy
  }
  return static_cast<double>(n);
}

std::optional<double> shard_tied_params(const model::Network& net, const SplitPart& part) {
  if (!split_covers(net)) return std::nullopt;
  const auto [v0, v1] = split_units(net.architecture->vocab, part);
  return static_cast<double>((v1 - v0) * net.architecture->hidden);
}

namespace {

double fraction_of(const SplitPart& part) {
  return static_cast<double>(part.hi_num) / static_cast<double>(part.hi_den) -
         static_cast<double>(part.lo_num) / static_cast<double>(part.lo_den);
}

}  // namespace

double layer_part_params(const model::Network& net, int layer, int chunk_begin, const SplitPart& part) {
  if (const auto exact = shard_params(net, layer, chunk_begin, part)) return *exact;
  const model::Layer& l = net.layers[static_cast<size_t>(layer)];
  const double own = l.params + (chunk_begin == 0 ? 0 : l.tied_params);
  return l.tp_splittable ? own * fraction_of(part) : own;
}

double part_params(const model::Network& net, int begin, int end, const SplitPart& part) {
  double params = 0;
  for (int l = begin; l < end; ++l) params += layer_part_params(net, l, begin, part);
  return params;
}

double tied_part_params(const model::Network& net, int layer, const SplitPart& part) {
  if (const auto exact = shard_tied_params(net, part)) return *exact;
  const model::Layer& l = net.layers[static_cast<size_t>(layer)];
  return l.tp_splittable ? l.tied_params * fraction_of(part) : l.tied_params;
}

}  // namespace hetflow::partition
