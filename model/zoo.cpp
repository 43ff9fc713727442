// The named networks and the spec strings users type after --model.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "model/error.hpp"
#include "model/gpu.hpp"
#include "model/limits.hpp"
#include "model/zoo.hpp"

namespace hetflow::model {

TransformerConfig gpt_family() {
  TransformerConfig c;
  c.seq = 2048;
  c.vocab = 50257;  // GPT-2/GPT-3 BPE vocabulary
  return c;
}

TransformerConfig llama_family() {
  TransformerConfig c;
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

namespace {

TransformerConfig gpt(std::string name, int layers, int hidden, int heads, int seq) {
  TransformerConfig c = gpt_family();
  c.name = std::move(name);
  c.layers = layers;
  c.hidden = hidden;
  c.heads = heads;
  c.seq = seq;
  return c;
}

TransformerConfig llama(std::string name, int layers, int hidden, int heads, int kv_heads, int ffn) {
  TransformerConfig c = llama_family();
  c.name = std::move(name);
  c.layers = layers;
  c.hidden = hidden;
  c.heads = heads;
  c.kv_heads = kv_heads;
  c.ffn = ffn;
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

// Qwen3 (Qwen Team 2025, and the released config.json files): heads of 128 whatever the
// width, QK-norm, no biases, rope_theta 1e6, RMSNorm eps 1e-6, pretrained at 4096 tokens
// before its context was extended.
TransformerConfig qwen3(std::string name, int layers, int hidden, int heads, int kv_heads, int ffn, bool tied) {
  TransformerConfig c = llama(std::move(name), layers, hidden, heads, kv_heads, ffn);
  c.head_dim = 128;
  c.qk_norm = true;
  c.vocab = 151936;
  c.rope_theta = 1e6;
  c.norm_eps = 1e-6;
  c.tied_embeddings = tied;
  return c;
}

// Mixtral (Jiang et al. 2024, and the released config.json files): Mistral's layers with 8
// SwiGLU experts, top-2, softmax router renormalised over the two; rope_theta 1e6, no sliding
// window. Planned at 4096 tokens, Megatron-Core's Mixtral recipe's length (its context is 32K).
TransformerConfig mixtral(std::string name, int layers, int hidden, int heads, int ffn, int vocab, double aux_loss) {
  TransformerConfig c = llama(std::move(name), layers, hidden, heads, 8, 0);
  c.vocab = vocab;
  c.rope_theta = 1e6;
  c.moe.experts = 8;
  c.moe.experts_per_token = 2;
  c.moe.expert_ffn = ffn;
  c.moe.aux_loss_coef = aux_loss;
  c.moe.tensor_names = MoeConfig::TensorNames::mixtral;
  return c;
}

// Qwen3-MoE (Qwen Team 2025, and the released config.json files): Qwen3's layers (QK-norm,
// heads of 128) with 128 experts, top-8, no shared expert, the chosen weights renormalised
// (norm_topk_prob true).
TransformerConfig qwen3_moe(std::string name, int layers, int hidden, int heads, int expert_ffn) {
  TransformerConfig c = qwen3(std::move(name), layers, hidden, heads, 4, 0, false);
  c.moe.experts = 128;
  c.moe.experts_per_token = 8;
  c.moe.expert_ffn = expert_ffn;
  c.moe.aux_loss_coef = 0.001;
  return c;
}

// Qwen1.5-MoE-A2.7B (Qwen Team 2024, the released config.json): 60 experts of 1408, top-4,
// weights not renormalised, one shared expert of 5632 behind a sigmoid gate, q/k/v biases.
TransformerConfig qwen15_moe() {
  TransformerConfig c = qwen25("qwen1.5-moe-a2.7b", 24, 2048, 16, 16, 5632, 151936, false);
  c.seq = 8192;
  c.moe.experts = 60;
  c.moe.experts_per_token = 4;
  c.moe.expert_ffn = 1408;
  c.moe.shared_experts = 1;
  c.moe.shared_expert_ffn = 5632;
  c.moe.shared_expert_gate = true;
  c.moe.normalize_top_k = false;
  c.moe.aux_loss_coef = 0.001;
  return c;
}

// DeepSeek-V3 (DeepSeek-AI 2024, arXiv:2412.19437, and the released config.json): 61 layers,
// the first 3 dense (ffn 18432), then 256 routed experts of 2048, top-8, and one shared;
// sigmoid scores with a per-expert bias, chosen in the best 4 of 8 groups of 32 experts, the
// chosen 8 renormalised and scaled by 2.5; the
// sequence-wise balance loss at alpha 0.0001 (section 4.2); multi-head latent attention with
// 128 heads. Pretrained at 4096 tokens with one multi-token prediction module (a 62nd block,
// an MoE one, with eh_proj and norms: 11.6B more parameters); the main model is the report's
// 671B parameters, 37B active, the released checkpoint's 685B both and the module's copies of
// the embedding and head.
TransformerConfig deepseek_v3() {
  TransformerConfig c = llama("deepseek-v3", 61, 7168, 128, 128, 18432);
  c.vocab = 129280;
  c.norm_eps = 1e-6;
  c.mla = {1536, 512, 128, 64, 128};
  c.moe.experts = 256;
  c.moe.experts_per_token = 8;
  c.moe.expert_ffn = 2048;
  c.moe.shared_experts = 1;
  c.moe.router = MoeConfig::Router::sigmoid;
  c.moe.groups = 8;
  c.moe.groups_chosen = 4;
  c.moe.routed_scale = 2.5;
  c.moe.aux_loss_coef = 0.0001;
  c.moe.sequence_aux_loss = true;
  c.moe.first_dense_layers = 3;
  c.mtp_layers = 1;  // trained with one multi-token prediction module (section 2.2, D = 1)
  return c;
}

// DeepSeek-V2-Lite (DeepSeek-AI 2024, arXiv:2405.04434, and the released config.json): MLA
// without a query latent, the first layer dense (ffn 10944), then 64 routed experts of 1408,
// top-6, softmax weights not renormalised, and 2 shared experts; the sequence-wise balance
// loss.
TransformerConfig deepseek_v2_lite() {
  TransformerConfig c = llama("deepseek-v2-lite", 27, 2048, 16, 16, 10944);
  c.vocab = 102400;
  c.norm_eps = 1e-6;
  c.mla = {0, 512, 128, 64, 128};
  c.moe.experts = 64;
  c.moe.experts_per_token = 6;
  c.moe.expert_ffn = 1408;
  c.moe.shared_experts = 2;
  c.moe.normalize_top_k = false;
  c.moe.aux_loss_coef = 0.001;
  c.moe.sequence_aux_loss = true;  // (its config's seq_aux)
  c.moe.first_dense_layers = 1;
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
// LLaMA 3, Mistral, Qwen2.5 and Qwen3 from their released config.json files.
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
        {qwen3("qwen3-0.6b", 28, 1024, 16, 8, 3072, true),
         "Qwen3 0.6B (heads of 128, QK-norm, tied head), 596M parameters, seq 4096"},
        {qwen3("qwen3-8b", 36, 4096, 32, 8, 12288, false), "Qwen3 8B (QK-norm), 8.2B parameters, seq 4096"},
        {mixtral("mixtral-8x7b", 32, 4096, 32, 14336, 32000, 0.02),
         "Mixtral 8x7B (8 experts, top-2), 46.7B parameters, 12.9B active, seq 4096"},
        {mixtral("mixtral-8x22b", 56, 6144, 48, 16384, 32768, 0.001),
         "Mixtral 8x22B (8 experts, top-2), 140.6B parameters, 39.2B active, seq 4096"},
        {qwen15_moe(), "Qwen1.5-MoE-A2.7B (60 experts, top-4, a gated shared expert), 14.3B parameters, 2.7B active, seq 8192"},
        {qwen3_moe("qwen3-30b-a3b", 48, 2048, 32, 768),
         "Qwen3-30B-A3B (128 experts, top-8), 30.5B parameters, 3.3B active, seq 4096"},
        {qwen3_moe("qwen3-235b-a22b", 94, 4096, 64, 1536),
         "Qwen3-235B-A22B (128 experts, top-8), 235.1B parameters, 22.2B active, seq 4096"},
        {deepseek_v2_lite(), "DeepSeek-V2-Lite (MLA, 64 experts top-6 + 2 shared), 15.7B parameters, 2.7B active, seq 4096"},
        {deepseek_v3(), "DeepSeek-V3 (MLA, 256 experts top-8 + 1 shared, 1 MTP module), 671B parameters + 11.6B MTP, "
                        "37.6B active, seq 4096"},
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
    else if (key == "head_dim") c.head_dim = value;
    else if (key == "experts") c.moe.experts = value;
    else if (key == "experts_per_token") c.moe.experts_per_token = value;
    else if (key == "expert_ffn") c.moe.expert_ffn = value;
    else if (key == "shared_experts") c.moe.shared_experts = value;
    else {
      throw InputError(file, 0, key,
                       "expected one of layers, hidden, heads, seq, ffn, vocab, kv_heads, head_dim, experts, "
                       "experts_per_token, expert_ffn, shared_experts");
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
  out.push_back({"gpt:layers=L,hidden=H,heads=A[,seq=S,ffn=F,vocab=V,kv_heads=G,head_dim=D]", "any GPT-style decoder", true});
  out.push_back({"llama:layers=L,hidden=H,heads=A[,seq=S,ffn=F,vocab=V,kv_heads=G,head_dim=D]", "any LLaMA-style decoder", true});
  out.push_back({"llama:...,experts=E,experts_per_token=K,expert_ffn=F[,shared_experts=N]",
                 "the same with a mixture of E SwiGLU experts on every layer, K per token", true});
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

}  // namespace hetflow::model
