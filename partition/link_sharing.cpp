#include "partition/link_sharing.hpp"

#include <algorithm>
#include <limits>
#include <map>

#include "partition/collective_steps.hpp"

namespace hetflow::partition {

namespace {
constexpr double kInfinity = std::numeric_limits<double>::infinity();
// A route of no latency: the weight of a flow whose penalty would be 0 (then it takes
// nearly all of a shared link, as SimGrid gives the lightest penalty the most).
constexpr double kLeastLatency_s = 1e-9;

void ring(const std::vector<int>& members, std::vector<Flow>& out) {
  if (members.size() < 2) return;
  for (size_t i = 0; i < members.size(); ++i) out.push_back({members[i], members[(i + 1) % members.size()]});
}
}  // namespace

namespace {

// The flows of a phase with their routes' links (densely numbered) and their weights.
struct Network {
  std::vector<std::vector<size_t>> links_of;  // per flow
  std::vector<double> weight;                 // per flow: 1 / its route's latency
  std::vector<double> capacity;               // per link
  bool shared = false;                        // some link carries two flows or more
};

Network network_of(const CostModel& cost, const std::vector<Flow>& flows) {
  Network n;
  n.links_of.resize(flows.size());
  n.weight.assign(flows.size(), 0);
  std::vector<int> ids;  // per dense link: its id (a phase crosses a few dozen links)
  std::vector<int> route;
  for (size_t f = 0; f < flows.size(); ++f) {
    if (flows[f].src == flows[f].dst) continue;
    route.clear();
    cost.route_links(flows[f].src, flows[f].dst, route);
    for (const int link : route) {
      const auto at = static_cast<size_t>(std::find(ids.begin(), ids.end(), link) - ids.begin());
      n.shared = n.shared || at < ids.size();
      if (at == ids.size()) {
        ids.push_back(link);
        n.capacity.push_back(cost.link_bandwidth_bytes_per_s(link));
      }
      n.links_of[f].push_back(at);
    }
  }
  // The weights only matter where flows meet.
  for (size_t f = 0; f < flows.size() && n.shared; ++f) {
    if (flows[f].src != flows[f].dst) {
      n.weight[f] = 1 / std::max(kLeastLatency_s, cost.route(flows[f].src, flows[f].dst).latency_s);
    }
  }
  return n;
}

// Weighted max-min rates of the active flows (inactive ones: 0; unconstrained: infinite).
std::vector<double> max_min(const Network& n, const std::vector<bool>& active) {
  const size_t flows = n.links_of.size();
  std::vector<double> rate(flows, 0), left = n.capacity, weight_on(n.capacity.size(), 0);
  if (!n.shared) {  // each flow alone on its links: the narrowest
    for (size_t f = 0; f < flows; ++f) {
      if (!active[f]) continue;
      rate[f] = kInfinity;
      for (const size_t l : n.links_of[f]) rate[f] = std::min(rate[f], n.capacity[l]);
    }
    return rate;
  }
  std::vector<bool> fixed(flows, true);
  for (size_t f = 0; f < flows; ++f) {
    if (!active[f]) continue;
    rate[f] = kInfinity;
    fixed[f] = n.links_of[f].empty();
    for (const size_t l : n.links_of[f]) weight_on[l] += n.weight[f];
  }
  for (;;) {
    // The bottleneck: the link whose capacity left per unit of weight is least.
    size_t bottleneck = left.size();
    double level = kInfinity;
    for (size_t l = 0; l < left.size(); ++l) {
      if (weight_on[l] <= 0) continue;
      const double per_weight = std::max(0.0, left[l]) / weight_on[l];
      if (per_weight < level) {
        level = per_weight;
        bottleneck = l;
      }
    }
    if (bottleneck == left.size()) break;
    for (size_t f = 0; f < flows; ++f) {
      if (fixed[f]) continue;
      const auto& links = n.links_of[f];
      if (std::find(links.begin(), links.end(), bottleneck) == links.end()) continue;
      fixed[f] = true;
      rate[f] = level * n.weight[f];
      for (const size_t l : links) {
        left[l] -= rate[f];
        weight_on[l] -= n.weight[f];
      }
    }
    weight_on[bottleneck] = 0;  // rounding must not leave it in play
  }
  return rate;
}

}  // namespace

std::vector<double> fair_shares_bytes_per_s(const CostModel& cost, const std::vector<Flow>& flows) {
  std::vector<bool> active(flows.size());
  for (size_t f = 0; f < flows.size(); ++f) active[f] = flows[f].src != flows[f].dst;
  std::vector<double> rate = max_min(network_of(cost, flows), active);
  for (size_t f = 0; f < flows.size(); ++f) {
    if (!active[f]) rate[f] = kInfinity;
  }
  return rate;
}

std::vector<double> mean_rates_bytes_per_s(const CostModel& cost, const std::vector<Flow>& flows,
                                           const std::vector<double>& bytes) {
  const Network n = network_of(cost, flows);
  std::vector<bool> active(flows.size());
  std::vector<double> left = bytes, finish(flows.size(), 0), mean(flows.size(), kInfinity);
  size_t running = 0;
  for (size_t f = 0; f < flows.size(); ++f) {
    active[f] = flows[f].src != flows[f].dst && bytes[f] > 0;
    running += active[f];
  }
  if (!n.shared) {  // each flow alone on its links: its rate throughout
    const std::vector<double> rate = max_min(n, active);
    for (size_t f = 0; f < flows.size(); ++f) {
      if (active[f]) mean[f] = rate[f];
    }
    return mean;
  }
  double now = 0;
  while (running > 0) {
    const std::vector<double> rate = max_min(n, active);
    double step = kInfinity;
    for (size_t f = 0; f < flows.size(); ++f) {
      if (active[f]) step = std::min(step, rate[f] > 0 ? left[f] / rate[f] : kInfinity);
    }
    if (step == kInfinity) break;  // nothing limits them (no link of limited bandwidth)
    now += step;
    for (size_t f = 0; f < flows.size(); ++f) {
      if (!active[f]) continue;
      left[f] -= rate[f] * step;
      if (left[f] <= 1e-9 * bytes[f]) {  // done (to rounding): its link frees for the others
        active[f] = false;
        --running;
        finish[f] = now;
      }
    }
  }
  for (size_t f = 0; f < flows.size(); ++f) {
    if (finish[f] > 0) mean[f] = bytes[f] / finish[f];
  }
  return mean;
}

std::vector<Flow> collective_flows(const CostModel& cost, const CollectiveSpec& c) {
  std::vector<Flow> out;
  const size_t n = c.devices.size();
  if (n < 2) return out;
  switch (c.algorithm) {
    case CollectiveAlgorithm::ring:
      if (c.kind == CollectiveKind::broadcast || c.kind == CollectiveKind::reduce) {
        // A chain from the root (a reduce: from the root's successor round to the root).
        const size_t first = static_cast<size_t>(c.root) + (c.kind == CollectiveKind::reduce ? 1 : 0);
        for (size_t i = 0; i + 1 < n; ++i) out.push_back({c.devices[(first + i) % n], c.devices[(first + i + 1) % n]});
      } else {
        ring(c.devices, out);
      }
      break;
    case CollectiveAlgorithm::tree:
      for (size_t q = 1; q < n; ++q) {
        const bool all_reduce = c.kind == CollectiveKind::all_reduce;
        // An all-reduce's tree is in member order; a broadcast's or reduce's from its root.
        const auto member = [&](size_t at) { return c.devices[(all_reduce ? at : static_cast<size_t>(c.root) + at) % n]; };
        const int parent = member((q - 1) / 2), child = member(q);
        if (all_reduce || c.kind == CollectiveKind::broadcast) out.push_back({parent, child});
        if (all_reduce || c.kind == CollectiveKind::reduce) out.push_back({child, parent});
      }
      break;
    case CollectiveAlgorithm::hierarchical: {
      if (c.kind == CollectiveKind::all_to_all) {  // every pair of a node, then every pair of peers
        const std::vector<std::vector<int>> nodes = node_major_groups(c.devices, [&](int d) { return cost.node_of(d); });
        for (size_t i = 0; i < n; ++i) {
          for (size_t q = 0; q < n; ++q) {
            const bool local = cost.node_of(c.devices[i]) == cost.node_of(c.devices[q]);
            const bool peers = !nodes.empty() && i % nodes.front().size() == q % nodes.front().size();
            if (q != i && (nodes.empty() || local || peers)) out.push_back({c.devices[i], c.devices[q]});
          }
        }
        break;
      }
      // The cost model's shape: a ring on each node, then a ring across nodes per local
      // index. Its phases run one after the other; here their flows count together.
      std::vector<int> nodes;
      std::map<int, std::vector<int>> local;
      for (const int d : c.devices) {
        if (local.count(cost.node_of(d)) == 0) nodes.push_back(cost.node_of(d));
        local[cost.node_of(d)].push_back(d);
      }
      size_t k = 0;
      for (const auto& [node, group] : local) k = std::max(k, group.size());
      if (nodes.size() == 1 || k == 1) {
        ring(c.devices, out);
        break;
      }
      for (const auto& [node, group] : local) ring(group, out);
      for (size_t j = 0; j < k; ++j) {
        std::vector<int> across;
        for (const int node : nodes) across.push_back(local[node][std::min(j, local[node].size() - 1)]);
        ring(across, out);
      }
      break;
    }
    case CollectiveAlgorithm::pairwise:  // every ordered pair
      for (size_t i = 0; i < n; ++i) {
        for (size_t q = 0; q < n; ++q) {
          if (q != i) out.push_back({c.devices[i], c.devices[q]});
        }
      }
      break;
  }
  return out;
}

namespace {
// What a collective moves over each of its edges (a transfer: its bytes): a ring's steps'
// bytes (partition/cost_model.hpp), else its buffer, about what a chain's or tree's hop carries.
double edge_bytes(const CollectiveSpec& c) {
  const double n = static_cast<double>(c.devices.size());
  if (c.algorithm == CollectiveAlgorithm::pairwise && n >= 2) return c.bytes / n;  // a pair's part, even routing
  if (c.algorithm != CollectiveAlgorithm::ring || n < 2) return c.bytes;
  switch (c.kind) {
    case CollectiveKind::all_reduce: return 2 * (n - 1) / n * c.bytes;
    case CollectiveKind::reduce_scatter:
    case CollectiveKind::all_gather: return (n - 1) / n * c.bytes;
    default: return c.bytes;
  }
}
}  // namespace

int SharedPhase::add(const CollectiveSpec& c) {
  const std::vector<Flow> flows = collective_flows(cost_, c);
  items_.push_back(Item{c, false, flows_.size(), flows.size()});
  flows_.insert(flows_.end(), flows.begin(), flows.end());
  return static_cast<int>(items_.size()) - 1;
}

int SharedPhase::add_transfer(int src, int dst, double bytes) {
  CollectiveSpec c;
  c.devices = {src, dst};
  c.bytes = bytes;
  items_.push_back(Item{c, true, flows_.size(), src == dst ? 0U : 1U});
  if (src != dst) flows_.push_back({src, dst});
  return static_cast<int>(items_.size()) - 1;
}

std::vector<double> SharedPhase::times_s() const {
  std::vector<double> out;
  out.reserve(items_.size());
  if (!shared_) {
    for (const Item& item : items_) {
      const CollectiveSpec& c = item.collective;
      out.push_back(item.transfer ? cost_.transfer_time_s(c.devices[0], c.devices[1], c.bytes) : cost_.collective_time_s(c));
    }
    return out;
  }
  // Each flow moves its item's bytes per edge; one that finishes early frees its links for
  // the others (as a ring step's fast edges do while the slow one goes on). Where no link
  // carries two flows, each item has its routes to itself.
  if (!network_of(cost_, flows_).shared) {
    for (const Item& item : items_) {
      const CollectiveSpec& c = item.collective;
      out.push_back(item.transfer ? cost_.transfer_time_s(c.devices[0], c.devices[1], c.bytes) : cost_.collective_time_s(c));
    }
    return out;
  }
  std::vector<double> bytes(flows_.size());
  for (const Item& item : items_) {
    for (size_t f = item.first_flow; f < item.first_flow + item.flows; ++f) bytes[f] = edge_bytes(item.collective);
  }
  const std::vector<double> shares = mean_rates_bytes_per_s(cost_, flows_, bytes);
  EdgeBandwidths edges;
  for (const Item& item : items_) {
    edges.of_edge.clear();
    for (size_t f = item.first_flow; f < item.first_flow + item.flows; ++f) {
      const Flow& flow = flows_[f];
      // A pair twice in one collective (a tree's parent and child both ways are two pairs):
      // the first one's share.
      if (edges.of(flow.src, flow.dst, -1) < 0) edges.of_edge.push_back({{flow.src, flow.dst}, shares[f]});
    }
    const CollectiveSpec& c = item.collective;
    out.push_back(item.transfer ? cost_.transfer_time_s(c.devices[0], c.devices[1], c.bytes, &edges)
                                : cost_.collective_time_s(c, &edges));
  }
  return out;
}

}  // namespace hetflow::partition
