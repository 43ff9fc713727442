#pragma once
// Links shared by concurrent flows, as the simulator shares them: every flow of a set that
// runs at once crosses the links of its route (CostModel::route_links: the simulator's
// platform, sim/platform_spec.hpp), and each link's bandwidth is divided among the flows on
// it by max-min fairness, as SimGrid's network model does (sim/platform.cpp sets CM02: each
// flow weighted by the inverse of its route's latency, which is what SimGrid's CM02 takes as
// a flow's sharing penalty when its weight-S parameter is 0, the model's default). A flow
// alone gets its route's bottleneck bandwidth, so the cost model's contention-free times are
// the case of one flow.
//
// The analytic estimate (partition/layout_estimate.cpp) calls this once per phase of flows
// that run together: a collective's steps (a ring's edges all send at once), the same
// collective of every data-parallel replica, a boundary transfer of every tensor rank.
#include <utility>
#include <vector>

#include "partition/collective.hpp"
#include "partition/cost_model.hpp"

namespace hetflow::partition {

// A flow from one device to another.
struct Flow {
  int src = 0, dst = 0;
  bool operator==(const Flow&) const = default;
};

// Each flow's bandwidth when all of them run at once (infinite for src == dst). Weighted
// max-min fairness by progressive filling: the most constrained link fixes its flows at
// their weighted share of what is left of it, until every flow is fixed.
std::vector<double> fair_shares_bytes_per_s(const CostModel& cost, const std::vector<Flow>& flows);

// Each flow's mean bandwidth when all start at once, flow f carrying bytes[f]: max-min
// shares until the first finishes, whose links then go to the others, and so on (SimGrid
// re-solves its sharing at every flow's end the same way); bytes[f] / its finishing time.
std::vector<double> mean_rates_bytes_per_s(const CostModel& cost, const std::vector<Flow>& flows,
                                           const std::vector<double>& bytes);

// The flows a collective's steps keep busy at once, as its algorithm runs
// (partition/collective_steps.hpp): a ring's edges, a chain's hops, a tree's edges (both
// ways for an all-reduce: its reduce and broadcast are pipelined), a hierarchical
// collective's intra- and inter-node rings.
std::vector<Flow> collective_flows(const CostModel& cost, const CollectiveSpec& c);

// One phase of communication that runs at once: collectives and transfers, each timed with
// the bandwidth its flows get among all of the phase's flows.
class SharedPhase {
 public:
  // Not shared: each item timed alone on its routes (the contention-free cost model).
  explicit SharedPhase(const CostModel& cost, bool shared = true) : cost_(cost), shared_(shared) {}
  // Adds a collective; its index among the phase's items.
  int add(const CollectiveSpec& c);
  // Adds a transfer of `bytes` from src to dst; its index.
  int add_transfer(int src, int dst, double bytes);
  // Every item's time, in the order added.
  std::vector<double> times_s() const;

 private:
  struct Item {
    CollectiveSpec collective;
    bool transfer = false;
    size_t first_flow = 0, flows = 0;  // its flows in flows_
  };
  const CostModel& cost_;
  bool shared_;
  std::vector<Item> items_;
  std::vector<Flow> flows_;
};

}  // namespace hetflow::partition
