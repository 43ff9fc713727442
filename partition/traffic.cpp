#include "partition/traffic.hpp"

namespace hetflow::partition {

int communicator_of(const Plan& plan, const Task& task) {
  switch (task.kind) {
    case TaskKind::send:
    case TaskKind::recv:
      return plan.channel(task.channel).communicator;
    case TaskKind::collective:
      return plan.collective(task.collective).communicator;
    default:
      return -1;
  }
}

std::vector<double> planned_bytes_per_communicator(const Plan& plan) {
  std::vector<double> bytes(plan.communicators.size(), 0.0);
  for (const Task& t : plan.tasks) {
    const int c = communicator_of(plan, t);
    if (c < 0) continue;
    bytes[static_cast<size_t>(c)] += t.kind == TaskKind::collective ? plan.collective(t.collective).bytes : t.bytes;
  }
  for (const Collective& c : plan.collectives) {  // in-task: no task of their own; each member moves `bytes`
    if (c.in_task()) bytes[static_cast<size_t>(c.communicator)] += c.bytes * static_cast<double>(c.tasks.size());
  }
  return bytes;
}

}  // namespace hetflow::partition
