#include "traces/traffic.hpp"

#include <string>

#include "model/error.hpp"
#include "partition/traffic.hpp"

namespace hetflow::traces {

std::vector<double> carried_bytes_per_communicator(const partition::Plan& plan, const Trace& trace) {
  std::vector<double> bytes(plan.communicators.size(), 0.0);
  for (const Event& e : trace.events) {
    if (e.task < 0 || static_cast<size_t>(e.task) >= plan.tasks.size()) {
      throw Error("trace event of task " + std::to_string(e.task) + ", which the plan does not have");
    }
    if (e.message >= 0) {  // an in-task message: its collective's communicator
      if (e.group < 0 || static_cast<size_t>(e.group) >= plan.collectives.size()) {
        throw Error("trace event of a message of collective " + std::to_string(e.group) + ", which the plan does not have");
      }
      bytes[static_cast<size_t>(plan.collective(e.group).communicator)] += e.bytes;
      continue;
    }
    const int c = partition::communicator_of(plan, plan.task(e.task));
    if (c >= 0) bytes[static_cast<size_t>(c)] += e.bytes;
  }
  return bytes;
}

}  // namespace hetflow::traces
