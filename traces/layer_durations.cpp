#include "traces/layer_durations.hpp"

#include <algorithm>
#include <cmath>

#include "model/error.hpp"
#include "traces/event_index.hpp"

namespace hetflow::traces {

namespace {

using partition::TaskKind;
using Phase = LayerRates::Phase;

// A compute task's FLOPs on each of its layers, by phase, in the proportions the plan
// builder counts them (partition/plan_builder.cpp, chunk_work) and scaled so that they add
// up to the task's own FLOPs and recompute FLOPs.
struct LayerFlops {
  int layer = 0;
  double work_flops = 0;       // forward work for F, backward work for B and W
  double recompute_flops = 0;  // B: forward work redone
};

std::vector<LayerFlops> layer_flops(const partition::Plan& plan, const partition::Task& task) {
  const partition::Layout& layout = plan.layout;
  int tensor = 1;
  if (task.worker >= 0 && static_cast<size_t>(task.worker) < layout.workers.size() && task.stage >= 0 &&
      static_cast<size_t>(task.stage) < layout.workers[static_cast<size_t>(task.worker)].stages.size()) {
    tensor = layout.workers[static_cast<size_t>(task.worker)].tensor_of(static_cast<size_t>(task.stage));
  }
  std::vector<LayerFlops> out;
  double work = 0, recompute = 0;
  for (int l = task.layer_begin; l < task.layer_end && l < static_cast<int>(plan.network.layers.size()); ++l) {
    const model::Layer& layer = plan.network.layers[static_cast<size_t>(l)];
    const double t = layer.tp_splittable ? tensor : 1;
    LayerFlops f{l, (task.kind == TaskKind::forward ? layer.forward_flops : layer.backward_flops) / t, 0};
    if (task.kind == TaskKind::backward && task.recompute_flops > 0) {
      f.recompute_flops = (layout.recompute == partition::Recompute::selective ? layer.attention_core_flops
                                                                                 : layer.forward_flops) / t;
    }
    work += f.work_flops;
    recompute += f.recompute_flops;
    out.push_back(f);
  }
  const double task_work = task.flops - task.recompute_flops;
  for (LayerFlops& f : out) {
    f.work_flops = work > 0 ? f.work_flops * task_work / work : 0;
    f.recompute_flops = recompute > 0 ? f.recompute_flops * task.recompute_flops / recompute : 0;
  }
  return out;
}

const std::string& gpu_type(const partition::Plan& plan, const std::vector<model::Device>& devices, int device) {
  return plan.cluster.device_gpu(devices.at(static_cast<size_t>(device))).name;
}

// Layers that compute the same thing (kind, shape and FLOPs alike: the blocks of a decoder)
// share one rate: each task then says something about every layer of its class.
std::string layer_class(const model::Layer& l) {
  return l.kind + "|" + l.shape + "|" + std::to_string(l.forward_flops) + "|" + std::to_string(l.backward_flops);
}

// One measured task of a phase: its work time and its FLOPs per layer class.
struct TaskWork {
  double work_s = 0, task_flops = 0;
  std::map<int, double> flops_of_class;
};

// Rates per class minimising the tasks' relative errors (weighted least squares,
//   work_s(task) = sum over classes of FLOPs(task, class) x rate(class)),
// with a vanishing pull towards the pooled rate (sum of work / sum of FLOPs) so that classes
// that always appear together get equal rates instead of an arbitrary split. A negative
// rate is fixed at 0 and the rest solved again.
std::map<int, double> fit_class_rates(const std::vector<TaskWork>& tasks) {
  std::vector<int> classes;
  double work = 0, flops = 0;
  for (const TaskWork& t : tasks) {
    work += t.work_s;
    for (const auto& [c, f] : t.flops_of_class) {
      flops += f;
      if (std::find(classes.begin(), classes.end(), c) == classes.end()) classes.push_back(c);
    }
  }
  const double pooled = flops > 0 ? work / flops : 0;
  std::map<int, double> rate;
  std::vector<bool> zero(classes.size(), false);
  for (size_t round = 0; round <= classes.size(); ++round) {
    const size_t n = classes.size();
    std::vector<double> a(n * n, 0), b(n, 0);
    double scale = 0;
    for (const TaskWork& t : tasks) {
      if (t.work_s <= 0) continue;
      const double w = 1 / (t.work_s * t.work_s);
      for (size_t i = 0; i < n; ++i) {
        const auto fi = t.flops_of_class.find(classes[i]);
        if (fi == t.flops_of_class.end() || zero[i]) continue;
        b[i] += w * fi->second * t.work_s;
        for (size_t j = 0; j < n; ++j) {
          const auto fj = t.flops_of_class.find(classes[j]);
          if (fj != t.flops_of_class.end() && !zero[j]) a[i * n + j] += w * fi->second * fj->second;
        }
      }
    }
    for (size_t i = 0; i < n; ++i) scale = std::max(scale, a[i * n + i]);
    const double ridge = 1e-9 * (scale > 0 ? scale : 1);
    for (size_t i = 0; i < n; ++i) {
      if (zero[i]) {
        a[i * n + i] = 1;  // rate 0
        b[i] = 0;
        continue;
      }
      a[i * n + i] += ridge;
      b[i] += ridge * pooled;
    }
    // Gaussian elimination with partial pivoting (n is the number of layer classes: small).
    std::vector<double> x(n, 0);
    for (size_t k = 0; k < n; ++k) {
      size_t pivot = k;
      for (size_t i = k + 1; i < n; ++i) {
        if (std::abs(a[i * n + k]) > std::abs(a[pivot * n + k])) pivot = i;
      }
      for (size_t j = 0; j < n; ++j) std::swap(a[k * n + j], a[pivot * n + j]);
      std::swap(b[k], b[pivot]);
      for (size_t i = k + 1; i < n; ++i) {
        const double f = a[i * n + k] / a[k * n + k];
        for (size_t j = k; j < n; ++j) a[i * n + j] -= f * a[k * n + j];
        b[i] -= f * b[k];
      }
    }
    for (size_t k = n; k-- > 0;) {
      double sum = b[k];
      for (size_t j = k + 1; j < n; ++j) sum -= a[k * n + j] * x[j];
      x[k] = sum / a[k * n + k];
    }
    bool negative = false;
    for (size_t i = 0; i < n; ++i) {
      if (!zero[i] && x[i] < 0) zero[i] = negative = true;
    }
    if (!negative) {
      for (size_t i = 0; i < n; ++i) rate[classes[i]] = std::isfinite(x[i]) ? std::max(0.0, x[i]) : pooled;
      break;
    }
  }
  return rate;
}

}  // namespace

LayerRates attribute_to_layers(const Trace& trace, const partition::Plan& plan, const std::string& trace_name) {
  if (!trace.fingerprint.empty() && trace.fingerprint != plan.fingerprint) {
    throw InputError(trace_name, 0, "fingerprint",
                     "the trace was made from another plan: it says " + trace.fingerprint + ", the plan is " +
                         plan.fingerprint);
  }
  const EventIndex index(trace, plan);
  const std::vector<model::Device> devices = plan.cluster.devices();
  std::map<std::string, int> class_index;
  std::vector<int> class_of_layer;
  for (const model::Layer& l : plan.network.layers) class_of_layer.push_back(class_index.try_emplace(layer_class(l), class_index.size()).first->second);

  LayerRates rates;
  // Per GPU type and phase, the tasks that measured it; forward first, since a backward's
  // recomputation is timed at the forward rates.
  std::map<std::string, std::vector<TaskWork>> forward, backward;
  std::map<std::string, std::map<int, double>> forward_rates;
  std::map<std::string, std::vector<double>> optimizer_rate, optimizer_flops;
  for (const TaskKind kind : {TaskKind::forward, TaskKind::backward, TaskKind::backward_weight, TaskKind::optimizer}) {
    if (kind == TaskKind::backward) {
      for (const auto& [gpu, tasks] : forward) forward_rates[gpu] = fit_class_rates(tasks);
    }
    for (size_t id = 0; id < plan.tasks.size(); ++id) {
      const partition::Task& t = plan.tasks[id];
      if (t.kind != kind || t.flops <= 0) continue;
      // The mean, not the median: durations add up to iteration times, slow instances included.
      const std::vector<double> durations = index.durations_s(trace, static_cast<int>(id));
      if (durations.empty()) continue;
      double d = 0;
      for (double x : durations) d += x / static_cast<double>(durations.size());
      ++rates.measured_tasks;
      const std::string& gpu = gpu_type(plan, devices, t.device);
      const double work_s = d;  // all of it: fixed costs belong to layers too (see the header)
      if (kind == TaskKind::optimizer) {
        optimizer_rate[gpu].push_back(work_s / t.flops);
        optimizer_flops[gpu].push_back(t.flops);
        continue;
      }
      TaskWork w{work_s, t.flops, {}};
      for (const LayerFlops& f : layer_flops(plan, t)) {
        const int c = class_of_layer[static_cast<size_t>(f.layer)];
        if (f.work_flops > 0) w.flops_of_class[c] += f.work_flops;
        if (f.recompute_flops > 0) {
          const auto r = forward_rates[gpu].find(c);
          w.work_s -= f.recompute_flops * (r != forward_rates[gpu].end() ? r->second : 0);
        }
      }
      w.work_s = std::max(0.0, w.work_s);
      (kind == TaskKind::forward ? forward : backward)[gpu].push_back(std::move(w));
    }
  }
  if (rates.measured_tasks == 0) {
    throw InputError(trace_name, 0, "events", "no compute task with FLOPs ran to completion: no durations to reuse");
  }
  for (const auto& [phase, by_gpu] : {std::pair{int(Phase::forward_work), &forward}, std::pair{int(Phase::backward_work), &backward}}) {
    for (const auto& [gpu, tasks] : *by_gpu) {
      const std::map<int, double> class_rate = fit_class_rates(tasks);
      std::map<int, std::vector<double>> sizes;  // the FLOPs of the tasks each class was measured in
      for (const TaskWork& t : tasks) {
        for (const auto& [c, f] : t.flops_of_class) sizes[c].push_back(t.task_flops);
      }
      for (size_t l = 0; l < class_of_layer.size(); ++l) {
        const int c = class_of_layer[l];
        const auto r = class_rate.find(c);
        if (r != class_rate.end()) rates.layer[{gpu, phase, static_cast<int>(l)}] = {r->second, median(sizes[c])};
      }
    }
  }
  for (const auto& [gpu, v] : optimizer_rate) rates.optimizer[gpu] = {median(v), median(optimizer_flops[gpu])};
  rates.micro_batch_size = plan.layout.micro_batch_size;
  return rates;
}

TransferredDurations transfer_durations(const LayerRates& rates, const partition::Plan& target,
                                        const partition::CostModel& cost, const model::Calibration& calibration) {
  TransferredDurations out;
  out.task_s.assign(target.tasks.size(), -1);
  const std::vector<model::Device> devices = target.cluster.devices();
  for (size_t id = 0; id < target.tasks.size(); ++id) {
    const partition::Task& t = target.tasks[id];
    if (!partition::is_compute(t.kind)) continue;
    const std::string& gpu = gpu_type(target, devices, t.device);
    const model::GpuEfficiency& type = calibration.gpu(gpu);
    const model::Efficiency& curve = type.of(std::string(to_string(t.kind)));
    const double peak = cost.peak_flops_per_s(t.device);
    // The time per FLOP measured in tasks of r.task_flops, as the calibrated model changes it
    // when the same task has another size: the optimizer's when it holds other parameters,
    // a layer's when the micro-batch is larger or smaller. Layers moved to other tasks at the
    // same micro-batch size keep their measured time.
    auto per_flop = [&](double flops) { return curve.time_s(flops, peak) / flops; };
    auto resized = [&](const LayerRates::Rate& r, double new_task_flops) {
      return r.task_flops > 0 && new_task_flops > 0 ? r.s_per_flop * per_flop(new_task_flops) / per_flop(r.task_flops)
                                                    : r.s_per_flop;
    };
    const double samples_ratio = static_cast<double>(target.layout.micro_batch_size) / rates.micro_batch_size;
    double work_s = 0;
    bool measured = t.flops > 0;
    if (t.kind == TaskKind::optimizer) {
      const auto r = rates.optimizer.find(gpu);
      if (r == rates.optimizer.end()) {
        measured = false;
      } else {
        work_s = t.flops * resized(r->second, t.flops);
      }
    } else {
      const int phase = t.kind == TaskKind::forward ? Phase::forward_work : Phase::backward_work;
      for (const LayerFlops& f : layer_flops(target, t)) {
        for (const auto& [flops, p] : {std::pair{f.work_flops, phase}, std::pair{f.recompute_flops, int(Phase::forward_work)}}) {
          if (flops <= 0) continue;
          const auto r = rates.layer.find({gpu, p, f.layer});
          if (r == rates.layer.end()) {
            measured = false;
            break;
          }
          work_s += flops * resized(r->second, r->second.task_flops * samples_ratio);
        }
      }
    }
    if (t.flops <= 0) {
      out.task_s[id] = 0;
    } else if (measured) {
      out.task_s[id] = work_s;
      ++out.measured_tasks;
    } else {
      // The replay adds the dispatch to every duration it is given, as the simulator adds it
      // to modelled ones: leave it out here.
      out.task_s[id] = cost.task_compute_time_s(target, t) - type.dispatch_s;
      ++out.modelled_tasks;
    }
  }
  return out;
}

}  // namespace hetflow::traces
