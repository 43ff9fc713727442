#include "partition/task_order.hpp"

#include <algorithm>

namespace hetflow::partition {

TaskOrder order_tasks(const Plan& plan) {
  TaskOrder o;
  const size_t n = plan.tasks.size();
  o.unit_of_task.assign(n, -1);
  // Units: collectives first (by index), then transfers (by channel), then the rest.
  for (const Collective& c : plan.collectives) {
    const int unit = static_cast<int>(o.units.size());
    o.units.emplace_back();
    for (int t : c.tasks) {
      if (t < 0 || static_cast<size_t>(t) >= n || o.unit_of_task[static_cast<size_t>(t)] >= 0) continue;
      o.unit_of_task[static_cast<size_t>(t)] = unit;
      o.units.back().push_back(t);
    }
  }
  // Transfers: the k-th send on a channel meets the k-th receive on it, in program order.
  std::vector<std::vector<int>> sends(plan.channels.size()), recvs(plan.channels.size());
  for (const auto& device : plan.programs) {
    for (const StreamProgram& stream : device) {
      for (int t : stream.tasks) {
        const Task& task = plan.tasks[static_cast<size_t>(t)];
        if (task.channel < 0 || static_cast<size_t>(task.channel) >= plan.channels.size()) continue;
        if (task.kind == TaskKind::send) sends[static_cast<size_t>(task.channel)].push_back(t);
        if (task.kind == TaskKind::recv) recvs[static_cast<size_t>(task.channel)].push_back(t);
      }
    }
  }
  for (size_t c = 0; c < plan.channels.size(); ++c) {
    const size_t pairs = std::max(sends[c].size(), recvs[c].size());
    for (size_t k = 0; k < pairs; ++k) {
      const int unit = static_cast<int>(o.units.size());
      o.units.emplace_back();
      for (const auto* side : {&sends[c], &recvs[c]}) {
        if (k >= side->size()) continue;
        const auto t = static_cast<size_t>((*side)[k]);
        if (o.unit_of_task[t] >= 0) continue;
        o.unit_of_task[t] = unit;
        o.units.back().push_back(static_cast<int>(t));
      }
      if (o.units.back().empty()) o.units.pop_back();
    }
  }
  for (size_t t = 0; t < n; ++t) {
    if (o.unit_of_task[t] >= 0) continue;
    o.unit_of_task[t] = static_cast<int>(o.units.size());
    o.units.push_back({static_cast<int>(t)});
  }
  const size_t units = o.units.size();

  // Edges between units: dependencies within an iteration (an edge with an offset ties
  // different iterations and cannot close a cycle in one), then program order on each
  // device stream. An edge inside one unit is a unit waiting for itself: kept, so that it
  // shows as a cycle.
  std::vector<std::pair<int, int>> edges;
  edges.reserve(boost::num_edges(plan.graph) + n);
  for (auto [it, end] = boost::edges(plan.graph); it != end; ++it) {
    if (plan.graph[*it].offset != 0) continue;
    edges.emplace_back(o.unit_of_task[boost::source(*it, plan.graph)], o.unit_of_task[boost::target(*it, plan.graph)]);
  }
  for (const auto& device : plan.programs) {
    for (const StreamProgram& stream : device) {
      const std::vector<int>& program = stream.tasks;
      for (size_t i = 1; i < program.size(); ++i) {
        edges.emplace_back(o.unit_of_task[static_cast<size_t>(program[i - 1])], o.unit_of_task[static_cast<size_t>(program[i])]);
      }
    }
  }
  o.successor_begin.assign(units + 1, 0);
  for (const auto& [a, b] : edges) ++o.successor_begin[static_cast<size_t>(a) + 1];
  for (size_t u = 0; u < units; ++u) o.successor_begin[u + 1] += o.successor_begin[u];
  o.successors.resize(edges.size());
  std::vector<int> fill(o.successor_begin.begin(), o.successor_begin.end() - 1);
  std::vector<int> indegree(units, 0);
  for (const auto& [a, b] : edges) {
    o.successors[static_cast<size_t>(fill[static_cast<size_t>(a)]++)] = b;
    ++indegree[static_cast<size_t>(b)];
  }

  // Kahn's algorithm, FIFO for determinism.
  o.order.reserve(units);
  for (size_t u = 0; u < units; ++u) {
    if (indegree[u] == 0) o.order.push_back(static_cast<int>(u));
  }
  for (size_t head = 0; head < o.order.size(); ++head) {
    const auto u = static_cast<size_t>(o.order[head]);
    for (int s = o.successor_begin[u]; s < o.successor_begin[u + 1]; ++s) {
      const auto v = static_cast<size_t>(o.successors[static_cast<size_t>(s)]);
      if (--indegree[v] == 0) o.order.push_back(static_cast<int>(v));
    }
  }
  if (!o.complete()) {
    // Walk backwards through unfinished predecessors until a unit repeats: that is a cycle.
    std::vector<std::vector<int>> predecessors(units);
    for (const auto& [a, b] : edges) {
      if (indegree[static_cast<size_t>(a)] > 0 && indegree[static_cast<size_t>(b)] > 0) {
        predecessors[static_cast<size_t>(b)].push_back(a);
      }
    }
    int u = -1;
    for (size_t i = 0; i < units && u < 0; ++i) {
      if (indegree[i] > 0) u = static_cast<int>(i);
    }
    std::vector<int> seen(units, -1), path;
    while (u >= 0 && seen[static_cast<size_t>(u)] < 0) {
      seen[static_cast<size_t>(u)] = static_cast<int>(path.size());
      path.push_back(u);
      const auto& preds = predecessors[static_cast<size_t>(u)];
      u = preds.empty() ? -1 : preds.front();
    }
    if (u >= 0) {
      for (size_t i = static_cast<size_t>(seen[static_cast<size_t>(u)]); i < path.size(); ++i) {
        o.cycle.push_back(o.units[static_cast<size_t>(path[i])].front());
      }
      std::reverse(o.cycle.begin(), o.cycle.end());
    }
  }
  return o;
}

std::string describe_task(const Plan& plan, int task) {
  const Task& t = plan.tasks.at(static_cast<size_t>(task));
  std::string s = std::string(to_string(t.kind)) + " #" + std::to_string(task) + " on ";
  s += t.device >= 0 && t.device < plan.device_count() ? plan.device_names[static_cast<size_t>(t.device)]
                                                        : "device " + std::to_string(t.device);
  if (t.stream >= 0 && static_cast<size_t>(t.stream) < plan.streams.size()) s += " stream " + plan.streams[static_cast<size_t>(t.stream)];
  std::string details;
  if (t.worker >= 0) details += ", worker " + std::to_string(t.worker);
  if (t.stage >= 0) details += ", stage " + std::to_string(t.stage);
  if (t.microbatch >= 0) details += ", micro-batch " + std::to_string(t.microbatch);
  if (t.kind == TaskKind::send || t.kind == TaskKind::recv) details += ", peer " + std::to_string(plan.peer(task));
  return details.empty() ? s : s + " (" + details.substr(2) + ")";
}

}  // namespace hetflow::partition
