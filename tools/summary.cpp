#include "tools/summary.hpp"

#include <algorithm>
#include <cstdio>
#include <iomanip>
#include <map>
#include <ostream>
#include <tuple>

#include "model/units.hpp"

namespace hetflow::tools {

namespace u = model::units;

namespace {

// A scale such as YaRN's attention factor, to four significant digits ("1.139").
std::string four_digits(double x) {
  char text[32];
  std::snprintf(text, sizeof text, "%.4g", x);
  return text;
}

// Parameters of the multi-token prediction modules (the layers of kind "mtp"): apart from the
// main model's in a release's count (DeepSeek-V3's 671B), in memory with the rest.
double mtp_params(const model::Network& n) {
  double sum = 0;
  for (const model::Layer& l : n.layers) sum += l.kind == "mtp" ? l.params : 0;
  return sum;
}

struct TypeTotals {
  int devices = 0;
  double fp16_flops_per_s = 0, fp32_flops_per_s = 0, memory_bytes = 0;
};

// GPU types in order of first appearance, with their device counts and aggregate peaks.
std::vector<std::pair<std::string, TypeTotals>> totals_by_type(const model::Cluster& c) {
  std::vector<std::pair<std::string, TypeTotals>> out;
  for (const model::Node& n : c.nodes) {
    auto it = std::find_if(out.begin(), out.end(), [&](const auto& p) { return p.first == n.gpu; });
    if (it == out.end()) it = out.insert(out.end(), {n.gpu, TypeTotals{}});
    const model::GpuSpec& g = c.gpu(n.gpu);
    it->second.devices += n.gpu_count;
    it->second.fp16_flops_per_s += n.gpu_count * g.fp16_flops_per_s;
    it->second.fp32_flops_per_s += n.gpu_count * g.fp32_flops_per_s;
    it->second.memory_bytes += n.gpu_count * g.memory_bytes;
  }
  return out;
}

// Distinct link classes: what a transfer can cross, each with the nodes that have it.
struct LinkClass {
  std::string kind;
  double bandwidth_bytes_per_s;
  double latency_s;
  int count;  // links of this class (per-GPU links, NICs, WAN links)
  std::vector<std::string> nodes;  // the nodes that have them (none for WAN links)
};

std::vector<LinkClass> link_classes(const model::Cluster& c) {
  std::map<std::tuple<std::string, double, double>, LinkClass> seen;
  std::vector<std::tuple<std::string, double, double>> order;
  auto add = [&](const std::string& kind, double bw, double lat, int count, const std::string& node) {
    const auto key = std::make_tuple(kind, bw, lat);
    if (seen.count(key) == 0) {
      order.push_back(key);
      seen[key] = LinkClass{kind, bw, lat, 0, {}};
    }
    seen[key].count += count;
    if (!node.empty()) seen[key].nodes.push_back(node);
  };
  for (const model::Node& n : c.nodes) {
    if (n.gpu_count > 1) {
      add("intra-node " + std::string(model::to_string(n.intra.kind)), n.intra.bandwidth_bytes_per_s,
          n.intra.latency_s, n.gpu_count, n.name);
    }
    if (n.intra.uplink_bandwidth_bytes_per_s > 0) {
      add("pcie host uplink", n.intra.uplink_bandwidth_bytes_per_s, 0, 1, n.name);
    }
    if (n.nic.count > 0) add("nic", n.nic.bandwidth_bytes_per_s, n.nic.latency_s, n.nic.count, n.name);
  }
  for (const model::WanLink& w : c.wan) {
    add("wan " + w.region_a + "<->" + w.region_b, w.bandwidth_bytes_per_s, w.latency_s, 1, "");
  }
  std::vector<LinkClass> out;
  for (const auto& key : order) out.push_back(seen[key]);
  return out;
}

// "v100-0, v100-1 and 2 more": which nodes have a link class, briefly.
std::string node_list(const std::vector<std::string>& nodes) {
  std::string text;
  for (size_t i = 0; i < nodes.size() && i < 3; ++i) text += (i > 0 ? ", " : "") + nodes[i];
  if (nodes.size() > 3) text += " and " + std::to_string(nodes.size() - 3) + " more";
  return text;
}

std::string fabric_text(const model::Fabric& f) {
  if (f.kind == model::FabricKind::single_switch) return "one switch, " + u::human_time_s(f.latency_s) + " per hop";
  return "two-level fat tree, " + std::to_string(f.nodes_per_leaf) + " nodes per leaf, " +
         u::format_number(f.oversubscription) + ":1 oversubscribed, " + u::human_time_s(f.latency_s) + " per hop";
}

}  // namespace

Json cluster_json(const model::Cluster& c) {
  Json j;
  j["name"] = c.name;
  j["description"] = c.description;
  j["nodes"] = c.nodes.size();
  j["devices"] = c.device_count();
  double fp16 = 0, fp32 = 0, memory = 0;
  for (const auto& [type, t] : totals_by_type(c)) {
    j["gpu_types"].push_back({{"type", type},
                              {"devices", t.devices},
                              {"peak_fp16_flops_per_s", t.fp16_flops_per_s},
                              {"peak_fp32_flops_per_s", t.fp32_flops_per_s},
                              {"memory_bytes", t.memory_bytes}});
    fp16 += t.fp16_flops_per_s;
    fp32 += t.fp32_flops_per_s;
    memory += t.memory_bytes;
  }
  j["peak_fp16_flops_per_s"] = fp16;
  j["peak_fp32_flops_per_s"] = fp32;
  j["memory_bytes"] = memory;
  for (const model::Region& r : c.regions) {
    j["regions"].push_back({{"name", r.name}, {"fabric", fabric_text(r.fabric)}});
  }
  for (const LinkClass& l : link_classes(c)) {
    j["link_classes"].push_back({{"kind", l.kind},
                                 {"bandwidth_bytes_per_s", l.bandwidth_bytes_per_s},
                                 {"latency_s", l.latency_s},
                                 {"count", l.count},
                                 {"nodes", l.nodes}});
  }
  return j;
}

void print_cluster(std::ostream& out, const model::Cluster& c) {
  out << "cluster " << c.name << (c.description.empty() ? "" : ": " + c.description) << "\n";
  out << "  " << c.device_count() << (c.device_count() == 1 ? " GPU in " : " GPUs in ") << c.nodes.size()
      << (c.nodes.size() == 1 ? " node, " : " nodes, ") << c.regions.size()
      << (c.regions.size() == 1 ? " region" : " regions") << "\n\n";
  out << "  " << std::left << std::setw(14) << "GPU type" << std::right << std::setw(6) << "count" << std::setw(16)
      << "fp16 peak" << std::setw(16) << "fp32 peak" << std::setw(12) << "memory" << "\n";
  double fp16 = 0, fp32 = 0, memory = 0;
  int devices = 0;
  for (const auto& [type, t] : totals_by_type(c)) {
    out << "  " << std::left << std::setw(14) << type << std::right << std::setw(6) << t.devices << std::setw(16)
        << (u::human_flops(t.fp16_flops_per_s) + "/s") << std::setw(16) << (u::human_flops(t.fp32_flops_per_s) + "/s")
        << std::setw(12) << u::human_bytes(t.memory_bytes) << "\n";
    fp16 += t.fp16_flops_per_s;
    fp32 += t.fp32_flops_per_s;
    memory += t.memory_bytes;
    devices += t.devices;
  }
  out << "  " << std::left << std::setw(14) << "total" << std::right << std::setw(6) << devices << std::setw(16)
      << (u::human_flops(fp16) + "/s") << std::setw(16) << (u::human_flops(fp32) + "/s") << std::setw(12)
      << u::human_bytes(memory) << "\n\n";
  out << "  link classes (bandwidth per direction):\n";
  for (const LinkClass& l : link_classes(c)) {
    out << "    " << std::left << std::setw(30) << l.kind << std::right << std::setw(12)
        << u::human_bandwidth(l.bandwidth_bytes_per_s) << std::setw(10)
        << (l.latency_s > 0 ? u::human_time_s(l.latency_s) : "-") << "  x";
    if (l.nodes.empty()) {
      out << l.count << "\n";
    } else {
      out << std::left << std::setw(4) << l.count << std::right << " " << node_list(l.nodes) << "\n";
    }
  }
  for (const model::Region& r : c.regions) out << "    region " << r.name << ": " << fabric_text(r.fabric) << "\n";
  // What --offload-optimizer uses, by distinct host (model/node_host.cpp's defaults where the file is silent).
  std::vector<std::pair<model::NodeHost, std::vector<std::string>>> hosts;
  for (int n = 0; n < static_cast<int>(c.nodes.size()); ++n) {
    const model::NodeHost h = c.host(n);
    auto same = std::find_if(hosts.begin(), hosts.end(), [&](const auto& e) { return e.first == h; });
    if (same == hosts.end()) same = hosts.insert(hosts.end(), {h, {}});
    same->second.push_back(c.nodes[static_cast<size_t>(n)].name);
  }
  out << "  hosts (offload):\n";
  for (const auto& [h, nodes] : hosts) {
    out << "    " << u::human_bytes(h.memory_bytes) << ", PCIe " << u::human_bandwidth(h.pcie_bytes_per_s) << " per "
        << h.gpus_per_bridge << (h.gpus_per_bridge == 1 ? " GPU" : " GPUs") << ", CPUs "
        << u::human_flops(h.cpu_flops_per_s) << "/s and " << u::human_bandwidth(h.cpu_memory_bytes_per_s)
        << "  x" << std::left << std::setw(4) << nodes.size() << std::right << " " << node_list(nodes) << "\n";
  }
}

Json network_json(const model::Network& n) {
  Json j;
  j["name"] = n.name;
  j["description"] = n.description;
  j["precision"] = std::string(model::to_string(n.precision));
  j["layers"] = n.layers.size();
  j["tokens_per_sample"] = n.tokens_per_sample;
  j["params"] = n.param_count();
  j["forward_flops_per_sample"] = n.forward_flops_per_sample();
  j["backward_flops_per_sample"] = n.backward_flops_per_sample();
  j["training_flops_per_sample"] = n.training_flops_per_sample();
  j["training_flops_per_token"] = n.training_flops_per_sample() / n.tokens_per_sample;
  j["weight_bytes"] = n.param_bytes();
  j["weights_grads_adam_bytes"] = n.adam_training_state_bytes();
  double stash = 0;
  for (const model::Layer& l : n.layers) stash += l.stashed_bytes;
  j["stashed_activation_bytes_per_sample"] = stash;
  if (n.architecture && !n.architecture->unmodelled.empty()) j["unmodelled"] = n.architecture->unmodelled;
  if (n.architecture && !n.architecture->rope_scaling.type.empty()) {
    const model::RopeScaling& s = n.architecture->rope_scaling;
    Json r;
    r["type"] = s.type;
    r["factor"] = s.factor;
    if (s.type == "llama3") {
      r["low_freq_factor"] = s.low_freq_factor;
      r["high_freq_factor"] = s.high_freq_factor;
    }
    if (s.original_positions > 0) r["original_positions"] = s.original_positions;
    if (s.type == "yarn") {
      r["beta_fast"] = s.beta_fast;
      r["beta_slow"] = s.beta_slow;
      r["attention_factor"] = s.attention_factor;
      r["truncate"] = s.truncate;
    }
    j["rope_theta"] = n.architecture->rope_theta;
    j["rope_scaling"] = r;
  }
  if (n.architecture && n.architecture->partial_rotary_factor != 1) {
    j["partial_rotary_factor"] = n.architecture->partial_rotary_factor;
    j["rotary_dims"] = n.architecture->rotary_dims();
  }
  if (n.architecture && n.architecture->sliding_window > 0) j["sliding_window"] = n.architecture->sliding_window;
  if (n.architecture && n.architecture->heads > 0 && !n.architecture->mla.enabled()) j["head_dim"] = n.architecture->head_size();
  if (n.architecture && n.architecture->qk_norm) j["qk_norm"] = true;
  if (n.architecture && n.architecture->positions > 0) j["positions"] = n.architecture->positions;
  if (n.architecture && n.architecture->attention_bias != model::TransformerConfig::AttentionBias::none) {
    j["attention_bias"] = n.architecture->attention_bias == model::TransformerConfig::AttentionBias::qkv ? "qkv" : "qkvo";
  }
  if (n.active_param_count() != n.param_count()) j["active_params"] = n.active_param_count();
  if (n.architecture && n.architecture->moe.experts > 0) {
    const model::MoeConfig& m = n.architecture->moe;
    Json e;
    e["experts"] = m.experts;
    e["experts_per_token"] = m.experts_per_token;
    e["expert_ffn"] = m.expert_ffn;
    e["shared_experts"] = m.shared_experts;
    e["router"] = m.router == model::MoeConfig::Router::sigmoid ? "sigmoid" : "softmax";
    e["capacity_factor"] = m.capacity_factor;
    e["aux_loss_coef"] = m.aux_loss_coef;
    e["sequence_aux_loss"] = m.sequence_aux_loss;
    e["groups"] = m.groups;
    e["groups_chosen"] = m.groups_chosen;
    int layers = 0;
    for (int i = 0; i < n.architecture->layers; ++i) layers += m.is_moe_layer(i);
    e["moe_layers"] = layers;
    j["moe"] = e;
  }
  if (n.architecture && n.architecture->mtp_layers > 0) {
    j["mtp_layers"] = n.architecture->mtp_layers;
    j["mtp_params"] = mtp_params(n);
  }
  if (n.architecture && n.architecture->mla.enabled()) {
    const model::MlaConfig& m = n.architecture->mla;
    j["mla"] = Json{{"q_lora_rank", m.q_lora_rank}, {"kv_lora_rank", m.kv_lora_rank},
                    {"qk_nope_head_dim", m.qk_nope_head_dim}, {"qk_rope_head_dim", m.qk_rope_head_dim},
                    {"v_head_dim", m.v_head_dim}};
  }
  return j;
}

void print_network(std::ostream& out, const model::Network& n) {
  std::map<std::string, int> kinds;
  std::vector<std::string> kind_order;
  double stash = 0;
  for (const model::Layer& l : n.layers) {
    if (kinds[l.kind]++ == 0) kind_order.push_back(l.kind);
    stash += l.stashed_bytes;
  }
  out << "network " << n.name << (n.description.empty() ? "" : ": " + n.description) << "\n";
  out << "  precision " << model::to_string(n.precision) << ", " << n.layers.size() << " layers";
  if (kind_order.size() > 1 || (kind_order.size() == 1 && kind_order[0] != "layer")) {
    out << " (";
    for (size_t i = 0; i < kind_order.size(); ++i) {
      out << (i ? ", " : "") << kinds[kind_order[i]] << " " << kind_order[i];
    }
    out << ")";
  }
  if (n.tokens_per_sample > 1) out << ", " << u::format_number(n.tokens_per_sample) << " tokens per sample";
  out << "\n";
  out << "  parameters            " << u::human_count(n.param_count()) << " (" << u::format_number(n.param_count()) << ")";
  if (n.active_param_count() != n.param_count()) {
    out << ", " << u::human_count(n.active_param_count()) << " active per token";
  }
  out << "\n";
  if (n.architecture && n.architecture->moe.experts > 0) {
    const model::MoeConfig& m = n.architecture->moe;
    int layers = 0;
    for (int i = 0; i < n.architecture->layers; ++i) layers += m.is_moe_layer(i);
    out << "  experts               " << m.experts << " of width " << m.expert_ffn << ", " << m.experts_per_token
        << " per token (" << (m.router == model::MoeConfig::Router::sigmoid ? "sigmoid" : "softmax") << " router"
        << (m.normalize_top_k ? ", weights renormalised" : "")
        << (m.routed_scale != 1 ? ", scaled x" + u::format_number(m.routed_scale) : "")
        << (m.groups_chosen < m.groups
                ? ", within the best " + std::to_string(m.groups_chosen) + " of " + std::to_string(m.groups) + " groups"
                : "")
        << ")";
    if (m.shared_experts > 0) {
      out << ", " << m.shared_experts << " shared of width " << m.shared_width() << (m.shared_expert_gate ? " (gated)" : "");
    }
    out << "; on " << layers << " of " << n.architecture->layers << " layers; "
        << (m.capacity_factor > 0 ? "capacity factor " + u::format_number(m.capacity_factor) : std::string("dropless"))
        << (m.aux_loss_coef > 0 ? ", balance loss x" + u::format_number(m.aux_loss_coef) : "")
        << (m.aux_loss_coef > 0 && m.sequence_aux_loss ? " per sequence" : "") << "\n";
  }
  out << "  FLOPs per sample      forward " << u::human_flops(n.forward_flops_per_sample()) << ", backward "
      << u::human_flops(n.backward_flops_per_sample()) << ", training " << u::human_flops(n.training_flops_per_sample())
      << "\n";
  if (n.tokens_per_sample > 1) {
    out << "  FLOPs per token       training " << u::human_flops(n.training_flops_per_sample() / n.tokens_per_sample)
        << "\n";
  }
  out << "  memory                weights " << u::human_bytes(n.param_bytes()) << "; weights+grads+Adam "
      << u::human_bytes(n.adam_training_state_bytes()) << " (16 B/param); activations "
      << u::human_bytes(stash) << " per sample without recomputation\n";
  if (const auto& a = n.architecture; a && (!a->rope_scaling.type.empty() || a->partial_rotary_factor != 1)) {
    const model::RopeScaling& s = a->rope_scaling;
    out << "  rotary positions      theta " << u::format_number(a->rope_theta);
    if (!s.type.empty()) out << ", " << s.type << " scaling x" << u::format_number(s.factor);
    if (s.type == "llama3") {
      out << " of wavelengths above " << u::format_number(s.original_positions / s.low_freq_factor)
          << " positions, blended down to " << u::format_number(s.original_positions / s.high_freq_factor);
    } else if (s.type == "dynamic") {
      out << " beyond " << s.original_positions << " positions";
    } else if (s.type == "yarn") {
      // YaRN's betas are turns over the original context: wavelengths L / beta.
      out << " of wavelengths above " << u::format_number(s.original_positions / s.beta_slow)
          << " positions, ramped down to " << u::format_number(s.original_positions / s.beta_fast)
          << (s.truncate ? " (in whole pairs)" : "") << ", cos and sin x" << four_digits(s.attention_factor);
    }
    if (a->partial_rotary_factor != 1) {
      out << ", on the first " << a->rotary_dims() << " of each head's " << a->head_size() << " values";
    }
    out << "\n";
  }
  if (n.architecture && n.architecture->mla.enabled()) {
    const model::MlaConfig& m = n.architecture->mla;
    out << "  attention             latent (MLA): " << n.architecture->heads << " heads, keys and values from a "
        << m.kv_lora_rank << "-wide latent"
        << (m.q_lora_rank > 0 ? ", queries from a " + std::to_string(m.q_lora_rank) + "-wide one" : std::string())
        << "; query/key heads " << m.qk_nope_head_dim << " + " << m.qk_rope_head_dim << " rotary, values "
        << m.v_head_dim << "\n";
  }
  if (n.architecture && n.architecture->mtp_layers > 0) {
    const int d = n.architecture->mtp_layers;
    const double mtp = mtp_params(n);
    out << "  multi-token prediction " << d << (d == 1 ? " module" : " modules")
        << " (a decoder block, eh_proj and norms each; the head scores each again): " << u::human_count(mtp)
        << " parameters beside the main model's " << u::human_count(n.param_count() - mtp) << "\n";
  }
  if (n.architecture && (n.architecture->sliding_window > 0 || n.architecture->head_dim > 0 || n.architecture->qk_norm ||
                         n.architecture->attention_bias != model::TransformerConfig::AttentionBias::none)) {
    const model::TransformerConfig& c = *n.architecture;
    std::string parts;
    const auto add = [&parts](const std::string& part) { parts += (parts.empty() ? "" : "; ") + part; };
    if (c.head_dim > 0) {
      add(std::to_string(c.heads) + " heads of " + std::to_string(c.head_dim) + " (q " +
          std::to_string(static_cast<long long>(c.heads) * c.head_dim) + " wide, hidden " + std::to_string(c.hidden) +
          ")");
    }
    if (c.qk_norm) add("QK-norm");
    if (c.attention_bias != model::TransformerConfig::AttentionBias::none) {
      add(c.attention_bias == model::TransformerConfig::AttentionBias::qkv ? "biases on q, k and v"
                                                                           : "biases on q, k, v and o");
    }
    if (c.sliding_window > 0) {
      add("sliding window of " + std::to_string(c.sliding_window) + " keys per query " +
          (c.sliding_window < c.seq ? "(its FLOPs counted over them)" : "(no narrower than this sequence)"));
    }
    out << "  attention             " << parts << "\n";
  }
  if (n.architecture && !n.architecture->unmodelled.empty()) {
    out << "  not modelled          " << n.architecture->unmodelled
        << " (counted as the plain layers; real math refuses it)\n";
  }
}

}  // namespace hetflow::tools
