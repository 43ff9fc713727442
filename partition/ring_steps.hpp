#pragma once
// A ring collective's steps for one member in summary, for callers that need their number,
// size and peers but not their list (partition/collective_steps.hpp lists them).
#include <optional>
#include <vector>

#include "partition/collective_steps.hpp"

namespace hetflow::partition {

// A ring all-reduce, reduce-scatter or all-gather's steps for one member, as collective_steps
// gives them, without listing them: `count` steps, each sending `bytes` to `next` and
// receiving from `previous` on `lane`. Listing 2(n-1) steps for each of n members is
// quadratic in the members; this is linear (finding the member) and allocates nothing.
struct RingSteps {
  int count = 0;         // steps
  double bytes = 0;      // sent in each step
  int next = -1;         // the member sent to
  int previous = -1;     // the member received from
  Lane lane = Lane::ring;
};

// The ring of `device` in `c` where collective_steps gives one (algorithm ring, kind
// all_reduce, reduce_scatter or all_gather, one message, even parts, two or more members,
// some bytes); nullopt for every other collective. Throws like collective_steps.
std::optional<RingSteps> ring_steps(const CollectiveSpec& c, int device);
// The same for members `devices` (a plan's communicator, not copied: a copy per member is
// quadratic too); c.devices is not read.
std::optional<RingSteps> ring_steps(const CollectiveSpec& c, const std::vector<int>& devices, int device);

}  // namespace hetflow::partition
