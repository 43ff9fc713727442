#pragma once
// Heterogeneity-aware stage partitioning: split an ordered list of layers into contiguous
// stages, one per device group of a pipeline, minimising the slowest stage while every stage
// fits its device group's memory. Exact for contiguous partitions (dynamic programming).
// Costs come from callbacks, so this file knows nothing of clusters or networks.
#include <functional>
#include <optional>
#include <vector>

namespace hetflow::partition {

struct PartitionProblem {
  int layers = 0;  // L layers, indices 0..L-1
  int stages = 0;  // S stages, S <= L
  // Time of stage s (0..S-1) running layers [first, last) — per micro-batch, forward +
  // backward; it may include the stage's outgoing transfer.
  std::function<double(int stage, int first, int last)> stage_time_s;
  // Whether layers [first, last) fit in stage s's memory.
  std::function<bool(int stage, int first, int last)> fits;
};

struct Partition {
  std::vector<int> boundaries;  // S+1 entries: 0 = b0 < b1 < ... < bS = L; stage s = [b_s, b_{s+1})
  double bottleneck_s = 0;      // max over stages of stage_time_s
};

// The contiguous partition with the smallest bottleneck among those where every stage is
// non-empty and fits; ties broken towards the smallest sum of stage times, then the
// lexicographically smallest boundaries (deterministic). nullopt when no partition fits.
std::optional<Partition> partition_min_bottleneck(const PartitionProblem& problem);

}  // namespace hetflow::partition
