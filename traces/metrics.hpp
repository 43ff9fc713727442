#pragma once
// Figures of merit computed from a trace (simulated or measured) and the plan that ran, each
// as traces/figures.hpp defines it. Iteration 0 is warm-up: steady-state figures use the
// iterations after it when there are several.
#include <map>
#include <string>
#include <vector>

#include "partition/cost_model.hpp"
#include "partition/plan.hpp"
#include "traces/trace.hpp"

namespace hetflow::traces {

struct DeviceMetrics {
  std::string name;
  double busy_s = 0;             // compute per steady-state iteration (passes, optimizer)
  double utilization = 0;        // busy_s / iteration_time_s: compute occupancy
  double exposed_comm_s = 0;     // per iteration: communication while this device computes nothing
  double idle_s = 0;             // per iteration: the rest (busy + exposed + idle = the iteration)
  double input_wait_s = 0;       // per iteration, of idle_s: waiting for the data loader (figures.hpp)
  double peak_memory_bytes = 0;  // from the plan's memory model (traces carry no allocations)
};

// One iteration's figures over its window (figures.hpp): from the end of the iteration
// before (0 for the first) to its own end. Tasks of neighbouring iterations overlap in a
// pipeline; whatever runs inside the window counts, as in the steady-state figures.
struct IterationMetrics {
  int iteration = 0;
  double start_s = 0, end_s = 0, time_s = 0;
  double samples_per_s = 0, tokens_per_s = 0, mfu = 0;
  double bubble_fraction = 0;
  double busy_s = 0;          // compute, mean over computing devices
  double exposed_comm_s = 0;  // mean over computing devices (idle: time_s less both)
  double comm_bytes = 0;      // sent point to point and by collectives, every device together
};

// A GPU type whose devices ran their passes faster than the peak the cluster gives it: what
// makes an MFU above 100 % possible (a nominal peak below what the hardware does).
struct OverPeak {
  std::string gpu;                    // the type's name in the cluster
  double achieved_flops_per_s = 0;    // the fastest of its devices: pass FLOPs over pass time
  double peak_flops_per_s = 0;        // the cluster's peak for it at the plan's precision
};

struct Metrics {
  int iterations = 0;                   // in the trace
  int measured_iterations = 0;          // used for steady-state figures
  std::vector<double> iteration_end_s;  // when each iteration's last task ended
  double iteration_time_s = 0;          // steady state
  double samples_per_s = 0;
  double tokens_per_s = 0;
  double model_flops_per_iteration = 0;  // forward + backward, recomputation excluded
  double peak_flops_per_s = 0;           // every device's peak at the cost model's precision
  double mfu = 0;                        // model FLOP/s over peak_flops_per_s
  std::vector<OverPeak> over_peak;       // why mfu may exceed 1; empty when no device beat its peak
  double bubble_fraction = 0;            // as partition::Estimate defines it, over measured iterations
  double exposed_comm_s = 0;             // mean over computing devices, per iteration
  double input_wait_s = 0;               // mean over computing devices, per iteration: waiting for the loader
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

// Why the MFU overstates (empty when no device beat its peak): which GPU types computed faster
// than the peak the cluster gives them, and that the peak is then too low, not the MFU right.
std::string over_peak_cause(const Metrics& metrics);

// The per-iteration figures as CSV: '#' header lines (the trace's source, plan and
// fingerprint), then `iteration,start_s,end_s,time_s,samples_per_s,tokens_per_s,mfu,
// bubble_fraction,busy_s,exposed_comm_s,comm_bytes`, one row per iteration; numbers
// round-trip exactly.
std::string write_metrics_csv(const Metrics& metrics, const Trace& trace);

}  // namespace hetflow::traces
