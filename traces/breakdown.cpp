#include "traces/breakdown.hpp"

#include <algorithm>
#include <map>
#include <tuple>

#include "traces/figures.hpp"

namespace hetflow::traces {
namespace {

std::vector<std::pair<std::string, double>> largest_first(const std::map<std::string, double>& parts, double scale) {
  std::vector<std::pair<std::string, double>> out;
  for (const auto& [name, s] : parts) out.emplace_back(name, s * scale);
  std::stable_sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  return out;
}

}  // namespace

Breakdown compute_breakdown(const Trace& trace, const partition::Plan& plan, const partition::CostModel& cost,
                            int warmup) {
  Breakdown b;
  const std::vector<double> ends = iteration_ends_s(trace);
  const int iterations = static_cast<int>(ends.size());
  if (iterations == 0) return b;
  const int first = std::clamp(warmup, 0, iterations - 1);  // as compute_metrics leaves it out
  const Window window = iteration_window(ends, first, iterations - 1);
  const int measured = iterations - first;
  if (!(window.length_s() > 0)) return b;

  const size_t devices = trace.device_names.size();
  // Each task's parts by operation, shared by a device's tasks alike (kind, layers,
  // recomputation): a device has a few kinds of task however many micro-batches.
  std::map<std::tuple<int, int, int, int, bool>, std::vector<std::pair<std::string, double>>> parts_of;
  std::vector<std::map<std::string, double>> by_operation(devices);
  for (const Event& e : trace.events) {
    const double start = std::max(e.start_s, window.from_s), end = std::min(e.end_s, window.to_s);
    if (!(end > start) || e.device < 0 || static_cast<size_t>(e.device) >= devices || !partition::is_compute(e.kind)) continue;
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
  }

  const std::vector<DeviceTime> times = device_times(trace, window);
  const std::vector<bool> computing = computing_devices(trace);
  std::map<std::string, double> compute_by_operation, comm_by_purpose;
  double compute = 0, comm = 0, idle = 0;
  for (size_t d = 0; d < devices; ++d) {
    if (!computing[d]) continue;  // a parameter server's host, a folded replica
    ++b.devices;
    const DeviceTime& time = times[d];
    compute += time.compute_s;
    comm += time.exposed_comm_s;
    idle += time.idle_s;
    // The operations' shares of the compute time swept (tasks of two compute streams may overlap).
    double parts = 0;
    for (const auto& [name, s] : by_operation[d]) parts += s;
    for (const auto& [name, s] : by_operation[d]) compute_by_operation[name] += parts > 0 ? s * time.compute_s / parts : 0;
    for (const auto& [purpose, s] : time.exposed_comm_by_purpose_s) comm_by_purpose[purpose] += s;
  }
  if (b.devices == 0) return b;
  const double per = 1.0 / (static_cast<double>(b.devices) * measured);
  b.compute_s = compute * per;
  b.exposed_comm_s = comm * per;
  b.idle_s = idle * per;
  b.iteration_time_s = window.length_s() / measured;
  b.compute_by_operation_s = largest_first(compute_by_operation, per);
  b.exposed_comm_by_purpose_s = largest_first(comm_by_purpose, per);
  return b;
}

}  // namespace hetflow::traces
