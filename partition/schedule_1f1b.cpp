// 1F1B / PipeDream-flush (Narayanan et al. 2021), Megatron-LM's non-interleaved schedule:
// rank r runs w = min(p - r - 1, m) warm-up forwards, then alternates one forward with one
// backward, then drains the remaining backwards. At most p - r micro-batches are in flight.
#include <algorithm>
#include <string>

#include "model/error.hpp"
#include "partition/schedule.hpp"

namespace hetflow::partition {

RankPrograms build_1f1b(int p, int m, int v) {
  if (p < 1) {
    throw InputError("<command line>", 0, "--pipeline-stages",
                     "expected at least 1 pipeline rank, found " + std::to_string(p));
  }
  if (m < 1) {
    throw InputError("<command line>", 0, "--microbatches",
                     "expected at least 1 micro-batch, found " + std::to_string(m));
  }
  if (v != 1) {
    throw InputError("<command line>", 0, "--virtual-stages",
                     "schedule 1f1b expects 1 chunk per rank, found " + std::to_string(v));
  }
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
