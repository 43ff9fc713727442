#include "partition/expert_shard.hpp"

#include <algorithm>

namespace hetflow::partition {

int expert_rank(int worker, int context, int ep) { return (worker / std::max(context, 1)) % std::max(ep, 1); }

std::vector<int> expert_group(int worker, int data, int context, int ep) {
  std::vector<int> out;
  if (ep <= 1 || data % ep != 0) return {worker};
  const int c = worker % context, first = worker / context / ep * ep;
  for (int j = 0; j < ep; ++j) out.push_back((first + j) * context + c);
  return out;
}

std::vector<int> expert_data_group(int worker, int data, int context, int ep) {
  std::vector<int> out;
  if (ep <= 1 || data % ep != 0) {
    for (int d = 0; d < data; ++d) out.push_back(d * context + worker % context);
    return out;
  }
  const int c = worker % context, rank = expert_rank(worker, context, ep);
  for (int g = 0; g < data / ep; ++g) out.push_back((g * ep + rank) * context + c);
  return out;
}

double expert_rank_params(const model::Layer& l, int held) {
  if (l.experts <= 0) return l.params;
  return l.params - (l.experts - std::clamp(held, 0, l.experts)) * l.expert_params;
}

double routed_forward_flops(const model::Layer& l, double tokens_per_sample) {
  return l.experts > 0 ? l.experts_per_token * 2.0 * tokens_per_sample * l.expert_params : 0;
}

double rank_forward_flops(const model::Layer& l, double tokens_per_sample, double load) {
  const double routed = routed_forward_flops(l, tokens_per_sample);
  return l.forward_flops - routed + routed * load;
}

Dispatch dispatch_parts(const std::vector<double>& shares, const ExpertPlacement& placement, double capacity_factor) {
  Dispatch out;
  const ExpertLoads loads = expert_loads(shares, placement, capacity_factor);
  out.kept = 1 - loads.dropped;
  // A rank's load is ranks x its experts' kept share: its part of every sender's kept copies.
  for (double load : loads.rank_load) out.parts.push_back(out.kept > 0 ? load / placement.ranks / out.kept : 0);
  return out;
}

}  // namespace hetflow::partition
