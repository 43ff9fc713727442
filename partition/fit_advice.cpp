// Candidates that pass the screen are built for real (layout, plan, memory from lifetimes):
// the advice is the same check that refused the original, so a suggestion printed does fit.
#include "partition/fit_advice.hpp"

#include <algorithm>
#include <set>
#include <tuple>
#include <utility>

#include "model/error.hpp"
#include "partition/estimate.hpp"
#include "partition/memory.hpp"
#include "partition/plan_builder.hpp"

namespace hetflow::partition {

bool fits_in_memory(const Plan& plan) {
  const bool devices = std::all_of(plan.memory.begin(), plan.memory.end(), [](const DeviceMemory& m) {
    return m.capacity_bytes <= 0 || m.total_bytes() <= m.capacity_bytes;
  });
  if (!devices || !plan.layout.offload.any()) return devices;
  // Offload: each node's host holds its devices' state too (as validation checks it).
  std::vector<double> host(plan.cluster.nodes.size(), 0);
  const std::vector<model::Device> all = plan.cluster.devices();
  for (size_t d = 0; d < plan.memory.size() && d < all.size(); ++d) {
    host[static_cast<size_t>(all[d].node)] += plan.memory[d].host_bytes;
  }
  for (size_t n = 0; n < host.size(); ++n) {
    if (host[n] > plan.cluster.host(static_cast<int>(n)).memory_bytes) return false;
  }
  return true;
}

namespace {

// Screening is approximate (stage cuts move); this much over capacity is still built.
constexpr double kScreenSlack = 1.15;

double peak_fraction(const Plan& plan) {
  double peak = 0;
  for (const DeviceMemory& m : plan.memory) {
    if (m.capacity_bytes > 0) peak = std::max(peak, m.total_bytes() / m.capacity_bytes);
  }
  return peak;
}

// Tensor-parallel degrees worth trying: powers of two up to the GPUs of the smallest node
// (Megatron keeps a TP group inside a node) and 8, dividing the attention heads.
std::vector<int> tensor_degrees(const model::Cluster& cluster, const model::Network& network, int from) {
  int per_node = 1 << 20;
  for (const model::Node& n : cluster.nodes) per_node = std::min(per_node, n.gpu_count);
  const int heads = network.architecture ? network.architecture->heads : 0;
  std::vector<int> out{from};
  for (int t = from * 2; t <= std::min(per_node, 8); t *= 2) {
    if (heads > 0 && heads % t != 0) continue;
    out.push_back(t);
  }
  return out;
}

// Bytes all layers stash per micro-batch under a recomputation mode, tensor and context degree.
double stash_bytes(const model::Network& network, Layout layout, Recompute recompute, int tensor, int context) {
  layout.recompute = recompute;
  layout.set_size(Axis::tensor, tensor);
  layout.set_size(Axis::context, context);
  double total = 0;
  for (const model::Layer& l : network.layers) total += stashed_bytes_per_microbatch(l, network, layout);
  return total;
}

struct Candidate {
  int changed;  // members changed: fewer first
  int split;    // p x t: less splitting first
  int pipeline, tensor, context;
  Recompute recompute;
  int zero;     // ZeRO stage: less sharding first
  bool reshard; // stage 3: parameters freed after each pass
  bool offload; // optimizer state in host memory: after sharding
  bool activations;  // stashes in host memory: last
  bool memory_shares = false;  // ZeRO's shares by device memory (the layout otherwise the failed one's)
};

// At most `max_answers` of `out` (built in order of their changes, `changes_of`), fastest
// first: those of fewer changes than `last_changes` (the last tier's, or -1), then the last
// tier's fastest.
void keep_fastest(std::vector<FitAdvice>& out, const std::vector<int>& changes_of, int last_changes, int max_answers) {
  const auto faster = [](const FitAdvice& a, const FitAdvice& b) { return a.iteration_time_s < b.iteration_time_s; };
  if (static_cast<int>(out.size()) > max_answers) {
    const auto first_of_last = std::find(changes_of.begin(), changes_of.end(), last_changes) - changes_of.begin();
    std::stable_sort(out.begin() + first_of_last, out.end(), faster);
    out.resize(static_cast<size_t>(max_answers));
  }
  std::stable_sort(out.begin(), out.end(), faster);
}

}  // namespace

std::vector<FitAdvice> what_would_fit(const Plan& failed, const PlanOptions& options, const CostModel& cost,
                                      int max_answers, long long max_tasks_built) {
  if (!options.layout_file.empty() || failed.memory.empty()) return {};
  const model::Cluster& cluster = failed.cluster;
  const model::Network& network = failed.network;
  const bool stage_options = (options.policy == "uniform" || options.policy == "balanced") && options.stage_layers.empty();
  const int devices = static_cast<int>(cluster.devices().size());
  const int p0 = std::max(1, options.pipeline), t0 = options.tensor;
  std::vector<int> pipelines{p0};
  std::vector<int> tensors{t0};
  if (stage_options) {
    for (int p = p0 * 2; p * t0 <= devices && p <= static_cast<int>(network.layers.size()); p *= 2) pipelines.push_back(p);
    tensors = tensor_degrees(cluster, network, t0);
  }
  // Context parallelism, where the policy lays it and the sequence splits in 2c chunks.
  const int c0 = std::max(1, options.context);
  std::vector<int> contexts{c0};
  const int seq = network.architecture ? network.architecture->seq : 0;
  for (int c = c0 * 2; stage_options && seq > 0 && c * t0 * p0 <= devices && seq % (2 * c) == 0; c *= 2) contexts.push_back(c);
  const double stash0 = stash_bytes(network, failed.layout, options.recompute, t0, c0);
  // ZeRO's stages where the data axis can shard: all-reduce over two or more replicas.
  const int z0 = options.zero_stage;
  const bool shardable = failed.layout.sync.kind == SyncKind::allreduce && failed.layout.workers.size() > 1;
  const Sharded by0 = sharded_by(failed.layout);
  const bool offloadable = failed.layout.sync.kind == SyncKind::allreduce;  // a device's own state to its host
  // Stashes leave only where a backward does not follow its forward at once: with one
  // micro-batch in flight per device (1F1B without a pipeline) there is nothing to offload.
  int in_flight0 = 0;
  for (const DeviceMemory& m : failed.memory) in_flight0 = std::max(in_flight0, m.peak_in_flight);

  std::vector<Candidate> candidates;
  for (const int p : pipelines) {
    for (const int t : tensors) {
      for (const int cp : contexts) {
        if (p * t * cp > devices) continue;
        for (const Recompute r : {Recompute::none, Recompute::selective, Recompute::full}) {
          // The stage and, at stage 3, whether parameters are freed after each pass (two layers
          // whole) or kept gathered (every chunk whole): the current one or more sharding.
          const bool r0 = options.reshard_after_forward, o0 = options.offload_optimizer, a0 = options.offload_activations;
          for (const auto& [z, reshard] : {std::pair{0, true}, {1, true}, {2, true}, {3, false}, {3, true}}) {
            for (const auto& [offload, acts] : {std::pair{false, false}, {true, false}, {false, true}, {true, true}}) {
              if (z < z0 || (z != z0 && !shardable) || (z == z0 && r0 && !reshard)) continue;
              // (The state to the host: under all-reduce. Stashes: under any.)
              if (r < options.recompute || (o0 && !offload) || (offload && !o0 && !offloadable) || (a0 && !acts)) continue;
              if (acts && !a0 && p == p0 && in_flight0 <= 1) continue;
              const int changed = (p != p0) + (t != t0) + (cp != c0) + (r != options.recompute) + (z != z0) +
                                  (reshard != r0) + (offload != o0) + (acts != a0);
              if (changed == 0) continue;
              // The failed plan's terms, scaled: state by the split and the sharding,
              // activations and buffers by what is stashed and the tensor and context degrees.
              // (More context on as many devices leaves the replicas ZeRO shards over, D x C, as
              // they were.)
              Layout sharded = failed.layout;
              sharded.sync.zero = {z, reshard};
              const Sharded by = sharded_by(sharded);
              const double state_scale = static_cast<double>(p0 * t0) / (p * t);
              const double stash_scale = stash0 > 0 ? stash_bytes(network, failed.layout, r, t, cp) / stash0 : 1;
              bool near = true;
              for (const DeviceMemory& m : failed.memory) {
                // Offloaded stashes: three on the device (memory.hpp's closed form) of those in flight.
                const double held = acts && !a0 && m.peak_in_flight > 3 ? 3.0 / m.peak_in_flight : 1.0;
                const double predicted = (m.weights_bytes * by0.weights / by.weights +
                                          m.gradients_bytes * by0.gradients / by.gradients +
                                          (offload ? 0 : m.optimizer_bytes * by0.optimizer / by.optimizer)) * state_scale +
                                         m.activations_bytes * stash_scale * held + m.buffers_bytes * t0 * c0 / (t * cp) +
                                         m.workspace_bytes;
                // Whole copies kept gathered come back only where the failed plan had them.
                const double gathered = reshard && !r0 ? 0 : m.gathered_bytes * state_scale;
                if (m.capacity_bytes > 0 && predicted + gathered > kScreenSlack * m.capacity_bytes) near = false;
              }
              if (near) candidates.push_back({changed, p * t * cp, p, t, cp, r, z, reshard, offload, acts});
            }
          }
        }
      }
    }
  }
  // Sharded over replicas of different memory sizes: shares by memory move state from the
  // small devices to the large ones (one change, after the others of as many changes: its
  // uneven rings are slower; built, not screened).
  if (z0 > 0 && shardable && options.zero_shares == ZeroShares::equal) {
    std::set<double> sizes;
    for (const DeviceMemory& m : failed.memory) {
      if (m.capacity_bytes > 0 && m.weights_bytes > 0) sizes.insert(m.capacity_bytes);
    }
    if (sizes.size() > 1) {
      candidates.push_back({1, p0 * t0 * c0, p0, t0, c0, options.recompute, z0, options.reshard_after_forward,
                            options.offload_optimizer, options.offload_activations, true});
    }
  }
  std::stable_sort(candidates.begin(), candidates.end(), [](const Candidate& a, const Candidate& b) {
    return std::tie(a.changed, a.memory_shares, a.split, a.recompute, a.zero, b.reshard, a.offload, a.activations) <
           std::tie(b.changed, b.memory_shares, b.split, b.recompute, b.zero, a.reshard, b.offload, b.activations);
  });

  // The fewest changes first, in the candidates' order (the least intrusive first). Where the
  // fewest changes leave places, the rest of the next tier is built too (within the bound) and
  // its fastest take them, not its first (a deeper pipeline with ZeRO 1 before ZeRO 1 with
  // offload, where it is faster).
  std::vector<FitAdvice> out;
  std::vector<int> changes_of;  // per answer: its candidate's changes
  long long built = 0;
  int last_changes = -1;  // once max_answers fit: the changes of the tier being finished
  for (const Candidate& c : candidates) {
    if (built >= max_tasks_built || (last_changes >= 0 && c.changed > last_changes)) break;
    FitAdvice a;
    a.options = options;
    a.options.pipeline = c.pipeline;
    a.options.tensor = c.tensor;
    a.options.context = c.context;
    a.options.recompute = c.recompute;
    a.options.zero_stage = c.zero;
    a.options.reshard_after_forward = c.reshard;
    a.options.offload_optimizer = c.offload;
    a.options.offload_activations = c.activations;
    if (c.memory_shares) {
      a.options.zero_shares = ZeroShares::memory;
      a.changes.emplace_back("zero_shares", "memory");
    }
    if (c.pipeline != p0) a.changes.emplace_back("pipeline", std::to_string(c.pipeline));
    if (c.tensor != t0) a.changes.emplace_back("tensor", std::to_string(c.tensor));
    if (c.context != c0) a.changes.emplace_back("context", std::to_string(c.context));
    if (c.recompute != options.recompute) a.changes.emplace_back("recompute", std::string(to_string(c.recompute)));
    if (c.zero != z0) a.changes.emplace_back("zero_stage", std::to_string(c.zero));
    if (c.reshard != options.reshard_after_forward) {
      a.changes.emplace_back("reshard_after_forward", c.reshard ? "true" : "false");
    }
    if (c.offload != options.offload_optimizer) a.changes.emplace_back("offload_optimizer", c.offload ? "true" : "false");
    if (c.activations != options.offload_activations) {
      a.changes.emplace_back("offload_activations", c.activations ? "true" : "false");
    }
    try {
      const Plan plan = build_plan(cluster, network, make_layout(cluster, network, a.options, cost), cost);
      built += static_cast<long long>(plan.tasks.size());
      if (!fits_in_memory(plan)) continue;
      a.iteration_time_s = estimate_plan(plan, cost).iteration_time_s;
      a.peak_fraction = peak_fraction(plan);
    } catch (const Error&) {
      continue;  // options this cluster or network cannot take: not advice
    }
    out.push_back(std::move(a));
    changes_of.push_back(c.changed);
    if (last_changes < 0 && static_cast<int>(out.size()) >= max_answers) {
      if (changes_of.front() == c.changed) break;  // one tier fills them
      last_changes = c.changed;
    }
  }
  keep_fastest(out, changes_of, last_changes, max_answers);
  return out;
}

}  // namespace hetflow::partition
