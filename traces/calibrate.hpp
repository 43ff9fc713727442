#pragma once
// Calibration from measured traces: what the devices and links of a cluster really do, fitted
// to the tasks of one or more runs, as a model::Calibration that plan, simulate and replay
// read back.
//
// What is fitted, and from what (every trace with the plan it ran):
//  - Compute, per GPU type and task kind (forward, backward, backward_weight, optimizer): a
//    task's duration (end - start, its median over the iterations after the first) against
//    its FLOPs, to model::Efficiency's curve
//      time = overhead + F / (P * max_efficiency * (1 - exp(-F / saturation_flops)))
//    by weighted least squares on relative error: for each saturation_flops of a log grid
//    (refined by golden section) the overhead and 1 / max_efficiency are linear. It needs
//    three or more distinct task sizes (within 5 %
//    of each other two count as one); with two the curve is flat (saturation_flops 0),
//    with one the overhead is the prior's and only max_efficiency is fitted (said so in
//    the note). Several traces (other micro-batch sizes, other stage cuts) give more sizes.
//  - Dispatch, per GPU type: the time between a compute task being ready (its stream's
//    previous task and every task it depends on have ended) and its start: the hand-off
//    that no task's duration contains (a thread waking, a kernel queued behind others). Its
//    mean over each run's task instances (the gaps add up to the iteration time, long ones
//    included), and the median of that over the runs (a run in a busier spell of a shared
//    host does not move it).
//  - Links, per link class: each transfer's time from both sides being ready to the data
//    being received (recv end - max(ready of send, ready of recv)), and each collective's
//    from its last member being ready to its last member ending, against the nominal
//    model of the same transfer split into its latency part A and bandwidth part B:
//      time = latency_factor * A + B / bandwidth_factor
//    least squares on relative error, per class (a route's class is its slowest link's).
//    With a single message size only the bandwidth factor is fitted (latency factor kept).
// Each fit reports its observations and its residual: the root mean square of the relative
// errors of the fitted model against the observations.
#include <string>
#include <vector>

#include "model/calibration.hpp"
#include "partition/plan.hpp"
#include "traces/trace.hpp"

namespace hetflow::traces {

struct MeasuredRun {
  const Trace* trace = nullptr;
  const partition::Plan* plan = nullptr;  // the plan the trace ran, for its iteration count
  std::string name;                       // for messages: the trace's file
};

struct ComputeFit {
  std::string gpu;   // GPU type
  std::string kind;  // task kind
  int observations = 0;
  int sizes = 0;     // distinct FLOP counts
  model::Efficiency efficiency;
  double residual = 0;  // RMS relative error
  std::string note;     // what could not be fitted, when anything
};

struct DispatchFit {
  std::string gpu;
  int observations = 0;    // task instances
  int runs = 0;            // traces that ran the GPU type
  double dispatch_s = 0;   // the median over the runs of each run's mean
};

struct LinkFit {
  std::string link_class;
  int observations = 0;
  int sizes = 0;  // distinct byte counts
  model::LinkCalibration factors;
  double nominal_latency_s = 0;                // of the class's fastest observed route
  double nominal_bandwidth_bytes_per_s = 0;
  double residual = 0;
  std::string note;
};

// A GPU type's peak as a run's plan gives it (for cpu-N:probed, the speed probed when the
// plan was made).
struct PeakSeen {
  std::string gpu;
  std::string run;
  double peak_flops_per_s = 0;
};

struct CalibrationFit {
  std::vector<ComputeFit> compute;
  std::vector<DispatchFit> dispatch;
  std::vector<LinkFit> links;
  std::vector<PeakSeen> peaks;  // per GPU type and run
  // What not to take on trust: an efficiency at its cap of 1 with a residual above 10 % (the
  // peak is too low for these runs: a probed speed, a wrong GPU type or precision); a link
  // fitted faster than any physical link of its class (an in-process copy, not a wire); a
  // GPU type whose peak differs by more than 10 % between runs (a probed speed that moved).
  std::vector<std::string> warnings;
  model::Calibration calibration;  // the prior with every fitted value replaced
};

// Throws InputError (naming the run) when a trace is not its plan's (fingerprint), has no
// compute events, or names tasks the plan lacks. `prior` gives what is not fitted.
CalibrationFit calibrate(const std::vector<MeasuredRun>& runs, const model::Calibration& prior = {});

// When each event of the trace could have started: the latest end of the tasks it waits for
// (the previous task on its stream, its dependencies in the plan, for a receive nothing but
// its turn); its own start where it waits for nothing in the trace. Index = event index.
std::vector<double> ready_times(const Trace& trace, const partition::Plan& plan);

}  // namespace hetflow::traces
