// Network descriptions in YAML (JSON accepted), and resolving --model / --cluster arguments.
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "model/error.hpp"
#include "model/io.hpp"
#include "model/limits.hpp"
#include "model/units.hpp"
#include "model/yaml_util.hpp"
#include "model/zoo.hpp"

namespace hetflow::model {

using yaml_util::MapReader;

namespace {
// A sample on storage: 1 B up to 1 PiB, the range of a memory size.
const MapReader::Range kSampleBytes{1, limits::kMaxMemory, units::format_bytes};

// A layer's `ops:` list (model::CnnOp), each `{op: conv, in: [h, w, c], out: [h, w, c], kernel:
// k, input_grad: false}`; `in` is needed by convolutions, fully connected layers and pools.
std::vector<CnnOp> parse_cnn_ops(const YAML::Node& list, const std::string& file, const std::string& path) {
  if (!list.IsSequence()) throw InputError(file, yaml_util::line_of(list), path, "expected a list of operations");
  std::vector<CnnOp> ops;
  for (size_t i = 0; i < list.size(); ++i) {
    MapReader r(list[i], file, path + "[" + std::to_string(i) + "]");
    CnnOp op;
    const std::string name = r.string("op");
    const auto kind = cnn_op_kind(name);
    if (!kind) r.fail("op", "expected conv, fc, batch_norm, relu, max_pool, avg_pool, add or bias, found '" + name + "'");
    op.kind = *kind;
    const auto dims = [&r, &file](const std::string& key) {
      const YAML::Node d = r.required(key);
      if (!d.IsSequence() || d.size() != 3) r.fail(key, "expected [height, width, channels]");
      std::array<std::int64_t, 3> out{};
      for (size_t k = 0; k < 3; ++k) {
        const std::string s = yaml_util::scalar(d[k], file, r.field(key));
        std::int64_t v = 0;
        try {
          size_t used = 0;
          v = std::stoll(s, &used);
          if (used != s.size()) v = 0;
        } catch (const std::exception&) {
          v = 0;
        }
        if (v < 1 || v > limits::kMaxCnnDim) {
          r.fail_at(d[k], r.field(key), "expected a whole number from 1 to " + std::to_string(limits::kMaxCnnDim) +
                                            ", found '" + s + "'");
        }
        out[k] = v;
      }
      return out;
    };
    const bool gemm = op.kind == CnnOp::Kind::conv || op.kind == CnnOp::Kind::fc;
    if (gemm || op.kind == CnnOp::Kind::max_pool || op.kind == CnnOp::Kind::avg_pool) op.in = dims("in");
    op.out = dims("out");
    op.kernel = op.kind == CnnOp::Kind::conv ? r.int_or("kernel", 1, 1, 64) : 1;
    op.input_grad = gemm ? r.boolean_or("input_grad", true) : true;
    r.finish();
    ops.push_back(op);
  }
  return ops;
}

// A layer's tensor-parallel collectives, in forward order; their elements must add up to
// the layer's totals, which the estimate reads.
std::vector<TpCall> parse_tp_calls(const YAML::Node& list, const std::string& file, const std::string& path,
                                   const Layer& l) {
  if (!list.IsSequence()) throw InputError(file, yaml_util::line_of(list), path, "expected a list of {op, elems, at}");
  std::vector<TpCall> calls;
  double f = 0, g = 0;
  for (size_t i = 0; i < list.size(); ++i) {
    MapReader r(list[i], file, path + "[" + std::to_string(i) + "]");
    TpCall call;
    const std::string name = r.string("op");
    const auto op = tp_call_op(name);
    if (!op) r.fail("op", "expected f, g or loss, found '" + name + "'");
    call.op = *op;
    call.elems = r.number("elems", 0, limits::kMaxLayerValue);
    call.at = r.number_or("at", 1, 0, 1);
    r.finish();
    (call.op == TpCall::Op::f ? f : g) += call.elems;
    calls.push_back(call);
  }
  const auto same = [](double a, double b) { return std::abs(a - b) <= 1e-9 * std::max(std::abs(a), std::abs(b)); };
  if (!same(f, l.tp_backward_allreduce_elems) || !same(g, l.tp_allreduce_elems)) {
    throw InputError(file, yaml_util::line_of(list), path,
                     "expected f calls adding up to tp_backward_allreduce_elems and g and loss calls to "
                     "tp_allreduce_elems, found " + units::format_number(f) + " and " + units::format_number(g));
  }
  return calls;
}

Layer parse_layer(const YAML::Node& node, const std::string& file, const std::string& path, int index) {
  MapReader r(node, file, path);
  Layer l;
  l.name = r.string("name");
  l.kind = r.string_or("kind", "layer");
  l.shape = r.string_or("shape", "");
  if (r.has("inputs")) {
    const YAML::Node list = r.get("inputs");
    if (!list.IsSequence()) r.fail("inputs", "expected a list of earlier layer indices");
    for (size_t i = 0; i < list.size(); ++i) {
      const std::string s = yaml_util::scalar(list[i], file, r.field("inputs"));
      int v = -1;
      try {
        size_t used = 0;
        v = std::stoi(s, &used);
        if (used != s.size()) v = -1;
      } catch (const std::exception&) {
        v = -1;
      }
      if (v < 0 || v >= index) {
        r.fail_at(list[i], r.field("inputs"),
                  "expected the index of an earlier layer (0.." + std::to_string(index - 1) +
                      "; layers are listed in topological order), found '" + s + "'");
      }
      l.inputs.push_back(v);
    }
  } else if (index > 0) {
    l.inputs = {index - 1};
  }
  // Per-sample figures, each at most limits::kMaxLayerValue: sums over layers and products
  // with batch sizes stay finite.
  constexpr double kMax = limits::kMaxLayerValue;
  l.forward_flops = r.number_or("forward_flops", 0, 0, kMax);
  l.backward_flops = r.number_or("backward_flops", 2 * l.forward_flops, 0, kMax);
  l.params = r.number_or("params", 0, 0, kMax);
  l.tied_params = r.number_or("tied_params", 0, 0, kMax);
  l.output_elems = r.number("output_elems", 0, kMax);
  l.stashed_bytes = r.number_or("stashed_bytes", 0, 0, kMax);
  l.attention_stash_bytes = r.number_or("attention_stash_bytes", 0, 0, kMax);
  l.attention_core_flops = r.number_or("attention_core_flops", 0, 0, kMax);
  l.tp_splittable = r.boolean_or("tp_splittable", false);
  l.tp_units = r.int_or("tp_units", 0, 0, limits::kMaxHeads);
  l.tp_allreduce_elems = r.number_or("tp_allreduce_elems", 0, 0, kMax);
  l.tp_allreduces = r.int_or("tp_allreduces", l.tp_allreduce_elems > 0 ? 1 : 0, 0, 1 << 20);
  if (l.tp_allreduce_elems > 0 && l.tp_allreduces < 1) r.fail("tp_allreduces", "expected at least 1 where tp_allreduce_elems is");
  const bool backward_given = r.has("tp_backward_allreduce_elems");
  l.tp_backward_allreduce_elems = r.number_or("tp_backward_allreduce_elems", l.tp_allreduce_elems, 0, kMax);
  l.tp_backward_allreduces =
      r.int_or("tp_backward_allreduces",
               backward_given ? (l.tp_backward_allreduce_elems > 0 ? 1 : 0) : l.tp_allreduces, 0, 1 << 20);
  if (l.tp_backward_allreduce_elems > 0 && l.tp_backward_allreduces < 1) {
    r.fail("tp_backward_allreduces", "expected at least 1 where tp_backward_allreduce_elems is");
  }
  l.tp_replicated_bytes = r.number_or("tp_replicated_bytes", 0, 0, kMax);
  l.tp_whole_bytes = r.number_or("tp_whole_bytes", 0, 0, kMax);
  l.tp_summed_gains = r.number_or("tp_summed_gains", 0, 0, kMax);
  l.tp_summed_gains_sequence_parallel = r.number_or("tp_summed_gains_sequence_parallel", 0, 0, kMax);
  if (r.has("tp_calls")) l.tp_calls = parse_tp_calls(r.get("tp_calls"), file, r.field("tp_calls"), l);
  l.experts = r.int_or("experts", 0, 0, limits::kMaxExperts);
  l.experts_per_token = r.int_or("experts_per_token", 0, 0, limits::kMaxExperts);
  l.expert_params = r.number_or("expert_params", 0, 0, kMax);
  if (l.experts == 0 && (l.experts_per_token > 0 || l.expert_params > 0)) {
    r.fail(l.experts_per_token > 0 ? "experts_per_token" : "expert_params",
           "is a setting of routed experts; experts is 0");
  }
  if (l.experts > 0 && (l.experts_per_token < 1 || l.experts_per_token > l.experts)) {
    r.fail("experts_per_token", "expected a whole number between 1 and experts=" + std::to_string(l.experts));
  }
  if (l.experts * l.expert_params > l.params) {
    r.fail("expert_params", "expected experts x expert_params at most params (the experts are a part of them)");
  }
  if (l.attention_stash_bytes > l.stashed_bytes) {
    r.fail("attention_stash_bytes", "expected at most stashed_bytes (it is a part of it)");
  }
  if (r.has("ops")) {
    l.cnn_ops = parse_cnn_ops(r.get("ops"), file, r.field("ops"));
    double macs = 0;
    for (const CnnOp& op : l.cnn_ops) macs += cnn_op_macs(op);
    if (macs > 0 && std::abs(2 * macs - l.forward_flops) > 1e-9 * l.forward_flops) {
      r.fail("ops", "its convolutions and fully connected layers make " + units::format_number(2 * macs) +
                        " FLOPs a sample forward, where forward_flops says " + units::format_number(l.forward_flops));
    }
  }
  r.finish();
  return l;
}

// `rope_scaling:` of an architecture, HuggingFace's keys but original_positions.
RopeScaling parse_rope_scaling(const YAML::Node& node, const std::string& file, const std::string& path) {
  MapReader r(node, file, path);
  RopeScaling s;
  s.type = r.string("type");
  s.factor = r.number("factor", 0);
  s.low_freq_factor = r.number_or("low_freq_factor", 1, 0);
  s.high_freq_factor = r.number_or("high_freq_factor", 4, 0);
  s.original_positions = r.int_or("original_positions", 0, 0, limits::kMaxSeq);
  s.beta_fast = r.number_or("beta_fast", 32, 0);
  s.beta_slow = r.number_or("beta_slow", 1, 0);
  s.attention_factor = r.number_or("attention_factor", 1, 0);
  s.truncate = r.boolean_or("truncate", true);
  r.finish();
  try {
    check_rope_scaling(s);
  } catch (const InputError& e) {
    r.fail(e.field().substr(std::string("rope_scaling.").size()), e.message());
  }
  return s;
}

// `moe:` of an architecture, MoeConfig's names.
MoeConfig parse_moe(const YAML::Node& node, const std::string& file, const std::string& path) {
  MapReader r(node, file, path);
  MoeConfig m;
  m.experts = r.positive_int("experts", limits::kMaxExperts);
  m.experts_per_token = r.positive_int("experts_per_token", limits::kMaxExperts);
  m.expert_ffn = r.positive_int("expert_ffn", limits::kMaxFfn);
  m.shared_experts = r.int_or("shared_experts", 0, 0, limits::kMaxExperts);
  m.shared_expert_ffn = r.int_or("shared_expert_ffn", 0, 0, limits::kMaxFfn);
  m.shared_expert_gate = r.boolean_or("shared_expert_gate", false);
  const std::string router = r.string_or("router", "softmax");
  if (router != "softmax" && router != "sigmoid") r.fail("router", "expected softmax or sigmoid, found '" + router + "'");
  m.router = router == "sigmoid" ? MoeConfig::Router::sigmoid : MoeConfig::Router::softmax;
  m.groups = r.int_or("groups", 1, 1, 64);
  m.groups_chosen = r.int_or("groups_chosen", m.groups, 1, 64);
  m.normalize_top_k = r.boolean_or("normalize_top_k", true);
  m.routed_scale = r.number_or("routed_scale", 1, 0, limits::kMaxCapacityFactor);
  m.capacity_factor = r.number_or("capacity_factor", 0, 0, limits::kMaxCapacityFactor);
  m.aux_loss_coef = r.number_or("aux_loss_coef", 0, 0, limits::kMaxCapacityFactor);
  m.sequence_aux_loss = r.boolean_or("sequence_aux_loss", false);
  m.first_dense_layers = r.int_or("first_dense_layers", 0, 0, limits::kMaxTransformerLayers);
  m.every = r.int_or("every", 1, 1, limits::kMaxTransformerLayers);
  const std::string names = r.string_or("tensor_names", "qwen");
  if (names != "qwen" && names != "mixtral") r.fail("tensor_names", "expected qwen or mixtral, found '" + names + "'");
  m.tensor_names = names == "mixtral" ? MoeConfig::TensorNames::mixtral : MoeConfig::TensorNames::qwen;
  r.finish();
  return m;
}

// `mla:` of an architecture, MlaConfig's names (HuggingFace's).
MlaConfig parse_mla(const YAML::Node& node, const std::string& file, const std::string& path) {
  MapReader r(node, file, path);
  MlaConfig m;
  m.q_lora_rank = r.int_or("q_lora_rank", 0, 0, limits::kMaxHidden);
  m.kv_lora_rank = r.positive_int("kv_lora_rank", limits::kMaxHidden);
  m.qk_nope_head_dim = r.int_or("qk_nope_head_dim", 0, 0, limits::kMaxHidden);
  m.qk_rope_head_dim = r.int_or("qk_rope_head_dim", 0, 0, limits::kMaxHidden);
  m.v_head_dim = r.positive_int("v_head_dim", limits::kMaxHidden);
  r.finish();
  return m;
}

// `architecture:` of a transformer stack: the shapes an executor builds real layers from.
// Norm and MLP kinds are written as words (layernorm|rmsnorm, gelu|swiglu), not flags.
TransformerConfig parse_architecture(const YAML::Node& node, const std::string& file, const std::string& name) {
  MapReader r(node, file, "architecture");
  TransformerConfig c;
  c.name = name;
  c.layers = r.positive_int("layers", limits::kMaxTransformerLayers);
  c.hidden = r.positive_int("hidden", limits::kMaxHidden);
  c.heads = r.positive_int("heads", limits::kMaxHeads);
  c.kv_heads = r.int_or("kv_heads", 0, 0, limits::kMaxHeads);
  c.head_dim = r.int_or("head_dim", 0, 0, limits::kMaxHidden);
  c.ffn = r.int_or("ffn", 0, 0, limits::kMaxFfn);
  c.seq = r.positive_int("seq", limits::kMaxSeq);
  c.positions = r.int_or("positions", 0, 0, limits::kMaxSeq);
  c.vocab = r.int_or("vocab", 0, 0, limits::kMaxVocab);
  const std::string norm = r.string_or("norm", "layernorm");
  if (norm != "layernorm" && norm != "rmsnorm") r.fail("norm", "expected layernorm or rmsnorm, found '" + norm + "'");
  c.rms_norm = norm == "rmsnorm";
  const std::string mlp = r.string_or("mlp", "gelu");
  if (mlp != "gelu" && mlp != "swiglu") r.fail("mlp", "expected gelu or swiglu, found '" + mlp + "'");
  c.gated_mlp = mlp == "swiglu";
  c.biases = r.boolean_or("biases", true);
  c.qk_norm = r.boolean_or("qk_norm", false);
  const std::string attention_bias = r.string_or("attention_bias", "none");
  if (attention_bias != "none" && attention_bias != "qkv" && attention_bias != "qkvo") {
    r.fail("attention_bias", "expected none, qkv or qkvo, found '" + attention_bias + "'");
  }
  c.attention_bias = attention_bias == "qkv"    ? TransformerConfig::AttentionBias::qkv
                     : attention_bias == "qkvo" ? TransformerConfig::AttentionBias::qkvo
                                                : TransformerConfig::AttentionBias::none;
  c.tied_embeddings = r.boolean_or("tied_embeddings", true);
  c.learned_positions = r.boolean_or("learned_positions", true);
  c.dropout = r.boolean_or("dropout", true);
  c.norm_eps = r.number_or("norm_eps", 1e-5, 0, 1);
  c.rope_theta = r.number_or("rope_theta", 10000, 1, 1e12);
  c.sliding_window = r.int_or("sliding_window", 0, 0, limits::kMaxSeq);
  if (r.has("rope_scaling")) c.rope_scaling = parse_rope_scaling(r.get("rope_scaling"), file, r.field("rope_scaling"));
  c.partial_rotary_factor = r.number_or("partial_rotary_factor", 1, 0, 1);
  c.encoder = r.boolean_or("encoder", false);
  c.type_vocab = r.int_or("type_vocab", 0, 0, limits::kMaxVocab);
  c.unmodelled = r.string_or("unmodelled", "");
  if (r.has("moe")) c.moe = parse_moe(r.get("moe"), file, r.field("moe"));
  if (r.has("mla")) c.mla = parse_mla(r.get("mla"), file, r.field("mla"));
  c.mtp_layers = r.int_or("mtp_layers", 0, 0, 16);
  r.finish();
  try {
    check_transformer_config(c);
  } catch (const InputError& e) {
    r.fail(e.field(), e.message());
  }
  return canonical(c);
}

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path, 0, "file", std::string("cannot be read: ") + std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

bool readable_file(std::string_view path) {
  std::error_code error;
  if (std::filesystem::is_directory(std::filesystem::path(path), error)) return false;  // opens, reads nothing
  std::ifstream in{std::string(path)};
  return static_cast<bool>(in);
}

// A HuggingFace config.json is recognised by its keys.
bool is_hf_config(const std::string& text) {
  return text.find("\"model_type\"") != std::string::npos || text.find("\"num_hidden_layers\"") != std::string::npos ||
         text.find("\"n_layer\"") != std::string::npos;
}

// What a name that is neither built in nor a readable file most likely meant: a path (it has a
// '/' or a file suffix) is a file that is missing or cannot be read, said so, rather than
// answered with the built-in names it resembles. `field` is what it was given as.
void refuse_unreadable_path(std::string_view name, const std::string& field) {
  const std::string path(name);
  const bool looks_like_path = path.find('/') != std::string::npos || path.ends_with(".yaml") ||
                               path.ends_with(".yml") || path.ends_with(".json");
  std::error_code error;
  if (!looks_like_path && !std::filesystem::exists(path, error)) return;
  if (!std::filesystem::exists(path, error)) throw InputError(path, 0, field, "no such file or folder");
  if (std::filesystem::is_directory(path, error)) {
    throw InputError(path, 0, field, "is a folder; expected a " + field + " file");
  }
  throw InputError(path, 0, field, std::string("cannot be read: ") + std::strerror(EACCES));
}

}  // namespace

Network parse_network(const std::string& text, const std::string& file, std::optional<Precision> precision) {
  const YAML::Node root = yaml_util::load(text, file);
  MapReader r(root, file, "");
  std::optional<Precision> file_precision;
  if (r.has("precision")) {
    try {
      file_precision = parse_precision(r.string("precision"));
    } catch (const std::invalid_argument& e) {
      r.fail("precision", e.what());
    }
  }
  const Precision chosen = precision.value_or(file_precision.value_or(Precision::fp16));

  if (r.has("zoo")) {
    const std::string spec = r.string("zoo");
    r.finish();
    try {
      return network_from_spec(spec, chosen);
    } catch (const InputError& e) {
      throw InputError(file, yaml_util::line_of(root["zoo"]), "zoo", e.message());
    }
  }

  Network net;
  net.name = r.string_or("name", file);
  net.description = r.string_or("description", "");
  net.precision = file_precision.value_or(Precision::fp16);
  net.tokens_per_sample = r.number_or("tokens_per_sample", 1, 1, limits::kMaxTokensPerSample);
  net.sample_bytes = r.quantity_in("sample_bytes", units::parse_bytes, kSampleBytes, 0.0, true);
  if (r.has("architecture")) net.architecture = parse_architecture(r.get("architecture"), file, net.name);
  const YAML::Node layers = r.required("layers");
  if (!layers.IsSequence() || layers.size() == 0) r.fail("layers", "expected a non-empty list of layers");
  if (layers.size() > static_cast<size_t>(limits::kMaxLayers)) {
    r.fail("layers", "expected at most " + std::to_string(limits::kMaxLayers) + " layers, found " +
                         std::to_string(layers.size()));
  }
  for (size_t i = 0; i < layers.size(); ++i) {
    net.layers.push_back(parse_layer(layers[i], file, "layers[" + std::to_string(i) + "]", static_cast<int>(i)));
  }
  r.finish();
  if (net.training_flops_per_sample() <= 0) {
    throw InputError(file, yaml_util::line_of(layers), "layers", "expected some layer with positive forward_flops");
  }
  if (chosen != net.precision) {
    // Explicit layers give bytes at the file's precision; another precision scales the
    // activation bytes by the element size (an approximation: dropout masks stay 1 byte).
    const double scale = element_bytes(chosen) / element_bytes(net.precision);
    for (Layer& l : net.layers) {
      l.stashed_bytes *= scale;
      l.attention_stash_bytes *= scale;
      l.tp_replicated_bytes *= scale;
      l.tp_whole_bytes *= scale;
    }
    net.precision = chosen;
  }
  return net;
}

namespace {

// `rope_scaling:` of an architecture: the keys its type reads (parse_rope_scaling's).
void write_rope_scaling(YAML::Emitter& out, const RopeScaling& s) {
  out << YAML::Key << "rope_scaling" << YAML::Value << YAML::Flow << YAML::BeginMap;
  out << YAML::Key << "type" << YAML::Value << s.type;
  out << YAML::Key << "factor" << YAML::Value << units::format_number(s.factor);
  if (s.type == "llama3") {
    out << YAML::Key << "low_freq_factor" << YAML::Value << units::format_number(s.low_freq_factor);
    out << YAML::Key << "high_freq_factor" << YAML::Value << units::format_number(s.high_freq_factor);
  }
  if (s.original_positions != 0) out << YAML::Key << "original_positions" << YAML::Value << s.original_positions;
  if (s.type == "yarn") {
    out << YAML::Key << "beta_fast" << YAML::Value << units::format_number(s.beta_fast);
    out << YAML::Key << "beta_slow" << YAML::Value << units::format_number(s.beta_slow);
    out << YAML::Key << "attention_factor" << YAML::Value << units::format_number(s.attention_factor);
    if (!s.truncate) out << YAML::Key << "truncate" << YAML::Value << false;
  }
  out << YAML::EndMap;
}

}  // namespace

std::string write_network(const Network& n) {
  YAML::Emitter out;
  out << YAML::BeginMap;
  out << YAML::Key << "name" << YAML::Value << n.name;
  out << YAML::Key << "description" << YAML::Value << n.description;
  out << YAML::Key << "precision" << YAML::Value << std::string(to_string(n.precision));
  out << YAML::Key << "tokens_per_sample" << YAML::Value << units::format_number(n.tokens_per_sample);
  if (n.sample_bytes > 0) out << YAML::Key << "sample_bytes" << YAML::Value << units::format_bytes(n.sample_bytes);
  if (n.architecture) {
    const TransformerConfig& c = *n.architecture;
    out << YAML::Key << "architecture" << YAML::Value << YAML::Flow << YAML::BeginMap;
    for (const auto& [key, value] : {std::pair{"layers", c.layers}, {"hidden", c.hidden}, {"heads", c.heads},
                                     {"kv_heads", c.kv_heads}, {"ffn", c.ffn}, {"seq", c.seq}, {"vocab", c.vocab}}) {
      out << YAML::Key << key << YAML::Value << value;
    }
    out << YAML::Key << "norm" << YAML::Value << (c.rms_norm ? "rmsnorm" : "layernorm");
    out << YAML::Key << "mlp" << YAML::Value << (c.gated_mlp ? "swiglu" : "gelu");
    for (const auto& [key, value] : {std::pair{"biases", c.biases}, {"tied_embeddings", c.tied_embeddings},
                                     {"learned_positions", c.learned_positions}, {"dropout", c.dropout},
                                     {"encoder", c.encoder}}) {
      out << YAML::Key << key << YAML::Value << value;
    }
    out << YAML::Key << "type_vocab" << YAML::Value << c.type_vocab;
    // Written only when not the defaults, so plans made before these keys existed keep
    // their bytes (and fingerprints).
    if (c.norm_eps != 1e-5) out << YAML::Key << "norm_eps" << YAML::Value << units::format_number(c.norm_eps);
    if (c.rope_theta != 10000) out << YAML::Key << "rope_theta" << YAML::Value << units::format_number(c.rope_theta);
    if (!c.rope_scaling.type.empty()) write_rope_scaling(out, c.rope_scaling);
    if (c.sliding_window != 0) out << YAML::Key << "sliding_window" << YAML::Value << c.sliding_window;
    if (c.partial_rotary_factor != 1) {
      out << YAML::Key << "partial_rotary_factor" << YAML::Value << units::format_number(c.partial_rotary_factor);
    }
    if (c.attention_bias != TransformerConfig::AttentionBias::none) {
      out << YAML::Key << "attention_bias" << YAML::Value
          << (c.attention_bias == TransformerConfig::AttentionBias::qkv ? "qkv" : "qkvo");
    }
    if (c.head_dim != 0) out << YAML::Key << "head_dim" << YAML::Value << c.head_dim;
    if (c.positions != 0) out << YAML::Key << "positions" << YAML::Value << c.positions;
    if (c.qk_norm) out << YAML::Key << "qk_norm" << YAML::Value << true;
    if (c.mtp_layers != 0) out << YAML::Key << "mtp_layers" << YAML::Value << c.mtp_layers;
    if (!c.unmodelled.empty()) out << YAML::Key << "unmodelled" << YAML::Value << YAML::DoubleQuoted << c.unmodelled;
    if (const MoeConfig& m = c.moe; m.experts > 0) {
      out << YAML::Key << "moe" << YAML::Value << YAML::Flow << YAML::BeginMap;
      for (const auto& [key, value] : {std::pair{"experts", m.experts}, {"experts_per_token", m.experts_per_token},
                                       {"expert_ffn", m.expert_ffn}, {"shared_experts", m.shared_experts},
                                       {"shared_expert_ffn", m.shared_expert_ffn},
                                       {"first_dense_layers", m.first_dense_layers}, {"every", m.every}}) {
        out << YAML::Key << key << YAML::Value << value;
      }
      out << YAML::Key << "shared_expert_gate" << YAML::Value << m.shared_expert_gate;
      out << YAML::Key << "router" << YAML::Value << (m.router == MoeConfig::Router::sigmoid ? "sigmoid" : "softmax");
      if (m.groups != 1) {  // (written only where routing is group-limited: every other network keeps its bytes)
        out << YAML::Key << "groups" << YAML::Value << m.groups;
        out << YAML::Key << "groups_chosen" << YAML::Value << m.groups_chosen;
      }
      out << YAML::Key << "normalize_top_k" << YAML::Value << m.normalize_top_k;
      out << YAML::Key << "routed_scale" << YAML::Value << units::format_number(m.routed_scale);
      out << YAML::Key << "capacity_factor" << YAML::Value << units::format_number(m.capacity_factor);
      out << YAML::Key << "aux_loss_coef" << YAML::Value << units::format_number(m.aux_loss_coef);
      if (m.sequence_aux_loss) out << YAML::Key << "sequence_aux_loss" << YAML::Value << true;
      // (Written only where it is not the default: every other network keeps its bytes.)
      if (m.tensor_names == MoeConfig::TensorNames::mixtral) out << YAML::Key << "tensor_names" << YAML::Value << "mixtral";
      out << YAML::EndMap;
    }
    if (const MlaConfig& m = c.mla; m.enabled()) {
      out << YAML::Key << "mla" << YAML::Value << YAML::Flow << YAML::BeginMap;
      for (const auto& [key, value] : {std::pair{"q_lora_rank", m.q_lora_rank}, {"kv_lora_rank", m.kv_lora_rank},
                                       {"qk_nope_head_dim", m.qk_nope_head_dim}, {"qk_rope_head_dim", m.qk_rope_head_dim},
                                       {"v_head_dim", m.v_head_dim}}) {
        out << YAML::Key << key << YAML::Value << value;
      }
      out << YAML::EndMap;
    }
    out << YAML::EndMap;
  }
  out << YAML::Key << "layers" << YAML::Value << YAML::BeginSeq;
  for (const Layer& l : n.layers) {
    out << YAML::BeginMap;
    out << YAML::Key << "name" << YAML::Value << l.name;
    out << YAML::Key << "kind" << YAML::Value << l.kind;
    out << YAML::Key << "shape" << YAML::Value << l.shape;
    out << YAML::Key << "inputs" << YAML::Value << YAML::Flow << l.inputs;
    auto number = [&out](const char* key, double value) {
      out << YAML::Key << key << YAML::Value << units::format_number(value);
    };
    number("forward_flops", l.forward_flops);
    number("backward_flops", l.backward_flops);
    number("params", l.params);
    number("tied_params", l.tied_params);
    number("output_elems", l.output_elems);
    number("stashed_bytes", l.stashed_bytes);
    number("attention_stash_bytes", l.attention_stash_bytes);
    number("attention_core_flops", l.attention_core_flops);
    out << YAML::Key << "tp_splittable" << YAML::Value << l.tp_splittable;
    out << YAML::Key << "tp_units" << YAML::Value << l.tp_units;
    number("tp_allreduce_elems", l.tp_allreduce_elems);
    out << YAML::Key << "tp_allreduces" << YAML::Value << l.tp_allreduces;
    number("tp_backward_allreduce_elems", l.tp_backward_allreduce_elems);
    out << YAML::Key << "tp_backward_allreduces" << YAML::Value << l.tp_backward_allreduces;
    number("tp_replicated_bytes", l.tp_replicated_bytes);
    if (l.tp_whole_bytes > 0) number("tp_whole_bytes", l.tp_whole_bytes);
    if (l.experts > 0) {
      out << YAML::Key << "experts" << YAML::Value << l.experts;
      out << YAML::Key << "experts_per_token" << YAML::Value << l.experts_per_token;
      number("expert_params", l.expert_params);
    }
    if (l.tp_summed_gains > 0) number("tp_summed_gains", l.tp_summed_gains);
    if (l.tp_summed_gains_sequence_parallel > 0) {
      number("tp_summed_gains_sequence_parallel", l.tp_summed_gains_sequence_parallel);
    }
    if (!l.tp_calls.empty()) {
      out << YAML::Key << "tp_calls" << YAML::Value << YAML::BeginSeq;
      for (const TpCall& call : l.tp_calls) {
        out << YAML::Flow << YAML::BeginMap << YAML::Key << "op" << YAML::Value << std::string(to_string(call.op));
        out << YAML::Key << "elems" << YAML::Value << units::format_number(call.elems);
        out << YAML::Key << "at" << YAML::Value << units::format_number(call.at) << YAML::EndMap;
      }
      out << YAML::EndSeq;
    }
    if (!l.cnn_ops.empty()) {
      out << YAML::Key << "ops" << YAML::Value << YAML::BeginSeq;
      for (const CnnOp& op : l.cnn_ops) {
        const bool gemm = op.kind == CnnOp::Kind::conv || op.kind == CnnOp::Kind::fc;
        out << YAML::Flow << YAML::BeginMap << YAML::Key << "op" << YAML::Value << std::string(to_string(op.kind));
        if (gemm || op.kind == CnnOp::Kind::max_pool || op.kind == CnnOp::Kind::avg_pool) {
          out << YAML::Key << "in" << YAML::Value << YAML::Flow << std::vector<std::int64_t>(op.in.begin(), op.in.end());
        }
        out << YAML::Key << "out" << YAML::Value << YAML::Flow << std::vector<std::int64_t>(op.out.begin(), op.out.end());
        if (op.kind == CnnOp::Kind::conv) out << YAML::Key << "kernel" << YAML::Value << op.kernel;
        if (gemm && !op.input_grad) out << YAML::Key << "input_grad" << YAML::Value << false;
        out << YAML::EndMap;
      }
      out << YAML::EndSeq;
    }
    out << YAML::EndMap;
  }
  out << YAML::EndSeq << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

std::optional<std::string> hf_model_folder_config(std::string_view path) {
  std::error_code error;
  const std::filesystem::path folder{std::string(path)};
  if (!std::filesystem::is_directory(folder, error)) return std::nullopt;
  const std::filesystem::path config = folder / "config.json";
  if (!std::filesystem::is_regular_file(config, error)) {
    throw InputError(std::string(path), 0, "model",
                     "is a folder without a config.json; expected a HuggingFace model folder (config.json, tokenizer "
                     "files, weights) or a network file");
  }
  return config.string();
}

Cluster load_cluster(std::string_view name_or_path) {
  for (const ClusterPreset& p : cluster_presets()) {
    if (p.name == name_or_path) return builtin_cluster(name_or_path);
  }
  if ((cpu_cluster_devices(name_or_path) > 0 || selene_cluster_nodes(name_or_path) > 0) && !readable_file(name_or_path)) {
    return builtin_cluster(name_or_path);
  }
  if (readable_file(name_or_path)) {
    const std::string path(name_or_path);
    return parse_cluster(read_text_file(path), path);
  }
  refuse_unreadable_path(name_or_path, "cluster");
  return builtin_cluster(name_or_path);  // throws, naming the nearest presets
}

std::string tokenizer_file(const std::string& config_path) {
  return (std::filesystem::path(config_path).parent_path() / "tokenizer_config.json").string();
}

std::optional<int> hf_tokenizer_max_length_beside(const std::string& config_path) {
  const std::string file = tokenizer_file(config_path);
  if (!readable_file(file)) return std::nullopt;
  return hf_tokenizer_max_length(read_text_file(file), file);
}

namespace {
// A HuggingFace config.json's decoder at the length it is planned at: the config's, capped
// by the tokenizer beside it.
TransformerConfig hf_transformer(const std::string& text, const std::string& path) {
  TransformerConfig c = transformer_from_hf_config(text, path);
  apply_tokenizer_max_length(c, hf_config_sequence_key(text, path), hf_tokenizer_max_length_beside(path));
  return c;
}
}  // namespace

std::optional<std::string> hf_config_file(std::string_view spec_or_path) {
  if (is_zoo_spec(spec_or_path)) return std::nullopt;
  if (readable_file(spec_or_path)) {
    const std::string path(spec_or_path);
    return is_hf_config(read_text_file(path)) ? std::optional<std::string>(path) : std::nullopt;
  }
  return hf_model_folder_config(spec_or_path);
}

Network load_network(std::string_view spec_or_path, std::optional<Precision> precision) {
  if (is_zoo_spec(spec_or_path)) return network_from_spec(spec_or_path, precision.value_or(Precision::fp16));
  if (readable_file(spec_or_path)) {
    const std::string path(spec_or_path);
    const std::string text = read_text_file(path);
    if (is_hf_config(text)) return make_transformer(hf_transformer(text, path), precision.value_or(Precision::fp16));
    return parse_network(text, path, precision);
  }
  if (const std::optional<std::string> config = hf_model_folder_config(spec_or_path)) {
    TransformerConfig c = hf_transformer(read_text_file(*config), *config);
    // Named after the folder (the model's name as downloaded), not its config.json.
    const std::filesystem::path folder = std::filesystem::path(std::string(spec_or_path)).lexically_normal();
    const std::string base = (folder.has_filename() ? folder : folder.parent_path()).filename().string();
    c.name = c.name.substr(0, c.name.find('(')) + "(" + base + ")";
    return make_transformer(c, precision.value_or(Precision::fp16));
  }
  refuse_unreadable_path(spec_or_path, "model");
  return network_from_spec(spec_or_path, precision.value_or(Precision::fp16));  // throws with hints
}

}  // namespace hetflow::model
