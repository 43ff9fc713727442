#pragma once
// A plan's dependencies as a back end walks them over several iterations: each task's
// successors with their iteration offsets, how many inputs each task waits for in a given
// iteration (an edge with offset k counts from iteration k on), and which send meets which
// receive (the k-th send on a channel meets its k-th receive, in program order). The
// simulator and the executor both run plans from this, so they unroll iterations the same way.
#include <span>
#include <utility>
#include <vector>

#include "partition/plan.hpp"

namespace hetflow::partition {

class RunGraph {
 public:
  struct Successor {
    int task = -1;
    int offset = 0;       // in iterations: iteration i of this task feeds iteration i + offset
    double fraction = 1;  // fed once this task has done this part of its work (OrderEdge)
  };

  // Throws PlanError for an edge between tasks of different devices (devices meet only
  // through transfers and collectives).
  explicit RunGraph(const Plan& plan);

  std::span<const Successor> successors(int task) const {
    const auto t = static_cast<size_t>(task);
    return {successors_.data() + successor_begin_[t], static_cast<size_t>(successor_begin_[t + 1] - successor_begin_[t])};
  }
  // Unfinished inputs of every task at the start of iteration i.
  std::vector<int> inputs(int iteration) const;
  // The other side of a transfer task (send <-> recv); -1 for other tasks or an unmatched side.
  int partner(int task) const { return partner_[static_cast<size_t>(task)]; }
  // For a send or recv: its position k among the sends (or receives) on its channel, per iteration.
  int channel_position(int task) const { return position_[static_cast<size_t>(task)]; }

 private:
  std::vector<int> successor_begin_;
  std::vector<Successor> successors_;
  std::vector<int> base_inputs_;                     // per task: inputs with offset 0
  std::vector<std::pair<int, int>> delayed_inputs_;  // (offset, task) of each edge with an offset
  std::vector<int> partner_, position_;
};

}  // namespace hetflow::partition
