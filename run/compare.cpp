#include "run/compare.hpp"

#include <algorithm>

#include "model/error.hpp"
#include "sim/simulator.hpp"
#include "traces/figures.hpp"

namespace hetflow::run {

namespace {

// The devices' summed peak at the precision the run computes in (FP32 for real math on the
// CPU back end, the plan's otherwise).
double peak_flops_per_s(const partition::Plan& plan, model::Precision precision) {
  double peak = 0;
  for (const model::Device& d : plan.cluster.devices()) peak += plan.cluster.device_gpu(d).peak_flops_per_s(precision);
  return peak;
}

}  // namespace

Figures step_figures(const traces::Trace& trace, const partition::Plan& plan, int warmup) {
  Figures f;
  std::vector<double> end(static_cast<size_t>(plan.iterations()), 0);
  std::vector<size_t> tasks(end.size(), 0);
  for (const traces::Event& e : trace.events) {
    if (e.iteration < 0 || e.iteration >= plan.iterations() || e.message >= 0) continue;  // (tasks, not their messages)
    end[static_cast<size_t>(e.iteration)] = std::max(end[static_cast<size_t>(e.iteration)], e.end_s);
    ++tasks[static_cast<size_t>(e.iteration)];
  }
  const auto whole = std::find_if(tasks.begin(), tasks.end(), [&](size_t n) { return n < plan.tasks.size(); });
  end.resize(static_cast<size_t>(whole - tasks.begin()));
  double previous = 0, total = 0;
  int measured = 0;
  for (size_t i = 0; i < end.size(); ++i) {
    end[i] = std::max(end[i], previous);
    f.step_s.push_back(end[i] - previous);
    if (static_cast<int>(i) >= warmup) {
      total += end[i] - previous;
      ++measured;
    }
    previous = end[i];
  }
  f.iteration_time_s = measured > 0 ? total / measured : 0;
  if (f.iteration_time_s > 0) {
    f.samples_per_s = plan.layout.samples_per_iteration() / f.iteration_time_s;
    f.tokens_per_s = f.samples_per_s * plan.network.tokens_per_sample;
  }
  return f;
}

model::Precision gemm_precision(const Request& r, bool real) {
  const model::Precision p = r.plan.layout.precision;
  if (!real) return p;
  if (r.backend == "cuda" && p == model::Precision::bf16) return p;
  if (r.backend == "cuda" && p == model::Precision::fp16 && r.optimizer.loss_scale.active()) return p;
  return model::Precision::fp32;
}

double mfu(const partition::Plan& plan, double iteration_time_s, model::Precision precision, double flop_scale) {
  const double model_flops =
      plan.network.training_flops_per_sample() * plan.layout.samples_per_iteration() * flop_scale;
  return traces::mfu(model_flops, iteration_time_s, peak_flops_per_s(plan, precision));
}

Simulated simulate_same(const partition::Plan& scaled_plan, const model::Calibration& calibration, int warmup,
                        const partition::CostModel& cost, model::Precision precision, double flop_scale) {
  Simulated out;
  sim::SimOptions options;
  options.calibration = calibration;
  try {
    const sim::SimResult r = sim::simulate(scaled_plan, options);
    out.completed = r.completed;
    if (!r.completed) {
      out.error = r.stalls.empty() ? "the simulation did not complete" : r.stalls.front();
      return out;
    }
    out.f = step_figures(r.trace, scaled_plan, warmup);
    out.f.mfu = mfu(scaled_plan, out.f.iteration_time_s, precision, flop_scale);
    out.m = traces::compute_metrics(r.trace, scaled_plan, cost, warmup);
  } catch (const Error& e) {
    out.error = e.what();
  }
  return out;
}

double model_bytes_planned(const partition::DeviceMemory& m) { return m.total_bytes() - m.workspace_bytes; }

Comparison compare(const Request& r, const TrainingSetup& t, const exec::RunResult& result,
                   const model::Calibration& calibration) {
  const partition::Plan& plan = r.plan;
  const partition::Plan as_run = run::as_run(plan, r);
  const partition::CostModel cost(plan.cluster, plan.layout.precision, calibration);
  Comparison c;
  c.analytic = partition::estimate_plan(as_run, cost);
  c.gemms = gemm_precision(r, t.training != nullptr);
  Figures& f = c.measured;
  f = step_figures(result.trace, plan, r.warmup);
  f.mfu = mfu(plan, f.iteration_time_s, c.gemms, r.flop_scale);
  f.analytic_mfu = mfu(plan, c.analytic.iteration_time_s, c.gemms, r.flop_scale);
  // The metrics (the --metrics CSV's MFU among them) count as the report does: the FLOPs the
  // run did, over the devices' peak at the precision its GEMMs multiplied in.
  const partition::CostModel at_gemms(plan.cluster, c.gemms, calibration);
  if (result.completed) c.simulated = simulate_same(as_run, calibration, r.warmup, at_gemms, c.gemms, r.flop_scale);
  if (t.training) {
    f.losses = t.training->losses();
    f.balance_losses = t.training->balance_losses();
    if (f.balance_losses.size() > f.step_s.size()) f.balance_losses.resize(f.step_s.size());
    f.learning_rates = t.training->learning_rates();
    if (f.losses.size() > f.step_s.size()) f.losses.resize(f.step_s.size());  // (a stopped step's is partial)
    if (f.learning_rates.size() > f.losses.size()) f.learning_rates.resize(f.losses.size());
  }
  c.metrics = traces::compute_metrics(result.trace, as_run, at_gemms, r.warmup);
  return c;
}

}  // namespace hetflow::run
