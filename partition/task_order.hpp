#pragma once
// The order in which a plan's tasks can run. Tasks that must happen together — the two sides
// of a transfer, the participants of a collective — are one "unit"; a unit can start when
// every data dependency and every earlier task on the same device stream of each of its
// tasks is done. A plan whose units cannot be ordered deadlocks.
#include <span>
#include <string>
#include <vector>

#include "partition/plan.hpp"

namespace hetflow::partition {

struct TaskOrder {
  std::vector<int> unit_of_task;          // task -> unit
  // unit -> its tasks: unit u's are unit_tasks[unit_begin[u], unit_begin[u + 1])
  std::vector<int> unit_begin, unit_tasks;
  std::vector<int> order;                 // units in an order that respects every dependency
  // CSR successor lists between units (data dependencies and program order, deduplicated
  // only where cheap).
  std::vector<int> successor_begin, successors;
  // Per successor entry: the part of the unit's work it waits for (OrderEdge::fraction; 1 for
  // data edges, program order and whole-task order edges).
  std::vector<double> successor_fraction;
  std::vector<int> cycle;                 // when order is incomplete: tasks on one cycle
  size_t unit_count() const { return unit_begin.empty() ? 0 : unit_begin.size() - 1; }
  std::span<const int> unit(int u) const {
    const auto b = static_cast<size_t>(unit_begin[static_cast<size_t>(u)]);
    return {unit_tasks.data() + b, static_cast<size_t>(unit_begin[static_cast<size_t>(u) + 1]) - b};
  }
  bool complete() const { return order.size() == unit_count(); }
  // Every task, unit by unit in `order`: one legal sequential run of the iteration.
  std::vector<int> task_sequence() const;
};

// Deterministic: the same plan gives the same order.
TaskOrder order_tasks(const Plan& plan);

// "device 3 (n0/gpu3) stream recv<2:act: recv #17 iteration 0 stage 1 mb 4" — for messages.
std::string describe_task(const Plan& plan, int task);

}  // namespace hetflow::partition
