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
  inside_s_.assign(at_.size(), 0);
  message_begin_.assign(tasks_ + 1, 0);
  for (size_t t = 0; t < tasks_; ++t) message_begin_[t + 1] = message_begin_[t] + plan.inside(static_cast<int>(t)).size();
  message_at_.assign(message_begin_.back() * static_cast<size_t>(iterations_), -1);
  for (size_t i = 0; i < trace.events.size(); ++i) {
    const Event& e = trace.events[i];
    if (e.task < 0 || static_cast<size_t>(e.task) >= tasks_ || e.iteration < 0) continue;
    const size_t at = static_cast<size_t>(e.iteration) * tasks_ + static_cast<size_t>(e.task);
    if (e.message >= 0) {
      inside_s_[at] += e.end_s - e.start_s - e.overlap_s;  // (beside the work: what the work waited for)
      const auto task = static_cast<size_t>(e.task);
      if (static_cast<size_t>(e.message) < message_begin_[task + 1] - message_begin_[task]) {
        message_at_[static_cast<size_t>(e.iteration) * message_begin_.back() + message_begin_[task] +
                    static_cast<size_t>(e.message)] = static_cast<int>(i);
      }
    } else {
      at_[at] = static_cast<int>(i);
    }
  }
}

int EventIndex::message(int task, int iteration, int k) const {
  if (iteration < 0 || iteration >= iterations_ || task < 0 || static_cast<size_t>(task) >= tasks_) return -1;
  const auto t = static_cast<size_t>(task);
  if (k < 0 || static_cast<size_t>(k) >= message_begin_[t + 1] - message_begin_[t]) return -1;
  return message_at_[static_cast<size_t>(iteration) * message_begin_.back() + message_begin_[t] + static_cast<size_t>(k)];
}

double EventIndex::own_s(const Trace& trace, int task, int iteration) const {
  const int at = (*this)(task, iteration);
  if (at < 0) return 0;
  const Event& e = trace.events[static_cast<size_t>(at)];
  const double inside = inside_s_[static_cast<size_t>(iteration) * tasks_ + static_cast<size_t>(task)];
  return std::max(0.0, e.end_s - e.start_s - inside);
}

int EventIndex::operator()(int task, int iteration) const {
  if (iteration < 0 || iteration >= iterations_ || task < 0 || static_cast<size_t>(task) >= tasks_) return -1;
  return at_[static_cast<size_t>(iteration) * tasks_ + static_cast<size_t>(task)];
}

std::vector<double> EventIndex::durations_s(const Trace& trace, int task) const {
  std::vector<double> durations;
  for (int i = first_measured(); i < iterations_; ++i) {
    const int at = (*this)(task, i);
    if (at >= 0) durations.push_back(own_s(trace, task, i));
  }
  return durations;
}

}  // namespace hetflow::traces
