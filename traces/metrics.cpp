#include "traces/metrics.hpp"

#include "model/error.hpp"
#include "model/units.hpp"
#include "partition/collective_steps.hpp"
#include "partition/estimate.hpp"
#include "traces/figures.hpp"
#include "traces/trace_io.hpp"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <unordered_map>

namespace hetflow::traces {

namespace {

// A collective participant's bytes and the link classes to its ring neighbour, per
// (collective, device): an event of an in-task collective is one of its messages, and a
// collective's events repeat every iteration (and message), its steps the same each time.
class CollectiveTraffic {
 public:
  struct Sent {
    double bytes = 0;
    std::vector<std::string> classes;
  };
  CollectiveTraffic(const partition::Plan& plan, const partition::CostModel& cost) : plan_(plan), cost_(cost) {}
  const Sent& of(const Event& e) {
    const std::uint64_t key = (static_cast<std::uint64_t>(e.group) << 32) | static_cast<std::uint32_t>(e.device);
    const auto found = sent_.find(key);
    if (found != sent_.end()) return found->second;
    partition::CollectiveSpec spec = partition::collective_spec(plan_, plan_.collective(e.group));
    if (e.message >= 0) {  // one message: its share of the bytes
      spec.bytes /= std::max(1, spec.messages);
      spec.messages = 1;
    }
    const auto me = std::find(spec.devices.begin(), spec.devices.end(), e.device) - spec.devices.begin();
    const int next = spec.devices[static_cast<size_t>(me + 1) % spec.devices.size()];
    Sent sent{partition::bytes_sent(spec, e.device, [&](int device) { return cost_.node_of(device); }),
              cost_.link_classes(e.device, next)};
    return sent_.emplace(key, std::move(sent)).first->second;
  }

 private:
  const partition::Plan& plan_;
  const partition::CostModel& cost_;
  std::unordered_map<std::uint64_t, Sent> sent_;
};

}  // namespace

Metrics compute_metrics(const Trace& trace, const partition::Plan& plan, const partition::CostModel& cost,
                        int warmup) {
  if (!trace.fingerprint.empty() && !plan.fingerprint.empty() && trace.fingerprint != plan.fingerprint) {
    throw InputError("<trace>", 0, "fingerprint",
                     "the trace comes from plan " + trace.fingerprint + ", not from this plan (" + plan.fingerprint + ")");
  }
  Metrics m;
  m.iteration_end_s = iteration_ends_s(trace);
  const int iterations = static_cast<int>(m.iteration_end_s.size());
  m.iterations = iterations;
  const int first = std::clamp(warmup, 0, std::max(0, iterations - 1));  // the warm-up left out
  m.measured_iterations = iterations - first;
  if (iterations == 0) return m;
  const Window steady = iteration_window(m.iteration_end_s, first, iterations - 1);
  m.iteration_time_s = steady.length_s() / m.measured_iterations;
  const double samples = plan.layout.samples_per_iteration();
  if (m.iteration_time_s > 0) {
    m.samples_per_s = samples / m.iteration_time_s;
    m.tokens_per_s = m.samples_per_s * plan.network.tokens_per_sample;
  }

  const size_t devices = trace.device_names.size();
  const size_t workers = plan.layout.workers.size();
  const auto measured = static_cast<double>(m.measured_iterations);
  const auto its = static_cast<size_t>(iterations);
  partition::BubbleMeter bubble(plan, iterations);
  std::vector<double> flops_it(its, 0), bytes_it(its, 0);
  // Per device, steady state: the FLOPs its passes did (recomputation included) and their time.
  std::vector<double> pass_flops(devices, 0), pass_s(devices, 0);
  CollectiveTraffic traffic(plan, cost);
  for (const Event& e : trace.events) {
    const auto it = static_cast<size_t>(e.iteration);
    const bool steady_event = e.iteration >= first;
    if (partition::is_pass(e.kind)) {
      const partition::Task& task = plan.task(e.task);
      flops_it[it] += task.flops - task.recompute_flops;
      bubble.add(e.device, e.iteration, e.start_s, e.end_s);
      if (steady_event && static_cast<size_t>(e.device) < devices) {
        pass_flops[static_cast<size_t>(e.device)] += task.flops;
        pass_s[static_cast<size_t>(e.device)] += e.end_s - e.start_s;
      }
    }
    // Traffic: a send's bytes over each class of link on its route; a collective
    // participant's share over the route to its ring neighbour.
    if (e.kind == partition::TaskKind::send) {
      bytes_it[it] += e.bytes;
      if (!steady_event) continue;
      for (const std::string& c : cost.link_classes(e.device, e.peer)) m.bytes_per_link_class[c] += e.bytes / measured;
    } else if (e.kind == partition::TaskKind::collective && e.group >= 0) {
      const CollectiveTraffic::Sent& sent = traffic.of(e);
      bytes_it[it] += sent.bytes;
      if (!steady_event) continue;
      for (const std::string& cls : sent.classes) m.bytes_per_link_class[cls] += sent.bytes / measured;
    }
  }
  for (const InputWait& w : input_waits(trace)) bubble.add_input_wait(w.device, w.iteration, w.window.from_s, w.window.to_s);
  // A folded plan's trace holds its first workers' tasks (Layout::task_workers): every
  // replica does the same work and moves the same bytes.
  const double replicas = plan.layout.folded ? static_cast<double>(std::max<size_t>(1, workers)) /
                                                   static_cast<double>(std::max<size_t>(1, plan.layout.task_workers()))
                                             : 1.0;
  for (double& f : flops_it) f *= replicas;
  for (double& b : bytes_it) b *= replicas;
  for (auto& [cls, bytes] : m.bytes_per_link_class) bytes *= replicas;
  double model_flops = 0;
  for (size_t it = static_cast<size_t>(first); it < its; ++it) model_flops += flops_it[it];
  m.model_flops_per_iteration = model_flops / measured;
  m.peak_flops_per_s = 0;
  for (int d = 0; d < cost.device_count(); ++d) m.peak_flops_per_s += cost.peak_flops_per_s(d);
  m.mfu = mfu(m.model_flops_per_iteration, m.iteration_time_s, m.peak_flops_per_s);

  // Compute, exposed communication and idle: per device over the steady state, and the mean
  // over computing devices per iteration.
  const std::vector<bool> computing = computing_devices(trace);
  const auto computing_count = static_cast<double>(std::count(computing.begin(), computing.end(), true));
  for (size_t it = 0; it < its; ++it) {
    IterationMetrics im;
    im.iteration = static_cast<int>(it);
    const Window w = iteration_window(m.iteration_end_s, im.iteration, im.iteration);
    im.start_s = w.from_s;
    im.end_s = w.to_s;
    im.time_s = w.length_s();
    if (im.time_s > 0) {
      im.samples_per_s = samples / im.time_s;
      im.tokens_per_s = im.samples_per_s * plan.network.tokens_per_sample;
      im.mfu = mfu(flops_it[it], im.time_s, m.peak_flops_per_s);
    }
    im.bubble_fraction = bubble.fraction(static_cast<int>(it), static_cast<int>(it) + 1);
    const std::vector<DeviceTime> times = device_times(trace, w);
    for (size_t d = 0; d < devices; ++d) {
      if (!computing[d]) continue;
      im.busy_s += times[d].compute_s;
      im.exposed_comm_s += times[d].exposed_comm_s;
    }
    if (computing_count > 0) im.busy_s /= computing_count, im.exposed_comm_s /= computing_count;
    im.comm_bytes = bytes_it[it];
    m.per_iteration.push_back(im);
  }

  const std::vector<DeviceTime> times = device_times(trace, steady);
  const std::vector<model::Device> cluster_devices = plan.cluster.devices();
  double exposed_sum = 0, input_wait_sum = 0;
  for (size_t d = 0; d < devices; ++d) {
    DeviceMetrics dm;
    dm.name = trace.device_names[d];
    dm.busy_s = times[d].compute_s / measured;
    dm.exposed_comm_s = times[d].exposed_comm_s / measured;
    dm.idle_s = times[d].idle_s / measured;
    dm.input_wait_s = times[d].input_wait_s / measured;
    dm.utilization = m.iteration_time_s > 0 ? dm.busy_s / m.iteration_time_s : 0;
    dm.peak_memory_bytes = d < plan.memory.size() ? plan.memory[d].total_bytes() : 0;
    if (computing[d]) exposed_sum += dm.exposed_comm_s, input_wait_sum += dm.input_wait_s;
    m.devices.push_back(dm);
    // Faster than its peak: the peak the cluster gives this device is below what it ran at.
    if (pass_s[d] > 0 && static_cast<int>(d) < cost.device_count() && d < cluster_devices.size()) {
      const double achieved = pass_flops[d] / pass_s[d], peak = cost.peak_flops_per_s(static_cast<int>(d));
      if (peak > 0 && achieved > peak) {
        const std::string type = plan.cluster.device_gpu(cluster_devices[d]).name;
        auto found = std::find_if(m.over_peak.begin(), m.over_peak.end(), [&](const OverPeak& o) { return o.gpu == type; });
        if (found == m.over_peak.end()) found = m.over_peak.insert(m.over_peak.end(), OverPeak{type, 0, peak});
        found->achieved_flops_per_s = std::max(found->achieved_flops_per_s, achieved);
      }
    }
  }
  m.bubble_fraction = bubble.fraction(first);
  m.exposed_comm_s = computing_count > 0 ? exposed_sum / computing_count : 0;
  m.input_wait_s = computing_count > 0 ? input_wait_sum / computing_count : 0;
  return m;
}

std::string over_peak_cause(const Metrics& metrics) {
  namespace u = model::units;
  std::string types;
  for (size_t i = 0; i < metrics.over_peak.size(); ++i) {
    const OverPeak& o = metrics.over_peak[i];
    types += std::string(i == 0 ? "" : i + 1 == metrics.over_peak.size() ? " and " : ", ") + o.gpu + " devices computed at " +
             u::human_flops(o.achieved_flops_per_s) + "/s, above the " + u::human_flops(o.peak_flops_per_s) + "/s peak";
  }
  if (types.empty()) return "";
  return types + " the cluster gives them: that peak is below what the hardware does (a nominal figure; give the "
                 "measured one: cpu-N:probed for this host's CPU devices, a GPU type's own peak in a cluster file), so "
                 "the MFU is overstated" + (metrics.mfu > 1 ? std::string(" and passes 100 %") : std::string());
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
