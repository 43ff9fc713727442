#pragma once
// The order in which a plan's tasks can run. Tasks that must happen together — the two sides
// of a transfer, the participants of a collective — are one "unit"; a unit can start when
// every data dependency and every earlier task on the same device stream of each of its
// tasks is done. A plan whose units cannot be ordered deadlocks.
#include <string>
#include <vector>

#include "partition/plan.hpp"

namespace hetflow::partition {

struct TaskOrder {
  std::vector<int> unit_of_task;          // task -> unit
  std::vector<std::vector<int>> units;    // unit -> its tasks
  std::vector<int> order;                 // units in an order that respects every dependency
  // CSR successor lists between units (data dependencies and program order, deduplicated
  // only where cheap).
  std::vector<int> successor_begin, successors;
  std::vector<int> cycle;                 // when order is incomplete: tasks on one cycle
  bool complete() const { return order.size() == units.size(); }
};

// Deterministic: the same plan gives the same order.
TaskOrder order_tasks(const Plan& plan);

// "device 3 (n0/gpu3) stream recv<2:act: recv #17 iteration 0 stage 1 mb 4" — for messages.
std::string describe_task(const Plan& plan, int task);

}  // namespace hetflow::partition
