#include "partition/task_order.hpp"

#include <algorithm>
#include <tuple>

namespace hetflow::partition {

std::vector<int> TaskOrder::task_sequence() const {
  std::vector<int> tasks;
  tasks.reserve(unit_tasks.size());
  for (int u : order) {
    for (int t : unit(u)) tasks.push_back(t);
  }
  return tasks;
}

TaskOrder order_tasks(const Plan& plan) {
  TaskOrder o;
  const size_t n = plan.tasks.size();
  o.unit_of_task.assign(n, -1);
  int next_unit = 0;
  // Units: collectives first (by index), then transfers (by channel), then the rest.
  for (const Collective& c : plan.collectives) {
    bool any = false;
    for (int t : c.tasks) {
      if (t < 0 || static_cast<size_t>(t) >= n || o.unit_of_task[static_cast<size_t>(t)] >= 0) continue;
      o.unit_of_task[static_cast<size_t>(t)] = next_unit;
      any = true;
    }
    next_unit += any;
  }
  // Transfers: the k-th send on a channel meets the k-th receive on it, in program order.
  std::vector<int> sends_seen(plan.channels.size(), 0), recvs_seen(plan.channels.size(), 0);
  std::vector<std::vector<int>> pair_unit(plan.channels.size());  // channel -> k -> unit
  for (const auto& device : plan.programs) {
    for (const StreamProgram& stream : device) {
      for (int t : stream.tasks) {
        if (t < 0 || static_cast<size_t>(t) >= n || o.unit_of_task[static_cast<size_t>(t)] >= 0) continue;
        const Task& task = plan.task(t);
        if (task.channel < 0 || static_cast<size_t>(task.channel) >= plan.channels.size()) continue;
        if (task.kind != TaskKind::send && task.kind != TaskKind::recv) continue;
        const auto c = static_cast<size_t>(task.channel);
        const auto k = static_cast<size_t>(task.kind == TaskKind::send ? sends_seen[c]++ : recvs_seen[c]++);
        if (pair_unit[c].size() <= k) pair_unit[c].push_back(next_unit++);
        o.unit_of_task[static_cast<size_t>(t)] = pair_unit[c][k];
      }
    }
  }
  for (size_t t = 0; t < n; ++t) {
    if (o.unit_of_task[t] < 0) o.unit_of_task[t] = next_unit++;
  }
  const auto units = static_cast<size_t>(next_unit);
  o.unit_begin.assign(units + 1, 0);
  for (size_t t = 0; t < n; ++t) ++o.unit_begin[static_cast<size_t>(o.unit_of_task[t]) + 1];
  for (size_t u = 0; u < units; ++u) o.unit_begin[u + 1] += o.unit_begin[u];
  o.unit_tasks.resize(n);
  {
    std::vector<int> fill(o.unit_begin.begin(), o.unit_begin.end() - 1);
    // Collective units list their tasks in the collective's order, the others in task order.
    std::vector<char> placed(n, 0);
    for (const Collective& c : plan.collectives) {
      for (int t : c.tasks) {
        if (t < 0 || static_cast<size_t>(t) >= n || placed[static_cast<size_t>(t)]) continue;
        const auto u = static_cast<size_t>(o.unit_of_task[static_cast<size_t>(t)]);
        o.unit_tasks[static_cast<size_t>(fill[u]++)] = t;
        placed[static_cast<size_t>(t)] = 1;
      }
    }
    for (size_t t = 0; t < n; ++t) {
      if (placed[t]) continue;
      const auto u = static_cast<size_t>(o.unit_of_task[t]);
      o.unit_tasks[static_cast<size_t>(fill[u]++)] = static_cast<int>(t);
    }
  }

  // Edges between units: dependencies within an iteration (an edge with an offset ties
  // different iterations and cannot close a cycle in one), then program order on each
  // device stream. An edge inside one unit is a unit waiting for itself: kept, so that it
  // shows as a cycle.
  std::vector<std::tuple<int, int, double>> edges;  // (from unit, to unit, fraction)
  edges.reserve(boost::num_edges(plan.graph) + n);
  for (auto [it, end] = boost::edges(plan.graph); it != end; ++it) {
    if (plan.graph[*it].offset != 0) continue;
    edges.emplace_back(o.unit_of_task[boost::source(*it, plan.graph)], o.unit_of_task[boost::target(*it, plan.graph)],
                       plan.graph[*it].fraction);
  }
  for (const auto& device : plan.programs) {
    for (const StreamProgram& stream : device) {
      const std::vector<int>& program = stream.tasks;
      for (size_t i = 1; i < program.size(); ++i) {
        edges.emplace_back(o.unit_of_task[static_cast<size_t>(program[i - 1])], o.unit_of_task[static_cast<size_t>(program[i])],
                           1.0);
      }
    }
  }
  o.successor_begin.assign(units + 1, 0);
  for (const auto& [a, b, f] : edges) ++o.successor_begin[static_cast<size_t>(a) + 1];
  for (size_t u = 0; u < units; ++u) o.successor_begin[u + 1] += o.successor_begin[u];
  o.successors.resize(edges.size());
  o.successor_fraction.resize(edges.size());
  std::vector<int> fill(o.successor_begin.begin(), o.successor_begin.end() - 1);
  std::vector<int> indegree(units, 0);
  for (const auto& [a, b, f] : edges) {
    const auto at = static_cast<size_t>(fill[static_cast<size_t>(a)]++);
    o.successors[at] = b;
    o.successor_fraction[at] = f;
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
    for (const auto& [a, b, f] : edges) {
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
        o.cycle.push_back(o.unit(path[i]).front());
      }
      std::reverse(o.cycle.begin(), o.cycle.end());
    }
  }
  return o;
}

std::string describe_task(const Plan& plan, int task) {
  const Task& t = plan.tasks.at(static_cast<size_t>(task));
  std::string s = std::string(to_string(t.kind)) + " #" + std::to_string(task) + " on ";
  s += t.device >= 0 && t.device < plan.device_count() ? plan.device_name(t.device)
                                                        : "device " + std::to_string(t.device);
  if (t.stream >= 0 && static_cast<size_t>(t.stream) < plan.streams.size()) s += " stream " + plan.stream_name(t.stream);
  std::string details;
  if (t.worker >= 0) details += ", worker " + std::to_string(t.worker);
  if (t.stage >= 0) details += ", stage " + std::to_string(t.stage);
  if (t.microbatch >= 0) details += ", micro-batch " + std::to_string(t.microbatch);
  if (t.kind == TaskKind::send || t.kind == TaskKind::recv) details += ", peer " + std::to_string(plan.peer(task));
  return details.empty() ? s : s + " (" + details.substr(2) + ")";
}

}  // namespace hetflow::partition
