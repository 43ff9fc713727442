#pragma once
// Reading the traces a command is given, and the plan each one ran (replay, calibrate,
// timeline): errors name the file and the field.
#include <string>

#include "partition/plan.hpp"
#include "traces/trace.hpp"

namespace hetflow::tools {

// A trace file (CSV); InputError for a missing, unreadable, malformed or empty one.
traces::Trace read_trace_file(const std::string& path);

// The plan file a trace ran, with the trace's iteration count (a run records its warm-up
// and steps; simulate its iterations; a partial trace its planned iterations), validated, its fingerprint checked against the
// trace's: InputError naming the trace's file and `fingerprint` when it is another plan's.
partition::Plan plan_of_trace(const std::string& plan_path, const std::string& option, const traces::Trace& trace,
                              const std::string& trace_path);

}  // namespace hetflow::tools
