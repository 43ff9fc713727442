// Megatron-LM's layout: a grid of tensor x pipeline x data devices dealt in the layout's
// placement order (Layout::axes; Megatron's tensor innermost, then data, then pipeline, so a
// tensor-parallel group sits inside a node); equal layers per stage, or the --stage-layers
// cuts. `balanced` keeps the groups but balances the stages (or orders GPU types for the
// given cuts).
#include <array>

#include "model/error.hpp"
#include "partition/policy.hpp"

namespace hetflow::partition {

namespace {
struct Grid {
  int tensor, pipeline, data;
};

Grid choose_grid(const model::Cluster& cluster, const PlanOptions& o) {
  const int devices = cluster.device_count();
  Grid g{o.tensor, o.pipeline > 0 ? o.pipeline : 1, o.data};
  if (g.data == 0) {
    // Data parallelism left automatic: only the sizes given can be too large, and the error
    // blames them, not the data-parallel size the user never gave.
    if (g.tensor * static_cast<long long>(g.pipeline) > devices) {
      throw InputError(kOptions, 0, o.pipeline > 1 ? "pipeline" : "tensor",
                       "tensor x pipeline = " + std::to_string(g.tensor) + " x " + std::to_string(g.pipeline) +
                           " devices for one data-parallel replica, more than the cluster's " + std::to_string(devices));
    }
    g.data = devices / (g.tensor * g.pipeline);
  }
  if (g.data < 1 || g.tensor * g.pipeline * g.data > devices) {
    throw InputError(kOptions, 0, "data",
                     "tensor x pipeline x data = " + std::to_string(g.tensor) + " x " + std::to_string(g.pipeline) + " x " +
                         std::to_string(std::max(g.data, 0)) + " needs more than the cluster's " + std::to_string(devices) +
                         " devices");
  }
  return g;
}
}  // namespace

// Virtual worker `dp`, pipeline rank `pp`, tensor rank `tp` -> the device whose index, read
// as a number with one digit per axis in placement order (innermost the lowest), is those
// coordinates: in Megatron's order tensor, data, pipeline, device pp*(D*T) + dp*T + tp.
static std::vector<std::vector<std::vector<int>>> megatron_ranks(const Grid& g, const std::vector<LayoutAxis>& order) {
  std::array<int, kAxisCount> size{}, stride{};
  size[static_cast<size_t>(Axis::data)] = g.data;
  size[static_cast<size_t>(Axis::pipeline)] = g.pipeline;
  size[static_cast<size_t>(Axis::tensor)] = g.tensor;
  int next = 1;
  for (const LayoutAxis& a : order) {
    stride[static_cast<size_t>(a.axis)] = next;
    next *= size[static_cast<size_t>(a.axis)];
  }
  const auto device = [&](int dp, int pp, int tp) {
    return dp * stride[static_cast<size_t>(Axis::data)] + pp * stride[static_cast<size_t>(Axis::pipeline)] +
           tp * stride[static_cast<size_t>(Axis::tensor)];
  };
  std::vector<std::vector<std::vector<int>>> workers(static_cast<size_t>(g.data));
  for (int dp = 0; dp < g.data; ++dp) {
    for (int pp = 0; pp < g.pipeline; ++pp) {
      std::vector<int> group;
      for (int tp = 0; tp < g.tensor; ++tp) group.push_back(device(dp, pp, tp));
      workers[static_cast<size_t>(dp)].push_back(group);
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
  layout.set_size(Axis::data, g.data);  // the balancer's memory bound divides ZeRO's shards by it
  const int m = policy_detail::microbatches_per_worker(o, g.data, g.pipeline);
  const std::vector<Stage> fixed =
      o.stage_layers.empty()
          ? std::vector<Stage>{}
          : policy_detail::stages_from_counts(network, o.stage_layers, g.pipeline * o.virtual_stages, g.pipeline);
  std::vector<double> bottlenecks;
  policy_detail::BalanceMemo memo;
  for (auto& ranks : megatron_ranks(g, layout.axes)) {
    policy_detail::Balanced b = memo.balance(network, layout, ranks, m, cost, fixed);
    bottlenecks.push_back(b.bottleneck_s);
    layout.workers.push_back(VirtualWorker{std::move(ranks), std::move(b.stages), m});
  }
  // Faster virtual workers take more of the global batch.
  const std::vector<int> split = policy_detail::split_microbatches(m * g.data, bottlenecks);
  for (size_t w = 0; w < layout.workers.size(); ++w) layout.workers[w].microbatches = split[w];
  policy_detail::place_layer_servers(layout, cluster, network, policy_detail::ServerPlacement::used_nodes);
  return layout;
}

}  // namespace hetflow::partition
