#pragma once
// Figures of merit computed from a trace (simulated or measured) and the plan that ran.
// Iteration 0 is warm-up: steady-state figures use the iterations after it when there are
// several.
#include <map>
#include <string>
#include <vector>

#include "partition/cost_model.hpp"
#include "partition/plan.hpp"
#include "traces/trace.hpp"

namespace hetflow::traces {

struct DeviceMetrics {
  std::string name;
  double busy_s = 0;             // compute per steady-state iteration (F/B/W, optimizer, TP collectives)
  double utilization = 0;        // busy_s / iteration_time_s
  double exposed_comm_s = 0;     // per iteration: communication not hidden behind this device's compute
  double peak_memory_bytes = 0;  // from the plan's memory model (traces carry no allocations)
};

struct Metrics {
  int iterations = 0;                   // in the trace
  int measured_iterations = 0;          // used for steady-state figures
  std::vector<double> iteration_end_s;  // when each iteration's last task ended
  double iteration_time_s = 0;          // steady state
  double samples_per_s = 0;
  double tokens_per_s = 0;
  double model_flops_per_iteration = 0;  // forward + backward, recomputation excluded
  double mfu = 0;                        // model FLOP/s over the whole cluster's peak
  double bubble_fraction = 0;            // as partition::Estimate defines it, over measured iterations
  double exposed_comm_s = 0;             // mean over computing devices, per iteration
  std::map<std::string, double> bytes_per_link_class;  // per iteration
  std::vector<DeviceMetrics> devices;
};

// Refuses (InputError) a trace whose fingerprint names another plan.
Metrics compute_metrics(const Trace& trace, const partition::Plan& plan, const partition::CostModel& cost);

}  // namespace hetflow::traces
