#pragma once
// Where a plan has no gradient-norm collective (parameter servers, a CNN's plan, an older
// one), the devices' optimizer steps meet here for the global gradient norm: each adds its
// device's sum of squares for an iteration, and each gets the square root of every part's
// sum, added in device order so that any number of threads or ranks gives the same bits.
//
// Under mpirun a rank's parts meet in the process first; the last of them trades the rank's
// parts for the others' through Ranks::exchange (one exchange a rank at a time: the next
// iteration's waits for this one's). Thread-safe; meet() blocks until every part is in, and
// throws Stopped promptly once `stop` is set.
#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <vector>

#include "exec/backend.hpp"
#include "exec/ranks.hpp"

namespace hetflow::exec {

class GlobalNorm {
 public:
  // `parts`: how many devices add a part each iteration, `parts_here` of them this
  // process's; `ranks` (null: every part is here) and `among`, the ranks holding parts,
  // ascending.
  GlobalNorm(int parts, int parts_here, const Ranks* ranks, std::vector<int> among);

  // Device's part of `task`'s iteration's norm; returns the norm once every part is in.
  double meet(TaskContext& task, const std::atomic<bool>& stop, int device, double sum_of_squares);
  // Iterations whose norm some caller here has yet to read (0 after a run).
  size_t in_flight() const;

 private:
  int parts_ = 0, parts_here_ = 0;
  const Ranks* ranks_ = nullptr;
  std::vector<int> among_;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::map<int, std::map<int, double>> parts_of_;  // per iteration: per device
  std::map<int, int> reads_;                       // per iteration: callers here that have their norm
};

}  // namespace hetflow::exec
