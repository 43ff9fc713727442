#pragma once
// Decoders of odd sizes for the executor's training tests (no power of two hides a stride
// bug), and weights as a trained model has them.
#include <random>
#include <string>

#include "exec/token_data.hpp"
#include "exec/training.hpp"
#include "model/zoo.hpp"
#include "partition/plan.hpp"

namespace hetflow::test_support {

// Odd sizes everywhere, so no power of two hides a stride bug.
inline model::Network odd_gpt(int layers = 2, int heads = 3, int seq = 13) {
  return model::network_from_spec("gpt:layers=" + std::to_string(layers) + ",hidden=36,heads=" + std::to_string(heads) +
                                      ",seq=" + std::to_string(seq) + ",vocab=97",
                                  model::Precision::fp32);
}
inline model::Network odd_llama(int layers = 2, int seq = 11) {
  return model::network_from_spec("llama:layers=" + std::to_string(layers) +
                                      ",hidden=48,heads=6,kv_heads=2,ffn=100,seq=" + std::to_string(seq) + ",vocab=101",
                                  model::Precision::fp32);
}

// Qwen3's attention: heads wider than hidden / heads (6 of 10 over a hidden of 48) and q and
// k RMS-normalised per head.
inline model::Network odd_qwen3(int layers = 2, int seq = 11) {
  model::TransformerConfig c = *odd_llama(layers, seq).architecture;
  c.head_dim = 10;
  c.qk_norm = true;
  return model::make_transformer(c, model::Precision::fp32);
}

// Mixtures of experts (Mixtral's names): 5 experts 37 wide, the top 2 renormalised, on every
// block, with a load-balancing loss weighed to matter.
// With a capacity factor, each expert keeps at most ceil(tokens x 2 / 5 x it) copies.
inline model::Network odd_mixtral(int layers = 2, int seq = 11, double capacity_factor = 0) {
  model::TransformerConfig c = *odd_llama(layers, seq).architecture;
  c.name = "mixtral-odd";
  c.moe.tensor_names = model::MoeConfig::TensorNames::mixtral;
  c.moe.experts = 5;
  c.moe.experts_per_token = 2;
  c.moe.expert_ffn = 37;
  c.moe.aux_loss_coef = 0.02;
  c.moe.capacity_factor = capacity_factor;
  return model::make_transformer(c, model::Precision::fp32);
}

// Qwen2-MoE's: the first block dense, then the top 3 of 7 experts 23 wide (not renormalised)
// beside a 41-wide shared expert behind its sigmoid gate.
inline model::Network odd_qwen2_moe(int layers = 3, int seq = 11) {
  model::TransformerConfig c = *odd_llama(layers, seq).architecture;
  c.name = "qwen2-moe-odd";
  c.attention_bias = model::TransformerConfig::AttentionBias::qkv;
  c.moe.experts = 7;
  c.moe.experts_per_token = 3;
  c.moe.expert_ffn = 23;
  c.moe.shared_experts = 1;
  c.moe.shared_expert_ffn = 41;
  c.moe.shared_expert_gate = true;
  c.moe.normalize_top_k = false;
  c.moe.aux_loss_coef = 0.01;
  c.moe.first_dense_layers = 1;
  return model::make_transformer(c, model::Precision::fp32);
}

// DeepSeek-V3's router on LLaMA-style blocks (GLM-4.5's mixture): the first block dense, then
// 6 experts 19 wide in 3 groups, each token's top 2 chosen within its best 2 groups by sigmoid
// score plus the balancing bias, renormalised and scaled by 2.5; one ungated shared expert;
// GLM-4.5's partial rotary, positions turning the first 4 of each head's 8 values.
inline model::Network odd_deepseek(int layers = 3, int seq = 11) {
  model::TransformerConfig c = *odd_llama(layers, seq).architecture;
  c.name = "deepseek-router-odd";
  c.moe.experts = 6;
  c.moe.experts_per_token = 2;
  c.moe.expert_ffn = 19;
  c.moe.shared_experts = 1;
  c.moe.router = model::MoeConfig::Router::sigmoid;
  c.moe.groups = 3;
  c.moe.groups_chosen = 2;
  c.moe.routed_scale = 2.5;
  c.moe.aux_loss_coef = 0.01;
  c.moe.first_dense_layers = 1;
  c.partial_rotary_factor = 0.5;
  return model::make_transformer(c, model::Precision::fp32);
}

// Weights as a trained checkpoint has them: the seeded initialisation plus noise on every
// parameter, so no tensor (a bias, a norm's shift) starts at zero, where the relative
// difference of two runs would measure nothing but Adam's sign of rounding noise.
inline exec::SafetensorsFile perturbed_weights(const partition::Plan& plan) {
  exec::SafetensorsFile w = exec::Training(plan, exec::markov_stream(plan.network.architecture->vocab, 1), {}, 42).weights();
  std::mt19937 rng(5);
  std::normal_distribution<float> noise(0.0f, 0.02f);
  for (auto& t : w.tensors) {
    for (float& x : t.data) x += noise(rng);
  }
  return w;
}

}  // namespace hetflow::test_support
