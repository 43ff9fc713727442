// The policy registry and what the policies share: stage balancing under memory limits,
// the choice of GPU-type order along a pipeline, and the split of micro-batches.
#include "partition/policy.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>

#include "model/error.hpp"
#include "partition/expert_placement.hpp"
#include "partition/expert_shard.hpp"
#include "partition/memory.hpp"
#include "partition/partitioner.hpp"
#include "partition/schedule.hpp"

namespace hetflow::partition {

const std::vector<PolicyInfo>& policies() {
  static const std::vector<PolicyInfo> list = {
      {"uniform", "Megatron-LM: tensor x pipeline x data groups in device order, equal layers per stage"},
      {"balanced", "uniform groups, but stages sized to each GPU's speed and memory, GPU-type order chosen"},
      {"hetpipe-np", "HetPipe NP: one virtual worker per node, stages balanced inside it"},
      {"hetpipe-ed", "HetPipe ED: every virtual worker gets an equal share of each GPU type"},
      {"hetpipe-hd", "HetPipe HD: fast GPU types paired with whimpy ones in each virtual worker"},
      {"hetpipe-ed-local", "HetPipe ED with each stage's parameters served from the node that runs it"},
      {"grouped", "virtual workers of any size by GPU type (`groups`), stages balanced, the batch split by makespan"},
  };
  return list;
}

std::string precision_unsupported(const model::Cluster& cluster, model::Precision precision) {
  std::vector<std::pair<std::string, int>> lacking;  // GPU type, devices, in node order
  for (const model::Node& n : cluster.nodes) {
    const model::GpuSpec& g = cluster.gpu(n.gpu);
    const double peak = precision == model::Precision::bf16 ? g.bf16_flops_per_s
                        : precision == model::Precision::fp16 ? g.fp16_flops_per_s
                                                              : g.fp32_flops_per_s;
    if (peak > 0) continue;
    auto it = std::find_if(lacking.begin(), lacking.end(), [&](const auto& l) { return l.first == g.name; });
    if (it == lacking.end()) it = lacking.insert(lacking.end(), {g.name, 0});
    it->second += n.gpu_count;
  }
  if (lacking.empty()) return "";
  std::string types;
  for (size_t i = 0; i < lacking.size(); ++i) {
    types += std::string(i == 0 ? "" : i + 1 == lacking.size() ? " and " : ", ") + lacking[i].first + " (" +
             std::to_string(lacking[i].second) + (lacking[i].second == 1 ? " device)" : " devices)");
  }
  const std::string p(model::to_string(precision));
  return p + " needs " + p + " arithmetic, which " + types + " of cluster " + cluster.name + (lacking.size() == 1 ? " has" : " have") +
         " not (bf16 came with Ampere); give `precision` fp16 (mixed precision with loss scaling) or fp32";
}

void require_precision_supported(const model::Cluster& cluster, model::Precision precision) {
  if (std::string why = precision_unsupported(cluster, precision); !why.empty()) throw InputError(kOptions, 0, "precision", why);
}

namespace {
Layout make_policy_layout(const model::Cluster& cluster, const model::Network& network, const PlanOptions& options,
                          const CostModel& cost) {
  if (!options.layout_file.empty() || options.policy == "layout-file") {
    return make_layout_file_layout(cluster, network, options, cost);
  }
  if (!options.groups.empty() && options.policy != "grouped") {
    throw InputError(kOptions, 0, "groups", "only `policy` grouped takes `groups`, not " + options.policy);
  }
  if (!options.axis_order.empty() && options.policy != "uniform" && options.policy != "balanced") {
    throw InputError(kOptions, 0, "axis_order",
                     "policy " + options.policy + " places its devices its own way; only uniform and balanced take `axis_order`");
  }
  if (options.policy == "uniform") return make_uniform_layout(cluster, network, options, cost);
  if (options.policy == "balanced") return make_balanced_layout(cluster, network, options, cost);
  if (options.policy == "grouped") return make_grouped_layout(cluster, network, options, cost);
  if (options.policy.rfind("hetpipe-", 0) == 0) {
    for (const PolicyInfo& p : policies()) {
      if (p.name == options.policy) return make_hetpipe_layout(cluster, network, options, cost);
    }
  }
  std::string names;
  for (const PolicyInfo& p : policies()) names += (names.empty() ? "" : ", ") + p.name;
  throw InputError(kOptions, 0, "policy",
                   "expected one of " + names + " (or layout-file, with `layout_file`), found '" + options.policy + "'");
}
}  // namespace

Layout make_layout(const model::Cluster& cluster, const model::Network& network, const PlanOptions& options,
                   const CostModel& cost) {
  require_precision_supported(cluster, options.precision);
  Layout layout = make_policy_layout(cluster, network, options, cost);
  // The policies make the workers, which size the data and pipeline axes; the tensor axis
  // keeps the degree the policy gave it, which the builder holds to its ranks.
  layout.fit_outer_axes();
  if (options.experts_by_speed) {
    if (!options.experts.placement.empty()) {
      throw InputError(kOptions, 0, "expert_placement", "expected a placement or placement by speed, not both");
    }
    check_experts(network, layout);  // (the placement needs ranks that hold the experts)
    layout.experts.placement = place_experts_by_speed(network, layout, cost);
  }
  return layout;
}

namespace policy_detail {

Layout base_layout(const PlanOptions& o, const std::string& policy, SyncKind default_sync) {
  auto positive = [](int value, const char* option) {
    if (value < 1) {
      throw InputError(kOptions, 0, option, "expected a positive number, found " + std::to_string(value));
    }
  };
  positive(o.tensor, "tensor");
  positive(o.virtual_stages, "virtual_stages");
  positive(o.micro_batch, "micro_batch");
  positive(o.iterations, "iterations");
  if (o.staleness < 0) throw InputError(kOptions, 0, "staleness", "expected 0 or more");
  if (o.bucket_bytes <= 0) throw InputError(kOptions, 0, "bucket_bytes", "expected a positive size");
  const Schedule& schedule = schedule_by_name(o.schedule);
  if (o.virtual_stages > 1 && !schedule.interleaved) {
    throw InputError(kOptions, 0, "virtual_stages",
                     "schedule " + schedule.name + " runs one chunk per rank; use `schedule` interleaved or bfs");
  }
  Layout l;
  l.policy = policy;
  l.schedule = o.schedule;
  l.precision = o.precision;
  if (!o.axis_order.empty()) {
    try {
      l.axes = parse_axis_order(o.axis_order);
    } catch (const std::invalid_argument& e) {
      throw InputError(kOptions, 0, "axis_order", e.what());
    }
  }
  l.set_size(Axis::tensor, o.tensor);
  positive(o.context, "context");
  if (o.context > 1) {
    if (policy != "uniform" && policy != "balanced" && policy != "layout-file") {
      throw InputError(kOptions, 0, "context",
                       "policy " + policy + " lays no context groups; the uniform and balanced policies and layout "
                       "files (consecutive workers) do");
    }
    l.set_size(Axis::context, o.context);
  }
  if (o.context_comm != ContextComm::all_gather && o.context <= 1) {
    throw InputError(kOptions, 0, "context_comm", "passes keys and values around a context group: give `context` 2 or more");
  }
  l.context_comm = o.context_comm;
  l.experts = o.experts;
  l.virtual_stages = o.virtual_stages;
  l.micro_batch_size = o.micro_batch;
  l.recompute = o.recompute;
  l.sequence_parallel = o.sequence_parallel;
  l.fp32_grad_accumulation = o.fp32_grad_accumulation;
  l.kernels = o.kernels;
  l.folded = o.fold;
  l.workspace_bytes = o.workspace_bytes;
  l.iterations = o.iterations;
  l.sync.kind = o.sync.value_or(default_sync);
  l.sync.algorithm = o.allreduce;
  l.sync.bucket_bytes = o.bucket_bytes;
  l.sync.overlap_grad_reduce = o.overlap_grad_reduce;
  l.sync.staleness = o.staleness;
  l.sync.zero = {o.zero_stage, o.reshard_after_forward, o.zero_shares};
  if (o.zero_stage < 0 || o.zero_stage > 3) {
    throw InputError(kOptions, 0, "zero_stage", "expected 0, 1, 2 or 3, found " + std::to_string(o.zero_stage));
  }
  if (o.zero_stage > 0 && l.sync.kind != SyncKind::allreduce) {
    throw InputError(kOptions, 0, "zero_stage", "shards data-parallel state under `sync` allreduce only");
  }
  if (!o.reshard_after_forward && o.zero_stage != 3) {
    throw InputError(kOptions, 0, "reshard_after_forward", "applies to `zero_stage` 3 only");
  }
  if (o.zero_shares != ZeroShares::equal && o.zero_stage == 0) {
    throw InputError(kOptions, 0, "zero_shares", "divides ZeRO's shards: give `zero_stage` 1, 2 or 3");
  }
  l.offload.optimizer = o.offload_optimizer;
  if (o.offload_optimizer && l.sync.kind != SyncKind::allreduce) {
    throw InputError(kOptions, 0, "offload_optimizer",
                     "moves each device's own optimizer state to its host: `sync` allreduce only (parameter servers "
                     "already hold it off the GPUs)");
  }
  l.offload.activations = o.offload_activations;
  if (o.overlap_grad_reduce && l.sync.kind != SyncKind::allreduce) {
    throw InputError(kOptions, 0, "overlap_grad_reduce", "only applies to `sync` allreduce");
  }
  if (l.sync.kind != SyncKind::wsp && o.staleness > 0) {
    throw InputError(kOptions, 0, "staleness", "only applies to `sync` wsp");
  }
  if (o.sequence_parallel && o.tensor == 1) {
    throw InputError(kOptions, 0, "sequence_parallel", "needs `tensor` 2 or more");
  }
  return l;
}

std::vector<Stage> uniform_stages(const model::Network& network, int chunks, int ranks) {
  const int layers = static_cast<int>(network.layers.size());
  int first_core = 0, end_core = layers;
  const auto is_core = [&](int i) { return network.layers[static_cast<size_t>(i)].kind == "transformer"; };
  bool any_core = false;
  for (int i = 0; i < layers; ++i) any_core = any_core || is_core(i);
  if (any_core) {
    while (!is_core(first_core)) ++first_core;
    while (!is_core(end_core - 1)) --end_core;
  }
  const int core = end_core - first_core;
  if (core < chunks) {
    throw InputError(kOptions, 0, "pipeline",
                     "cannot split " + std::to_string(core) + (any_core ? " transformer" : "") + " layers into " +
                         std::to_string(chunks) + " non-empty chunks");
  }
  std::vector<Stage> stages;
  int begin = 0;
  for (int c = 0; c < chunks; ++c) {
    const int core_end = first_core + (c + 1) * core / chunks;
    const int end = c + 1 == chunks ? layers : core_end;
    stages.push_back(Stage{begin, end, c % ranks});
    begin = end;
  }
  return stages;
}

std::vector<Stage> stages_from_counts(const model::Network& network, const std::vector<int>& counts, int chunks,
                                      int ranks) {
  const auto fail = [](const std::string& message) { throw InputError(kOptions, 0, "stage_layers", message); };
  if (static_cast<int>(counts.size()) != chunks) {
    fail("expected " + std::to_string(chunks) + " layer counts (pipeline x virtual stages), found " +
         std::to_string(counts.size()));
  }
  std::vector<Stage> stages;
  int begin = 0;
  for (size_t k = 0; k < counts.size(); ++k) {
    if (counts[k] < 1) fail("expected positive layer counts, found " + std::to_string(counts[k]));
    stages.push_back(Stage{begin, begin + counts[k], static_cast<int>(k) % ranks});
    begin += counts[k];
  }
  if (begin != static_cast<int>(network.layers.size())) {
    fail("the counts add up to " + std::to_string(begin) + " layers, but " + network.name + " has " +
         std::to_string(network.layers.size()));
  }
  return stages;
}

int microbatches_per_worker(const PlanOptions& o, int workers, int pipeline) {
  if (o.global_batch > 0 && o.microbatches > 0) {
    throw InputError(kOptions, 0, "microbatches", "give either `global_batch` or `microbatches`, not both");
  }
  if (o.global_batch > 0) {
    const int per_microbatch_round = o.micro_batch * workers;
    if (o.global_batch % per_microbatch_round != 0) {
      throw InputError(kOptions, 0, "global_batch",
                       "expected a multiple of micro-batch x data-parallel size = " + std::to_string(per_microbatch_round) +
                           ", found " + std::to_string(o.global_batch));
    }
    return o.global_batch / per_microbatch_round;
  }
  if (o.microbatches < 0) throw InputError(kOptions, 0, "microbatches", "expected a positive number");
  return o.microbatches > 0 ? o.microbatches : 2 * pipeline;
}

namespace {
// Prefix sums over the layers so each stage cost is O(1).
struct Prefix {
  std::vector<double> forward, backward, recompute, params_split, tied_split, stash;
  double range(const std::vector<double>& v, int a, int b) const { return v[static_cast<size_t>(b)] - v[static_cast<size_t>(a)]; }
};

// At tensor-parallel degree `tensor`.
Prefix prefix_sums(const model::Network& net, const Layout& layout, int tensor) {
  Prefix p;
  const size_t n = net.layers.size();
  for (auto* v : {&p.forward, &p.backward, &p.recompute, &p.params_split, &p.tied_split, &p.stash}) v->assign(n + 1, 0);
  for (size_t i = 0; i < n; ++i) {
    const model::Layer& l = net.layers[i];
    const double t = l.tp_splittable ? tensor : 1;
    const double mbs = layout.micro_batch_size;
    p.forward[i + 1] = p.forward[i] + l.forward_flops * mbs / t;
    p.backward[i + 1] = p.backward[i] + l.backward_flops * mbs / t;
    const double re = layout.recompute == Recompute::full ? l.forward_flops
                      : layout.recompute == Recompute::selective ? l.attention_core_flops : 0;
    p.recompute[i + 1] = p.recompute[i] + re * mbs / t;
    p.params_split[i + 1] = p.params_split[i] + l.params / t;
    p.tied_split[i + 1] = p.tied_split[i] + l.tied_params / t;
    p.stash[i + 1] = p.stash[i] + stashed_bytes_per_microbatch(l, net, layout, tensor);
  }
  return p;
}
}  // namespace

namespace {
// What every order balance_with_order tries shares for one pipeline (the same ranks in
// another order): prefix sums by degree, the schedule's in-flight counts, and each layer
// range's compute time by device class (a GPU type at a degree), asked for once.
class SharedCosts {
 public:
  SharedCosts(const model::Network& net, const Layout& layout, const CostModel& cost, int p, int microbatches)
      : net_(net), layout_(layout), cost_(cost), layers_(static_cast<int>(net.layers.size())),
        in_flight(peak_in_flight(schedule_by_name(layout.schedule).build(p, microbatches, layout.virtual_stages),
                                 layout.virtual_stages)) {
    // Each boundary's activation bytes per micro-batch (Network::cut_bytes walks the layers).
    for (int b = 0; b <= layers_; ++b) boundary_bytes.push_back(net.cut_bytes(static_cast<size_t>(b)) * layout.micro_batch_size);
  }
  const Prefix& prefix(int tensor) {
    auto it = by_degree_.find(tensor);
    if (it == by_degree_.end()) it = by_degree_.emplace(tensor, prefix_sums(net_, layout_, tensor)).first;
    return it->second;
  }
  // The class of a rank whose first device is `device`, of `tensor` devices.
  int class_of(int device, int tensor) {
    for (size_t c = 0; c < classes_.size(); ++c) {
      if (classes_[c].second == tensor && cost_.same_compute(classes_[c].first, device)) return static_cast<int>(c);
    }
    classes_.emplace_back(device, tensor);
    const auto cells = static_cast<size_t>(layers_ + 1) * static_cast<size_t>(layers_ + 1);
    compute_.emplace_back(cells, std::numeric_limits<double>::quiet_NaN());
    return static_cast<int>(classes_.size()) - 1;
  }
  // Forward and backward (recomputation included) of layers [a, b) on a rank of class `c`.
  double compute_s(int c, int a, int b) {
    double& t = compute_[static_cast<size_t>(c)][static_cast<size_t>(a) * static_cast<size_t>(layers_ + 1) + static_cast<size_t>(b)];
    if (std::isnan(t)) {
      const auto& [device, tensor] = classes_[static_cast<size_t>(c)];
      const Prefix& pre = prefix(tensor);
      const double flops_f = pre.range(pre.forward, a, b);
      const double flops_b = pre.range(pre.backward, a, b) + pre.range(pre.recompute, a, b);
      t = cost_.compute_time_s(device, TaskKind::forward, flops_f) + cost_.compute_time_s(device, TaskKind::backward, flops_b);
    }
    return t;
  }

 private:
  const model::Network& net_;
  const Layout& layout_;
  const CostModel& cost_;
  int layers_;
  std::map<int, Prefix> by_degree_;
  std::vector<std::pair<int, int>> classes_;   // (a device of it, degree)
  std::vector<std::vector<double>> compute_;   // per class: (a, b) -> seconds, NaN: not yet

 public:
  const std::vector<std::vector<int>> in_flight;  // per rank position and chunk
  std::vector<double> boundary_bytes;             // per layer boundary
  double replicas_memory_bytes = 0;               // balance_stages's (0: ZeRO's shares equal)
};

// One pipeline's chunk costs, as the balancer sees them: per micro-batch time (forward,
// backward, recomputation, the outgoing transfer) and whether a chunk fits its rank's memory,
// each at its rank's tensor-parallel degree (its device count).
class ChunkCost {
 public:
  ChunkCost(const Layout& layout, const std::vector<std::vector<int>>& ranks, const CostModel& cost, SharedCosts& shared)
      : layout_(layout), ranks_(ranks), cost_(cost), shared_(shared),
        p_(static_cast<int>(ranks.size())), chunks_(p_ * layout.virtual_stages) {
    for (const auto& rank : ranks) {
      const int t = static_cast<int>(rank.size());
      pre_.push_back(&shared.prefix(t));
      class_.push_back(shared.class_of(rank.front(), t));
    }
    send_s_.assign(static_cast<size_t>(p_) * shared.boundary_bytes.size(), std::numeric_limits<double>::quiet_NaN());
    const double e = model::element_bytes(layout.precision);
    const bool hosts_optimizer = layout.sync.kind == SyncKind::allreduce;
    for (const auto& rank : ranks) {
      // ZeRO over the data axis's size as the policy set it, or by memory: the device's part.
      const double memory = cost.memory_capacity_bytes(rank.front());
      const Sharded by = shared.replicas_memory_bytes > 0 ? sharded_by(layout, memory / shared.replicas_memory_bytes)
                                                          : sharded_by(layout);
      double bytes = e / by.weights + layout.gradient_element_bytes() / by.gradients +
                     (hosts_optimizer ? model::adam_state_bytes(layout.precision) / by.optimizer : 0);
      // ZeRO-3 gathers a chunk whole for its passes: count it as held.
      if (layout.sync.zero.stage >= 3 && layout.replicas() > 1) bytes += e + layout.gradient_element_bytes();
      state_per_param_.push_back(bytes);
    }
  }

  int chunks() const { return chunks_; }

  double time_s(int k, int a, int b) const {
    const int r = k % p_;
    double t = shared_.compute_s(class_[static_cast<size_t>(r)], a, b);
    if (k + 1 < chunks_) {
      // 1/t of the boundary to each rank of the next group (t: its degree), asked for once.
      double& send = send_s_[static_cast<size_t>(r) * shared_.boundary_bytes.size() + static_cast<size_t>(b)];
      if (std::isnan(send)) {
        const auto& next = ranks_[static_cast<size_t>((k + 1) % p_)];
        send = cost_.transfer_time_s(ranks_[static_cast<size_t>(r)].front(), next.front(),
                                     shared_.boundary_bytes[static_cast<size_t>(b)] / static_cast<double>(next.size()));
      }
      t += send;
    }
    return t;
  }

  bool fits(int k, int a, int b) const {
    const int r = k % p_;
    const int device = ranks_[static_cast<size_t>(r)].front();
    const Prefix& pre = *pre_[static_cast<size_t>(r)];
    const double params = pre.range(pre.params_split, a, b) + (a == 0 ? 0 : pre.range(pre.tied_split, a, b));
    const double held = shared_.in_flight[static_cast<size_t>(r)][static_cast<size_t>(k / p_)];
    const double bytes = params * state_per_param_[static_cast<size_t>(r)] + held * pre.range(pre.stash, a, b);
    // With v chunks per rank, each chunk gets 1/v of what the workspace leaves.
    return bytes <= (cost_.memory_capacity_bytes(device) - layout_.workspace_bytes) / layout_.virtual_stages;
  }

 private:
  const Layout& layout_;
  const std::vector<std::vector<int>>& ranks_;
  const CostModel& cost_;
  SharedCosts& shared_;
  std::vector<const Prefix*> pre_;  // per rank: its degree's prefix sums
  std::vector<int> class_;          // per rank: its device class in shared_
  int p_, chunks_;
  mutable std::vector<double> send_s_;  // per rank and boundary: its send to the next rank (NaN: not yet)
  std::vector<double> state_per_param_;  // per rank: persistent bytes per parameter
};

Balanced balance_with(const model::Network& net, const Layout& layout, const std::vector<std::vector<int>>& ranks,
                      const CostModel& cost, SharedCosts& shared) {
  const ChunkCost chunk(layout, ranks, cost, shared);
  const int chunks = chunk.chunks();
  const int p = static_cast<int>(ranks.size());
  PartitionProblem problem{static_cast<int>(net.layers.size()), chunks,
                           [&](int k, int a, int b) { return chunk.time_s(k, a, b); },
                           [&](int k, int a, int b) { return chunk.fits(k, a, b); }};
  Balanced out;
  std::optional<Partition> best = partition_min_bottleneck(problem);
  if (!best) {
    out.fits = false;
    problem.fits = [](int, int, int) { return true; };
    best = partition_min_bottleneck(problem);
  }
  if (!best) {
    throw InputError(kOptions, 0, "pipeline",
                     "cannot split " + std::to_string(net.layers.size()) + " layers into " + std::to_string(chunks) + " chunks");
  }
  for (int k = 0; k < chunks; ++k) {
    out.stages.push_back(Stage{best->boundaries[static_cast<size_t>(k)], best->boundaries[static_cast<size_t>(k) + 1], k % p});
  }
  out.bottleneck_s = best->bottleneck_s;
  return out;
}

Balanced measure_with(const Layout& layout, const std::vector<std::vector<int>>& ranks, std::vector<Stage> stages,
                      const CostModel& cost, SharedCosts& shared) {
  const ChunkCost chunk(layout, ranks, cost, shared);
  Balanced out;
  for (size_t k = 0; k < stages.size(); ++k) {
    const Stage& s = stages[k];
    out.bottleneck_s = std::max(out.bottleneck_s, chunk.time_s(static_cast<int>(k), s.layer_begin, s.layer_end));
    out.fits = out.fits && chunk.fits(static_cast<int>(k), s.layer_begin, s.layer_end);
  }
  out.stages = std::move(stages);
  return out;
}
}  // namespace

Balanced balance_stages(const model::Network& net, const Layout& layout, const std::vector<std::vector<int>>& ranks,
                        int microbatches, const CostModel& cost, double replicas_memory_bytes) {
  SharedCosts shared(net, layout, cost, static_cast<int>(ranks.size()), microbatches);
  shared.replicas_memory_bytes = replicas_memory_bytes;
  return balance_with(net, layout, ranks, cost, shared);
}

double replicas_memory_bytes(const Layout& layout, const std::vector<std::vector<std::vector<int>>>& workers,
                             const CostModel& cost) {
  if (layout.sync.kind != SyncKind::allreduce || layout.sync.zero.stage < 1 ||
      layout.sync.zero.shares != ZeroShares::memory || workers.size() < 2) {
    return 0;
  }
  double total = 0;
  for (const auto& ranks : workers) {
    double sum = 0;
    int devices = 0;
    for (const auto& rank : ranks) {
      for (const int d : rank) {
        sum += cost.memory_capacity_bytes(d);
        ++devices;
      }
    }
    if (devices > 0) total += sum / devices;
  }
  return total;
}

Balanced measure_stages(const model::Network& net, const Layout& layout, const std::vector<std::vector<int>>& ranks,
                        std::vector<Stage> stages, int microbatches, const CostModel& cost) {
  SharedCosts shared(net, layout, cost, static_cast<int>(ranks.size()), microbatches);
  return measure_with(layout, ranks, std::move(stages), cost, shared);
}

Balanced balance_with_order(const model::Network& net, const Layout& layout, std::vector<std::vector<int>>& ranks,
                            int microbatches, const CostModel& cost, const std::vector<Stage>& fixed,
                            double replicas_memory_bytes) {
  // Group ranks by the GPU type of their devices, keeping first-seen order.
  std::vector<std::string> types;
  std::map<std::string, std::vector<std::vector<int>>> by_type;
  for (const auto& rank : ranks) {
    const int node = cost.node_of(rank.front());
    const std::string& type = cost.cluster().nodes[static_cast<size_t>(node)].gpu;
    if (by_type.count(type) == 0) types.push_back(type);
    by_type[type].push_back(rank);
  }
  std::vector<int> order(types.size());
  std::iota(order.begin(), order.end(), 0);
  std::optional<Balanced> best;
  std::vector<std::vector<int>> best_ranks;
  SharedCosts shared(net, layout, cost, static_cast<int>(ranks.size()), microbatches);
  shared.replicas_memory_bytes = replicas_memory_bytes;
  // At most 6 types: 720 orders. More types keep the given order.
  do {
    std::vector<std::vector<int>> candidate;
    for (int i : order) {
      for (const auto& rank : by_type[types[static_cast<size_t>(i)]]) candidate.push_back(rank);
    }
    Balanced b = fixed.empty() ? balance_with(net, layout, candidate, cost, shared)
                               : measure_with(layout, candidate, fixed, cost, shared);
    const bool better = !best || (b.fits && !best->fits) ||
                        (b.fits == best->fits && b.bottleneck_s < best->bottleneck_s);
    if (better) {
      best = std::move(b);
      best_ranks = std::move(candidate);
    }
  } while (types.size() <= 6 && std::next_permutation(order.begin(), order.end()));
  ranks = std::move(best_ranks);
  return std::move(*best);
}

namespace {
bool same_to_the_balancer(const std::vector<std::vector<int>>& a, const std::vector<std::vector<int>>& b,
                          const CostModel& cost) {
  if (a.size() != b.size()) return false;
  const auto type = [&](int device) -> const std::string& {
    return cost.cluster().nodes[static_cast<size_t>(cost.node_of(device))].gpu;
  };
  for (size_t i = 0; i < a.size(); ++i) {
    const int x = a[i].front(), y = b[i].front();
    if (a[i].size() != b[i].size() || type(x) != type(y) || !cost.same_compute(x, y) ||
        cost.memory_capacity_bytes(x) != cost.memory_capacity_bytes(y)) {
      return false;
    }
  }
  for (size_t i = 0; i < a.size(); ++i) {
    for (size_t j = 0; j < a.size(); ++j) {
      if (i == j) continue;
      const Route ra = cost.route(a[i].front(), a[j].front()), rb = cost.route(b[i].front(), b[j].front());
      if (ra.bandwidth_bytes_per_s != rb.bandwidth_bytes_per_s || ra.latency_s != rb.latency_s) return false;
    }
  }
  return true;
}
}  // namespace

Balanced BalanceMemo::balance(const model::Network& network, const Layout& layout, std::vector<std::vector<int>>& ranks,
                              int microbatches, const CostModel& cost, const std::vector<Stage>& fixed) {
  for (const Entry& e : done_) {
    if (e.microbatches != microbatches || !same_to_the_balancer(e.ranks, ranks, cost)) continue;
    std::vector<std::vector<int>> ordered;
    for (const size_t i : e.order) ordered.push_back(ranks[i]);
    ranks = std::move(ordered);
    return e.result;
  }
  Entry e{ranks, {}, microbatches, {}};
  e.result = balance_with_order(network, layout, ranks, microbatches, cost, fixed, replicas_memory_bytes_);
  for (const auto& rank : ranks) {
    e.order.push_back(static_cast<size_t>(std::find(e.ranks.begin(), e.ranks.end(), rank) - e.ranks.begin()));
  }
  done_.push_back(std::move(e));
  return done_.back().result;
}

std::vector<int> split_microbatches(int total, const std::vector<double>& bottleneck_s) {
  const size_t n = bottleneck_s.size();
  std::vector<int> out(n, 1);
  if (n == 0) return out;
  if (total < static_cast<int>(n)) total = static_cast<int>(n);
  double speed_sum = 0;
  for (double b : bottleneck_s) speed_sum += b > 0 ? 1 / b : 0;
  std::vector<std::pair<double, size_t>> remainders;
  int assigned = 0;
  for (size_t i = 0; i < n; ++i) {
    const double share = speed_sum > 0 ? total * (1 / bottleneck_s[i]) / speed_sum : static_cast<double>(total) / n;
    out[i] = std::max(1, static_cast<int>(std::floor(share)));
    assigned += out[i];
    remainders.emplace_back(share - std::floor(share), i);
  }
  std::stable_sort(remainders.begin(), remainders.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  for (size_t k = 0; assigned < total; k = (k + 1) % n, ++assigned) ++out[remainders[k].second];
  while (assigned > total) {  // the at-least-one rule overshot: take from the largest share
    --*std::max_element(out.begin(), out.end());
    --assigned;
  }
  return out;
}

namespace {
// One server per node: its first GPU, or with `used_only` its first device that the layout
// runs on (nodes the layout does not use get none).
std::vector<int> node_servers(const model::Cluster& cluster, const Layout& layout, bool used_only) {
  const std::vector<model::Device> devices = cluster.devices();
  std::vector<int> first(cluster.nodes.size(), -1);
  auto offer = [&](int id) {
    int& f = first[static_cast<size_t>(devices[static_cast<size_t>(id)].node)];
    if (f < 0 || id < f) f = id;
  };
  if (used_only) {
    for (const VirtualWorker& w : layout.workers) {
      for (const auto& rank : w.ranks) {
        for (int d : rank) offer(d);
      }
    }
  } else {
    for (const model::Device& d : devices) {
      if (d.local_rank == 0) offer(d.id);
    }
  }
  std::erase(first, -1);
  return first;
}
}  // namespace

void place_layer_servers(Layout& layout, const model::Cluster& cluster, const model::Network& network,
                         ServerPlacement placement) {
  if (layout.sync.kind == SyncKind::allreduce) return;
  std::vector<int>& server = layout.sync.layer_server;
  server.assign(network.layers.size(), 0);
  if (placement == ServerPlacement::local) {
    // Under ED every virtual worker runs a stage on the same GPU type, i.e. the same node.
    const VirtualWorker& first = layout.workers.front();
    for (const Stage& s : first.stages) {
      const int device = first.ranks[static_cast<size_t>(s.rank)].front();
      for (int l = s.layer_begin; l < s.layer_end; ++l) server[static_cast<size_t>(l)] = device;
    }
    return;
  }
  const std::vector<int> servers = node_servers(cluster, layout, placement == ServerPlacement::used_nodes);
  std::vector<double> load(servers.size(), 0);
  for (size_t l = 0; l < network.layers.size(); ++l) {
    const size_t i = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    server[l] = servers[i];
    load[i] += network.layers[l].params + 1;  // +1: parameter-free layers spread too
  }
}

}  // namespace policy_detail
}  // namespace hetflow::partition
