#include "partition/search_placement.hpp"

#include "partition/schedule.hpp"

namespace hetflow::partition::search_detail {

Placement placement(int code) {
  constexpr Placement state[kStatePlacements] = {
      {{0, true}, false, false}, {{1, true}, false, false}, {{2, true}, false, false},
      {{3, false}, false, false}, {{3, true}, false, false}, {{0, true}, true, false},
      {{1, true}, true, false},   {{2, true}, true, false},  {{3, false}, true, false},
      {{3, true}, true, false}};
  Placement p = state[code % kStatePlacements];
  p.activations = code % (2 * kStatePlacements) >= kStatePlacements;
  if (code >= 2 * kStatePlacements) p.zero.shares = ZeroShares::memory;
  return p;
}

int placement_code(const PlanOptions& o) {
  for (int code = 0; code < kPlacementCount; ++code) {
    const Placement p = placement(code);
    if (p.zero == Sharding{o.zero_stage, o.reshard_after_forward, o.zero_shares} && p.offload == o.offload_optimizer &&
        p.activations == o.offload_activations) {
      return code;
    }
  }
  return kPlacementCount;
}

PlanOptions with_placement(PlanOptions o, int code) {
  const Placement p = placement(code);
  o.zero_stage = p.zero.stage;
  o.reshard_after_forward = p.zero.reshard_after_forward;
  o.offload_optimizer = p.offload;
  o.offload_activations = p.activations;
  o.zero_shares = o.zero_stage > 0 ? p.zero.shares : ZeroShares::equal;
  return o;
}

bool stashes_leave(const Layout& layout) {
  const Schedule& schedule = schedule_by_name(layout.schedule);
  for (const VirtualWorker& vw : layout.workers) {
    const int p = static_cast<int>(vw.ranks.size());
    if (p > 0 && any_stash_leaves(schedule.build(p, vw.microbatches, static_cast<int>(vw.stages.size()) / p))) return true;
  }
  return false;
}

}  // namespace hetflow::partition::search_detail
