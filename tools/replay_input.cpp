// tools/replay_input.hpp: a measured trace as the durations a replay runs.
#include "tools/replay_input.hpp"

#include <algorithm>

#include "model/error.hpp"
#include "partition/plan_io.hpp"
#include "traces/event_index.hpp"

namespace hetflow::tools {


std::vector<double> dispatch_of_devices(const partition::Plan& plan, const model::Calibration& calibration) {
  std::vector<double> dispatch_s;
  for (const model::Device& d : plan.cluster.devices()) {
    dispatch_s.push_back(calibration.gpu(plan.cluster.device_gpu(d).name).dispatch_s);
  }
  return dispatch_s;
}

void keep_complete_iterations(Replay& r) {
  const size_t tasks = r.plan.tasks.size();
  r.planned_iterations = r.plan.layout.iterations;
  const traces::EventIndex index(r.measured, r.plan);
  const auto whole = [&](int i) {  // every task instance of iteration i is in the trace
    for (size_t t = 0; t < tasks; ++t) {
      if (index(static_cast<int>(t), i) < 0) return false;
    }
    return true;
  };
  int complete = 0;
  while (complete < r.planned_iterations && whole(complete)) ++complete;
  if (complete == 0) {
    throw InputError(r.trace_path, 0, "events",
                     "a partial trace (" + r.measured.partial + ") without one complete iteration: nothing to replay");
  }
  std::erase_if(r.measured.events, [&](const traces::Event& e) { return e.iteration >= complete; });
  r.plan.layout.iterations = complete;
  r.plan.fingerprint = partition::plan_fingerprint(r.plan);
  r.measured.fingerprint = r.plan.fingerprint;  // (checked against the run's plan above) what is kept is this plan's trace
}

void take_measured_durations(Replay& r) {
  const int iterations = r.plan.layout.iterations;
  const size_t tasks = r.plan.tasks.size();
  r.options.compute_s.assign(tasks * static_cast<size_t>(iterations), -1.0);
  const std::vector<double> dispatch_s = dispatch_of_devices(r.plan, r.options.calibration);
  const traces::EventIndex index(r.measured, r.plan);
  for (const traces::Event& e : r.measured.events) {
    const bool load = e.kind == partition::TaskKind::load;
    if (!partition::is_compute(e.kind) && !load) continue;
    if (e.task < 0 || static_cast<size_t>(e.task) >= tasks || r.plan.tasks[static_cast<size_t>(e.task)].kind != e.kind) {
      throw InputError(r.trace_path, 0, "task",
                       "event of task " + std::to_string(e.task) + " (" + std::string(partition::to_string(e.kind)) +
                           ") is no such task of the plan");
    }
    if (load) {  // what the loader took then, whatever slowed it (its input path, a throttle, the others' loads)
      double& s = r.options.compute_s[static_cast<size_t>(e.iteration) * tasks + static_cast<size_t>(e.task)];
      r.measured_loads += s < 0;
      s = std::max(0.0, e.end_s - e.start_s);
      continue;
    }
    const size_t device = static_cast<size_t>(r.plan.tasks[static_cast<size_t>(e.task)].device);
    r.options.compute_s[static_cast<size_t>(e.iteration) * tasks + static_cast<size_t>(e.task)] =
        index.own_s(r.measured, e.task, e.iteration) + (device < dispatch_s.size() ? dispatch_s[device] : 0);  // (the simulation runs its in-task messages)
  }
  long long missing = 0;  // compute instances without a measured duration
  for (size_t i = 0; i < r.options.compute_s.size(); ++i) {
    missing += r.options.compute_s[i] < 0 && partition::is_compute(r.plan.tasks[i % tasks].kind);
    r.loads += r.plan.tasks[i % tasks].kind == partition::TaskKind::load;
  }
  if (missing > 0) {
    throw InputError(r.trace_path, 0, "events",
                     std::to_string(missing) + " compute task instances of the plan are not in the trace "
                     "(the trace of a run that did not complete?)");
  }
}

}  // namespace hetflow::tools
