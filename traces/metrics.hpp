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

// One iteration's figures: from the end of the iteration before (0 for the first) to the
// end of its own last task. Tasks of neighbouring iterations overlap in a pipeline, so an
// iteration's busy and communication time is its own tasks' wherever they fall.
struct IterationMetrics {
  int iteration = 0;
  double start_s = 0, end_s = 0, time_s = 0;
  double samples_per_s = 0, tokens_per_s = 0, mfu = 0;
  double bubble_fraction = 0;
  double busy_s = 0;          // compute, mean over computing devices
  double exposed_comm_s = 0;  // mean over computing devices
  double comm_bytes = 0;      // sent point to point and by collectives, every device together
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
  std::vector<IterationMetrics> per_iteration;  // every iteration of the trace, warm-up included
};

// Refuses (InputError) a trace whose fingerprint names another plan. For a folded plan
// (partition::Layout::folded) the work and traffic of worker 0 count once per replica;
// per-device figures are the simulated devices' (the replicas' are theirs by symmetry).
// Steady-state figures leave out the first `warmup` iterations (all but the last at most;
// with none left out, the first iteration is timed from 0).
Metrics compute_metrics(const Trace& trace, const partition::Plan& plan, const partition::CostModel& cost,
                        int warmup = 1);

// The per-iteration figures as CSV: '#' header lines (the trace's source, plan and
// fingerprint), then `iteration,start_s,end_s,time_s,samples_per_s,tokens_per_s,mfu,
// bubble_fraction,busy_s,exposed_comm_s,comm_bytes`, one row per iteration; numbers
// round-trip exactly.
std::string write_metrics_csv(const Metrics& metrics, const Trace& trace);

}  // namespace hetflow::traces
