#pragma once
// Experts placed over a layout's expert ranks by what the ranks' devices can do: more
// experts (or the heavier ones, under skewed routing) on the faster ranks, no more on a rank
// than its devices' memory holds. The layout's `experts.placement` it fills is the plan's
// word on where each expert lives (layout.experts in the plan file).
#include <vector>

#include "model/cluster.hpp"
#include "model/network.hpp"
#include "partition/cost_model.hpp"
#include "partition/layout.hpp"

namespace hetflow::partition {

// What each expert rank can do, as placement_by_speed (routing.hpp) takes it.
struct ExpertRanks {
  // Per expert rank: routed-expert FLOPs per second of its slowest device, at the size of one
  // expert's GEMMs of a micro-batch (the calibration's efficiency at that size).
  std::vector<double> speeds;
  // Per expert rank: the most experts its fullest device holds beside everything else it
  // keeps (weights, gradients and optimizer state of its chunks' other parameters, the
  // layout's workspace), each expert its parameters' state under the layout's ZeRO stage.
  // Activations are left to validation's memory check.
  std::vector<int> max_experts;
};
ExpertRanks expert_ranks(const model::Network& net, const Layout& layout, const CostModel& cost);

// placement_by_speed over expert_ranks, under the layout's routing, then every rank given at
// least one expert (a rank left without takes the lightest expert of the rank that finishes
// last): expert e on rank result[e]. Throws InputError (file "<options>", field "expert_placement") where the network
// has no experts or the ranks' memory holds fewer than all of them.
std::vector<int> place_experts_by_speed(const model::Network& net, const Layout& layout, const CostModel& cost);

}  // namespace hetflow::partition
