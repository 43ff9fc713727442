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

LoadShares load_shares(const Plan& plan) {
  LoadShares s;
  if (!plan.layout.folded || plan.layout.workers.size() < 2) return s;
  const std::vector<model::Device> devices = plan.cluster.devices();
  std::vector<double> all(plan.cluster.nodes.size(), 0), built(plan.cluster.nodes.size(), 0);
  double all_total = 0, built_total = 0;
  for (size_t w = 0; w < plan.layout.workers.size(); ++w) {
    const VirtualWorker& vw = plan.layout.workers[w];
    if (vw.stages.empty() || vw.ranks[static_cast<size_t>(vw.stages.front().rank)].empty()) continue;
    const int first = vw.ranks[static_cast<size_t>(vw.stages.front().rank)].front();
    const auto node = static_cast<size_t>(devices[static_cast<size_t>(first)].node);
    all[node] += 1, all_total += 1;
    if (w == 0) built[node] += 1, built_total += 1;
  }
  s.per_node.assign(all.size(), 1);
  for (size_t n = 0; n < all.size(); ++n) {
    if (built[n] > 0) s.per_node[n] = all[n] / built[n];
  }
  if (built_total > 0) s.all = all_total / built_total;
  return s;
}

LoaderBound loader_bound(const Plan& plan) {
  LoaderBound b;
  const model::InputPath& in = plan.cluster.input;
  const bool loads = std::any_of(plan.tasks.begin(), plan.tasks.end(), [](const Task& t) { return t.kind == TaskKind::load; });
  if (!loads) return b;
  // Per node, one iteration: every worker's samples where its first device is (from the
  // layout, so that a folded plan's replicas count too).
  std::map<int, double> node_bytes;
  const std::vector<model::Device> devices = plan.cluster.devices();
  const double sample_bytes = plan.network.stored_sample_bytes();
  for (const VirtualWorker& vw : plan.layout.workers) {
    if (vw.stages.empty() || vw.ranks[static_cast<size_t>(vw.stages.front().rank)].empty()) continue;
    const int first = vw.ranks[static_cast<size_t>(vw.stages.front().rank)].front();
    node_bytes[devices[static_cast<size_t>(first)].node] +=
        static_cast<double>(vw.microbatches) * plan.layout.micro_batch_size * sample_bytes;
  }
  b.bounded = true;
  double total_bytes = 0, most_bytes = 0;
  for (const auto& [node, bytes] : node_bytes) total_bytes += bytes, most_bytes = std::max(most_bytes, bytes);
  b.samples = total_bytes / sample_bytes;
  auto consider = [&b](double s, const char* limit) {
    if (s > b.iteration_s) b.iteration_s = s, b.limit = limit;
  };
  if (in.shared_read_bytes_per_s > 0) consider(total_bytes / in.shared_read_bytes_per_s, "shared file system");
  if (in.node_read_bytes_per_s > 0) consider(most_bytes / in.node_read_bytes_per_s, "node read");
  consider(most_bytes / sample_bytes * in.preprocess_s_per_sample / in.workers_per_node, "preprocessing");
  b.samples_per_s = b.iteration_s > 0 ? b.samples / b.iteration_s : 0;
  return b;
}

}  // namespace hetflow::partition
