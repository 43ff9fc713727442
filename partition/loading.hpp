#pragma once
// Data loading as plan tasks. Where the cluster gives an input path (model::InputPath), each
// virtual worker's first device (tensor rank 0 of its first chunk) gets a `load` task per
// micro-batch, on a stream of its own ("load"): its host's loader reads the micro-batch's
// samples from storage and preprocesses them, and that device's forward waits for it (the
// other tensor ranks get the batch inside the forward's collectives, as Megatron broadcasts
// it from rank 0). Prefetch depth k lets the loader run k micro-batches ahead: load m waits
// for the forward of micro-batch m - k (of an earlier iteration when m < k: an order edge
// with an iteration offset). Every edge stays on one device, as the back ends require.
//
// The loads of a node share its read bandwidth and its loader workers, and all loads share
// the file system; a load lasts as long as its slowest part, as the parts overlap across
// micro-batches (workers prefetch), so in the steady state a loader delivers at the rate of
// its slowest resource. The host-to-device copy is not timed: at PCIe rates it is far from
// the bottleneck.
#include <vector>

#include "partition/plan.hpp"

namespace hetflow::partition {

// Adds the load tasks and their order edges to a plan whose compute tasks are made and whose
// graph is not yet finished; nothing when the cluster has no input path.
void add_loading(Plan& plan);

// The samples a load task brings: its bytes over the network's bytes per sample.
double load_samples(const Plan& plan, const Task& load);

// The loader's side of one iteration, in closed form: each node loads its samples; the
// shared file system serves all of them, each node reads and preprocesses its own.
struct LoaderBound {
  bool bounded = false;           // the plan has load tasks
  double samples = 0;             // samples loaded per iteration, all nodes
  double iteration_s = 0;         // the shortest iteration the loader allows
  double samples_per_s = 0;       // samples / iteration_s (0 when not bounded)
  const char* limit = "";         // "shared file system", "node read", "preprocessing"
};
LoaderBound loader_bound(const Plan& plan);

// In a folded plan (worker 0 alone has tasks), how many workers' loads each of worker 0's
// stands for: over the shared file system (all workers over worker 0) and on each node
// (workers whose first device is there over worker 0's); 1 where the plan is not folded.
struct LoadShares {
  double all = 1;
  std::vector<double> per_node;  // by node index; missing nodes: 1
};
LoadShares load_shares(const Plan& plan);

}  // namespace hetflow::partition
