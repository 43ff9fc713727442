#pragma once
// What a run measured, beside the simulator's prediction and the analytic estimate of the
// same plan (its compute scaled as the run scaled it): per step, the steady-state figures
// (iteration time, throughput, MFU), per device utilisation and busy time.
#include <string>
#include <vector>

#include "exec/engine.hpp"
#include "model/calibration.hpp"
#include "model/precision.hpp"
#include "partition/estimate.hpp"
#include "partition/plan.hpp"
#include "run/run.hpp"
#include "traces/metrics.hpp"
#include "traces/trace.hpp"

namespace hetflow::run {

// A run's figures, per step and in the steady state after the warm-up.
struct Figures {
  std::vector<double> step_s;  // per iteration (warm-up included)
  double iteration_time_s = 0;  // mean over the steps after the warm-up
  double samples_per_s = 0, tokens_per_s = 0;
  double mfu = 0, analytic_mfu = 0;  // model FLOPs per second over the devices' peak
  std::vector<double> losses;  // per step, real math only
  // per step, real math of a mixture of experts only: the load-balancing loss before its
  // coefficient (exec::Training::balance_losses)
  std::vector<double> balance_losses;
  std::vector<double> learning_rates;  // per step, real math only; NaN: skipped (gradients not finite)
};

// Per step, and the mean after the warm-up, of the iterations that ran whole: a run that
// stopped counts its steps up to the first with a task missing (its trace has them all).
// Fills step_s, iteration_time_s, samples_per_s and tokens_per_s.
Figures step_figures(const traces::Trace& trace, const partition::Plan& plan, int warmup);

// The precision the run's GEMMs multiply at, whose peak MFU is measured against: a proxy's
// the plan's; the real math's FP32, but on GPUs bf16 operands for a bf16 plan and fp16 ones
// for a loss-scaled fp16 plan.
model::Precision gemm_precision(const Request& r, bool real);

// MFU (traces/figures.hpp) of an iteration of this length: the model's FLOPs over the
// devices' peak at `precision`; a proxy run scaled by `flop_scale` does that share of them.
double mfu(const partition::Plan& plan, double iteration_time_s, model::Precision precision, double flop_scale);

// The simulator's prediction for the plan that ran (compute scaled as the run scaled it).
struct Simulated {
  bool completed = false;
  std::string error;  // why there is no prediction: the simulation's stall or error
  Figures f;          // step_s, iteration_time_s, samples_per_s, tokens_per_s, mfu
  traces::Metrics m;  // the simulated trace's metrics
};

// Simulates `scaled_plan` with `calibration` and measures its trace as the run's is
// measured. A simulation that does not complete or fails is reported in the result.
Simulated simulate_same(const partition::Plan& scaled_plan, const model::Calibration& calibration, int warmup,
                        const partition::CostModel& cost, model::Precision precision, double flop_scale);

// What the plan's memory model gives the model itself on a device: all of it but the
// workspace reserve (cuBLAS and NCCL buffers, fragmentation), which the real math's arrays
// do not include.
double model_bytes_planned(const partition::DeviceMemory& m);

// A run beside its predictions.
struct Comparison {
  partition::Estimate analytic;     // the analytic estimate of the plan as run
  model::Precision gemms = model::Precision::fp32;  // the precision MFU is measured at
  Figures measured;                 // the run's, with its MFU, the estimate's MFU, losses and rates
  Simulated simulated;              // the simulator's (not tried when the run did not complete)
  traces::Metrics metrics;          // the run's trace measured as run, at the GEMMs' precision
};

// The run's figures beside the simulator's and the estimate's, with `calibration` (which
// `hetflow run --calibration` gives the simulator and the cost model).
Comparison compare(const Request& r, const TrainingSetup& t, const exec::RunResult& result,
                   const model::Calibration& calibration);

}  // namespace hetflow::run
