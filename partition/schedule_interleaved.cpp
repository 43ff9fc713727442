// Megatron-LM's interleaved 1F1B (Narayanan et al., SC'21), following
// forward_backward_pipelining_with_interleaving in megatron/core/pipeline_parallel/schedules.py.
// Rank r holds v model chunks; chunk c is virtual stage c * p + r. The m * v "virtual
// micro-batches" k are walked in groups of p * v: within a group, p consecutive k run the same
// chunk (ascending for forwards, descending for backwards) on p consecutive micro-batches.
#include <algorithm>
#include <string>

#include "model/error.hpp"
#include "partition/layout.hpp"
#include "partition/schedule.hpp"

namespace hetflow::partition {

RankPrograms build_interleaved(int p, int m, int v) {
  check_schedule_sizes("interleaved", p, m, v, true);
  if (m % p != 0) {
    throw InputError(kOptions, 0, "microbatches",
                     "schedule interleaved expects a multiple of the " + std::to_string(p) +
                         " pipeline ranks, found " + std::to_string(m));
  }
  const int total = m * v;
  const int group = p * v;
  const auto microbatch = [&](int k) { return (k / group) * p + k % p; };
  const auto forward = [&](int k) {
    return ScheduledOp{OpKind::F, microbatch(k), (k % group) / p};
  };
  const auto backward = [&](int k) {
    return ScheduledOp{OpKind::B, microbatch(k), v - 1 - (k % group) / p};
  };

  RankPrograms programs(p);
  for (int r = 0; r < p; ++r) {
    std::vector<ScheduledOp>& ops = programs[r];
    ops.reserve(2 * static_cast<std::size_t>(total));
    const int w = (m == p) ? total : std::min((p - r - 1) * 2 + (v - 1) * p, total);
    for (int k = 0; k < w; ++k) ops.push_back(forward(k));
    for (int i = 0; i < total - w; ++i) {
      ops.push_back(forward(w + i));
      ops.push_back(backward(i));
    }
    for (int k = total - w; k < total; ++k) ops.push_back(backward(k));
  }
  return programs;
}

}  // namespace hetflow::partition
