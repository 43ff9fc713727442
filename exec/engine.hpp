#pragma once
// The backend-neutral engine: runs a plan's iteration `iterations` times on a back end
// (exec/backend.hpp) and measures every task instance on the wall clock.
//
// What it promises:
//  - Each device stream runs its tasks in program order, iteration after iteration, on its
//    own thread, so the streams of a device overlap. A task starts when the task before it on
//    its stream is done and so are its inputs: the producers of the tensors it reads and its
//    order edges, an edge with offset k tying iteration i to iteration i - k of its source
//    (partition/run_graph.hpp). Threads wait on their device's condition variable; there is
//    no barrier across devices or iterations.
//  - A transient tensor gets a host buffer when its producer starts and loses it when its
//    `free_after` task ends (in the same iteration); persistent tensors (weights, gradients,
//    optimizer state) live for the whole run. Buffers are capped at max_buffer_bytes each, but
//    the accounting uses the plan's bytes: DeviceMemoryUse::peak_transient_bytes is the most
//    transient bytes alive at once on a device, comparable with the plan's memory model
//    (activations_bytes + buffers_bytes of partition::DeviceMemory).
//  - The first failure anywhere (a back end throws, a transient tensor's buffer cannot be
//    allocated, a stream thread cannot start) stops every thread; the result says which task failed and why, and
//    holds the trace of what completed.
//  - A watchdog: when no task instance completes for watchdog_s seconds, the run stops and
//    the result names, per device stream, the task it is at and what it waits for (the
//    unfinished inputs by tensor or order edge, or what the back end said it waits for).
//  - The trace (traces/) has one event per completed task instance, times relative to the
//    run's start; a transfer starts when both of its sides have started, as in the simulator.
//  - Under mpirun (EngineOptions::ranks, several of them): each process runs the streams of
//    its rank's devices (exec/ranks.hpp); the ranks start together, poll one another's
//    progress, so a failure or stall anywhere stops them all and the watchdog counts every
//    rank's progress; at the end rank 0 holds the result of the whole run (trace of every
//    device on rank 0's clock, memory of every device, the error of the lowest rank that
//    failed, or, where none failed, every rank's stall report) and every rank the same
//    completed/error. Other ranks' traces hold their own
//    devices only.
//  - Progress and interruption: while it runs it tells EngineOptions::on_progress where it
//    stands (exec/run_progress.hpp); when EngineOptions::interrupt turns non-zero (a signal,
//    exec/interrupt.hpp) it stops as on a failure, every rank with it, and the result says so
//    and holds the trace of what completed, marked partial.
#include <atomic>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "exec/backend.hpp"
#include "exec/ranks.hpp"
#include "exec/run_progress.hpp"
#include "partition/plan.hpp"
#include "traces/trace.hpp"

namespace hetflow::exec {

// A finished task instance and its buffers, for tests that check what moved.
struct TaskView {
  int task = -1;
  int iteration = 0;
  std::span<const Buffer> reads, writes;
};

struct EngineOptions {
  int iterations = 0;                          // 0: the plan's layout.iterations
  // The number of the run's first iteration: a run that goes on from another in the same
  // process (exec/segmented_run.hpp) numbers its iterations from there, in what the back end
  // sees (TaskContext::iteration), the trace and the messages; the dependencies on
  // iterations before it count as met.
  int first_iteration = 0;
  double watchdog_s = 60;                      // stall limit: no task completed for this long
  double max_buffer_bytes = 4.0 * 1024 * 1024;  // host bytes allocated per tensor at most
  // Called on the task's thread after each task instance, before its tensors may be freed.
  std::function<void(const TaskView&)> on_task_end;
  Ranks* ranks = nullptr;  // null or alone: every device runs in this process
  // Called on the thread that called run_plan, every progress_every_s while the stream
  // threads run (never concurrently with itself; it should return quickly: the watchdog waits).
  std::function<void(const RunProgress&)> on_progress;
  double progress_every_s = 0.1;
  // Non-null: polled with the watchdog (every 50 ms, 10 ms under mpirun); a non-zero value
  // (the signal received: InterruptOnSignal::flag()) stops the run.
  const std::atomic<int>* interrupt = nullptr;
};

struct DeviceMemoryUse {
  double peak_transient_bytes = 0;  // plan bytes of transient tensors alive at once, at most
  double persistent_bytes = 0;      // weights, gradients, optimizer state
  double peak_allocated_bytes = 0;  // host bytes actually allocated at once (capped buffers)
  double peak_model_bytes = 0;      // the model's own arrays at most at once (Backend::model_peak_bytes; 0: unknown)
};

struct RunResult {
  bool completed = false;
  std::string error;                    // when not completed: the failure or the stall report
  bool stalled = false;                 // the watchdog stopped it
  int interrupted = 0;                  // the signal that stopped it (EngineOptions::interrupt), 0: none
  traces::Trace trace;                  // completed task instances (Trace::partial says why a run stopped)
  std::vector<DeviceMemoryUse> memory;  // per device
  double wall_s = 0;
  long long task_instances = 0;         // completed
};

// Runs the plan on the back end. Throws PlanError for a plan it cannot run (before anything
// runs; a folded plan among them); a failure or stall while running is reported in the
// result, not thrown.
RunResult run_plan(const partition::Plan& plan, Backend& backend, const EngineOptions& options);

}  // namespace hetflow::exec
