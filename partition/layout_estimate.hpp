#pragma once
// The analytic estimate of a layout without building its plan: what the search scores every
// candidate with before it builds the most promising ones.
//
// It runs what the plan would hold at the granularity of pipeline operations rather than
// tasks: each rank's schedule order of F, B and W, each costed as the builder's tasks are
// (the cost model's compute time of the chunk's slowest device plus the tensor-parallel
// collectives the builder puts around it), activations and gradients between chunks as
// transfers that queue on their channel, then the data-parallel all-reduce of each gradient
// segment in the builder's order, tied embeddings, the optimizer, or the parameter servers'
// pushes, updates and pulls; under activation offload each stash's copy out after its
// forward and back before its backward on the rank's copy streams (the prefetch gated as the
// builder gates it); under ZeRO (Layout::sync.zero) the reduce-scatters and
// all-gathers each stage adds (partition/layout_estimate_zero.hpp): stage 3's before every
// pass on the gather stream, prefetched one ahead, with the replicas' pipelines run together
// since each all-gather spans them. Over the layout's iterations, each stream and channel carrying
// on from where the last iteration left it, and under WSP each chunk's first forward waiting
// for its pull D + 1 iterations back; the steady state as estimate_plan takes it.
//
// Communication that runs at once shares the links it crosses, as in the simulation
// (partition/link_sharing.hpp): the same tensor-parallel collective or boundary transfer of
// every data-parallel replica (a ring's edges and every tensor rank's slice at once), the
// data-parallel pieces of one segment, the pushes of one chunk of every replica, one
// server's pulls. Without that (LayoutEstimateOptions::shared_links false) every transfer
// and collective has its routes to itself: the model of estimate_plan of the built plan,
// with the differences listed in layout_estimate.cpp (none of which acts where a tensor
// group is one GPU type), so the two agree: to rounding on every layout
// tests/partition/layout_estimate_test.cpp compares. At a small part of the cost: no tensors,
// names or streams, and one value per rank of a tensor group.
//
// Data loading (a cluster with an input path) is a floor, not part of the critical path: the
// iteration time is at least the loader's closed form for the iteration's samples
// (partition/loading.hpp, loader_bound), so the search ranks an input-bound layout by what it
// will do; the plan's estimate times each load task instead, and agrees in the steady state.
//
// Memory is a lower bound of the plan's lifetime peak on every device: its persistent state
// exactly (partition/memory.hpp's closed form; ZeRO's shards as the plan's whole elements),
// ZeRO-3's gathered copy of the pass at the peak, the workspace, and each rank's stashes at
// their peak over its own program (offloaded, a pass's own: the plan adds up to two more in
// a copy), with full recomputation's one-layer scratch during a backward. It leaves out what the plan adds around them (boundary activations waiting to be
// sent or consumed, their gradients, partial sums, pushed gradients on servers), so a layout
// it says overflows overflows in the plan too: the search screens by it without building.
#include <string>
#include <vector>

#include "model/network.hpp"
#include "partition/cost_model.hpp"
#include "partition/layout.hpp"

namespace hetflow::partition {

struct LayoutEstimate {
  double iteration_time_s = 0;  // one iteration's makespan; over several, the steady state; at least the loader's
  double bubble_fraction = 0;   // BubbleMeter's definition, over the pipeline operations
  std::vector<double> busy_s;   // per device and iteration: compute, tensor-parallel collectives and optimizer
  double headroom_bytes = 0;    // the least free memory of any device that runs a task (a bound: above)
  int tightest_device = -1;     // that device
  // Activation offload: the same with two more of each device's largest stashes in a copy,
  // the most the plan adds to the bound (headroom_bytes otherwise): what the search screens
  // offloaded layouts with, since the bound alone would pass layouts whose plans overflow.
  double headroom_with_copies_bytes = 0;
  // Without activation offload: headroom_with_copies_bytes were this layout's stashes
  // offloaded, its cuts kept. The search lays a placement out again with its stashes
  // offloaded only where this is not negative.
  double headroom_stashes_offloaded_bytes = 0;
  // Offload: the least free host memory of any node, its devices' host state and stashes at
  // their closed forms (partition/memory.hpp) against model::NodeHost::memory_bytes; infinite
  // without offload. Negative: validation would refuse the plan.
  double host_headroom_bytes = 0;
  int slowest_device = -1;      // the busiest device
};

struct LayoutEstimateOptions {
  // Concurrent flows share the links they cross (partition/link_sharing.hpp), as in the
  // simulation; false: every transfer and collective alone on its routes, the model of
  // estimate_plan (partition/estimate.hpp), which it then equals.
  bool shared_links = true;
  // An all-reduce layout whose memory bound overflows (or, offloading stashes, its headroom
  // with their copies) is not timed (iteration time infinite): its memory is all the search's
  // trial of ZeRO shardings needs of it.
  bool time_only_what_fits = false;
};

// Throws hetflow::Error where the layout does not fit the network or its schedule (what
// build_plan would refuse for the same reasons).
LayoutEstimate estimate_layout(const model::Network& network, const Layout& layout, const CostModel& cost,
                               const LayoutEstimateOptions& options = {});

}  // namespace hetflow::partition
