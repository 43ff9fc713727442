#pragma once
// The trace event of one task instance, as every back end records it: the plan's task
// (device, stream, kind, purpose, stage, micro-batch, peer, channel or collective, bytes,
// FLOPs) in one iteration. Times are the back end's to fill in.
#include "partition/plan.hpp"
#include "traces/trace.hpp"

namespace hetflow::traces {

// start_s and end_s are left 0.
Event task_event(const partition::Plan& plan, int task, int iteration);

// The event of message k of compute task `task`'s in-task collectives (plan.inside(task)[k]):
// on the task's device and stream, of kind collective with the collective's purpose and one
// message's bytes. start_s and end_s are left 0.
Event in_task_event(const partition::Plan& plan, int task, int iteration, int k);

}  // namespace hetflow::traces
