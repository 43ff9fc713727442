#include "tools/run_report.hpp"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <ostream>
#include <sstream>

#include "model/units.hpp"
#include "partition/loading.hpp"
#include "tools/plan_summary.hpp"
#include "traces/metrics.hpp"

namespace hetflow::tools {

namespace {

namespace u = model::units;

using run::model_bytes_planned;

// A table cell `width` wide, right-aligned, always after a space: a value too wide for its
// column pushes the rest of the row right instead of running into its neighbour.
std::string cell(const std::string& text, int width) {
  const auto pad = static_cast<size_t>(std::max(0, width - 1 - static_cast<int>(text.size())));
  return " " + std::string(pad, ' ') + text;
}

// The row's name, left-aligned in `width` (a longer name keeps its space before the cells).
std::string name_cell(const std::string& text, int width) {
  return "  " + text + std::string(static_cast<size_t>(std::max(0, width - static_cast<int>(text.size()))), ' ');
}

// Where the plan has load tasks: what the executor's loader did (read each micro-batch, and
// the throttle), its closed form as the simulator's prediction has it, and the measured rate
// against it.
void print_loader(std::ostream& out, const run::Request& r, const traces::Metrics& m, double measured_samples_per_s,
                  double compute_samples_per_s) {
  const partition::Plan as_run = run::as_run(r.plan, r);
  const partition::LoaderBound b = partition::loader_bound(as_run);
  if (!b.bounded) return;
  out << "  loader: a load task per micro-batch";
  const auto waited = [&] {
    out << "  waiting for the loader: " << u::human_time_s(m.input_wait_s) << " of each iteration's "
        << u::human_time_s(m.iteration_time_s) << " (mean over the devices; apart from the bubble fraction, " << std::fixed
        << std::setprecision(1) << 100 * m.bubble_fraction << " %)\n" << std::defaultfloat;
  };
  if (r.loader_throttle_s_per_sample <= 0) {
    out << ", unthrottled (--loader-throttle slows it)\n";
    waited();
    return;
  }
  out << ", throttled to " << u::human_time_s(r.loader_throttle_s_per_sample) << " a sample on each node\n";
  print_input_bound(out, as_run, compute_samples_per_s);
  out << "  measured " << std::fixed << std::setprecision(2) << measured_samples_per_s << " samples/s, "
      << std::setprecision(1) << 100 * measured_samples_per_s / b.samples_per_s << " % of the loader's\n"
      << std::defaultfloat;
  waited();
}

// --save-interval's checkpoints: after which steps, and how long the run stood to write them.
void print_checkpoints(std::ostream& out, const run::Request& r, const run::TrainingSetup& t,
                       const std::vector<exec::Pause>& checkpoints) {
  out << "  checkpoints: " << r.save_checkpoint << " written after step";
  for (size_t k = 0; k < checkpoints.size(); ++k) {
    out << (k == 0 ? (checkpoints.size() > 1 ? "s " : " ") : ", ") << t.resumed_iterations + checkpoints[k].after_iterations;
  }
  std::vector<double> s;
  for (const exec::Pause& p : checkpoints) s.push_back(p.s);
  std::sort(s.begin(), s.end());
  out << " (every " << r.save_interval << ", each replacing the last) in " << u::human_time_s(s[(s.size() - 1) / 2])
      << (s.size() > 1 ? " each (median; longest " + u::human_time_s(s.back()) + ")" : "")
      << " to gather and write, left out of the step times\n";
}

}  // namespace

Json run_report_json(const run::Request& r, const run::TrainingSetup& t, const exec::RunResult& result,
                     const run::Comparison& c, int ranks, double watchdog_s, const std::vector<exec::Pause>& checkpoints) {
  const partition::Plan& plan = r.plan;
  const run::Figures& f = c.measured;
  const traces::Metrics& m = c.metrics;
  const partition::Estimate& e = c.analytic;
  const run::Simulated& sim = c.simulated;
  Json j;
  j["completed"] = result.completed;
  j["error"] = result.error;
  j["stalled"] = result.stalled;
  j["fingerprint"] = plan.fingerprint;
  j["backend"] = r.backend;
  j["ranks"] = ranks;
  j["compute"] = result.trace.compute;
  if (!t.proxy_reason.empty()) j["proxy_reason"] = t.proxy_reason;
  if (t.training) {
    j["model"] = t.training->describe();
    j["data"] = t.data;
    // (Steps are numbered from this run's first; a resumed run's first is the checkpoint's next.)
    if (!r.resume.empty()) j["resumed_from"] = {{"path", r.resume}, {"iterations", t.resumed_iterations}};
    if (t.entropy_nats > 0) j["data_entropy_nats"] = t.entropy_nats;
    j["optimizer"] = {{"lr", r.optimizer.lr}, {"adam_beta1", r.optimizer.adam_beta1}, {"adam_beta2", r.optimizer.adam_beta2},
                      {"adam_eps", r.optimizer.adam_eps}, {"weight_decay", r.optimizer.weight_decay},
                      {"clip_grad", r.optimizer.clip_grad},
                      {"moe_router_bias_update_rate", r.optimizer.moe_router_bias_update_rate},
                      {"lr_decay_style", std::string(exec::to_string(r.optimizer.lr_decay_style))},
                      {"min_lr", r.optimizer.min_lr}, {"lr_warmup_iters", r.optimizer.lr_warmup_iters},
                      {"lr_decay_iters", r.optimizer.lr_decay_iters}};
    if (r.optimizer.loss_scale.active()) {
      j["loss_scale"] = t.training->loss_scale();
      j["skipped_steps"] = t.training->skipped_steps();
    }
  }
  j["flop_scale"] = r.flop_scale;
  j["watchdog_s"] = watchdog_s;
  j["warmup"] = r.warmup;
  Json steps = Json::array();
  for (size_t i = 0; i < f.step_s.size(); ++i) {
    // (A resumed run's steps go on from its checkpoint's.)
    Json step = {{"step", t.resumed_iterations + static_cast<long long>(i)}, {"time_s", f.step_s[i]},
                 {"warmup", static_cast<int>(i) < r.warmup}};
    if (i < f.losses.size()) step["loss"] = f.losses[i];
    if (i < f.balance_losses.size()) step["load_balancing_loss"] = f.balance_losses[i];
    if (i < f.learning_rates.size()) {
      const double lr = f.learning_rates[i];
      step["lr"] = std::isnan(lr) ? Json(nullptr) : Json(lr);  // null: skipped (gradients not finite)
    }
    steps.push_back(std::move(step));
  }
  j["steps"] = std::move(steps);
  if (r.save_interval > 0) {
    // (The pauses are left out of the steps' times and of the trace's timeline.)
    Json written = Json::array();
    for (const exec::Pause& p : checkpoints) {
      written.push_back({{"after_step", t.resumed_iterations + p.after_iterations}, {"write_s", p.s}});
    }
    j["save_interval"] = r.save_interval;
    j["checkpoints"] = std::move(written);
  }
  j["iteration_time_s"] = f.iteration_time_s;
  j["analytic_iteration_time_s"] = e.iteration_time_s;
  j["iteration_time_error"] = relative_error(f.iteration_time_s, e.iteration_time_s);
  j["throughput_samples_per_s"] = f.samples_per_s;
  j["analytic_throughput_samples_per_s"] = e.throughput_samples_per_s;
  j["throughput_tokens_per_s"] = f.tokens_per_s;
  j["analytic_throughput_tokens_per_s"] = e.throughput_tokens_per_s;
  j["mfu"] = f.mfu;
  j["analytic_mfu"] = f.analytic_mfu;
  if (!m.over_peak.empty()) j["mfu_overstated"] = traces::over_peak_cause(m);
  j["simulated"] = sim.completed;
  if (!sim.error.empty()) j["simulation_error"] = sim.error;
  if (sim.completed) {
    j["simulated_iteration_time_s"] = sim.f.iteration_time_s;
    j["simulated_iteration_time_error"] = relative_error(f.iteration_time_s, sim.f.iteration_time_s);
    j["simulated_throughput_samples_per_s"] = sim.f.samples_per_s;
    j["simulated_throughput_tokens_per_s"] = sim.f.tokens_per_s;
    j["simulated_mfu"] = sim.f.mfu;
  }
  // The executor's loader (run::as_run's input path: the throttle, or unbounded) against
  // what the estimate says the devices could take, and what the run measured against it.
  if (Json loader = input_bound_json(run::as_run(plan, r), e.compute_throughput_samples_per_s); !loader.is_null()) {
    loader["throttle_s_per_sample"] = r.loader_throttle_s_per_sample;
    const double bound = loader["loader_samples_per_s"].is_null() ? 0.0 : loader["loader_samples_per_s"].get<double>();
    loader["measured_over_loader"] = bound > 0 ? Json(f.samples_per_s / bound) : Json(nullptr);
    loader["input_wait_s"] = m.input_wait_s;  // per iteration, mean over computing devices
    j["loader"] = std::move(loader);
  }
  j["wall_s"] = result.wall_s;
  j["task_instances"] = result.task_instances;
  Json devices = Json::array();
  for (size_t d = 0; d < static_cast<size_t>(plan.device_count()); ++d) {
    const double analytic_util = e.iteration_time_s > 0 ? e.busy_s[d] / e.iteration_time_s : 0;
    devices.push_back({{"name", plan.device_names[d]},
                       {"busy_s", d < m.devices.size() ? m.devices[d].busy_s : 0},
                       {"analytic_busy_s", e.busy_s[d]},
                       {"utilization", d < m.devices.size() ? m.devices[d].utilization : 0},
                       {"input_wait_s", d < m.devices.size() ? m.devices[d].input_wait_s : 0},
                       {"analytic_utilization", analytic_util},
                       {"simulated_utilization", sim.completed && d < sim.m.devices.size() ? sim.m.devices[d].utilization : 0},
                       {"simulated_busy_s", sim.completed && d < sim.m.devices.size() ? sim.m.devices[d].busy_s : 0},
                       {"peak_transient_bytes", result.memory[d].peak_transient_bytes},
                       {"plan_transient_bytes", plan.memory[d].activations_bytes + plan.memory[d].buffers_bytes},
                       {"persistent_bytes", result.memory[d].persistent_bytes},
                       {"peak_allocated_bytes", result.memory[d].peak_allocated_bytes},
                       {"peak_model_bytes", result.memory[d].peak_model_bytes},
                       {"plan_model_bytes", model_bytes_planned(plan.memory[d])}});
  }
  j["devices"] = std::move(devices);
  return j;
}

void print_run_report(std::ostream& out, const run::Request& r, const run::TrainingSetup& t, const exec::RunResult& result,
                      const run::Comparison& c, int ranks, const std::vector<exec::Pause>& checkpoints) {
  const partition::Plan& plan = r.plan;
  const run::Figures& f = c.measured;
  const traces::Metrics& m = c.metrics;
  const partition::Estimate& e = c.analytic;
  const run::Simulated& sim = c.simulated;
  // (A schedule's rates are worth a column; a constant rate is said once.)
  const bool scheduled = r.optimizer.lr_decay_style != exec::LrSchedule::Style::constant || r.optimizer.lr_warmup_iters > 0;
  print_layout(out, plan);
  out << "\nran " << plan.network.name << " on " << plan.cluster.name << " (backend " << r.backend;
  if (ranks > 1) out << " in " << ranks << " MPI ranks";
  out << ", compute " << result.trace.compute;
  if (t.training) {
    out << ": the model's training math in FP32";
    if (r.backend == "cuda" && plan.layout.precision == model::Precision::bf16) {
      out << ", the linear layers' operands in bf16";
    } else if (r.backend == "cuda" && plan.layout.precision == model::Precision::fp16 && r.optimizer.loss_scale.active()) {
      out << ", the linear layers' operands in fp16 (loss scaled)";
    } else if (plan.layout.precision != model::Precision::fp32) {
      out << " (the plan says " << to_string(plan.layout.precision) << ")";
    }
  } else {
    out << (r.backend == "cuda" ? ": FLOP-matched cublasGemmEx" : ": FLOP-matched sgemm") << ", not the model's math";
    if (r.flop_scale != 1) out << ", FLOPs x " << r.flop_scale;
  }
  out << "): " << result.task_instances << " task instances in " << u::human_time_s(result.wall_s) << "\n";
  if (!t.proxy_reason.empty()) out << "  proxies because " << t.proxy_reason << "\n";
  if (t.training) {
    out << "  model: " << t.training->describe() << "\n  data: " << t.data
        << (t.entropy_nats > 0 ? " (the loss a perfect model reaches)" : "") << "\n";
    if (!r.resume.empty()) {
      out << "  resumed from " << r.resume << " after its " << t.resumed_iterations << " steps: this run's go on from step "
          << t.resumed_iterations << "\n";
    }
    out << "  AdamW lr " << r.optimizer.lr;
    if (scheduled) {
      out << " (" << r.optimizer.schedule().describe() << ")";
    }
    out << ", betas " << r.optimizer.adam_beta1 << " " << r.optimizer.adam_beta2
        << ", eps " << r.optimizer.adam_eps << ", weight decay " << r.optimizer.weight_decay << ", clip-grad "
        << r.optimizer.clip_grad << "\n";
    if (!f.balance_losses.empty()) {
      out << "  balance: each step's load-balancing loss over the MoE layers (Megatron-Core's, before its "
             "coefficient; 1 when the routers spread the copies evenly)\n";
    }
    if (r.optimizer.loss_scale.active()) {
      out << "  loss scale " << t.training->loss_scale()
          << (r.optimizer.loss_scale.loss_scale > 0 ? " (constant)" : " (dynamic, after the last step)") << ", "
          << t.training->skipped_steps() << " step(s) skipped: gradients not finite\n";
    }
  }
  for (size_t i = 0; i < f.step_s.size(); ++i) {
    out << "  step " << std::setw(3) << t.resumed_iterations + static_cast<long long>(i) << "  " << std::setw(9) << u::human_time_s(f.step_s[i]);
    if (i < f.losses.size()) out << "  loss " << std::fixed << std::setprecision(6) << f.losses[i] << std::defaultfloat;
    if (i < f.balance_losses.size()) {
      out << "  balance " << std::fixed << std::setprecision(4) << f.balance_losses[i] << std::defaultfloat;
    }
    const double lr = i < f.learning_rates.size() ? f.learning_rates[i] : 0;
    if (std::isnan(lr)) {
      out << "  skipped: gradients not finite";
    } else if (scheduled && i < f.learning_rates.size()) {
      const std::streamsize precision = out.precision(4);
      out << "  lr " << lr;
      out.precision(precision);
    }
    out << (static_cast<int>(i) < r.warmup ? "   (warm-up)" : "") << "\n";
  }
  if (!checkpoints.empty()) print_checkpoints(out, r, t, checkpoints);
  out << "\n" << name_cell("", 16) << cell("measured", 12) << cell("simulated", 13) << cell("error", 10)
      << cell("estimate", 12) << cell("error", 10) << "\n";
  // Each figure beside the simulator's prediction and the analytic estimate of the same plan.
  auto row = [&](const std::string& what, double measured, double simulated, double estimate, auto show) {
    out << name_cell(what, 16) << cell(show(measured), 12) << cell(sim.completed ? show(simulated) : "-", 13)
        << cell(sim.completed ? signed_percent(relative_error(measured, simulated)) : "-", 10) << cell(show(estimate), 12)
        << cell(signed_percent(relative_error(measured, estimate)), 10) << "\n";
  };
  auto number = [](int precision) {
    return [precision](double x) {
      std::ostringstream s;
      s << std::fixed << std::setprecision(precision) << x;
      return s.str();
    };
  };
  auto time = [](double x) { return u::human_time_s(x); };
  auto share = [](double x) {
    std::ostringstream s;
    s << std::fixed << std::setprecision(1) << 100 * x << " %";
    return s.str();
  };
  row("iteration time", f.iteration_time_s, sim.f.iteration_time_s, e.iteration_time_s, time);
  row("samples/s", f.samples_per_s, sim.f.samples_per_s, e.throughput_samples_per_s, number(2));
  if (plan.network.tokens_per_sample > 1) row("tokens/s", f.tokens_per_s, sim.f.tokens_per_s, e.throughput_tokens_per_s, number(0));
  row("MFU", f.mfu, sim.f.mfu, f.analytic_mfu, share);
  if (const std::string cause = traces::over_peak_cause(m); !cause.empty()) out << "  (MFU: " << cause << ")\n";
  if (!sim.error.empty()) out << "  (no simulation: " << sim.error << ")\n";
  print_loader(out, r, m, f.samples_per_s, e.compute_throughput_samples_per_s);
  out << "\n" << name_cell("device", 16) << cell("utilization", 13) << cell("simulated", 11) << cell("compute", 12)
      << cell("simulated", 11) << cell("peak tensors", 17) << cell("plan", 11) << "\n";
  size_t shown = 0;
  for (size_t d = 0; d < static_cast<size_t>(plan.device_count()); ++d) {
    if (e.busy_s[d] == 0 && result.memory[d].peak_transient_bytes == 0) continue;
    if (++shown > 32) continue;
    const double util = d < m.devices.size() ? m.devices[d].utilization : 0;
    const double busy = d < m.devices.size() ? m.devices[d].busy_s : 0;
    const bool has_sim = sim.completed && d < sim.m.devices.size();
    out << name_cell(plan.device_names[d], 16) << cell(share(util), 13)
        << cell(has_sim ? share(sim.m.devices[d].utilization) : "-", 11) << cell(u::human_time_s(busy), 12)
        << cell(has_sim ? u::human_time_s(sim.m.devices[d].busy_s) : "-", 11)
        << cell(u::human_bytes(result.memory[d].peak_transient_bytes), 17)
        << cell(u::human_bytes(plan.memory[d].activations_bytes + plan.memory[d].buffers_bytes), 11) << "\n";
  }
  if (shown > 32) out << "  ... and " << shown - 32 << " more devices (--json lists all)\n";
  out << "  (peak tensors: transient tensors alive at once, by the plan's bytes; ";
  if (t.training) {
    out << "host buffers hold exactly the FP32 activations that travel, the rest is the model's own)\n";
  } else {
    out << "host buffers are capped at " << u::human_bytes(r.max_buffer_bytes) << " each)\n";
  }
  if (!t.training) return;
  // The model's own memory, measured, beside the plan's memory model of the same device.
  out << "\n" << name_cell("device", 16) << cell("model peak", 13) << cell("plan", 13) << cell("error", 10) << "\n";
  shown = 0;
  for (size_t d = 0; d < static_cast<size_t>(plan.device_count()); ++d) {
    const double measured = result.memory[d].peak_model_bytes, planned = model_bytes_planned(plan.memory[d]);
    if (measured == 0 || ++shown > 32) continue;
    out << name_cell(plan.device_names[d], 16) << cell(u::human_bytes(measured), 13)
        << cell(u::human_bytes(planned), 13) << cell(signed_percent(relative_error(measured, planned)), 10) << "\n";
  }
  if (shown > 32) out << "  ... and " << shown - 32 << " more devices (--json lists all)\n";
  out << "  (model peak: the real math's arrays alive at once (parameters, gradients, AdamW moments, what the\n"
      << "   backward keeps, temporaries), FP32; plan: its memory model's weights, gradients, optimizer state,\n"
      << "   activations and buffers in " << to_string(plan.layout.precision) << ", without the workspace reserve)\n";
  if (plan.layout.sync.zero.stage > 0 && plan.layout.workers.size() > 1) {
    // (exec/chunk_state.hpp's keep_owned_state; stage 3's gathered copies are transient.)
    const int stage = plan.layout.sync.zero.stage;
    out << "  (ZeRO stage " << stage << ": every replica here keeps the AdamW moments"
        << (stage >= 3 ? ", gradients and parameters" : stage >= 2 ? " and gradients" : "")
        << " of its shard alone, as the plan counts them)\n";
  }
  if (plan.layout.offload.optimizer) {
    out << "  (optimizer offloaded: the plan keeps AdamW's state in host memory, " << u::human_bytes(plan.memory[0].host_bytes)
        << " for the first device with its staging buffers, which the plan column leaves out; here the host's memory is the"
        << " device's and the model peak holds the moments)\n";
  }
  if (plan.layout.offload.activations) {
    out << "  (stashes offloaded: each leaves the chunk's arrays after its forward and comes back before its backward,"
        << " so the model peak holds the stashes in use; the host's copies are not counted)\n";
  }
}

}  // namespace hetflow::tools
