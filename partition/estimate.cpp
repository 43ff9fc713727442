#include "partition/estimate.hpp"

#include <algorithm>
#include <deque>
#include <limits>

#include "model/error.hpp"
#include "partition/loading.hpp"

namespace hetflow::partition {

CollectiveSpec collective_spec(const Plan& plan, const Collective& c) {
  CollectiveSpec spec;
  spec.kind = c.kind;
  spec.algorithm = c.algorithm;
  spec.devices = plan.members(c);
  spec.bytes = c.bytes;
  spec.root = c.root;
  spec.messages = c.messages;
  spec.parts = c.parts;
  return spec;
}

double task_duration_s(const Plan& plan, const CostModel& cost, int task) {
  const Task& t = plan.task(task);
  switch (t.kind) {
    case TaskKind::forward:
    case TaskKind::backward:
    case TaskKind::backward_weight:
    case TaskKind::optimizer:
      return cost.task_compute_time_s(plan, t) + in_task_time_s(plan, cost, task);
    case TaskKind::send:
      return cost.transfer_time_s(t.device, plan.peer(task), t.bytes);
    case TaskKind::recv:
      return cost.transfer_time_s(plan.peer(task), t.device, t.bytes);
    case TaskKind::collective:  // (its local reduction first: the gradient norm's read)
      return cost.memory_op_time_s(t.device, t.memory_bytes) +
             cost.collective_time_s(collective_spec(plan, plan.collective(t.collective)));
    case TaskKind::load:
      return load_time_s(plan, t);
    case TaskKind::to_host:
    case TaskKind::to_device:
      return cost.host_copy_time_s(t.device, t.bytes);
    case TaskKind::host_optimizer:
      return cost.host_step_time_s(t.device, t.flops, t.memory_bytes);
  }
  return 0;
}

double in_task_time_s(const Plan& plan, const CostModel& cost, int task) {
  double s = 0, compute_s = -1;
  std::vector<std::pair<int, double>> message_s;  // per overlapped collective: one message's time
  for (const InTaskCall& call : plan.inside(task)) {
    const Collective& c = plan.collective(call.collective);
    if (c.until.empty()) {  // each collective once, at its first message
      if (call.message == 0) s += cost.collective_time_s(collective_spec(plan, c));
      continue;
    }
    auto found = std::find_if(message_s.begin(), message_s.end(), [&](const auto& m) { return m.first == call.collective; });
    if (found == message_s.end()) {
      message_s.emplace_back(call.collective, cost.collective_time_s(collective_spec(plan, c)) / std::max(1, c.messages));
      found = message_s.end() - 1;
    }
    if (!call.overlaps()) {
      s += found->second;
      continue;
    }
    if (compute_s < 0) compute_s = cost.task_compute_time_s(plan, plan.task(task));
    s += std::max(0.0, found->second - (call.until - call.at) * compute_s);  // what outlasts the work it overlaps
  }
  return s;
}

BubbleMeter::BubbleMeter(const Plan& plan, int iterations)
    : iterations_(std::max(1, iterations)), worker_of_(static_cast<size_t>(plan.device_count()), -1) {
  for (size_t w = 0; w < plan.layout.workers.size(); ++w) {
    for (const auto& rank : plan.layout.workers[w].ranks) {
      for (int d : rank) {
        if (d >= 0 && d < plan.device_count()) worker_of_[static_cast<size_t>(d)] = static_cast<int>(w);
      }
    }
  }
  const auto n = static_cast<size_t>(iterations_);
  busy_.assign(worker_of_.size() * n, -1);  // -1: the device ran no pipeline compute then
  span_begin_.assign(plan.layout.workers.size() * n, std::numeric_limits<double>::infinity());
  span_end_.assign(plan.layout.workers.size() * n, 0);
}

void BubbleMeter::add(int device, int iteration, double start_s, double end_s) {
  if (device < 0 || static_cast<size_t>(device) >= worker_of_.size() || iteration < 0 || iteration >= iterations_) return;
  const int w = worker_of_[static_cast<size_t>(device)];
  if (w < 0) return;
  const auto n = static_cast<size_t>(iterations_), it = static_cast<size_t>(iteration);
  double& busy = busy_[static_cast<size_t>(device) * n + it];
  busy = std::max(busy, 0.0) + (end_s - start_s);
  const size_t key = static_cast<size_t>(w) * n + it;
  span_begin_[key] = std::min(span_begin_[key], start_s);
  span_end_[key] = std::max(span_end_[key], end_s);
}

void BubbleMeter::add_input_wait(int device, int iteration, double from_s, double to_s) {
  if (device < 0 || static_cast<size_t>(device) >= worker_of_.size() || iteration < 0 || iteration >= iterations_) return;
  if (worker_of_[static_cast<size_t>(device)] < 0 || !(to_s > from_s)) return;
  waits_.push_back({device, iteration, from_s, to_s});
}

double BubbleMeter::fraction(int first_iteration, int end_iteration) const {
  double sum = 0;
  int count = 0;
  const auto n = static_cast<size_t>(iterations_);
  const size_t end = end_iteration < 0 ? n : std::min(n, static_cast<size_t>(end_iteration));
  // Each device's input wait inside its worker's span, per iteration.
  std::vector<double> waited(busy_.size(), 0);
  for (const Wait& w : waits_) {
    const size_t key = static_cast<size_t>(worker_of_[static_cast<size_t>(w.device)]) * n + static_cast<size_t>(w.iteration);
    const double from = std::max(w.from_s, span_begin_[key]), to = std::min(w.to_s, span_end_[key]);
    if (to > from) waited[static_cast<size_t>(w.device) * n + static_cast<size_t>(w.iteration)] += to - from;
  }
  for (size_t d = 0; d < worker_of_.size(); ++d) {
    if (worker_of_[d] < 0) continue;
    for (size_t it = static_cast<size_t>(std::max(first_iteration, 0)); it < end; ++it) {
      const double busy = busy_[d * n + it];
      const size_t key = static_cast<size_t>(worker_of_[d]) * n + it;
      const double span = span_end_[key] - span_begin_[key];
      if (busy < 0 || span <= 0) continue;
      sum += std::max(0.0, 1 - (busy + waited[d * n + it]) / span);
      ++count;
    }
  }
  return count > 0 ? sum / count : 0;
}

Estimate estimate_plan(const Plan& plan, const CostModel& cost) { return estimate_plan(plan, cost, order_tasks(plan)); }

namespace {

// A forward that a load feeds, in units: where its input wait (input_wait_span) comes from.
struct FedForward {
  int forward = -1, load = -1;
  int before = -1;  // the unit before the forward on its stream; -1: the stream's last of the iteration before
  int wrap = -1;    // the stream's last unit
  int device = -1;
};

std::vector<FedForward> fed_forwards(const Plan& plan, const TaskOrder& order) {
  std::vector<int> load_of(plan.tasks.size(), -1);  // forward task -> the load that feeds it
  for (const OrderEdge& edge : plan.order) {
    if (edge.offset == 0 && plan.task(edge.from).kind == TaskKind::load && plan.task(edge.to).kind == TaskKind::forward) {
      load_of[static_cast<size_t>(edge.to)] = edge.from;
    }
  }
  std::vector<FedForward> out;
  const auto unit = [&](int task) { return order.unit_of_task[static_cast<size_t>(task)]; };
  for (const auto& device : plan.programs) {
    for (const StreamProgram& s : device) {
      for (size_t i = 0; i < s.tasks.size(); ++i) {
        const int load = load_of[static_cast<size_t>(s.tasks[i])];
        if (load < 0) continue;
        out.push_back({unit(s.tasks[i]), unit(load), i > 0 ? unit(s.tasks[i - 1]) : -1, unit(s.tasks.back()),
                       plan.task(s.tasks[i]).device});
      }
    }
  }
  return out;
}

// The critical path over the plan's iterations with these unit durations: each iteration's
// end, and (where `e` is given) each device's compute, its input wait and the bubble, into it.
//
// Iteration i runs the one-iteration order again: a unit is ready when its predecessors in
// iteration i are done, when the previous task on each of its streams is (the stream's last
// task of iteration i - 1 for its first), and when its order edges with offset k from
// iteration i - k are.
std::vector<double> run_iterations(const Plan& plan, const TaskOrder& order, const std::vector<double>& duration,
                                   const std::vector<double>& computing, Estimate* e) {
  const size_t units = order.unit_count();
  const int iterations = std::max(1, plan.iterations());
  // Cross-iteration links: each stream's first unit waits for its last one; order edges with
  // an offset (WSP, prefetching loads) wait for an earlier iteration of their source.
  std::vector<std::pair<int, int>> wraps;  // (last unit, first unit) per stream
  for (const auto& device : plan.programs) {
    for (const StreamProgram& s : device) {
      if (s.tasks.empty()) continue;
      wraps.emplace_back(order.unit_of_task[static_cast<size_t>(s.tasks.back())],
                         order.unit_of_task[static_cast<size_t>(s.tasks.front())]);
    }
  }
  int max_offset = 1;
  std::vector<std::tuple<int, int, int>> delayed;  // (from unit, to unit, offset)
  for (const OrderEdge& edge : plan.order) {
    if (edge.offset <= 0) continue;
    delayed.emplace_back(order.unit_of_task[static_cast<size_t>(edge.from)],
                         order.unit_of_task[static_cast<size_t>(edge.to)], edge.offset);
    max_offset = std::max(max_offset, edge.offset);
  }
  std::deque<std::vector<double>> past;  // unit end times of the last max_offset iterations, newest first
  BubbleMeter bubble(plan, e != nullptr ? iterations : 1);
  const std::vector<FedForward> fed = e != nullptr ? fed_forwards(plan, order) : std::vector<FedForward>{};
  std::vector<double> waited(static_cast<size_t>(iterations), 0);  // every device's input wait, per iteration
  std::vector<double> iteration_end(static_cast<size_t>(iterations), 0);
  std::vector<double> ready(units), end(units);
  for (int it = 0; it < iterations; ++it) {
    std::fill(ready.begin(), ready.end(), 0.0);
    if (!past.empty()) {
      for (const auto& [last, first] : wraps) ready[static_cast<size_t>(first)] = std::max(ready[static_cast<size_t>(first)], past.front()[static_cast<size_t>(last)]);
    }
    for (const auto& [from, to, offset] : delayed) {
      if (offset <= static_cast<int>(past.size())) {
        double& r = ready[static_cast<size_t>(to)];
        r = std::max(r, past[static_cast<size_t>(offset - 1)][static_cast<size_t>(from)]);
      }
    }
    double& last_end = iteration_end[static_cast<size_t>(it)];
    for (int u : order.order) {
      const auto uu = static_cast<size_t>(u);
      const double finish = ready[uu] + duration[uu];
      end[uu] = finish;
      last_end = std::max(last_end, finish);
      for (int s = order.successor_begin[uu]; s < order.successor_begin[uu + 1]; ++s) {
        double& r = ready[static_cast<size_t>(order.successors[static_cast<size_t>(s)])];
        const double f = order.successor_fraction[static_cast<size_t>(s)];
        r = std::max(r, f < 1 ? ready[uu] + f * duration[uu] : finish);
      }
      if (e == nullptr) continue;
      for (int t : order.unit(u)) {
        const Task& task = plan.task(t);
        // Compute only, as every report's utilisation counts it (traces/figures.hpp).
        if (is_compute(task.kind)) e->busy_s[static_cast<size_t>(task.device)] += computing[uu] / iterations;
        if (is_pass(task.kind)) bubble.add(task.device, it, ready[uu], ready[uu] + computing[uu]);
      }
    }
    for (const FedForward& f : fed) {
      const double before = f.before >= 0 ? end[static_cast<size_t>(f.before)]
                                          : past.empty() ? 0.0 : past.front()[static_cast<size_t>(f.wrap)];
      const auto l = static_cast<size_t>(f.load);
      const InputWaitSpan w = input_wait_span(ready[l], end[l], before, ready[static_cast<size_t>(f.forward)]);
      bubble.add_input_wait(f.device, it, w.from_s, w.to_s);
      waited[static_cast<size_t>(it)] += w.length_s();
    }
    past.push_front(end);
    if (static_cast<int>(past.size()) > max_offset) past.pop_back();
  }
  if (e != nullptr) {
    e->bubble_fraction = bubble.fraction();
    // Steady state as the iteration time's: the iterations after the first, where there are several.
    const size_t first = iterations > 1 ? 1 : 0;
    double sum = 0;
    for (size_t it = first; it < waited.size(); ++it) sum += waited[it];
    std::vector<bool> passes(static_cast<size_t>(plan.device_count()), false);
    for (const Task& t : plan.tasks) {
      if (is_pass(t.kind) && t.device >= 0 && t.device < plan.device_count()) passes[static_cast<size_t>(t.device)] = true;
    }
    const auto pass_devices = static_cast<double>(std::count(passes.begin(), passes.end(), true));
    e->input_wait_s = pass_devices > 0 ? sum / static_cast<double>(waited.size() - first) / pass_devices : 0;
  }
  return iteration_end;
}

// Steady state: (end of the last iteration - end of the first) / (iterations - 1), else the makespan.
double steady_s(const std::vector<double>& iteration_end) {
  const double makespan = *std::max_element(iteration_end.begin(), iteration_end.end());
  const auto n = iteration_end.size();
  return n > 1 ? (iteration_end.back() - iteration_end.front()) / static_cast<double>(n - 1) : makespan;
}

}  // namespace

Estimate estimate_plan(const Plan& plan, const CostModel& cost, const TaskOrder& order) {
  if (!order.complete()) {
    std::string message = "the plan deadlocks: these tasks wait for each other in a cycle:";
    for (int t : order.cycle) message += "\n  " + describe_task(plan, t);
    throw PlanError(message);
  }
  const size_t units = order.unit_count();
  std::vector<double> duration(units), computing(units);  // a compute unit's without its in-task collectives
  std::vector<size_t> loads;                               // units of load tasks
  const bool any_load = std::any_of(plan.tasks.begin(), plan.tasks.end(), [](const Task& t) { return t.kind == TaskKind::load; });
  const LoaderDemand demand = any_load ? loader_demand(plan.cluster, plan.network, plan.layout) : LoaderDemand{};
  for (size_t u = 0; u < units; ++u) {
    const int front = order.unit(static_cast<int>(u)).front();
    const Task& t = plan.task(front);
    if (t.kind == TaskKind::load) {
      duration[u] = computing[u] = load_time_s(plan, demand, t);  // once for all loads, not per task
      loads.push_back(u);
      continue;
    }
    duration[u] = task_duration_s(plan, cost, front);
    computing[u] = is_compute(t.kind) ? duration[u] - in_task_time_s(plan, cost, front) : duration[u];
    // Compute tasks that meet inside (an in-task collective's members: a tensor, context or
    // expert group) move at the slowest's pace; a collective's members all take its time,
    // after the slowest's local reduction (Task::memory_bytes, the gradient norm's read).
    if (t.kind == TaskKind::collective) {
      for (const int other : order.unit(static_cast<int>(u)).subspan(1)) {
        const Task& o = plan.task(other);
        if (o.memory_bytes == t.memory_bytes && cost.same_compute(o.device, t.device)) continue;
        duration[u] = computing[u] = std::max(duration[u], task_duration_s(plan, cost, other));
      }
    }
    if (is_compute(t.kind)) {
      for (const int other : order.unit(static_cast<int>(u)).subspan(1)) {
        // (A tensor-parallel group's alike members, the usual case, are not timed again.)
        const Task& o = plan.task(other);
        if (o.flops == t.flops && o.memory_bytes == t.memory_bytes && o.recompute_flops == t.recompute_flops &&
            cost.same_compute(o.device, t.device)) {
          continue;
        }
        const double d = task_duration_s(plan, cost, other);
        if (d <= duration[u]) continue;
        duration[u] = d;
        computing[u] = d - in_task_time_s(plan, cost, other);
      }
    }
  }
  Estimate e;
  const size_t devices = static_cast<size_t>(plan.device_count());
  e.busy_s.assign(devices, 0);
  const std::vector<double> iteration_end = run_iterations(plan, order, duration, computing, &e);
  e.makespan_s = *std::max_element(iteration_end.begin(), iteration_end.end());
  e.iteration_time_s = steady_s(iteration_end);
  e.compute_iteration_time_s = e.iteration_time_s;
  if (!loads.empty()) {  // the GPUs' own rate: the same critical path with loads that take no time
    for (size_t u : loads) duration[u] = computing[u] = 0;
    e.compute_iteration_time_s = steady_s(run_iterations(plan, order, duration, computing, nullptr));
  }
  const double samples = plan.layout.samples_per_iteration();
  e.throughput_samples_per_s = e.iteration_time_s > 0 ? samples / e.iteration_time_s : 0;
  e.throughput_tokens_per_s = e.throughput_samples_per_s * plan.network.tokens_per_sample;
  e.compute_throughput_samples_per_s = e.compute_iteration_time_s > 0 ? samples / e.compute_iteration_time_s : 0;
  e.peak_memory_bytes.assign(devices, 0);
  for (size_t d = 0; d < devices && d < plan.memory.size(); ++d) e.peak_memory_bytes[d] = plan.memory[d].total_bytes();
  return e;
}

}  // namespace hetflow::partition
