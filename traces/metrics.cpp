#include "traces/metrics.hpp"

#include "model/error.hpp"
#include "partition/collective_steps.hpp"
#include "partition/estimate.hpp"
#include "traces/trace_io.hpp"

#include <algorithm>
#include <limits>

namespace hetflow::traces {

namespace {

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

Metrics compute_metrics(const Trace& trace, const partition::Plan& plan, const partition::CostModel& cost,
                        int warmup) {
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
  const int first = std::clamp(warmup, 0, std::max(0, iterations - 1));  // the warm-up left out
  m.measured_iterations = iterations - first;
  if (iterations == 0) return m;
  const double start = first > 0 ? m.iteration_end_s[static_cast<size_t>(first - 1)] : 0.0;
  m.iteration_time_s = (m.iteration_end_s.back() - start) / m.measured_iterations;
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
  // Per iteration (index iteration * devices + device for the intervals).
  const auto its = static_cast<size_t>(iterations);
  std::vector<double> busy_it(its * devices, 0), flops_it(its, 0), bytes_it(its, 0);
  std::vector<std::vector<std::pair<double, double>>> comm_it(its * devices), compute_it(its * devices);
  // A workload plan (read from Chakra traces) has no virtual workers: every device computes.
  auto in_a_worker = [&](size_t d) { return workers == 0 || worker_of[d] >= 0; };
  double model_flops = 0;
  for (const Event& e : trace.events) {
    const auto d = static_cast<size_t>(e.device);
    const auto it = static_cast<size_t>(e.iteration);
    const bool steady = e.iteration >= first;
    const double duration = e.end_s - e.start_s;
    if (occupies_compute(e)) {
      busy_it[it * devices + d] += duration;
      compute_it[it * devices + d].emplace_back(e.start_s, e.end_s);
      if (steady) busy[d] += duration, compute[d].emplace_back(e.start_s, e.end_s);
    } else {
      comm_it[it * devices + d].emplace_back(e.start_s, e.end_s);
      if (steady) comm[d].emplace_back(e.start_s, e.end_s);
    }
    if (partition::is_pass(e.kind)) {
      const partition::Task& task = plan.task(e.task);
      flops_it[it] += task.flops - task.recompute_flops;
      if (steady) model_flops += task.flops - task.recompute_flops;
      bubble.add(e.device, e.iteration, e.start_s, e.end_s);
    }
    // Traffic: a send's bytes over each class of link on its route; a collective
    // participant's share over the route to its ring neighbour.
    if (e.kind == partition::TaskKind::send) {
      bytes_it[it] += e.bytes;
      if (!steady) continue;
      for (const std::string& c : cost.link_classes(e.device, e.peer)) m.bytes_per_link_class[c] += e.bytes / measured;
    } else if (e.kind == partition::TaskKind::collective && e.group >= 0) {
      const partition::CollectiveSpec spec = partition::collective_spec(plan, plan.collective(e.group));
      const auto me = std::find(spec.devices.begin(), spec.devices.end(), e.device) - spec.devices.begin();
      const int next = spec.devices[static_cast<size_t>(me + 1) % spec.devices.size()];
      const double sent = partition::bytes_sent(spec, e.device, [&](int device) { return cost.node_of(device); });
      bytes_it[it] += sent;
      if (!steady) continue;
      for (const std::string& cls : cost.link_classes(e.device, next)) m.bytes_per_link_class[cls] += sent / measured;
    }
  }
  // A folded plan's trace holds worker 0's tasks: every replica does the same work and moves
  // the same bytes.
  const double replicas = plan.layout.folded ? static_cast<double>(std::max<size_t>(1, workers)) : 1.0;
  model_flops *= replicas;
  for (double& f : flops_it) f *= replicas;
  for (double& b : bytes_it) b *= replicas;
  for (auto& [cls, bytes] : m.bytes_per_link_class) bytes *= replicas;
  m.model_flops_per_iteration = model_flops / measured;
  double peak = 0;
  for (int d = 0; d < cost.device_count(); ++d) peak += cost.peak_flops_per_s(d);
  if (m.iteration_time_s > 0 && peak > 0) m.mfu = m.model_flops_per_iteration / m.iteration_time_s / peak;

  for (size_t it = 0; it < its; ++it) {
    IterationMetrics im;
    im.iteration = static_cast<int>(it);
    im.start_s = it > 0 ? m.iteration_end_s[it - 1] : 0;
    im.end_s = m.iteration_end_s[it];
    im.time_s = im.end_s - im.start_s;
    if (im.time_s > 0) {
      im.samples_per_s = samples / im.time_s;
      im.tokens_per_s = im.samples_per_s * plan.network.tokens_per_sample;
      if (peak > 0) im.mfu = flops_it[it] / im.time_s / peak;
    }
    im.bubble_fraction = bubble.fraction(static_cast<int>(it), static_cast<int>(it) + 1);
    int computing = 0;
    for (size_t d = 0; d < devices; ++d) {
      if (!in_a_worker(d) || busy_it[it * devices + d] <= 0) continue;
      ++computing;
      im.busy_s += busy_it[it * devices + d];
      im.exposed_comm_s += exposed(comm_it[it * devices + d], compute_it[it * devices + d]);
    }
    if (computing > 0) im.busy_s /= computing, im.exposed_comm_s /= computing;
    im.comm_bytes = bytes_it[it];
    m.per_iteration.push_back(im);
  }

  double exposed_sum = 0;
  int computing = 0;
  for (size_t d = 0; d < devices; ++d) {
    DeviceMetrics dm;
    dm.name = trace.device_names[d];
    dm.busy_s = busy[d] / measured;
    dm.utilization = m.iteration_time_s > 0 ? dm.busy_s / m.iteration_time_s : 0;
    dm.exposed_comm_s = exposed(comm[d], compute[d]) / measured;
    dm.peak_memory_bytes = d < plan.memory.size() ? plan.memory[d].total_bytes() : 0;
    if (in_a_worker(d) && busy[d] > 0) {
      ++computing;
      exposed_sum += dm.exposed_comm_s;
    }
    m.devices.push_back(dm);
  }
  m.bubble_fraction = bubble.fraction(first);
  m.exposed_comm_s = computing > 0 ? exposed_sum / computing : 0;
  return m;
}

std::string write_metrics_csv(const Metrics& metrics, const Trace& trace) {
  std::string out = "# hetflow metrics v1\n";
  out += "# source: " + csv_field(trace.source) + "\n";
  out += "# plan: " + csv_field(trace.plan) + "\n";
  if (!trace.fingerprint.empty()) out += "# fingerprint: " + csv_field(trace.fingerprint) + "\n";
  out += "iteration,start_s,end_s,time_s,samples_per_s,tokens_per_s,mfu,bubble_fraction,busy_s,exposed_comm_s,comm_bytes\n";
  for (const IterationMetrics& i : metrics.per_iteration) {
    out += std::to_string(i.iteration);
    for (double v : {i.start_s, i.end_s, i.time_s, i.samples_per_s, i.tokens_per_s, i.mfu, i.bubble_fraction, i.busy_s,
                     i.exposed_comm_s, i.comm_bytes}) {
      out += "," + format_double(v);
    }
    out += "\n";
  }
  return out;
}

}  // namespace hetflow::traces
