// hetflow replay: run a trace's plan in the simulator with every compute and load task instance
// taking the time the trace measured (communication still modelled by the network), and report
// the replayed iteration times against the measured ones. Three steps, as in simulate: read
// the trace and its plan, replay, report.
#include <fstream>
#include <iomanip>
#include <ostream>
#include <sstream>
#include <vector>

#include "model/error.hpp"
#include "model/units.hpp"
#include "partition/plan_io.hpp"
#include "partition/validate.hpp"
#include "sim/simulator.hpp"
#include "tools/cli.hpp"
#include "tools/plan_options.hpp"
#include "tools/replay_input.hpp"
#include "tools/trace_files.hpp"
#include "tools/what_if.hpp"
#include "traces/layer_durations.hpp"
#include "traces/metrics.hpp"
#include "traces/trace_io.hpp"

namespace hetflow::tools {

namespace {

namespace u = model::units;

// --- step 1: the trace and the plan that made it ---

Replay read_replay(const po::variables_map& vm) {
  Replay r;
  r.trace_path = vm["trace-file"].as<std::string>();
  r.measured = read_trace_file(r.trace_path);
  r.plan = plan_of_trace(vm["plan"].as<std::string>(), "--plan", r.measured, r.trace_path);
  if (!r.measured.partial.empty()) keep_complete_iterations(r);
  r.options.calibration = read_calibration_option(vm, r.plan.cluster);
  take_measured_durations(r);
  return r;
}

// The what-if: the replayed plan or --as-plan's on changed hardware. Another plan gets the
// trace's durations through the layers they computed (traces/layer_durations.hpp).
struct WhatIfReplay {
  partition::Plan plan;
  sim::SimOptions options;
  WhatIf what_if;
  traces::TransferredDurations transferred;
  bool other_plan = false;
};

WhatIfReplay read_what_if_replay(const po::variables_map& vm, const Replay& r) {
  WhatIfReplay w;
  w.plan = r.plan;
  w.options = r.options;
  if (vm.count("as-plan")) {
    const std::string path = vm["as-plan"].as<std::string>();
    w.plan = read_plan_file(path, "--as-plan");
    partition::require_valid(w.plan);
    if (w.plan.network.layers != r.plan.network.layers) {
      throw InputError(path, 0, "network",
                       "the plan trains " + w.plan.network.name + ", the trace " + r.plan.network.name +
                           ": measured layer durations carry over only to a plan of the same network");
    }
    w.plan.layout.iterations = r.plan.layout.iterations;  // compared iteration by iteration
    w.plan.fingerprint = partition::plan_fingerprint(w.plan);
    const traces::LayerRates rates =
        traces::attribute_to_layers(r.measured, r.plan, r.trace_path);
    w.options.calibration = model::resolve_calibration(r.options.calibration, w.plan.cluster, "--calibration");
    const partition::CostModel cost(w.plan.cluster, w.plan.layout.precision, w.options.calibration);
    w.transferred = traces::transfer_durations(rates, w.plan, cost, w.options.calibration);
    const std::vector<double> dispatch_s = dispatch_of_devices(w.plan, w.options.calibration);
    const size_t tasks = w.plan.tasks.size();
    w.options.compute_s.assign(tasks * static_cast<size_t>(w.plan.layout.iterations), -1.0);
    for (size_t i = 0; i < w.options.compute_s.size(); ++i) {
      const double s = w.transferred.task_s[i % tasks];
      if (s >= 0) w.options.compute_s[i] = s + dispatch_s[static_cast<size_t>(w.plan.tasks[i % tasks].device)];
    }
    w.other_plan = true;
  }
  w.what_if = read_what_if(vm, w.plan);
  if (w.other_plan) w.what_if.changes.insert(w.what_if.changes.begin(), "--as-plan " + vm["as-plan"].as<std::string>());
  w.options.stragglers.insert(w.options.stragglers.end(), w.what_if.slowdowns.begin(), w.what_if.slowdowns.end());
  return w;
}

// --- step 3: the report ---

// Where the replay's load tasks take their time from: the trace, or where it has none, the
// plan's input path (a trace from before loads were timed, or one that left them out).
std::string loads_text(const Replay& r) {
  if (r.measured_loads == r.loads) return "every load at its measured duration (the loader as it ran)";
  const std::string path = "the plan's input path, in closed form";
  if (r.measured_loads == 0) return "the trace has no load times: every load by " + path;
  return std::to_string(r.measured_loads) + " of the " + std::to_string(r.loads) +
         " loads at their measured durations, the rest by " + path;
}

std::vector<double> step_times(const traces::Metrics& m) {
  std::vector<double> out;
  double previous = 0;
  for (const double end : m.iteration_end_s) {
    out.push_back(end - previous);
    previous = end;
  }
  return out;
}

}  // namespace

void replay_options(po::options_description& options) {
  options.add_options()
      ("trace-file", po::value<std::string>(), "the trace to replay (CSV, the traces/ format; the first argument)")
      ("plan", po::value<std::string>(), "the plan file the trace ran (its fingerprint must match; required)")
      ("calibration", po::value<std::string>(), "calibration YAML for the simulated network")
      ("trace", po::value<std::string>(), "write the replayed trace as CSV")
      ("chrome", po::value<std::string>(), "write the replayed trace as Chrome trace JSON")
      ("metrics", po::value<std::string>(), "write the replay's per-iteration metrics as CSV")
      ("as-plan", po::value<std::string>(),
       "what if the trace's durations ran this plan of the same network (another schedule, micro-batching, stages)");
  add_what_if_options(options);
}

int run_replay(const std::vector<std::string>& args, std::ostream& out) {
  po::options_description options("replay options");
  po::variables_map vm;
  if (!parse_command_options("replay", args, options, vm, out)) return 0;
  if (!vm.count("trace-file")) {  // --trace names the output here, as in simulate and run
    throw InputError("<command line>", 0, "TRACE",
                     "expected the trace to replay as the first argument (--trace names the file the replayed trace "
                     "is written to)");
  }
  if (!vm.count("plan")) {
    throw InputError("<command line>", 0, "--plan", "is required: the plan file the trace ran");
  }
  // 1. The trace and its plan.
  const Replay r = read_replay(vm);

  // 2. The replay, and beside it the replay on changed hardware when asked (what-if).
  const sim::SimResult replayed = sim::simulate(r.plan, r.options);
  const WhatIfReplay w = read_what_if_replay(vm, r);
  const partition::Plan& changed = w.plan;
  const WhatIf& what_if = w.what_if;
  const sim::SimResult what_if_run = what_if.any() && replayed.completed ? sim::simulate(changed, w.options) : sim::SimResult{};
  const sim::SimResult& written = what_if.any() ? what_if_run : replayed;
  auto write = [&](const char* option, const std::string& text) {
    if (!vm.count(option)) return;
    std::ofstream file(vm[option].as<std::string>());
    if (!file) throw InputError(vm[option].as<std::string>(), 0, std::string("--") + option, "cannot be written");
    file << text;
  };
  write("trace", traces::write_trace_csv(written.trace));
  write("chrome", traces::write_chrome_trace(written.trace));

  // 3. The report: per iteration, then the steady state (after iteration 0, as metrics define it).
  const partition::CostModel cost(r.plan.cluster, r.plan.layout.precision, r.options.calibration);
  const traces::Metrics measured = traces::compute_metrics(r.measured, r.plan, cost);
  const traces::Metrics got = replayed.completed ? traces::compute_metrics(replayed.trace, r.plan, cost) : traces::Metrics{};
  const std::vector<double> measured_s = step_times(measured), replayed_s = step_times(got);
  const double error = relative_error(got.iteration_time_s, measured.iteration_time_s);
  const bool compare = what_if.any() && what_if_run.completed;
  const traces::Metrics changed_metrics =
      compare ? traces::compute_metrics(what_if_run.trace, changed,
                                        partition::CostModel(changed.cluster, changed.layout.precision, w.options.calibration))
              : traces::Metrics{};
  if (vm.count("metrics") && written.completed) {
    write("metrics", traces::write_metrics_csv(what_if.any() ? changed_metrics : got, written.trace));
  }
  if (vm.count("json")) {
    Json steps = Json::array();
    for (size_t i = 0; i < measured_s.size(); ++i) {
      const double rs = i < replayed_s.size() ? replayed_s[i] : 0;
      steps.push_back({{"iteration", i}, {"measured_s", measured_s[i]}, {"replayed_s", rs},
                       {"error", relative_error(rs, measured_s[i])}});
    }
    Json j{{"completed", replayed.completed},
           {"stalls", replayed.stalls},
           {"trace", r.trace_path},
           {"source", r.measured.source},
           {"fingerprint", r.plan.fingerprint},
           {"iterations", steps},
           {"measured_iteration_time_s", measured.iteration_time_s},
           {"replayed_iteration_time_s", got.iteration_time_s},
           {"iteration_time_error", error},
           {"wall_s", replayed.wall_s}};
    if (r.loads > 0) j["loads"] = {{"instances", r.loads}, {"measured", r.measured_loads}};
    if (!r.measured.partial.empty()) {
      j["partial"] = r.measured.partial;
      j["planned_iterations"] = r.planned_iterations;
    }
    if (compare) {
      j["what_if"] = what_if_json(what_if, got, changed_metrics);
      if (w.other_plan) {
        j["what_if"]["plan"] = {{"fingerprint", changed.fingerprint},
                                {"measured_tasks", w.transferred.measured_tasks},
                                {"modelled_tasks", w.transferred.modelled_tasks}};
      }
    }
    print_json(out, j);
    return replayed.completed ? 0 : 4;
  }
  out << "replayed " << r.plan.network.name << " on " << r.plan.cluster.name << " from " << r.trace_path << " ("
      << r.measured.source << (r.measured.compute.empty() ? "" : ", compute " + r.measured.compute)
      << "): every compute task at its measured duration, communication by the simulator's network\n";
  if (r.loads > 0) out << "  " << loads_text(r) << "\n";
  if (!r.measured.partial.empty()) {
    out << "  a partial trace (" << r.measured.partial << "): its " << r.plan.layout.iterations
        << " complete iteration" << (r.plan.layout.iterations == 1 ? "" : "s") << " of " << r.planned_iterations << "\n";
  }
  if (!replayed.completed) {
    out << "THE REPLAY DID NOT COMPLETE:\n";
    for (const std::string& s : replayed.stalls) out << "  " << s << "\n";
    return 4;
  }
  out << "  iteration     measured     replayed      error\n";
  for (size_t i = 0; i < measured_s.size(); ++i) {
    const double rs = i < replayed_s.size() ? replayed_s[i] : 0;
    out << "  " << std::setw(9) << i << std::setw(13) << u::human_time_s(measured_s[i]) << std::setw(13)
        << u::human_time_s(rs) << std::setw(11) << signed_percent(relative_error(rs, measured_s[i]), 2) << "\n";
  }
  out << "  steady state (" << measured.measured_iterations << " iteration" << (measured.measured_iterations == 1 ? "" : "s")
      << (measured.iterations > measured.measured_iterations ? " after the first" : "") << "): "
      << u::human_time_s(measured.iteration_time_s) << " measured, " << u::human_time_s(got.iteration_time_s)
      << " replayed, " << signed_percent(error, 2) << "\n";
  if (compare) {
    print_what_if(out, what_if, got, changed_metrics);
    if (w.other_plan) {
      out << "  (the other plan's " << w.transferred.measured_tasks + w.transferred.modelled_tasks
          << " compute tasks: " << w.transferred.measured_tasks << " timed from the trace's layers";
      if (w.transferred.modelled_tasks > 0) {
        out << ", " << w.transferred.modelled_tasks << " by the cost model (layers or GPU types the trace never ran)";
      }
      out << ")\n";
      const bool loads = std::any_of(changed.tasks.begin(), changed.tasks.end(),
                                     [](const partition::Task& t) { return t.kind == partition::TaskKind::load; });
      if (loads) out << "  (the other plan's loads: by its input path, in closed form, not the trace's)\n";
    }
  }
  if (vm.count("trace")) out << "wrote " << vm["trace"].as<std::string>() << "\n";
  return 0;
}

}  // namespace hetflow::tools
