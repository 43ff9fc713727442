// 1F1B with the backward split into B (input gradient) and W (weight gradient), after Qi et
// al. 2023, "Zero Bubble Pipeline Parallelism". Every rank runs 1F1B's warm-up, then F B W
// in the steady state and B W in the cool-down: a micro-batch is held from its F until its
// W, so the peak in flight stays 1F1B's p - r. The gain: only B sits on the chain of
// gradients from rank to rank, so with equal stages the bubble is (p-1)(T_F + T_B) instead
// of 1F1B's (p-1)(T_F + T_B + T_W). (Deferring all W's to the end is worse: the first rank
// then idles between cool-down B's and runs the W's after the last one.)
#include <algorithm>
#include <string>

#include "model/error.hpp"
#include "partition/schedule.hpp"

namespace hetflow::partition {

RankPrograms build_1f1b_split_w(int p, int m, int v) {
  check_schedule_sizes("1f1b-split-w", p, m, v, false);
  RankPrograms programs(p);
  for (int r = 0; r < p; ++r) {
    std::vector<ScheduledOp>& ops = programs[r];
    ops.reserve(3 * static_cast<std::size_t>(m));
    const int w = std::min(p - r - 1, m);
    for (int i = 0; i < w; ++i) ops.push_back({OpKind::F, i, 0});
    for (int i = 0; i < m - w; ++i) {
      ops.push_back({OpKind::F, w + i, 0});
      ops.push_back({OpKind::B, i, 0});
      ops.push_back({OpKind::W, i, 0});
    }
    for (int i = m - w; i < m; ++i) {
      ops.push_back({OpKind::B, i, 0});
      ops.push_back({OpKind::W, i, 0});
    }
  }
  return programs;
}

}  // namespace hetflow::partition
