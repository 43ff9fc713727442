#include "tools/run_request.hpp"

#include <cmath>
#include <set>
#include <stdexcept>

#include "exec/training_checkpoint.hpp"
#include "model/error.hpp"
#include "model/units.hpp"
#include "partition/loading.hpp"
#include "partition/plan_io.hpp"
#include "tools/options.hpp"
#include "tools/plan_options.hpp"

namespace hetflow::tools {

namespace {

namespace u = model::units;

template <typename Parse>
double parsed(const po::variables_map& vm, const char* name, Parse parse) {
  try {
    return parse(vm[name].as<std::string>());
  } catch (const std::invalid_argument& e) {
    throw InputError("<command line>", 0, std::string("--") + name, e.what());
  }
}

// The plan to run: a plan file (with only the run's own options beside it), or the one the
// plan options make.
partition::Plan plan_of(const po::variables_map& vm) {
  if (vm.count("plan")) {
    // A plan fixes its cluster, network and layout; only the run may change.
    for (const auto& [name, value] : vm) {
      static const std::set<std::string> run_options{
          "plan", "steps", "warmup", "progress", "backend", "loader-throttle", "trace", "chrome", "metrics", "watchdog",
          "max-tasks", "flop-scale", "max-buffer", "calibration", "json", "compute", "data-path", "init-weights",
          "save-weights", "resume", "save-checkpoint", "save-interval", "seed",
          "lr", "adam-beta1", "adam-beta2", "adam-eps", "weight-decay", "clip-grad", "moe-router-bias-update-rate",
          "loss-scale", "initial-loss-scale", "min-loss-scale", "loss-scale-window", "hysteresis", "lr-decay-style",
          "lr-warmup-iters", "lr-decay-iters", "min-lr", "yes"};
      const bool allowed = run_options.count(name) > 0;
      if (!allowed && !value.defaulted()) {
        throw InputError("<command line>", 0, "--" + name,
                         "a plan file fixes its cluster, network and layout; give either --plan or --" + name);
      }
    }
    return read_plan_file(vm["plan"].as<std::string>(), "--plan");
  }
  return plan_from_options(vm).plan;
}

}  // namespace

run::Request read_run_request(po::variables_map& vm) {
  const std::string backend = vm["backend"].as<std::string>();
  if (backend != "cpu" && backend != "cuda") {
    throw InputError("<command line>", 0, "--backend", "expected cpu or cuda, found '" + backend + "'");
  }
  run::Request r;
  r.backend = backend;
  r.steps = int_option_in(vm, "steps", 1, 1'000'000);
  r.warmup = int_option_in(vm, "warmup", 0, 1'000'000);
  r.watchdog_s = parsed(vm, "watchdog", u::parse_time_s);
  r.watchdog_given = !vm["watchdog"].defaulted();
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
  if (vm.count("loader-throttle")) {
    r.loader_throttle_s_per_sample = parsed(vm, "loader-throttle", u::parse_time_s);
    if (!(r.loader_throttle_s_per_sample >= 0 && r.loader_throttle_s_per_sample <= 3600)) {
      throw InputError("<command line>", 0, "--loader-throttle", "expected a time from 0 to 3600 s a sample, found '" +
                                                                     vm["loader-throttle"].as<std::string>() + "'");
    }
    if (backend != "cpu") throw InputError("<command line>", 0, "--loader-throttle", "slows the cpu back end's loader only");
  }
  r.compute = vm["compute"].as<std::string>();
  if (r.compute != "auto" && r.compute != "real" && r.compute != "proxy") {
    throw InputError("<command line>", 0, "--compute", "expected auto, real or proxy, found '" + r.compute + "'");
  }
  if (vm.count("data-path")) r.data_path = vm["data-path"].as<std::string>();
  if (vm.count("init-weights")) r.init_weights = vm["init-weights"].as<std::string>();
  if (vm.count("save-weights")) r.save_weights = vm["save-weights"].as<std::string>();
  if (vm.count("save-checkpoint")) r.save_checkpoint = vm["save-checkpoint"].as<std::string>();
  if (vm.count("save-interval")) {
    r.save_interval = int_option_in(vm, "save-interval", 1, 1'000'000'000);
    if (r.save_checkpoint.empty()) {
      throw InputError("<command line>", 0, "--save-interval", "says how often to write --save-checkpoint's folder: give it too");
    }
  }
  if (vm.count("resume")) {
    if (vm.count("init-weights")) {
      throw InputError("<command line>", 0, "--init-weights", "a resumed run takes its checkpoint's weights: give --resume or --init-weights");
    }
    r.resume = vm["resume"].as<std::string>();
    // (Checked now, before anything is planned or runs; its tensors are read when training starts.)
    r.resumed_iterations = exec::TrainingCheckpoint(r.resume).progress().iterations;
  }
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
  r.optimizer.moe_router_bias_update_rate = number("moe-router-bias-update-rate", 0, 1, false);
  // Megatron's schedule; the decay ends with the run (warm-up steps included) unless told.
  const std::string style = vm["lr-decay-style"].as<std::string>();
  if (!exec::parse_lr_style(style, r.optimizer.lr_decay_style)) {
    throw InputError("<command line>", 0, "--lr-decay-style",
                     "expected constant, linear, cosine or inverse-square-root, found '" + style + "'");
  }
  r.optimizer.min_lr = number("min-lr", 0, 10, false);
  r.optimizer.lr_warmup_iters = int_option_in(vm, "lr-warmup-iters", 0, 1'000'000'000);
  // (A resumed run's steps count from the first run's first.)
  const long long run_end = r.resumed_iterations + r.warmup + r.steps;
  r.optimizer.lr_decay_iters =
      vm.count("lr-decay-iters") ? int_option_in(vm, "lr-decay-iters", 1, 1'000'000'000) : run_end;
  if (!vm.count("lr-decay-iters") && r.optimizer.lr_decay_style != exec::LrSchedule::Style::constant &&
      r.optimizer.lr_warmup_iters >= r.optimizer.lr_decay_iters) {
    throw InputError("<command line>", 0, "--lr-warmup-iters",
                     std::to_string(r.optimizer.lr_warmup_iters) + " steps of warm-up leave no decay before the run ends at step " +
                         std::to_string(r.optimizer.lr_decay_iters) +
                         (r.resumed_iterations > 0 ? " (the checkpoint's steps + --warmup + --steps, the default --lr-decay-iters)"
                                                   : " (--warmup + --steps, the default --lr-decay-iters)") +
                         ": give more steps or --lr-decay-iters");
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
    for (const char* name : {"data-path", "init-weights", "save-weights", "resume", "save-checkpoint", "save-interval"}) {
      if (vm.count(name)) throw InputError("<command line>", 0, std::string("--") + name, "needs --compute real (proxies train nothing)");
    }
  }
  r.plan = plan_of(vm);
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
  if (r.loader_throttle_s_per_sample > 0 && !partition::loader_bound(r.plan).bounded) {
    throw InputError("<command line>", 0, "--loader-throttle",
                     "the plan has no load tasks to slow: its cluster needs an input: section (README, \"Data loading\")");
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

}  // namespace hetflow::tools
