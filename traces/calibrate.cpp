#include "traces/calibrate.hpp"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <sstream>
#include <limits>
#include <map>
#include <set>
#include <tuple>

#include "model/error.hpp"
#include "partition/cost_model.hpp"
#include "partition/estimate.hpp"
#include "partition/run_graph.hpp"
#include "traces/event_index.hpp"

namespace hetflow::traces {

namespace {

using partition::TaskKind;

// Weighted least squares of y ~ a * x1 + b * x2 (weights w), closed form; nullopt when singular.
struct Fit2 {
  double a = 0, b = 0;
  bool ok = false;
};
Fit2 least_squares2(const std::vector<double>& x1, const std::vector<double>& x2, const std::vector<double>& y,
                    const std::vector<double>& w) {
  double s11 = 0, s12 = 0, s22 = 0, s1y = 0, s2y = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    s11 += w[i] * x1[i] * x1[i];
    s12 += w[i] * x1[i] * x2[i];
    s22 += w[i] * x2[i] * x2[i];
    s1y += w[i] * x1[i] * y[i];
    s2y += w[i] * x2[i] * y[i];
  }
  const double det = s11 * s22 - s12 * s12;
  if (!(std::abs(det) > 1e-12 * std::max(s11 * s22, 1e-300))) return {};
  return {(s1y * s22 - s2y * s12) / det, (s2y * s11 - s1y * s12) / det, true};
}

// y ~ b * x (weights w).
double least_squares1(const std::vector<double>& x, const std::vector<double>& y, const std::vector<double>& w) {
  double sxx = 0, sxy = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    sxx += w[i] * x[i] * x[i];
    sxy += w[i] * x[i] * y[i];
  }
  return sxx > 0 ? sxy / sxx : 0;
}

double rms_relative(const std::vector<double>& predicted, const std::vector<double>& y) {
  double sum = 0;
  for (size_t i = 0; i < y.size(); ++i) sum += std::pow((predicted[i] - y[i]) / y[i], 2);
  return y.empty() ? 0 : std::sqrt(sum / static_cast<double>(y.size()));
}

// Sizes closer than this are one size: a slope between them would be measurement noise
// (two devices' optimizer steps over nearly equal parameter counts, say).
constexpr double kSameSize = 0.05;

int distinct(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  int n = 0;
  double first_of_group = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    if (i == 0 || v[i] > first_of_group * (1 + kSameSize)) {
      ++n;
      first_of_group = v[i];
    }
  }
  return n;
}

// --- compute ---

struct ComputeObservation {
  double flops = 0, peak = 0, memory_s = 0, time_s = 0;
};

// The best (overhead, 1/max_efficiency) for one saturation, and its residual.
struct CurveTry {
  model::Efficiency e;
  double residual = std::numeric_limits<double>::infinity();
};

double predicted_s(const model::Efficiency& e, const ComputeObservation& o) {
  return e.overhead_s + std::max(e.math_s(o.flops, o.peak), o.memory_s);
}

CurveTry fit_curve(const std::vector<ComputeObservation>& obs, double saturation_flops, bool fit_overhead,
                   double prior_overhead_s) {
  std::vector<double> ones, h, y, w, pred;
  model::Efficiency unit{1, saturation_flops, 0};
  for (const ComputeObservation& o : obs) {
    ones.push_back(1);
    h.push_back(unit.math_s(o.flops, o.peak));  // the math time at efficiency 1
    y.push_back(o.time_s);
    w.push_back(1 / (o.time_s * o.time_s));     // relative errors
  }
  CurveTry t;
  t.e.saturation_flops = saturation_flops;
  double inverse_efficiency = 0;
  Fit2 f;
  if (fit_overhead) f = least_squares2(ones, h, y, w);
  if (f.ok && f.a >= 0) {
    t.e.overhead_s = f.a;
    inverse_efficiency = f.b;
  } else {
    t.e.overhead_s = fit_overhead ? 0 : prior_overhead_s;
    std::vector<double> rest;
    for (size_t i = 0; i < y.size(); ++i) rest.push_back(y[i] - t.e.overhead_s);
    inverse_efficiency = least_squares1(h, rest, w);
  }
  if (!(inverse_efficiency >= 1)) {
    // Faster than the peak: the times hardly grow with the work. Efficiency 1, and the
    // overhead carries the rest (the weighted mean of what the math leaves).
    inverse_efficiency = 1;
    if (fit_overhead) {
      double sum = 0, weights = 0;
      for (size_t i = 0; i < y.size(); ++i) sum += w[i] * (y[i] - h[i]), weights += w[i];
      t.e.overhead_s = std::max(0.0, sum / weights);
    }
  }
  t.e.max_efficiency = 1 / inverse_efficiency;
  for (const ComputeObservation& o : obs) pred.push_back(predicted_s(t.e, o));
  t.residual = rms_relative(pred, y);
  return t;
}

ComputeFit fit_compute(const std::string& gpu, const std::string& kind, const std::vector<ComputeObservation>& obs,
                       const model::Efficiency& prior) {
  ComputeFit fit{gpu, kind, static_cast<int>(obs.size()), 0, prior, 0, ""};
  std::vector<double> flops;
  for (const ComputeObservation& o : obs) flops.push_back(o.flops);
  fit.sizes = distinct(flops);
  CurveTry best = fit_curve(obs, 0, fit.sizes >= 2, prior.overhead_s);
  if (fit.sizes == 1) fit.note = "one task size: overhead kept at the prior's, efficiency fitted, flat";
  if (fit.sizes == 2) fit.note = "two task sizes: overhead and a flat efficiency fitted";
  if (fit.sizes >= 3) {
    // The saturation on a log grid around the observed sizes, then golden section around the
    // best grid point (the residual is smooth in log saturation).
    const auto [lo, hi] = std::minmax_element(flops.begin(), flops.end());
    const double a = std::log(*lo / 100), b = std::log(*hi * 100);
    constexpr int kGrid = 80;
    int best_i = -1;
    for (int i = 0; i <= kGrid; ++i) {
      const CurveTry t = fit_curve(obs, std::exp(a + (b - a) * i / kGrid), true, prior.overhead_s);
      if (t.residual < best.residual) best = t, best_i = i;
    }
    if (best_i >= 0) {
      double x0 = a + (b - a) * std::max(0, best_i - 1) / kGrid, x1 = a + (b - a) * std::min(kGrid, best_i + 1) / kGrid;
      const double g = (std::sqrt(5.0) - 1) / 2;
      for (int step = 0; step < 60; ++step) {
        const double c = x1 - g * (x1 - x0), d = x0 + g * (x1 - x0);
        const CurveTry tc = fit_curve(obs, std::exp(c), true, prior.overhead_s);
        const CurveTry td = fit_curve(obs, std::exp(d), true, prior.overhead_s);
        if (tc.residual < td.residual) {
          x1 = d;
          if (tc.residual < best.residual) best = tc;
        } else {
          x0 = c;
          if (td.residual < best.residual) best = td;
        }
      }
    }
  }
  fit.efficiency = best.e;
  fit.residual = best.residual;
  return fit;
}

// --- links ---

struct LinkObservation {
  double latency_part_s = 0, bandwidth_part_s = 0, time_s = 0, bytes = 0;
  double route_latency_s = 0, route_bandwidth_bytes_per_s = 0;
};

// The cluster split into a latency-only one (bandwidths unbounded) and a bandwidth-only one
// (latencies zero), so that a nominal time splits into A + B.
model::Cluster latency_only(model::Cluster c) {
  constexpr double kUnbounded = 1e9;
  for (model::Node& n : c.nodes) {
    n.intra.bandwidth_bytes_per_s *= kUnbounded;
    n.intra.uplink_bandwidth_bytes_per_s *= kUnbounded;
    n.nic.bandwidth_bytes_per_s *= kUnbounded;
  }
  for (model::WanLink& w : c.wan) w.bandwidth_bytes_per_s *= kUnbounded;
  return c;
}
model::Cluster bandwidth_only(model::Cluster c) {
  for (model::Node& n : c.nodes) n.intra.latency_s = n.nic.latency_s = 0;
  for (model::WanLink& w : c.wan) w.latency_s = 0;
  for (model::Region& r : c.regions) r.fabric.latency_s = 0;
  return c;
}

LinkFit fit_link(const std::string& link_class, const std::vector<LinkObservation>& obs) {
  LinkFit fit;
  fit.link_class = link_class;
  fit.observations = static_cast<int>(obs.size());
  std::vector<double> a, b, y, w, bytes, pred;
  for (const LinkObservation& o : obs) {
    a.push_back(o.latency_part_s);
    b.push_back(o.bandwidth_part_s);
    y.push_back(o.time_s);
    w.push_back(1 / (o.time_s * o.time_s));
    bytes.push_back(o.bytes);
    if (fit.nominal_bandwidth_bytes_per_s == 0 || o.route_bandwidth_bytes_per_s > fit.nominal_bandwidth_bytes_per_s) {
      fit.nominal_bandwidth_bytes_per_s = o.route_bandwidth_bytes_per_s;
      fit.nominal_latency_s = o.route_latency_s;
    }
  }
  fit.sizes = distinct(bytes);
  Fit2 f;
  if (fit.sizes >= 2) f = least_squares2(a, b, y, w);
  if (f.ok && f.a >= 0 && f.b > 0) {
    fit.factors.latency_factor = f.a;
    fit.factors.bandwidth_factor = 1 / f.b;
  } else {
    // One size (or a fit that says negative latency): the latency as nominal, the bandwidth fitted.
    std::vector<double> rest;
    for (size_t i = 0; i < y.size(); ++i) rest.push_back(y[i] - a[i]);
    const double inverse = least_squares1(b, rest, w);
    fit.factors.bandwidth_factor = inverse > 0 ? 1 / inverse : 1;
    fit.note = fit.sizes < 2 ? "one message size: latency kept nominal, bandwidth fitted"
                             : "latency and bandwidth not separable here: latency kept nominal, bandwidth fitted";
  }
  for (size_t i = 0; i < y.size(); ++i) {
    pred.push_back(fit.factors.latency_factor * a[i] + b[i] / fit.factors.bandwidth_factor);
  }
  fit.residual = rms_relative(pred, y);
  return fit;
}

// The link classes a calibration has factors for (a fat tree's "fabric" uplinks are the
// NICs' bandwidth, not a class of their own).
bool calibrated_class(std::string_view c) {
  return c == "pcie" || c == "nvlink" || c == "nvswitch" || c == "nic" || c == "wan";
}

void check_run(const MeasuredRun& run) {
  const Trace& t = *run.trace;
  if (t.fingerprint != run.plan->fingerprint) {
    throw InputError(run.name, 0, "fingerprint",
                     "the trace was made from another plan: it says " + t.fingerprint + ", the plan is " +
                         run.plan->fingerprint);
  }
  for (const Event& e : t.events) {
    const bool known = e.task >= 0 && static_cast<size_t>(e.task) < run.plan->tasks.size();
    if (known && e.message >= 0) {  // an in-task message: one the task's collectives have
      const auto calls = run.plan->inside(e.task);
      if (static_cast<size_t>(e.message) < calls.size() && calls[static_cast<size_t>(e.message)].collective == e.group) continue;
      throw InputError(run.name, 0, "message", "event of message " + std::to_string(e.message) + " of collective " +
                                                   std::to_string(e.group) + " in task " + std::to_string(e.task) +
                                                   " is no such in-task message of the plan");
    }
    if (!known || run.plan->task(e.task).kind != e.kind) {
      throw InputError(run.name, 0, "task", "event of task " + std::to_string(e.task) + " (" +
                                                std::string(partition::to_string(e.kind)) + ") is no such task of the plan");
    }
  }
}

}  // namespace

std::vector<double> ready_times(const Trace& trace, const partition::Plan& plan) {
  const EventIndex index(trace, plan);
  const partition::RunGraph graph(plan);
  // Predecessors of each task: its data and order edges (with offsets), and the task before
  // it on its stream (the last task of the stream's previous iteration for the first one).
  std::vector<std::vector<std::pair<int, int>>> before(plan.tasks.size());  // (task, iteration offset)
  for (size_t t = 0; t < plan.tasks.size(); ++t) {
    for (const partition::RunGraph::Successor& s : graph.successors(static_cast<int>(t))) {
      before[static_cast<size_t>(s.task)].emplace_back(static_cast<int>(t), s.offset);
    }
  }
  for (const auto& device : plan.programs) {
    for (const partition::StreamProgram& stream : device) {
      for (size_t k = 0; k < stream.tasks.size(); ++k) {
        const int previous = k > 0 ? stream.tasks[k - 1] : stream.tasks.back();
        before[static_cast<size_t>(stream.tasks[k])].emplace_back(previous, k > 0 ? 0 : 1);
      }
    }
  }
  std::vector<double> ready(trace.events.size());
  for (size_t i = 0; i < trace.events.size(); ++i) {
    const Event& e = trace.events[i];
    ready[i] = e.start_s;
    if (e.task < 0 || static_cast<size_t>(e.task) >= plan.tasks.size()) continue;
    double latest = -std::numeric_limits<double>::infinity();
    for (const auto& [task, offset] : before[static_cast<size_t>(e.task)]) {
      const int at = index(task, e.iteration - offset);
      if (at >= 0) latest = std::max(latest, trace.events[static_cast<size_t>(at)].end_s);
    }
    if (latest > -std::numeric_limits<double>::infinity()) ready[i] = std::min(e.start_s, latest);
  }
  return ready;
}

namespace {

// Collective ci's durations over the iterations from `first`: from the last member ready to
// the last done. An in-task collective's are its messages' (all alike), each from the last
// member to start it to the last to end it.
std::vector<double> collective_durations_s(const Trace& trace, const partition::Plan& plan, const EventIndex& index,
                                           const std::vector<double>& ready, int ci, int first) {
  const partition::Collective& c = plan.collective(ci);
  // Per member, where each message is among its task's in-task messages.
  std::vector<std::vector<int>> place(c.tasks.size(), std::vector<int>(c.at.size(), -1));
  for (size_t m = 0; m < c.tasks.size(); ++m) {
    const auto calls = plan.inside(c.tasks[m]);
    for (size_t k = 0; k < calls.size(); ++k) {
      if (calls[k].collective == ci && static_cast<size_t>(calls[k].message) < c.at.size()) {
        place[m][static_cast<size_t>(calls[k].message)] = static_cast<int>(k);
      }
    }
  }
  std::vector<double> durations;
  for (int i = first; i < index.iterations(); ++i) {
    for (size_t k = 0; k < std::max<size_t>(1, c.at.size()); ++k) {
      double last_ready = -std::numeric_limits<double>::infinity(), last_end = last_ready;
      bool complete = true;
      for (size_t m = 0; m < c.tasks.size() && complete; ++m) {
        const int at = c.in_task() ? index.message(c.tasks[m], i, place[m][k]) : index(c.tasks[m], i);
        complete = at >= 0;
        if (!complete) break;
        const Event& e = trace.events[static_cast<size_t>(at)];
        last_ready = std::max(last_ready, c.in_task() ? e.start_s : ready[static_cast<size_t>(at)]);
        last_end = std::max(last_end, e.end_s);
      }
      if (complete) durations.push_back(last_end - last_ready);
    }
  }
  return durations;
}

// The fastest link of each class built, one direction (a fitted link faster than this moved
// its bytes some other way, e.g. a copy in one process): PCIe 5.0 x16, 32 GT/s x 16 lanes at
// 128b/130b (PCI-SIG, PCI Express Base Specification 5.0); NVLink 4 and NVSwitch on H100
// SXM, 900 GB/s total (NVIDIA H100 Tensor Core GPU datasheet); an 800 Gb/s NIC (NVIDIA
// ConnectX-8 SuperNIC product brief); WAN at most a NIC.
double fastest_physical_bytes_per_s(const std::string& link_class) {
  if (link_class == "pcie") return 32e9 * 16 * 128 / 130 / 8;
  if (link_class == "nvlink" || link_class == "nvswitch") return 450e9;
  return 800e9 / 8;
}

std::string gflops(double flops_per_s) {
  std::ostringstream s;
  s << std::setprecision(3) << flops_per_s / 1e9 << " GFLOP/s";
  return s.str();
}

void warn(CalibrationFit& out) {
  for (const ComputeFit& c : out.compute) {
    if (c.efficiency.max_efficiency >= 1 - 1e-9 && c.residual > 0.1) {
      std::ostringstream s;
      s << c.gpu << " " << c.kind << ": efficiency at its cap of 1 with a residual of " << std::setprecision(3)
        << 100 * c.residual << " %: the tasks ran faster than the peak allows (a probed speed that understates the "
        << "device, a wrong GPU type or precision); the fit cannot follow them";
      out.warnings.push_back(s.str());
    }
  }
  for (const LinkFit& l : out.links) {
    const double fitted = l.nominal_bandwidth_bytes_per_s * l.factors.bandwidth_factor;
    const double fastest = std::max(fastest_physical_bytes_per_s(l.link_class), l.nominal_bandwidth_bytes_per_s);
    if (fitted > fastest) {
      std::ostringstream s;
      s << l.link_class << " fitted at " << std::setprecision(3) << fitted / 1e9 << " GB/s, faster than any physical "
        << l.link_class << " link (" << fastest / 1e9 << " GB/s): its bytes did not cross a wire (an in-process "
        << "copy?); do not carry this factor to a real cluster";
      out.warnings.push_back(s.str());
    }
  }
  std::map<std::string, std::pair<double, double>> range;  // gpu -> (lowest, highest) peak
  for (const PeakSeen& p : out.peaks) {
    auto [it, fresh] = range.try_emplace(p.gpu, p.peak_flops_per_s, p.peak_flops_per_s);
    it->second.first = std::min(it->second.first, p.peak_flops_per_s);
    it->second.second = std::max(it->second.second, p.peak_flops_per_s);
  }
  for (const auto& [gpu, r] : range) {
    if (r.second > 1.1 * r.first) {
      out.warnings.push_back(gpu + "'s peak differs between the runs' plans, from " + gflops(r.first) + " to " +
                             gflops(r.second) + " (a probed speed that moved: a loaded or throttling host); the "
                             "fitted efficiencies are relative to each run's own peak");
    }
  }
}

}  // namespace

CalibrationFit calibrate(const std::vector<MeasuredRun>& runs, const model::Calibration& prior) {
  std::map<std::pair<std::string, std::string>, std::vector<ComputeObservation>> compute;  // (gpu, kind)
  std::map<std::string, std::vector<double>> run_dispatch;                                // gpu -> each run's mean gap
  std::map<std::string, int> gap_count;                                                   // gpu -> gaps seen
  std::map<std::string, std::vector<LinkObservation>> links;                              // class
  std::vector<PeakSeen> peaks;
  for (const MeasuredRun& run : runs) {
    check_run(run);
    const Trace& trace = *run.trace;
    const partition::Plan& plan = *run.plan;
    const EventIndex index(trace, plan);
    const std::vector<double> ready = ready_times(trace, plan);
    const partition::CostModel nominal(plan.cluster, plan.layout.precision);
    const partition::CostModel latency(latency_only(plan.cluster), plan.layout.precision);
    const partition::CostModel bandwidth(bandwidth_only(plan.cluster), plan.layout.precision);
    const partition::RunGraph graph(plan);
    const int first = index.iterations() > 1 ? 1 : 0;  // iteration 0 warms up
    const std::vector<model::Device> devices = plan.cluster.devices();
    std::map<std::string, std::vector<double>> gaps;  // gpu -> this run's dispatch gaps
    bool any_compute = false;
    for (const model::GpuSpec& g : plan.cluster.gpu_types) {
      bool used = false;
      for (const model::Device& d : devices) used = used || plan.cluster.device_gpu(d).name == g.name;
      if (used) peaks.push_back({g.name, run.name, g.peak_flops_per_s(plan.layout.precision)});
    }
    for (size_t t = 0; t < plan.tasks.size(); ++t) {
      const partition::Task& task = plan.tasks[t];
      const model::GpuSpec& spec = plan.cluster.device_gpu(devices.at(static_cast<size_t>(task.device)));
      const std::string& gpu = spec.name;
      std::vector<double> durations;
      if (partition::is_compute(task.kind)) {
        for (int i = first; i < index.iterations(); ++i) {
          const int at = index(static_cast<int>(t), i);
          if (at < 0) continue;
          const Event& e = trace.events[static_cast<size_t>(at)];
          durations.push_back(index.own_s(trace, static_cast<int>(t), i));  // (its in-task messages are not compute)
          gaps[gpu].push_back(e.start_s - ready[static_cast<size_t>(at)]);
        }
        const double d = median(durations);
        if (durations.empty() || !(d > 0) || task.flops <= 0) continue;
        any_compute = true;
        const double peak = nominal.peak_flops_per_s(task.device);
        const double memory_s = task.memory_bytes / spec.memory_bandwidth_bytes_per_s;
        compute[{gpu, std::string(partition::to_string(task.kind))}].push_back({task.flops, peak, memory_s, d});
      } else if (task.kind == TaskKind::send && graph.partner(static_cast<int>(t)) >= 0) {
        const int recv = graph.partner(static_cast<int>(t));
        const int src = task.device, dst = plan.task(recv).device;
        for (int i = first; i < index.iterations(); ++i) {
          const int s = index(static_cast<int>(t), i), r = index(recv, i);
          if (s < 0 || r < 0) continue;
          durations.push_back(trace.events[static_cast<size_t>(r)].end_s -
                              std::max(ready[static_cast<size_t>(s)], ready[static_cast<size_t>(r)]));
        }
        const double d = median(durations);
        if (durations.empty() || !(d > 0) || task.bytes <= 0) continue;
        const partition::Route route = nominal.route(src, dst);
        if (!calibrated_class(route.bottleneck)) continue;
        links[std::string(route.bottleneck)].push_back({latency.transfer_time_s(src, dst, task.bytes),
                                           bandwidth.transfer_time_s(src, dst, task.bytes), d, task.bytes,
                                           route.latency_s, route.bandwidth_bytes_per_s});
      }
    }
    for (size_t ci = 0; ci < plan.collectives.size(); ++ci) {
      const partition::Collective& c = plan.collectives[ci];
      // A tree's closed form is an upper bound wherever its leaves are not all on the deepest
      // level (the gradient norm's): fitting links to it would bias them.
      if (c.algorithm == partition::CollectiveAlgorithm::tree) continue;
      const std::vector<double> durations = collective_durations_s(trace, plan, index, ready, static_cast<int>(ci), first);
      const double d = median(durations);
      if (durations.empty() || !(d > 0) || c.bytes <= 0) continue;
      partition::CollectiveSpec spec = partition::collective_spec(plan, c);
      if (c.in_task()) {  // each duration is one message's
        spec.bytes /= std::max(1, spec.messages);
        spec.messages = 1;
      }
      // The class of the slowest route between ring neighbours.
      partition::Route slowest{std::numeric_limits<double>::infinity(), 0, ""};
      for (size_t k = 0; k < spec.devices.size(); ++k) {
        const partition::Route r = nominal.route(spec.devices[k], spec.devices[(k + 1) % spec.devices.size()]);
        if (r.bandwidth_bytes_per_s < slowest.bandwidth_bytes_per_s) slowest = r;
      }
      if (!calibrated_class(slowest.bottleneck)) continue;
      links[std::string(slowest.bottleneck)].push_back({latency.collective_time_s(spec), bandwidth.collective_time_s(spec), d, spec.bytes,
                                           slowest.latency_s, slowest.bandwidth_bytes_per_s});
    }
    if (!any_compute) throw InputError(run.name, 0, "events", "no compute task with FLOPs ran to completion: nothing to fit");
    for (const auto& [gpu, v] : gaps) {
      // The mean, not the median: hand-offs add up to iteration times, a thread that waited
      // for a core included (on a loaded host the median gap is a tenth of the mean).
      double sum = 0;
      for (double g : v) sum += g;
      run_dispatch[gpu].push_back(sum / static_cast<double>(v.size()));
      gap_count[gpu] += static_cast<int>(v.size());
    }
  }

  CalibrationFit out;
  out.calibration = prior;
  for (const auto& [key, obs] : compute) {
    const auto& [gpu, kind] = key;
    const model::GpuEfficiency& base = prior.gpu(gpu);
    ComputeFit fit = fit_compute(gpu, kind, obs, base.of(kind));
    auto [it, inserted] = out.calibration.gpus.try_emplace(gpu, base);
    it->second.kinds[kind] = fit.efficiency;
    out.compute.push_back(std::move(fit));
  }
  for (auto& [gpu, g] : out.calibration.gpus) {
    // The type's own figures: its forward's (the kind most plans have most of).
    if (const auto f = g.kinds.find("forward"); f != g.kinds.end()) static_cast<model::Efficiency&>(g) = f->second;
  }
  for (const auto& [gpu, v] : run_dispatch) {
    // Over the runs the median: one run on a busier spell of the host does not move it.
    const double dispatch = std::max(0.0, median(v));
    out.dispatch.push_back({gpu, gap_count[gpu], static_cast<int>(v.size()), dispatch});
    out.calibration.gpus.try_emplace(gpu, prior.gpu(gpu)).first->second.dispatch_s = dispatch;
  }
  for (const auto& [link_class, obs] : links) {
    LinkFit fit = fit_link(link_class, obs);
    out.calibration.links[link_class] = fit.factors;
    out.links.push_back(std::move(fit));
  }
  out.peaks = std::move(peaks);
  warn(out);
  return out;
}

}  // namespace hetflow::traces
