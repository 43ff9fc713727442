// GPipe (Huang et al. 2019): every rank runs all forwards, then all backwards.
#include <string>

#include "model/error.hpp"
#include "partition/schedule.hpp"

namespace hetflow::partition {

RankPrograms build_gpipe(int p, int m, int v) {
  check_schedule_sizes("gpipe", p, m, v, false);
  RankPrograms programs(p);
  for (std::vector<ScheduledOp>& ops : programs) {
    ops.reserve(2 * static_cast<std::size_t>(m));
    for (int i = 0; i < m; ++i) ops.push_back({OpKind::F, i, 0});
    for (int i = 0; i < m; ++i) ops.push_back({OpKind::B, i, 0});
  }
  return programs;
}

}  // namespace hetflow::partition
