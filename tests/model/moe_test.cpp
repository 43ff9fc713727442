// Mixture-of-Experts decoders and latent attention: parameter counts against the released
// checkpoints, FLOPs against closed forms, their HuggingFace config.json files, their network
// files, and the errors a bad setting gets.
#include <gtest/gtest.h>

#include <string>

#include "model/error.hpp"
#include "model/io.hpp"
#include "model/zoo.hpp"

using namespace hetflow::model;
using hetflow::InputError;

namespace {

Network zoo(const char* name) { return network_from_spec(name, Precision::bf16); }

std::string error_of(const auto& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.field() + ": " + e.message();
  }
  return "";
}

// The released config.json files' keys and values.
const char* kMixtralConfig = R"({"architectures": ["MixtralForCausalLM"], "attention_dropout": 0.0,
  "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
  "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mixtral", "num_attention_heads": 32,
  "num_experts_per_tok": 2, "num_hidden_layers": 32, "num_key_value_heads": 8, "num_local_experts": 8,
  "output_router_logits": false, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.02,
  "sliding_window": null, "tie_word_embeddings": false, "torch_dtype": "bfloat16", "use_cache": true,
  "vocab_size": 32000})";

const char* kQwen3MoeConfig = R"({"architectures": ["Qwen3MoeForCausalLM"], "attention_bias": false,
  "attention_dropout": 0.0, "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645,
  "head_dim": 128, "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 6144,
  "max_position_embeddings": 40960, "max_window_layers": 48, "mlp_only_layers": [], "model_type": "qwen3_moe",
  "moe_intermediate_size": 768, "norm_topk_prob": true, "num_attention_heads": 32, "num_experts": 128,
  "num_experts_per_tok": 8, "num_hidden_layers": 48, "num_key_value_heads": 4, "output_router_logits": false,
  "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001,
  "sliding_window": null, "tie_word_embeddings": false, "torch_dtype": "bfloat16", "use_cache": true,
  "use_sliding_window": false, "vocab_size": 151936})";

const char* kQwen15MoeConfig = R"({"architectures": ["Qwen2MoeForCausalLM"], "attention_dropout": 0.0,
  "bos_token_id": 151643, "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 2048,
  "initializer_range": 0.02, "intermediate_size": 5632, "max_position_embeddings": 8192, "max_window_layers": 21,
  "model_type": "qwen2_moe", "num_attention_heads": 16, "num_hidden_layers": 24, "num_key_value_heads": 16,
  "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": false,
  "torch_dtype": "bfloat16", "use_cache": true, "use_sliding_window": false, "vocab_size": 151936,
  "decoder_sparse_step": 1, "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632,
  "num_experts_per_tok": 4, "num_experts": 60, "norm_topk_prob": false, "output_router_logits": false,
  "router_aux_loss_coef": 0.001})";

// GLM-4.5-Air's (zai-org/GLM-4.5-Air).
const char* kGlm45AirConfig = R"({"architectures": ["Glm4MoeForCausalLM"], "attention_bias": true,
  "attention_dropout": 0.0, "pad_token_id": 151329, "eos_token_id": [151329, 151336, 151338], "head_dim": 128,
  "hidden_act": "silu", "hidden_size": 4096, "partial_rotary_factor": 0.5, "initializer_range": 0.02,
  "intermediate_size": 10944, "max_position_embeddings": 131072, "model_type": "glm4_moe", "moe_intermediate_size": 1408,
  "norm_topk_prob": true, "num_attention_heads": 96, "n_group": 1, "topk_group": 1, "n_routed_experts": 128,
  "n_shared_experts": 1, "routed_scaling_factor": 1.0, "num_experts_per_tok": 8, "first_k_dense_replace": 1,
  "num_hidden_layers": 46, "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_scaling": null, "rope_theta": 1000000,
  "num_nextn_predict_layers": 1, "tie_word_embeddings": false, "torch_dtype": "bfloat16", "use_cache": true,
  "use_qk_norm": false, "vocab_size": 151552})";

const char* kDeepSeekV3Config = R"({"architectures": ["DeepseekV3ForCausalLM"], "attention_bias": false,
  "attention_dropout": 0.0, "aux_loss_alpha": 0.001, "bos_token_id": 0, "eos_token_id": 1, "ep_size": 1,
  "first_k_dense_replace": 3, "hidden_act": "silu", "hidden_size": 7168, "initializer_range": 0.02,
  "intermediate_size": 18432, "kv_lora_rank": 512, "max_position_embeddings": 163840, "model_type": "deepseek_v3",
  "moe_intermediate_size": 2048, "moe_layer_freq": 1, "n_group": 8, "n_routed_experts": 256, "n_shared_experts": 1,
  "norm_topk_prob": true, "num_attention_heads": 128, "num_experts_per_tok": 8, "num_hidden_layers": 61,
  "num_key_value_heads": 128, "num_nextn_predict_layers": 1, "q_lora_rank": 1536, "qk_nope_head_dim": 128,
  "qk_rope_head_dim": 64, "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3",
  "quant_method": "fp8", "weight_block_size": [128, 128]}, "rms_norm_eps": 1e-06, "rope_scaling": {"beta_fast": 32,
  "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
  "type": "yarn"}, "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "seq_aux": true,
  "tie_word_embeddings": false, "topk_group": 4, "topk_method": "noaux_tc", "torch_dtype": "bfloat16",
  "use_cache": true, "v_head_dim": 128, "vocab_size": 129280})";

Network from_hf(const char* text) {
  return make_transformer(transformer_from_hf_config(text, "config.json"), Precision::bf16);
}

}  // namespace

// Parameter counts of the released checkpoints (model.safetensors' totals; DeepSeek-V3's main
// model as its report counts it, then with its multi-token-prediction module, whose
// checkpoint tensors also copy the embedding and the head; fp8 scales apart).
TEST(Moe, ZooEntriesCountTheirCheckpoints) {
  EXPECT_DOUBLE_EQ(zoo("mixtral-8x7b").param_count(), 46702792704);
  EXPECT_DOUBLE_EQ(zoo("qwen3-30b-a3b").param_count(), 30532122624);
  EXPECT_DOUBLE_EQ(zoo("qwen1.5-moe-a2.7b").param_count(), 14315784192);
  // By hand: embedding and head 2 x 129280 x 7168; per layer MLA 187,107,328 and 2 norms of
  // 7168; 3 dense MLPs of 3 x 7168 x 18432; 58 MoE layers of 257 experts of 3 x 7168 x 2048,
  // a router of 7168 x 256 and its 256 biases; the final norm.
  const double mla = 7168.0 * 1536 + 1536 + 1536.0 * 128 * 192 + 7168.0 * 576 + 512 + 512.0 * 128 * 256 + 128.0 * 128 * 7168;
  EXPECT_DOUBLE_EQ(mla, 187107328);
  const double expert = 3.0 * 7168 * 2048;
  const double deepseek = 2 * 129280.0 * 7168 + 61 * (mla + 2 * 7168) + 3 * (3.0 * 7168 * 18432) +
                          58 * (257 * expert + 7168.0 * 256 + 256) + 7168;
  // Layer 61 of the checkpoint: a MoE block, eh_proj 7168 x 14336, enorm, hnorm and
  // shared_head.norm (its embed_tokens and shared_head.head are the main model's, copied).
  const double mtp = mla + 2 * 7168 + 257 * expert + 7168.0 * 256 + 256 + 7168.0 * 14336 + 3 * 7168;
  const Network v3 = zoo("deepseek-v3");
  EXPECT_DOUBLE_EQ(v3.param_count(), deepseek + mtp);
  ASSERT_EQ(v3.layers[62].kind, "mtp");
  EXPECT_DOUBLE_EQ(v3.layers[62].params, mtp);
  EXPECT_NEAR(deepseek / 671e9, 1, 0.0005);  // "671B total parameters"
  EXPECT_NEAR((deepseek + mtp + 2 * 129280.0 * 7168) / 685e9, 1, 0.001);  // the checkpoint's "685B"
  // The others against their model cards' rounded totals and active counts.
  EXPECT_NEAR(zoo("mixtral-8x22b").param_count() / 141e9, 1, 0.005);          // "141B", "39B active"
  EXPECT_NEAR(zoo("mixtral-8x22b").active_param_count() / 39e9, 1, 0.01);
  EXPECT_NEAR(zoo("qwen3-235b-a22b").param_count() / 235e9, 1, 0.002);        // "235B", "22B activated"
  EXPECT_NEAR(zoo("qwen3-235b-a22b").active_param_count() / 22e9, 1, 0.01);
  EXPECT_NEAR(zoo("deepseek-v2-lite").param_count() / 15.7e9, 1, 0.003);      // "15.7B"
}

// What a token passes through: Mixtral's two experts of eight ("12.9B active"), Qwen3's 8 of
// 128 ("3.3B activated"), DeepSeek-V3's 8 of 256 plus the shared one ("37B activated").
TEST(Moe, ActiveParametersAreThoseATokenPassesThrough) {
  const Network mixtral = zoo("mixtral-8x7b");
  EXPECT_DOUBLE_EQ(mixtral.active_param_count(), 46702792704 - 32 * 6 * (3.0 * 4096 * 14336));
  EXPECT_NEAR(mixtral.active_param_count() / 12.9e9, 1, 0.005);
  EXPECT_NEAR(zoo("qwen3-30b-a3b").active_param_count() / 3.3e9, 1, 0.02);
  const Network v3 = zoo("deepseek-v3");  // (the main model's; its MTP module's layer apart)
  EXPECT_NEAR((v3.active_param_count() - v3.layers[62].active_params()) / 37e9, 1, 0.02);
  const Network dense = zoo("llama3-8b");
  EXPECT_DOUBLE_EQ(dense.active_param_count(), dense.param_count());
}

// A MoE layer's forward FLOPs: attention as a dense layer's, the router's h x experts GEMM,
// top-k experts' SwiGLU and the shared experts' (2 FLOPs a multiply-add).
TEST(Moe, ALayersFlopsAreItsActiveExpertsAndItsRouter) {
  const Network dense = network_from_spec("llama:layers=2,hidden=512,heads=8,ffn=1536,seq=256,vocab=1000", Precision::bf16);
  const Network moe = network_from_spec(
      "llama:layers=2,hidden=512,heads=8,ffn=1536,seq=256,vocab=1000,experts=16,experts_per_token=3,expert_ffn=384,"
      "shared_experts=2",
      Precision::bf16);
  const double s = 256, h = 512;
  const double dense_mlp = 2 * s * 3 * h * 1536;
  const double moe_mlp = 2 * s * h * 16 + 3 * (2 * s * 3 * h * 384) + 2 * (2 * s * 3 * h * 384);
  EXPECT_DOUBLE_EQ(moe.layers[1].forward_flops - dense.layers[1].forward_flops, moe_mlp - dense_mlp);
  EXPECT_DOUBLE_EQ(moe.layers[1].backward_flops, 2 * moe.layers[1].forward_flops);
  EXPECT_EQ(moe.layers[1].experts, 16);
  EXPECT_EQ(moe.layers[1].experts_per_token, 3);
  EXPECT_DOUBLE_EQ(moe.layers[1].expert_params, 3 * h * 384);
  EXPECT_DOUBLE_EQ(moe.layers[1].params - dense.layers[1].params,
                   (16 + 2) * 3 * h * 384 + h * 16 - 3 * h * 1536);
}

// Which layers are MoE: DeepSeek-V3's first three are dense; Qwen's decoder_sparse_step 2
// makes layers 1, 3, 5, ... MoE ((i + 1) % 2 == 0).
TEST(Moe, DenseLayersWhereTheModelKeepsThem) {
  const Network v3 = zoo("deepseek-v3");
  for (int i = 0; i < 61; ++i) EXPECT_EQ(v3.layers[static_cast<size_t>(i) + 1].experts, i < 3 ? 0 : 256) << i;
  std::string config = kQwen15MoeConfig;
  config.replace(config.find("\"decoder_sparse_step\": 1"), 24, "\"decoder_sparse_step\": 2");
  const TransformerConfig c = transformer_from_hf_config(config, "config.json");
  for (int i = 0; i < 24; ++i) EXPECT_EQ(c.moe.is_moe_layer(i), (i + 1) % 2 == 0) << i;
  // A leading run of mlp_only_layers is the dense layers before the first MoE one.
  config = kQwen3MoeConfig;
  config.replace(config.find("\"mlp_only_layers\": []"), 21, "\"mlp_only_layers\": [0, 1]");
  const TransformerConfig q = transformer_from_hf_config(config, "config.json");
  EXPECT_EQ(q.moe.first_dense_layers, 2);
  EXPECT_EQ(q.unmodelled, "");
  config.replace(config.find("[0, 1]"), 6, "[0, 7]");
  EXPECT_EQ(transformer_from_hf_config(config, "config.json").unmodelled, "mlp_only_layers beyond a leading run");
}

// The released config.json files read as the zoo's networks (the same parameters), with their
// routers as the models' code runs them, and what the layers leave out noted.
TEST(Moe, ReleasedConfigsReadAsTheZoosNetworks) {
  const Network mixtral = from_hf(kMixtralConfig);
  EXPECT_DOUBLE_EQ(mixtral.param_count(), 46702792704);
  const MoeConfig& m = mixtral.architecture->moe;
  EXPECT_EQ(m.experts, 8);
  EXPECT_EQ(m.experts_per_token, 2);
  EXPECT_TRUE(m.normalize_top_k);
  EXPECT_DOUBLE_EQ(m.aux_loss_coef, 0.02);
  EXPECT_EQ(mixtral.architecture->sliding_window, 0);
  EXPECT_EQ(mixtral.architecture->unmodelled, "");
  EXPECT_EQ(m.capacity_factor, 0);  // dropless, as released
  EXPECT_EQ(m.tensor_names, MoeConfig::TensorNames::mixtral);  // block_sparse_moe.experts.j.w1

  // Megatron-Core's capacity factor, where a config asks to train dropping tokens.
  std::string dropping = kMixtralConfig;
  dropping.insert(dropping.find('{') + 1, "\"moe_expert_capacity_factor\": 1.25,");
  EXPECT_DOUBLE_EQ(from_hf(dropping.c_str()).architecture->moe.capacity_factor, 1.25);
  dropping.replace(dropping.find("1.25"), 4, "-1.0");
  EXPECT_NE(error_of([&] { transformer_from_hf_config(dropping, "config.json"); }).find("moe_expert_capacity_factor"),
            std::string::npos);

  const Network qwen3 = from_hf(kQwen3MoeConfig);
  EXPECT_DOUBLE_EQ(qwen3.param_count(), 30532122624);
  EXPECT_TRUE(qwen3.architecture->qk_norm);
  EXPECT_TRUE(qwen3.architecture->moe.normalize_top_k);
  EXPECT_EQ(qwen3.architecture->moe.tensor_names, MoeConfig::TensorNames::qwen);  // mlp.experts.j.gate_proj

  const Network qwen15 = from_hf(kQwen15MoeConfig);
  EXPECT_DOUBLE_EQ(qwen15.param_count(), 14315784192);
  EXPECT_TRUE(qwen15.architecture->moe.shared_expert_gate);
  EXPECT_FALSE(qwen15.architecture->moe.normalize_top_k);

  const Network v3 = from_hf(kDeepSeekV3Config);
  EXPECT_DOUBLE_EQ(v3.param_count(), zoo("deepseek-v3").param_count());
  EXPECT_EQ(v3.architecture->moe.router, MoeConfig::Router::sigmoid);
  EXPECT_DOUBLE_EQ(v3.architecture->moe.routed_scale, 2.5);
  EXPECT_EQ(v3.architecture->mla, (MlaConfig{1536, 512, 128, 64, 128}));
  EXPECT_EQ(v3.architecture->moe.groups, 8);  // the best 4 of 8 groups of 32 experts: the real layers route so
  EXPECT_EQ(v3.architecture->moe.groups_chosen, 4);
  EXPECT_TRUE(v3.architecture->moe.sequence_aux_loss);  // (its seq_aux: the sequence-wise balance loss)
  // YaRN x40 over its 4,096 pre-training positions, cos and sin unscaled (mscale over
  // mscale_all_dim, both 1); its latent attention's softmax scale (mscale_all_dim's square) is
  // noted with the attention itself.
  RopeScaling yarn{"yarn", 40, 1, 4, 4096};
  EXPECT_EQ(v3.architecture->rope_scaling, yarn);
  EXPECT_EQ(v3.architecture->unmodelled, "yarn's mscale_all_dim on latent attention's softmax scale");
  EXPECT_EQ(v3.architecture->mtp_layers, 1);  // planned and simulated (the real layers refuse it)

  // GLM-4.5-Air: DeepSeek-V3's router (sigmoid, the balancing bias) over 128 experts, one
  // shared, the first layer dense; q, k, v biases. Its parameters counted here part by part
  // from the config: 106.85 B, the "106B total" of its release.
  const Network air = from_hf(kGlm45AirConfig);
  const MoeConfig& g = air.architecture->moe;
  EXPECT_EQ(g.router, MoeConfig::Router::sigmoid);
  EXPECT_EQ(g.experts, 128);
  EXPECT_EQ(g.experts_per_token, 8);
  EXPECT_EQ(g.shared_experts, 1);
  EXPECT_EQ(g.first_dense_layers, 1);
  EXPECT_EQ(g.groups, 1);
  EXPECT_DOUBLE_EQ(g.aux_loss_coef, 0);  // transformers computes none for it
  EXPECT_FALSE(g.sequence_aux_loss);
  EXPECT_EQ(air.architecture->attention_bias, TransformerConfig::AttentionBias::qkv);
  EXPECT_DOUBLE_EQ(air.architecture->norm_eps, 1e-5);
  const double C = 4096, Q = 96 * 128, KV = 8 * 128, attention = C * Q + 2 * C * KV + Q * C + Q + 2 * KV + 2 * C;
  const double moe_layer = attention + 129 * 3 * C * 1408 + 128 * C + 128, dense_layer = attention + 3 * C * 10944;
  // Its multi-token prediction module: a 47th (MoE) block, eh_proj 2C -> C and three norms.
  const double mtp = moe_layer + 2 * C * C + 3 * C;
  EXPECT_DOUBLE_EQ(air.param_count(), 2 * 151552 * C + C + dense_layer + 45 * moe_layer + mtp);
  EXPECT_EQ(air.architecture->mtp_layers, 1);
  // Rotary positions on the first half of each head, as its release (the real layers do that).
  EXPECT_DOUBLE_EQ(air.architecture->partial_rotary_factor, 0.5);
  EXPECT_EQ(air.architecture->rotary_dims(), 64);
  EXPECT_EQ(air.architecture->unmodelled, "");
}

// GLM-4.5's partial rotary: read from a config (top level, or transformers 5's
// rope_parameters; Glm4MoeConfig's 0.5 where absent), kept by a network file (the key written
// only below 1, so other files keep their bytes), and refused where no even number of a
// head's values would turn, naming the field.
TEST(Moe, PartialRotaryIsReadKeptAndChecked) {
  std::string config = kGlm45AirConfig;
  auto with = [&](const std::string& from, const std::string& to) {
    std::string text = config;
    const size_t at = text.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return text.replace(at, from.size(), to);
  };
  const std::string factor = R"("partial_rotary_factor": 0.5, )";
  EXPECT_DOUBLE_EQ(transformer_from_hf_config(with(factor, ""), "config.json").partial_rotary_factor, 0.5);
  const TransformerConfig inner = transformer_from_hf_config(
      with(factor, R"("rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.25}, )"), "config.json");
  EXPECT_DOUBLE_EQ(inner.partial_rotary_factor, 0.25);
  EXPECT_EQ(inner.rotary_dims(), 32);
  EXPECT_EQ(transformer_from_hf_config(with(factor, R"("partial_rotary_factor": 1, )"), "config.json").rotary_dims(), 128);
  const std::string few = error_of([&] {
    transformer_from_hf_config(with(factor, R"("partial_rotary_factor": 0.01, )"), "config.json");
  });
  EXPECT_EQ(few, "partial_rotary_factor: gives int(head size 128 x 0.01) = 1 rotary values a head; expected an even "
                 "number of at least 2");
  EXPECT_NE(error_of([&] {
              transformer_from_hf_config(with(factor, R"("partial_rotary_factor": 0.3046875, )"), "config.json");
            }).find("= 39 rotary values a head"),
            std::string::npos);
  EXPECT_EQ(error_of([&] { transformer_from_hf_config(with(factor, R"("partial_rotary_factor": 1.5, )"), "config.json"); }),
            "partial_rotary_factor: expected a fraction of each head in (0, 1], found 1.5");

  const Network air = from_hf(kGlm45AirConfig);
  const std::string text = write_network(air);
  EXPECT_NE(text.find("partial_rotary_factor: 0.5"), std::string::npos);
  EXPECT_EQ(parse_network(text, "net.yaml"), air);
  EXPECT_EQ(write_network(zoo("mixtral-8x7b")).find("partial_rotary_factor"), std::string::npos);
  // A network file's factor is checked as a config's: learned positions have no rotary part.
  auto network_error = [](const std::string& family, const std::string& fraction = "0.5") {
    return error_of([&] {
      parse_network("name: n\nprecision: fp32\ntokens_per_sample: 16\narchitecture: {layers: 1, hidden: 8, heads: 2, "
                    "seq: 16, vocab: 10, " + family + ", dropout: false, partial_rotary_factor: " + fraction + "}\nlayers: []\n",
                    "net.yaml");
    });
  };
  EXPECT_EQ(network_error("norm: layernorm, mlp: gelu, biases: true, tied_embeddings: true, learned_positions: true"),
            "architecture.partial_rotary_factor: turns part of each head by rotary positions, but these layers learn "
            "their positions");
  EXPECT_EQ(network_error("norm: rmsnorm, mlp: swiglu, biases: false, tied_embeddings: false, learned_positions: false",
                          "0.25"),
            "architecture.partial_rotary_factor: gives int(head size 4 x 0.25) = 1 rotary values a head; expected an "
            "even number of at least 2");
}

// A network file keeps an MoE architecture and its layers' experts: written, read, equal.
// Its tensor names are written only where they are Mixtral's (every other file as before).
TEST(Moe, NetworkFilesRoundTrip) {
  for (const char* name : {"deepseek-v3", "qwen1.5-moe-a2.7b", "deepseek-v2-lite", "mixtral-8x7b"}) {
    SCOPED_TRACE(name);
    const Network net = zoo(name);
    const std::string text = write_network(net);
    const Network back = parse_network(text, "net.yaml");
    EXPECT_EQ(back, net);
    EXPECT_DOUBLE_EQ(back.active_param_count(), net.active_param_count());
    EXPECT_EQ(text.find("tensor_names: mixtral") != std::string::npos, std::string(name) == "mixtral-8x7b");
    EXPECT_EQ(text.find("tensor_names: qwen"), std::string::npos);
  }
  std::string bad = write_network(zoo("mixtral-8x7b"));
  bad.replace(bad.find("tensor_names: mixtral"), 21, "tensor_names: gpt");
  EXPECT_NE(error_of([&] { parse_network(bad, "net.yaml"); }).find("tensor_names"), std::string::npos);
}

// Settings that cannot be: each error names its field.
TEST(Moe, BadSettingsNameTheirField) {
  auto spec = [](const std::string& s) { return error_of([&] { network_from_spec(s, Precision::bf16); }); };
  EXPECT_NE(spec("llama:layers=2,hidden=64,heads=4,experts=4,experts_per_token=5,expert_ffn=32").find("experts_per_token"),
            std::string::npos);
  EXPECT_NE(spec("llama:layers=2,hidden=64,heads=4,experts=4,experts_per_token=2").find("moe.expert_ffn"), std::string::npos);
  EXPECT_NE(spec("llama:layers=2,hidden=64,heads=4,expert_ffn=32").find("moe.experts"), std::string::npos);
  EXPECT_NE(spec("gpt:layers=2,hidden=64,heads=4,experts=4,experts_per_token=1,expert_ffn=32").find("SwiGLU"),
            std::string::npos);
  std::string config = kDeepSeekV3Config;
  config.replace(config.find("\"num_experts_per_tok\": 8"), 24, "\"num_experts_per_tok\": 300");
  EXPECT_NE(error_of([&] { transformer_from_hf_config(config, "config.json"); }).find("experts_per_token"),
            std::string::npos);
  TransformerConfig mla = *zoo("deepseek-v3").architecture;
  mla.qk_norm = true;
  EXPECT_NE(error_of([&] { check_transformer_config(mla); }).find("latent attention"), std::string::npos);
  mla.qk_norm = false;
  mla.mla.qk_rope_head_dim = 63;
  EXPECT_EQ(error_of([&] { check_transformer_config(mla); }).substr(0, 20), "mla.qk_rope_head_dim");
  const std::string file = "name: x\ntokens_per_sample: 1\nlayers:\n  - {name: a, output_elems: 1, params: 10, experts: 4}\n";
  EXPECT_NE(error_of([&] { parse_network(file, "net.yaml"); }).find("experts_per_token"), std::string::npos);
}

// Multi-token prediction (DeepSeek-V3 section 2.2): module k after the last block, a block of
// its own (the config's block L + k - 1: here a mixture) with eh_proj (2h -> h) and three
// norms, looking the next tokens up in a copy of the embedding table; the head scores the
// main model's and every module's hidden states, each pass a logits GEMM and a loss. The
// head reads both outputs, so a cut between the module and the head carries both.
TEST(Moe, MultiTokenPredictionIsABlockEhProjAndAHeadPassMore) {
  const Network v3 = zoo("deepseek-v3");
  const TransformerConfig& c = *v3.architecture;
  ASSERT_EQ(c.mtp_layers, 1);
  ASSERT_EQ(v3.layers.size(), 64u);  // embedding, 61 blocks, the module, the head
  const Layer &last = v3.layers[61], &mtp = v3.layers[62], &head = v3.layers[63];
  EXPECT_EQ(mtp.kind, "mtp");
  const double s = c.seq, h = c.hidden, V = c.vocab;
  EXPECT_DOUBLE_EQ(mtp.forward_flops, last.forward_flops + 2 * s * (2 * h) * h);
  EXPECT_DOUBLE_EQ(mtp.backward_flops, 2 * mtp.forward_flops);
  EXPECT_DOUBLE_EQ(mtp.params, last.params + 2 * h * h + 3 * h);
  EXPECT_DOUBLE_EQ(mtp.tied_params, V * h);
  EXPECT_EQ(mtp.experts, 256);
  EXPECT_DOUBLE_EQ(head.forward_flops, 2 * (2 * s * h * V));
  EXPECT_EQ(mtp.inputs, (std::vector<int>{61}));
  EXPECT_EQ(head.inputs, (std::vector<int>{61, 62}));
  EXPECT_DOUBLE_EQ(v3.cut_bytes(62), s * h * 2);        // the last block's output (bf16)
  EXPECT_DOUBLE_EQ(v3.cut_bytes(63), 2 * s * h * 2);    // and the module's
  // Its tensor-parallel calls, Megatron-Core's split: the vocabulary-parallel look-up's sum
  // (g), eh_proj's column-parallel input (f, 2 s h) and its gathered output (g), then the
  // block's, moved past eh_proj.
  ASSERT_EQ(mtp.tp_calls.size(), last.tp_calls.size() + 3);
  EXPECT_EQ(mtp.tp_calls[0].op, TpCall::Op::g);
  EXPECT_DOUBLE_EQ(mtp.tp_calls[0].at, 0);
  EXPECT_EQ(mtp.tp_calls[1].op, TpCall::Op::f);
  EXPECT_DOUBLE_EQ(mtp.tp_calls[1].elems, 2 * s * h);
  EXPECT_EQ(mtp.tp_calls[2].op, TpCall::Op::g);
  EXPECT_DOUBLE_EQ(mtp.tp_calls[2].at, 2 * s * (2 * h) * h / mtp.forward_flops);
  EXPECT_DOUBLE_EQ(mtp.tp_allreduce_elems, last.tp_allreduce_elems + 2 * s * h);
  EXPECT_DOUBLE_EQ(mtp.tp_backward_allreduce_elems, last.tp_backward_allreduce_elems + 2 * s * h);
  EXPECT_EQ(head.tp_calls.size(), 6u);  // f, loss, loss a pass
  // A network file keeps it; two modules chain; the real layers refuse it.
  TransformerConfig two = c;
  two.mtp_layers = 2;
  const Network deeper = make_transformer(two, Precision::bf16);
  EXPECT_EQ(deeper.layers[63].inputs, (std::vector<int>{62}));
  EXPECT_EQ(deeper.layers[64].inputs, (std::vector<int>{61, 62, 63}));
  EXPECT_DOUBLE_EQ(deeper.layers[64].forward_flops, 3 * (2 * s * h * V));
  const Network back = parse_network(write_network(deeper), "net.yaml");
  EXPECT_EQ(back, deeper);
  TransformerConfig tied = c;
  tied.tied_embeddings = true;
  try {
    make_transformer(tied, Precision::bf16);
    FAIL() << "a tied table with a module accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("mtp_layers: with tied_embeddings is not modelled"), std::string::npos)
        << e.what();
  }
  TransformerConfig bad = c;
  bad.mtp_layers = 17;
  try {
    make_transformer(bad, Precision::bf16);
    FAIL() << "17 modules accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("mtp_layers: expected a whole number in [0, 16], found 17"), std::string::npos)
        << e.what();
  }
}
