#pragma once
// The devices a simulation of a plan touches, so that only their nodes are built: a folded
// plan of 98,304 GPUs runs one replica's 64 and their ring neighbours, and SimGrid's set-up
// of a platform grows faster than linearly with its nodes.
#include <vector>

#include "partition/plan.hpp"
#include "sim/simulator.hpp"

namespace hetflow::sim {

// One entry per device of the plan's cluster: true for a device that runs a program, the
// ring neighbours a folded collective's member sends to and receives from, the devices a
// straggler or fault names, and device 0 (where fault actors live). Empty (every device)
// when a fault names a link, which may lie on any node.
std::vector<bool> needed_hosts(const partition::Plan& plan, const SimOptions& options);

}  // namespace hetflow::sim
