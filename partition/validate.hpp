#pragma once
// Validation of a plan before anything runs it: consistent tasks and programs, every send
// matched by exactly one receive of the same size, data dependencies local to a device,
// every virtual worker covering every layer exactly once, no deadlock, every device within
// its memory. A workload plan (layout policy `kWorkloadPolicy`: tasks read from a Chakra
// execution trace, which knows no layers) has no virtual workers; the checks of workers and
// their layers then have nothing to check.
#include <string>
#include <vector>

#include "partition/plan.hpp"

namespace hetflow::partition {

// The estimate and the simulator keep state for every task of every iteration, and take
// time in proportion: a plan may run at most this many task instances (tasks x iterations).
constexpr long long kMaxTaskInstances = 100'000'000;

// The layout policy of a plan whose tasks were read from a workload trace, not planned.
inline constexpr const char* kWorkloadPolicy = "chakra";

struct Validation {
  std::vector<std::string> problems;  // each a sentence naming the task, device or term at fault
  bool ok() const { return problems.empty(); }
};

// Checks everything; never throws on a malformed plan (that is what it reports).
Validation validate_plan(const Plan& plan);
// Throws PlanError listing every problem when the plan is not valid.
void require_valid(const Plan& plan);

}  // namespace hetflow::partition
