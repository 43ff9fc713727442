#pragma once
// `hetflow calibrate --measured FILE`: the table of measured runs and the report of their
// step-time fit (sim/step_calibration.hpp).
//
// The table, CSV with a header (columns in any order, '#' lines are comments) or YAML
// (`runs:` a list of mappings with the same fields):
//   plan      a plan file (relative to the table), standing alone; or
//   cluster, model, options   what `hetflow simulate` takes to plan it (options: its plan
//             options, e.g. "--pipeline 4 --microbatches 8")
//   step_s    the measured seconds per iteration (steady state)
#include <iosfwd>
#include <string>
#include <vector>

#include "sim/step_calibration.hpp"
#include "tools/cli.hpp"

namespace hetflow::tools {

// Every run of the table planned; InputError naming the file, the row's line and the field.
// Without need_times a row may leave step_s out or empty (candidates for --design; 0 then).
std::vector<sim::StepRun> read_measured_runs(const std::string& path, std::ostream& out, bool need_times = true);

// The rows `chosen` (indices in table order) of the table at `path`, written as a CSV table
// of the same fields (step_s as given, or empty to fill in once measured).
void write_runs_table(const std::string& path, const std::vector<size_t>& chosen, const std::string& out_path);

// The design: which runs to measure and what they would leave each parameter at.
void print_step_design(std::ostream& out, const sim::StepDesign& design, const std::vector<sim::StepRun>& runs, double noise);
Json step_design_json(const sim::StepDesign& design, const std::vector<sim::StepRun>& runs);

// Each parameter with its prior, fitted value and relative uncertainty; each run measured,
// fitted and held out; MAPE and Spearman in and out of sample; the warnings.
void print_step_fit(std::ostream& out, const sim::StepFit& fit, const std::vector<sim::StepRun>& runs, bool simulated);
Json step_fit_json(const sim::StepFit& fit, const std::vector<sim::StepRun>& runs);

}  // namespace hetflow::tools
