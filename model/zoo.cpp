// The named networks and the spec strings users type after --model.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/error.hpp"
#include "model/json_util.hpp"
#include "model/gpu.hpp"
#include "model/limits.hpp"
#include "model/zoo.hpp"

namespace hetflow::model {

namespace {

TransformerConfig gpt(std::string name, int layers, int hidden, int heads, int seq) {
  TransformerConfig c;
  c.name = std::move(name);
  c.layers = layers;
  c.hidden = hidden;
  c.heads = heads;
  c.seq = seq;
  c.vocab = 50257;  // GPT-2/GPT-3 BPE vocabulary
  return c;
}

TransformerConfig llama(std::string name, int layers, int hidden, int heads, int kv_heads, int ffn) {
  TransformerConfig c;
  c.name = std::move(name);
  c.layers = layers;
  c.hidden = hidden;
  c.heads = heads;
  c.kv_heads = kv_heads;
  c.ffn = ffn;
  c.seq = 4096;
  c.vocab = 32000;
  c.gated_mlp = true;
  c.biases = false;
  c.rms_norm = true;
  c.tied_embeddings = false;
  c.learned_positions = false;
  c.dropout = false;
  return c;
}

// LLaMA 3 (Grattafiori et al. 2024, and the released config.json files): a 128K vocabulary,
// rope_theta 500000, pretrained at 8192 tokens.
TransformerConfig llama3(std::string name, int layers, int hidden, int heads, int kv_heads, int ffn, bool tied) {
  TransformerConfig c = llama(std::move(name), layers, hidden, heads, kv_heads, ffn);
  c.vocab = 128256;
  c.seq = 8192;
  c.rope_theta = 500000;
  c.tied_embeddings = tied;
  return c;
}

// Qwen2.5 (Qwen Team 2024, and the released config.json files): q, k and v biases,
// rope_theta 1e6, RMSNorm eps 1e-6, pretrained at 4096 tokens before its context was extended.
TransformerConfig qwen25(std::string name, int layers, int hidden, int heads, int kv_heads, int ffn, int vocab,
                         bool tied) {
  TransformerConfig c = llama(std::move(name), layers, hidden, heads, kv_heads, ffn);
  c.vocab = vocab;
  c.rope_theta = 1e6;
  c.norm_eps = 1e-6;
  c.attention_bias = TransformerConfig::AttentionBias::qkv;
  c.tied_embeddings = tied;
  return c;
}

TransformerConfig bert(std::string name, int layers, int hidden, int heads) {
  TransformerConfig c;
  c.name = std::move(name);
  c.layers = layers;
  c.hidden = hidden;
  c.heads = heads;
  c.seq = 512;
  c.vocab = 30522;
  c.encoder = true;
  c.type_vocab = 2;
  return c;
}

struct NamedTransformer {
  TransformerConfig config;
  const char* description;
};

// Shapes from the papers: GPT-3 (Brown et al. 2020, table 2.1), GPT-2 (Radford et al. 2019),
// LLaMA 2 (Touvron et al. 2023, and the released config.json files), BERT (Devlin et al. 2019);
// LLaMA 3, Mistral and Qwen2.5 from their released config.json files.
const std::vector<NamedTransformer>& transformers() {
  static const std::vector<NamedTransformer> list = [] {
    TransformerConfig llama32_1b = llama3("llama3.2-1b", 16, 2048, 32, 8, 8192, true);
    llama32_1b.rope_scaling = {"llama3", 32, 1, 4, 8192};
    TransformerConfig mistral_7b = llama("mistral-7b", 32, 4096, 32, 8, 14336);
    mistral_7b.seq = 8192;
    mistral_7b.sliding_window = 4096;
    return std::vector<NamedTransformer>{
        {gpt("gpt2-124m", 12, 768, 12, 1024), "GPT-2 small, 124M parameters, seq 1024"},
        {gpt("gpt2-350m", 24, 1024, 16, 1024), "GPT-2 medium, 355M parameters, seq 1024"},
        {gpt("gpt2-xl", 48, 1600, 25, 1024), "GPT-2 XL, 1.5B parameters, seq 1024"},
        {gpt("gpt3-1.3b", 24, 2048, 16, 2048), "GPT-3 XL, 1.3B parameters, seq 2048"},
        {gpt("gpt3-6.7b", 32, 4096, 32, 2048), "GPT-3 6.7B, seq 2048"},
        {gpt("gpt3-13b", 40, 5120, 40, 2048),
         "GPT-3 13B, seq 2048 (h=5120: the paper's 5140 is not a multiple of 40 heads)"},
        {gpt("gpt3-175b", 96, 12288, 96, 2048), "GPT-3 175B, seq 2048"},
        {llama("llama2-7b", 32, 4096, 32, 32, 11008), "LLaMA-2 7B, seq 4096"},
        {llama("llama2-13b", 40, 5120, 40, 40, 13824), "LLaMA-2 13B, seq 4096"},
        {llama("llama2-70b", 80, 8192, 64, 8, 28672), "LLaMA-2 70B (grouped-query attention), seq 4096"},
        {llama3("llama3-8b", 32, 4096, 32, 8, 14336, false), "Llama 3 8B, 8.0B parameters, seq 8192"},
        {llama32_1b, "Llama 3.2 1B (tied head, llama3 RoPE scaling), 1.24B parameters, seq 8192"},
        {mistral_7b, "Mistral 7B v0.1 (sliding window of 4096), 7.24B parameters, seq 8192"},
        {qwen25("qwen2.5-0.5b", 24, 896, 14, 2, 4864, 151936, true),
         "Qwen2.5 0.5B (q/k/v biases, tied head), 494M parameters, seq 4096"},
        {qwen25("qwen2.5-7b", 28, 3584, 28, 4, 18944, 152064, false),
         "Qwen2.5 7B (q/k/v biases), 7.6B parameters, seq 4096"},
        {bert("bert-base", 12, 768, 12), "BERT-base, 110M parameters, seq 512"},
        {bert("bert-large", 24, 1024, 16), "BERT-large, 340M parameters, seq 512"},
    };
  }();
  return list;
}

struct NamedCnn {
  const char* name;
  const char* description;
  std::function<Network(Precision)> make;
};

const std::vector<NamedCnn>& cnns() {
  static const std::vector<NamedCnn> list = {
      {"resnet50", "ResNet-50, 25.6M parameters, 224x224 images", [](Precision p) { return make_resnet(50, p); }},
      {"resnet101", "ResNet-101, 44.5M parameters, 224x224 images", [](Precision p) { return make_resnet(101, p); }},
      {"resnet152", "ResNet-152, 60.2M parameters, 224x224 images", [](Precision p) { return make_resnet(152, p); }},
      {"vgg19", "VGG-19, 143.7M parameters, 224x224 images", [](Precision p) { return make_vgg19(p); }},
  };
  return list;
}

std::vector<std::string> known_names() {
  std::vector<std::string> names;
  for (const auto& t : transformers()) names.push_back(t.config.name);
  for (const auto& c : cnns()) names.push_back(c.name);
  return names;
}

int parse_int_field(std::string_view value, const std::string& key, const std::string& file) {
  long long out = 0;
  auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), out);
  if (ec != std::errc() || end != value.data() + value.size() || value.empty()) {
    throw InputError(file, 0, key, "expected a whole number, found '" + std::string(value) + "'");
  }
  if (out < 0 || out > std::numeric_limits<int>::max()) {
    throw InputError(file, 0, key,
                     "expected a whole number between 0 and " + std::to_string(std::numeric_limits<int>::max()) +
                         ", found " + std::string(value));
  }
  return static_cast<int>(out);
}

// "gpt:layers=24,hidden=1024,heads=16,seq=2048" or "llama:..." (gated MLP, RMSNorm, no bias).
TransformerConfig parse_decoder_spec(std::string_view spec) {
  const std::string file = "<spec '" + std::string(spec) + "'>";
  const size_t colon = spec.find(':');
  const std::string_view family = spec.substr(0, colon);
  TransformerConfig c = family == "llama" ? llama("", 0, 0, 0, 0, 0) : gpt("", 0, 0, 0, 0);
  c.name = std::string(spec);
  c.seq = family == "llama" ? 4096 : 2048;
  std::string_view rest = spec.substr(colon + 1);
  bool has_layers = false, has_hidden = false, has_heads = false;
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos) {
      throw InputError(file, 0, std::string(item), "expected key=value");
    }
    const std::string key(item.substr(0, eq));
    const int value = parse_int_field(item.substr(eq + 1), key, file);
    if (key == "layers") { c.layers = value; has_layers = true; }
    else if (key == "hidden") { c.hidden = value; has_hidden = true; }
    else if (key == "heads") { c.heads = value; has_heads = true; }
    else if (key == "seq") c.seq = value;
    else if (key == "ffn") c.ffn = value;
    else if (key == "vocab") c.vocab = value;
    else if (key == "kv_heads") c.kv_heads = value;
    else {
      throw InputError(file, 0, key, "expected one of layers, hidden, heads, seq, ffn, vocab, kv_heads");
    }
  }
  if (!has_layers || !has_hidden || !has_heads) {
    throw InputError(file, 0, !has_layers ? "layers" : !has_hidden ? "hidden" : "heads",
                     "is required (e.g. gpt:layers=24,hidden=1024,heads=16,seq=2048)");
  }
  return c;
}

}  // namespace

std::vector<ZooEntry> zoo_entries() {
  std::vector<ZooEntry> out;
  for (const auto& t : transformers()) out.push_back({t.config.name, t.description});
  for (const auto& c : cnns()) out.push_back({c.name, c.description});
  out.push_back({"gpt:layers=L,hidden=H,heads=A[,seq=S,ffn=F,vocab=V,kv_heads=G]", "any GPT-style decoder", true});
  out.push_back({"llama:layers=L,hidden=H,heads=A[,seq=S,ffn=F,vocab=V,kv_heads=G]", "any LLaMA-style decoder", true});
  return out;
}

const TransformerConfig* zoo_transformer(std::string_view name) {
  for (const auto& t : transformers()) {
    if (t.config.name == name) return &t.config;
  }
  return nullptr;
}

bool is_zoo_spec(std::string_view spec) {
  if (spec.rfind("gpt:", 0) == 0 || spec.rfind("llama:", 0) == 0) return true;
  if (zoo_transformer(spec)) return true;
  for (const auto& c : cnns()) {
    if (spec == c.name) return true;
  }
  return false;
}

Network network_from_spec(std::string_view spec, Precision precision) {
  if (spec.rfind("gpt:", 0) == 0 || spec.rfind("llama:", 0) == 0) {
    TransformerConfig c = parse_decoder_spec(spec);
    try {
      return make_transformer(c, precision);
    } catch (const InputError& e) {
      throw InputError("<spec '" + std::string(spec) + "'>", 0, e.field(), e.message());
    }
  }
  if (const TransformerConfig* c = zoo_transformer(spec)) return make_transformer(*c, precision);
  for (const auto& c : cnns()) {
    if (spec == c.name) return c.make(precision);
  }
  std::string hint;
  for (const std::string& n : nearest_names(spec, known_names())) hint += (hint.empty() ? "" : ", ") + n;
  throw InputError(std::string(spec), 0, "model",
                   "unknown network (not a zoo name, a gpt:/llama: spec or a readable file); nearest: " + hint);
}

namespace {

using json_util::brief;

nlohmann::json parse_hf_json(const std::string& text, const std::string& file) {
  return json_util::parse<nlohmann::json>(text, file, " (a HuggingFace config.json is a flat object)");
}

}  // namespace

TransformerConfig transformer_from_hf_config(const std::string& text, const std::string& file) {
  const nlohmann::json j = parse_hf_json(text, file);
  if (!j.is_object()) {
    throw InputError(file, 0, "(top level)", "expected a JSON object of settings, found " + brief(j));
  }
  auto present = [&](const char* k) { return j.contains(k) && !j[k].is_null(); };
  // Integers are read as 64 bits and range-checked: 4294967298 layers is an error, not 2.
  auto get_int = [&](std::initializer_list<const char*> keys, bool required, int fallback) -> int {
    for (const char* k : keys) {
      if (!present(k)) continue;
      const nlohmann::json& v = j[k];
      if (!v.is_number_integer()) throw InputError(file, 0, k, "expected an integer, found " + brief(v));
      const long long max = std::numeric_limits<int>::max();
      if ((v.is_number_unsigned() && v.get<unsigned long long>() > static_cast<unsigned long long>(max)) ||
          v.get<long long>() > max) {
        throw InputError(file, 0, k, "expected an integer up to " + std::to_string(max) + ", found " + brief(v));
      }
      const long long x = v.get<long long>();
      if (x < 0) throw InputError(file, 0, k, "expected an integer >= 0, found " + brief(v));
      return static_cast<int>(x);
    }
    if (required) throw InputError(file, 0, *keys.begin(), "is required in a HuggingFace config.json");
    return fallback;
  };
  auto get_bool = [&](const char* k, bool fallback) {
    if (!present(k)) return fallback;
    if (!j[k].is_boolean()) throw InputError(file, 0, k, "expected true or false, found " + brief(j[k]));
    return j[k].get<bool>();
  };
  auto get_number = [&](const char* k, double fallback) {
    if (!present(k)) return fallback;
    if (!j[k].is_number() || !std::isfinite(j[k].get<double>()) || j[k].get<double>() <= 0) {
      throw InputError(file, 0, k, "expected a number > 0, found " + brief(j[k]));
    }
    return j[k].get<double>();
  };
  if (present("model_type") && !j["model_type"].is_string()) {
    throw InputError(file, 0, "model_type",
                     "expected a string (gpt2, llama, mistral or qwen2), found " + brief(j["model_type"]));
  }
  const std::string type = present("model_type") ? j["model_type"].get<std::string>() : std::string("gpt2");
  // Settings that change the math from what the layers here compute: noted, so a simulation
  // still counts the network and a real-math run refuses it (TransformerConfig::unmodelled).
  std::vector<std::string> unmodelled;
  auto string_unless = [&](const char* k, std::initializer_list<const char*> modelled) {
    if (!present(k)) return;
    if (!j[k].is_string()) throw InputError(file, 0, k, "expected a string, found " + brief(j[k]));
    const std::string v = j[k].get<std::string>();
    if (std::find(modelled.begin(), modelled.end(), v) == modelled.end()) unmodelled.push_back(std::string(k) + " " + v);
  };
  auto true_unmodelled = [&](const char* k) {
    if (get_bool(k, false)) unmodelled.push_back(k);
  };
  TransformerConfig c;
  if (type == "gpt2") {
    c = gpt("", 0, 0, 0, 0);
    c.layers = get_int({"n_layer"}, true, 0);
    c.hidden = get_int({"n_embd"}, true, 0);
    c.heads = get_int({"n_head"}, true, 0);
    c.seq = get_int({"n_positions", "n_ctx"}, false, 1024);
    c.ffn = get_int({"n_inner"}, false, 0);
    c.vocab = get_int({"vocab_size"}, false, 50257);
    c.norm_eps = get_number("layer_norm_epsilon", 1e-5);
    string_unless("activation_function", {"gelu_new", "gelu_pytorch_tanh"});  // GELU's tanh approximation
    true_unmodelled("scale_attn_by_inverse_layer_idx");
    true_unmodelled("reorder_and_upcast_attn");
    if (!get_bool("scale_attn_weights", true)) unmodelled.push_back("scale_attn_weights false");
  } else if (type == "llama" || type == "mistral" || type == "qwen2") {
    c = llama("", 0, 0, 0, 0, 0);
    c.layers = get_int({"num_hidden_layers"}, true, 0);
    c.hidden = get_int({"hidden_size"}, true, 0);
    c.heads = get_int({"num_attention_heads"}, true, 0);
    // Absent keys take transformers' defaults for the model type (LlamaConfig, MistralConfig,
    // Qwen2Config), as loading the config there would.
    const bool mistral = type == "mistral", qwen2 = type == "qwen2";
    // null is transformers' None: one key/value head per query head, as absent is for LLaMA.
    const bool kv_null = j.contains("num_key_value_heads") && j["num_key_value_heads"].is_null();
    c.kv_heads = kv_null ? 0 : get_int({"num_key_value_heads"}, false, mistral ? 8 : qwen2 ? 32 : 0);
    if (!j.contains("num_key_value_heads") && c.kv_heads > 0 && c.heads % c.kv_heads != 0) {
      throw InputError(file, 0, "num_key_value_heads",
                       "is absent, and transformers' default for " + type + " (" + std::to_string(c.kv_heads) +
                           ") does not divide num_attention_heads=" + std::to_string(c.heads) + "; give it");
    }
    c.ffn = get_int({"intermediate_size"}, true, 0);
    c.seq = get_int({"max_position_embeddings"}, false, mistral ? 131072 : qwen2 ? 32768 : 2048);
    c.vocab = get_int({"vocab_size"}, true, 0);
    c.tied_embeddings = get_bool("tie_word_embeddings", false);
    c.norm_eps = get_number("rms_norm_eps", 1e-6);
    c.rope_theta = get_number("rope_theta", 10000);
    // The shapes: a head size other than hidden / heads would change them all, for the cost
    // model too; refused rather than counted wrong.
    if (const int head_dim = get_int({"head_dim"}, false, 0); head_dim != 0 && c.heads > 0 && head_dim * c.heads != c.hidden) {
      throw InputError(file, 0, "head_dim",
                       std::to_string(head_dim) + " differs from hidden_size / num_attention_heads = " +
                           std::to_string(c.hidden) + " / " + std::to_string(c.heads) + ": not modelled");
    }
    string_unless("hidden_act", {"silu"});
    // Biases as transformers builds them: Qwen2's q, k and v always; LLaMA's four attention
    // projections when attention_bias is true, its MLP's when mlp_bias is (not modelled);
    // Mistral's never (it reads neither key).
    if (type == "qwen2") c.attention_bias = TransformerConfig::AttentionBias::qkv;
    if (type == "llama" && get_bool("attention_bias", false)) c.attention_bias = TransformerConfig::AttentionBias::qkvo;
    if (type == "llama") true_unmodelled("mlp_bias");
    // RoPE: transformers 4 writes the base as rope_theta and its scaling as a `rope_scaling`
    // object; transformers 5 both in one `rope_parameters` object.
    const char* rope_key = present("rope_parameters") ? "rope_parameters" : present("rope_scaling") ? "rope_scaling" : "";
    if (*rope_key != '\0') {
      const std::string prefix = std::string(rope_key) + ".";
      const nlohmann::json& r = j[rope_key];
      auto number = [&](const char* k, const std::string& kind) {
        if (!r.contains(k)) throw InputError(file, 0, prefix + k, "is required for " + kind + " scaling");
        const nlohmann::json& v = r[k];
        if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() <= 0) {
          throw InputError(file, 0, prefix + k, "expected a number > 0, found " + brief(v));
        }
        return v.get<double>();
      };
      if (r.is_object() && r.contains("rope_theta")) c.rope_theta = number("rope_theta", "any");
      // transformers 4 lets a legacy "type" override "rope_type".
      const char* key = r.is_object() && r.contains("type") ? "type" : "rope_type";
      const std::string kind = r.is_object() && r.contains(key) && r[key].is_string() ? r[key].get<std::string>() : "";
      RopeScaling& s = c.rope_scaling;
      if (kind == "linear" || kind == "dynamic" || kind == "llama3") {
        s.type = kind;
        s.factor = number("factor", kind);
      }
      if (kind == "dynamic") s.original_positions = c.seq;  // the context the model was trained with
      if (kind == "llama3") {
        s.low_freq_factor = number("low_freq_factor", kind);
        s.high_freq_factor = number("high_freq_factor", kind);
        const double original = number("original_max_position_embeddings", kind);
        if (original != std::floor(original) || original > limits::kMaxSeq) {
          throw InputError(file, 0, prefix + "original_max_position_embeddings",
                           "expected a whole number up to " + std::to_string(limits::kMaxSeq) + ", found " +
                               brief(r["original_max_position_embeddings"]));
        }
        s.original_positions = static_cast<int>(original);
      }
      // Linear or llama3 scaling by a factor of 1 stretches nothing (llama3's bands then all
      // keep their frequencies); dynamic's still raises the base beyond the trained context.
      if (s.factor == 1 && s.type != "dynamic") s = RopeScaling{};
      if (kind != "default" && kind != "linear" && kind != "dynamic" && kind != "llama3") {
        unmodelled.push_back(std::string(rope_key) + (kind.empty() ? std::string() : " (" + kind + ")"));
      }
    }
    // Mistral's sliding window: 4096 when the key is absent (Qwen2's too), none when it is
    // null. LLaMA's attention has none (transformers ignores the key there). Qwen2 windows
    // only with use_sliding_window, the layers its layer_types call "sliding_attention" or,
    // without them, those from max_window_layers on. A window as long as the sequence masks
    // nothing; it is kept all the same, for a network run at a longer one.
    const int window = j.contains("sliding_window") ? get_int({"sliding_window"}, false, 0) : mistral || qwen2 ? 4096 : 0;
    if (mistral && window > 0) c.sliding_window = window;
    if (qwen2 && get_bool("use_sliding_window", false) && window > 0) {
      int windowed = 0;  // layers
      if (present("layer_types")) {
        const nlohmann::json& types = j["layer_types"];
        if (!types.is_array() || types.size() != static_cast<size_t>(c.layers)) {
          throw InputError(file, 0, "layer_types", "expected a list of num_hidden_layers=" + std::to_string(c.layers) +
                                                       " strings, found " + brief(types));
        }
        for (const nlohmann::json& t : types) windowed += t.is_string() && t.get<std::string>() == "sliding_attention";
      } else {
        windowed = std::max(0, c.layers - get_int({"max_window_layers"}, false, 28));
      }
      if (windowed == c.layers) {
        c.sliding_window = window;
      } else if (windowed > 0) {  // one window for the whole stack here
        unmodelled.push_back("sliding windows on " + std::to_string(windowed) + " of " + std::to_string(c.layers) +
                             " layers");
      }
    }
  } else {
    std::string shown = type.size() > 40 ? type.substr(0, 37) + "..." : type;
    throw InputError(file, 0, "model_type", "expected gpt2, llama, mistral or qwen2, found '" + shown + "'");
  }
  std::string base = file;
  if (const size_t slash = base.find_last_of('/'); slash != std::string::npos) base = base.substr(slash + 1);
  c.name = type + "(" + base + ")";
  for (const std::string& u : unmodelled) c.unmodelled += (c.unmodelled.empty() ? "" : ", ") + u;
  try {
    check_transformer_config(c);
  } catch (const InputError& e) {
    throw InputError(file, 0, e.field(), e.message());
  }
  return c;
}

}  // namespace hetflow::model
