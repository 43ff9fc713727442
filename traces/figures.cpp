#include "traces/figures.hpp"

#include <algorithm>
#include <map>
#include <tuple>

#include "partition/loading.hpp"

namespace hetflow::traces {

namespace {

// An instant where a task starts (+1) or ends (-1); purpose -1 for compute, -2 for a wait
// for input.
struct Edge {
  double t_s;
  int delta;
  int purpose;
};
constexpr int kComputeEdge = -1, kInputWaitEdge = -2;

}  // namespace

std::vector<InputWait> input_waits(const Trace& trace) {
  std::vector<InputWait> out;
  std::map<std::tuple<int, int, int>, const Event*> loads;  // (device, iteration, micro-batch)
  std::map<std::pair<int, std::string>, std::vector<const Event*>> streams;  // (device, stream): its events
  for (const Event& e : trace.events) {
    if (e.kind == partition::TaskKind::load) {
      loads[{e.device, e.iteration, e.microbatch}] = &e;
    } else if (e.message < 0) {
      streams[{e.device, e.stream}].push_back(&e);
    }
  }
  if (loads.empty()) return out;
  for (auto& [key, events] : streams) {
    std::sort(events.begin(), events.end(), [](const Event* a, const Event* b) { return a->start_s < b->start_s; });
    for (size_t i = 0; i < events.size(); ++i) {
      const Event& f = *events[i];
      if (f.kind != partition::TaskKind::forward || f.stage != 0) continue;
      const auto load = loads.find({f.device, f.iteration, f.microbatch});
      if (load == loads.end() || f.device < 0 || static_cast<size_t>(f.device) >= trace.device_names.size()) continue;
      const double before_s = i > 0 ? events[i - 1]->end_s : 0.0;
      const partition::InputWaitSpan w = partition::input_wait_span(load->second->start_s, load->second->end_s, before_s, f.start_s);
      if (w.length_s() > 0) out.push_back({f.device, f.iteration, {w.from_s, w.to_s}});
    }
  }
  return out;
}

std::vector<double> iteration_ends_s(const Trace& trace) {
  int iterations = 0;
  for (const Event& e : trace.events) iterations = std::max(iterations, e.iteration + 1);
  std::vector<double> ends(static_cast<size_t>(iterations), 0);
  for (const Event& e : trace.events) {
    if (e.iteration >= 0) ends[static_cast<size_t>(e.iteration)] = std::max(ends[static_cast<size_t>(e.iteration)], e.end_s);
  }
  // An iteration whose tasks all ended before the last of the one before (a stale worker's,
  // WSP) ends with it: windows never overlap.
  for (size_t i = 1; i < ends.size(); ++i) ends[i] = std::max(ends[i], ends[i - 1]);
  return ends;
}

Window iteration_window(const std::vector<double>& ends_s, int first, int last) {
  const int n = static_cast<int>(ends_s.size());
  if (n == 0 || first > last || last < 0 || first >= n) return {};
  first = std::max(first, 0);
  last = std::min(last, n - 1);
  return {first > 0 ? ends_s[static_cast<size_t>(first - 1)] : 0.0, ends_s[static_cast<size_t>(last)]};
}

std::vector<DeviceTime> device_times(const Trace& trace, Window window) {
  const size_t devices = trace.device_names.size();
  std::vector<DeviceTime> out(devices);
  if (!(window.to_s > window.from_s)) return out;
  std::vector<std::vector<Edge>> edges(devices);
  std::vector<std::string> purposes;  // index -> name
  std::map<std::string, int> purpose_index;
  for (const Event& e : trace.events) {
    const double start = std::max(e.start_s, window.from_s), end = std::min(e.end_s, window.to_s);
    if (!(end > start) || e.device < 0 || static_cast<size_t>(e.device) >= devices) continue;
    // A load runs on the host's loader, not the GPU: a GPU waiting for it is idle (an input stall).
    if (e.kind == partition::TaskKind::load) continue;
    int purpose = kComputeEdge;
    if (!partition::is_compute(e.kind)) {
      const std::string name(partition::to_string(e.purpose));
      purpose = purpose_index.emplace(name, static_cast<int>(purposes.size())).first->second;
      if (static_cast<size_t>(purpose) == purposes.size()) purposes.push_back(name);
    }
    edges[static_cast<size_t>(e.device)].push_back({start, +1, purpose});
    edges[static_cast<size_t>(e.device)].push_back({end, -1, purpose});
    if (e.message >= 0) {  // an in-task message is cut out of its task's compute, which waits for it
      // (one beside the work from its start: what the work waited for, after its overlap_s)
      const double waits = std::max(start, std::min(e.start_s + e.overlap_s, end));
      edges[static_cast<size_t>(e.device)].push_back({waits, -1, -1});
      edges[static_cast<size_t>(e.device)].push_back({end, +1, -1});
    }
  }
  for (const InputWait& w : input_waits(trace)) {
    const double start = std::max(w.window.from_s, window.from_s), end = std::min(w.window.to_s, window.to_s);
    if (!(end > start)) continue;
    edges[static_cast<size_t>(w.device)].push_back({start, +1, kInputWaitEdge});
    edges[static_cast<size_t>(w.device)].push_back({end, -1, kInputWaitEdge});
  }
  for (size_t d = 0; d < devices; ++d) {
    auto& mine = edges[d];
    std::sort(mine.begin(), mine.end(), [](const Edge& x, const Edge& y) { return x.t_s < y.t_s; });
    DeviceTime& time = out[d];
    int computing = 0, communicating = 0, waiting = 0;
    std::vector<int> active(purposes.size(), 0);
    std::vector<double> comm(purposes.size(), 0);
    double at = window.from_s;
    for (const Edge& x : mine) {
      const double span = x.t_s - at;
      if (span > 0) {
        if (computing > 0) {
          time.compute_s += span;
        } else if (waiting > 0) {  // before communication: the device would wait for its input anyway
          time.input_wait_s += span;
        } else if (communicating > 0) {
          int kinds = 0;
          for (const int a : active) kinds += a > 0;
          for (size_t p = 0; p < active.size(); ++p) {
            if (active[p] > 0) comm[p] += span / kinds;
          }
          time.exposed_comm_s += span;
        }
        at = x.t_s;
      }
      if (x.purpose == kInputWaitEdge) {
        waiting += x.delta;
      } else if (x.purpose == kComputeEdge) {
        computing += x.delta;
      } else {
        active[static_cast<size_t>(x.purpose)] += x.delta;
        communicating += x.delta;
      }
    }
    for (size_t p = 0; p < purposes.size(); ++p) {
      if (comm[p] > 0) time.exposed_comm_by_purpose_s[purposes[p]] += comm[p];
    }
    // The rest of the window, so the three add up to its length (no rounding left over); input
    // wait is a part of idle.
    time.idle_s = std::max(0.0, window.length_s() - time.compute_s - time.exposed_comm_s);
  }
  return out;
}

std::vector<bool> computing_devices(const Trace& trace) {
  std::vector<bool> out(trace.device_names.size(), false);
  for (const Event& e : trace.events) {
    if (partition::is_pass(e.kind) && e.device >= 0 && static_cast<size_t>(e.device) < out.size()) {
      out[static_cast<size_t>(e.device)] = true;
    }
  }
  return out;
}

double mfu(double model_flops, double time_s, double peak_flops_per_s) {
  return time_s > 0 && peak_flops_per_s > 0 ? model_flops / time_s / peak_flops_per_s : 0;
}

}  // namespace hetflow::traces
