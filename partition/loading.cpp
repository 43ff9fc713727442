// Load tasks: which node loads what, the prefetch edges, and the loader's closed form.
#include "partition/loading.hpp"

#include <algorithm>
#include <map>
#include <set>

namespace hetflow::partition {

void add_loading(Plan& plan) {
  if (!plan.cluster.input.given) return;
  // Each worker's first device: tensor rank 0 of its first chunk.
  std::set<std::pair<int, int>> feeds;  // (worker, device)
  for (size_t w = 0; w < plan.layout.workers.size(); ++w) {
    const VirtualWorker& vw = plan.layout.workers[w];
    if (vw.stages.empty()) continue;
    const auto& rank = vw.ranks[static_cast<size_t>(vw.stages.front().rank)];
    if (!rank.empty()) feeds.insert({static_cast<int>(w), rank.front()});
  }
  // (worker, micro-batch) -> its first forward on the device that loads
  std::map<std::pair<int, int>, int> forward_of;
  for (size_t id = 0; id < plan.tasks.size(); ++id) {
    const Task& t = plan.tasks[id];
    if (t.kind != TaskKind::forward || t.stage != 0 || t.microbatch < 0 || !feeds.count({t.worker, t.device})) continue;
    forward_of.emplace(std::pair(t.worker, t.microbatch), static_cast<int>(id));
  }
  if (forward_of.empty()) return;
  const int stream = static_cast<int>(plan.streams.size());
  plan.streams.push_back("load");
  const double bytes = plan.layout.micro_batch_size * plan.network.stored_sample_bytes();
  const int ahead = plan.cluster.input.prefetch_batches;
  for (const auto& [key, forward] : forward_of) {
    const auto [w, mb] = key;
    const Task& f = plan.task(forward);
    Task load;
    load.kind = TaskKind::load;
    load.device = f.device;
    load.stream = stream;
    load.worker = w;
    load.stage = 0;
    load.microbatch = mb;
    load.bytes = bytes;
    const int id = plan.add_task(load);
    plan.add_order(id, forward);
    // Prefetch: load m waits for the forward k micro-batches earlier to take its batch.
    const int count = plan.layout.workers[static_cast<size_t>(w)].microbatches;
    const int earlier = mb - ahead;
    const int offset = earlier >= 0 ? 0 : (-earlier + count - 1) / count;
    const auto it = forward_of.find({w, earlier + offset * count});
    if (it != forward_of.end()) plan.add_order(it->second, id, offset);
  }
}

double load_samples(const Plan& plan, const Task& load) {
  return load.bytes / plan.network.stored_sample_bytes();
}

InputWaitSpan input_wait_span(double load_start_s, double load_end_s, double before_end_s, double forward_start_s) {
  return {std::max(load_start_s, before_end_s), std::min(load_end_s, forward_start_s)};
}

LoadShares load_shares(const Plan& plan) {
  LoadShares s;
  if (!plan.layout.folded || plan.layout.workers.size() <= plan.layout.task_workers()) return s;
  const std::vector<model::Device> devices = plan.cluster.devices();
  std::vector<double> all(plan.cluster.nodes.size(), 0), built(plan.cluster.nodes.size(), 0);
  double all_total = 0, built_total = 0;
  for (size_t w = 0; w < plan.layout.workers.size(); ++w) {
    const VirtualWorker& vw = plan.layout.workers[w];
    if (vw.stages.empty() || vw.ranks[static_cast<size_t>(vw.stages.front().rank)].empty()) continue;
    const int first = vw.ranks[static_cast<size_t>(vw.stages.front().rank)].front();
    const auto node = static_cast<size_t>(devices[static_cast<size_t>(first)].node);
    all[node] += 1, all_total += 1;
    if (w < plan.layout.task_workers()) built[node] += 1, built_total += 1;
  }
  s.per_node.assign(all.size(), 1);
  for (size_t n = 0; n < all.size(); ++n) {
    if (built[n] > 0) s.per_node[n] = all[n] / built[n];
  }
  if (built_total > 0) s.all = all_total / built_total;
  return s;
}

LoaderDemand loader_demand(const model::Cluster& cluster, const model::Network& network, const Layout& layout) {
  LoaderDemand d;
  d.sample_bytes = network.stored_sample_bytes();
  d.node_bytes.assign(cluster.nodes.size(), 0);
  d.worker_bytes.assign(layout.workers.size(), 0);
  for (const model::Device& device : cluster.devices()) d.node_of_device.push_back(device.node);
  for (size_t w = 0; w < layout.workers.size(); ++w) {
    const VirtualWorker& vw = layout.workers[w];
    if (vw.stages.empty() || vw.ranks[static_cast<size_t>(vw.stages.front().rank)].empty()) continue;
    const int first = vw.ranks[static_cast<size_t>(vw.stages.front().rank)].front();
    const double bytes = static_cast<double>(vw.microbatches) * layout.micro_batch_size * d.sample_bytes;
    d.worker_bytes[w] = bytes;
    d.node_bytes[static_cast<size_t>(d.node_of_device[static_cast<size_t>(first)])] += bytes;
  }
  for (double bytes : d.node_bytes) d.total_bytes += bytes;
  return d;
}

double load_time_s(const Plan& plan, const LoaderDemand& demand, const Task& load) {
  const model::InputPath& in = plan.cluster.input;
  const auto w = static_cast<size_t>(load.worker);
  if (w >= demand.worker_bytes.size() || !(demand.worker_bytes[w] > 0) || !(load.bytes > 0)) return 0;
  const double node_bytes = demand.node_bytes[static_cast<size_t>(demand.node_of_device[static_cast<size_t>(load.device)])];
  // This load's part of its worker's iteration, times each resource's time for all it serves.
  const double part = load.bytes / demand.worker_bytes[w];
  double s = part * node_bytes / demand.sample_bytes * in.preprocess_s_per_sample / in.workers_per_node;
  if (in.shared_read_bytes_per_s > 0) s = std::max(s, part * demand.total_bytes / in.shared_read_bytes_per_s);
  if (in.node_read_bytes_per_s > 0) s = std::max(s, part * node_bytes / in.node_read_bytes_per_s);
  return s;
}

double load_time_s(const Plan& plan, const Task& load) {
  return load_time_s(plan, loader_demand(plan.cluster, plan.network, plan.layout), load);
}

LoaderBound loader_bound(const Plan& plan) {
  const bool loads = std::any_of(plan.tasks.begin(), plan.tasks.end(), [](const Task& t) { return t.kind == TaskKind::load; });
  if (!loads) return {};
  return loader_bound(plan.cluster, plan.network, plan.layout);
}

LoaderBound loader_bound(const model::Cluster& cluster, const model::Network& network, const Layout& layout) {
  LoaderBound b;
  const model::InputPath& in = cluster.input;
  if (!in.given) return b;
  // Per node, one iteration: every worker's samples where its first device is.
  const LoaderDemand d = loader_demand(cluster, network, layout);
  if (!(d.total_bytes > 0)) return b;
  b.bounded = true;
  const double most_bytes = *std::max_element(d.node_bytes.begin(), d.node_bytes.end());
  b.samples = d.total_bytes / d.sample_bytes;
  auto consider = [&b](double s, const char* limit) {
    if (s > b.iteration_s) b.iteration_s = s, b.limit = limit;
  };
  if (in.shared_read_bytes_per_s > 0) consider(d.total_bytes / in.shared_read_bytes_per_s, "shared file system");
  if (in.node_read_bytes_per_s > 0) consider(most_bytes / in.node_read_bytes_per_s, "node read");
  consider(most_bytes / d.sample_bytes * in.preprocess_s_per_sample / in.workers_per_node, "preprocessing");
  b.samples_per_s = b.iteration_s > 0 ? b.samples / b.iteration_s : 0;
  return b;
}

}  // namespace hetflow::partition
