#pragma once
// Turns a layout into a plan: the task graph, program orders and per-device memory.
#include "model/cluster.hpp"
#include "model/network.hpp"
#include "partition/cost_model.hpp"
#include "partition/layout.hpp"
#include "partition/plan.hpp"

namespace hetflow::partition {

// Builds every iteration of the layout's training loop:
// - per virtual worker, the schedule's compute order per rank (F, B, W tasks; with tensor
//   parallelism one task per device of the rank and a tensor-parallel all-reduce after each
//   F and B on the compute stream);
// - activations forward and gradients backward between consecutive chunks as send/recv
//   pairs on per-peer channels ("send>7:act", "recv<3:grad");
// - all-reduce sync: one bucketed all-reduce per layer segment held by the same devices
//   across virtual workers, on the "comm" stream, then an optimizer step per device;
// - ps / wsp: pushes of each chunk's gradients to the servers of its layers, one update per
//   server and iteration, pulls back; iteration i+D+1 of a worker waits for the pull of
//   iteration i (D = staleness; D = 0 is synchronous).
// Throws InputError when the layout does not fit the network or the cluster.
Plan build_plan(const model::Cluster& cluster, const model::Network& network, const Layout& layout,
                const CostModel& cost);

}  // namespace hetflow::partition
