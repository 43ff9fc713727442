#pragma once
// A collective's point-to-point steps (partition/collective_steps.hpp) as one participant posts
// them on SimGrid mailboxes: the simulator's view of a collective. Rings may run as one
// transfer per member (coalesced, or standing for a folded plan's replicas), all-to-alls as two
// flows a member where that is exact (coalesced), and a collective
// of several messages waits their latencies on a timer.
#include <tuple>
#include <utility>
#include <vector>

#include <simgrid/s4u.hpp>

#include "partition/cost_model.hpp"
#include "partition/plan.hpp"
#include "sim/platform.hpp"

namespace hetflow::sim {

// One step of a collective with its messages' mailboxes.
struct MailboxStep {
  std::vector<std::pair<simgrid::s4u::Mailbox*, double>> puts;  // (to, bytes)
  std::vector<simgrid::s4u::Mailbox*> gets;                      // from
  double delay_s = 0;                                            // a wait before anything (coalesced rings)
  double rate_cap = 0;                                           // puts go no faster (bytes/s; 0: no cap)
  // Host-to-host flows with no actor on the other side (a folded plan's replicas):
  // (from device, to device, bytes), paced by rate_cap too.
  std::vector<std::tuple<int, int, double>> flows;
};

// The steps of a plan's collectives, per participant. Made once the platform exists; caches
// what it learns about each collective's ring.
class MailboxSteps {
 public:
  // coalesce_rings, coalesce_all_to_all: SimOptions' own.
  MailboxSteps(const partition::Plan& plan, const partition::CostModel& cost, const Platform& platform,
               bool coalesce_rings, bool coalesce_all_to_all);
  // The steps participant task `t` (on its device and stream) posts for collective `c`.
  std::vector<MailboxStep> of(const partition::Collective& c, const partition::Task& t) const;

 private:
  // A ring's hops: the largest latency and the smallest bandwidth among them, and whether all
  // are alike. In a ring's steps every member waits for its predecessor, so the slowest hop
  // paces them all; a coalesced member waits the largest latency and sends no faster than
  // the smallest bandwidth, and they end together as the steps do.
  struct RingHops {
    bool known = false, uniform = true;
    double latency_s = 0, bandwidth_bytes_per_s = 0;
  };
  const RingHops& ring_hops(size_t collective) const;
  bool ring_shares_a_link(size_t collective) const;

  const partition::Plan& plan_;
  const partition::CostModel& cost_;
  const Platform& platform_;
  bool coalesce_rings_;
  bool coalesce_all_to_all_;
  mutable std::vector<RingHops> ring_hops_;       // per collective, computed when first run
  mutable std::vector<signed char> ring_shares_;  // per collective: ring_shares_a_link, -1 until asked
};

}  // namespace hetflow::sim
