#pragma once
// The trace event of one task instance, as every back end records it: the plan's task
// (device, stream, kind, purpose, stage, micro-batch, peer, channel or collective, bytes,
// FLOPs) in one iteration. Times are the back end's to fill in.
#include "partition/plan.hpp"
#include "traces/trace.hpp"

namespace hetflow::traces {

// start_s and end_s are left 0.
Event task_event(const partition::Plan& plan, int task, int iteration);

}  // namespace hetflow::traces
