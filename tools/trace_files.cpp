#include "tools/trace_files.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "model/error.hpp"
#include "partition/plan_io.hpp"
#include "partition/validate.hpp"
#include "tools/plan_options.hpp"
#include "traces/trace_io.hpp"

namespace hetflow::tools {

traces::Trace read_trace_file(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    throw InputError(path, 0, "trace", std::filesystem::exists(path, ec) ? "is not a regular file" : "cannot be read: no such file");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path, 0, "trace", "cannot be read");
  std::ostringstream text;
  text << in.rdbuf();  // an empty file inserts nothing: the reader then says what is missing
  traces::Trace trace = traces::read_trace_csv(text.str(), path);
  if (trace.events.empty()) throw InputError(path, 0, "events", "the trace has no events");
  return trace;
}

partition::Plan plan_of_trace(const std::string& plan_path, const std::string& option, const traces::Trace& trace,
                              const std::string& trace_path) {
  int iterations = 0;
  for (const traces::Event& e : trace.events) iterations = std::max(iterations, e.iteration + 1);
  if (trace.planned_iterations > 0) {  // a partial trace: its events stop short of what the plan ran for
    if (iterations > trace.planned_iterations) {
      throw InputError(trace_path, 0, "planned iterations",
                       "the trace says its run had " + std::to_string(trace.planned_iterations) +
                           " iterations, but its events reach iteration " + std::to_string(iterations - 1));
    }
    iterations = trace.planned_iterations;
  }
  partition::Plan plan = read_plan_file(plan_path, option);
  partition::require_valid(plan);
  plan.layout.iterations = iterations;  // a run's trace: the plan with its warm-up and steps
  plan.fingerprint = partition::plan_fingerprint(plan);
  if (trace.fingerprint != plan.fingerprint) {
    throw InputError(trace_path, 0, "fingerprint",
                     "the trace was made from another plan: it says " + trace.fingerprint + ", " + plan_path +
                         " run for " + std::to_string(iterations) + " iterations gives " + plan.fingerprint);
  }
  return plan;
}

}  // namespace hetflow::tools
