#pragma once
// Looking up a trace's events by (task, iteration), a task's own time without its in-task
// messages, and medians: what calibration, the attribution of durations to layers and
// replay share.
#include <vector>

#include "partition/plan.hpp"
#include "traces/trace.hpp"

namespace hetflow::traces {

// The median of v (the mean of the middle two for an even count); 0 for none.
double median(std::vector<double> v);

// (task, iteration) -> the index of its event (not its in-task messages').
class EventIndex {
 public:
  EventIndex(const Trace& trace, const partition::Plan& plan);
  // -1 where the trace has no such event.
  int operator()(int task, int iteration) const;
  // The task instance's own time: its event's length less its in-task messages' (of one beside
  // the work, Event::overlap_s, what the work waited for); 0 where the trace has no such event.
  double own_s(const Trace& trace, int task, int iteration) const;
  // The event of in-task message k of the instance (plan.inside(task)[k]); -1 where none.
  int message(int task, int iteration, int k) const;
  int iterations() const { return iterations_; }
  // The first iteration of steady-state figures: 1 when there are several (0 warms up).
  int first_measured() const { return iterations_ > 1 ? 1 : 0; }
  // A task's own times (own_s) over the iterations from first_measured(); empty where none ran.
  std::vector<double> durations_s(const Trace& trace, int task) const;

 private:
  size_t tasks_ = 0;
  int iterations_ = 0;
  std::vector<int> at_;          // iteration * tasks + task
  std::vector<double> inside_s_;  // the same: what its in-task messages held its work
  std::vector<size_t> message_begin_;  // per task: its messages' place in an iteration's
  std::vector<int> message_at_;        // iteration * message_begin_.back() + message_begin_[task] + k
};

}  // namespace hetflow::traces
