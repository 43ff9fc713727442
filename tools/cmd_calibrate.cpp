// hetflow calibrate: fit a calibration (traces/calibrate.hpp) to measured traces, print each
// fit with its residual, and write the calibration YAML that plan, simulate, run and replay
// read with --calibration. Three steps: read the traces and their plans, fit, report.
#include <fstream>
#include <iomanip>
#include <ostream>
#include <sstream>

#include "model/error.hpp"
#include "model/units.hpp"
#include "tools/calibrate_measured.hpp"
#include "tools/cli.hpp"
#include "tools/plan_options.hpp"
#include "tools/trace_files.hpp"
#include "traces/calibrate.hpp"

namespace hetflow::tools {

namespace {

namespace u = model::units;

struct Inputs {
  std::vector<std::string> trace_paths;
  std::vector<traces::Trace> traces;
  std::vector<partition::Plan> plans;
  model::Calibration prior;
};

// --- step 1: every trace with the plan it ran ---

Inputs read_inputs(const po::variables_map& vm) {
  Inputs in;
  in.trace_paths = vm["trace"].as<std::vector<std::string>>();
  const std::vector<std::string> plan_paths = vm["plan"].as<std::vector<std::string>>();
  if (plan_paths.size() != 1 && plan_paths.size() != in.trace_paths.size()) {
    throw InputError("<command line>", 0, "--plan",
                     "expected one plan for all traces or one per trace (" + std::to_string(in.trace_paths.size()) +
                         " traces, " + std::to_string(plan_paths.size()) + " plans)");
  }
  for (size_t i = 0; i < in.trace_paths.size(); ++i) {
    in.traces.push_back(read_trace_file(in.trace_paths[i]));
    in.plans.push_back(plan_of_trace(plan_paths[plan_paths.size() == 1 ? 0 : i], "--plan", in.traces.back(),
                                     in.trace_paths[i]));
  }
  in.prior = read_calibration_option(vm, in.plans.front().cluster);
  return in;
}

// --- step 3: the report ---

std::string percent(double fraction) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(2) << 100 * fraction << " %";
  return s.str();
}

std::string number(double x, int precision = 4) {
  std::ostringstream s;
  s << std::setprecision(precision) << x;
  return s.str();
}

void print_fit(std::ostream& out, const traces::CalibrationFit& fit, size_t runs) {
  out << "calibrated from " << runs << (runs == 1 ? " trace" : " traces") << "\n\n";
  out << "compute, per GPU type and task kind (median duration of each task over the iterations after the first):\n"
      << "  time = overhead + F / (peak x max_efficiency x (1 - exp(-F / saturation)))\n";
  out << "  " << std::left << std::setw(12) << "gpu" << std::setw(17) << "kind" << std::right << std::setw(6) << "tasks"
      << std::setw(7) << "sizes" << std::setw(10) << "max eff" << std::setw(14) << "saturation" << std::setw(12)
      << "overhead" << std::setw(11) << "residual" << "\n";
  for (const traces::ComputeFit& c : fit.compute) {
    out << "  " << std::left << std::setw(12) << c.gpu << std::setw(17) << c.kind << std::right << std::setw(6)
        << c.observations << std::setw(7) << c.sizes << std::setw(10) << number(c.efficiency.max_efficiency, 3)
        << std::setw(14) << (c.efficiency.saturation_flops > 0 ? u::human_flops(c.efficiency.saturation_flops) : "flat")
        << std::setw(12) << u::human_time_s(c.efficiency.overhead_s) << std::setw(11) << percent(c.residual)
        << (c.note.empty() ? "" : "   (" + c.note + ")") << "\n";
  }
  out << "\npeak of each GPU type as each run's plan gives it (cpu-N:probed: the speed probed then):\n";
  for (const traces::PeakSeen& p : fit.peaks) {
    out << "  " << std::left << std::setw(12) << p.gpu << std::right << std::setw(14) << u::human_flops(p.peak_flops_per_s)
        << "/s   " << p.run << "\n";
  }
  out << "\ndispatch, per GPU type (time from a compute task being ready to its start: each run's mean, their median):\n";
  for (const traces::DispatchFit& d : fit.dispatch) {
    out << "  " << std::left << std::setw(12) << d.gpu << std::right << std::setw(12) << u::human_time_s(d.dispatch_s)
        << "   over " << d.observations << " task instances in " << d.runs << (d.runs == 1 ? " run\n" : " runs\n");
  }
  out << "\nlinks, per class (from both sides ready to received; A, B: the nominal latency and bandwidth parts):\n"
      << "  time = latency_factor x A + B / bandwidth_factor\n";
  if (fit.links.empty()) out << "  (no transfer or collective with bytes in the traces)\n";
  for (const traces::LinkFit& l : fit.links) {
    out << "  " << std::left << std::setw(10) << l.link_class << std::right << std::setw(6) << l.observations
        << " obs " << std::setw(3) << l.sizes << " sizes   latency x" << number(l.factors.latency_factor) << " = "
        << u::human_time_s(l.nominal_latency_s * l.factors.latency_factor) << ", bandwidth x"
        << number(l.factors.bandwidth_factor) << " = "
        << u::human_bandwidth(l.nominal_bandwidth_bytes_per_s * l.factors.bandwidth_factor) << "   residual "
        << percent(l.residual) << (l.note.empty() ? "" : "   (" + l.note + ")") << "\n";
  }
  if (!fit.warnings.empty()) out << "\n";
  for (const std::string& w : fit.warnings) out << "warning: " << w << "\n";
}

Json fit_json(const traces::CalibrationFit& fit) {
  Json compute = Json::array(), dispatch = Json::array(), links = Json::array();
  for (const traces::ComputeFit& c : fit.compute) {
    compute.push_back({{"gpu", c.gpu},
                       {"kind", c.kind},
                       {"tasks", c.observations},
                       {"sizes", c.sizes},
                       {"max_efficiency", c.efficiency.max_efficiency},
                       {"saturation_flops", c.efficiency.saturation_flops},
                       {"overhead_s", c.efficiency.overhead_s},
                       {"residual", c.residual},
                       {"note", c.note}});
  }
  for (const traces::DispatchFit& d : fit.dispatch) {
    dispatch.push_back({{"gpu", d.gpu}, {"tasks", d.observations}, {"runs", d.runs}, {"dispatch_s", d.dispatch_s}});
  }
  for (const traces::LinkFit& l : fit.links) {
    links.push_back({{"class", l.link_class},
                     {"observations", l.observations},
                     {"sizes", l.sizes},
                     {"latency_factor", l.factors.latency_factor},
                     {"bandwidth_factor", l.factors.bandwidth_factor},
                     {"latency_s", l.nominal_latency_s * l.factors.latency_factor},
                     {"bandwidth_bytes_per_s", l.nominal_bandwidth_bytes_per_s * l.factors.bandwidth_factor},
                     {"residual", l.residual},
                     {"note", l.note}});
  }
  Json peaks = Json::array();
  for (const traces::PeakSeen& p : fit.peaks) {
    peaks.push_back({{"gpu", p.gpu}, {"run", p.run}, {"peak_flops_per_s", p.peak_flops_per_s}});
  }
  return Json{{"compute", compute}, {"dispatch", dispatch}, {"links", links}, {"peaks", peaks}, {"warnings", fit.warnings}};
}

void write_file(const std::string& path, const model::Calibration& calibration) {
  std::ofstream file(path, std::ios::binary);
  if (!(file << model::write_calibration(calibration)) || !file.flush()) {
    throw InputError(path, 0, "--out", "cannot be written");
  }
}

int run_calibrate_measured(const po::variables_map& vm, std::ostream& out) {
  const std::string table = vm["measured"].as<std::string>();
  const bool design = vm.count("design") != 0;
  const std::vector<sim::StepRun> runs = read_measured_runs(table, out, !design);
  sim::StepFitOptions options;
  options.prior = read_calibration_option(vm, runs.front().plan.cluster);
  options.folds = vm["folds"].as<int>();
  if (options.folds < 0) throw InputError("<command line>", 0, "--folds", "expected 0 or more");
  options.simulate = vm.count("estimate-only") == 0;
  options.groups.clear();
  std::istringstream groups(vm["fit"].as<std::string>());
  for (std::string g; std::getline(groups, g, ',');) {
    if (g == "efficiency") options.groups.insert(sim::StepParameterKind::max_efficiency);
    else if (g == "overhead") options.groups.insert(sim::StepParameterKind::overhead);
    else if (g == "bandwidth") options.groups.insert(sim::StepParameterKind::bandwidth_factor);
    else if (g == "latency") options.groups.insert(sim::StepParameterKind::latency_factor);
    else throw InputError("<command line>", 0, "--fit", "expected efficiency, overhead, bandwidth or latency, found '" + g + "'");
  }
  options.starts = vm["starts"].as<int>();
  if (options.starts < 1) throw InputError("<command line>", 0, "--starts", "expected 1 or more");
  const std::string path = vm["out"].as<std::string>();
  if (design) {
    const int count = vm["design"].as<int>();
    if (count < 1) throw InputError("<command line>", 0, "--design", "expected 1 or more runs to choose");
    const double noise = 0.01;
    const sim::StepDesign d = sim::design_step_runs(runs, options, static_cast<size_t>(count), noise);
    write_runs_table(table, d.chosen, path);
    if (vm.count("json")) {
      Json j = step_design_json(d, runs);
      j["wrote"] = path;
      print_json(out, j);
      return 0;
    }
    print_step_design(out, d, runs, noise);
    out << "\nwrote " << path << " (measure these runs, fill in step_s, then calibrate --measured " << path << ")\n";
    return 0;
  }
  const sim::StepFit fit = sim::calibrate_step_times(runs, options);
  write_file(path, fit.calibration);
  if (vm.count("json")) {
    Json j = step_fit_json(fit, runs);
    j["wrote"] = path;
    print_json(out, j);
    return 0;
  }
  print_step_fit(out, fit, runs, options.simulate);
  out << "\nwrote " << path << " (use it with --calibration on plan, simulate, run, replay and search)\n";
  return 0;
}

}  // namespace

void calibrate_options(po::options_description& options) {
  options.add_options()
      ("trace", po::value<std::vector<std::string>>()->multitoken(),
       "measured traces (CSV, as run --trace writes them); several give more task sizes")
      ("plan", po::value<std::vector<std::string>>()->composing(),
       "the plan each trace ran (one for all, or one per trace in the same order)")
      ("measured", po::value<std::string>(),
       "instead of traces: a table (CSV or YAML) of runs and their measured seconds per iteration")
      ("folds", po::value<int>()->default_value(4), "--measured: k-fold cross-validation (0: none)")
      ("fit", po::value<std::string>()->default_value("efficiency,overhead,bandwidth,latency"),
       "--measured: the kinds of parameter to fit (the others keep the prior's)")
      ("estimate-only", "--measured: fit through the analytic estimate alone (fast; no contention)")
      ("starts", po::value<int>()->default_value(3),
       "--measured: fits from the prior and from the best of 4 x N-1 deterministic start points (1: the prior alone)")
      ("design", po::value<int>(),
       "--measured: choose this many of the table's runs (step_s may be empty) that best determine the parameters, "
       "and write them to --out as a table to measure")
      ("out,o", po::value<std::string>()->required(), "write the calibration YAML here (--design: the chosen runs' table)")
      ("calibration", po::value<std::string>(), "a calibration to start from: what the traces cannot fit is kept");
}

int run_calibrate(const std::vector<std::string>& args, std::ostream& out) {
  po::options_description options("calibrate options");
  po::variables_map vm;
  if (!parse_command_options("calibrate", args, options, vm, out)) return 0;
  if (vm.count("measured")) {
    if (vm.count("trace") || vm.count("plan")) {
      throw InputError("<command line>", 0, "--measured", "fits step times instead of traces: give one or the other");
    }
    return run_calibrate_measured(vm, out);
  }
  if (!vm.count("trace")) throw InputError("<command line>", 0, "--trace", "expected measured traces (or --measured FILE)");
  if (!vm.count("plan")) throw InputError("<command line>", 0, "--plan", "expected the plan each trace ran");
  const Inputs in = read_inputs(vm);

  std::vector<traces::MeasuredRun> runs;
  for (size_t i = 0; i < in.traces.size(); ++i) runs.push_back({&in.traces[i], &in.plans[i], in.trace_paths[i]});
  const traces::CalibrationFit fit = traces::calibrate(runs, in.prior);

  const std::string path = vm["out"].as<std::string>();
  write_file(path, fit.calibration);
  if (vm.count("json")) {
    Json j = fit_json(fit);
    j["wrote"] = path;
    print_json(out, j);
    return 0;
  }
  print_fit(out, fit, runs.size());
  out << "\nwrote " << path << " (use it with --calibration on plan, simulate, run and replay)\n";
  return 0;
}

}  // namespace hetflow::tools
