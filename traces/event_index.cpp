#include "traces/event_index.hpp"

#include <algorithm>

namespace hetflow::traces {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<long>(mid), v.end());
  const double upper = v[mid];
  if (v.size() % 2 == 1) return upper;
  return (*std::max_element(v.begin(), v.begin() + static_cast<long>(mid)) + upper) / 2;
}

EventIndex::EventIndex(const Trace& trace, const partition::Plan& plan) : tasks_(plan.tasks.size()) {
  for (const Event& e : trace.events) iterations_ = std::max(iterations_, e.iteration + 1);
  at_.assign(tasks_ * static_cast<size_t>(iterations_), -1);
  for (size_t i = 0; i < trace.events.size(); ++i) {
    const Event& e = trace.events[i];
    if (e.task < 0 || static_cast<size_t>(e.task) >= tasks_ || e.iteration < 0) continue;
    at_[static_cast<size_t>(e.iteration) * tasks_ + static_cast<size_t>(e.task)] = static_cast<int>(i);
  }
}

int EventIndex::operator()(int task, int iteration) const {
  if (iteration < 0 || iteration >= iterations_ || task < 0 || static_cast<size_t>(task) >= tasks_) return -1;
  return at_[static_cast<size_t>(iteration) * tasks_ + static_cast<size_t>(task)];
}

std::vector<double> EventIndex::durations_s(const Trace& trace, int task) const {
  std::vector<double> durations;
  for (int i = first_measured(); i < iterations_; ++i) {
    const int at = (*this)(task, i);
    if (at >= 0) durations.push_back(trace.events[static_cast<size_t>(at)].end_s - trace.events[static_cast<size_t>(at)].start_s);
  }
  return durations;
}

}  // namespace hetflow::traces
