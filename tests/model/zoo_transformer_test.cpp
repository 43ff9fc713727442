// The transformer zoo against published figures and closed-form formulas.
#include <gtest/gtest.h>

#include <cmath>

#include "model/error.hpp"
#include "model/io.hpp"
#include "model/zoo.hpp"

using namespace hetflow::model;

namespace {
double params(const char* name) { return network_from_spec(name, Precision::fp16).param_count(); }

// Narayanan et al. (SC'21), eq. 3 without recomputation: per token, a training iteration of a
// GPT with l layers, hidden h, sequence s and vocabulary V costs 72 l h^2 (1 + s/6h + V/12lh).
double narayanan_flops_per_token(double l, double h, double s, double v) {
  return 72 * l * h * h * (1 + s / (6 * h) + v / (12 * l * h));
}
}  // namespace

TEST(ZooTransformer, Gpt3_175bHas175BillionParameters) {
  EXPECT_NEAR(params("gpt3-175b") / 175e9, 1.0, 0.01);
}

TEST(ZooTransformer, Gpt2FamilyMatchesReleasedCheckpoints) {
  // Parameter counts of the released GPT-2 checkpoints (tied embeddings).
  EXPECT_DOUBLE_EQ(params("gpt2-124m"), 124439808);
  EXPECT_DOUBLE_EQ(params("gpt2-350m"), 354823168);
  EXPECT_DOUBLE_EQ(params("gpt2-xl"), 1557611200);
}

TEST(ZooTransformer, Llama2FromItsConfigJsonKeys) {
  // The key names and values of the released Llama-2-7b-hf config.json.
  const std::string config = R"({
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
    "intermediate_size": 11008, "max_position_embeddings": 4096, "num_attention_heads": 32,
    "num_hidden_layers": 32, "num_key_value_heads": 32, "rms_norm_eps": 1e-05,
    "tie_word_embeddings": false, "vocab_size": 32000 })";
  const Network net = make_transformer(transformer_from_hf_config(config, "config.json"), Precision::bf16);
  EXPECT_DOUBLE_EQ(net.param_count(), 6738415616);  // the checkpoint's count
  EXPECT_DOUBLE_EQ(params("llama2-7b"), 6738415616);
  EXPECT_DOUBLE_EQ(params("llama2-13b"), 13015864320);
  EXPECT_NEAR(params("llama2-70b") / 68.98e9, 1.0, 0.001);  // grouped-query attention, 8 KV heads
}

// Today's open decoders count their checkpoints' parameters exactly (the released
// model.safetensors' totals), each with what sets it apart.
TEST(ZooTransformer, Llama3MistralAndQwenCountTheirCheckpoints) {
  EXPECT_DOUBLE_EQ(params("llama3-8b"), 8030261248);
  EXPECT_DOUBLE_EQ(params("llama3.2-1b"), 1235814400);  // tied head
  EXPECT_DOUBLE_EQ(params("mistral-7b"), 7241732096);
  EXPECT_DOUBLE_EQ(params("qwen2.5-0.5b"), 494032768);  // q/k/v biases, tied head
  EXPECT_DOUBLE_EQ(params("qwen2.5-7b"), 7615616512);
  const Network llama32 = network_from_spec("llama3.2-1b", Precision::bf16);
  ASSERT_TRUE(llama32.architecture);
  EXPECT_EQ(llama32.architecture->rope_scaling, (RopeScaling{"llama3", 32, 1, 4, 8192}));
  EXPECT_EQ(network_from_spec("mistral-7b", Precision::bf16).architecture->sliding_window, 4096);
}

// Qwen3 widens its heads past hidden / heads and normalises q and k per head: both change
// the counts, which match the released checkpoints (model.safetensors' totals).
TEST(ZooTransformer, Qwen3CountsItsCheckpoints) {
  EXPECT_DOUBLE_EQ(params("qwen3-0.6b"), 596049920);  // 16 heads of 128 over a hidden of 1024, tied head
  EXPECT_DOUBLE_EQ(params("qwen3-8b"), 8190735360);
  // The released Qwen3-0.6B config.json's keys.
  const TransformerConfig c = transformer_from_hf_config(R"({"architectures": ["Qwen3ForCausalLM"],
    "attention_bias": false, "attention_dropout": 0.0, "bos_token_id": 151643, "eos_token_id": 151645,
    "head_dim": 128, "hidden_act": "silu", "hidden_size": 1024, "initializer_range": 0.02,
    "intermediate_size": 3072, "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
    "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
    "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null, "tie_word_embeddings": true,
    "torch_dtype": "bfloat16", "use_cache": true, "use_sliding_window": false, "vocab_size": 151936})",
                                                         "config.json");
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.head_size(), 128);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_EQ(c.attention_bias, TransformerConfig::AttentionBias::none);
  EXPECT_EQ(c.unmodelled, "");
  EXPECT_EQ(c.sliding_window, 0);
  EXPECT_DOUBLE_EQ(make_transformer(c, Precision::bf16).param_count(), 596049920);
  // Qwen3Config's defaults: heads of 128 and 32 key/value heads when the keys are absent;
  // attention_bias puts biases on q, k, v and o.
  const TransformerConfig bare = transformer_from_hf_config(R"({"model_type": "qwen3", "hidden_size": 256,
    "intermediate_size": 512, "num_attention_heads": 32, "num_hidden_layers": 2, "vocab_size": 100,
    "attention_bias": true})", "c.json");
  EXPECT_EQ(bare.head_size(), 128);
  EXPECT_EQ(bare.kv_heads, 32);
  EXPECT_EQ(bare.attention_bias, TransformerConfig::AttentionBias::qkvo);
  // Kept through a network file (a plan embeds the network).
  const Network net = make_transformer(c, Precision::bf16);
  const Network back = parse_network(write_network(net), "net.yaml");
  ASSERT_TRUE(back.architecture);
  EXPECT_EQ(back.architecture->head_dim, 128);
  EXPECT_TRUE(back.architecture->qk_norm);
  EXPECT_EQ(back, net);
}

// head_dim is read for every LLaMA-family type (transformers' LlamaConfig, MistralConfig and
// Qwen2's attention honour it). Mistral NeMo: 32 heads of 128 over a hidden of 5120.
TEST(ZooTransformer, AHeadDimOtherThanHiddenOverHeadsWidensTheAttention) {
  const TransformerConfig nemo = transformer_from_hf_config(R"({"architectures": ["MistralForCausalLM"],
    "head_dim": 128, "hidden_act": "silu", "hidden_size": 5120, "intermediate_size": 14336,
    "max_position_embeddings": 1024000, "model_type": "mistral", "num_attention_heads": 32,
    "num_hidden_layers": 40, "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0,
    "sliding_window": null, "tie_word_embeddings": false, "vocab_size": 131072})", "config.json");
  EXPECT_EQ(nemo.head_dim, 128);
  EXPECT_FALSE(nemo.qk_norm);
  const Network net = make_transformer(nemo, Precision::bf16);
  EXPECT_DOUBLE_EQ(net.param_count(), 12247782400);  // Mistral-Nemo-Base-2407's checkpoint
  // Closed form per layer and token: q and o are h x 4096, k and v h x 1024, attention over s keys.
  const double h = 5120, q = 4096, kv = 1024, f = 14336, s = 1024000;
  EXPECT_DOUBLE_EQ(net.layers[1].forward_flops, 2 * s * h * (q + 2 * kv) + 2 * 2 * s * s * q + 2 * s * q * h +
                                                    3 * 2 * s * h * f);
  // A head_dim equal to hidden / heads reads as the default (no key in the network file).
  EXPECT_EQ(transformer_from_hf_config(R"({"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
    "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 100, "head_dim": 16})", "c.json").head_dim, 0);
  // heads need not divide hidden when head_dim is given; without it they must.
  TransformerConfig odd = nemo;
  odd.hidden = 5000;
  EXPECT_NO_THROW(make_transformer(odd, Precision::bf16));
  odd.head_dim = 0;
  EXPECT_THROW(make_transformer(odd, Precision::bf16), hetflow::InputError);
  try {
    transformer_from_hf_config(R"({"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
      "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 100, "head_dim": 0})", "c.json");
    FAIL() << "expected an InputError";
  } catch (const hetflow::InputError& e) {
    EXPECT_EQ(e.field(), "head_dim");
  }
}

TEST(ZooTransformer, Gpt2ConfigJsonKeys) {
  const std::string config = R"({"model_type": "gpt2", "n_layer": 48, "n_embd": 1600, "n_head": 25,
                                  "n_positions": 1024, "n_ctx": 1024, "vocab_size": 50257, "n_inner": null})";
  EXPECT_DOUBLE_EQ(make_transformer(transformer_from_hf_config(config, "c.json"), Precision::fp16).param_count(),
                   1557611200);
}

// RoPE scaling of a config.json (linear, dynamic NTK, Llama 3.1's llama3) is read into
// rope_scaling, and written with the network, so a plan file carries it. The Llama-3.2-1B
// config's keys.
TEST(ZooTransformer, ConfigRopeScalingIsRead) {
  const std::string llama32 = R"({"model_type": "llama", "hidden_size": 2048, "intermediate_size": 8192,
    "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8, "head_dim": 64,
    "hidden_act": "silu", "attention_bias": false, "mlp_bias": false, "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "tie_word_embeddings": true, "vocab_size": 128256,
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"}})";
  const TransformerConfig c = transformer_from_hf_config(llama32, "config.json");
  EXPECT_EQ(c.unmodelled, "");
  EXPECT_EQ(c.rope_scaling, (RopeScaling{"llama3", 32, 1, 4, 8192}));
  const Network net = make_transformer(c, Precision::bf16);
  const Network back = parse_network(write_network(net), "net.yaml");
  ASSERT_TRUE(back.architecture);
  EXPECT_EQ(back.architecture->rope_scaling, c.rope_scaling);
  EXPECT_EQ(back, net);

  auto llama_with = [](const std::string& scaling) {
    return transformer_from_hf_config(R"({"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
      "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 100, "max_position_embeddings": 2048,
      "rope_scaling": )" + scaling + "}",
                                      "c.json");
  };
  EXPECT_EQ(llama_with(R"({"type": "linear", "factor": 4})").rope_scaling, (RopeScaling{"linear", 4, 1, 4, 0}));
  // Dynamic NTK stretches beyond the context the config was trained with.
  EXPECT_EQ(llama_with(R"({"type": "dynamic", "factor": 2})").rope_scaling, (RopeScaling{"dynamic", 2, 1, 4, 2048}));
  // transformers 4 lets a legacy "type" override "rope_type"; dynamic by a factor of 1 still
  // acts beyond the trained context.
  EXPECT_EQ(llama_with(R"({"rope_type": "llama3", "type": "linear", "factor": 2})").rope_scaling,
            (RopeScaling{"linear", 2, 1, 4, 0}));
  EXPECT_EQ(llama_with(R"({"type": "dynamic", "factor": 1})").rope_scaling, (RopeScaling{"dynamic", 1, 1, 4, 2048}));
  // No stretch at all: plain RoPE.
  for (const char* plain : {R"({"rope_type": "default"})", R"({"type": "linear", "factor": 1.0})",
                            R"({"rope_type": "llama3", "factor": 1, "low_freq_factor": 1, "high_freq_factor": 4,
                                "original_max_position_embeddings": 8192})"}) {
    const TransformerConfig plain_config = llama_with(plain);
    EXPECT_EQ(plain_config.rope_scaling, RopeScaling{}) << plain;
    EXPECT_EQ(plain_config.unmodelled, "") << plain;
  }
  // transformers 5's rope_parameters: the base and the scaling in one object.
  const TransformerConfig v5 = transformer_from_hf_config(R"({"model_type": "llama", "hidden_size": 64,
    "intermediate_size": 128, "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 100,
    "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
                        "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}})",
                                                          "c.json");
  EXPECT_EQ(v5.rope_theta, 500000);
  EXPECT_EQ(v5.rope_scaling, (RopeScaling{"llama3", 32, 1, 4, 8192}));
  EXPECT_EQ(v5.unmodelled, "");
  // Per-layer-type parameters (Gemma's) are not one scaling: noted, not guessed.
  EXPECT_EQ(transformer_from_hf_config(R"({"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
    "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 100,
    "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e6}}})",
                                       "c.json")
                .unmodelled,
            "rope_parameters");
  // What llama3 needs, named; the bands in order.
  auto error = [&](const std::string& scaling) {
    try {
      llama_with(scaling);
    } catch (const hetflow::InputError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error(R"({"rope_type": "llama3", "factor": 8, "low_freq_factor": 1, "original_max_position_embeddings": 8192})")
                .find("rope_scaling.high_freq_factor: is required for llama3 scaling"),
            std::string::npos);
  EXPECT_NE(error(R"({"rope_type": "llama3", "factor": 8, "low_freq_factor": 4, "high_freq_factor": 1,
                      "original_max_position_embeddings": 8192})")
                .find("rope_scaling.high_freq_factor: expected a number above low_freq_factor=4, found 1"),
            std::string::npos);
  EXPECT_NE(error(R"({"type": "linear", "factor": -2})").find("rope_scaling.factor: expected a number > 0, found -2"),
            std::string::npos);
  EXPECT_NE(error(R"({"rope_type": "llama3", "factor": 8, "low_freq_factor": 1, "high_freq_factor": 4,
                      "original_max_position_embeddings": 8192.5})")
                .find("rope_scaling.original_max_position_embeddings: expected a whole number up to 134217728"),
            std::string::npos);
}

// Mistral's sliding window: each query attends to W keys, so the attention's score and
// context products count s * W per head instead of s * s (the sequence's, as the plain
// layers count). A window as long as the sequence counts as none. Absent, it is
// transformers' default for Mistral (4096); null, none.
TEST(ZooTransformer, SlidingWindowAttentionCountsItsKeys) {
  auto mistral = [](int window) {
    return transformer_from_hf_config(R"({"model_type": "mistral", "hidden_size": 256, "intermediate_size": 512,
      "num_attention_heads": 8, "num_hidden_layers": 2, "vocab_size": 1000, "max_position_embeddings": 1024,
      "sliding_window": )" + std::to_string(window) + "}",
                                      "c.json");
  };
  EXPECT_EQ(mistral(256).sliding_window, 256);
  EXPECT_EQ(mistral(1024).sliding_window, 1024);  // kept, and counted as the sequence's keys
  const Network windowed = make_transformer(mistral(256), Precision::bf16);
  const Network plain = make_transformer(mistral(1024), Precision::bf16);
  // Two products (Q K^T and P V) of 2 s (s - W) h FLOPs fewer each, per layer, forward.
  const double s = 1024, w = 256, h = 256;
  EXPECT_DOUBLE_EQ(plain.layers[1].forward_flops - windowed.layers[1].forward_flops, 2 * 2 * s * (s - w) * h);
  EXPECT_DOUBLE_EQ(plain.param_count(), windowed.param_count());
  EXPECT_NE(windowed.layers[1].shape.find(" window=256"), std::string::npos) << windowed.layers[1].shape;
  const std::string bare = R"({"model_type": "mistral", "hidden_size": 256, "intermediate_size": 512,
    "num_attention_heads": 8, "num_hidden_layers": 2, "vocab_size": 1000)";
  EXPECT_EQ(transformer_from_hf_config(bare + "}", "c.json").sliding_window, 4096);
  EXPECT_EQ(transformer_from_hf_config(bare + R"(, "sliding_window": null})", "c.json").sliding_window, 0);
  try {
    transformer_from_hf_config(R"({"model_type": "mistral", "hidden_size": 64, "intermediate_size": 128,
      "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 100})", "c.json");
    FAIL() << "expected an InputError";
  } catch (const hetflow::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("num_key_value_heads: is absent, and transformers' default for mistral (8) "
                                         "does not divide num_attention_heads=4"),
              std::string::npos)
        << e.what();
  }
  const Network back = parse_network(write_network(windowed), "net.yaml");
  ASSERT_TRUE(back.architecture);
  EXPECT_EQ(back.architecture->sliding_window, 256);
  EXPECT_EQ(back, windowed);
}

// Qwen2's q, k and v carry biases (and nothing else does): Qwen2.5-0.5B's config gives the
// checkpoint's 494,032,768 parameters. LLaMA's attention_bias adds o_proj's too.
TEST(ZooTransformer, Qwen2AndLlamaAttentionBiasesAreCounted) {
  const TransformerConfig qwen = transformer_from_hf_config(R"({"model_type": "qwen2", "hidden_size": 896,
    "intermediate_size": 4864, "num_attention_heads": 14, "num_hidden_layers": 24, "num_key_value_heads": 2,
    "vocab_size": 151936, "max_position_embeddings": 32768, "rope_theta": 1000000.0, "rms_norm_eps": 1e-06,
    "tie_word_embeddings": true, "use_sliding_window": false, "sliding_window": 32768, "max_window_layers": 21,
    "hidden_act": "silu"})",
                                                            "config.json");
  EXPECT_EQ(qwen.attention_bias, TransformerConfig::AttentionBias::qkv);
  EXPECT_EQ(qwen.unmodelled, "");
  EXPECT_EQ(qwen.sliding_window, 0);
  const Network net = make_transformer(qwen, Precision::bf16);
  EXPECT_DOUBLE_EQ(net.param_count(), 494032768);
  const Network back = parse_network(write_network(net), "net.yaml");
  ASSERT_TRUE(back.architecture);
  EXPECT_EQ(back.architecture->attention_bias, TransformerConfig::AttentionBias::qkv);
  EXPECT_EQ(back, net);
  // Qwen2's window on every layer (max_window_layers 0) is modelled; on some layers only, noted.
  auto qwen_window = [](int first_windowed) {
    return transformer_from_hf_config(R"({"model_type": "qwen2", "hidden_size": 64, "intermediate_size": 128,
      "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 4, "vocab_size": 100,
      "max_position_embeddings": 1024, "use_sliding_window": true, "sliding_window": 256, "max_window_layers": )" + std::to_string(first_windowed) + "}",
                                      "c.json");
  };
  EXPECT_EQ(qwen_window(0).sliding_window, 256);
  EXPECT_EQ(qwen_window(4).sliding_window, 0);
  EXPECT_EQ(qwen_window(4).unmodelled, "");
  EXPECT_EQ(qwen_window(2).unmodelled, "sliding windows on 2 of 4 layers");
  // Explicit layer_types decide instead of max_window_layers; absent sliding_window is 4096;
  // a null num_key_value_heads is one per query head.
  const std::string qwen_base = R"({"model_type": "qwen2", "hidden_size": 64, "intermediate_size": 128,
    "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 100, "use_sliding_window": true)";
  const TransformerConfig typed = transformer_from_hf_config(
      qwen_base + R"(, "num_key_value_heads": null, "max_window_layers": 0,
      "layer_types": ["full_attention", "full_attention"]})",
      "c.json");
  EXPECT_EQ(typed.sliding_window, 0);
  EXPECT_EQ(typed.unmodelled, "");
  EXPECT_EQ(typed.kv_heads, 0);
  const TransformerConfig all_sliding = transformer_from_hf_config(
      qwen_base + R"(, "num_key_value_heads": 2, "layer_types": ["sliding_attention", "sliding_attention"]})", "c.json");
  EXPECT_EQ(all_sliding.sliding_window, 4096);

  auto llama = [](bool bias) {
    return transformer_from_hf_config(std::string(R"({"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
      "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 100,
      "attention_bias": )") + (bias ? "true" : "false") + "}",
                                      "c.json");
  };
  EXPECT_EQ(llama(true).attention_bias, TransformerConfig::AttentionBias::qkvo);
  // Per layer: q and o biases of 64, k and v of 32 (2 heads of 16).
  EXPECT_DOUBLE_EQ(make_transformer(llama(true), Precision::bf16).param_count() -
                       make_transformer(llama(false), Precision::bf16).param_count(),
                   2 * (64 + 32 + 32 + 64));
  try {
    parse_network("name: n\nprecision: fp32\ntokens_per_sample: 16\narchitecture: {layers: 1, hidden: 8, heads: 2, "
                  "seq: 16, vocab: 10, attention_bias: qkv}\nlayers: []\n",
                  "net.yaml");
    FAIL() << "expected an InputError";
  } catch (const hetflow::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("architecture.attention_bias: names the biases of layers that otherwise have "
                                         "none, but biases is true"),
              std::string::npos)
        << e.what();
  }
}

// YaRN as transformers' current _compute_yarn_parameters reads it: Qwen3's long-context
// settings (its model card's rope_scaling), the factor from the two contexts where absent,
// DeepSeek's mscale ratio, GPT-OSS's untruncated range, transformers 5's rope_parameters; the
// result carried by a network file; bad values named.
TEST(ZooTransformer, ConfigYarnIsReadAsTransformersReadsIt) {
  auto qwen3_with = [](const std::string& scaling, int positions = 131072) {
    return transformer_from_hf_config(R"({"model_type": "qwen3", "hidden_size": 64, "intermediate_size": 128,
      "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "num_hidden_layers": 2, "vocab_size": 100,
      "rope_theta": 1000000, "max_position_embeddings": )" + std::to_string(positions) +
                                          R"(, "rope_scaling": )" + scaling + "}",
                                      "c.json");
  };
  const double ln4 = std::log(4.0);
  const TransformerConfig qwen = qwen3_with(R"({"rope_type": "yarn", "factor": 4.0,
    "original_max_position_embeddings": 32768})");
  EXPECT_EQ(qwen.unmodelled, "");
  EXPECT_EQ(qwen.rope_scaling, (RopeScaling{"yarn", 4, 1, 4, 32768, 32, 1, 0.1 * ln4 + 1, true}));
  const Network net = make_transformer(qwen, Precision::bf16);
  const Network back = parse_network(write_network(net), "net.yaml");
  ASSERT_TRUE(back.architecture);
  EXPECT_EQ(back.architecture->rope_scaling, qwen.rope_scaling);  // the attention factor to the last bit
  EXPECT_EQ(back, net);
  // The factor from the contexts; without original_max_position_embeddings the context is
  // max_position_embeddings (a factor of 1: plain RoPE, but for a given attention factor).
  EXPECT_EQ(qwen3_with(R"({"type": "yarn", "original_max_position_embeddings": 32768})").rope_scaling,
            (RopeScaling{"yarn", 4, 1, 4, 32768, 32, 1, 0.1 * ln4 + 1, true}));
  EXPECT_EQ(qwen3_with(R"({"type": "yarn", "factor": 2})", 4096).rope_scaling,
            (RopeScaling{"yarn", 2, 1, 4, 4096, 32, 1, 0.1 * std::log(2.0) + 1, true}));
  EXPECT_EQ(qwen3_with(R"({"type": "yarn"})").rope_scaling, RopeScaling{});
  EXPECT_EQ(qwen3_with(R"({"type": "yarn", "attention_factor": 1.25})").rope_scaling,
            (RopeScaling{"yarn", 1, 1, 4, 131072, 32, 1, 1.25, true}));
  // DeepSeek's magnitude: mscale(4, 0.707) / mscale(4, 1) where both are non-zero; one of them
  // 0 falls back to mscale(4). Betas given, 0 taken as absent (transformers' `or`); GPT-OSS's
  // truncate false.
  EXPECT_EQ(qwen3_with(R"({"type": "yarn", "factor": 4, "original_max_position_embeddings": 32768,
                          "mscale": 0.707, "mscale_all_dim": 1.0, "beta_fast": 16, "beta_slow": 0, "truncate": false})")
                .rope_scaling,
            (RopeScaling{"yarn", 4, 1, 4, 32768, 16, 1, (0.0707 * ln4 + 1) / (0.1 * ln4 + 1), false}));
  EXPECT_EQ(qwen3_with(R"({"type": "yarn", "factor": 4, "mscale": 0.707, "mscale_all_dim": 0})").rope_scaling,
            (RopeScaling{"yarn", 4, 1, 4, 131072, 32, 1, 0.1 * ln4 + 1, true}));
  // transformers 5 keeps it in rope_parameters.
  const TransformerConfig v5 = transformer_from_hf_config(R"({"model_type": "qwen3", "hidden_size": 64,
    "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "num_hidden_layers": 2, "vocab_size": 100, "max_position_embeddings": 131072,
    "rope_parameters": {"rope_type": "yarn", "rope_theta": 1000000.0,
    "factor": 4.0, "original_max_position_embeddings": 32768}})",
                                                          "c.json");
  EXPECT_EQ(v5.rope_theta, 1000000);
  EXPECT_EQ(v5.rope_scaling, qwen.rope_scaling);
  auto error = [&](const std::string& scaling, int positions = 131072) {
    try {
      qwen3_with(scaling, positions);
    } catch (const hetflow::InputError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error(R"({"type": "yarn", "factor": 0.5})").find("rope_scaling.factor: expected a number >= 1 for yarn "
                                                            "scaling, found 0.5"),
            std::string::npos)
      << error(R"({"type": "yarn", "factor": 0.5})");
  EXPECT_NE(error(R"({"type": "yarn", "original_max_position_embeddings": 8192})", 4096)
                .find("found 0.5 (max_position_embeddings over original_max_position_embeddings)"),
            std::string::npos)
      << error(R"({"type": "yarn", "original_max_position_embeddings": 8192})", 4096);
  EXPECT_NE(error(R"({"type": "yarn", "factor": 4, "original_max_position_embeddings": 32768.5})")
                .find("rope_scaling.original_max_position_embeddings: expected a whole number"),
            std::string::npos);
  EXPECT_NE(error(R"({"type": "yarn", "factor": 4, "beta_fast": -1})").find("rope_scaling.beta_fast: expected a number > 0"),
            std::string::npos);
  EXPECT_NE(error(R"({"type": "yarn", "factor": 4, "truncate": "no"})").find("rope_scaling.truncate: expected true or false"),
            std::string::npos);
  // Without original_max_position_embeddings the context is max_position_embeddings, whose
  // own bound then speaks (this read an absent key once).
  EXPECT_NE(error(R"({"type": "yarn", "factor": 4})", 1 << 30).find("c.json: max_position_embeddings: expected at most"),
            std::string::npos)
      << error(R"({"type": "yarn", "factor": 4})", 1 << 30);
}

// A network file's rope_scaling is checked as a config's, naming the field.
TEST(ZooTransformer, NetworkFileRopeScalingIsChecked) {
  auto parse_error = [](const std::string& family, const std::string& scaling) {
    try {
      parse_network("name: n\nprecision: fp32\ntokens_per_sample: 16\narchitecture: {layers: 1, hidden: 8, heads: 2, "
                    "seq: 16, vocab: 10, " + family + ", dropout: false, rope_scaling: " + scaling + "}\nlayers: []\n",
                    "net.yaml");
    } catch (const hetflow::InputError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  auto error = [&](const std::string& scaling) {
    return parse_error("norm: rmsnorm, mlp: swiglu, biases: false, tied_embeddings: false, learned_positions: false",
                       scaling);
  };
  EXPECT_NE(error("{type: longrope, factor: 4}")
                .find("architecture.rope_scaling.type: expected linear, dynamic, llama3 or yarn"),
            std::string::npos)
      << error("{type: longrope, factor: 4}");
  // YaRN's settings: its context required, its own keys positive, theirs on no other type,
  // and a base its range can divide by.
  for (const auto& [scaling, want] : std::vector<std::pair<std::string, std::string>>{
           {"{type: yarn, factor: 4}", "original_positions: expected a whole number in [1, 134217728] for yarn"},
           {"{type: yarn, factor: 4, original_positions: 8, beta_fast: 0}", "beta_fast: expected a number > 0, found 0"},
           {"{type: yarn, factor: 4, original_positions: 8, attention_factor: 0}",
            "attention_factor: expected a number in (0, 100], found 0"},
           {"{type: yarn, factor: 4, original_positions: 8, attention_factor: 1000}",
            "attention_factor: expected a number in (0, 100], found 1000"},
           {"{type: yarn, factor: 0.5, original_positions: 8}", "factor: expected a number >= 1 for yarn scaling, found 0.5"},
           {"{type: linear, factor: 4, beta_slow: 2}", "beta_slow: is a setting of yarn scaling only"},
           {"{type: llama3, factor: 4, original_positions: 8, truncate: false}", "truncate: is a setting of yarn scaling only"},
       }) {
    EXPECT_NE(error(scaling).find("architecture.rope_scaling." + want), std::string::npos) << error(scaling);
  }
  const std::string theta_one =
      parse_error("norm: rmsnorm, mlp: swiglu, biases: false, tied_embeddings: false, learned_positions: false, "
                  "rope_theta: 1",
                  "{type: yarn, factor: 4, original_positions: 8}");
  EXPECT_NE(theta_one.find("architecture.rope_theta: expected a number > 1 under yarn scaling, found 1"),
            std::string::npos)
      << theta_one;
  EXPECT_NE(error("{type: linear, factor: 4, original_positions: 8}")
                .find("architecture.rope_scaling.original_positions: is not a setting of linear scaling"),
            std::string::npos)
      << error("{type: linear, factor: 4, original_positions: 8}");
  EXPECT_NE(error("{type: dynamic, factor: 2}").find("architecture.rope_scaling.original_positions: expected a whole "
                                                    "number in [1, 134217728] for dynamic scaling"),
            std::string::npos)
      << error("{type: dynamic, factor: 2}");
  // Learned positions have no rotary frequencies to scale.
  EXPECT_NE(parse_error("norm: layernorm, mlp: gelu, biases: true, tied_embeddings: true, learned_positions: true",
                        "{type: linear, factor: 2}")
                .find("architecture.rope_scaling: scales rotary positions, but these layers learn their positions"),
            std::string::npos);
  EXPECT_NE(error("{type: linear, factor: 4, low_freq_factor: 2}")
                .find("architecture.rope_scaling.low_freq_factor: is a setting of llama3 scaling only"),
            std::string::npos)
      << error("{type: linear, factor: 4, low_freq_factor: 2}");
}

// Settings of a config.json that change the math from the layers here are kept as
// `unmodelled` (the cost model counts the plain layers; real math refuses them), and written
// with the network, so a plan file carries them.
TEST(ZooTransformer, ConfigSettingsTheLayersLeaveOutAreNoted) {
  const TransformerConfig c = transformer_from_hf_config(R"({"model_type": "mistral", "hidden_size": 64,
    "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 100,
    "max_position_embeddings": 32768, "sliding_window": 4096, "hidden_act": "gelu", "attention_bias": true,
    "rope_scaling": {"rope_type": "longrope", "factor": 4.0, "original_max_position_embeddings": 8192}})", "c.json");
  EXPECT_EQ(c.unmodelled, "hidden_act gelu, rope_scaling (longrope)");  // Mistral reads no attention_bias
  EXPECT_EQ(c.attention_bias, TransformerConfig::AttentionBias::none);
  EXPECT_EQ(c.rope_scaling, RopeScaling{});
  EXPECT_EQ(c.sliding_window, 4096);  // modelled
  EXPECT_EQ(transformer_from_hf_config(R"({"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4,
    "activation_function": "relu", "scale_attn_by_inverse_layer_idx": true})", "c.json").unmodelled,
            "activation_function relu, scale_attn_by_inverse_layer_idx");
  // What the layers do compute is not noted: the released Llama 2 and GPT-2 configs.
  EXPECT_EQ(transformer_from_hf_config(R"({"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
    "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 100, "hidden_act": "silu",
    "rope_scaling": null, "sliding_window": null})", "c.json").unmodelled, "");
  EXPECT_EQ(transformer_from_hf_config(R"({"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4,
    "activation_function": "gelu_new", "scale_attn_weights": true})", "c.json").unmodelled, "");
  // Kept through a network file (a plan embeds the network).
  const Network net = make_transformer(c, Precision::bf16);
  const Network back = parse_network(write_network(net), "net.yaml");
  ASSERT_TRUE(back.architecture);
  EXPECT_EQ(back.architecture->unmodelled, c.unmodelled);
  EXPECT_EQ(back, net);
}

TEST(ZooTransformer, BertLargeIsAbout340M) {
  // BERT-large encoder + pooler is 335.1M (the HuggingFace BertModel count); the MLM head
  // transform and decoder bias add 1.1M. Devlin et al. quote 340M.
  EXPECT_NEAR(params("bert-large") / 340e6, 1.0, 0.02);
  EXPECT_NEAR(params("bert-base") / 110e6, 1.0, 0.02);
}

TEST(ZooTransformer, TrainingFlopsPerTokenMatchNarayanan) {
  struct Case { const char* name; double l, h, s, v; };
  for (const Case& c : {Case{"gpt3-175b", 96, 12288, 2048, 50257}, Case{"gpt2-xl", 48, 1600, 1024, 50257},
                        Case{"gpt3-6.7b", 32, 4096, 2048, 50257}, Case{"gpt3-1.3b", 24, 2048, 2048, 50257}}) {
    const Network net = network_from_spec(c.name, Precision::fp16);
    const double per_token = net.training_flops_per_sample() / net.tokens_per_sample;
    EXPECT_NEAR(per_token / narayanan_flops_per_token(c.l, c.h, c.s, c.v), 1.0, 0.02) << c.name;
  }
}

TEST(ZooTransformer, TrainingFlopsAreSixNPlusAttention) {
  // 6N per token for the non-embedding weights, plus 12 l s h for attention scores and context.
  const Network net = network_from_spec("gpt3-175b", Precision::fp16);
  const double l = 96, h = 12288, s = 2048, v = 50257;
  const double n_dense = 12 * l * h * h;
  const double expected = 6 * n_dense + 12 * l * s * h + 6 * h * v;
  EXPECT_NEAR(net.training_flops_per_sample() / s / expected, 1.0, 0.02);
}

TEST(ZooTransformer, ActivationBytesMatchKorthikanti) {
  // Korthikanti et al. (2022): a GPT layer stashes s b h (34 + 5 a s / h) bytes in fp16,
  // of which 5 a s^2 b are attention scores (dropped by selective recomputation).
  const Network net = network_from_spec("gpt3-175b", Precision::fp16);
  const double s = 2048, h = 12288, a = 96;
  const Layer& layer = net.layers.at(1);
  ASSERT_EQ(layer.kind, "transformer");
  EXPECT_DOUBLE_EQ(layer.stashed_bytes, s * h * (34 + 5 * a * s / h));
  EXPECT_DOUBLE_EQ(layer.attention_stash_bytes, 5 * a * s * s);
  EXPECT_DOUBLE_EQ(layer.attention_core_flops, 4 * s * s * h);
}

TEST(ZooTransformer, PrecisionChangesBytesNotFlops) {
  const Network half = network_from_spec("gpt2-350m", Precision::fp16);
  const Network full = network_from_spec("gpt2-350m", Precision::fp32);
  EXPECT_DOUBLE_EQ(half.training_flops_per_sample(), full.training_flops_per_sample());
  EXPECT_DOUBLE_EQ(full.param_bytes(), 2 * half.param_bytes());
  EXPECT_GT(full.layers[1].stashed_bytes, 1.8 * half.layers[1].stashed_bytes);
  EXPECT_DOUBLE_EQ(half.adam_training_state_bytes(), 16 * half.param_count());
}

TEST(ZooTransformer, DecoderSpecBuildsAnyDecoder) {
  const Network net = network_from_spec("gpt:layers=24,hidden=2048,heads=16,seq=2048", Precision::fp16);
  EXPECT_DOUBLE_EQ(net.param_count(), params("gpt3-1.3b"));
  EXPECT_EQ(net.layers.size(), 26u);
  const Network gqa = network_from_spec("llama:layers=2,hidden=1024,heads=16,kv_heads=4,ffn=2816", Precision::bf16);
  EXPECT_EQ(gqa.tokens_per_sample, 4096);
}

TEST(ZooTransformer, BadSpecsNameTheField) {
  auto field_of = [](const char* spec) {
    try {
      network_from_spec(spec, Precision::fp16);
    } catch (const hetflow::InputError& e) {
      return e.field();
    }
    return std::string("no error");
  };
  EXPECT_EQ(field_of("gpt:layers=2,hidden=100,heads=3"), "heads");
  EXPECT_EQ(field_of("gpt:layers=x,hidden=128,heads=2"), "layers");
  EXPECT_EQ(field_of("gpt:hidden=128,heads=2"), "layers");
  EXPECT_EQ(field_of("gpt:layers=2,hidden=128,heads=2,depth=3"), "depth");
  EXPECT_EQ(field_of("gpt:layers=0,hidden=128,heads=2"), "layers");
  EXPECT_EQ(field_of("gpt-4"), "model");
}
