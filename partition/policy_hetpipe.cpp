// HetPipe's virtual-worker formation (Park et al., ATC'20): NP, ED, HD, and ED with local
// parameter placement. Inside each virtual worker the stages are balanced to its GPUs;
// virtual workers synchronise through sharded parameter servers (WSP by default).
#include <algorithm>
#include <map>

#include "model/error.hpp"
#include "partition/policy.hpp"

namespace hetflow::partition {

namespace {

struct TypeGroup {
  std::string type;
  std::vector<int> devices;  // in device order
  double speed = 0;          // per-GPU peak at the run's precision
};

std::vector<TypeGroup> devices_by_type(const model::Cluster& cluster, const CostModel& cost) {
  std::vector<TypeGroup> groups;
  for (const model::Device& d : cluster.devices()) {
    const std::string& type = cluster.nodes[static_cast<size_t>(d.node)].gpu;
    auto it = std::find_if(groups.begin(), groups.end(), [&](const TypeGroup& g) { return g.type == type; });
    if (it == groups.end()) {
      groups.push_back(TypeGroup{type, {}, cost.peak_flops_per_s(d.id)});
      it = groups.end() - 1;
    }
    it->devices.push_back(d.id);
  }
  return groups;
}

// NP: each node is a virtual worker.
std::vector<std::vector<int>> form_np(const model::Cluster& cluster) {
  std::vector<std::vector<int>> workers(cluster.nodes.size());
  for (const model::Device& d : cluster.devices()) workers[static_cast<size_t>(d.node)].push_back(d.id);
  return workers;
}

// ED: as many virtual workers as the rarest GPU type has GPUs; each gets an equal share of
// every type (leftovers stay idle).
std::vector<std::vector<int>> form_ed(const std::vector<TypeGroup>& types) {
  size_t workers = types.front().devices.size();
  for (const TypeGroup& t : types) workers = std::min(workers, t.devices.size());
  std::vector<std::vector<int>> out(workers);
  for (const TypeGroup& t : types) {
    const size_t share = t.devices.size() / workers;
    for (size_t w = 0; w < workers; ++w) {
      for (size_t i = 0; i < share; ++i) out[w].push_back(t.devices[w * share + i]);
    }
  }
  return out;
}

// HD: types sorted by speed; the fastest is paired with the slowest, the second with the
// second slowest, ...; each pair is split into virtual workers holding half of each
// (a middle type without a partner forms virtual workers of its own, two GPUs each).
std::vector<std::vector<int>> form_hd(std::vector<TypeGroup> types) {
  std::stable_sort(types.begin(), types.end(), [](const TypeGroup& a, const TypeGroup& b) { return a.speed > b.speed; });
  std::vector<std::vector<int>> out;
  size_t lo = 0, hi = types.size();
  while (lo < hi) {
    const TypeGroup& fast = types[lo];
    if (hi - lo == 1) {
      for (size_t i = 0; i + 1 < fast.devices.size(); i += 2) out.push_back({fast.devices[i], fast.devices[i + 1]});
      break;
    }
    const TypeGroup& slow = types[hi - 1];
    const size_t workers = std::max<size_t>(1, std::min(fast.devices.size(), slow.devices.size()) / 2);
    const size_t fast_share = fast.devices.size() / workers, slow_share = slow.devices.size() / workers;
    for (size_t w = 0; w < workers; ++w) {
      std::vector<int> vw;
      for (size_t i = 0; i < fast_share; ++i) vw.push_back(fast.devices[w * fast_share + i]);
      for (size_t i = 0; i < slow_share; ++i) vw.push_back(slow.devices[w * slow_share + i]);
      out.push_back(vw);
    }
    ++lo;
    --hi;
  }
  return out;
}

}  // namespace

Layout make_hetpipe_layout(const model::Cluster& cluster, const model::Network& network, const PlanOptions& o,
                           const CostModel& cost) {
  Layout layout = policy_detail::base_layout(o, o.policy, SyncKind::wsp);
  if (o.tensor != 1) throw InputError(kOptions, 0, "tensor", "HetPipe policies use pipeline stages of one GPU");
  if (o.pipeline != 0 || o.data != 0) {
    throw InputError(kOptions, 0, o.pipeline != 0 ? "pipeline" : "data",
                     "HetPipe policies form virtual workers themselves; leave `pipeline` and `data` out");
  }
  if (!o.stage_layers.empty()) {
    throw InputError(kOptions, 0, "stage_layers",
                     "HetPipe policies balance each virtual worker's stages themselves; use `policy` uniform or "
                     "balanced, or a layout file (`layout_file`), for fixed cuts");
  }
  const std::vector<TypeGroup> types = devices_by_type(cluster, cost);
  std::vector<std::vector<int>> workers;
  if (o.policy == "hetpipe-np") {
    workers = form_np(cluster);
  } else if (o.policy == "hetpipe-hd") {
    workers = form_hd(types);
  } else {
    workers = form_ed(types);
  }
  std::erase_if(workers, [](const std::vector<int>& w) { return w.empty(); });
  size_t depth = 0;
  for (const auto& w : workers) depth = std::max(depth, w.size());
  // The workers share the global batch's micro-batches by speed (split_microbatches), so it
  // need only be a whole number of micro-batches, at least one per worker, not a multiple of
  // micro-batch x workers; m, the even share, is what each worker's stages are balanced for.
  const int n = static_cast<int>(workers.size());
  int m = 0, total = 0;
  if (o.global_batch > 0 && o.microbatches == 0 && o.micro_batch > 0 && n > 0) {
    if (o.global_batch % o.micro_batch != 0 || o.global_batch / o.micro_batch < n) {
      throw InputError(kOptions, 0, "global_batch",
                       "expected a multiple of `micro_batch` " + std::to_string(o.micro_batch) + " of at least " +
                           std::to_string(o.micro_batch * n) + " (a micro-batch for each of the " + std::to_string(n) +
                           " virtual workers), found " + std::to_string(o.global_batch));
    }
    total = o.global_batch / o.micro_batch;
    m = std::max(1, total / n);
  } else {
    m = policy_detail::microbatches_per_worker(o, n, static_cast<int>(depth));
    total = m * n;
  }

  std::vector<double> bottlenecks;
  std::vector<std::vector<std::vector<int>>> replicas;  // (ZeRO's shares by memory: every worker's devices)
  for (const std::vector<int>& devices : workers) replicas.push_back({devices});
  policy_detail::BalanceMemo memo(policy_detail::replicas_memory_bytes(layout, replicas, cost));
  for (const std::vector<int>& devices : workers) {
    std::vector<std::vector<int>> ranks;
    for (int d : devices) ranks.push_back({d});
    policy_detail::Balanced b = memo.balance(network, layout, ranks, m, cost);
    bottlenecks.push_back(b.bottleneck_s);
    layout.workers.push_back(VirtualWorker{std::move(ranks), std::move(b.stages), m});
  }
  const std::vector<int> split = policy_detail::split_microbatches(total, bottlenecks);
  for (size_t w = 0; w < layout.workers.size(); ++w) layout.workers[w].microbatches = split[w];

  policy_detail::place_layer_servers(layout, cluster, network,
                                     o.policy == "hetpipe-ed-local" ? policy_detail::ServerPlacement::local
                                                                    : policy_detail::ServerPlacement::every_node);
  return layout;
}

}  // namespace hetflow::partition
