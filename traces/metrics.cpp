#include "traces/metrics.hpp"

#include "partition/collective_steps.hpp"
#include "partition/estimate.hpp"
#include "model/error.hpp"

#include <algorithm>
#include <limits>

namespace hetflow::traces {

namespace {

bool is_pipeline_compute(const std::string& kind) {
  return kind == "forward" || kind == "backward" || kind == "backward_weight";
}

bool on_compute_stream(const Event& e) {
  return e.kind != "send" && e.kind != "recv" && (e.kind != "collective" || e.purpose == "tensor_parallel" || e.purpose == "sequence_parallel");
}

// Total length of the union of intervals.
double covered(std::vector<std::pair<double, double>> intervals) {
  std::sort(intervals.begin(), intervals.end());
  double total = 0, start = 0, end = -1;
  for (const auto& [a, b] : intervals) {
    if (a > end) {
      if (end > start) total += end - start;
      start = a;
      end = b;
    } else {
      end = std::max(end, b);
    }
  }
  if (end > start) total += end - start;
  return total;
}

// Length of the part of `comm` not inside any of `compute` (both unions of intervals).
double exposed(std::vector<std::pair<double, double>> comm, std::vector<std::pair<double, double>> compute) {
  std::vector<std::pair<double, double>> both = comm;
  both.insert(both.end(), compute.begin(), compute.end());
  return covered(both) - covered(std::move(compute));
}

}  // namespace

Metrics compute_metrics(const Trace& trace, const partition::Plan& plan, const partition::CostModel& cost) {
  if (!trace.fingerprint.empty() && !plan.fingerprint.empty() && trace.fingerprint != plan.fingerprint) {
    throw InputError("<trace>", 0, "fingerprint",
                     "the trace comes from plan " + trace.fingerprint + ", not from this plan (" + plan.fingerprint + ")");
  }
  Metrics m;
  int iterations = 0;
  for (const Event& e : trace.events) iterations = std::max(iterations, e.iteration + 1);
  m.iterations = iterations;
  m.iteration_end_s.assign(static_cast<size_t>(iterations), 0);
  for (const Event& e : trace.events) {
    double& end = m.iteration_end_s[static_cast<size_t>(e.iteration)];
    end = std::max(end, e.end_s);
  }
  const int first = iterations > 1 ? 1 : 0;  // iteration 0 warms up
  m.measured_iterations = iterations - first;
  if (iterations == 0) return m;
  m.iteration_time_s = iterations > 1 ? (m.iteration_end_s.back() - m.iteration_end_s.front()) / (iterations - 1)
                                      : m.iteration_end_s.front();
  const double samples = plan.layout.samples_per_iteration();
  if (m.iteration_time_s > 0) {
    m.samples_per_s = samples / m.iteration_time_s;
    m.tokens_per_s = m.samples_per_s * plan.network.tokens_per_sample;
  }

  const size_t devices = trace.device_names.size();
  const size_t workers = plan.layout.workers.size();
  const auto measured = static_cast<double>(m.measured_iterations);
  std::vector<double> busy(devices, 0);
  partition::BubbleMeter bubble(plan, iterations);
  std::vector<std::vector<std::pair<double, double>>> comm(devices), compute(devices);
  std::vector<int> worker_of(devices, -1);
  for (size_t w = 0; w < workers; ++w) {
    for (const auto& rank : plan.layout.workers[w].ranks) {
      for (int d : rank) worker_of[static_cast<size_t>(d)] = static_cast<int>(w);
    }
  }
  double model_flops = 0;
  for (const Event& e : trace.events) {
    if (e.iteration < first) continue;
    const auto d = static_cast<size_t>(e.device);
    const double duration = e.end_s - e.start_s;
    if (on_compute_stream(e)) {
      busy[d] += duration;
      compute[d].emplace_back(e.start_s, e.end_s);
    } else {
      comm[d].emplace_back(e.start_s, e.end_s);
    }
    if (is_pipeline_compute(e.kind)) {
      const partition::Task& task = plan.task(e.task);
      model_flops += task.flops - task.recompute_flops;
      bubble.add(e.device, e.iteration, e.start_s, e.end_s);
    }
    // Traffic: a send's bytes over each class of link on its route; a collective
    // participant's share over the route to its ring neighbour.
    if (e.kind == "send") {
      for (const std::string& c : cost.link_classes(e.device, e.peer)) m.bytes_per_link_class[c] += e.bytes / measured;
    } else if (e.kind == "collective" && e.group >= 0) {
      const partition::CollectiveSpec spec = partition::collective_spec(plan, plan.collective(e.group));
      const auto me = std::find(spec.devices.begin(), spec.devices.end(), e.device) - spec.devices.begin();
      const int next = spec.devices[static_cast<size_t>(me + 1) % spec.devices.size()];
      const double sent = partition::bytes_sent(spec, e.device, [&](int device) { return cost.node_of(device); });
      for (const std::string& cls : cost.link_classes(e.device, next)) m.bytes_per_link_class[cls] += sent / measured;
    }
  }
  m.model_flops_per_iteration = model_flops / measured;
  double peak = 0;
  for (int d = 0; d < cost.device_count(); ++d) peak += cost.peak_flops_per_s(d);
  if (m.iteration_time_s > 0 && peak > 0) m.mfu = m.model_flops_per_iteration / m.iteration_time_s / peak;

  double exposed_sum = 0;
  int computing = 0;
  for (size_t d = 0; d < devices; ++d) {
    DeviceMetrics dm;
    dm.name = trace.device_names[d];
    dm.busy_s = busy[d] / measured;
    dm.utilization = m.iteration_time_s > 0 ? dm.busy_s / m.iteration_time_s : 0;
    dm.exposed_comm_s = exposed(comm[d], compute[d]) / measured;
    dm.peak_memory_bytes = d < plan.memory.size() ? plan.memory[d].total_bytes() : 0;
    if (worker_of[d] >= 0 && busy[d] > 0) {
      ++computing;
      exposed_sum += dm.exposed_comm_s;
    }
    m.devices.push_back(dm);
  }
  m.bubble_fraction = bubble.fraction(first);
  m.exposed_comm_s = computing > 0 ? exposed_sum / computing : 0;
  return m;
}

}  // namespace hetflow::traces
