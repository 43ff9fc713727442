#pragma once
// Looking up a trace's events by (task, iteration), and medians: what calibration and the
// attribution of durations to layers share (traces/ only).
#include <vector>

#include "partition/plan.hpp"
#include "traces/trace.hpp"

namespace hetflow::traces {

// The median of v (the mean of the middle two for an even count); 0 for none.
double median(std::vector<double> v);

// (task, iteration) -> event index.
class EventIndex {
 public:
  EventIndex(const Trace& trace, const partition::Plan& plan);
  // -1 where the trace has no such event.
  int operator()(int task, int iteration) const;
  int iterations() const { return iterations_; }
  // The first iteration of steady-state figures: 1 when there are several (0 warms up).
  int first_measured() const { return iterations_ > 1 ? 1 : 0; }
  // A task's durations over the iterations from first_measured(); empty where none ran.
  std::vector<double> durations_s(const Trace& trace, int task) const;

 private:
  size_t tasks_ = 0;
  int iterations_ = 0;
  std::vector<int> at_;  // iteration * tasks + task
};

}  // namespace hetflow::traces
