#include "partition/expert_shard.hpp"

#include <algorithm>
#include <string>

#include "model/error.hpp"

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

namespace {
// A device's part of layer l's experts on a rank of degree `tensor` (part_params' proportion).
double device_part(const model::Layer& l, int tensor) { return l.tp_splittable ? 1.0 / std::max(tensor, 1) : 1.0; }
}  // namespace

double routed_expert_params(const model::Network& net, int begin, int end, int tensor) {
  double sum = 0;
  for (int i = std::max(begin, 0); i < end && i < static_cast<int>(net.layers.size()); ++i) {
    const model::Layer& l = net.layers[static_cast<size_t>(i)];
    sum += l.experts > 0 ? l.experts * l.expert_params * device_part(l, tensor) : 0;
  }
  return sum;
}

double expert_params_elsewhere(const model::Network& net, int begin, int end, int held, int tensor) {
  if (held < 0) return 0;
  double sum = 0;
  for (int i = std::max(begin, 0); i < end && i < static_cast<int>(net.layers.size()); ++i) {
    const model::Layer& l = net.layers[static_cast<size_t>(i)];
    sum += (l.params - expert_rank_params(l, held)) * device_part(l, tensor);
  }
  return sum;
}

double routed_forward_flops(const model::Layer& l, double tokens_per_sample) {
  return l.experts > 0 ? l.experts_per_token * 2.0 * tokens_per_sample * l.expert_params : 0;
}

double rank_forward_flops(const model::Layer& l, double tokens_per_sample, double load) {
  const double routed = routed_forward_flops(l, tokens_per_sample);
  return l.forward_flops - routed + routed * load;
}

ExchangePoints exchange_points(const model::TransformerConfig& c, const model::Layer& l) {
  const model::MoeConfig& m = c.moe;
  const double shared = 2.0 * c.seq * 3.0 * c.hidden * static_cast<double>(m.shared_experts) * m.shared_width();
  const double routed = routed_forward_flops(l, c.seq);
  const double f = l.forward_flops;
  const double combine = std::clamp(1 - shared / f, 0.0, 1.0);
  const double dispatch = std::clamp(combine - routed / f, 0.0, combine);
  // Strictly inside the layer: at its very end the combine would tie with the next layer's
  // first call (its tensor group's gather), and a task orders tied calls by collective, not
  // by layer.
  return {dispatch, combine - (combine - dispatch) * 1e-9};
}

Dispatch dispatch_parts(const std::vector<double>& shares, const ExpertPlacement& placement, double capacity_factor) {
  Dispatch out;
  const ExpertLoads loads = expert_loads(shares, placement, capacity_factor);
  out.kept = 1 - loads.dropped;
  // A rank's load is ranks x its experts' kept share: its part of every sender's kept copies.
  for (double load : loads.rank_load) out.parts.push_back(out.kept > 0 ? load / placement.ranks / out.kept : 0);
  return out;
}

namespace {
const model::MoeConfig* moe_of(const model::Network& net) {
  if (!net.architecture || net.architecture->moe.experts <= 0) return nullptr;
  return &net.architecture->moe;
}
}  // namespace

ExpertSplit expert_split(const model::Network& net, const Layout& layout) {
  ExpertSplit split;
  const model::MoeConfig* moe = moe_of(net);
  const int experts = moe ? moe->experts : 0;
  split.ranks = std::max(1, layout.experts.parallel);
  if (!layout.experts.placement.empty()) {
    split.placement.rank_of = layout.experts.placement;
    split.placement.ranks = split.ranks;
  } else {
    split.placement = contiguous_placement(experts, split.ranks);
  }
  split.held.assign(static_cast<size_t>(split.ranks), 0);
  for (const int r : split.placement.rank_of) {
    if (r >= 0 && r < split.ranks) ++split.held[static_cast<size_t>(r)];
  }
  if (moe == nullptr) {
    split.loads.rank_load.assign(static_cast<size_t>(split.ranks), 1.0);
    split.dispatch.parts.assign(static_cast<size_t>(split.ranks), 1.0 / split.ranks);
    return split;
  }
  const std::vector<double> shares = expert_shares(layout.experts.routing, experts);
  split.loads = expert_loads(shares, split.placement, moe->capacity_factor);
  split.dispatch = dispatch_parts(shares, split.placement, moe->capacity_factor);
  return split;
}

ExpertShare expert_share(const ExpertSplit& split, const Layout& layout, int worker) {
  const int rank = expert_rank(worker, layout.size(Axis::context), split.ranks);
  const auto r = static_cast<size_t>(std::clamp(rank, 0, split.ranks - 1));
  ExpertShare share;
  if (split.ranks > 1 && r < split.held.size()) share.held = split.held[r];
  // (One rank that drops nothing computes every copy: exactly 1, not a sum of shares.)
  if ((split.ranks > 1 || split.loads.dropped > 0) && r < split.loads.rank_load.size()) share.load = split.loads.rank_load[r];
  return share;
}

void check_experts(const model::Network& net, const Layout& layout) {
  const Experts& x = layout.experts;
  const model::MoeConfig* moe = moe_of(net);
  const int ep = x.parallel, data = layout.size(Axis::data);
  if (ep < 1) throw InputError(kOptions, 0, "expert_parallel", "expected at least 1, found " + std::to_string(ep));
  if (x.dispatch != CollectiveAlgorithm::pairwise && x.dispatch != CollectiveAlgorithm::hierarchical) {
    throw InputError(kOptions, 0, "expert_dispatch",
                     "expected pairwise or hierarchical, found " + std::string(to_string(x.dispatch)));
  }
  if (moe == nullptr) {
    if (ep > 1 || !x.placement.empty()) {
      throw InputError(kOptions, 0, "expert_parallel",
                       "expected a network with a mixture of experts (architecture.moe) for expert parallelism " +
                           std::to_string(ep) + "; " + net.name + " has none");
    }
    return;
  }
  if (ep > 1 && data % ep != 0) {
    throw InputError(kOptions, 0, "expert_parallel",
                     "expected a divisor of the data axis (" + std::to_string(data) +
                         " replicas: expert groups are consecutive replicas), found " + std::to_string(ep));
  }
  if (x.routing.kind == Routing::Kind::histogram && static_cast<int>(x.routing.histogram.size()) != moe->experts) {
    throw InputError(kOptions, 0, "routing",
                     "expected one token count per expert (" + std::to_string(moe->experts) + "), found " +
                         std::to_string(x.routing.histogram.size()));
  }
  if (!x.placement.empty()) {
    if (static_cast<int>(x.placement.size()) != moe->experts) {
      throw InputError(kOptions, 0, "expert_placement",
                       "expected one expert rank per expert (" + std::to_string(moe->experts) + "), found " +
                           std::to_string(x.placement.size()));
    }
    std::vector<int> held(static_cast<size_t>(ep), 0);
    for (size_t e = 0; e < x.placement.size(); ++e) {
      const int r = x.placement[e];
      if (r < 0 || r >= ep) {
        throw InputError(kOptions, 0, "expert_placement[" + std::to_string(e) + "]",
                         "expected an expert rank below expert_parallel (" + std::to_string(ep) + "), found " +
                             std::to_string(r));
      }
      ++held[static_cast<size_t>(r)];
    }
    for (int r = 0; r < ep; ++r) {
      if (held[static_cast<size_t>(r)] == 0) {
        throw InputError(kOptions, 0, "expert_placement",
                         "expected every expert rank to hold an expert; rank " + std::to_string(r) + " holds none");
      }
    }
  } else if (moe->experts % ep != 0) {
    throw InputError(kOptions, 0, "expert_parallel",
                     "expected a divisor of the " + std::to_string(moe->experts) +
                         " experts (or an expert placement), found " + std::to_string(ep));
  }
  if (ep <= 1) return;
  // Expert tensor parallelism is each chunk's tensor degree: one all-to-all per tensor rank
  // across an expert group, so every replica splits a chunk with MoE layers alike, and each
  // device dispatches its share of the tokens (sequence parallelism, which Megatron-Core
  // requires of MoE with tensor parallelism).
  const VirtualWorker& first = layout.workers.front();
  for (size_t w = 0; w < layout.workers.size(); ++w) {
    const VirtualWorker& vw = layout.workers[w];
    for (size_t k = 0; k < vw.stages.size(); ++k) {
      const Stage& s = vw.stages[k];
      bool has_moe = false;
      for (int i = s.layer_begin; i < s.layer_end && i < static_cast<int>(net.layers.size()); ++i) {
        has_moe = has_moe || net.layers[static_cast<size_t>(i)].experts > 0;
      }
      if (!has_moe) continue;
      const int t = vw.tensor_of(k);
      if (k >= first.stages.size() || first.tensor_of(k) != t) {
        throw InputError(kOptions, 0, "tensor",
                         "expected the same tensor degree on every replica's chunk " + std::to_string(k) +
                             " with expert parallelism (its MoE layers' experts split over it); worker " +
                             std::to_string(w) + " has " + std::to_string(t) + ", worker 0 " +
                             (k < first.stages.size() ? std::to_string(first.tensor_of(k)) : std::string("no such chunk")));
      }
      if (t > 1 && !layout.sequence_parallel) {
        throw InputError(kOptions, 0, "sequence_parallel",
                         "expected sequence parallelism with tensor and expert parallelism: chunk " + std::to_string(k) +
                             " of worker " + std::to_string(w) + " holds MoE layers on " + std::to_string(t) +
                             " tensor-parallel devices, and each dispatches its share of the tokens (Megatron-Core "
                             "requires it too)");
      }
    }
  }
}

}  // namespace hetflow::partition
