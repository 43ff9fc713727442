#pragma once
// How `hetflow run` reports a run: the measured figures beside the simulator's prediction and
// the analytic estimate of the same plan (run/compare.hpp), as text tables or the --json object.
#include <iosfwd>
#include <vector>

#include "exec/engine.hpp"
#include "exec/segmented_run.hpp"
#include "run/compare.hpp"
#include "run/run.hpp"
#include "tools/cli.hpp"

namespace hetflow::tools {

// The --json object; `ranks` is how many MPI ranks ran it, `watchdog_s` the engine's stall
// limit, `checkpoints` the pauses to write --save-interval's checkpoints (exec/segmented_run.hpp).
Json run_report_json(const run::Request& r, const run::TrainingSetup& t, const exec::RunResult& result,
                     const run::Comparison& c, int ranks, double watchdog_s, const std::vector<exec::Pause>& checkpoints);

// The text report of a completed run: the layout, what ran and how, each step, the
// checkpoints written on the way, the figures beside their predictions, and per device
// utilisation and memory against the plan's.
void print_run_report(std::ostream& out, const run::Request& r, const run::TrainingSetup& t,
                      const exec::RunResult& result, const run::Comparison& c, int ranks,
                      const std::vector<exec::Pause>& checkpoints);

}  // namespace hetflow::tools
