#pragma once
// How a mixture of experts' router spreads tokens over the experts, and what that costs the
// expert-parallel ranks that hold them: the routing model of planning and simulation.
//
// A routing model gives each expert its share of the token copies (a micro-batch's tokens x
// top-k; the shares add up to 1). Balanced: 1 / experts each, what the load-balancing loss
// trains towards. Zipf: the i-th expert (in expert order) gets a share in proportion to
// 1 / (i + 1)^s, a skewed router (early training, narrow data). Histogram: measured tokens
// per expert, as a router's logs give them.
//
// Every expert-parallel rank routes its own tokens with the same shares, so expert e takes
// `ranks` x tokens x top-k x share_e copies in all. Under a capacity factor c each rank sends
// an expert at most c x tokens x top-k / experts copies (Megatron's per-rank capacity) and
// drops the rest (their residual passes alone). A rank's load is the copies its experts
// compute as a multiple of an even share (tokens x top-k): 1 for every rank under balanced
// routing; the busiest rank's load scales its expert GEMMs and the bytes the all-to-all
// delivers to it, and gates the layer.
#include <string>
#include <string_view>
#include <vector>

namespace hetflow::partition {

struct Routing {
  enum class Kind { balanced, zipf, histogram };
  Kind kind = Kind::balanced;
  double zipf_exponent = 0;       // zipf: s > 0
  std::vector<double> histogram;  // histogram: tokens (any counts >= 0, not all 0) per expert
  bool operator==(const Routing&) const = default;
};

// "balanced", "zipf:<s>" or "histogram:<n0>,<n1>,..." (as a plan file and --routing write it).
// Throws InputError naming `field` in `file` when it is none of these.
Routing parse_routing(std::string_view text, const std::string& file, const std::string& field);
std::string to_string(const Routing& routing);

// Each expert's share of the token copies, adding up to 1. Throws InputError (file
// "<routing>") when a histogram does not list `experts` counts.
std::vector<double> expert_shares(const Routing& routing, int experts);

// Where the experts live: rank_of[e] is the expert-parallel rank holding expert e.
struct ExpertPlacement {
  std::vector<int> rank_of;
  int ranks = 1;
  bool operator==(const ExpertPlacement&) const = default;
};

// experts / ranks consecutive experts a rank (Megatron's placement); `ranks` divides `experts`.
ExpertPlacement contiguous_placement(int experts, int ranks);

// Experts placed so the slowest rank finishes first: each rank r holds at most
// max_experts[r] experts, and the experts, heaviest share first, go one by one to the rank
// whose load after it over its speed is least (longest-processing-time first; Graham 1969
// bounds it within 4/3 of the best). Equal speeds, equal caps and balanced shares give each
// rank experts / ranks. Throws InputError when the caps hold fewer than the experts.
ExpertPlacement placement_by_speed(const std::vector<double>& shares, const std::vector<double>& speeds,
                                   const std::vector<int>& max_experts);

// What the routing costs each rank of the placement under `capacity_factor` (0: dropless).
struct ExpertLoads {
  std::vector<double> rank_load;  // copies each rank computes, as a multiple of tokens x top-k
  double dropped = 0;             // the part of all copies dropped for capacity, in [0, 1)
  int busiest = 0;                // the rank with the largest load (the first of equals)
};
ExpertLoads expert_loads(const std::vector<double>& shares, const ExpertPlacement& placement, double capacity_factor);

}  // namespace hetflow::partition
