#include "traces/message_times.hpp"

#include <algorithm>

#include "traces/task_event.hpp"

namespace hetflow::traces {

MessageTimes::MessageTimes(const partition::Plan& plan, int iterations) : begin_(plan.tasks.size() + 1, 0) {
  for (size_t t = 0; t < plan.tasks.size(); ++t) begin_[t + 1] = begin_[t] + plan.inside(static_cast<int>(t)).size();
  per_iteration_ = begin_.back();
  spans_.assign(per_iteration_ * static_cast<size_t>(iterations > 0 ? iterations : 0), Span{});
}

std::span<MessageTimes::Span> MessageTimes::of(int task, int iteration) {
  const auto t = static_cast<size_t>(task);
  return {spans_.data() + static_cast<size_t>(iteration) * per_iteration_ + begin_[t], begin_[t + 1] - begin_[t]};
}

std::span<const MessageTimes::Span> MessageTimes::of(int task, int iteration) const {
  const auto t = static_cast<size_t>(task);
  return {spans_.data() + static_cast<size_t>(iteration) * per_iteration_ + begin_[t], begin_[t + 1] - begin_[t]};
}

void MessageTimes::append_events(const partition::Plan& plan, int task, int iteration, std::vector<Event>& out) const {
  const std::span<const Span> spans = of(task, iteration);
  for (size_t k = 0; k < spans.size(); ++k) {
    if (spans[k].start_s < 0) continue;
    Event e = in_task_event(plan, task, iteration, static_cast<int>(k));
    e.start_s = spans[k].start_s;
    e.end_s = std::max(spans[k].end_s, spans[k].start_s);
    if (spans[k].bytes >= 0) e.bytes = spans[k].bytes;
    e.overlap_s = std::clamp(spans[k].overlap_s, 0.0, e.end_s - e.start_s);
    out.push_back(std::move(e));
  }
}

}  // namespace hetflow::traces
