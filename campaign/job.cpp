// A plan's size, its checkpoint and its iteration times by state.
#include "campaign/job.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>

#include "model/error.hpp"
#include "partition/cost_model.hpp"
#include "partition/memory.hpp"
#include "partition/plan_builder.hpp"
#include "sim/simulator.hpp"
#include "traces/metrics.hpp"

namespace hetflow::campaign {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Steady-state iteration time of `plan` (two iterations, the first left out).
double iteration_time_s(partition::Plan plan, const model::Calibration& calibration,
                        const std::vector<sim::Straggler>& stragglers) {
  plan.layout.iterations = 2;
  sim::SimOptions options;
  options.calibration = calibration;
  options.stragglers = stragglers;
  const sim::SimResult result = sim::simulate(plan, options);
  if (!result.completed) {
    std::string why = result.stalls.empty() ? std::string("no reason given") : result.stalls.front();
    throw Error("campaign: the simulation of one iteration did not complete: " + why);
  }
  const partition::CostModel cost(plan.cluster, plan.network.precision, calibration);
  return traces::compute_metrics(result.trace, plan, cost, 1).iteration_time_s;
}

// The workers a campaign's replica is: a virtual worker, a context group's workers, and under
// expert parallelism the expert group's (a member cannot leave alone: its experts would go).
int replica_workers(const partition::Layout& layout) {
  return std::max(1, layout.size(partition::Axis::context)) * std::max(1, layout.experts.parallel);
}

// The plan rebuilt with its last replica gone (replica_workers); `same_batch`: the others share
// its micro-batches (each gets ceil(m R / (R - 1)), the nearest whole count not below).
partition::Plan without_last_replica(const partition::Plan& plan, const model::Calibration& calibration,
                                     bool same_batch) {
  partition::Layout layout = plan.layout;
  const int unit = replica_workers(layout);
  const int replicas = static_cast<int>(layout.workers.size()) / unit;
  layout.workers.resize(layout.workers.size() - static_cast<size_t>(unit));
  layout.fit_axes();  // one replica fewer on the data axis
  if (same_batch) {
    for (partition::VirtualWorker& w : layout.workers) {
      w.microbatches = (w.microbatches * replicas + replicas - 2) / (replicas - 1);
    }
  }
  const partition::CostModel cost(plan.cluster, plan.network.precision, calibration);
  return partition::build_plan(plan.cluster, plan.network, layout, cost);
}

}  // namespace

Job describe_job(const partition::Plan& plan, const Reliability& reliability) {
  Job job;
  job.reliability = reliability;
  const std::vector<model::Device> devices = plan.cluster.devices();
  std::set<int> used_devices, used_nodes;
  for (const partition::VirtualWorker& w : plan.layout.workers) {
    for (const auto& rank : w.ranks) used_devices.insert(rank.begin(), rank.end());
  }
  for (int d : used_devices) used_nodes.insert(devices.at(static_cast<size_t>(d)).node);
  job.gpus = static_cast<int>(used_devices.size());
  job.nodes = static_cast<int>(used_nodes.size());
  for (int n : used_nodes) job.gpus_per_node = std::max(job.gpus_per_node, plan.cluster.nodes.at(static_cast<size_t>(n)).gpu_count);
  // A replica is a virtual worker, a context group's C workers, or an expert group's.
  job.replicas = std::max(1, static_cast<int>(plan.layout.workers.size()) / replica_workers(plan.layout));
  job.samples_per_step = plan.layout.samples_per_iteration();
  job.tokens_per_sample = std::max(1.0, plan.network.tokens_per_sample);

  // The model's state once: every parameter's weight and optimizer state (fp32 master and
  // Adam moments), however the plan splits, shards or offloads them (torch.distributed.
  // checkpoint writes each tensor once, a ZeRO shard or an expert from whoever holds it, a
  // tensor-parallel replicated norm once). What a GPU reads back is what it holds: its
  // weights and optimizer state as the plan places them (under ZeRO its shard; offloaded,
  // the optimizer state its host memory keeps for it, less the staging buffers).
  CheckpointCost& c = job.checkpoint;
  const double whole_params = partition::params_per_device(plan.network, 0, static_cast<int>(plan.network.layers.size()), 1);
  const double state_per_param = model::adam_state_bytes(plan.layout.precision);
  c.size_bytes = whole_params * (model::element_bytes(plan.layout.precision) + state_per_param);
  std::vector<double> offloaded_state(plan.memory.size(), 0.0);  // per device
  for (const partition::Tensor& t : plan.tensors) {
    if (t.kind == partition::TensorKind::host_state && t.device >= 0 && static_cast<size_t>(t.device) < offloaded_state.size()) {
      offloaded_state[static_cast<size_t>(t.device)] +=
          t.bytes * state_per_param / partition::offload_host_bytes_per_param(plan.layout);
    }
  }
  double largest_device_bytes = 0;
  if (!plan.layout.workers.empty()) {
    for (const auto& rank : plan.layout.workers.front().ranks) {
      for (int d : rank) {
        const partition::DeviceMemory& m = plan.memory.at(static_cast<size_t>(d));
        largest_device_bytes = std::max(largest_device_bytes,
                                        m.weights_bytes + m.optimizer_bytes + offloaded_state[static_cast<size_t>(d)]);
      }
    }
  }
  // Writing: every node writes an equal share of the one copy (replicas deduplicated, as
  // torch.distributed.checkpoint does), bounded by its own link and the file system's total.
  const double nodes = std::max(1, job.nodes);
  c.write_s = std::max(c.size_bytes / reliability.storage_aggregate_bytes_per_s,
                       c.size_bytes / nodes / reliability.storage_node_bytes_per_s);
  // Loading: one copy read as it was written, every node its share, then each GPU's shard
  // broadcast to its copies in the other replicas (a pipelined broadcast takes about the
  // shard over the GPU's share of its node's NICs). Reading a copy per replica would
  // multiply the file system's load by the replicas.
  double nic_bytes_per_s_per_gpu = kInf;
  for (int n : used_nodes) {
    const model::Node& node = plan.cluster.nodes.at(static_cast<size_t>(n));
    nic_bytes_per_s_per_gpu = std::min(nic_bytes_per_s_per_gpu,
                                       node.nic.count * node.nic.bandwidth_bytes_per_s / std::max(1, node.gpu_count));
  }
  const double broadcast_s =
      job.replicas > 1 && nic_bytes_per_s_per_gpu > 0 ? largest_device_bytes / nic_bytes_per_s_per_gpu : 0;
  c.load_s = c.write_s + broadcast_s;
  // (An offloaded shard is copied too, though from host memory: the optimizer goes on stepping it.)
  c.snapshot_s = largest_device_bytes / reliability.host_copy_bytes_per_s;
  return job;
}

void measure_states(const partition::Plan& plan, const model::Calibration& calibration, Job& job,
                    StatesNeeded needed) {
  StateTimes& t = job.times;
  t.healthy_s = iteration_time_s(plan, calibration, {});
  t.replica_short_s = t.replica_short_same_batch_s = t.healthy_s;
  if (job.replicas > 1 && needed.replica_short) {
    t.replica_short_s = iteration_time_s(without_last_replica(plan, calibration, false), calibration, {});
    if (needed.same_batch) {
      t.replica_short_same_batch_s = iteration_time_s(without_last_replica(plan, calibration, true), calibration, {});
    }
  }
  t.straggler_s = t.healthy_s;
  const Reliability& r = job.reliability;
  if (r.straggler_probability > 0 && r.straggler_slowdown > 1 && !plan.layout.workers.empty()) {
    // One node of worker 0 slow: all its devices (a node is what straggles: thermals, a
    // noisy neighbour, a slow host).
    const std::vector<model::Device> devices = plan.cluster.devices();
    const int first = plan.layout.workers.front().ranks.front().front();
    const int node = devices.at(static_cast<size_t>(first)).node;
    std::vector<sim::Straggler> slow;
    for (const model::Device& d : devices) {
      if (d.node == node) slow.push_back({d.id, r.straggler_slowdown, 0});
    }
    t.straggler_s = iteration_time_s(plan, calibration, slow);
  }
}

double daly_interval_s(double write_s, double mtbf_s) {
  if (!(mtbf_s > 0) || !std::isfinite(mtbf_s)) return std::numeric_limits<double>::infinity();
  if (write_s >= 2 * mtbf_s) return mtbf_s;
  const double x = write_s / (2 * mtbf_s);
  return std::sqrt(2 * write_s * mtbf_s) * (1 + std::sqrt(x) / 3 + x / 9) - write_s;
}

}  // namespace hetflow::campaign
