// Breadth-first pipeline parallelism, looped (Lamy-Poirier 2022, arXiv:2211.05953), in the
// order PyTorch's ScheduleLoopedBFS (torch.distributed.pipelining) runs it. Rank r holds v
// chunks, chunk c being virtual stage c * p + r as in Megatron's interleaving. It runs every
// micro-batch's forward through its first chunk, then through its second, and so on; then the
// backwards chunk by chunk in reverse, the micro-batches of each in reverse. Where depth-first
// interleaving (schedule interleaved) finishes one micro-batch early to free its activations,
// breadth-first keeps them all (GPipe's memory) so that each chunk's passes run back to back:
// fewer, longer bursts of work between transfers, and no need for m to be a multiple of p.
// With v = 1 it is GPipe with the backwards in reverse micro-batch order.
#include <string>

#include "partition/schedule.hpp"

namespace hetflow::partition {

RankPrograms build_bfs(int p, int m, int v) {
  check_schedule_sizes("bfs", p, m, v, true, 1);
  RankPrograms programs(p);
  for (std::vector<ScheduledOp>& ops : programs) {
    ops.reserve(2 * static_cast<std::size_t>(m) * static_cast<std::size_t>(v));
    for (int c = 0; c < v; ++c) {
      for (int i = 0; i < m; ++i) ops.push_back({OpKind::F, i, c});
    }
    for (int c = v - 1; c >= 0; --c) {
      for (int i = m - 1; i >= 0; --i) ops.push_back({OpKind::B, i, c});
    }
  }
  return programs;
}

}  // namespace hetflow::partition
