// Megatron-LM's layout: a grid of tensor x context x pipeline x data devices dealt in the
// layout's placement order (Layout::axes; Megatron's tensor innermost, then context, data,
// pipeline, so a tensor-parallel group sits inside a node); equal layers per stage, or the --stage-layers
// cuts. `balanced` keeps the groups but balances the stages (or orders GPU types for the
// given cuts).
#include <algorithm>
#include <array>

#include "model/error.hpp"
#include "partition/policy.hpp"

namespace hetflow::partition {

namespace {
struct Grid {
  int tensor, pipeline, data, context;
};

Grid choose_grid(const model::Cluster& cluster, const PlanOptions& o) {
  const int devices = cluster.device_count();
  Grid g{o.tensor, o.pipeline > 0 ? o.pipeline : 1, o.data, o.context};
  // One data-parallel replica: tensor x context x pipeline devices.
  const long long replica = static_cast<long long>(g.tensor) * g.context * g.pipeline;
  const auto sizes_text = [&](bool with_data) {
    return "tensor x " + std::string(g.context > 1 ? "context x " : "") + "pipeline" + (with_data ? " x data" : "") +
           " = " + std::to_string(g.tensor) + " x " + (g.context > 1 ? std::to_string(g.context) + " x " : std::string()) +
           std::to_string(g.pipeline) + (with_data ? " x " + std::to_string(std::max(g.data, 0)) : std::string());
  };
  if (g.data == 0) {
    // Data parallelism left automatic: only the sizes given can be too large, and the error
    // blames them, not the data-parallel size the user never gave.
    if (replica > devices) {
      throw InputError(kOptions, 0, g.context > 1 ? "context" : o.pipeline > 1 ? "pipeline" : "tensor",
                       sizes_text(false) + " devices for one data-parallel replica, more than the cluster's " +
                           std::to_string(devices));
    }
    g.data = static_cast<int>(devices / replica);
  }
  if (g.data < 1 || replica * g.data > devices) {
    throw InputError(kOptions, 0, "data",
                     sizes_text(true) + " needs more than the cluster's " + std::to_string(devices) + " devices");
  }
  return g;
}
}  // namespace

// Replica `dp`, context rank `cp`, pipeline rank `pp`, tensor rank `tp` -> the device whose
// index, read as a number with one digit per axis in placement order (innermost the lowest),
// is those coordinates: in Megatron's order tensor, context, data, pipeline, device
// pp*(D*C*T) + dp*(C*T) + cp*T + tp. Virtual worker dp*C + cp (Layout::axes).
static std::vector<std::vector<std::vector<int>>> megatron_ranks(const Grid& g, const std::vector<LayoutAxis>& order) {
  std::array<int, kAxisCount> size{}, stride{};
  size[static_cast<size_t>(Axis::data)] = g.data;
  size[static_cast<size_t>(Axis::pipeline)] = g.pipeline;
  size[static_cast<size_t>(Axis::tensor)] = g.tensor;
  size[static_cast<size_t>(Axis::context)] = g.context;
  int next = 1;
  for (const LayoutAxis& a : order) {
    stride[static_cast<size_t>(a.axis)] = next;
    next *= size[static_cast<size_t>(a.axis)];
  }
  const auto at = [&](Axis a, int i) { return i * stride[static_cast<size_t>(a)]; };
  std::vector<std::vector<std::vector<int>>> workers(static_cast<size_t>(g.data) * static_cast<size_t>(g.context));
  for (int dp = 0; dp < g.data; ++dp) {
    for (int cp = 0; cp < g.context; ++cp) {
      for (int pp = 0; pp < g.pipeline; ++pp) {
        std::vector<int> group;
        for (int tp = 0; tp < g.tensor; ++tp) {
          group.push_back(at(Axis::data, dp) + at(Axis::context, cp) + at(Axis::pipeline, pp) + at(Axis::tensor, tp));
        }
        workers[static_cast<size_t>(dp * g.context + cp)].push_back(group);
      }
    }
  }
  return workers;
}

Layout make_uniform_layout(const model::Cluster& cluster, const model::Network& network, const PlanOptions& o,
                           const CostModel&) {
  Layout layout = policy_detail::base_layout(o, "uniform", SyncKind::allreduce);
  const Grid g = choose_grid(cluster, o);
  const int m = policy_detail::microbatches_per_worker(o, g.data, g.pipeline);
  const int chunks = g.pipeline * o.virtual_stages;
  const std::vector<Stage> stages = o.stage_layers.empty()
                                        ? policy_detail::uniform_stages(network, chunks, g.pipeline)
                                        : policy_detail::stages_from_counts(network, o.stage_layers, chunks, g.pipeline);
  for (auto& ranks : megatron_ranks(g, layout.axes)) layout.workers.push_back(VirtualWorker{std::move(ranks), stages, m});
  policy_detail::place_layer_servers(layout, cluster, network, policy_detail::ServerPlacement::used_nodes);
  return layout;
}

Layout make_balanced_layout(const model::Cluster& cluster, const model::Network& network, const PlanOptions& o,
                            const CostModel& cost) {
  Layout layout = policy_detail::base_layout(o, "balanced", SyncKind::allreduce);
  const Grid g = choose_grid(cluster, o);
  layout.set_size(Axis::data, g.data);  // the balancer's memory bound divides ZeRO's shards by it (and context)
  const int m = policy_detail::microbatches_per_worker(o, g.data, g.pipeline);
  const std::vector<Stage> fixed =
      o.stage_layers.empty()
          ? std::vector<Stage>{}
          : policy_detail::stages_from_counts(network, o.stage_layers, g.pipeline * o.virtual_stages, g.pipeline);
  std::vector<double> bottlenecks;
  std::vector<std::vector<std::vector<int>>> workers = megatron_ranks(g, layout.axes);
  policy_detail::BalanceMemo memo(policy_detail::replicas_memory_bytes(layout, workers, cost));
  for (auto& ranks : workers) {
    policy_detail::Balanced b = memo.balance(network, layout, ranks, m, cost, fixed);
    // A context group's workers cut the model alike, as its first worker does (a group of
    // one GPU type, as Megatron's placement gives, balances alike anyway).
    if (layout.workers.size() % static_cast<size_t>(g.context) != 0) b.stages = layout.workers.back().stages;
    bottlenecks.push_back(b.bottleneck_s);
    layout.workers.push_back(VirtualWorker{std::move(ranks), std::move(b.stages), m});
  }
  // Faster virtual workers take more of the global batch; a context group's workers take
  // one share, as they run every pass together (at its slowest member's pace).
  std::vector<double> group_bottlenecks;
  for (size_t w = 0; w < bottlenecks.size(); w += static_cast<size_t>(g.context)) {
    double slowest = 0;
    for (size_t c = w; c < w + static_cast<size_t>(g.context); ++c) slowest = std::max(slowest, bottlenecks[c]);
    group_bottlenecks.push_back(slowest);
  }
  const std::vector<int> split = policy_detail::split_microbatches(m * g.data, group_bottlenecks);
  for (size_t w = 0; w < layout.workers.size(); ++w) layout.workers[w].microbatches = split[w / static_cast<size_t>(g.context)];
  policy_detail::place_layer_servers(layout, cluster, network, policy_detail::ServerPlacement::used_nodes);
  return layout;
}

}  // namespace hetflow::partition
