// 1F1B / PipeDream-flush (Narayanan et al. 2021), Megatron-LM's non-interleaved schedule:
// rank r runs w = min(p - r - 1, m) warm-up forwards, then alternates one forward with one
// backward, then drains the remaining backwards. At most p - r micro-batches are in flight.
#include <algorithm>
#include <string>

#include "model/error.hpp"
#include "partition/schedule.hpp"

namespace hetflow::partition {

RankPrograms build_1f1b(int p, int m, int v) {
  check_schedule_sizes("1f1b", p, m, v, false);
  RankPrograms programs(p);
  for (int r = 0; r < p; ++r) {
    std::vector<ScheduledOp>& ops = programs[r];
    ops.reserve(2 * static_cast<std::size_t>(m));
    const int w = std::min(p - r - 1, m);
    for (int i = 0; i < w; ++i) ops.push_back({OpKind::F, i, 0});
    for (int i = 0; i < m - w; ++i) {
      ops.push_back({OpKind::F, w + i, 0});
      ops.push_back({OpKind::B, i, 0});
    }
    for (int i = m - w; i < m; ++i) ops.push_back({OpKind::B, i, 0});
  }
  return programs;
}

}  // namespace hetflow::partition
