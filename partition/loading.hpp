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

// What the loaders bring in one iteration, from the layout (so that a folded plan's replicas
// count too): each virtual worker's samples, loaded where its first device is.
struct LoaderDemand {
  double sample_bytes = 0;           // the network's stored bytes per sample
  double total_bytes = 0;            // all nodes
  std::vector<double> node_bytes;    // by node index
  std::vector<double> worker_bytes;  // by virtual worker (0: it loads nothing)
  std::vector<int> node_of_device;   // by device
};
LoaderDemand loader_demand(const model::Cluster& cluster, const model::Network& network, const Layout& layout);

// How long one load task lasts in the steady state, every loader busy: its bytes and samples
// at its worker's share of each resource (the file system's among all workers' demand, its
// node's read bandwidth and loader workers among that node's), the slowest of the three. The
// shares are in proportion to each worker's demand, so a worker's loads of one iteration add
// up to the loader's closed form for the whole of it (loader_bound's iteration_s where its
// node is the most loaded). The overload without a demand computes one.
double load_time_s(const Plan& plan, const LoaderDemand& demand, const Task& load);
double load_time_s(const Plan& plan, const Task& load);

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
// The same for a layout not yet built: bounded where the cluster has an input path.
LoaderBound loader_bound(const model::Cluster& cluster, const model::Network& network, const Layout& layout);

// In a folded plan (worker 0 alone has tasks), how many workers' loads each of worker 0's
// stands for: over the shared file system (all workers over worker 0) and on each node
// (workers whose first device is there over worker 0's); 1 where the plan is not folded.
struct LoadShares {
  double all = 1;
  std::vector<double> per_node;  // by node index; missing nodes: 1
};
LoadShares load_shares(const Plan& plan);

// Input wait, one definition for the estimate and for traces (traces/figures.hpp): before a
// forward that a load feeds, its device waits for the input from the later of the load's
// start and the end of the task before the forward on its stream, to the earlier of the
// load's end and the forward's start. Empty (to_s <= from_s) when the load was in time.
struct InputWaitSpan {
  double from_s = 0, to_s = 0;
  double length_s() const { return to_s > from_s ? to_s - from_s : 0; }
};
InputWaitSpan input_wait_span(double load_start_s, double load_end_s, double before_end_s, double forward_start_s);

}  // namespace hetflow::partition
