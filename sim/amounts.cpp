#include "sim/amounts.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "model/error.hpp"
#include "partition/task_order.hpp"

namespace hetflow::sim {

using partition::Task;
using partition::TaskKind;

void check_amounts(const partition::Plan& plan, const partition::CostModel& cost, const SimOptions& options) {
  constexpr double kMaxBytes = 9223372036854775808.0;  // 2^63
  auto shown = [](double x) {
    char text[32];
    std::snprintf(text, sizeof text, "%.3g", x);
    return std::string(text);
  };
  const size_t tasks = plan.tasks.size();
  for (size_t id = 0; id < tasks; ++id) {
    const Task& t = plan.tasks[id];
    std::string why;
    switch (t.kind) {
      case TaskKind::forward:
      case TaskKind::backward:
      case TaskKind::backward_weight:
      case TaskKind::optimizer:
        if (!std::isfinite(cost.task_compute_time_s(plan, t) * cost.peak_flops_per_s(t.device))) {
          why = "its " + shown(t.flops) + " flops and " + shown(t.memory_bytes) +
                " bytes of memory traffic take longer than the simulator can count";
        }
        break;
      case TaskKind::load:
      case TaskKind::to_host:
      case TaskKind::to_device:
        if (!(t.bytes < kMaxBytes)) why = "it moves " + shown(t.bytes) + " bytes, more than the simulator can count";
        break;
      case TaskKind::host_optimizer:
        if (!(t.flops < kMaxBytes && t.memory_bytes < kMaxBytes)) {
          why = "its " + shown(t.flops) + " flops and " + shown(t.memory_bytes) + " bytes are more than the simulator can count";
        }
        break;
      case TaskKind::send:
      case TaskKind::recv:
      case TaskKind::collective:
        if (!(t.bytes < kMaxBytes)) why = "it moves " + shown(t.bytes) + " bytes; the simulator moves at most 2^63";
        if (!std::isfinite(cost.memory_op_time_s(t.device, t.memory_bytes) * cost.peak_flops_per_s(t.device))) {
          why = "its " + shown(t.memory_bytes) + " bytes of memory traffic take longer than the simulator can count";
        }
        break;
    }
    if (!why.empty()) throw PlanError(partition::describe_task(plan, static_cast<int>(id)) + ": " + why);
  }
  const auto& replay = options.compute_s;
  const int iterations = std::max(1, plan.iterations());
  if (!replay.empty() && replay.size() != tasks * static_cast<size_t>(iterations)) {
    throw Error("replay: " + std::to_string(replay.size()) + " compute durations for " + std::to_string(tasks) +
                " tasks x " + std::to_string(iterations) + " iterations");
  }
  for (size_t i = 0; i < replay.size(); ++i) {
    if (!(replay[i] < 1e9)) {  // NaN too
      throw Error("replay: " + partition::describe_task(plan, static_cast<int>(i % tasks)) + ", iteration " +
                  std::to_string(i / tasks) + ": a duration of " + shown(replay[i]) + " s");
    }
  }
}

}  // namespace hetflow::sim
