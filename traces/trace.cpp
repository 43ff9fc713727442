#include "traces/trace.hpp"

#include <algorithm>
#include <tuple>

namespace hetflow::traces {

void sort_events(Trace& trace) {
  // Stable, so events equal on every key (a zero-length pair, say) keep their given order.
  std::stable_sort(trace.events.begin(), trace.events.end(), [](const Event& a, const Event& b) {
    return std::tie(a.start_s, a.device, a.stream, a.task, a.kind, a.message) <
           std::tie(b.start_s, b.device, b.stream, b.task, b.kind, b.message);
  });
}

}  // namespace hetflow::traces
