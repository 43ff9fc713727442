#pragma once
// What a back end gives the engine (exec/engine.hpp): the way one task instance runs on one
// device. The engine decides when a task runs (program order, dependencies), owns the
// tensors' host buffers and the timing; a back end only executes: compute, transfers on the
// plan's channels (the k-th send on a channel meets its k-th receive), collectives as
// partition/collective_steps.hpp's point-to-point steps on the plan's communicators.
//
// Promises a back end keeps: run() is called concurrently from several threads (one per
// device stream), returns when the task is done, throws hetflow::Error (or any exception)
// when it fails, and returns promptly by throwing Stopped once stop() has been called.
#include <cstddef>
#include <optional>
#include <span>
#include <string>

#include "model/error.hpp"
#include "partition/plan.hpp"
#include "traces/message_times.hpp"

namespace hetflow::exec {

// A tensor's host memory, as the engine hands it to a back end. size_bytes may be less than
// the tensor's bytes (EngineOptions::max_buffer_bytes caps what is allocated).
struct Buffer {
  std::byte* data = nullptr;
  size_t size_bytes = 0;
};

// Thrown by a back end's run() after stop(): the run is ending, not failing.
class Stopped : public Error {
 public:
  Stopped() : Error("stopped") {}
};

// One task instance as the back end sees it.
class TaskContext {
 public:
  virtual ~TaskContext() = default;
  int task = -1;
  int iteration = 0;
  const partition::Task* spec = nullptr;
  std::span<Buffer> reads;   // the plan's reads, in order (persistent tensors included)
  std::span<Buffer> writes;  // its writes, allocated by the engine before run()
  // What a transfer or collective task carried, in the plan's bytes (elements moved times the
  // plan's element size, whatever the back end's wire type): the back end sets it and the
  // trace records it, so a trace shows what ran, not what was planned. -1: not reported (the
  // trace then says the plan's bytes).
  double carried_bytes = -1;
  // Where the times of the task's in-task messages (Plan::inside(task)) go: the engine's.
  std::span<traces::MessageTimes::Span> messages;
  // The back end performed the task's next in-task message (they run in the plan's order)
  // from start_s to end_s on now_s()'s clock, carrying `bytes` (as carried_bytes
  // below; -1: the plan's): the trace records it within the task's event. `overlap_s`: of a
  // message beside the work (Collective::until), how long from its start the work went on.
  void message_ran(double start_s, double end_s, double bytes = -1, double overlap_s = 0) {
    if (next_message_ < messages.size()) messages[next_message_++] = {start_s, end_s, bytes, overlap_s};
  }
  // What the task is blocked on ("the 2nd message on channel 3 from device 0"): the
  // watchdog names it when the run stalls.
  virtual void waiting_for(std::string what) = 0;
  // The run's clock: seconds since it began, as the trace's times.
  virtual double now_s() const = 0;

 private:
  size_t next_message_ = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;     // "cpu": traces say exec-<name>
  virtual std::string compute() const = 0;  // "proxy" or "real" (traces::Trace::compute)
  // Once, before any run(), from the thread that runs the plan. Throws PlanError for what it
  // cannot run.
  virtual void prepare(const partition::Plan& plan) = 0;
  // Host bytes the engine allocates for a tensor; nullopt: the engine's default (the plan's
  // bytes, capped by EngineOptions::max_buffer_bytes). A back end running real math sizes
  // what it exchanges exactly. Called after prepare().
  virtual std::optional<size_t> buffer_bytes(int /*tensor*/) const { return std::nullopt; }
  // The most bytes the model's own arrays held at once on a device of this process since
  // prepare() (real math: parameters, gradients, optimizer state, activations kept for the
  // backward, temporaries); nullopt where the back end does not know. Called after the run.
  virtual std::optional<double> model_peak_bytes(int /*device*/) const { return std::nullopt; }
  virtual void run(TaskContext& task) = 0;
  // From any thread: every run() in progress or to come throws Stopped promptly.
  virtual void stop() = 0;
};

}  // namespace hetflow::exec
