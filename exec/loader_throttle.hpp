#pragma once
// A slowed-down data loader, for runs that test what an input-bound plan does: each node's
// loader spends `s_per_sample` seconds on every sample its load tasks bring, one sample
// after another (the node's loads take turns, in the order they ask). So a node delivers at
// most 1 / s_per_sample samples per second, which is partition::loader_bound's
// "preprocessing" limit for a cluster whose input path has preprocess_s_per_sample =
// s_per_sample and one loader worker per node (and no read limit).
//
// The node's loader keeps its own clock: a load asks for its samples' time after the loads
// before it, not after its own thread woke up, so a late wake-up delays the forward that
// waits for it but not the loads behind it. Under mpirun the processes cannot take turns on
// one clock: a node whose loads are split over k processes gets a clock in each, every sample
// costing k x s_per_sample there, so the node still delivers 1 / s_per_sample samples per
// second where its loads are spread evenly over those processes (as the ranks' blocks of
// devices spread a symmetric plan's), and less where they are not.
#include <atomic>
#include <mutex>
#include <set>
#include <vector>

#include "exec/backend.hpp"
#include "exec/ranks.hpp"
#include "partition/plan.hpp"

namespace hetflow::exec {

class LoaderThrottle {
 public:
  // Throws InputError (field "loader_throttle_s_per_sample") for a value that is not finite
  // and >= 0; 0 throttles nothing.
  explicit LoaderThrottle(double s_per_sample = 0);
  double s_per_sample() const { return s_per_sample_; }
  // Before a run: every node's loader is free from the run's start. `ranks` (null or alone:
  // every device is in this process) says which processes share a node's loads.
  void prepare(const partition::Plan& plan, const Ranks* ranks = nullptr);
  // The load task's share of its node's loader: returns when the node has spent its samples'
  // time on it (on task.now_s()'s clock), waiting in sleeps of at most 0.5 ms; throws
  // Stopped once `stop` is set. Safe to call from several threads.
  void wait(TaskContext& task, const std::atomic<bool>& stop);

 private:
  double s_per_sample_ = 0;
  const partition::Plan* plan_ = nullptr;
  std::vector<int> node_of_;  // per device
  std::mutex mutex_;           // free_at_s_
  std::vector<double> free_at_s_;  // per node: when its loader has finished the loads given to it
  std::vector<int> processes_;     // per node: the processes its load tasks run in (at least 1)
};

}  // namespace hetflow::exec
