#include "partition/cost_model.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <map>
#include <queue>
#include <tuple>

#include "model/error.hpp"
#include "partition/collective_steps.hpp"
#include "partition/layer_ops.hpp"
#include "partition/schedule.hpp"

namespace hetflow::partition {

namespace {
constexpr double kInfinity = std::numeric_limits<double>::infinity();

// Keeps the narrower of two routes' bottlenecks and adds latencies.
void through(Route& route, double bandwidth_bytes_per_s, double latency_s, std::string_view link_class) {
  if (bandwidth_bytes_per_s > 0 && bandwidth_bytes_per_s < route.bandwidth_bytes_per_s) {  // <= 0: unlimited
    route.bandwidth_bytes_per_s = bandwidth_bytes_per_s;
    route.bottleneck = link_class;
  }
  route.latency_s += latency_s;
}
}  // namespace

CostModel CostModel::without_input() const {
  CostModel c = *this;
  c.cluster_.input = {};
  return c;
}

CostModel::CostModel(const model::Cluster& cluster, model::Precision precision, model::Calibration calibration)
    : cluster_(model::apply_link_calibration(cluster, calibration)),
      precision_(precision),
      calibration_(std::move(calibration)) {
  std::map<std::string, int> region_index;
  std::vector<std::string> terms_names;  // the GPU type of each terms_ entry
  for (size_t r = 0; r < cluster_.regions.size(); ++r) region_index[cluster_.regions[r].name] = static_cast<int>(r);
  for (size_t n = 0; n < cluster_.nodes.size(); ++n) {
    node_region_.push_back(region_index.at(cluster_.nodes[n].region));
    const model::GpuSpec* gpu = &cluster_.gpu(cluster_.nodes[n].gpu);
    int terms = -1;
    for (size_t i = 0; i < terms_names.size(); ++i) {
      if (terms_names[i] == gpu->name) terms = static_cast<int>(i);
    }
    if (terms < 0) {
      const model::GpuEfficiency& type = calibration_.gpu(gpu->name);
      ComputeTerms c;
      c.peak_flops_per_s = gpu->peak_flops_per_s(precision_);
      c.memory_bandwidth_bytes_per_s = gpu->memory_bandwidth_bytes_per_s;
      c.dispatch_s = type.dispatch_s;
      for (TaskKind k : {TaskKind::forward, TaskKind::backward, TaskKind::backward_weight, TaskKind::optimizer}) {
        c.of_kind[static_cast<size_t>(k)] = type.of(std::string(to_string(k)));
      }
      terms_.push_back(c);
      terms_names.push_back(gpu->name);
      terms = static_cast<int>(terms_.size()) - 1;
    }
    for (int g = 0; g < cluster_.nodes[n].gpu_count; ++g) {
      device_node_.push_back(static_cast<int>(n));
      device_gpu_.push_back(gpu);
      device_terms_.push_back(terms);
    }
  }
  // Fat-tree leaves: a region's nodes in cluster order, nodes_per_leaf to a leaf.
  node_leaf_.assign(cluster_.nodes.size(), 0);
  node_leaf_uplink_.assign(cluster_.nodes.size(), 0);
  for (const model::Region& region : cluster_.regions) {
    if (region.fabric.kind != model::FabricKind::fat_tree) continue;
    std::vector<size_t> members;
    for (size_t n = 0; n < cluster_.nodes.size(); ++n) {
      if (cluster_.nodes[n].region == region.name) members.push_back(n);
    }
    const auto per_leaf = static_cast<size_t>(region.fabric.nodes_per_leaf);
    for (size_t first = 0; first < members.size(); first += per_leaf) {
      double bandwidth = 0;
      const size_t last = std::min(members.size(), first + per_leaf);
      for (size_t i = first; i < last; ++i) {
        bandwidth += cluster_.nodes[members[i]].nic.count * cluster_.nodes[members[i]].nic.bandwidth_bytes_per_s;
      }
      for (size_t i = first; i < last; ++i) {
        node_leaf_[members[i]] = static_cast<int>(first / per_leaf);
        node_leaf_uplink_[members[i]] = bandwidth / region.fabric.oversubscription;
      }
    }
  }
  // Region-to-region WAN routes: the widest path (max of the min bandwidth), then the lowest
  // latency; a handful of regions, so a simple relaxation to a fixed point is enough.
  const size_t regions = cluster_.regions.size();
  region_route_.assign(regions, std::vector<Route>(regions, Route{0, kInfinity, ""}));
  region_hops_.assign(regions, std::vector<std::vector<int>>(regions));
  for (size_t r = 0; r < regions; ++r) region_route_[r][r] = Route{kInfinity, 0, ""};
  // The links of route_links: GPU links, host bridges, NICs, leaf uplinks, WAN links.
  for (size_t d = 0; d < device_node_.size(); ++d) {
    const auto n = static_cast<size_t>(device_node_[d]);
    device_local_.push_back(d > 0 && device_node_[d - 1] == device_node_[d] ? device_local_.back() + 1 : 0);
    link_bandwidth_.push_back(cluster_.nodes[n].intra.bandwidth_bytes_per_s);
  }
  for (const model::Node& node : cluster_.nodes) link_bandwidth_.push_back(node.intra.uplink_bandwidth_bytes_per_s);
  for (const model::Node& node : cluster_.nodes) {
    node_nic_link_.push_back(static_cast<int>(link_bandwidth_.size()));
    for (int r = 0; r < std::max(1, node.nic.count); ++r) link_bandwidth_.push_back(node.nic.bandwidth_bytes_per_s);
  }
  node_leaf_link_.assign(cluster_.nodes.size(), -1);
  std::map<std::pair<int, int>, int> leaf_link;  // (region, leaf) -> link
  for (size_t n = 0; n < cluster_.nodes.size(); ++n) {
    const int region = node_region_[n];
    if (cluster_.regions[static_cast<size_t>(region)].fabric.kind != model::FabricKind::fat_tree) continue;
    const auto [at, added] = leaf_link.emplace(std::pair{region, node_leaf_[n]}, static_cast<int>(link_bandwidth_.size()));
    if (added) link_bandwidth_.push_back(node_leaf_uplink_[n]);
    node_leaf_link_[n] = at->second;
  }
  wan_link_ = static_cast<int>(link_bandwidth_.size());
  for (const model::WanLink& w : cluster_.wan) link_bandwidth_.push_back(w.bandwidth_bytes_per_s);
  bool changed = true;
  while (changed) {
    changed = false;
    for (size_t i = 0; i < cluster_.wan.size(); ++i) {
      const model::WanLink& w = cluster_.wan[i];
      const size_t a = static_cast<size_t>(region_index.at(w.region_a));
      const size_t b = static_cast<size_t>(region_index.at(w.region_b));
      for (size_t src = 0; src < regions; ++src) {
        for (auto [from, to] : {std::pair{a, b}, std::pair{b, a}}) {
          const Route& via = region_route_[src][from];
          if (via.bandwidth_bytes_per_s <= 0) continue;
          Route candidate = via;
          through(candidate, w.bandwidth_bytes_per_s, w.latency_s, "wan");
          Route& best = region_route_[src][to];
          if (candidate.bandwidth_bytes_per_s > best.bandwidth_bytes_per_s ||
              (candidate.bandwidth_bytes_per_s == best.bandwidth_bytes_per_s && candidate.latency_s < best.latency_s)) {
            best = candidate;
            // The platform's WAN route: the same path, each link in the direction it is crossed.
            std::vector<int> hops = region_hops_[src][from];
            hops.push_back(2 * (wan_link_ + static_cast<int>(i)) + (from == a ? 0 : 1));
            region_hops_[src][to] = std::move(hops);
            changed = true;
          }
        }
      }
    }
  }
}

double EdgeBandwidths::of(int src, int dst, double route_bytes_per_s) const {
  for (const auto& [pair, bandwidth] : of_edge) {
    if (pair.first == src && pair.second == dst) return bandwidth;
  }
  return route_bytes_per_s;
}

void CostModel::route_links(int src, int dst, std::vector<int>& out) const {
  if (src == dst) return;
  const auto add = [&](int link, bool back) {
    if (link >= 0 && link_bandwidth_[static_cast<size_t>(link)] > 0) out.push_back(2 * link + (back ? 1 : 0));
  };
  const int devices = device_count();
  const auto ns = static_cast<size_t>(node_of(src)), nd = static_cast<size_t>(node_of(dst));
  const auto nic = [&](size_t n, int device) {
    const int count = std::max(1, cluster_.nodes[n].nic.count);  // GPU i uses NIC i mod count
    return node_nic_link_[n] + device_local_[static_cast<size_t>(device)] % count;
  };
  add(src, false);
  add(devices + static_cast<int>(ns), false);
  if (ns == nd) {
    add(devices + static_cast<int>(ns), true);
  } else {
    add(nic(ns, src), false);
    const auto ra = static_cast<size_t>(node_region_[ns]), rb = static_cast<size_t>(node_region_[nd]);
    if (ra != rb || node_leaf_link_[ns] != node_leaf_link_[nd]) add(node_leaf_link_[ns], false);
    if (ra != rb) {
      for (const int hop : region_hops_[ra][rb]) add(hop / 2, hop % 2 == 1);
    }
    if (ra != rb || node_leaf_link_[ns] != node_leaf_link_[nd]) add(node_leaf_link_[nd], true);
    add(nic(nd, dst), true);
    add(devices + static_cast<int>(nd), true);
  }
  add(dst, true);
}

bool CostModel::same_compute(int a, int b) const {
  const auto x = static_cast<size_t>(a), y = static_cast<size_t>(b);
  return device_gpu_.at(x) == device_gpu_.at(y) && (slowdown_.empty() || slowdown_[x] == slowdown_[y]);
}

void CostModel::set_slowdown(int device, double factor) {
  slowdown_.resize(device_node_.size(), 1.0);
  slowdown_.at(static_cast<size_t>(device)) = factor;
}

double CostModel::peak_flops_per_s(int device) const {
  return device_gpu_.at(static_cast<size_t>(device))->peak_flops_per_s(precision_);
}

double CostModel::memory_capacity_bytes(int device) const {
  return device_gpu_.at(static_cast<size_t>(device))->memory_bytes;
}

namespace {
// What of a layer a task computes, beyond the passes themselves.
enum What { kForward = 0, kBackwardData, kBackwardWeight, kRecomputeFull, kRecomputeSelective };

bool selective_op(std::string_view name) {
  return name == "scores" || name == "softmax" || name == "attention dropout" || name == "context" ||
         name == "flash attention";
}
}  // namespace

template <class Part>
void CostModel::for_each_layer_op(const model::Network& network, const Layout& layout, const model::GpuSpec& gpu, int layer, int what,
                                  const TaskShape& task, Part part) const {
  const OpShape shape{layout.micro_batch_size, task.tensor, layout.sequence_parallel,
                      model::element_bytes(layout.precision), layout.size(Axis::context),
                      layout.experts.parallel, task.experts.held, task.experts.load};
  const OpPass pass = what == kBackwardData ? OpPass::backward_data
                      : what == kBackwardWeight ? OpPass::backward_weight
                                                : OpPass::forward;
  const model::GpuEfficiency& type = calibration_.gpu(gpu.name);
  const model::OpEfficiency gemm = type.op("gemm"), attention = type.op("attention"), memory = type.op("memory");
  for (const Op& op : layer_ops(network, layer, pass, shape, layout.kernels)) {
    if (what == kRecomputeSelective && !selective_op(op.name)) continue;
    switch (op.cls) {
      case OpClass::gemm:
        part(op.name, gemm.time_s(op.flops, gpu.peak_flops_per_s(precision_) * gemm.utilization(op.m, op.n, op.batch)));
        break;
      case OpClass::attention: part(op.name, attention.time_s(op.flops, gpu.peak_flops_per_s(precision_))); break;
      case OpClass::memory: part(op.name, memory.time_s(op.bytes, gpu.memory_bandwidth_bytes_per_s)); break;
    }
  }
}

double CostModel::layer_ops_time_s(const model::Network& network, const Layout& layout, const model::GpuSpec& gpu, int layer, int what,
                                   const TaskShape& task) const {
  const model::Layer& l = network.layers[static_cast<size_t>(layer)];
  const KernelOptions& k = layout.kernels;
  const int kernels = k.flash_attention + 2 * k.fused_softmax + 4 * k.fused_bias_gelu + 8 * k.fused_bias_dropout_add;
  // A decoder's dense layers of one kind are alike, and its MoE layers; a CNN's differ layer by layer.
  const int which = !l.cnn_ops.empty() ? layer : l.experts > 0 ? -2 : -1;
  const auto key = std::make_tuple(&gpu, l.kind, which, what, layout.micro_batch_size, task.tensor, layout.sequence_parallel,
                                   kernels, layout.size(Axis::context), task.experts.held, task.experts.load);
  {
    const std::lock_guard<std::mutex> lock(op_cache_.mutex);
    if (const auto it = op_cache_.seconds.find(key); it != op_cache_.seconds.end()) return it->second;
  }
  double s = 0;
  for_each_layer_op(network, layout, gpu, layer, what, task, [&](std::string_view, double t) { s += t; });
  const std::lock_guard<std::mutex> lock(op_cache_.mutex);
  op_cache_.seconds.emplace(key, s);
  return s;
}

ExpertShare CostModel::task_expert_share(const model::Network& network, const Layout& layout, int worker) const {
  const bool moe = network.architecture && network.architecture->moe.experts > 0;
  if (!moe || (layout.experts.parallel <= 1 && network.architecture->moe.capacity_factor <= 0)) return {};
  const model::MoeConfig& m = network.architecture->moe;
  const auto key = std::make_tuple(layout.experts, m.experts, m.capacity_factor, layout.size(Axis::context));
  const std::lock_guard<std::mutex> lock(split_cache_.mutex);
  for (const auto& [k, split] : split_cache_.splits) {
    if (k == key) return expert_share(split, layout, worker);
  }
  split_cache_.splits.emplace_back(key, expert_split(network, layout));
  return expert_share(split_cache_.splits.back().second, layout, worker);
}

std::vector<int> CostModel::task_passes(const model::Network& network, const Layout& layout, const Task& t, TaskShape* shape) const {
  const model::GpuSpec& gpu = *device_gpu_.at(static_cast<size_t>(t.device));
  const model::GpuEfficiency& type = calibration_.gpu(gpu.name);
  const bool layered = is_pass(t.kind);
  if (type.ops.empty() || !layered || t.flops <= 0 || t.layer_begin >= t.layer_end || !has_layer_ops(network)) {
    return {};
  }
  *shape = {};
  const Layout& l = layout;
  if (t.worker >= 0 && static_cast<size_t>(t.worker) < l.workers.size() && t.stage >= 0 &&
      static_cast<size_t>(t.stage) < l.workers[static_cast<size_t>(t.worker)].stages.size()) {
    shape->tensor = l.workers[static_cast<size_t>(t.worker)].tensor_of(static_cast<size_t>(t.stage));
    shape->experts = task_expert_share(network, layout, t.worker);
  }
  bool split = false;
  try {
    split = schedule_by_name(l.schedule).splits_backward;
  } catch (const Error&) {
    split = false;  // validation names an unknown schedule; here the whole backward is counted
  }
  if (t.kind == TaskKind::forward) return {kForward};
  if (t.kind == TaskKind::backward_weight) return {kBackwardWeight};
  std::vector<int> passes = split ? std::vector<int>{kBackwardData} : std::vector<int>{kBackwardData, kBackwardWeight};
  if (t.recompute_flops > 0) passes.push_back(l.recompute == Recompute::selective ? kRecomputeSelective : kRecomputeFull);
  return passes;
}

double CostModel::task_compute_time_s(const model::Network& network, const Layout& layout, const Task& t) const {
  TaskShape shape;
  const std::vector<int> passes = task_passes(network, layout, t, &shape);
  if (passes.empty()) return compute_time_s(t.device, t.kind, t.flops, t.memory_bytes);
  const model::GpuSpec& gpu = *device_gpu_.at(static_cast<size_t>(t.device));
  const model::GpuEfficiency& type = calibration_.gpu(gpu.name);
  double s = 0;
  for (int layer = t.layer_begin; layer < t.layer_end && layer < static_cast<int>(network.layers.size()); ++layer) {
    for (int what : passes) s += layer_ops_time_s(network, layout, gpu, layer, what, shape);
  }
  const double slowdown = slowdown_.empty() ? 1.0 : slowdown_[static_cast<size_t>(t.device)];
  return type.dispatch_s + (type.of(std::string(to_string(t.kind))).overhead_s + s) * slowdown;
}

std::vector<std::pair<std::string, double>> CostModel::task_compute_parts_s(const model::Network& network, const Layout& layout, const Task& t) const {
  TaskShape shape;
  const std::vector<int> passes = task_passes(network, layout, t, &shape);
  if (passes.empty()) return {{std::string(to_string(t.kind)), task_compute_time_s(network, layout, t)}};
  const model::GpuSpec& gpu = *device_gpu_.at(static_cast<size_t>(t.device));
  const model::GpuEfficiency& type = calibration_.gpu(gpu.name);
  const double slowdown = slowdown_.empty() ? 1.0 : slowdown_[static_cast<size_t>(t.device)];
  std::vector<std::pair<std::string, double>> parts;
  auto add = [&](std::string_view name, double s) {
    for (auto& [n, total] : parts) {
      if (n == name) {
        total += s;
        return;
      }
    }
    parts.emplace_back(std::string(name), s);
  };
  for (int layer = t.layer_begin; layer < t.layer_end && layer < static_cast<int>(network.layers.size()); ++layer) {
    for (int what : passes) {
      for_each_layer_op(network, layout, gpu, layer, what, shape, [&](std::string_view name, double s) { add(name, s * slowdown); });
    }
  }
  const double overhead = type.dispatch_s + type.of(std::string(to_string(t.kind))).overhead_s * slowdown;
  if (overhead > 0) add("overhead", overhead);
  return parts;
}

double CostModel::task_compute_time_s(const Plan& plan, const Task& t) const {
  return task_compute_time_s(plan.network, plan.layout, t);
}

std::vector<std::pair<std::string, double>> CostModel::task_compute_parts_s(const Plan& plan, const Task& t) const {
  return task_compute_parts_s(plan.network, plan.layout, t);
}

double CostModel::compute_time_s(int device, TaskKind kind, double flops, double memory_bytes) const {
  const ComputeTerms& c = terms_[static_cast<size_t>(device_terms_.at(static_cast<size_t>(device)))];
  if (flops <= 0 && memory_bytes <= 0) return 0;
  const auto k = static_cast<size_t>(kind);
  if (k >= c.of_kind.size()) throw Error("compute_time_s: " + std::string(to_string(kind)) + " is not a compute task");
  const model::Efficiency& eff = c.of_kind[k];
  const double math_s = eff.math_s(flops, c.peak_flops_per_s);
  const double memory_s = memory_bytes / c.memory_bandwidth_bytes_per_s;
  const double slowdown = slowdown_.empty() ? 1.0 : slowdown_[static_cast<size_t>(device)];
  return c.dispatch_s + (eff.overhead_s + std::max(math_s, memory_s)) * slowdown;
}

double CostModel::memory_op_time_s(int device, double bytes) const {
  if (!(bytes > 0)) return 0;
  const model::GpuSpec& gpu = *device_gpu_.at(static_cast<size_t>(device));
  const double slowdown = slowdown_.empty() ? 1.0 : slowdown_[static_cast<size_t>(device)];
  return calibration_.gpu(gpu.name).op("memory").time_s(bytes, gpu.memory_bandwidth_bytes_per_s) * slowdown;
}

Route CostModel::route(int src, int dst) const {
  Route r{kInfinity, 0, "local"};
  if (src == dst) return r;
  const int ns = node_of(src), nd = node_of(dst);
  const model::Node& a = cluster_.nodes[static_cast<size_t>(ns)];
  const model::Node& b = cluster_.nodes[static_cast<size_t>(nd)];
  const std::string_view a_kind = model::to_string(a.intra.kind), b_kind = model::to_string(b.intra.kind);
  // GPU link (half the intra-node latency at each end) and the PCIe uplink where present.
  through(r, a.intra.bandwidth_bytes_per_s, a.intra.latency_s / 2, a_kind);
  if (a.intra.uplink_bandwidth_bytes_per_s > 0) through(r, a.intra.uplink_bandwidth_bytes_per_s, 0, "pcie");
  if (ns != nd) {
    through(r, a.nic.bandwidth_bytes_per_s, a.nic.latency_s, "nic");
    const auto ra = static_cast<size_t>(node_region_[static_cast<size_t>(ns)]);
    const auto rb = static_cast<size_t>(node_region_[static_cast<size_t>(nd)]);
    const model::Fabric& fa = cluster_.regions[ra].fabric;
    const model::Fabric& fb = cluster_.regions[rb].fabric;
    const bool tree_a = fa.kind == model::FabricKind::fat_tree, tree_b = fb.kind == model::FabricKind::fat_tree;
    if (ra == rb) {
      if (tree_a && node_leaf_[static_cast<size_t>(ns)] != node_leaf_[static_cast<size_t>(nd)]) {
        through(r, node_leaf_uplink_[static_cast<size_t>(ns)], 0, "fabric");  // leaf, spine, leaf
        through(r, node_leaf_uplink_[static_cast<size_t>(nd)], 0, "fabric");
        r.latency_s += 3 * fa.latency_s;
      } else {
        r.latency_s += fa.latency_s;
      }
    } else {
      // Up to each region's gateway (one switch hop; leaf and spine in a fat tree), across the WAN.
      if (tree_a) through(r, node_leaf_uplink_[static_cast<size_t>(ns)], 0, "fabric");
      if (tree_b) through(r, node_leaf_uplink_[static_cast<size_t>(nd)], 0, "fabric");
      r.latency_s += (tree_a ? 2 : 1) * fa.latency_s + (tree_b ? 2 : 1) * fb.latency_s;
      const Route& wan = region_route_[ra][rb];
      through(r, wan.bandwidth_bytes_per_s, wan.latency_s, "wan");
    }
    through(r, b.nic.bandwidth_bytes_per_s, b.nic.latency_s, "nic");
  }
  if (b.intra.uplink_bandwidth_bytes_per_s > 0) through(r, b.intra.uplink_bandwidth_bytes_per_s, 0, "pcie");
  through(r, b.intra.bandwidth_bytes_per_s, b.intra.latency_s / 2, b_kind);
  return r;
}

std::vector<std::string> CostModel::link_classes(int src, int dst) const {
  std::vector<std::string> out;
  if (src == dst) return out;
  const int ns = node_of(src), nd = node_of(dst);
  const model::Node& a = cluster_.nodes[static_cast<size_t>(ns)];
  const model::Node& b = cluster_.nodes[static_cast<size_t>(nd)];
  out.emplace_back(model::to_string(a.intra.kind));
  if (a.intra.uplink_bandwidth_bytes_per_s > 0) out.emplace_back("pcie");
  if (ns != nd) {
    out.emplace_back("nic");
    out.emplace_back("fabric");
    if (node_region_[static_cast<size_t>(ns)] != node_region_[static_cast<size_t>(nd)]) out.emplace_back("wan");
    out.emplace_back("nic");
  }
  if (b.intra.uplink_bandwidth_bytes_per_s > 0) out.emplace_back("pcie");
  out.emplace_back(model::to_string(b.intra.kind));
  return out;
}

double CostModel::host_copy_time_s(int device, double bytes) const {
  const model::NodeHost h = cluster_.host(node_of(device));
  return h.pcie_latency_s + bytes / h.pcie_bytes_per_s;
}

double CostModel::host_step_time_s(int device, double flops, double memory_bytes) const {
  const model::NodeHost h = cluster_.host(node_of(device));
  return std::max(flops / h.cpu_flops_per_s, memory_bytes / h.cpu_memory_bytes_per_s);
}

double CostModel::transfer_time_s(int src, int dst, double bytes) const {
  return transfer_time_s(src, dst, bytes, nullptr);
}

double CostModel::transfer_time_s(int src, int dst, double bytes, const EdgeBandwidths* shared) const {
  if (free_communication_ || src == dst || bytes <= 0) return 0;
  const Route r = edge(src, dst, shared);
  return r.latency_s + bytes / r.bandwidth_bytes_per_s;
}

Route CostModel::edge(int src, int dst, const EdgeBandwidths* shared) const {
  Route r = route(src, dst);
  if (shared != nullptr) r.bandwidth_bytes_per_s = shared->of(src, dst, r.bandwidth_bytes_per_s);
  return r;
}

double CostModel::ring_time_s(const std::vector<int>& ring, double bytes_per_step, int steps,
                              const EdgeBandwidths* shared) const {
  if (ring.size() < 2 || steps <= 0) return 0;
  double step_s = 0;
  for (size_t i = 0; i < ring.size(); ++i) {
    const Route r = edge(ring[i], ring[(i + 1) % ring.size()], shared);
    step_s = std::max(step_s, r.latency_s + bytes_per_step / r.bandwidth_bytes_per_s);
  }
  return steps * step_s;
}

double CostModel::uneven_ring_time_s(const CollectiveSpec& c, const EdgeBandwidths* shared) const {
  // The steps as collective_steps.hpp lists them (member p sends part p - s - 1 in step s of
  // a reduce-scatter, p - s of an all-gather) and as the back ends run them: a member's step
  // starts when its previous one has ended, a send when its receiver has reached the same
  // step, and a step ends with its send and its receive (the predecessor's send). So a member
  // paces only its neighbours: on links alike every step lasts as the largest part, but a
  // slow link carrying a small part does not hold up a fast one carrying a large part, as a
  // whole-ring maximum per step would. Above 128 members, the bound that pairs the slowest
  // edge with the largest part (n^2 terms would cost more than the estimate saves).
  const size_t n = c.devices.size();
  const std::vector<double> cuts = part_cuts(c.parts, n);
  if (n > 128) {
    double largest = 0;
    for (size_t i = 0; i < n; ++i) largest = std::max(largest, cuts[i + 1] - cuts[i]);
    return ring_time_s(c.devices, c.bytes * largest, static_cast<int>(n) - 1, shared);
  }
  std::vector<Route> edges;
  for (size_t i = 0; i < n; ++i) edges.push_back(edge(c.devices[i], c.devices[(i + 1) % n], shared));
  const long long shift = c.kind == CollectiveKind::reduce_scatter ? -1 : 0;
  std::vector<double> start(n, 0), sent(n, 0);
  for (size_t s = 0; s + 1 < n; ++s) {
    for (size_t p = 0; p < n; ++p) {
      const long long index = static_cast<long long>(p) - static_cast<long long>(s) + shift;
      const auto k = static_cast<size_t>(((index % static_cast<long long>(n)) + static_cast<long long>(n)) % static_cast<long long>(n));
      sent[p] = std::max(start[p], start[(p + 1) % n]) + edges[p].latency_s +
                c.bytes * (cuts[k + 1] - cuts[k]) / edges[p].bandwidth_bytes_per_s;
    }
    for (size_t p = 0; p < n; ++p) start[p] = std::max(sent[p], sent[(p + n - 1) % n]);
  }
  return *std::max_element(start.begin(), start.end());
}

double CostModel::collective_time_s(const CollectiveSpec& c, const EdgeBandwidths* shared) const {
  check_collective(c);
  const int n = static_cast<int>(c.devices.size());
  if (free_communication_ || n < 2 || c.bytes <= 0) return 0;
  if (c.messages > 1) {  // one after another, each of its own size
    const double m = c.messages;
    if (c.algorithm == CollectiveAlgorithm::ring && c.kind == CollectiveKind::all_reduce) {  // the common case, uncopied
      return m * ring_time_s(c.devices, c.bytes / m / n, 2 * (n - 1), shared);
    }
    CollectiveSpec one = c;
    one.messages = 1;
    one.bytes = c.bytes / c.messages;
    return c.messages * collective_time_s(one, shared);
  }
  switch (c.algorithm) {
    case CollectiveAlgorithm::ring:
      switch (c.kind) {
        case CollectiveKind::all_reduce:
          return ring_time_s(c.devices, c.bytes / n, 2 * (n - 1), shared);  // reduce-scatter, then all-gather
        case CollectiveKind::reduce_scatter:
        case CollectiveKind::all_gather:
          if (!c.parts.empty()) return uneven_ring_time_s(c, shared);
          return ring_time_s(c.devices, c.bytes / n, n - 1, shared);
        case CollectiveKind::broadcast:
        case CollectiveKind::reduce:
          return chain_time_s(c, shared);
        case CollectiveKind::sendrecv:  // one step of a ring: the whole buffer over each edge at once
          return ring_time_s(c.devices, c.bytes, 1, shared);
        case CollectiveKind::all_to_all:
          break;  // refused by check_collective
      }
      break;
    case CollectiveAlgorithm::tree: {
      if (c.kind != CollectiveKind::all_reduce) return tree_time_s(c, shared);
      double latency_s = 0, bandwidth = kInfinity;
      for (int child = 1; child < n; ++child) {
        const Route r = edge(c.devices[static_cast<size_t>((child - 1) / 2)], c.devices[static_cast<size_t>(child)], shared);
        latency_s = std::max(latency_s, r.latency_s);
        bandwidth = std::min(bandwidth, r.bandwidth_bytes_per_s);
      }
      const double depth = std::ceil(std::log2(static_cast<double>(n)));
      return 2 * depth * latency_s + 2 * c.bytes / bandwidth;
    }
    case CollectiveAlgorithm::hierarchical:
      if (c.kind == CollectiveKind::all_to_all) return all_to_all_time_s(c, shared);
      return hierarchical_time_s(c, shared);
    case CollectiveAlgorithm::pairwise:
      return all_to_all_time_s(c, shared);
  }
  return 0;
}

double CostModel::all_to_all_time_s(const CollectiveSpec& c, const EdgeBandwidths* shared) const {
  // Every pair's flow at once, sharing links: the busiest link's bytes over its bandwidth (a
  // sender's link carries all it sends), no faster than any pair's own route allows, after
  // the slowest route's latency. Hierarchical: its two phases so, one after the other.
  const auto phase_s = [&](const std::vector<std::tuple<int, int, double>>& flows) {
    std::map<int, double> link_bytes;
    std::vector<int> links;
    double latency_s = 0, pair_s = 0;
    for (const auto& [src, dst, bytes] : flows) {
      const Route r = edge(src, dst, shared);
      latency_s = std::max(latency_s, r.latency_s);
      pair_s = std::max(pair_s, bytes / r.bandwidth_bytes_per_s);
      links.clear();
      route_links(src, dst, links);
      for (int l : links) link_bytes[l] += bytes;
    }
    double busiest_s = 0;
    for (const auto& [link, bytes] : link_bytes) busiest_s = std::max(busiest_s, bytes / link_bandwidth_bytes_per_s(link));
    return flows.empty() ? 0.0 : latency_s + std::max(busiest_s, pair_s);
  };
  const size_t n = c.devices.size();
  const std::vector<std::vector<int>> nodes =
      c.algorithm == CollectiveAlgorithm::hierarchical ? node_major_groups(c.devices, [this](int d) { return node_of(d); })
                                                       : std::vector<std::vector<int>>{};
  if (nodes.size() < 2 || nodes.front().size() < 2) {
    std::vector<std::tuple<int, int, double>> flows;
    for (size_t i = 0; i < n; ++i) {
      for (size_t q = 0; q < n; ++q) {
        if (q != i) flows.emplace_back(c.devices[i], c.devices[q], c.bytes * all_to_all_part(c, q));
      }
    }
    return phase_s(flows);
  }
  // collective_steps.hpp's two phases: m parts to each other member of the node, then k
  // parts to each peer.
  const size_t m = nodes.size(), k = nodes.front().size();
  std::vector<std::tuple<int, int, double>> inside, across;
  for (size_t i = 0; i < n; ++i) {
    const size_t a = i / k, l = i % k;
    for (size_t other = 0; other < k; ++other) {
      if (other == l) continue;
      double bytes = 0;
      for (size_t b = 0; b < m; ++b) bytes += c.bytes * all_to_all_part(c, b * k + other);
      inside.emplace_back(c.devices[i], c.devices[a * k + other], bytes);
    }
    for (size_t b = 0; b < m; ++b) {
      if (b != a) across.emplace_back(c.devices[i], c.devices[b * k + l], static_cast<double>(k) * c.bytes * all_to_all_part(c, b * k + l));
    }
  }
  return phase_s(inside) + phase_s(across);
}

double CostModel::hierarchical_time_s(const CollectiveSpec& c, const EdgeBandwidths* shared) const {
  const int n = static_cast<int>(c.devices.size());
  // All-reduce goes round each ring twice (reduce-scatter, all-gather), the others once.
  const int rounds = c.kind == CollectiveKind::all_reduce ? 2 : 1;
  // Group by node, keeping the participants' order.
  std::vector<int> nodes;
  std::map<int, std::vector<int>> local;
  for (int d : c.devices) {
    if (local.count(node_of(d)) == 0) nodes.push_back(node_of(d));
    local[node_of(d)].push_back(d);
  }
  size_t k = 0;
  for (const auto& [node, group] : local) k = std::max(k, group.size());
  if (nodes.size() == 1 || k == 1) return ring_time_s(c.devices, c.bytes / n, rounds * (n - 1), shared);
  double intra_s = 0;
  for (const auto& [node, group] : local) {
    const int kn = static_cast<int>(group.size());
    intra_s = std::max(intra_s, ring_time_s(group, c.bytes / kn, kn - 1, shared));
  }
  double inter_s = 0;
  const int nn = static_cast<int>(nodes.size());
  for (size_t j = 0; j < k; ++j) {
    std::vector<int> ring;
    for (int node : nodes) {
      const auto& group = local[node];
      ring.push_back(group[std::min(j, group.size() - 1)]);
    }
    inter_s = std::max(inter_s, ring_time_s(ring, c.bytes / static_cast<double>(k) / nn, rounds * (nn - 1), shared));
  }
  return rounds * intra_s + inter_s;
}

double CostModel::chain_time_s(const CollectiveSpec& c, const EdgeBandwidths* shared) const {
  const size_t n = c.devices.size();
  // Broadcast flows from the root along the ring order, reduce from the root's successor to the root.
  const size_t first = static_cast<size_t>(c.root) + (c.kind == CollectiveKind::reduce ? 1 : 0);
  double hop_s = 0;
  for (size_t i = 0; i + 1 < n; ++i) {
    const Route r = edge(c.devices[(first + i) % n], c.devices[(first + i + 1) % n], shared);
    hop_s = std::max(hop_s, r.latency_s + c.bytes / kPipelineChunks / r.bandwidth_bytes_per_s);
  }
  return static_cast<double>(n - 2 + kPipelineChunks) * hop_s;  // the last chunk leaves K-1 steps late
}

double CostModel::tree_time_s(const CollectiveSpec& c, const EdgeBandwidths* shared) const {
  const size_t n = c.devices.size();
  auto member = [&](size_t q) { return c.devices[(static_cast<size_t>(c.root) + q) % n]; };  // heap position q
  const int depth = std::bit_width(n) - 1;          // floor(log2 n)
  const size_t deepest = (size_t{1} << depth) - 1;  // first position on the deepest level
  double hop_s = 0, last_hop_s = 0;
  for (size_t q = 1; q < n; ++q) {
    const size_t parent = (q - 1) / 2;
    const double fan = 2 * parent + 2 < n ? 2 : 1;  // the parent's children share its link
    const bool down = c.kind == CollectiveKind::broadcast;
    const Route r = down ? edge(member(parent), member(q), shared) : edge(member(q), member(parent), shared);
    const double s = r.latency_s + fan * c.bytes / kPipelineChunks / r.bandwidth_bytes_per_s;
    hop_s = std::max(hop_s, s);
    if (q >= deepest) last_hop_s = std::max(last_hop_s, s);
  }
  // D+K-1 steps: the last chunk leaves the root K-1 steps late and needs D hops; one of them
  // (a broadcast's last, a reduce's first) only moves chunks to or from the deepest level.
  return (depth + kPipelineChunks - 2) * hop_s + last_hop_s;
}

}  // namespace hetflow::partition
