// Cluster descriptions in YAML (JSON accepted): parse, check, write back.
#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <set>
#include <sstream>

#include "model/error.hpp"
#include "model/io.hpp"
#include "model/limits.hpp"
#include "model/units.hpp"
#include "model/yaml_util.hpp"

namespace hetflow::model {

using yaml_util::MapReader;

namespace {

constexpr double kDefaultIntraLatency_s = 2e-6;
constexpr double kDefaultSwitchLatency_s = 1e-6;

// What the simulator's physics can take (model/limits.hpp).
const MapReader::Range kBandwidth{limits::kMinBandwidth, limits::kMaxBandwidth, units::format_bandwidth};
const MapReader::Range kLatency{limits::kMinLatency, limits::kMaxLatency, units::format_time_s};
const MapReader::Range kPrice{1e-6, 1e6, units::format_price_usd_per_hour};  // per GPU and hour
const MapReader::Range kFlops{limits::kMinFlops, limits::kMaxFlops, units::format_flops_per_s};
const MapReader::Range kMemory{limits::kMinMemory, limits::kMaxMemory, units::format_bytes};

std::vector<std::string> builtin_gpu_names() {
  std::vector<std::string> names;
  for (const GpuSpec& g : builtin_gpus()) names.push_back(g.name);
  return names;
}

GpuSpec parse_gpu_type(const YAML::Node& node, const std::string& file, const std::string& path) {
  MapReader r(node, file, path);
  GpuSpec g;
  g.name = r.string("name");
  g.description = r.string_or("description", "user-defined GPU type");
  g.fp16_flops_per_s = r.quantity_in("fp16", units::parse_flops_per_s, kFlops);
  g.bf16_flops_per_s = r.quantity_in("bf16", units::parse_flops_per_s, kFlops, 0.0, true);
  g.fp32_flops_per_s = r.quantity_in("fp32", units::parse_flops_per_s, kFlops);
  g.memory_bytes = r.quantity_in("memory", units::parse_bytes, kMemory);
  g.memory_bandwidth_bytes_per_s = r.quantity_in("memory_bandwidth", units::parse_bandwidth_bytes_per_s, kBandwidth);
  try {
    g.usual_link = parse_link_kind(r.string_or("link", "pcie"));
  } catch (const std::invalid_argument& e) {
    r.fail("link", e.what());
  }
  g.usual_link_bandwidth_bytes_per_s =
      r.quantity_in("link_bandwidth", units::parse_bandwidth_bytes_per_s, kBandwidth, 16e9);
  r.finish();
  return g;
}

Fabric parse_fabric(const YAML::Node& node, const std::string& file, const std::string& path) {
  MapReader r(node, file, path);
  Fabric f;
  const std::string kind = r.string_or("kind", "switch");
  if (kind == "switch") {
    f.kind = FabricKind::single_switch;
  } else if (kind == "fat-tree") {
    f.kind = FabricKind::fat_tree;
    f.nodes_per_leaf = r.positive_int("nodes_per_leaf", limits::kMaxNodes);
    f.oversubscription = r.number_or("oversubscription", 1.0, 1.0, limits::kMaxOversubscription);
  } else {
    r.fail("kind", "expected switch or fat-tree, found '" + kind + "'");
  }
  f.latency_s = r.quantity_in("latency", units::parse_time_s, kLatency, kDefaultSwitchLatency_s, true);
  r.finish();
  return f;
}

// Loader workers per node and batches ahead: beyond these a figure is a typo.
constexpr int kMaxLoaderWorkers = 65'536;
constexpr int kMaxPrefetchBatches = 1'024;
const MapReader::Range kPreprocess{1e-12, limits::kMaxLatency, units::format_time_s};

// The `input:` section: what the data loader reads from and how fast the host prepares
// samples. Every key optional; an absent bandwidth is unbounded, no preprocess is free.
InputPath parse_input(const YAML::Node& node, const std::string& file) {
  MapReader r(node, file, "input");
  InputPath in;
  in.given = true;
  in.shared_read_bytes_per_s =
      r.quantity_in("shared_read", units::parse_bandwidth_bytes_per_s, kBandwidth, 0.0, true);
  in.node_read_bytes_per_s = r.quantity_in("node_read", units::parse_bandwidth_bytes_per_s, kBandwidth, 0.0, true);
  in.preprocess_s_per_sample = r.quantity_in("preprocess", units::parse_time_s, kPreprocess, 0.0, true);
  in.workers_per_node = r.int_or("workers", 1, 1, kMaxLoaderWorkers);
  in.prefetch_batches = r.int_or("prefetch", 2, 1, kMaxPrefetchBatches);
  r.finish();
  return in;
}

// A node entry; `count: N` expands it into N nodes named <name>-0 .. <name>-(N-1).
std::vector<Node> parse_nodes(const YAML::Node& node, const std::string& file, const std::string& path,
                              const std::function<const GpuSpec*(const std::string&)>& find_gpu,
                              const std::vector<std::string>& gpu_names,
                              const std::string& default_region) {
  MapReader r(node, file, path);
  Node n;
  n.name = r.string("name");
  n.region = r.string_or("region", default_region);
  n.gpu = r.string("gpu");
  const GpuSpec* spec = find_gpu(n.gpu);
  if (spec == nullptr) {
    std::string hint;
    for (const std::string& s : nearest_names(n.gpu, gpu_names)) hint += (hint.empty() ? "" : ", ") + s;
    r.fail("gpu", "unknown GPU type '" + n.gpu + "'; nearest known: " + hint +
                      " (or define it under gpu_types)");
  }
  n.gpu = spec->name;  // canonical spelling
  n.gpu_count = r.positive_int("gpus", limits::kMaxGpusPerNode);
  const int count = r.int_or("count", 1, 1, limits::kMaxNodes);

  if (r.has("intra")) {
    MapReader intra(r.get("intra"), file, r.field("intra"));
    try {
      n.intra.kind = parse_link_kind(intra.string_or("kind", std::string(to_string(spec->usual_link))));
    } catch (const std::invalid_argument& e) {
      intra.fail("kind", e.what());
    }
    n.intra.bandwidth_bytes_per_s = intra.quantity_in("bandwidth", units::parse_bandwidth_bytes_per_s, kBandwidth,
                                                      spec->usual_link_bandwidth_bytes_per_s);
    n.intra.latency_s = intra.quantity_in("latency", units::parse_time_s, kLatency, kDefaultIntraLatency_s, true);
    n.intra.uplink_bandwidth_bytes_per_s =
        intra.quantity_in("uplink", units::parse_bandwidth_bytes_per_s, kBandwidth, 0.0, true);
    intra.finish();
  } else {
    n.intra.kind = spec->usual_link;
    n.intra.bandwidth_bytes_per_s = spec->usual_link_bandwidth_bytes_per_s;
    n.intra.latency_s = kDefaultIntraLatency_s;
  }
  if (r.has("nic")) {
    MapReader nic(r.get("nic"), file, r.field("nic"));
    n.nic.count = nic.int_or("count", 1, 1, limits::kMaxNics);
    n.nic.bandwidth_bytes_per_s = nic.quantity_in("bandwidth", units::parse_bandwidth_bytes_per_s, kBandwidth);
    n.nic.latency_s = nic.quantity_in("latency", units::parse_time_s, kLatency, 5e-6, true);
    nic.finish();
  } else {
    n.nic.count = 0;  // no NIC: only valid for a one-node cluster (checked by validate_cluster)
  }
  n.price_usd_per_gpu_hour = r.quantity_in("price", units::parse_price_usd_per_hour, kPrice, 0.0, true);
  if (r.has("host")) {
    // Every field optional: what is left out comes from the GPU type's usual host (node_host.cpp).
    MapReader host(r.get("host"), file, r.field("host"));
    n.host.memory_bytes = host.quantity_in("memory", units::parse_bytes, kMemory, 0.0, true);
    n.host.pcie_bytes_per_s = host.quantity_in("pcie", units::parse_bandwidth_bytes_per_s, kBandwidth, 0.0, true);
    n.host.pcie_latency_s = host.quantity_in("pcie_latency", units::parse_time_s, kLatency, 0.0, true);
    n.host.gpus_per_bridge = host.int_or("gpus_per_bridge", 0, 1, limits::kMaxGpusPerNode);
    n.host.cpu_flops_per_s = host.quantity_in("cpu_flops", units::parse_flops_per_s, kFlops, 0.0, true);
    n.host.cpu_memory_bytes_per_s =
        host.quantity_in("cpu_memory_bandwidth", units::parse_bandwidth_bytes_per_s, kBandwidth, 0.0, true);
    host.finish();
  }
  r.finish();

  std::vector<Node> out;
  if (count == 1 && !r.has("count")) {
    out.push_back(n);
  } else {
    for (int i = 0; i < count; ++i) {
      out.push_back(n);
      out.back().name = n.name + "-" + std::to_string(i);
    }
  }
  return out;
}

}  // namespace

Cluster parse_cluster(const std::string& text, const std::string& file) {
  const YAML::Node root = yaml_util::load(text, file);
  MapReader r(root, file, "");
  Cluster c;
  c.name = r.string_or("name", file);
  c.description = r.string_or("description", "");

  std::vector<std::string> gpu_names = builtin_gpu_names();
  if (r.has("gpu_types")) {
    const YAML::Node list = r.get("gpu_types");
    if (!list.IsSequence()) r.fail("gpu_types", "expected a list of GPU types");
    for (size_t i = 0; i < list.size(); ++i) {
      c.gpu_types.push_back(parse_gpu_type(list[i], file, "gpu_types[" + std::to_string(i) + "]"));
      gpu_names.push_back(c.gpu_types.back().name);
    }
  }
  auto find_gpu = [&c](const std::string& name) -> const GpuSpec* {
    for (const GpuSpec& g : c.gpu_types) {
      if (g.name == name) return &g;
    }
    return find_builtin_gpu(name);
  };

  if (r.has("regions")) {
    if (r.has("fabric")) r.fail("fabric", "give the fabric inside each region when regions are listed");
    const YAML::Node list = r.get("regions");
    if (!list.IsSequence() || list.size() == 0) r.fail("regions", "expected a non-empty list of regions");
    for (size_t i = 0; i < list.size(); ++i) {
      const std::string path = "regions[" + std::to_string(i) + "]";
      MapReader rr(list[i], file, path);
      Region region;
      region.name = rr.string("name");
      region.fabric = rr.has("fabric") ? parse_fabric(rr.get("fabric"), file, rr.field("fabric")) : Fabric{};
      if (!rr.has("fabric")) region.fabric.latency_s = kDefaultSwitchLatency_s;
      rr.finish();
      c.regions.push_back(region);
    }
  } else {
    Region region{"default", Fabric{}};
    region.fabric.latency_s = kDefaultSwitchLatency_s;
    if (r.has("fabric")) region.fabric = parse_fabric(r.get("fabric"), file, "fabric");
    c.regions.push_back(region);
  }

  const YAML::Node nodes = r.required("nodes");
  if (!nodes.IsSequence() || nodes.size() == 0) {
    r.fail("nodes", "expected a non-empty list of nodes (an empty cluster cannot train)");
  }
  std::set<std::string> region_names;
  for (const Region& region : c.regions) region_names.insert(region.name);
  std::set<std::string> node_names;
  long long gpus = 0;
  FieldLines lines{{"nodes", yaml_util::line_of(nodes)}};
  for (size_t i = 0; i < nodes.size(); ++i) {
    const std::string path = "nodes[" + std::to_string(i) + "]";
    std::vector<Node> expanded = parse_nodes(nodes[i], file, path, find_gpu, gpu_names, c.regions.front().name);
    gpus += static_cast<long long>(expanded.size()) * expanded.front().gpu_count;
    if (c.nodes.size() + expanded.size() > static_cast<size_t>(limits::kMaxNodes) || gpus > limits::kMaxGpus) {
      throw InputError(file, yaml_util::line_of(nodes[i]), path + ".count",
                       "the cluster would have more than " + std::to_string(limits::kMaxNodes) + " nodes or " +
                           std::to_string(limits::kMaxGpus) + " GPUs, the most hetflow models");
    }
    for (Node& n : expanded) {
      if (region_names.count(n.region) == 0) {
        throw InputError(file, yaml_util::line_of(nodes[i]), path + ".region",
                         "unknown region '" + n.region + "'");
      }
      if (!node_names.insert(n.name).second) {
        throw InputError(file, yaml_util::line_of(nodes[i]), path + ".name",
                         "duplicate node name '" + n.name + "'");
      }
      lines["nodes[" + std::to_string(c.nodes.size()) + "]"] = yaml_util::line_of(nodes[i]);
      c.nodes.push_back(std::move(n));
    }
  }

  if (r.has("wan")) {
    const YAML::Node list = r.get("wan");
    if (!list.IsSequence()) r.fail("wan", "expected a list of WAN links");
    std::map<std::pair<std::string, std::string>, size_t> joined;  // region pair -> its WAN entry
    for (size_t i = 0; i < list.size(); ++i) {
      const std::string path = "wan[" + std::to_string(i) + "]";
      MapReader wr(list[i], file, path);
      const YAML::Node between = wr.required("between");
      if (!between.IsSequence() || between.size() != 2) {
        wr.fail("between", "expected two region names, e.g. [us-east, eu-west]");
      }
      WanLink w;
      w.region_a = yaml_util::scalar(between[0], file, wr.field("between"));
      w.region_b = yaml_util::scalar(between[1], file, wr.field("between"));
      for (const std::string& name : {w.region_a, w.region_b}) {
        if (region_names.count(name) == 0) wr.fail("between", "unknown region '" + name + "'");
      }
      if (w.region_a == w.region_b) wr.fail("between", "a WAN link joins two different regions");
      const auto pair = std::minmax(w.region_a, w.region_b);
      if (const auto [at, fresh] = joined.emplace(std::pair(pair.first, pair.second), i); !fresh) {
        wr.fail("between", "regions '" + w.region_a + "' and '" + w.region_b + "' are already joined by wan[" +
                               std::to_string(at->second) + "]; give one link per pair of regions");
      }
      w.bandwidth_bytes_per_s = wr.quantity_in("bandwidth", units::parse_bandwidth_bytes_per_s, kBandwidth);
      w.latency_s = wr.quantity_in("latency", units::parse_time_s, kLatency, 0.0, true);
      wr.finish();
      c.wan.push_back(w);
    }
  }
  if (r.has("regions")) {
    const YAML::Node list = r.get("regions");
    lines["regions"] = yaml_util::line_of(list);
    lines["wan"] = yaml_util::line_of(r.has("wan") ? r.get("wan") : list);  // regions without links: where they are
    for (size_t i = 0; i < c.regions.size() && i < list.size(); ++i) {
      lines["regions." + c.regions[i].name] = yaml_util::line_of(list[i]);
    }
  }
  if (r.has("gpu_types")) {
    const YAML::Node list = r.get("gpu_types");
    for (size_t i = 0; i < c.gpu_types.size() && i < list.size(); ++i) {
      lines["gpu_types." + c.gpu_types[i].name] = yaml_util::line_of(list[i]);
    }
  }
  if (r.has("input")) {
    c.input = parse_input(r.get("input"), file);
    lines["input"] = yaml_util::line_of(r.get("input"));
  }
  (void)r.has("reliability");  // failure rates and recovery, for campaigns: campaign/reliability.hpp reads it
  r.finish();
  validate_cluster(c, file, lines);
  return c;
}

void validate_cluster(const Cluster& c, const std::string& file, const FieldLines& lines) {
  auto line_of = [&lines](const std::string& field) {
    int line = 0;
    size_t longest = 0;
    for (const auto& [prefix, at] : lines) {
      if (prefix.size() <= longest || field.compare(0, prefix.size(), prefix) != 0) continue;
      // A whole name only: "nodes[1]" prefixes "nodes[1].nic", not "nodes[10]".
      const char next = field.size() > prefix.size() ? field[prefix.size()] : '.';
      if (next == '.' || next == '[') line = at, longest = prefix.size();
    }
    return line;
  };
  auto fail = [&](const std::string& field, const std::string& message) {
    throw InputError(file, line_of(field), field, message);
  };
  if (c.nodes.empty()) fail("nodes", "expected at least one node (an empty cluster cannot train)");
  if (c.regions.empty()) fail("regions", "expected at least one region");
  std::set<std::string> names, regions;
  for (const Region& r : c.regions) {
    if (!regions.insert(r.name).second) fail("regions", "duplicate region '" + r.name + "'");
    if (r.fabric.kind == FabricKind::fat_tree &&
        (r.fabric.nodes_per_leaf < 1 || r.fabric.oversubscription < 1)) {
      fail("regions." + r.name + ".fabric", "a fat tree needs nodes_per_leaf >= 1 and oversubscription >= 1");
    }
  }
  std::vector<std::string> gpu_names = builtin_gpu_names();
  for (const GpuSpec& g : c.gpu_types) gpu_names.push_back(g.name);
  for (size_t i = 0; i < c.nodes.size(); ++i) {
    const Node& n = c.nodes[i];
    const std::string path = "nodes[" + std::to_string(i) + "]";
    if (!names.insert(n.name).second) fail(path + ".name", "duplicate node name '" + n.name + "'");
    if (regions.count(n.region) == 0) fail(path + ".region", "unknown region '" + n.region + "'");
    if (n.gpu_count < 1) fail(path + ".gpus", "expected at least one GPU, found " + std::to_string(n.gpu_count));
    try {
      (void)c.gpu(n.gpu);
    } catch (const Error&) {
      std::string hint;
      for (const std::string& s : nearest_names(n.gpu, gpu_names)) hint += (hint.empty() ? "" : ", ") + s;
      fail(path + ".gpu", "unknown GPU type '" + n.gpu + "'; nearest known: " + hint);
    }
    if (n.gpu_count > 1 && n.intra.bandwidth_bytes_per_s <= 0) {
      fail(path + ".intra.bandwidth", "expected a positive bandwidth between the node's GPUs");
    }
    if (c.nodes.size() > 1 && (n.nic.count < 1 || n.nic.bandwidth_bytes_per_s <= 0)) {
      fail(path + ".nic", "a node of a multi-node cluster needs a NIC with a positive bandwidth");
    }
  }
  for (const GpuSpec& g : c.gpu_types) {
    if (!(g.fp16_flops_per_s > 0) || !(g.fp32_flops_per_s > 0) || !(g.memory_bytes > 0) ||
        !(g.memory_bandwidth_bytes_per_s > 0) || !std::isfinite(g.fp16_flops_per_s + g.bf16_flops_per_s +
                                                               g.fp32_flops_per_s + g.memory_bytes +
                                                               g.memory_bandwidth_bytes_per_s)) {
      fail("gpu_types." + g.name, "expected positive, finite fp16, fp32, memory and memory_bandwidth");
    }
  }
  if (c.nodes.size() > static_cast<size_t>(limits::kMaxNodes) || c.device_count() > limits::kMaxGpus) {
    fail("nodes", "more than " + std::to_string(limits::kMaxNodes) + " nodes or " + std::to_string(limits::kMaxGpus) +
                      " GPUs, the most hetflow models");
  }
  // Every time and rate the simulator gets must be a finite number.
  auto finite = [&](double v) { return std::isfinite(v) && v >= 0; };
  for (size_t i = 0; i < c.nodes.size(); ++i) {
    const Node& n = c.nodes[i];
    if (!finite(n.intra.bandwidth_bytes_per_s) || !finite(n.intra.latency_s) ||
        !finite(n.intra.uplink_bandwidth_bytes_per_s) || !finite(n.nic.bandwidth_bytes_per_s) ||
        !finite(n.nic.latency_s)) {
      fail("nodes[" + std::to_string(i) + "]", "expected finite, non-negative bandwidths and latencies");
    }
  }
  for (const Region& r : c.regions) {
    if (!finite(r.fabric.latency_s) || !std::isfinite(r.fabric.oversubscription)) {
      fail("regions." + r.name + ".fabric", "expected a finite latency and oversubscription");
    }
  }
  const InputPath& in = c.input;
  if (!finite(in.shared_read_bytes_per_s) || !finite(in.node_read_bytes_per_s) ||
      !finite(in.preprocess_s_per_sample) || in.workers_per_node < 1 || in.prefetch_batches < 1) {
    fail("input", "expected finite, non-negative bandwidths and preprocessing time, at least one worker and "
                  "one batch of prefetch");
  }
  std::set<std::pair<std::string, std::string>> joined;
  for (const WanLink& w : c.wan) {
    if (!finite(w.bandwidth_bytes_per_s) || !finite(w.latency_s)) {
      fail("wan", "expected finite, non-negative WAN bandwidths and latencies");
    }
    if (!joined.insert(std::minmax(w.region_a, w.region_b)).second) {
      fail("wan", "regions '" + w.region_a + "' and '" + w.region_b + "' are joined by more than one WAN link");
    }
  }
  // Every region must reach every other one over WAN links.
  if (c.regions.size() > 1) {
    std::map<std::string, std::string> parent;
    for (const Region& r : c.regions) parent[r.name] = r.name;
    std::function<std::string(const std::string&)> root = [&](const std::string& x) {
      return parent[x] == x ? x : parent[x] = root(parent[x]);
    };
    for (const WanLink& w : c.wan) {
      if (regions.count(w.region_a) == 0 || regions.count(w.region_b) == 0) {
        fail("wan", "link between unknown regions '" + w.region_a + "' and '" + w.region_b + "'");
      }
      if (w.bandwidth_bytes_per_s <= 0) fail("wan", "expected a positive WAN bandwidth");
      parent[root(w.region_a)] = root(w.region_b);
    }
    for (const Region& r : c.regions) {
      if (root(r.name) != root(c.regions.front().name)) {
        fail("wan", "region '" + r.name + "' is not connected to region '" + c.regions.front().name +
                        "' by any WAN link");
      }
    }
  }
}

namespace {
void emit_gpu(YAML::Emitter& out, const GpuSpec& g) {
  out << YAML::BeginMap;
  out << YAML::Key << "name" << YAML::Value << g.name;
  out << YAML::Key << "description" << YAML::Value << g.description;
  out << YAML::Key << "fp16" << YAML::Value << units::format_flops_per_s(g.fp16_flops_per_s);
  out << YAML::Key << "bf16" << YAML::Value << units::format_flops_per_s(g.bf16_flops_per_s);
  out << YAML::Key << "fp32" << YAML::Value << units::format_flops_per_s(g.fp32_flops_per_s);
  out << YAML::Key << "memory" << YAML::Value << units::format_bytes(g.memory_bytes);
  out << YAML::Key << "memory_bandwidth" << YAML::Value << units::format_bandwidth(g.memory_bandwidth_bytes_per_s);
  out << YAML::Key << "link" << YAML::Value << std::string(to_string(g.usual_link));
  out << YAML::Key << "link_bandwidth" << YAML::Value << units::format_bandwidth(g.usual_link_bandwidth_bytes_per_s);
  out << YAML::EndMap;
}
}  // namespace

std::string write_cluster(const Cluster& c) {
  YAML::Emitter out;
  out << YAML::BeginMap;
  out << YAML::Key << "name" << YAML::Value << c.name;
  out << YAML::Key << "description" << YAML::Value << c.description;
  if (!c.gpu_types.empty()) {
    out << YAML::Key << "gpu_types" << YAML::Value << YAML::BeginSeq;
    for (const GpuSpec& g : c.gpu_types) emit_gpu(out, g);
    out << YAML::EndSeq;
  }
  out << YAML::Key << "regions" << YAML::Value << YAML::BeginSeq;
  for (const Region& r : c.regions) {
    out << YAML::BeginMap << YAML::Key << "name" << YAML::Value << r.name;
    out << YAML::Key << "fabric" << YAML::Value << YAML::Flow << YAML::BeginMap;
    out << YAML::Key << "kind" << YAML::Value
        << (r.fabric.kind == FabricKind::fat_tree ? "fat-tree" : "switch");
    out << YAML::Key << "latency" << YAML::Value << units::format_time_s(r.fabric.latency_s);
    if (r.fabric.kind == FabricKind::fat_tree) {
      out << YAML::Key << "nodes_per_leaf" << YAML::Value << r.fabric.nodes_per_leaf;
      out << YAML::Key << "oversubscription" << YAML::Value << r.fabric.oversubscription;
    }
    out << YAML::EndMap << YAML::EndMap;
  }
  out << YAML::EndSeq;
  out << YAML::Key << "nodes" << YAML::Value << YAML::BeginSeq;
  for (const Node& n : c.nodes) {
    out << YAML::BeginMap;
    out << YAML::Key << "name" << YAML::Value << n.name;
    out << YAML::Key << "region" << YAML::Value << n.region;
    out << YAML::Key << "gpu" << YAML::Value << n.gpu;
    out << YAML::Key << "gpus" << YAML::Value << n.gpu_count;
    out << YAML::Key << "intra" << YAML::Value << YAML::Flow << YAML::BeginMap;
    out << YAML::Key << "kind" << YAML::Value << std::string(to_string(n.intra.kind));
    out << YAML::Key << "bandwidth" << YAML::Value << units::format_bandwidth(n.intra.bandwidth_bytes_per_s);
    out << YAML::Key << "latency" << YAML::Value << units::format_time_s(n.intra.latency_s);
    out << YAML::Key << "uplink" << YAML::Value << units::format_bandwidth(n.intra.uplink_bandwidth_bytes_per_s);
    out << YAML::EndMap;
    if (n.nic.count > 0) {
      out << YAML::Key << "nic" << YAML::Value << YAML::Flow << YAML::BeginMap;
      out << YAML::Key << "count" << YAML::Value << n.nic.count;
      out << YAML::Key << "bandwidth" << YAML::Value << units::format_bandwidth(n.nic.bandwidth_bytes_per_s);
      out << YAML::Key << "latency" << YAML::Value << units::format_time_s(n.nic.latency_s);
      out << YAML::EndMap;
    }
    if (n.price_usd_per_gpu_hour > 0) {
      out << YAML::Key << "price" << YAML::Value << units::format_price_usd_per_hour(n.price_usd_per_gpu_hour);
    }
    if (n.host != NodeHost{}) {
      // Only the figures the file gave: the rest stay the GPU type's usual host's.
      out << YAML::Key << "host" << YAML::Value << YAML::Flow << YAML::BeginMap;
      const NodeHost& h = n.host;
      if (h.memory_bytes > 0) out << YAML::Key << "memory" << YAML::Value << units::format_bytes(h.memory_bytes);
      if (h.pcie_bytes_per_s > 0) out << YAML::Key << "pcie" << YAML::Value << units::format_bandwidth(h.pcie_bytes_per_s);
      if (h.pcie_latency_s > 0) out << YAML::Key << "pcie_latency" << YAML::Value << units::format_time_s(h.pcie_latency_s);
      if (h.gpus_per_bridge > 0) out << YAML::Key << "gpus_per_bridge" << YAML::Value << h.gpus_per_bridge;
      if (h.cpu_flops_per_s > 0) out << YAML::Key << "cpu_flops" << YAML::Value << units::format_flops_per_s(h.cpu_flops_per_s);
      if (h.cpu_memory_bytes_per_s > 0) {
        out << YAML::Key << "cpu_memory_bandwidth" << YAML::Value << units::format_bandwidth(h.cpu_memory_bytes_per_s);
      }
      out << YAML::EndMap;
    }
    out << YAML::EndMap;
  }
  out << YAML::EndSeq;
  if (!c.wan.empty()) {
    out << YAML::Key << "wan" << YAML::Value << YAML::BeginSeq;
    for (const WanLink& w : c.wan) {
      out << YAML::Flow << YAML::BeginMap;
      out << YAML::Key << "between" << YAML::Value << YAML::Flow << YAML::BeginSeq << w.region_a
          << w.region_b << YAML::EndSeq;
      out << YAML::Key << "bandwidth" << YAML::Value << units::format_bandwidth(w.bandwidth_bytes_per_s);
      out << YAML::Key << "latency" << YAML::Value << units::format_time_s(w.latency_s);
      out << YAML::EndMap;
    }
    out << YAML::EndSeq;
  }
  if (c.input.given) {
    const InputPath& in = c.input;
    out << YAML::Key << "input" << YAML::Value << YAML::Flow << YAML::BeginMap;
    if (in.shared_read_bytes_per_s > 0) {
      out << YAML::Key << "shared_read" << YAML::Value << units::format_bandwidth(in.shared_read_bytes_per_s);
    }
    if (in.node_read_bytes_per_s > 0) {
      out << YAML::Key << "node_read" << YAML::Value << units::format_bandwidth(in.node_read_bytes_per_s);
    }
    if (in.preprocess_s_per_sample > 0) {
      out << YAML::Key << "preprocess" << YAML::Value << units::format_time_s(in.preprocess_s_per_sample);
    }
    out << YAML::Key << "workers" << YAML::Value << in.workers_per_node;
    out << YAML::Key << "prefetch" << YAML::Value << in.prefetch_batches;
    out << YAML::EndMap;
  }
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

}  // namespace hetflow::model
