#pragma once
// When the messages of in-task collectives (partition::Plan::inside) ran, for every task
// instance of a run: what the simulator and the executor record while a compute task runs,
// and the trace events they make (in_task_event), one per message, within its task's.
#include <cstddef>
#include <span>
#include <vector>

#include "partition/plan.hpp"
#include "traces/trace.hpp"

namespace hetflow::traces {

class MessageTimes {
 public:
  // One message's times on the run's clock (start_s < 0 until it is recorded), and the bytes
  // it carried where its back end says (-1: the plan's, Collective::bytes / messages).
  struct Span {
    double start_s = -1;
    double end_s = -1;
    double bytes = -1;
    double overlap_s = 0;  // Event::overlap_s
  };

  MessageTimes() = default;
  // Room for every message of `iterations` iterations of the plan's tasks (after finish()).
  MessageTimes(const partition::Plan& plan, int iterations);

  // The messages of task's instance in `iteration`, in the order of plan.inside(task).
  std::span<Span> of(int task, int iteration);
  std::span<const Span> of(int task, int iteration) const;
  // Appends an event for each recorded message of the instance.
  void append_events(const partition::Plan& plan, int task, int iteration, std::vector<Event>& out) const;
  // Message instances in all (events, once every one is recorded).
  size_t size() const { return spans_.size(); }

 private:
  std::vector<size_t> begin_;  // per task: its first message's place in an iteration's
  size_t per_iteration_ = 0;
  std::vector<Span> spans_;    // iteration * per_iteration_ + begin_[task] + k
};

}  // namespace hetflow::traces
