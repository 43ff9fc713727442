// A HuggingFace config.json read as a decoder (zoo.hpp's transformer_from_hf_config): the
// keys of GPT-2, LLaMA, Mistral, Mixtral, Qwen2, Qwen3, their MoE and DeepSeek-V2/V3, absent ones taking transformers' defaults for the
// model type, and what the layers here leave out noted as TransformerConfig::unmodelled.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/error.hpp"
#include "model/json_util.hpp"
#include "model/limits.hpp"
#include "model/units.hpp"
#include "model/zoo.hpp"

namespace hetflow::model {

namespace {

using json_util::brief;

// Typed reads of one JSON object's keys, each error naming the file and the key. A key whose
// value is null reads as absent, as transformers' None does.
class Reader {
 public:
  Reader(const nlohmann::json& j, std::string file, std::string prefix = "")
      : j_(j), file_(std::move(file)), prefix_(std::move(prefix)) {}

  bool present(const char* k) const { return j_.contains(k) && !j_[k].is_null(); }
  bool given(const char* k) const { return j_.contains(k); }  // even as null
  const nlohmann::json& at(const char* k) const { return j_[k]; }
  [[noreturn]] void fail(const std::string& key, const std::string& why) const {
    throw InputError(file_, 0, prefix_ + key, why);
  }

  // Integers are read as 64 bits and range-checked: 4294967298 layers is an error, not 2.
  int integer(std::initializer_list<const char*> keys, bool required, int fallback) const {
    for (const char* k : keys) {
      if (!present(k)) continue;
      const nlohmann::json& v = j_[k];
      if (!v.is_number_integer()) fail(k, "expected an integer, found " + brief(v));
      const long long max = std::numeric_limits<int>::max();
      if ((v.is_number_unsigned() && v.get<unsigned long long>() > static_cast<unsigned long long>(max)) ||
          v.get<long long>() > max) {
        fail(k, "expected an integer up to " + std::to_string(max) + ", found " + brief(v));
      }
      const long long x = v.get<long long>();
      if (x < 0) fail(k, "expected an integer >= 0, found " + brief(v));
      return static_cast<int>(x);
    }
    if (required) fail(*keys.begin(), "is required in a HuggingFace config.json");
    return fallback;
  }
  bool boolean(const char* k, bool fallback) const {
    if (!present(k)) return fallback;
    if (!j_[k].is_boolean()) fail(k, "expected true or false, found " + brief(j_[k]));
    return j_[k].get<bool>();
  }
  double positive(const char* k, double fallback) const {
    if (!present(k)) return fallback;
    if (!j_[k].is_number() || !std::isfinite(j_[k].get<double>()) || j_[k].get<double>() <= 0) {
      fail(k, "expected a number > 0, found " + brief(j_[k]));
    }
    return j_[k].get<double>();
  }
  double non_negative(const char* k, double fallback) const {
    if (!present(k)) return fallback;
    if (!j_[k].is_number() || !std::isfinite(j_[k].get<double>()) || j_[k].get<double>() < 0) {
      fail(k, "expected a number >= 0, found " + brief(j_[k]));
    }
    return j_[k].get<double>();
  }
  // A number > 0 that `kind` of scaling requires.
  double required_positive(const char* k, const std::string& kind) const {
    if (!present(k)) fail(k, "is required for " + kind + " scaling");
    return positive(k, 0);
  }
  // A string value, noted as `key value` when it is not one of `modelled`.
  void string_unless(const char* k, std::initializer_list<const char*> modelled, std::vector<std::string>& notes) const {
    if (!present(k)) return;
    if (!j_[k].is_string()) fail(k, "expected a string, found " + brief(j_[k]));
    const std::string v = j_[k].get<std::string>();
    if (std::find(modelled.begin(), modelled.end(), v) == modelled.end()) notes.push_back(std::string(k) + " " + v);
  }
  void true_unmodelled(const char* k, std::vector<std::string>& notes) const {
    if (boolean(k, false)) notes.push_back(k);
  }

 private:
  const nlohmann::json& j_;
  std::string file_;
  std::string prefix_;
};

// The model types read as LLaMA-family decoders, and every type in words.
constexpr const char* kLlamaFamilyTypes[] = {"llama", "mistral",   "mixtral",     "qwen2",       "qwen2_moe",
                                             "qwen3", "qwen3_moe", "deepseek_v2", "deepseek_v3", "glm4_moe"};
constexpr const char* kTypesInWords =
    "gpt2, llama, mistral, mixtral, qwen2, qwen2_moe, qwen3, qwen3_moe, deepseek_v2, deepseek_v3 or glm4_moe";

TransformerConfig read_gpt2(const Reader& r, std::vector<std::string>& notes) {
  TransformerConfig c = gpt_family();
  c.layers = r.integer({"n_layer"}, true, 0);
  c.hidden = r.integer({"n_embd"}, true, 0);
  c.heads = r.integer({"n_head"}, true, 0);
  c.seq = r.integer({"n_positions", "n_ctx"}, false, 1024);
  c.ffn = r.integer({"n_inner"}, false, 0);
  c.vocab = r.integer({"vocab_size"}, false, 50257);
  c.norm_eps = r.positive("layer_norm_epsilon", 1e-5);
  r.string_unless("activation_function", {"gelu_new", "gelu_pytorch_tanh"}, notes);  // GELU's tanh approximation
  r.true_unmodelled("scale_attn_by_inverse_layer_idx", notes);
  r.true_unmodelled("reorder_and_upcast_attn", notes);
  if (!r.boolean("scale_attn_weights", true)) notes.push_back("scale_attn_weights false");
  return c;
}

// YaRN as transformers' current _compute_yarn_parameters reads it: the original context from
// original_max_position_embeddings, else max_position_embeddings (`positions`); the factor
// given, else positions over the original context; the cos and sin scale attention_factor
// given, else mscale(factor, mscale) / mscale(factor, mscale_all_dim) where both are given
// and non-zero (DeepSeek's), else mscale(factor), with mscale(f, m) = 0.1 m ln f + 1 for f > 1
// (1 otherwise); beta_fast 32 and beta_slow 1 unless given (0 and null as absent, its `or`);
// truncate true unless given. A factor or original context of 0 is refused (transformers'
// `or` would take either as absent), as is a negative mscale. Some 4.5x releases took the
// factor from the two contexts even where it was given (the released configs give the same
// number both ways) and 4.4x ones the ramp over max_position_embeddings. DeepSeek's latent attention also scales its softmax
// by mscale(factor, mscale_all_dim)^2, noted as not modelled (its attention is not either).
void read_yarn(const Reader& r, int positions, int original, RopeScaling& s, std::vector<std::string>& notes,
               bool latent_attention) {
  if (original <= 0) r.fail("original_max_position_embeddings", "is absent, and max_position_embeddings is 0: give it");
  s.original_positions = original;
  s.factor = r.positive("factor", static_cast<double>(positions) / original);
  if (!(s.factor >= 1)) {
    r.fail("factor", "expected a number >= 1 for yarn scaling, found " + units::format_number(s.factor) +
                         (r.present("factor") ? "" : " (max_position_embeddings over original_max_position_embeddings)"));
  }
  const auto mscale = [&](double m) { return s.factor <= 1 ? 1.0 : 0.1 * m * std::log(s.factor) + 1.0; };
  const auto nonzero = [&](const char* k) { return r.present(k) && r.non_negative(k, 0) != 0; };
  if (r.present("attention_factor")) {
    s.attention_factor = r.positive("attention_factor", 1);
  } else if (nonzero("mscale") && nonzero("mscale_all_dim")) {
    s.attention_factor = mscale(r.non_negative("mscale", 0)) / mscale(r.non_negative("mscale_all_dim", 0));
  } else {
    s.attention_factor = mscale(1);
  }
  const auto beta = [&](const char* k, double fallback) {
    return r.present(k) && r.at(k).is_number() && r.at(k).get<double>() == 0 ? fallback : r.positive(k, fallback);
  };
  s.beta_fast = beta("beta_fast", 32);
  s.beta_slow = beta("beta_slow", 1);
  s.truncate = r.boolean("truncate", true);
  if (latent_attention && nonzero("mscale_all_dim") && s.factor > 1) {
    notes.push_back("yarn's mscale_all_dim on latent attention's softmax scale");
  }
}

// RoPE: transformers 4 writes the base as rope_theta and its scaling as a `rope_scaling`
// object; transformers 5 both in one `rope_parameters` object.
void read_rope(const Reader& top, const std::string& file, TransformerConfig& c, std::vector<std::string>& notes,
               double default_theta, bool latent_attention) {
  c.rope_theta = top.positive("rope_theta", default_theta);
  const char* key = top.present("rope_parameters") ? "rope_parameters" : top.present("rope_scaling") ? "rope_scaling" : "";
  if (*key == '\0') return;
  const nlohmann::json& object = top.at(key);
  const Reader r(object, file, std::string(key) + ".");
  if (object.is_object() && r.present("rope_theta")) c.rope_theta = r.positive("rope_theta", 0);
  // transformers 4 lets a legacy "type" override "rope_type".
  const char* type_key = object.is_object() && r.given("type") ? "type" : "rope_type";
  const std::string kind =
      object.is_object() && r.given(type_key) && r.at(type_key).is_string() ? r.at(type_key).get<std::string>() : "";
  if (kind != "default" && kind != "linear" && kind != "dynamic" && kind != "llama3" && kind != "yarn") {
    notes.push_back(std::string(key) + (kind.empty() ? std::string() : " (" + kind + ")"));
    return;
  }
  RopeScaling& s = c.rope_scaling;
  if (kind == "default") return;
  s.type = kind;
  // (yarn's falls back to max_position_embeddings, checked against the same bound later)
  const auto original_positions = [&](int fallback) {
    if (kind != "llama3" && !r.present("original_max_position_embeddings")) return fallback;
    const double original = r.required_positive("original_max_position_embeddings", kind);
    if (original != std::floor(original) || original > limits::kMaxSeq) {
      r.fail("original_max_position_embeddings", "expected a whole number up to " + std::to_string(limits::kMaxSeq) +
                                                     ", found " + brief(r.at("original_max_position_embeddings")));
    }
    return static_cast<int>(original);
  };
  if (kind == "yarn") {
    read_yarn(r, c.seq, original_positions(c.seq), s, notes, latent_attention);
  } else {
    s.factor = r.required_positive("factor", kind);
  }
  if (kind == "dynamic") s.original_positions = c.seq;  // the context the model was trained with
  if (kind == "llama3") {
    s.low_freq_factor = r.required_positive("low_freq_factor", kind);
    s.high_freq_factor = r.required_positive("high_freq_factor", kind);
    s.original_positions = original_positions(0);
  }
  // Linear, llama3 or yarn scaling by a factor of 1 stretches nothing (llama3's bands and
  // yarn's ramp then all keep their frequencies; yarn's cos and sin may still be scaled);
  // dynamic's still raises the base beyond the trained context.
  if (s.factor == 1 && s.type != "dynamic" && s.attention_factor == 1) s = RopeScaling{};
}

// Mistral's sliding window: 4096 when the key is absent (the Qwen configs' too; Mixtral's
// none), none when it is null. LLaMA's attention has none (transformers ignores the key there). Qwen2 and
// Qwen3 window only with use_sliding_window, the layers their layer_types call
// "sliding_attention" or, without them, those from max_window_layers on. A window as long as the sequence masks nothing; it is kept
// all the same, for a network run at a longer one.
void read_window(const Reader& r, const std::string& type, TransformerConfig& c, std::vector<std::string>& notes) {
  const bool mistral = type == "mistral" || type == "mixtral";
  const bool qwen = type == "qwen2" || type == "qwen3" || type == "qwen2_moe" || type == "qwen3_moe";
  // MixtralConfig's default is None; MistralConfig's and the Qwen configs' 4096.
  const int window =
      r.given("sliding_window") ? r.integer({"sliding_window"}, false, 0) : type == "mistral" || qwen ? 4096 : 0;
  if (mistral && window > 0) c.sliding_window = window;
  if (!qwen || !r.boolean("use_sliding_window", false) || window == 0) return;
  int windowed = 0;  // layers
  if (r.present("layer_types")) {
    const nlohmann::json& types = r.at("layer_types");
    if (!types.is_array() || types.size() != static_cast<size_t>(c.layers)) {
      r.fail("layer_types",
             "expected a list of num_hidden_layers=" + std::to_string(c.layers) + " strings, found " + brief(types));
    }
    for (const nlohmann::json& t : types) windowed += t.is_string() && t.get<std::string>() == "sliding_attention";
  } else {
    windowed = std::max(0, c.layers - r.integer({"max_window_layers"}, false, 28));
  }
  if (windowed == c.layers) {
    c.sliding_window = window;
  } else if (windowed > 0) {  // one window for the whole stack here
    notes.push_back("sliding windows on " + std::to_string(windowed) + " of " + std::to_string(c.layers) + " layers");
  }
}

// transformers' defaults for a model type's keys where they differ from LLaMA's.
struct TypeDefaults {
  int kv_heads = 0;  // 0: num_attention_heads
  int seq = 2048;
  double rope_theta = 10000;
  int head_dim = 0;  // 0: hidden / heads
  double norm_eps = 1e-6;
};

TypeDefaults defaults_of(const std::string& type) {
  if (type == "mistral") return {8, 131072, 10000, 0};
  if (type == "mixtral") return {8, 131072, 1e6, 0, 1e-5};
  if (type == "qwen2") return {32, 32768, 10000, 0};
  if (type == "qwen2_moe") return {16, 32768, 10000, 0};
  if (type == "qwen3") return {32, 32768, 10000, 128};
  if (type == "qwen3_moe") return {4, 32768, 10000, 0};
  if (type == "deepseek_v3") return {128, 4096, 10000, 0};
  if (type == "deepseek_v2") return {32, 2048, 10000, 0};
  if (type == "glm4_moe") return {8, 131072, 10000, 128, 1e-5};
  return {};
}

// Multi-token prediction's modules (DeepSeek-V3's and GLM-4.5's num_nextn_predict_layers):
// planning and simulation count them (model/zoo_transformer.cpp, mtp_layer); the real
// layers refuse them.
void read_mtp(const Reader& r, TransformerConfig& c) {
  c.mtp_layers = r.integer({"num_nextn_predict_layers"}, false, 0);
  if (c.mtp_layers > 16) {
    r.fail("num_nextn_predict_layers", "expected at most 16 modules, found " + std::to_string(c.mtp_layers));
  }
}

// The mixture of experts of Mixtral, Qwen2-MoE, Qwen3-MoE, DeepSeek-V2/V3 and GLM-4.5, with their
// configs' defaults; which layers are MoE as each model's code decides it.
void read_moe(const Reader& r, const std::string& type, TransformerConfig& c, std::vector<std::string>& notes) {
  MoeConfig& m = c.moe;
  const bool qwen = type == "qwen2_moe" || type == "qwen3_moe", deepseek = type.rfind("deepseek", 0) == 0;
  if (type == "mixtral") {
    m.experts = r.integer({"num_local_experts"}, false, 8);
    m.experts_per_token = r.integer({"num_experts_per_tok"}, false, 2);
    m.expert_ffn = c.ffn;  // every layer's MLP is the mixture
    m.aux_loss_coef = r.non_negative("router_aux_loss_coef", 0.001);
    if (r.non_negative("router_jitter_noise", 0) > 0) notes.push_back("router_jitter_noise");
    m.tensor_names = MoeConfig::TensorNames::mixtral;
    return;
  }
  if (qwen) {
    const bool qwen2 = type == "qwen2_moe";
    m.experts = r.integer({"num_experts"}, false, qwen2 ? 60 : 128);
    m.experts_per_token = r.integer({"num_experts_per_tok"}, false, qwen2 ? 4 : 8);
    m.expert_ffn = r.integer({"moe_intermediate_size"}, false, qwen2 ? 1408 : 768);
    if (qwen2) {
      m.shared_expert_ffn = r.integer({"shared_expert_intermediate_size"}, false, 5632);
      m.shared_experts = m.shared_expert_ffn > 0 ? 1 : 0;
      m.shared_expert_gate = m.shared_experts > 0;
    }
    m.normalize_top_k = r.boolean("norm_topk_prob", false);
    m.aux_loss_coef = r.non_negative("router_aux_loss_coef", 0.001);
    // Layer i is MoE when (i + 1) % decoder_sparse_step == 0 and i is not in mlp_only_layers;
    // a leading run of mlp_only_layers is first_dense_layers here.
    const int step = std::max(1, r.integer({"decoder_sparse_step"}, false, 1));
    int dense_prefix = 0;
    bool listed_elsewhere = false;
    if (r.present("mlp_only_layers")) {
      const nlohmann::json& list = r.at("mlp_only_layers");
      if (!list.is_array()) r.fail("mlp_only_layers", "expected a list of layer indices, found " + brief(list));
      for (const nlohmann::json& v : list) {
        if (!v.is_number_integer()) r.fail("mlp_only_layers", "expected layer indices, found " + brief(v));
        if (v.get<long long>() == dense_prefix) {
          ++dense_prefix;
        } else {
          listed_elsewhere = true;
        }
      }
    }
    if (listed_elsewhere || (dense_prefix > 0 && step > 1)) {
      notes.push_back("mlp_only_layers beyond a leading run");
    }
    m.first_dense_layers = step > 1 ? step - 1 : dense_prefix;
    m.every = step;
    return;
  }
  if (type == "glm4_moe") {
    // Glm4MoeConfig (GLM-4.5): DeepSeek-V3's router (sigmoid scores, the balancing bias,
    // group-limited choice, routed_scaling_factor) and ungated shared experts, MoE from layer
    // first_k_dense_replace on. transformers computes no balance loss for it: only a config
    // that asks (router_aux_loss_coef, Megatron-Core's --moe-aux-loss-coeff) gets one.
    m.experts = r.integer({"n_routed_experts", "num_experts"}, false, 128);
    m.experts_per_token = r.integer({"num_experts_per_tok"}, false, 8);
    m.expert_ffn = r.integer({"moe_intermediate_size"}, false, 1408);
    m.shared_experts = r.integer({"n_shared_experts"}, false, 1);
    m.normalize_top_k = r.boolean("norm_topk_prob", true);
    m.routed_scale = r.positive("routed_scaling_factor", 1.0);
    m.aux_loss_coef = r.non_negative("router_aux_loss_coef", 0);
    m.sequence_aux_loss = r.boolean("seq_aux", false);  // (DeepSeek's key, for a sequence-wise one)
    m.router = MoeConfig::Router::sigmoid;
    m.groups = r.integer({"n_group"}, false, 1);
    m.groups_chosen = r.integer({"topk_group"}, false, 1);
    m.first_dense_layers = r.integer({"first_k_dense_replace"}, false, 1);
    read_mtp(r, c);
    return;
  }
  if (deepseek) {
    const bool v3 = type == "deepseek_v3";
    // DeepseekV2Config leaves the experts None (a dense model) unless given.
    if (!v3 && !r.present("n_routed_experts")) return;
    m.experts = r.integer({"n_routed_experts"}, false, 256);
    m.experts_per_token = r.integer({"num_experts_per_tok"}, !v3, 8);
    m.expert_ffn = r.integer({"moe_intermediate_size"}, false, v3 ? 2048 : 1407);
    m.shared_experts = r.integer({"n_shared_experts"}, false, v3 ? 1 : 0);
    m.normalize_top_k = r.boolean("norm_topk_prob", v3);
    m.routed_scale = r.positive("routed_scaling_factor", v3 ? 2.5 : 1.0);
    m.aux_loss_coef = r.non_negative("aux_loss_alpha", 0.001);
    m.sequence_aux_loss = r.boolean("seq_aux", true);  // (DeepseekV2Config's and V3's default)
    if (r.present("scoring_func")) {
      if (!r.at("scoring_func").is_string()) r.fail("scoring_func", "expected softmax or sigmoid, found " + brief(r.at("scoring_func")));
      const std::string f = r.at("scoring_func").get<std::string>();
      if (f != "softmax" && f != "sigmoid") r.fail("scoring_func", "expected softmax or sigmoid, found '" + f + "'");
      m.router = f == "sigmoid" ? MoeConfig::Router::sigmoid : MoeConfig::Router::softmax;
    } else {
      m.router = v3 ? MoeConfig::Router::sigmoid : MoeConfig::Router::softmax;
    }
    // MoE on layer i when i >= first_k_dense_replace and i % moe_layer_freq == 0: from the
    // first multiple of the frequency at or past the dense layers, every frequency-th.
    const int every = std::max(1, r.integer({"moe_layer_freq"}, false, 1));
    const int first = r.integer({"first_k_dense_replace"}, false, v3 ? 3 : 0);
    m.first_dense_layers = (first + every - 1) / every * every;
    m.every = every;
    const int groups = r.integer({"n_group"}, false, v3 ? 8 : 1), chosen = r.integer({"topk_group"}, false, v3 ? 4 : 1);
    if (m.router == MoeConfig::Router::sigmoid) {  // (checked with the rest: check_moe)
      m.groups = groups;
      m.groups_chosen = chosen;
    } else if (groups > 1 && chosen < groups) {  // DeepSeek-V2's group-limited greedy: the best score per group
      notes.push_back("group-limited routing (topk_group " + std::to_string(chosen) + " of n_group " +
                      std::to_string(groups) + ")");
    }
    read_mtp(r, c);
  }
}

// DeepSeek's multi-head latent attention: q_lora_rank null is no query latent.
void read_mla(const Reader& r, const std::string& type, TransformerConfig& c) {
  MlaConfig& m = c.mla;
  const bool q_null = r.given("q_lora_rank") && !r.present("q_lora_rank");
  m.q_lora_rank = q_null ? 0 : r.integer({"q_lora_rank"}, false, 1536);
  m.kv_lora_rank = r.integer({"kv_lora_rank"}, false, 512);
  m.qk_nope_head_dim = r.integer({"qk_nope_head_dim"}, false, 128);
  m.qk_rope_head_dim = r.integer({"qk_rope_head_dim"}, false, 64);
  m.v_head_dim = r.integer({"v_head_dim"}, false, 128);
  if (m.kv_lora_rank == 0) r.fail("kv_lora_rank", "expected an integer > 0 (" + type + " attention is latent), found 0");
  c.kv_heads = 0;  // every head has its own keys and values, up from the latent
}

// GLM-4.5's rotary positions turn the first partial_rotary_factor of each head (0.5 by
// Glm4MoeConfig's default; transformers 5 keeps it in rope_parameters).
void read_partial_rotary(const Reader& top, const std::string& file, TransformerConfig& c) {
  const bool inner = !top.present("partial_rotary_factor") && top.present("rope_parameters") &&
                     top.at("rope_parameters").is_object() && top.at("rope_parameters").contains("partial_rotary_factor");
  const Reader r = inner ? Reader(top.at("rope_parameters"), file, "rope_parameters.") : top;
  c.partial_rotary_factor = r.positive("partial_rotary_factor", 0.5);
  try {
    check_partial_rotary(c);
  } catch (const InputError& e) {
    r.fail("partial_rotary_factor", e.message());
  }
}

// LLaMA, Mistral, Mixtral, Qwen2, Qwen3, their MoE, DeepSeek-V2/V3 and GLM-4.5: absent keys take
// transformers' defaults for the model type (LlamaConfig, MistralConfig, ...), as loading
// the config there would.
TransformerConfig read_llama_family(const Reader& r, const std::string& type, const std::string& file,
                                    std::vector<std::string>& notes) {
  const bool qwen2 = type == "qwen2" || type == "qwen2_moe", qwen3 = type == "qwen3" || type == "qwen3_moe";
  const bool deepseek = type.rfind("deepseek", 0) == 0, glm = type == "glm4_moe";
  const TypeDefaults d = defaults_of(type);
  TransformerConfig c = llama_family();
  c.layers = r.integer({"num_hidden_layers"}, true, 0);
  c.hidden = r.integer({"hidden_size"}, true, 0);
  c.heads = r.integer({"num_attention_heads"}, true, 0);
  // null is transformers' None: one key/value head per query head, as absent is for LLaMA.
  const bool kv_null = r.given("num_key_value_heads") && !r.present("num_key_value_heads");
  c.kv_heads = kv_null ? 0 : r.integer({"num_key_value_heads"}, false, d.kv_heads);
  if (!r.given("num_key_value_heads") && c.kv_heads > 0 && c.heads % c.kv_heads != 0 && !deepseek) {
    r.fail("num_key_value_heads", "is absent, and transformers' default for " + type + " (" +
                                      std::to_string(c.kv_heads) + ") does not divide num_attention_heads=" +
                                      std::to_string(c.heads) + "; give it");
  }
  c.ffn = r.integer({"intermediate_size"}, true, 0);
  c.seq = r.integer({"max_position_embeddings"}, false, d.seq);
  if (c.seq > limits::kMaxSeq) {
    r.fail("max_position_embeddings", "expected at most " + std::to_string(limits::kMaxSeq) + " positions, found " +
                                          std::to_string(c.seq));
  }
  c.vocab = r.integer({"vocab_size"}, true, 0);
  c.tied_embeddings = r.boolean("tie_word_embeddings", false);
  c.norm_eps = r.positive("rms_norm_eps", d.norm_eps);
  // The head size: hidden / heads unless head_dim says otherwise (Qwen3Config's default is
  // 128). Kept as 0 when it is hidden / heads, so such configs read as they always have.
  if ((qwen3 || glm) && r.given("head_dim") && !r.present("head_dim") && d.head_dim > 0) {
    r.fail("head_dim", "is null; " + type + "'s config keeps None there, and its attention has no head size to run with");
  }
  if (!deepseek) {  // DeepSeek's heads are sized by its latent attention's keys
    const int head_dim = r.integer({"head_dim"}, false, d.head_dim);
    if (r.present("head_dim") && head_dim == 0) r.fail("head_dim", "expected an integer > 0, found 0");
    if (head_dim != 0 && !(c.heads > 0 && head_dim * static_cast<long long>(c.heads) == c.hidden)) c.head_dim = head_dim;
  }
  c.qk_norm = qwen3 || (glm && r.boolean("use_qk_norm", false));
  r.string_unless("hidden_act", {"silu"}, notes);
  // Biases as transformers builds them: Qwen2's q, k and v always; LLaMA's and Qwen3's four
  // attention projections when attention_bias is true, LLaMA's MLP's when mlp_bias is (not
  // modelled); Mistral's never (it reads neither key).
  if (qwen2) c.attention_bias = TransformerConfig::AttentionBias::qkv;
  if ((type == "llama" || qwen3) && r.boolean("attention_bias", false)) {
    c.attention_bias = TransformerConfig::AttentionBias::qkvo;
  }
  if (glm && r.boolean("attention_bias", false)) c.attention_bias = TransformerConfig::AttentionBias::qkv;
  if (glm) read_partial_rotary(r, file, c);
  if (deepseek) r.true_unmodelled("attention_bias", notes);
  if (type == "llama") r.true_unmodelled("mlp_bias", notes);
  read_rope(r, file, c, notes, d.rope_theta, deepseek);
  read_window(r, type, c, notes);
  if (deepseek) read_mla(r, type, c);
  read_moe(r, type, c, notes);
  // Not a transformers key: Megatron-Core's --moe-expert-capacity-factor, for a config that
  // is to be trained dropping tokens past each expert's capacity (absent: dropless).
  if (c.moe.experts > 0) {
    c.moe.capacity_factor = r.non_negative("moe_expert_capacity_factor", 0);
    if (c.moe.capacity_factor > limits::kMaxCapacityFactor) {
      r.fail("moe_expert_capacity_factor", "expected a number up to 1e6, found " + brief(r.at("moe_expert_capacity_factor")));
    }
  }
  return c;
}

}  // namespace

std::string hf_config_sequence_key(const std::string& text, const std::string& file) {
  const nlohmann::json j = json_util::parse<nlohmann::json>(text, file, " (a HuggingFace config.json is a flat object)");
  if (!j.is_object()) return "";
  // The keys read_gpt2 and read_llama_family take it from, in their order.
  for (const char* key : {"max_position_embeddings", "n_positions", "n_ctx"}) {
    if (j.contains(key) && !j[key].is_null()) return key;
  }
  return "";
}

std::optional<int> hf_tokenizer_max_length(const std::string& text, const std::string& file) {
  const nlohmann::json j = json_util::parse<nlohmann::json>(text, file, " (a tokenizer_config.json is a flat object)");
  if (!j.is_object()) throw InputError(file, 0, "(top level)", "expected a JSON object of settings, found " + brief(j));
  if (!j.contains("model_max_length") || j["model_max_length"].is_null()) return std::nullopt;
  const nlohmann::json& v = j["model_max_length"];
  const double tokens = v.is_number() ? v.get<double>() : 0;
  if (!v.is_number() || !(tokens >= 1) || tokens != std::floor(tokens)) {
    throw InputError(file, 0, "model_max_length", "expected a whole number of tokens > 0, found " + brief(v));
  }
  if (tokens > limits::kMaxSeq) return std::nullopt;  // transformers' "no limit", or past any model
  return static_cast<int>(tokens);
}

void apply_tokenizer_max_length(TransformerConfig& config, const std::string& key, std::optional<int> tokenizer_max) {
  if (!tokenizer_max) return;
  // A config without the key took its model type's default; the tokenizer's limit is the
  // better word then, but never past a learned table's rows.
  const bool capped = !key.empty() || config.learned_positions;
  const int seq = capped ? std::min(config.seq, *tokenizer_max) : *tokenizer_max;
  if (seq == config.seq) return;
  if (config.learned_positions && config.positions == 0) config.positions = config.seq;
  config.seq = seq;
}

TransformerConfig transformer_from_hf_config(const std::string& text, const std::string& file) {
  const nlohmann::json j = json_util::parse<nlohmann::json>(text, file, " (a HuggingFace config.json is a flat object)");
  if (!j.is_object()) {
    throw InputError(file, 0, "(top level)", "expected a JSON object of settings, found " + brief(j));
  }
  const Reader r(j, file);
  if (r.present("model_type") && !j["model_type"].is_string()) {
    r.fail("model_type", "expected a string (" + std::string(kTypesInWords) + "), found " + brief(j["model_type"]));
  }
  const std::string type = r.present("model_type") ? j["model_type"].get<std::string>() : std::string("gpt2");
  // Settings that change the math from what the layers here compute: noted, so a simulation
  // still counts the network and a real-math run refuses it (TransformerConfig::unmodelled).
  std::vector<std::string> notes;
  TransformerConfig c;
  if (type == "gpt2") {
    c = read_gpt2(r, notes);
  } else if (std::find(std::begin(kLlamaFamilyTypes), std::end(kLlamaFamilyTypes), type) != std::end(kLlamaFamilyTypes)) {
    c = read_llama_family(r, type, file, notes);
  } else {
    std::string shown = type.size() > 40 ? type.substr(0, 37) + "..." : type;
    r.fail("model_type", "expected " + std::string(kTypesInWords) + ", found '" + shown + "'");
  }
  std::string base = file;
  if (const size_t slash = base.find_last_of('/'); slash != std::string::npos) base = base.substr(slash + 1);
  c.name = type + "(" + base + ")";
  for (const std::string& u : notes) c.unmodelled += (c.unmodelled.empty() ? "" : ", ") + u;
  try {
    check_transformer_config(c);
  } catch (const InputError& e) {
    throw InputError(file, 0, e.field(), e.message());
  }
  return c;
}

}  // namespace hetflow::model
