#include "partition/run_graph.hpp"

#include <algorithm>
#include <string>

#include "model/error.hpp"

namespace hetflow::partition {

RunGraph::RunGraph(const Plan& plan) {
  const size_t n = plan.tasks.size();
  successor_begin_.assign(n + 1, 0);
  base_inputs_.assign(n, 0);
  for (auto [it, end] = boost::edges(plan.graph); it != end; ++it) {
    const auto from = boost::source(*it, plan.graph), to = boost::target(*it, plan.graph);
    if (plan.tasks[from].device != plan.tasks[to].device) {
      throw PlanError("task " + std::to_string(to) + " on device " + std::to_string(plan.tasks[to].device) +
                      " depends on task " + std::to_string(from) + " on device " +
                      std::to_string(plan.tasks[from].device) + ": devices meet only through transfers");
    }
    ++successor_begin_[from + 1];
    const int offset = plan.graph[*it].offset;
    if (offset == 0) {
      ++base_inputs_[to];
    } else {
      delayed_inputs_.emplace_back(offset, static_cast<int>(to));
    }
  }
  for (size_t t = 0; t < n; ++t) successor_begin_[t + 1] += successor_begin_[t];
  successors_.resize(static_cast<size_t>(successor_begin_[n]));
  std::vector<int> fill(successor_begin_.begin(), successor_begin_.end() - 1);
  for (auto [it, end] = boost::edges(plan.graph); it != end; ++it) {
    successors_[static_cast<size_t>(fill[boost::source(*it, plan.graph)]++)] = {
        static_cast<int>(boost::target(*it, plan.graph)), plan.graph[*it].offset, plan.graph[*it].fraction};
  }
  // The k-th send on a channel meets its k-th receive, in program order.
  partner_.assign(n, -1);
  position_.assign(n, -1);
  std::vector<std::vector<int>> sends(plan.channels.size()), recvs(plan.channels.size());
  for (const auto& device : plan.programs) {
    for (const StreamProgram& stream : device) {
      for (int t : stream.tasks) {
        const Task& task = plan.task(t);
        if (task.kind != TaskKind::send && task.kind != TaskKind::recv) continue;
        auto& list = (task.kind == TaskKind::send ? sends : recvs)[static_cast<size_t>(task.channel)];
        position_[static_cast<size_t>(t)] = static_cast<int>(list.size());
        list.push_back(t);
      }
    }
  }
  for (size_t c = 0; c < sends.size(); ++c) {
    for (size_t k = 0; k < std::min(sends[c].size(), recvs[c].size()); ++k) {
      partner_[static_cast<size_t>(sends[c][k])] = recvs[c][k];
      partner_[static_cast<size_t>(recvs[c][k])] = sends[c][k];
    }
  }
}

std::vector<int> RunGraph::inputs(int iteration) const {
  std::vector<int> r = base_inputs_;
  for (const auto& [offset, to] : delayed_inputs_) {
    if (offset <= iteration) ++r[static_cast<size_t>(to)];
  }
  return r;
}

}  // namespace hetflow::partition
