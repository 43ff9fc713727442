#pragma once
// What `hetflow replay` runs: a measured trace's plan with every compute and load task
// instance taking the time the trace measured (communication still modelled by the network).
#include <string>
#include <vector>

#include "model/calibration.hpp"
#include "partition/plan.hpp"
#include "sim/simulator.hpp"
#include "traces/trace.hpp"

namespace hetflow::tools {

struct Replay {
  std::string trace_path;
  traces::Trace measured;
  partition::Plan plan;  // with the trace's iteration count
  int planned_iterations = 0;  // a partial trace's run's (plan holds its complete ones)
  sim::SimOptions options;
  long long loads = 0, measured_loads = 0;  // load task instances of the plan; of those, timed by the trace
};

// A calibrated dispatch (the hand-off before each task, which no measured duration holds),
// per device, as the simulator adds it to modelled durations.
std::vector<double> dispatch_of_devices(const partition::Plan& plan, const model::Calibration& calibration);

// A partial trace (a run that stopped short: interrupted, stalled) replays the iterations it
// holds every task instance of: the events of the rest are left out, the plan's iterations cut
// to those (InputError naming the trace when none is complete).
void keep_complete_iterations(Replay& r);

// r.options.compute_s from the trace: each compute instance its measured own time plus its
// device's dispatch, each load its measured duration (-1, the input path's closed form, where
// the trace has none); counts the loads. InputError naming the trace for an event of no such
// task, or compute instances the trace lacks. r.options.calibration must be set.
void take_measured_durations(Replay& r);

}  // namespace hetflow::tools
