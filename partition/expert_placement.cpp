#include "partition/expert_placement.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "model/error.hpp"
#include "partition/expert_shard.hpp"
#include "partition/memory.hpp"

namespace hetflow::partition {

ExpertRanks expert_ranks(const model::Network& net, const Layout& layout, const CostModel& cost) {
  ExpertRanks out;
  const int ep = std::max(1, layout.experts.parallel), context = layout.size(Axis::context);
  const bool moe = net.architecture && net.architecture->moe.experts > 0;
  out.speeds.assign(static_cast<size_t>(ep), std::numeric_limits<double>::infinity());
  out.max_experts.assign(static_cast<size_t>(ep), std::numeric_limits<int>::max());
  if (!moe) return out;
  const double seq = net.architecture->seq, mbs = layout.micro_batch_size / static_cast<double>(context);
  const double e = model::element_bytes(layout.precision), g = layout.gradient_element_bytes();
  const Sharded zero = sharded_by(layout);
  // Expert state is sharded over the replicas holding the same experts: EP times fewer.
  const double holders = std::max(1.0, static_cast<double>(layout.replicas()) / ep);
  const double dense_bytes_per_param = e / zero.weights + g / zero.gradients +
                                       model::adam_state_bytes(layout.precision) / zero.optimizer;
  const auto sharded = [&](double by) { return by > 1 ? holders : 1.0; };
  const double expert_bytes_per_param = e / sharded(zero.weights) + g / sharded(zero.gradients) +
                                        model::adam_state_bytes(layout.precision) / sharded(zero.optimizer);
  for (size_t w = 0; w < layout.workers.size(); ++w) {
    const auto r = static_cast<size_t>(expert_rank(static_cast<int>(w), context, ep));
    const VirtualWorker& vw = layout.workers[w];
    std::vector<double> used(vw.ranks.size(), layout.workspace_bytes), per_expert(vw.ranks.size(), 0.0);
    for (size_t k = 0; k < vw.stages.size(); ++k) {
      const Stage& s = vw.stages[k];
      const int t = vw.tensor_of(k);  // (each device holds and computes 1/t of every expert)
      const double routed = routed_expert_params(net, s.layer_begin, s.layer_end, t);
      const double dense = params_per_device(net, s.layer_begin, s.layer_end, t) - routed;
      used[static_cast<size_t>(s.rank)] += dense * dense_bytes_per_param;
      for (int i = s.layer_begin; i < s.layer_end; ++i) {
        const model::Layer& l = net.layers[static_cast<size_t>(i)];
        if (l.experts <= 0) continue;
        const double part = l.tp_splittable ? 1.0 / t : 1.0;
        per_expert[static_cast<size_t>(s.rank)] += l.expert_params * part * expert_bytes_per_param;
        // One expert's share of a micro-batch's routed FLOPs, timed on each of the rank's devices.
        const double flops = routed_forward_flops(l, seq) * mbs / l.experts * part;
        for (const int d : vw.ranks[static_cast<size_t>(s.rank)]) {
          const double seconds = cost.compute_time_s(d, TaskKind::forward, flops);
          if (seconds > 0) out.speeds[r] = std::min(out.speeds[r], flops / seconds);
        }
      }
    }
    for (size_t k = 0; k < vw.ranks.size(); ++k) {
      if (per_expert[k] <= 0) continue;
      for (const int d : vw.ranks[k]) {
        const double room = std::max(0.0, cost.memory_capacity_bytes(d) - used[k]);
        out.max_experts[r] = std::min(out.max_experts[r], static_cast<int>(std::min(1e9, std::floor(room / per_expert[k]))));
      }
    }
  }
  for (size_t r = 0; r < out.speeds.size(); ++r) {
    if (!std::isfinite(out.speeds[r])) out.speeds[r] = 1;  // a rank without MoE layers: any speed
    out.max_experts[r] = std::min(out.max_experts[r], net.architecture->moe.experts);
  }
  return out;
}

std::vector<int> place_experts_by_speed(const model::Network& net, const Layout& layout, const CostModel& cost) {
  if (!net.architecture || net.architecture->moe.experts <= 0) {
    throw InputError(kOptions, 0, "expert_placement", "places experts, but " + net.name + " has no mixture of experts");
  }
  const ExpertRanks ranks = expert_ranks(net, layout, cost);
  const std::vector<double> shares = expert_shares(layout.experts.routing, net.architecture->moe.experts);
  std::vector<int> rank_of;
  try {
    rank_of = placement_by_speed(shares, ranks.speeds, ranks.max_experts).rank_of;
  } catch (const InputError& e) {
    throw InputError(kOptions, 0, "expert_placement", e.message());
  }
  // Every expert rank holds at least one expert (its grouped GEMMs need one, as Megatron's
  // experts / EP does): a rank left without, slowest first, takes the lightest expert of the
  // rank that finishes last among those holding two or more.
  const size_t n = ranks.speeds.size();
  std::vector<double> load(n, 0.0);
  std::vector<int> held(n, 0);
  for (size_t e = 0; e < rank_of.size(); ++e) {
    load[static_cast<size_t>(rank_of[e])] += shares[e];
    ++held[static_cast<size_t>(rank_of[e])];
  }
  std::vector<size_t> empty;
  for (size_t r = 0; r < n; ++r) {
    if (held[r] == 0) empty.push_back(r);
  }
  std::sort(empty.begin(), empty.end(), [&](size_t a, size_t b) { return ranks.speeds[a] < ranks.speeds[b]; });
  for (const size_t r : empty) {
    size_t from = n;
    for (size_t q = 0; q < n; ++q) {
      if (held[q] >= 2 && (from == n || load[q] / ranks.speeds[q] > load[from] / ranks.speeds[from])) from = q;
    }
    if (from == n) break;  // fewer experts than ranks: check_experts says so
    size_t lightest = rank_of.size();
    for (size_t e = 0; e < rank_of.size(); ++e) {
      if (static_cast<size_t>(rank_of[e]) == from && (lightest == rank_of.size() || shares[e] < shares[lightest])) lightest = e;
    }
    rank_of[lightest] = static_cast<int>(r);
    load[from] -= shares[lightest];
    load[r] += shares[lightest];
    --held[from];
    ++held[r];
  }
  return rank_of;
}

}  // namespace hetflow::partition
