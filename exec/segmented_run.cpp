#include "exec/segmented_run.hpp"

#include <algorithm>
#include <chrono>
#include <string>
#include <utility>

#include "exec/interrupt.hpp"
#include "model/error.hpp"

namespace hetflow::exec {

namespace {

// `segment` appended to `run`, its times shifted by `offset_s` (where the run's last segment ended).
void append(RunResult& run, RunResult segment, double offset_s) {
  for (traces::Event& e : segment.trace.events) {
    e.start_s += offset_s;
    e.end_s += offset_s;
    run.trace.events.push_back(std::move(e));
  }
  if (run.memory.size() < segment.memory.size()) run.memory.resize(segment.memory.size());
  for (size_t d = 0; d < segment.memory.size(); ++d) {
    DeviceMemoryUse& m = run.memory[d];
    const DeviceMemoryUse& s = segment.memory[d];
    m.peak_transient_bytes = std::max(m.peak_transient_bytes, s.peak_transient_bytes);
    m.persistent_bytes = std::max(m.persistent_bytes, s.persistent_bytes);
    m.peak_allocated_bytes = std::max(m.peak_allocated_bytes, s.peak_allocated_bytes);
    m.peak_model_bytes = std::max(m.peak_model_bytes, s.peak_model_bytes);
  }
  run.wall_s += segment.wall_s;
  run.task_instances += segment.task_instances;
  run.completed = segment.completed;
  run.error = std::move(segment.error);
  run.stalled = segment.stalled;
  run.interrupted = segment.interrupted;
  run.trace.partial = std::move(segment.trace.partial);
}

// The signal received (0: none), the same on every rank: the first rank's that has one.
int agreed_signal(const EngineOptions& options) {
  const int mine = options.interrupt != nullptr ? options.interrupt->load() : 0;
  if (options.ranks == nullptr || options.ranks->alone()) return mine;
  std::vector<std::byte> bytes;
  put(bytes, mine);
  int first = 0;
  for (const std::vector<std::byte>& theirs : options.ranks->gather(bytes)) {  // (empty but at rank 0)
    ByteReader in(theirs);
    const int sig = in.get<int>();
    if (first == 0) first = sig;
  }
  std::vector<std::byte> verdict;
  put(verdict, first);
  const std::vector<std::byte> agreed = options.ranks->broadcast(verdict);
  ByteReader in(agreed);
  return in.get<int>();
}

}  // namespace

SegmentedResult run_in_segments(const partition::Plan& plan, Backend& backend, const EngineOptions& options,
                                const std::vector<int>& cuts, const std::function<void(int iterations_done)>& between) {
  const int total = options.iterations > 0 ? options.iterations : plan.iterations();
  std::vector<int> ends;
  for (size_t k = 0; k < cuts.size(); ++k) {
    if (k > 0 && cuts[k] <= cuts[k - 1]) {
      throw InputError("<options>", 0, "cuts", "expected ascending iteration counts, got " + std::to_string(cuts[k]) +
                                                    " after " + std::to_string(cuts[k - 1]));
    }
    if (cuts[k] > 0 && cuts[k] < total) ends.push_back(cuts[k]);
  }
  ends.push_back(total);

  SegmentedResult out;
  RunResult& run = out.run;
  int done = 0;
  long long completed_before = 0;
  double elapsed_before_s = 0;  // the segments' and the pauses' wall time
  for (const int end : ends) {
    // A signal that came while `between` ran (a checkpoint being written) stops the run
    // here, before the next segment starts.
    const int sig = done > 0 ? agreed_signal(options) : 0;
    if (sig != 0) {
      run.completed = false;
      run.interrupted = sig;
      run.error = "interrupted by " + signal_name(sig) + " after step " + std::to_string(options.first_iteration + done);
      run.trace.partial = run.error;
      break;
    }
    EngineOptions segment = options;
    segment.iterations = std::max(1, end - done);
    segment.first_iteration = options.first_iteration + done;
    if (options.on_progress) {
      segment.on_progress = [&, done](RunProgress p) {
        p.iteration += done;
        p.iterations = total;
        p.completed += completed_before;
        p.elapsed_s += elapsed_before_s;
        options.on_progress(p);
      };
    }
    RunResult r = run_plan(plan, backend, segment);
    if (done == 0) {  // the trace's header: what ran, where
      std::vector<traces::Event> events = std::move(r.trace.events);
      run.trace = r.trace;
      r.trace.events = std::move(events);
    }
    const double offset_s = run.wall_s;
    completed_before += r.task_instances;
    elapsed_before_s += r.wall_s;
    append(run, std::move(r), offset_s);
    done = end;
    if (!run.completed || end == total) break;
    const auto start = std::chrono::steady_clock::now();
    between(done);
    const double pause_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    out.pauses.push_back({done, pause_s});
    elapsed_before_s += pause_s;
  }
  if (!run.completed) run.trace.planned_iterations = options.first_iteration + total;
  traces::sort_events(run.trace);
  return out;
}

}  // namespace hetflow::exec
