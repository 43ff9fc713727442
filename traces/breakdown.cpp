#include "traces/breakdown.hpp"

#include <algorithm>
#include <map>
#include <tuple>

namespace hetflow::traces {
namespace {

// An instant where an interval starts (+1) or ends (-1); purpose -1 for compute.
struct Edge {
  double t_s;
  int delta;
  int purpose;
};

std::vector<std::pair<std::string, double>> largest_first(const std::map<std::string, double>& parts, double scale) {
  std::vector<std::pair<std::string, double>> out;
  for (const auto& [name, s] : parts) out.emplace_back(name, s * scale);
  std::stable_sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  return out;
}

}  // namespace

Breakdown compute_breakdown(const Trace& trace, const partition::Plan& plan, const partition::CostModel& cost) {
  Breakdown b;
  int iterations = 0;
  for (const Event& e : trace.events) iterations = std::max(iterations, e.iteration + 1);
  if (iterations == 0) return b;
  std::vector<double> ends(static_cast<size_t>(iterations), 0);
  for (const Event& e : trace.events) ends[static_cast<size_t>(e.iteration)] = std::max(ends[static_cast<size_t>(e.iteration)], e.end_s);
  const double from_s = iterations > 1 ? ends.front() : 0, to_s = ends.back();
  const int measured = iterations > 1 ? iterations - 1 : 1;
  if (!(to_s > from_s)) return b;

  const size_t devices = trace.device_names.size();
  std::vector<std::vector<Edge>> edges(devices);
  std::vector<std::string> purposes;  // index -> name
  std::map<std::string, int> purpose_index;
  // Each task's parts by operation, shared by a device's tasks alike (kind, layers,
  // recomputation): a device has a few kinds of task however many micro-batches.
  std::map<std::tuple<int, int, int, int, bool>, std::vector<std::pair<std::string, double>>> parts_of;
  std::vector<std::map<std::string, double>> by_operation(devices);
  for (const Event& e : trace.events) {
    const double start = std::max(e.start_s, from_s), end = std::min(e.end_s, to_s);
    if (!(end > start) || e.device < 0 || static_cast<size_t>(e.device) >= devices) continue;
    auto& mine = edges[static_cast<size_t>(e.device)];
    if (partition::is_compute(e.kind)) {
      mine.push_back({start, +1, -1});
      mine.push_back({end, -1, -1});
      if (e.task < 0 || static_cast<size_t>(e.task) >= plan.tasks.size()) continue;
      const partition::Task& t = plan.task(e.task);
      const auto key = std::make_tuple(t.device, static_cast<int>(t.kind), t.layer_begin, t.layer_end, t.recompute_flops > 0);
      auto it = parts_of.find(key);
      if (it == parts_of.end()) it = parts_of.emplace(key, cost.task_compute_parts_s(plan, t)).first;
      double total = 0;
      for (const auto& [name, s] : it->second) total += s;
      if (total <= 0) continue;
      for (const auto& [name, s] : it->second) {
        // Every pass of an operation under its name: "qkv (data)" and "qkv (weight)" are qkv.
        by_operation[static_cast<size_t>(e.device)][name.substr(0, name.find(" ("))] += (end - start) * s / total;
      }
    } else {
      const std::string purpose(partition::to_string(e.purpose));
      auto [p, added] = purpose_index.emplace(purpose, static_cast<int>(purposes.size()));
      if (added) purposes.push_back(purpose);
      mine.push_back({start, +1, p->second});
      mine.push_back({end, -1, p->second});
    }
  }

  std::map<std::string, double> compute_by_operation, comm_by_purpose;
  double compute = 0, comm = 0, idle = 0;
  for (size_t d = 0; d < devices; ++d) {
    if (by_operation[d].empty() && std::none_of(edges[d].begin(), edges[d].end(), [](const Edge& x) { return x.purpose < 0; })) {
      continue;  // not a computing device (a parameter server's host, a folded replica)
    }
    ++b.devices;
    auto& mine = edges[d];
    std::sort(mine.begin(), mine.end(), [](const Edge& x, const Edge& y) { return x.t_s < y.t_s; });
    int computing = 0;
    std::vector<int> active(purposes.size(), 0);
    int communicating = 0;
    double at = from_s, device_compute = 0;
    std::vector<double> device_comm(purposes.size(), 0);
    for (const Edge& x : mine) {
      const double span = x.t_s - at;
      if (span > 0) {
        if (computing > 0) {
          device_compute += span;
        } else if (communicating > 0) {
          int kinds = 0;
          for (int a : active) kinds += a > 0;
          for (size_t p = 0; p < active.size(); ++p) {
            if (active[p] > 0) device_comm[p] += span / kinds;
          }
        } else {
          idle += span;
        }
        at = x.t_s;
      }
      if (x.purpose < 0) {
        computing += x.delta;
      } else {
        active[static_cast<size_t>(x.purpose)] += x.delta;
        communicating += x.delta;
      }
    }
    idle += to_s - at;
    compute += device_compute;
    // The operations' shares of the compute time swept (tasks of two compute streams may overlap).
    double parts = 0;
    for (const auto& [name, s] : by_operation[d]) parts += s;
    for (const auto& [name, s] : by_operation[d]) compute_by_operation[name] += parts > 0 ? s * device_compute / parts : 0;
    for (size_t p = 0; p < purposes.size(); ++p) {
      comm += device_comm[p];
      if (device_comm[p] > 0) comm_by_purpose[purposes[p]] += device_comm[p];
    }
  }
  if (b.devices == 0) return b;
  const double per = 1.0 / (static_cast<double>(b.devices) * measured);
  b.compute_s = compute * per;
  b.exposed_comm_s = comm * per;
  b.idle_s = idle * per;
  b.iteration_time_s = (to_s - from_s) / measured;
  b.compute_by_operation_s = largest_first(compute_by_operation, per);
  b.exposed_comm_by_purpose_s = largest_first(comm_by_purpose, per);
  return b;
}

}  // namespace hetflow::traces
