#include "partition/estimate.hpp"

#include <algorithm>
#include <limits>

#include "model/error.hpp"

namespace hetflow::partition {

namespace {
bool is_pipeline_compute(TaskKind k) {
  return k == TaskKind::forward || k == TaskKind::backward || k == TaskKind::backward_weight;
}
}  // namespace

double task_duration_s(const Plan& plan, const CostModel& cost, int task) {
  const Task& t = plan.tasks[static_cast<size_t>(task)];
  switch (t.kind) {
    case TaskKind::forward:
    case TaskKind::backward:
    case TaskKind::backward_weight:
    case TaskKind::optimizer:
      return cost.compute_time_s(t.device, t.flops, t.memory_bytes);
    case TaskKind::send:
      return cost.transfer_time_s(t.device, t.peer, t.bytes);
    case TaskKind::recv:
      return cost.transfer_time_s(t.peer, t.device, t.bytes);
    case TaskKind::collective: {
      const Collective& c = plan.collectives[static_cast<size_t>(t.group)];
      return cost.collective_time_s({c.kind, c.algorithm, c.devices, c.bytes, 0});
    }
  }
  return 0;
}

Estimate estimate_plan(const Plan& plan, const CostModel& cost) {
  return estimate_plan(plan, cost, order_tasks(plan));
}

Estimate estimate_plan(const Plan& plan, const CostModel& cost, const TaskOrder& order) {
  if (!order.complete()) {
    std::string message = "the plan deadlocks: these tasks wait for each other in a cycle:";
    for (int t : order.cycle) message += "\n  " + describe_task(plan, t);
    throw PlanError(message);
  }
  const size_t units = order.units.size();
  std::vector<double> ready(units, 0), end(units, 0);
  Estimate e;
  e.task_start_s.assign(plan.tasks.size(), 0);
  e.task_end_s.assign(plan.tasks.size(), 0);
  for (int u : order.order) {
    const auto& tasks = order.units[static_cast<size_t>(u)];
    const double start = ready[static_cast<size_t>(u)];
    const double finish = start + task_duration_s(plan, cost, tasks.front());
    end[static_cast<size_t>(u)] = finish;
    for (int t : tasks) {
      e.task_start_s[static_cast<size_t>(t)] = start;
      e.task_end_s[static_cast<size_t>(t)] = finish;
    }
    for (int s = order.successor_begin[static_cast<size_t>(u)]; s < order.successor_begin[static_cast<size_t>(u) + 1]; ++s) {
      double& r = ready[static_cast<size_t>(order.successors[static_cast<size_t>(s)])];
      r = std::max(r, finish);
    }
  }

  const int iterations = std::max(1, plan.layout.iterations);
  const size_t devices = static_cast<size_t>(plan.device_count());
  const size_t workers = plan.layout.workers.size();
  std::vector<double> iteration_end(static_cast<size_t>(iterations), 0);
  // Per (worker, iteration): span of pipeline compute; per (device, iteration): busy time.
  constexpr double kInf = std::numeric_limits<double>::infinity();
  std::vector<double> span_begin(workers * static_cast<size_t>(iterations), kInf);
  std::vector<double> span_end(workers * static_cast<size_t>(iterations), 0);
  std::vector<double> pipeline_busy(devices * static_cast<size_t>(iterations), 0);
  std::vector<char> in_pipeline(devices, 0);
  e.busy_s.assign(devices, 0);
  for (size_t i = 0; i < plan.tasks.size(); ++i) {
    const Task& t = plan.tasks[i];
    const double duration = e.task_end_s[i] - e.task_start_s[i];
    const auto it = static_cast<size_t>(std::clamp(t.iteration, 0, iterations - 1));
    iteration_end[it] = std::max(iteration_end[it], e.task_end_s[i]);
    e.makespan_s = std::max(e.makespan_s, e.task_end_s[i]);
    const bool compute_stream = t.kind != TaskKind::send && t.kind != TaskKind::recv &&
                                (t.kind != TaskKind::collective || t.purpose == Purpose::tensor_parallel);
    if (compute_stream) e.busy_s[static_cast<size_t>(t.device)] += duration / iterations;
    if ((is_pipeline_compute(t.kind) || t.purpose == Purpose::tensor_parallel) && t.worker >= 0) {
      const size_t key = static_cast<size_t>(t.worker) * static_cast<size_t>(iterations) + it;
      span_begin[key] = std::min(span_begin[key], e.task_start_s[i]);
      span_end[key] = std::max(span_end[key], e.task_end_s[i]);
      if (is_pipeline_compute(t.kind)) {
        pipeline_busy[static_cast<size_t>(t.device) * static_cast<size_t>(iterations) + it] += duration;
        in_pipeline[static_cast<size_t>(t.device)] = 1;
      }
    }
  }
  e.iteration_time_s = iterations > 1 ? (iteration_end.back() - iteration_end.front()) / (iterations - 1)
                                      : e.makespan_s;
  // Bubble: average over the devices that run pipeline compute.
  double bubble_sum = 0;
  int bubble_count = 0;
  for (size_t w = 0; w < workers; ++w) {
    for (const auto& rank : plan.layout.workers[w].ranks) {
      for (int d : rank) {
        if (!in_pipeline[static_cast<size_t>(d)]) continue;
        for (size_t it = 0; it < static_cast<size_t>(iterations); ++it) {
          const size_t key = w * static_cast<size_t>(iterations) + it;
          const double span = span_end[key] - span_begin[key];
          if (span <= 0) continue;
          bubble_sum += 1 - pipeline_busy[static_cast<size_t>(d) * static_cast<size_t>(iterations) + it] / span;
          ++bubble_count;
        }
      }
    }
  }
  e.bubble_fraction = bubble_count > 0 ? bubble_sum / bubble_count : 0;
  e.throughput_samples_per_s =
      e.iteration_time_s > 0 ? plan.layout.samples_per_iteration() / e.iteration_time_s : 0;
  e.peak_memory_bytes.assign(devices, 0);
  for (size_t d = 0; d < devices && d < plan.memory.size(); ++d) e.peak_memory_bytes[d] = plan.memory[d].total_bytes();
  return e;
}

}  // namespace hetflow::partition
