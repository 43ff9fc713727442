#include "tools/plan_summary.hpp"

#include <algorithm>
#include <iomanip>
#include <map>
#include <ostream>
#include <set>
#include <string>

#include "model/units.hpp"
#include "partition/expert_shard.hpp"
#include "partition/loading.hpp"
#include "partition/validate.hpp"

namespace hetflow::tools {

namespace u = model::units;
using partition::Plan;

namespace {
// The tensor-parallel degree: one number, or the range of the stages' degrees.
std::string tensor_text(const partition::Layout& l) {
  const int tensor = l.size(partition::Axis::tensor);
  if (l.uniform_tensor()) return std::to_string(tensor);
  size_t least = static_cast<size_t>(tensor);
  for (const partition::VirtualWorker& w : l.workers) {
    for (const auto& rank : w.ranks) least = std::min(least, rank.size());
  }
  return std::to_string(least) + "-" + std::to_string(tensor) + " (per stage)";
}
// ", flash attention, unfused softmax, bias-GeLU": what differs from Megatron's defaults.
std::string kernels_text(const partition::KernelOptions& k) {
  std::string s = k.flash_attention ? ", flash attention" : "";
  std::string unfused;
  for (const auto& [fused, name] : {std::pair{k.fused_softmax, "softmax"}, std::pair{k.fused_bias_gelu, "bias-GeLU"},
                                    std::pair{k.fused_bias_dropout_add, "bias-dropout-add"}, std::pair{k.fused_adam, "Adam"}}) {
    if (!fused) unfused += (unfused.empty() ? ", unfused " : ", ") + std::string(name);
  }
  return s + unfused;
}

// A mixture's experts: where they live and what the routing costs each expert rank (the
// busiest gates every MoE layer).
void experts_summary(const Plan& plan, std::ostream& out) {
  const partition::Layout& l = plan.layout;
  if (!plan.network.architecture || plan.network.architecture->moe.experts <= 0) return;
  const partition::ExpertSplit split = partition::expert_split(plan.network, l);
  out << "  experts: " << plan.network.architecture->moe.experts << " routed, top-" << plan.network.architecture->moe.experts_per_token;
  if (split.ranks <= 1) {
    out << ", every one on every device (no expert parallelism), routing " << partition::to_string(l.experts.routing) << "\n";
    return;
  }
  const auto& load = split.loads.rank_load;
  // Expert tensor parallelism is the chunks' tensor degree (alike on every replica: check_experts).
  int tensor = 1;
  const partition::VirtualWorker& first = l.workers.front();
  for (size_t k = 0; k < first.stages.size(); ++k) {
    for (int i = first.stages[k].layer_begin; i < first.stages[k].layer_end; ++i) {
      if (plan.network.layers[static_cast<size_t>(i)].experts > 0) tensor = std::max(tensor, first.tensor_of(k));
    }
  }
  out << ", expert parallel " << split.ranks << " (groups of " << split.ranks << " consecutive replicas, all-to-all "
      << partition::to_string(l.experts.dispatch)
      << (tensor > 1 ? ", one a tensor rank, each expert split over a rank's " + std::to_string(tensor) + " devices" : "")
      << "), routing " << partition::to_string(l.experts.routing)
      << (l.experts.placement.empty() ? ", contiguous placement" : ", placement given expert by expert") << "\n";
  // Each rank's GPU types (its first expert group's worker, the chunks holding MoE layers): a
  // placement by speed gives the faster ones more experts.
  const auto devices = plan.cluster.devices();
  const auto types_of = [&](size_t r) {
    std::set<std::string> types;
    const size_t w = r * static_cast<size_t>(l.size(partition::Axis::context));
    if (w >= l.workers.size()) return std::string();
    for (const partition::Stage& s : l.workers[w].stages) {
      bool moe = false;
      for (int i = s.layer_begin; i < s.layer_end; ++i) moe = moe || plan.network.layers[static_cast<size_t>(i)].experts > 0;
      if (!moe) continue;
      for (const int d : l.workers[w].ranks[static_cast<size_t>(s.rank)]) {
        types.insert(plan.cluster.device_gpu(devices[static_cast<size_t>(d)]).name);
      }
    }
    std::string text;
    for (const std::string& t : types) text += (text.empty() ? "" : "+") + t;
    return text;
  };
  std::set<std::string> all_types;
  for (size_t r = 0; r < load.size(); ++r) all_types.insert(types_of(r));
  const bool mixed = all_types.size() > 1;
  out << std::fixed << std::setprecision(2) << "    expert rank: experts held, load (copies over an even share)"
      << (mixed ? ", GPUs" : "");
  const size_t shown = std::min<size_t>(load.size(), 16);
  for (size_t r = 0; r < shown; ++r) {
    out << (r ? "; " : " ") << r << ": " << split.held[r] << ", " << load[r] << (mixed ? ", " + types_of(r) : "");
  }
  if (shown < load.size()) out << "; ...";
  out << "\n    busiest: rank " << split.loads.busiest << " at " << load[static_cast<size_t>(split.loads.busiest)]
      << "x an even share" << (mixed ? " (on mixed GPUs the slowest rank's experts gate each MoE layer: more experts on "
                                       "the faster ranks shorten it; --expert-placement speed)"
                                     : " gates every MoE layer");
  if (split.loads.dropped > 0) out << "; capacity drops " << 100 * split.loads.dropped << " % of the copies";
  out << "\n" << std::defaultfloat << std::setprecision(6);
}
}  // namespace

void print_layout(std::ostream& out, const Plan& plan) {
  const partition::Layout& l = plan.layout;
  if (l.policy == partition::kWorkloadPolicy) {
    std::set<int> ranks;
    for (const partition::Task& t : plan.tasks) ranks.insert(t.device);
    out << "plan: " << plan.network.name << " on " << plan.cluster.name << " — a workload read from Chakra traces: "
        << ranks.size() << " ranks, " << plan.tasks.size() << " tasks per iteration, " << plan.collectives.size()
        << " collectives, " << l.iterations << " iteration" << (l.iterations == 1 ? "" : "s") << "\n";
    return;
  }
  out << "plan: " << plan.network.name << " on " << plan.cluster.name << " — policy " << l.policy << ", schedule "
      << l.schedule << ", tensor " << tensor_text(l) << ", " << l.workers.size() << " virtual worker"
      << (l.workers.size() == 1 ? "" : "s")
      << (partition::axis_order_text(l.axes) == partition::axis_order_text(partition::default_axes())
              ? ""
              : ", placed " + partition::axis_order_text(l.axes))
      << ", micro-batch " << l.micro_batch_size << ", recompute "
      << partition::to_string(l.recompute) << (l.sequence_parallel ? ", sequence parallel" : "") << kernels_text(l.kernels)
      << ", sync "
      << partition::to_string(l.sync.kind);
  if (l.sync.kind == partition::SyncKind::wsp) out << " (staleness " << l.sync.staleness << ")";
  if (l.sync.kind == partition::SyncKind::allreduce) out << " (" << partition::to_string(l.sync.algorithm) << ")";
  if (l.sync.zero.stage > 0) {
    out << ", ZeRO stage " << l.sync.zero.stage
        << (l.sync.zero.stage < 3 ? "" : l.sync.zero.reshard_after_forward ? " (resharded after each pass)" : " (kept gathered)")
        << (l.sync.zero.shares == partition::ZeroShares::memory ? ", shards by device memory" : "");
  }
  if (l.offload.optimizer) out << ", optimizer offloaded to host memory";
  if (l.offload.activations) out << ", stashes offloaded to host memory";
  out << ", " << l.iterations << " iteration" << (l.iterations == 1 ? "" : "s");
  if (l.size(partition::Axis::context) > 1) {
    out << ", context parallel " << l.size(partition::Axis::context) << " (each worker 1/" << l.size(partition::Axis::context)
        << " of every sequence, keys and values "
        << (l.context_comm == partition::ContextComm::ring ? "passed around a ring, overlapped with the attention)"
                                                           : "all-gathered)");
  }
  if (l.folded) {
    out << ", folded: "
        << (l.experts.parallel > 1    ? "the first expert group's tasks"
            : l.task_workers() > 1    ? "the first context group's tasks"
                                      : std::string("virtual worker 0's tasks"))
        << " stand for all " << l.workers.size() / std::max<size_t>(1, l.task_workers()) << " replicas";
  }
  out << "\n";
  experts_summary(plan, out);
  const size_t shown = std::min<size_t>(l.workers.size(), 4);
  for (size_t w = 0; w < shown; ++w) {
    const partition::VirtualWorker& vw = l.workers[w];
    out << "  virtual worker " << w << ": " << vw.ranks.size() << " rank" << (vw.ranks.size() == 1 ? "" : "s") << ", "
        << vw.microbatches << " micro-batch" << (vw.microbatches == 1 ? "" : "es") << "\n";
    for (const partition::Stage& s : vw.stages) {
      out << "    layers " << std::setw(3) << s.layer_begin << "-" << std::left << std::setw(4) << (s.layer_end - 1)
          << std::right << " on ";
      const auto& rank = vw.ranks[static_cast<size_t>(s.rank)];
      for (size_t j = 0; j < rank.size(); ++j) out << (j ? "," : "") << plan.device_names[static_cast<size_t>(rank[j])];
      out << "\n";
    }
  }
  if (shown < l.workers.size()) {
    const size_t more = l.workers.size() - shown;
    out << "  ... and " << more << " more virtual worker" << (more == 1 ? "" : "s") << "\n";
  }
  // Devices no worker runs and no layer is served from (a grouped or layout-file plan may
  // leave slow GPUs out).
  std::vector<bool> used(static_cast<size_t>(plan.device_count()), false);
  const auto use = [&](int d) {
    if (d >= 0 && static_cast<size_t>(d) < used.size()) used[static_cast<size_t>(d)] = true;
  };
  for (const partition::VirtualWorker& vw : l.workers) {
    for (const auto& rank : vw.ranks) std::for_each(rank.begin(), rank.end(), use);
  }
  std::for_each(l.sync.layer_server.begin(), l.sync.layer_server.end(), use);
  std::vector<std::string> idle;
  for (size_t d = 0; d < used.size(); ++d) {
    if (!used[d]) idle.push_back(plan.device_names[d]);
  }
  if (!idle.empty()) {
    out << "  idle (in no virtual worker):";
    for (size_t i = 0; i < std::min<size_t>(idle.size(), 8); ++i) out << (i ? ", " : " ") << idle[i];
    if (idle.size() > 8) out << " and " << idle.size() - 8 << " more";
    out << "\n";
  }
}

void print_estimate(std::ostream& out, const Plan& plan, const partition::Estimate& e) {
  out << "analytic estimate (critical path, no contention):\n";
  out << "  iteration time   " << u::human_time_s(e.iteration_time_s) << "\n";
  out << std::fixed << "  throughput       " << std::setprecision(2) << e.throughput_samples_per_s << " samples/s";
  if (plan.network.tokens_per_sample > 1) out << ", " << std::setprecision(0) << e.throughput_tokens_per_s << " tokens/s";
  out << "\n  bubble fraction  " << std::setprecision(3) << e.bubble_fraction << "\n" << std::defaultfloat;
  print_input_bound(out, plan, e.compute_throughput_samples_per_s);
  if (partition::loader_bound(plan).bounded) {
    out << "  input wait       " << u::human_time_s(e.input_wait_s)
        << " per iteration (the next forward waiting for its load; mean over computing devices, not in the bubble)\n";
  }
  out << "  " << std::left << std::setw(22) << "device" << std::right << std::setw(12) << "busy" << std::setw(14)
      << "peak memory" << std::setw(12) << "capacity" << "\n";
  const size_t devices = static_cast<size_t>(plan.device_count());
  size_t printed = 0;
  for (size_t d = 0; d < devices; ++d) {
    if (e.busy_s[d] == 0 && e.peak_memory_bytes[d] == 0) continue;
    if (++printed > 32) continue;
    out << "  " << std::left << std::setw(22) << plan.device_names[d] << std::right << std::setw(12)
        << u::human_time_s(e.busy_s[d]) << std::setw(14) << u::human_bytes(e.peak_memory_bytes[d]) << std::setw(12)
        << u::human_bytes(plan.memory[d].capacity_bytes) << "\n";
  }
  if (printed > 32) out << "  ... and " << printed - 32 << " more devices (--json lists all)\n";
  print_host_memory(out, plan);
}

// Offload: each node's host memory, what its devices keep there and what it holds.
void print_host_memory(std::ostream& out, const Plan& plan) {
  std::map<int, std::pair<double, int>> per_node;  // node -> (bytes, devices)
  const std::vector<model::Device> devices = plan.cluster.devices();
  for (size_t d = 0; d < plan.memory.size() && d < devices.size(); ++d) {
    if (!(plan.memory[d].host_bytes > 0)) continue;
    per_node[devices[d].node].first += plan.memory[d].host_bytes;
    ++per_node[devices[d].node].second;
  }
  const partition::Offload& o = plan.layout.offload;
  const char* what = o.optimizer && o.activations ? "optimizer state and stashes" : o.optimizer ? "optimizer state" : "stashes";
  size_t shown = 0;
  for (const auto& [node, use] : per_node) {
    if (++shown > 8) break;
    out << "  host of " << plan.cluster.nodes[static_cast<size_t>(node)].name << ": " << u::human_bytes(use.first)
        << " of " << what << " from " << use.second << " device" << (use.second == 1 ? "" : "s") << ", of "
        << u::human_bytes(plan.cluster.host(node).memory_bytes) << "\n";
  }
  if (per_node.size() > 8) out << "  ... and " << per_node.size() - 8 << " more hosts\n";
}

void print_input_bound(std::ostream& out, const Plan& plan, double compute_samples_per_s) {
  const partition::LoaderBound b = partition::loader_bound(plan);
  if (!b.bounded) return;
  out << std::fixed << std::setprecision(0);
  if (b.samples_per_s <= 0) {
    out << "  loader           unbounded (the input path limits nothing)\n";
  } else if (b.samples_per_s < compute_samples_per_s) {
    out << "  input-bound: the loader gives " << b.samples_per_s << " samples/s (" << b.limit
        << "), the GPUs could take " << compute_samples_per_s << " (" << std::setprecision(1)
        << compute_samples_per_s / b.samples_per_s << "x)\n";
  } else {
    out << "  loader           " << b.samples_per_s << " samples/s (" << b.limit << "), "
        << std::setprecision(1) << b.samples_per_s / compute_samples_per_s << "x what the GPUs take: not input-bound\n";
  }
  out << std::defaultfloat;
}

Json input_bound_json(const Plan& plan, double compute_samples_per_s) {
  const partition::LoaderBound b = partition::loader_bound(plan);
  if (!b.bounded) return nullptr;
  Json j;
  j["loader_samples_per_s"] = b.samples_per_s > 0 ? Json(b.samples_per_s) : Json(nullptr);  // null: unbounded
  j["limit"] = b.limit;
  j["compute_samples_per_s"] = compute_samples_per_s;
  j["input_bound"] = b.samples_per_s > 0 && b.samples_per_s < compute_samples_per_s;
  j["slowdown"] = b.samples_per_s > 0 ? std::max(1.0, compute_samples_per_s / b.samples_per_s) : 1.0;
  return j;
}

Json estimate_json(const Plan& plan, const partition::Estimate& e) {
  Json j;
  j["iteration_time_s"] = e.iteration_time_s;
  j["makespan_s"] = e.makespan_s;
  j["bubble_fraction"] = e.bubble_fraction;
  j["throughput_samples_per_s"] = e.throughput_samples_per_s;
  j["throughput_tokens_per_s"] = e.throughput_tokens_per_s;
  j["samples_per_iteration"] = plan.layout.samples_per_iteration();
  j["tasks"] = plan.tasks.size();  // per iteration
  j["iterations"] = plan.iterations();
  Json devices = Json::array();
  for (size_t d = 0; d < static_cast<size_t>(plan.device_count()); ++d) {
    const partition::DeviceMemory& m = plan.memory[d];
    devices.push_back({{"name", plan.device_names[d]},
                       {"busy_s", e.busy_s[d]},
                       {"peak_memory_bytes", e.peak_memory_bytes[d]},
                       {"capacity_bytes", m.capacity_bytes},
                       {"memory", {{"weights_bytes", m.weights_bytes},
                                   {"gradients_bytes", m.gradients_bytes},
                                   {"optimizer_bytes", m.optimizer_bytes},
                                   {"activations_bytes", m.activations_bytes},
                                   {"buffers_bytes", m.buffers_bytes},
                                   {"gathered_bytes", m.gathered_bytes},
                                   {"workspace_bytes", m.workspace_bytes},
                                   {"host_bytes", m.host_bytes}}}});
  }
  j["devices"] = std::move(devices);
  if (Json loader = input_bound_json(plan, e.compute_throughput_samples_per_s); !loader.is_null()) {
    loader["input_wait_s"] = e.input_wait_s;  // per iteration, mean over computing devices
    j["loader"] = std::move(loader);
  }
  return j;
}

}  // namespace hetflow::tools
