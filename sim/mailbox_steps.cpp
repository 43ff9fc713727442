#include "sim/mailbox_steps.hpp"

#include <algorithm>
#include <optional>
#include <set>
#include <string>

#include "model/error.hpp"
#include "partition/collective_steps.hpp"
#include "partition/estimate.hpp"
#include "partition/ring_steps.hpp"

namespace hetflow::sim {

namespace sg = simgrid::s4u;
using partition::Collective;
using partition::Message;
using partition::Step;
using partition::Task;

namespace {

// A collective's mailbox is "src>dst|lane/stream": whatever tag a plan gives a channel
// ("src>dst:tag"), it never names a collective's mailbox.
sg::Mailbox* mailbox(int src, int dst, const std::string& lane_and_stream) {
  return sg::Mailbox::by_name(std::to_string(src) + ">" + std::to_string(dst) + "|" + lane_and_stream);
}

}  // namespace

MailboxSteps::MailboxSteps(const partition::Plan& plan, const partition::CostModel& cost, const Platform& platform,
                           bool coalesce_rings, bool coalesce_all_to_all)
    : plan_(plan), cost_(cost), platform_(platform), coalesce_rings_(coalesce_rings),
      coalesce_all_to_all_(coalesce_all_to_all) {}

const MailboxSteps::RingHops& MailboxSteps::ring_hops(size_t collective) const {
  if (ring_hops_.size() != plan_.collectives.size()) ring_hops_.assign(plan_.collectives.size(), RingHops{});
  RingHops& h = ring_hops_[collective];
  if (!h.known) {
    const std::vector<int>& ring = plan_.members(plan_.collectives[collective]);
    const partition::Route first = cost_.route(ring[0], ring[1 % ring.size()]);
    h = {true, true, first.latency_s, first.bandwidth_bytes_per_s};
    for (size_t i = 0; i < ring.size() && ring.size() > 1; ++i) {
      const partition::Route r = cost_.route(ring[i], ring[(i + 1) % ring.size()]);
      h.uniform = h.uniform && r.latency_s == first.latency_s && r.bandwidth_bytes_per_s == first.bandwidth_bytes_per_s;
      h.latency_s = std::max(h.latency_s, r.latency_s);
      h.bandwidth_bytes_per_s = std::min(h.bandwidth_bytes_per_s, r.bandwidth_bytes_per_s);
    }
  }
  return h;
}

// Whether two of the ring's hops cross one link (a node's one NIC, a shared PCIe uplink):
// such a link is shared step by step between equal messages, which one transfer per member
// does not reproduce. Read from SimGrid's routes, so only asked of rings whose members all
// have hosts (never of a folded plan's rings across replicas).
bool MailboxSteps::ring_shares_a_link(size_t collective) const {
  if (ring_shares_.size() != plan_.collectives.size()) ring_shares_.assign(plan_.collectives.size(), -1);
  signed char& shares = ring_shares_[collective];
  if (shares < 0) {
    shares = 0;
    const std::vector<int>& ring = plan_.members(plan_.collectives[collective]);
    std::set<const sg::Link*> used;
    for (size_t i = 0; i < ring.size() && ring.size() > 1; ++i) {
      std::vector<sg::Link*> links;
      double latency = 0;
      platform_.hosts[static_cast<size_t>(ring[i])]->route_to(platform_.hosts[static_cast<size_t>(ring[(i + 1) % ring.size()])],
                                                             links, &latency);
      for (const sg::Link* l : links) shares = static_cast<signed char>(!used.insert(l).second || shares);
    }
  }
  return shares > 0;
}

// A collective's steps for one participant, each message on the mailbox of its phase's
// channel between the two devices, scoped by the task's stream (validation puts every
// participant of a collective on the same stream) so that collectives on different
// streams never match each other's messages.
std::vector<MailboxStep> MailboxSteps::of(const Collective& c, const Task& t) const {
  // A collective of m messages runs as one message of all the bytes after the other m - 1
  // rounds' latencies on a timer: the cost model's time (m rounds of steps, the same bytes)
  // without m times the events (a chunk's per-layer all-reduces are dozens of rounds).
  const int rounds = c.messages;
  // A ring run as one transfer needs its steps' number, bytes and peers, not their list: n
  // members listing 2(n-1) steps each (or copying the n members) is quadratic in time, and
  // in memory too, as every member holds its list across the mailbox look-ups (simcalls).
  const bool folded = c.tasks.size() < plan_.members(c).size();
  const std::optional<partition::RingSteps> ring = partition::ring_steps(
      partition::CollectiveSpec{c.kind, c.algorithm, {}, c.bytes, c.root, 1, c.parts}, plan_.members(c), t.device);
  // (A folded ring of one step, two replicas' reduce-scatter, is one transfer too.)
  const bool one_transfer = ring && (folded || (ring->count > 1 && coalesce_rings_ &&
                                                !ring_shares_a_link(static_cast<size_t>(t.collective))));
  std::vector<Step> steps;
  if (!one_transfer) {
    partition::CollectiveSpec spec = partition::collective_spec(plan_, c);
    spec.messages = 1;
    const auto node_of = [this](int d) { return cost_.node_of(d); };
    // An all-to-all as two flows a member where that is exact (SimOptions::coalesce_all_to_all):
    // its n (n - 1) pairs' events are what large expert groups cost.
    if (coalesce_all_to_all_ && !folded) steps = partition::coalesced_all_to_all(spec, t.device, node_of);
    if (steps.empty()) steps = partition::collective_steps(spec, t.device, node_of);
  }
  const std::string scope = std::to_string(t.stream);
  struct Known {
    int peer;
    partition::Lane lane;
    bool send;
    sg::Mailbox* mailbox;
  };
  std::vector<Known> known;  // a collective uses a handful of mailboxes: look each up once
  auto box = [&](const Message& m, bool send) {
    for (const Known& k : known) {
      if (k.peer == m.peer && k.lane == m.lane && k.send == send) return k.mailbox;
    }
    const std::string tag = std::to_string(static_cast<int>(m.lane)) + "/" + scope;
    sg::Mailbox* found = send ? mailbox(t.device, m.peer, tag) : mailbox(m.peer, t.device, tag);
    known.push_back({m.peer, m.lane, send, found});
    return found;
  };
  std::vector<MailboxStep> out;
  if (rounds > 1) {
    double round_latency_s = 0;  // a step waits for its slowest message
    if (one_transfer) {
      const double latency_s =
          std::max(std::max(0.0, cost_.route(t.device, ring->next).latency_s), cost_.route(ring->previous, t.device).latency_s);
      for (int i = 0; i < ring->count; ++i) round_latency_s += latency_s;
    }
    for (const Step& step : steps) {
      double latency_s = 0;
      for (const Message& m : step.sends) latency_s = std::max(latency_s, cost_.route(t.device, m.peer).latency_s);
      for (const Message& m : step.receives) latency_s = std::max(latency_s, cost_.route(m.peer, t.device).latency_s);
      round_latency_s += latency_s;
    }
    MailboxStep wait;
    wait.delay_s = (rounds - 1) * round_latency_s;
    out.push_back(wait);
  }
  // A ring member coalesced or standing for its replicas (folded): the steps' latencies but
  // one on a timer, then all their bytes in one step, paced by the ring's slowest hop.
  if (one_transfer) {
    const RingHops& hops = ring_hops(static_cast<size_t>(t.collective));
    double bytes = 0;
    for (int i = 0; i < ring->count; ++i) bytes += ring->bytes;  // summed as the steps' are
    MailboxStep wait;
    wait.delay_s = static_cast<double>(ring->count - 1) * hops.latency_s;
    out.push_back(wait);
    MailboxStep transfer;
    if (folded) {
      // A folded plan's collective across replicas: this member stands for every replica's,
      // all alike: the flows from its predecessor and to its successor that no actor on the
      // replicas' devices posts. Between members with tasks of their own (a context or an
      // expert group's workers are all simulated) the data goes as in a plan not folded:
      // put by the sender, awaited by the receiver.
      const auto& members = plan_.members(c);
      const auto simulated = [&](int device) {
        return static_cast<size_t>(std::find(members.begin(), members.end(), device) - members.begin()) < c.tasks.size();
      };
      if (simulated(ring->previous)) {
        transfer.gets.push_back(box(Message{ring->previous, 0, ring->lane}, false));
      } else {
        transfer.flows.push_back({ring->previous, t.device, bytes});
      }
      if (simulated(ring->next)) {
        transfer.puts.emplace_back(box(Message{ring->next, ring->bytes, ring->lane}, true), bytes);
      } else {
        transfer.flows.push_back({t.device, ring->next, bytes});
      }
    } else {
      // One communication to the successor with all the steps' bytes (SimOptions::coalesce_rings).
      transfer.puts.emplace_back(box(Message{ring->next, ring->bytes, ring->lane}, true), bytes);
      transfer.gets.push_back(box(Message{ring->previous, 0, ring->lane}, false));
    }
    if (!hops.uniform) transfer.rate_cap = hops.bandwidth_bytes_per_s;
    out.push_back(std::move(transfer));
    return out;
  }
  if (folded) {
    throw PlanError("collective " + std::to_string(t.collective) +
                    " of a folded plan is not a ring all-reduce, reduce-scatter or all-gather");
  }
  out.reserve(steps.size());
  for (const Step& step : steps) {
    MailboxStep posted;
    for (const Message& m : step.sends) posted.puts.emplace_back(box(m, true), m.bytes);
    for (const Message& m : step.receives) posted.gets.push_back(box(m, false));
    out.push_back(std::move(posted));
  }
  return out;
}

}  // namespace hetflow::sim
