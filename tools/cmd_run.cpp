// hetflow run: execute a plan (a file, or built from the plan options) on a back end; print
// each step's time (and loss, when it trains) and the measured figures beside the
// simulator's prediction and the analytic estimate of the same plan; write the trace. Three steps, as in simulate: read what was asked, run it, report it.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iomanip>
#include <iostream>
#include <ostream>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>

#include "exec/checkpoint.hpp"
#include "exec/cpu_backend.hpp"
#include "exec/cuda_backend.hpp"
#include "exec/engine.hpp"
#include "exec/interrupt.hpp"
#include "exec/ranks.hpp"
#include "exec/safetensors.hpp"
#include "exec/token_data.hpp"
#include "exec/training.hpp"
#include "kernels/transformer_cuda.hpp"
#include "model/error.hpp"
#include "model/units.hpp"
#include "partition/estimate.hpp"
#include "partition/plan_io.hpp"
#include "partition/validate.hpp"
#include "sim/simulator.hpp"
#include "tools/cli.hpp"
#include "tools/options.hpp"
#include "tools/plan_options.hpp"
#include "tools/plan_summary.hpp"
#include "tools/run_prediction.hpp"
#include "tools/run_progress.hpp"
#include "traces/figures.hpp"
#include "traces/metrics.hpp"
#include "traces/trace_io.hpp"

namespace hetflow::tools {

namespace {

namespace u = model::units;

struct Request {
  partition::Plan plan;
  std::string backend = "cpu";  // cpu | cuda
  int warmup = 1;
  int steps = 3;
  double watchdog_s = 60;
  double flop_scale = 1;
  double max_buffer_bytes = 4.0 * 1024 * 1024;
  std::string compute = "auto";  // auto | real | proxy
  std::string data_path, init_weights, save_weights;
  std::uint64_t seed = 1234;
  exec::OptimizerOptions optimizer;
};

// Real math when asked for, or (auto) when the plan is one it covers; why not otherwise.
struct TrainingSetup {
  std::unique_ptr<exec::Training> training;
  std::string proxy_reason;  // auto fell back to proxies: why
  std::string data;          // what the tokens are
  double entropy_nats = 0;   // the synthetic stream's: the loss floor
};

template <typename Parse>
double parsed(const po::variables_map& vm, const char* name, Parse parse) {
  try {
    return parse(vm[name].as<std::string>());
  } catch (const std::invalid_argument& e) {
    throw InputError("<command line>", 0, std::string("--") + name, e.what());
  }
}

// --- step 1: what was asked ---

Request read_request(po::variables_map& vm) {
  const std::string backend = vm["backend"].as<std::string>();
  if (backend != "cpu" && backend != "cuda") {
    throw InputError("<command line>", 0, "--backend", "expected cpu or cuda, found '" + backend + "'");
  }
  Request r;
  r.backend = backend;
  r.steps = int_option_in(vm, "steps", 1, 1'000'000);
  r.warmup = int_option_in(vm, "warmup", 0, 1'000'000);
  r.watchdog_s = parsed(vm, "watchdog", u::parse_time_s);
  if (!(r.watchdog_s > 0 && r.watchdog_s <= 86400)) {
    throw InputError("<command line>", 0, "--watchdog", "expected a time above 0 and at most 1 day, found '" +
                                                            vm["watchdog"].as<std::string>() + "'");
  }
  r.flop_scale = parsed(vm, "flop-scale", u::parse_number);
  if (!(r.flop_scale > 0 && r.flop_scale <= 1e6)) {
    throw InputError("<command line>", 0, "--flop-scale", "expected a factor above 0 and at most 1e6, found '" +
                                                              vm["flop-scale"].as<std::string>() + "'");
  }
  r.max_buffer_bytes = parsed(vm, "max-buffer", u::parse_bytes);
  if (!(r.max_buffer_bytes >= 0 && r.max_buffer_bytes <= 1024.0 * 1024 * 1024)) {
    throw InputError("<command line>", 0, "--max-buffer", "expected a size between 0 and 1 GiB, found '" +
                                                              vm["max-buffer"].as<std::string>() + "'");
  }
  r.compute = vm["compute"].as<std::string>();
  if (r.compute != "auto" && r.compute != "real" && r.compute != "proxy") {
    throw InputError("<command line>", 0, "--compute", "expected auto, real or proxy, found '" + r.compute + "'");
  }
  if (vm.count("data-path")) r.data_path = vm["data-path"].as<std::string>();
  if (vm.count("init-weights")) r.init_weights = vm["init-weights"].as<std::string>();
  if (vm.count("save-weights")) r.save_weights = vm["save-weights"].as<std::string>();
  const long long seed = vm["seed"].as<long long>();
  if (seed < 0) {
    throw InputError("<command line>", 0, "--seed", "expected a whole number >= 0, found " + std::to_string(seed));
  }
  r.seed = static_cast<std::uint64_t>(seed);
  auto number = [&](const char* name, double low, double high, bool low_open) {
    const double x = parsed(vm, name, u::parse_number);
    if (!(low_open ? x > low : x >= low) || !(x <= high)) {
      throw InputError("<command line>", 0, std::string("--") + name,
                       "expected a number " + std::string(low_open ? "above " : "from ") + u::format_number(low) +
                           " to " + u::format_number(high) + ", found '" + vm[name].as<std::string>() + "'");
    }
    return x;
  };
  r.optimizer.lr = number("lr", 0, 10, false);
  r.optimizer.adam_beta1 = number("adam-beta1", 0, 0.999999, false);
  r.optimizer.adam_beta2 = number("adam-beta2", 0, 0.999999999, false);
  r.optimizer.adam_eps = number("adam-eps", 0, 1, true);
  r.optimizer.weight_decay = number("weight-decay", 0, 10, false);
  r.optimizer.clip_grad = number("clip-grad", 0, 1e12, false);
  // Megatron's schedule; the decay ends with the run (warm-up steps included) unless told.
  const std::string style = vm["lr-decay-style"].as<std::string>();
  if (!exec::parse_lr_style(style, r.optimizer.lr_decay_style)) {
    throw InputError("<command line>", 0, "--lr-decay-style",
                     "expected constant, linear, cosine or inverse-square-root, found '" + style + "'");
  }
  r.optimizer.min_lr = number("min-lr", 0, 10, false);
  r.optimizer.lr_warmup_iters = int_option_in(vm, "lr-warmup-iters", 0, 1'000'000'000);
  r.optimizer.lr_decay_iters =
      vm.count("lr-decay-iters") ? int_option_in(vm, "lr-decay-iters", 1, 1'000'000'000) : r.warmup + r.steps;
  if (!vm.count("lr-decay-iters") && r.optimizer.lr_decay_style != exec::LrSchedule::Style::constant &&
      r.optimizer.lr_warmup_iters >= r.optimizer.lr_decay_iters) {
    throw InputError("<command line>", 0, "--lr-warmup-iters",
                     std::to_string(r.optimizer.lr_warmup_iters) + " steps of warm-up leave no decay before the run ends at step " +
                         std::to_string(r.optimizer.lr_decay_iters) +
                         " (--warmup + --steps, the default --lr-decay-iters): give more steps or --lr-decay-iters");
  }
  r.optimizer.schedule().check();
  // Loss scaling, Megatron's: a constant --loss-scale, or dynamic where the GEMMs multiply
  // fp16 operands (an fp16 plan on the cuda back end) unless a constant is given.
  exec::LossScaleOptions& ls = r.optimizer.loss_scale;
  if (vm.count("loss-scale")) ls.loss_scale = number("loss-scale", exec::kMinLossScale, exec::kMaxLossScale, false);
  ls.initial_loss_scale = number("initial-loss-scale", exec::kMinLossScale, exec::kMaxLossScale, false);
  ls.min_loss_scale = number("min-loss-scale", exec::kMinLossScale, exec::kMaxLossScale, false);
  for (const char* name : {"loss-scale-window", "hysteresis"}) {
    const double x = number(name, 1, 1e9, false);
    if (x != std::floor(x)) {
      throw InputError("<command line>", 0, std::string("--") + name, "expected a whole number, found '" + vm[name].as<std::string>() + "'");
    }
    (std::string(name) == "hysteresis" ? ls.hysteresis : ls.loss_scale_window) = static_cast<int>(x);
  }
  if (ls.min_loss_scale > ls.initial_loss_scale) {
    throw InputError("<command line>", 0, "--min-loss-scale", "is above --initial-loss-scale");
  }
  for (const char* name : {"loss-scale", "initial-loss-scale", "min-loss-scale"}) {
    if (!vm.count(name)) continue;
    const double x = parsed(vm, name, u::parse_number);
    int exponent = 0;
    if (std::frexp(x, &exponent) != 0.5) {
      throw InputError("<command line>", 0, std::string("--") + name,
                       "expected a power of two (so that scaling is exact), found '" + vm[name].as<std::string>() + "'");
    }
  }
  if (r.compute == "proxy") {
    for (const char* name : {"data-path", "init-weights", "save-weights"}) {
      if (vm.count(name)) throw InputError("<command line>", 0, std::string("--") + name, "needs --compute real (proxies train nothing)");
    }
  }
  if (vm.count("plan")) {
    // A plan fixes its cluster, network and layout; only the run may change.
    for (const auto& [name, value] : vm) {
      static const std::set<std::string> run_options{
          "plan", "steps", "warmup", "progress", "backend", "trace", "chrome", "metrics", "watchdog", "max-tasks", "flop-scale", "max-buffer",
          "calibration", "json", "compute", "data-path", "init-weights", "save-weights", "seed", "lr", "adam-beta1",
          "adam-beta2", "adam-eps", "weight-decay", "clip-grad", "loss-scale", "initial-loss-scale", "min-loss-scale",
          "loss-scale-window", "hysteresis", "lr-decay-style", "lr-warmup-iters", "lr-decay-iters", "min-lr", "yes"};
      const bool allowed = run_options.count(name) > 0;
      if (!allowed && !value.defaulted()) {
        throw InputError("<command line>", 0, "--" + name,
                         "a plan file fixes its cluster, network and layout; give either --plan or --" + name);
      }
    }
    r.plan = read_plan_file(vm["plan"].as<std::string>(), "--plan");
  } else {
    r.plan = plan_from_options(vm).plan;
  }
  // fp16 GEMM operands (an fp16 plan's real math on GPUs) need loss scaling: dynamic, as
  // Megatron's fp16, unless a constant was given.
  // (Parameter servers take a constant scale only: theirs stay fp32 operands without one.)
  if (r.backend == "cuda" && r.plan.layout.precision == model::Precision::fp16 && r.optimizer.loss_scale.loss_scale <= 0 &&
      r.plan.layout.sync.kind == partition::SyncKind::allreduce) {
    r.optimizer.loss_scale.dynamic = true;
  }
  if (!r.optimizer.loss_scale.dynamic) {
    for (const char* name : {"initial-loss-scale", "min-loss-scale", "loss-scale-window", "hysteresis"}) {
      if (!vm[name].defaulted()) {
        throw InputError("<command line>", 0, std::string("--") + name,
                         "applies to dynamic loss scaling, which only an fp16 plan's real math on the cuda back end uses "
                         "(without --loss-scale, and with all-reduce)");
      }
    }
  }
  r.plan.layout.iterations = r.warmup + r.steps;  // the plan that runs: its fingerprint says how long
  r.plan.fingerprint = partition::plan_fingerprint(r.plan);
  const long long tasks = static_cast<long long>(r.plan.tasks.size()) * r.plan.iterations();
  if (const long long max_tasks = read_max_tasks(vm); tasks > max_tasks) {
    throw InputError("<command line>", 0, "--steps",
                     std::to_string(r.plan.iterations()) + " iterations x " + std::to_string(r.plan.tasks.size()) +
                         " tasks = " + std::to_string(tasks) + " task instances, more than --max-tasks " +
                         std::to_string(max_tasks) + "; lower --steps or raise --max-tasks");
  }
  return r;
}

// This host's memory, or under mpirun the least of the ranks' hosts': every rank then makes
// the same choice between real math and proxies (ranks of both kinds would not meet).
double smallest_host_bytes(const exec::Ranks& ranks) {
  const double here = static_cast<double>(::sysconf(_SC_PHYS_PAGES)) * static_cast<double>(::sysconf(_SC_PAGE_SIZE));
  if (ranks.alone()) return here;
  std::vector<std::byte> mine, least;
  exec::put(mine, here);
  const std::vector<std::vector<std::byte>> all = ranks.gather(mine);
  if (ranks.rank() == 0) {
    double smallest = here;
    for (const auto& bytes : all) smallest = std::min(smallest, exec::ByteReader(bytes).get<double>());
    exec::put(least, smallest);
  }
  const std::vector<std::byte> agreed = ranks.broadcast(least);
  return exec::ByteReader(agreed).get<double>();
}

// The training a real-math run does: its token source, its initial weights, its optimizer.
TrainingSetup make_training(const Request& r, const exec::Ranks& ranks) {
  TrainingSetup t;
  if (r.compute == "proxy") return t;
  const partition::Plan& plan = r.plan;
  try {
    if (!plan.network.architecture) {
      throw PlanError("the network '" + plan.network.name + "' is not a transformer: real math covers GPT-2 and LLaMA "
                      "style decoders, other networks run as FLOP-matched proxies");
    }
    const exec::DecoderShape shape = exec::decoder_shape(*plan.network.architecture);  // a PlanError when not covered
    if (r.backend == "cuda" && shape.HS > kernels::kMaxCudaHeadSize) {
      throw PlanError("its heads are " + std::to_string(shape.HS) + " wide, and the CUDA attention kernels take up to " +
                      std::to_string(kernels::kMaxCudaHeadSize));
    }
    // FP32 weights, gradients and two Adam moments on every replica: auto keeps real math to
    // what fits in a quarter of this host's memory (a GPU-sized model runs as proxies).
    const double state_bytes =
        16.0 * plan.network.param_count() * static_cast<double>(std::max<size_t>(1, plan.layout.workers.size()));
    if (r.compute == "auto") {
      const double host_bytes = smallest_host_bytes(ranks);
      if (host_bytes > 0 && state_bytes > host_bytes / 4) {
        throw PlanError("its FP32 training state (" + u::human_bytes(state_bytes) + ") is more than a quarter of " +
                        (ranks.alone() ? "this host's " : "the smallest of the ranks' hosts' ") + u::human_bytes(host_bytes) +
                        " of memory (--compute real runs it anyway)");
      }
    }
    const int vocab = plan.network.architecture->vocab;
    std::unique_ptr<exec::TokenSource> data;
    if (!r.data_path.empty()) {
      data = exec::open_token_file(r.data_path, vocab);
    } else {
      auto markov = exec::markov_stream(vocab, r.seed);
      t.entropy_nats = markov->entropy_nats();
      data = std::move(markov);
    }
    t.data = data->describe();
    if (!r.init_weights.empty()) {
      // Each rank reads the tensors of its own parameters, one at a time.
      const exec::Checkpoint init(r.init_weights);
      t.training = std::make_unique<exec::Training>(plan, std::move(data), r.optimizer, r.seed, init, &ranks);
    } else {
      t.training = std::make_unique<exec::Training>(plan, std::move(data), r.optimizer, r.seed, nullptr, "", &ranks);
    }
  } catch (const PlanError& e) {
    if (r.compute == "real") throw;
    t.proxy_reason = e.what();
  }
  if (t.training && r.flop_scale != 1) {
    // Real math does the model's work, all of it; a scaled prediction would not be of this run.
    throw InputError("<command line>", 0, "--flop-scale",
                     "scales proxies' work, and this run trains for real (give --compute proxy to scale it)");
  }
  if (!t.training) {
    for (const auto& [option, value] : {std::pair{"--data-path", r.data_path}, {"--init-weights", r.init_weights},
                                        {"--save-weights", r.save_weights}}) {
      if (!value.empty()) throw InputError("<command line>", 0, option, "needs real math, and this plan runs proxies: " + t.proxy_reason);
    }
  }
  return t;
}

// The same plan with every compute task's work scaled as the run scales it: the estimate
// then predicts the run that happens.
partition::Plan scaled(const partition::Plan& plan, double flop_scale) {
  partition::Plan out = plan;
  for (partition::Task& t : out.tasks) {
    t.flops *= flop_scale;
    t.recompute_flops *= flop_scale;
    t.memory_bytes *= flop_scale;
  }
  return out;
}

// The longest compute task of `plan` as the cost model predicts it.
double longest_task_s(const partition::Plan& plan, const partition::CostModel& cost) {
  double longest = 0;
  for (const partition::Task& t : plan.tasks) {
    using partition::TaskKind;
    if (t.kind != TaskKind::forward && t.kind != TaskKind::backward && t.kind != TaskKind::backward_weight &&
        t.kind != TaskKind::optimizer) {
      continue;
    }
    longest = std::max(longest, cost.task_compute_time_s(plan, t));
  }
  return longest;
}

// --- step 3: the report ---

struct Figures {
  std::vector<double> step_s;  // per iteration (warm-up included)
  double iteration_time_s = 0;  // mean over the steps after the warm-up
  double samples_per_s = 0, tokens_per_s = 0;
  double mfu = 0, analytic_mfu = 0;  // model FLOPs per second over the devices' peak
  std::vector<double> losses;  // per step, real math only
  std::vector<double> learning_rates;  // per step, real math only; NaN: skipped (gradients not finite)
};

// The devices' summed peak at the precision the run computes in (FP32 for real math on the
// CPU back end, the plan's otherwise).
double peak_flops_per_s(const partition::Plan& plan, model::Precision precision) {
  double peak = 0;
  for (const model::Device& d : plan.cluster.devices()) peak += plan.cluster.device_gpu(d).peak_flops_per_s(precision);
  return peak;
}

// Per step, and the mean after the warm-up, of the iterations that ran whole: a run that
// stopped counts its steps up to the first with a task missing (its trace has them all).
Figures figures(const traces::Trace& trace, const partition::Plan& plan, int warmup) {
  Figures f;
  std::vector<double> end(static_cast<size_t>(plan.iterations()), 0);
  std::vector<size_t> tasks(end.size(), 0);
  for (const traces::Event& e : trace.events) {
    if (e.iteration < 0 || e.iteration >= plan.iterations()) continue;
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

// The precision the run's GEMMs multiply at, whose peak MFU is measured against: a proxy's
// the plan's; the real math's FP32, but on GPUs bf16 operands for a bf16 plan and fp16 ones
// for a loss-scaled fp16 plan (as report_text says).
model::Precision gemm_precision(const Request& r, bool real) {
  const model::Precision p = r.plan.layout.precision;
  if (!real) return p;
  if (r.backend == "cuda" && p == model::Precision::bf16) return p;
  if (r.backend == "cuda" && p == model::Precision::fp16 && r.optimizer.loss_scale.active()) return p;
  return model::Precision::fp32;
}

// MFU (traces/figures.hpp) of an iteration of this length: the model's FLOPs over the
// devices' peak at `precision`; a proxy run scaled by --flop-scale does that share of them.
double mfu(const partition::Plan& plan, double iteration_time_s, model::Precision precision, double flop_scale) {
  const double model_flops =
      plan.network.training_flops_per_sample() * plan.layout.samples_per_iteration() * flop_scale;
  return traces::mfu(model_flops, iteration_time_s, peak_flops_per_s(plan, precision));
}

// The simulator's prediction for the plan that ran (compute scaled as the run scaled it).
struct Simulated {
  bool completed = false;
  std::string error;
  Figures f;
  traces::Metrics m;
};

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
    out.f = figures(r.trace, scaled_plan, warmup);
    out.f.mfu = mfu(scaled_plan, out.f.iteration_time_s, precision, flop_scale);
    out.m = traces::compute_metrics(r.trace, scaled_plan, cost, warmup);
  } catch (const Error& e) {
    out.error = e.what();
  }
  return out;
}

// What the plan's memory model gives the model itself on a device: all of it but the
// workspace reserve (cuBLAS and NCCL buffers, fragmentation), which the real math's arrays
// do not include.
double model_bytes_planned(const partition::DeviceMemory& m) { return m.total_bytes() - m.workspace_bytes; }

Json report_json(const Request& r, const TrainingSetup& t, const exec::RunResult& result, const Figures& f,
                 const traces::Metrics& m, const partition::Estimate& e, const Simulated& sim, int ranks,
                 double watchdog_s) {
  const partition::Plan& plan = r.plan;
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
    if (t.entropy_nats > 0) j["data_entropy_nats"] = t.entropy_nats;
    j["optimizer"] = {{"lr", r.optimizer.lr}, {"adam_beta1", r.optimizer.adam_beta1}, {"adam_beta2", r.optimizer.adam_beta2},
                      {"adam_eps", r.optimizer.adam_eps}, {"weight_decay", r.optimizer.weight_decay},
                      {"clip_grad", r.optimizer.clip_grad},
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
    Json step = {{"step", i}, {"time_s", f.step_s[i]}, {"warmup", static_cast<int>(i) < r.warmup}};
    if (i < f.losses.size()) step["loss"] = f.losses[i];
    if (i < f.learning_rates.size()) {
      const double lr = f.learning_rates[i];
      step["lr"] = std::isnan(lr) ? Json(nullptr) : Json(lr);  // null: skipped (gradients not finite)
    }
    steps.push_back(std::move(step));
  }
  j["steps"] = std::move(steps);
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
  j["wall_s"] = result.wall_s;
  j["task_instances"] = result.task_instances;
  Json devices = Json::array();
  for (size_t d = 0; d < static_cast<size_t>(plan.device_count()); ++d) {
    const double analytic_util = e.iteration_time_s > 0 ? e.busy_s[d] / e.iteration_time_s : 0;
    devices.push_back({{"name", plan.device_names[d]},
                       {"busy_s", d < m.devices.size() ? m.devices[d].busy_s : 0},
                       {"analytic_busy_s", e.busy_s[d]},
                       {"utilization", d < m.devices.size() ? m.devices[d].utilization : 0},
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

void report_text(std::ostream& out, const Request& r, const TrainingSetup& t, const exec::RunResult& result,
                 const Figures& f, const traces::Metrics& m, const partition::Estimate& e, const Simulated& sim, int ranks) {
  const partition::Plan& plan = r.plan;
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
    out << "  AdamW lr " << r.optimizer.lr;
    if (scheduled) {
      out << " (" << r.optimizer.schedule().describe() << ")";
    }
    out << ", betas " << r.optimizer.adam_beta1 << " " << r.optimizer.adam_beta2
        << ", eps " << r.optimizer.adam_eps << ", weight decay " << r.optimizer.weight_decay << ", clip-grad "
        << r.optimizer.clip_grad << "\n";
    if (r.optimizer.loss_scale.active()) {
      out << "  loss scale " << t.training->loss_scale()
          << (r.optimizer.loss_scale.loss_scale > 0 ? " (constant)" : " (dynamic, after the last step)") << ", "
          << t.training->skipped_steps() << " step(s) skipped: gradients not finite\n";
    }
  }
  for (size_t i = 0; i < f.step_s.size(); ++i) {
    out << "  step " << std::setw(3) << i << "  " << std::setw(9) << u::human_time_s(f.step_s[i]);
    if (i < f.losses.size()) out << "  loss " << std::fixed << std::setprecision(6) << f.losses[i] << std::defaultfloat;
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
}

}  // namespace

void run_options(po::options_description& options) {
  add_plan_options(options, PlanCommand::run);
  options.add_options()
      ("plan", po::value<std::string>(), "run this plan file instead of planning from the options")
      ("backend", po::value<std::string>()->default_value("cpu"), "cpu (threads in this process) | cuda (local GPUs, cuBLAS and NCCL)")
      ("steps", po::value<int>()->default_value(3), "iterations measured")
      ("progress", "show the progress line also where stderr is not a terminal (a line a second)")
      ("yes", "start a run predicted to take more than 10 minutes without asking (asked when stdin is a terminal)")
      ("warmup", po::value<int>()->default_value(1), "iterations run first and left out of the figures")
      ("watchdog", po::value<std::string>()->default_value("60 s"), "stop when no task completes for this long")
      ("flop-scale", po::value<std::string>()->default_value("1"),
       "run compute tasks with their FLOPs times this (e.g. 0.001 for a GPU plan on a CPU)")
      ("max-buffer", po::value<std::string>()->default_value("4 MiB"),
       "host bytes allocated per tensor and moved per message at most (the accounting keeps the plan's bytes)")
      ("compute", po::value<std::string>()->default_value("auto"),
       "real (the model's training math) | proxy (FLOP-matched sgemm) | auto (real where covered)")
      ("data-path", po::value<std::string>(), "training tokens, an llm.c token file (default: a seeded Markov stream)")
      ("init-weights", po::value<std::string>(),
       "start from these weights (safetensors, HuggingFace names): a file, a sharded checkpoint's index.json, or their directory")
      ("save-weights", po::value<std::string>(), "write the FP32 weights after the last step (safetensors)")
      ("seed", po::value<long long>()->default_value(1234), "seed of the initial weights and the Markov stream")
      ("lr", po::value<std::string>()->default_value("3e-4"), "AdamW learning rate (the schedule's peak)")
      ("lr-decay-style", po::value<std::string>()->default_value("constant"),
       "constant | linear | cosine | inverse-square-root (Megatron's schedule)")
      ("lr-warmup-iters", po::value<int>()->default_value(0), "steps of linear warm-up from 0 to --lr")
      ("lr-decay-iters", po::value<int>(),
       "the step the decay reaches --min-lr (default: --warmup + --steps, one past the last, as Megatron's --train-iters)")
      ("min-lr", po::value<std::string>()->default_value("0"), "the rate the decay ends at")
      ("adam-beta1", po::value<std::string>()->default_value("0.9"), "AdamW beta1")
      ("adam-beta2", po::value<std::string>()->default_value("0.999"), "AdamW beta2")
      ("adam-eps", po::value<std::string>()->default_value("1e-8"), "AdamW epsilon")
      ("weight-decay", po::value<std::string>()->default_value("0.01"), "decoupled weight decay of matrices and embeddings")
      ("clip-grad", po::value<std::string>()->default_value("1.0"), "clip gradients to this global norm (0: off)")
      ("loss-scale", po::value<std::string>(), "constant loss scale, a power of two (default: none; dynamic for fp16 GEMMs)")
      ("initial-loss-scale", po::value<std::string>()->default_value("4294967296"), "dynamic loss scale's start (2^32)")
      ("min-loss-scale", po::value<std::string>()->default_value("1"), "dynamic loss scale's floor")
      ("loss-scale-window", po::value<std::string>()->default_value("1000"), "good steps before the loss scale doubles")
      ("hysteresis", po::value<std::string>()->default_value("2"), "steps with non-finite gradients before it halves")
      ("trace", po::value<std::string>(), "write the trace as CSV (the traces/ format)")
      ("chrome", po::value<std::string>(), "write a Chrome trace JSON (open in ui.perfetto.dev)")
      ("metrics", po::value<std::string>(), "write per-iteration metrics as CSV (also of a partial run)");
}

int run_run(const std::vector<std::string>& args, std::ostream& out) {
  po::options_description options("run options");
  po::variables_map vm;
  if (!parse_command_options("run", args, options, vm, out)) return 0;
  // 1. What was asked.
  Request request = read_request(vm);
  const partition::Plan& plan = request.plan;
  partition::require_valid(plan);
  const model::Calibration calibration = read_calibration_option(vm, plan.cluster);
  const partition::CostModel cost(plan.cluster, plan.layout.precision, calibration);

  // 2. The run: every device here as threads, or under mpirun this rank's devices; rank 0
  // then holds the whole run and reports it, the other ranks only say whether it completed.
  exec::Ranks& ranks = exec::Ranks::world();
  double predicted_s = 0;
  if (ranks.rank() == 0) {
    const int iterations = request.warmup + request.steps;
    predicted_s = predicted_run_wall_s(scaled(plan, request.flop_scale), iterations, request.backend, cost);
    confirm_run(predicted_s, iterations, vm.count("yes") > 0);
  }
  if (ranks.rank() == 0) {  // (the rank that writes them) before the run, not after it
    for (const char* option : {"trace", "chrome", "metrics"}) {
      if (vm.count(option)) check_writable(vm[option].as<std::string>(), std::string("--") + option);
    }
    if (!request.save_weights.empty()) check_writable(request.save_weights, "--save-weights");
  }
  const TrainingSetup training = make_training(request, ranks);
  std::unique_ptr<exec::Backend> backend;
  if (request.backend == "cuda") {
    // Under mpirun each process drives its block of the devices on its node's GPUs.
    backend = std::make_unique<exec::CudaBackend>(
        exec::CudaBackendOptions{request.flop_scale, request.max_buffer_bytes, {}, false, &ranks, training.training.get()});
  } else {
    backend = std::make_unique<exec::CpuBackend>(exec::CpuBackendOptions{request.flop_scale, request.max_buffer_bytes},
                                                 training.training.get(), &ranks);
  }
  exec::EngineOptions engine;
  engine.watchdog_s = request.watchdog_s;
  // A long task is not a stall: unless told, the watchdog waits at least ten times the
  // longest compute task the cost model predicts for this run.
  const partition::Plan as_run = scaled(plan, request.flop_scale);
  if (vm["watchdog"].defaulted()) engine.watchdog_s = std::max(request.watchdog_s, 10 * longest_task_s(as_run, cost));
  engine.max_buffer_bytes = request.max_buffer_bytes;
  engine.ranks = &ranks;
  // Under mpirun rank 0 shows its own devices' tasks, without the loss (another rank's to say).
  RunProgressLine progress(predicted_s, ranks.alone() ? training.training.get() : nullptr, ranks.rank() == 0,
                           vm.count("progress") > 0);
  engine.on_progress = progress.reporter();
  const exec::RunResult result = [&] {
    const exec::InterruptOnSignal on_signal;  // Ctrl-C stops every thread and rank; what ran is still reported
    engine.interrupt = &on_signal.flag();
    return exec::run_plan(plan, *backend, engine);
  }();
  progress.finish();
  if (training.training) training.training->collect_at_root();
  if (ranks.rank() != 0) return result.completed ? 0 : 4;
  // A file that cannot be written now (checked before the run: a full disk, say) is said
  // after the report, which is not lost; the run's own status stands if it failed.
  std::vector<std::string> unwritten;  // the failures' messages
  std::set<std::string> failed;         // and their options
  const auto write = [&](const std::string& option, const std::function<void()>& writing) {
    try {
      writing();
    } catch (const InputError& e) {
      unwritten.push_back(as_command_line_error(e).what());
      failed.insert(option);
    }
  };
  const auto written = [&](const std::string& option) { return vm.count(option) && !failed.count(option); };
  if (vm.count("trace")) {
    write("trace", [&] { write_file(vm["trace"].as<std::string>(), traces::write_trace_csv(result.trace), "--trace"); });
  }
  if (vm.count("chrome")) {
    write("chrome", [&] { write_file(vm["chrome"].as<std::string>(), traces::write_chrome_trace(result.trace), "--chrome"); });
  }
  if (training.training && result.completed && !request.save_weights.empty()) {
    write("save-weights", [&] { exec::write_safetensors(request.save_weights, training.training->weights()); });
  }
  const partition::Estimate analytic = partition::estimate_plan(as_run, cost);
  const model::Precision gemms = gemm_precision(request, training.training != nullptr);
  Figures f = figures(result.trace, plan, request.warmup);
  f.mfu = mfu(plan, f.iteration_time_s, gemms, request.flop_scale);
  f.analytic_mfu = mfu(plan, analytic.iteration_time_s, gemms, request.flop_scale);
  // The metrics (the --metrics CSV's MFU among them) count as the report does: the FLOPs the
  // run did, over the devices' peak at the precision its GEMMs multiplied in.
  const partition::CostModel at_gemms(plan.cluster, gemms, calibration);
  const Simulated simulated =
      result.completed ? simulate_same(as_run, calibration, request.warmup, at_gemms, gemms, request.flop_scale) : Simulated{};
  if (training.training) {
    f.losses = training.training->losses();
    f.learning_rates = training.training->learning_rates();
    if (f.losses.size() > f.step_s.size()) f.losses.resize(f.step_s.size());  // (a stopped step's is partial)
    if (f.learning_rates.size() > f.losses.size()) f.learning_rates.resize(f.losses.size());
  }
  const traces::Metrics m = traces::compute_metrics(result.trace, as_run, at_gemms, request.warmup);
  if (vm.count("metrics")) {
    write("metrics", [&] { write_file(vm["metrics"].as<std::string>(), traces::write_metrics_csv(m, result.trace), "--metrics"); });
  }
  const auto status = [&] {
    for (const std::string& u : unwritten) std::cerr << "hetflow: " << u << "\n";
    return !result.completed ? 4 : unwritten.empty() ? 0 : 2;
  };

  // 3. The report.
  if (vm.count("json")) {
    print_json(out, report_json(request, training, result, f, m, analytic, simulated, ranks.size(), engine.watchdog_s));
    return status();
  }
  if (!result.completed) {
    out << "ran " << plan.network.name << " on " << plan.cluster.name << ": THE RUN DID NOT COMPLETE ("
        << result.task_instances << " task instances completed):\n  " << result.error << "\n";
    if (written("trace")) out << "wrote the partial trace to " << vm["trace"].as<std::string>() << "\n";
    if (written("chrome")) out << "wrote the partial Chrome trace to " << vm["chrome"].as<std::string>() << "\n";
    if (written("metrics")) out << "wrote the partial metrics to " << vm["metrics"].as<std::string>() << "\n";
    return status();
  }
  report_text(out, request, training, result, f, m, analytic, simulated, ranks.size());
  if (written("trace")) out << "\nwrote " << vm["trace"].as<std::string>() << " (" << result.trace.events.size() << " events)\n";
  if (written("chrome")) out << "wrote " << vm["chrome"].as<std::string>() << " (open in ui.perfetto.dev)\n";
  if (written("metrics")) out << "wrote " << vm["metrics"].as<std::string>() << " (per-iteration metrics)\n";
  return status();
}

}  // namespace hetflow::tools
