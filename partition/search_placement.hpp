#pragma once
// Inside partition/search*.cpp only: where an overflowing all-reduce candidate's model state
// and stashes may go, the placements the search lays it out at again (SearchSpace::zero,
// SearchSpace::offload), numbered so a candidate's is a code the search's processes share.
#include "partition/layout.hpp"
#include "partition/policy.hpp"

namespace hetflow::partition::search_detail {

struct Placement {
  Sharding zero;     // ZeRO's stage, resharding and shares
  bool offload;      // the optimizer state in host memory
  bool activations;  // the stashes in host memory
};

// The placements of the model state: ZeRO's shardings, from the least memory saved to the
// most (a chunk kept gathered holds more than one resharded after every pass), then each with
// the optimizer state offloaded; each of those again with the stashes offloaded; and all of
// those again with the shards by memory (after every equal one: uneven rings are slower).
inline constexpr int kStatePlacements = 10;
inline constexpr int kPlacementCount = 4 * kStatePlacements;

// Placement `code`, 0 <= code < kPlacementCount.
Placement placement(int code);
// The code of the options' placement; kPlacementCount for one the search does not know.
int placement_code(const PlanOptions& o);
// The options at placement `code`.
PlanOptions with_placement(PlanOptions o, int code);
// Whether activation offload would move any stash of the layout (schedule.hpp's stash_leaves).
bool stashes_leave(const Layout& layout);

}  // namespace hetflow::partition::search_detail
