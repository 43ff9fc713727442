// hetflow simulate: run a plan (a file, or built from the plan options) on the SimGrid model
// of its cluster; print the figures of merit; write the trace. Three steps: read what was
// asked (the plan and the simulation options), run it, report it.
#include <fstream>
#include <ostream>

#include "model/error.hpp"
#include "partition/estimate.hpp"
#include "partition/plan_io.hpp"
#include "partition/validate.hpp"
#include "sim/platform_spec.hpp"
#include "sim/simulator.hpp"
#include "tools/breakdown_report.hpp"
#include "tools/cli.hpp"
#include "tools/plan_options.hpp"
#include "tools/progress.hpp"
#include "tools/simulate_report.hpp"
#include "tools/what_if.hpp"
#include "traces/breakdown.hpp"
#include "traces/metrics.hpp"
#include "traces/trace_io.hpp"

namespace hetflow::tools {

namespace {

struct Request {
  partition::Plan plan;
  sim::SimOptions options;
};

std::vector<std::string> list(const po::variables_map& vm, const char* name) {
  return vm.count(name) ? vm[name].as<std::vector<std::string>>() : std::vector<std::string>{};
}

// --- step 1: what was asked ---

partition::Plan read_or_build_plan(const po::variables_map& vm) {
  if (vm.count("plan")) {
    // A plan fixes its cluster, network and layout; only the run length may change.
    for (const auto& [name, value] : vm) {
      const bool allowed = name == "plan" || name == "iterations" || name == "calibration" || name == "trace" ||
                           name == "max-tasks" || name == "metrics" || name == "breakdown" ||
                           name == "chrome" || name == "straggler" || name == "scale-gpu" || name == "link" ||
                           name == "fail-device" || name == "fail-link" || name == "collective-steps" ||
                           name == "export-platform" || name == "json";
      if (!allowed && !value.defaulted()) {
        throw InputError("<command line>", 0, "--" + name,
                         "a plan file fixes its cluster, network and layout; give either --plan or --" + name +
                             " (with --plan only --iterations, --max-tasks, --calibration and the simulation and report options apply)");
      }
    }
    partition::Plan plan = read_plan_file(vm["plan"].as<std::string>(), "--plan");
    if (!vm["iterations"].defaulted()) {
      plan.layout.iterations = vm["iterations"].as<int>();
      if (plan.layout.iterations < 1) {
        throw InputError("<command line>", 0, "--iterations",
                         "expected at least 1, found " + std::to_string(plan.layout.iterations));
      }
      plan.fingerprint = partition::plan_fingerprint(plan);
    }
    return plan;
  }
  if (vm.count("fold") && vm.count("no-fold")) {
    throw InputError("<command line>", 0, "--no-fold", "give either --fold or --no-fold");
  }
  // Identical data-parallel replicas fold into one by default where the cluster's symmetry
  // allows it (partition: one region, a non-blocking fabric, a NIC per GPU, no shared uplink;
  // within 1 % of the unfolded simulation where tested); elsewhere the builder refuses the
  // fold, naming it, and every replica is planned.
  if (!vm.count("fold") && !vm.count("no-fold")) {
    try {
      return plan_from_options(vm, true).plan;
    } catch (const InputError& e) {
      if (e.file() != partition::kOptions || e.field() != "fold") throw;
    }
  }
  return plan_from_options(vm).plan;
}

sim::SimOptions read_sim_options(const po::variables_map& vm, const partition::Plan& plan) {
  sim::SimOptions o;
  o.calibration = read_calibration_option(vm, plan.cluster);
  o.coalesce_rings = o.coalesce_all_to_all = !vm.count("collective-steps");
  for (const std::string& s : list(vm, "fail-device")) {
    const auto [what, at] = split_at(s, "--fail-device");
    o.faults.push_back({device_by_name(plan, what, "--fail-device"), "", at});
  }
  const sim::PlatformSpec spec =
      sim::platform_spec(plan.cluster, std::vector<double>(static_cast<size_t>(plan.device_count()), 1));
  for (const std::string& s : list(vm, "fail-link")) {
    const auto [what, at] = split_at(s, "--fail-link");
    if (spec.link_index(what) < 0) {
      std::string names;
      for (size_t i = 0; i < spec.links.size() && i < 8; ++i) names += (i ? ", " : "") + spec.links[i].name;
      throw InputError("<command line>", 0, "--fail-link", "no link '" + what + "'; links are named like " + names);
    }
    o.faults.push_back({-1, what, at});
  }
  return o;
}

}  // namespace

void simulate_options(po::options_description& options) {
  add_plan_options(options, PlanCommand::simulate);
  options.add_options()
      ("plan", po::value<std::string>(), "simulate this plan file instead of planning from the options")
      ("trace", po::value<std::string>(), "write the trace as CSV (the traces/ format)")
      ("chrome", po::value<std::string>(), "write a Chrome trace JSON (open in ui.perfetto.dev)")
      ("metrics", po::value<std::string>(), "write per-iteration metrics as CSV")
      ("fail-device", po::value<std::vector<std::string>>()->composing(), "DEVICE@TIME: the device fails")
      ("fail-link", po::value<std::vector<std::string>>()->composing(), "LINK@TIME: a platform link fails")
      ("export-platform", po::value<std::string>(), "write the SimGrid platform XML here")
      ("collective-steps", "simulate every step of ring collectives and every pair of even all-to-alls (default: one "
                           "transfer per member, two for all-to-alls, tested equal within 1 %)")
      ("breakdown", "where an iteration's time goes: compute by operation, exposed communication by purpose, idle");
  add_what_if_options(options);
}

int run_simulate(const std::vector<std::string>& args, std::ostream& out) {
  po::options_description options("simulate options");
  po::variables_map vm;
  if (!parse_command_options("simulate", args, options, vm, out)) return 0;
  // 1. What was asked.
  Request request{read_or_build_plan(vm), {}};
  const partition::Plan& plan = request.plan;
  // The simulator unrolls every iteration: bound the total before it allocates for them
  // (and before validation, which refuses beyond its own, larger bound).
  const long long tasks = static_cast<long long>(plan.tasks.size()) * plan.iterations();
  if (const long long max_tasks = read_max_tasks(vm); tasks > max_tasks) {
    throw InputError("<command line>", 0, "--iterations",
                     std::to_string(plan.iterations()) + " iterations x " + std::to_string(plan.tasks.size()) +
                         " tasks per iteration = " + std::to_string(tasks) + " tasks to simulate, more than --max-tasks " +
                         std::to_string(max_tasks) + "; lower --iterations or raise --max-tasks");
  }
  if (vm.count("plan")) {
    partition::require_valid(plan);
  } else {
    require_valid_or_advise(plan, vm);  // a plan from options: say what would fit if it does not
  }
  request.options = read_sim_options(vm, plan);
  // What-if changes make the plan that runs; the plan as given is then the baseline.
  partition::Plan changed = plan;
  const WhatIf what_if = read_what_if(vm, changed);
  sim::SimOptions changed_options = request.options;
  changed_options.stragglers.insert(changed_options.stragglers.end(), what_if.slowdowns.begin(), what_if.slowdowns.end());
  const partition::CostModel cost(changed.cluster, changed.layout.precision, request.options.calibration);
  if (vm.count("export-platform")) {
    std::vector<double> peaks;
    for (int d = 0; d < cost.device_count(); ++d) peaks.push_back(cost.peak_flops_per_s(d));
    write_file(vm["export-platform"].as<std::string>(), sim::platform_xml(sim::platform_spec(changed.cluster, peaks)),
               "--export-platform");
  }

  // 2. The run (a progress line on a terminal while it lasts), and the baseline beside a what-if.
  sim::SimResult result, baseline;
  {
    ProgressLine progress;
    changed_options.on_progress = progress.reporter();
    result = sim::simulate(changed, changed_options);
    if (what_if.any() && result.completed) baseline = sim::simulate(plan, request.options);
  }
  if (vm.count("trace")) write_file(vm["trace"].as<std::string>(), traces::write_trace_csv(result.trace), "--trace");
  if (vm.count("chrome")) write_file(vm["chrome"].as<std::string>(), traces::write_chrome_trace(result.trace), "--chrome");
  const traces::Metrics m = traces::compute_metrics(result.trace, changed, cost);
  if (vm.count("metrics")) write_file(vm["metrics"].as<std::string>(), traces::write_metrics_csv(m, result.trace), "--metrics");
  const partition::Estimate analytic = partition::estimate_plan(changed, cost);
  const bool compare = what_if.any() && baseline.completed;
  const traces::Metrics base =
      compare ? traces::compute_metrics(baseline.trace, plan,
                                        partition::CostModel(plan.cluster, plan.layout.precision, request.options.calibration))
              : traces::Metrics{};

  // 3. The report.
  if (vm.count("json")) {
    Json j = simulate_json(result, m, analytic, changed);
    j["folded_replicas"] = changed.layout.folded ? changed.layout.workers.size() / changed.layout.task_workers() : 1;
    if (compare) j["what_if"] = what_if_json(what_if, base, m);
    if (vm.count("breakdown") && result.completed) j["breakdown"] = breakdown_json(traces::compute_breakdown(result.trace, changed, cost));
    print_json(out, j);
    return result.completed ? 0 : 4;
  }
  if (!result.completed) {
    out << "simulated " << plan.network.name << " on " << plan.cluster.name << ": THE RUN DID NOT COMPLETE:\n";
    for (const std::string& s : result.stalls) out << "  " << s << "\n";
    return 4;
  }
  print_simulation(out, result, m, analytic, changed);
  if (changed.layout.folded && changed.layout.workers.size() > changed.layout.task_workers()) {
    out << "\nfolded: the " << changed.layout.workers.size() / changed.layout.task_workers()
        << " identical data-parallel replicas were simulated as one, as this cluster's symmetric links allow (--no-fold simulates each)\n";
  }
  if (vm.count("breakdown")) print_breakdown(out, traces::compute_breakdown(result.trace, changed, cost));
  if (compare) print_what_if(out, what_if, base, m);
  if (vm.count("trace")) out << "\nwrote " << vm["trace"].as<std::string>() << " (" << result.trace.events.size() << " events)\n";
  if (vm.count("chrome")) out << "wrote " << vm["chrome"].as<std::string>() << " (open in ui.perfetto.dev)\n";
  if (vm.count("metrics")) out << "wrote " << vm["metrics"].as<std::string>() << " (per-iteration metrics)\n";
  return 0;
}

}  // namespace hetflow::tools
