#pragma once
// Expert parallelism's split of a mixture of experts, counted: which virtual workers form an
// expert group, what one of its ranks holds and computes, and what its dispatch all-to-all
// carries. The one definition the expert axis's plan, the layout estimate and the memory
// model are to share (as shard.hpp is the tensor split's).
//
// Expert groups lie along the data axis (Megatron's expert parallelism inside the data-parallel
// group): with D data-parallel indices, C context ranks and EP | D, the group of worker
// w = d C + c is the EP workers of data indices floor(d / EP) EP .. + EP - 1 with the same c;
// its expert rank is d mod EP. The D / EP workers of one expert rank in different groups hold
// the same experts and sum their gradients (Megatron's expert data parallelism); dense layers
// keep summing over all D.
#include <vector>

#include "model/network.hpp"
#include "partition/routing.hpp"

namespace hetflow::partition {

// The workers of worker w's expert group, in expert-rank order; and the workers holding the
// same experts as w (one per group), in data order. {w} where ep is 1. data, context, ep >= 1
// and ep divides data.
std::vector<int> expert_group(int worker, int data, int context, int ep);
std::vector<int> expert_data_group(int worker, int data, int context, int ep);
int expert_rank(int worker, int context, int ep);

// Parameters of layer `l` on a rank holding `held` of its routed experts: the layer's own
// less the experts held elsewhere (all of a layer without experts).
double expert_rank_params(const model::Layer& l, int held);

// The routed experts' share of a MoE layer's forward FLOPs: top-k experts' GEMMs per token
// (2 FLOPs a multiply-add over expert_params per copy, seq copies x top-k a sample); 0 for a
// layer without experts.
double routed_forward_flops(const model::Layer& l, double tokens_per_sample);
// The layer's forward FLOPs on a rank whose experts compute `load` times an even share of the
// copies (ExpertLoads::rank_load): the routed part scales, the rest does not.
double rank_forward_flops(const model::Layer& l, double tokens_per_sample, double load);

// What a dispatch all-to-all carries under the routing: every member sends its copies
// (tokens x top-k x hidden, less what capacity drops) in parts, one per expert rank, in
// proportion to the copies that rank's experts take (CollectiveSpec::parts, adding up to 1).
struct Dispatch {
  double kept = 1;           // the part of the copies not dropped, scaling the bytes
  std::vector<double> parts;  // per expert rank
};
Dispatch dispatch_parts(const std::vector<double>& shares, const ExpertPlacement& placement, double capacity_factor);

}  // namespace hetflow::partition
