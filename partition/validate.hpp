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
  // Problems counted but not listed (devices over their memory beyond the worst few), and
  // the sentence that says what they are; count() is every problem, listed or not.
  size_t unlisted = 0;
  std::string unlisted_note;
  // Devices over their memory, listed or not: when there are any, they are every problem
  // (memory is checked last, on a plan otherwise valid), out of `devices`.
  size_t over_memory = 0;
  size_t devices = 0;
  size_t count() const { return problems.size() + unlisted; }
  bool ok() const { return problems.empty() && unlisted == 0; }
};

// Checks everything; never throws on a malformed plan (that is what it reports).
Validation validate_plan(const Plan& plan);
// Throws PlanError when the plan is not valid: "N problems" (or, when those are devices over
// their memory, "N of D devices over their memory, the 5 worst:"), then each listed one and
// the note on those not listed.
void require_valid(const Plan& plan);

}  // namespace hetflow::partition
