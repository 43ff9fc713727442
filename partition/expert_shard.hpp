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
// keep summing over all D. A chunk's tensor degree t is also its experts' (expert tensor
// parallelism as Megatron-Core defaults it): each device holds 1/t of its rank's experts, and
// the group exchanges once per tensor rank, among the members' devices of that rank.
#include <vector>

#include "model/network.hpp"
#include "partition/layout.hpp"
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
// Of layers [begin, end) on one device of a tensor-parallel rank of degree `tensor`: the
// routed experts' parameters in all, and those a rank holding `held` experts of each MoE
// layer does not hold (0 where held < 0: every expert). Expert tensor parallelism is the
// rank's degree (Megatron-Core's default): each expert's widths split as the dense MLP's, a
// device holding 1/tensor of every expert its rank holds.
double routed_expert_params(const model::Network& net, int begin, int end, int tensor);
double expert_params_elsewhere(const model::Network& net, int begin, int end, int held, int tensor);

// The routed experts' share of a MoE layer's forward FLOPs: top-k experts' GEMMs per token
// (2 FLOPs a multiply-add over expert_params per copy, seq copies x top-k a sample); 0 for a
// layer without experts.
double routed_forward_flops(const model::Layer& l, double tokens_per_sample);
// The layer's forward FLOPs on a rank whose experts compute `load` times an even share of the
// copies (ExpertLoads::rank_load): the routed part scales, the rest does not.
double rank_forward_flops(const model::Layer& l, double tokens_per_sample, double load);

// Where a MoE layer's exchanges sit in its forward, as parts of its forward FLOPs: the
// dispatch after the attention and the router, the combine after the routed experts (the
// shared experts come last), the combine a hair before the layer's end.
struct ExchangePoints {
  double dispatch = 0, combine = 1;
};
ExchangePoints exchange_points(const model::TransformerConfig& c, const model::Layer& l);

// What a dispatch all-to-all carries under the routing: every member sends its copies
// (tokens x top-k x hidden, less what capacity drops) in parts, one per expert rank, in
// proportion to the copies that rank's experts take (CollectiveSpec::parts, adding up to 1).
struct Dispatch {
  double kept = 1;           // the part of the copies not dropped, scaling the bytes
  std::vector<double> parts;  // per expert rank
};
Dispatch dispatch_parts(const std::vector<double>& shares, const ExpertPlacement& placement, double capacity_factor);

// A layout's expert split resolved for a network: where each expert lives, what each expert
// rank holds and computes, and what the dispatch carries. Every MoE layer of a network has the
// same experts and routing, so one split serves them all. A network without experts, or a
// layout without expert parallelism on one, has one rank that holds every expert at load 1.
struct ExpertSplit {
  int ranks = 1;  // EP
  ExpertPlacement placement;
  std::vector<int> held;  // per expert rank: the experts it holds
  ExpertLoads loads;      // per expert rank: the copies it computes, as a multiple of an even share
  Dispatch dispatch;
};
ExpertSplit expert_split(const model::Network& net, const Layout& layout);

// What one virtual worker's devices hold and compute of every MoE layer.
struct ExpertShare {
  int held = -1;     // routed experts held; -1: every one (no expert axis)
  double load = 1;   // copies computed, as a multiple of tokens x top-k (capacity drops below 1)
  bool operator==(const ExpertShare&) const = default;
};
ExpertShare expert_share(const ExpertSplit& split, const Layout& layout, int worker);

// Throws InputError (file "<options>", the field at fault) unless the layout's expert axis
// fits the network and the layout: a network with MoE layers where EP > 1; EP dividing the
// data axis; every chunk holding an MoE layer of the same tensor degree on every replica,
// with sequence parallelism where that degree is above 1; a placement, when given, naming a rank below EP for
// every expert and every rank at least once; a routing histogram with one count per expert;
// pairwise or hierarchical dispatch.
void check_experts(const model::Network& net, const Layout& layout);

}  // namespace hetflow::partition
