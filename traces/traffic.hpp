#pragma once
// What a trace says each communicator carried: the other side of partition/traffic.hpp's
// conservation check. An executor's trace records the bytes its back end moved
// (exec::TaskContext::carried_bytes); the simulator's, the bytes it sent.
#include <vector>

#include "partition/plan.hpp"
#include "traces/trace.hpp"

namespace hetflow::traces {

// Per communicator of `plan`, summed over the trace's iterations: each transfer and
// collective event's bytes on the communicator its task uses. Throws hetflow::Error when an
// event names a task the plan lacks.
std::vector<double> carried_bytes_per_communicator(const partition::Plan& plan, const Trace& trace);

}  // namespace hetflow::traces
