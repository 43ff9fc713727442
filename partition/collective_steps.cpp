#include "partition/collective_steps.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include "model/error.hpp"
#include "partition/ring_steps.hpp"

namespace hetflow::partition {

namespace {

using NodeOf = std::function<int(int)>;

size_t position(const std::vector<int>& group, int device) {
  return static_cast<size_t>(std::find(group.begin(), group.end(), device) - group.begin());
}

// A part of the buffer, as fractions of it.
struct Part {
  double begin = 0, end = 1;
  Part piece(size_t i, size_t n) const {
    const double w = end - begin;
    return {begin + w * static_cast<double>(i) / static_cast<double>(n),
            begin + w * static_cast<double>(i + 1) / static_cast<double>(n)};
  }
};

// `count` steps around the ring, `whole` cut into one piece per member: in step s the member
// at position p sends piece (p - s + shift) to the next member and receives piece
// (p - s - 1 + shift) from the previous one (adding it in when `reduce`). shift -1 with
// reduce is a reduce-scatter (position p ends with piece p summed); shift 0 without is an
// all-gather (position p starts owning piece p). Pieces are even, chunk_bytes each, or
// `parts` of the whole (shares adding up to 1), each n parts x chunk_bytes.
void ring(const std::vector<int>& group, int device, int count, double chunk_bytes, Lane channel,
          std::vector<Step>& steps, Part whole = {}, int shift = 0, bool reduce = false,
          const std::vector<double>& parts = {}) {
  const size_t n = group.size(), me = position(group, device);
  if (n < 2) return;
  const int next = group[(me + 1) % n], previous = group[(me + n - 1) % n];
  const std::vector<double> cuts = parts.empty() ? std::vector<double>{} : part_cuts(parts, n);
  const auto index_of = [&](long long index) {
    return static_cast<size_t>(((index % static_cast<long long>(n)) + static_cast<long long>(n)) % static_cast<long long>(n));
  };
  auto piece = [&](size_t i) {
    if (cuts.empty()) return whole.piece(i, n);
    const double w = whole.end - whole.begin;
    return Part{whole.begin + w * cuts[i], whole.begin + w * cuts[i + 1]};
  };
  const auto bytes = [&](size_t i) {
    return cuts.empty() ? chunk_bytes : chunk_bytes * static_cast<double>(n) * (cuts[i + 1] - cuts[i]);
  };
  for (int s = 0; s < count; ++s) {
    const long long p = static_cast<long long>(me) - s + shift;
    const size_t out_index = index_of(p);
    const Part out = piece(out_index), in = piece(index_of(p - 1));
    steps.push_back(Step{{{next, bytes(out_index), channel, out.begin, out.end, false}},
                         {{previous, 0, channel, in.begin, in.end, reduce}}});
  }
}

void reduce_scatter_ring(const std::vector<int>& group, int device, double chunk_bytes, Lane channel,
                         std::vector<Step>& steps, Part whole = {}, const std::vector<double>& parts = {}) {
  ring(group, device, static_cast<int>(group.size()) - 1, chunk_bytes, channel, steps, whole, -1, true, parts);
}
void all_gather_ring(const std::vector<int>& group, int device, double chunk_bytes, Lane channel,
                     std::vector<Step>& steps, Part whole = {}, const std::vector<double>& parts = {}) {
  ring(group, device, static_cast<int>(group.size()) - 1, chunk_bytes, channel, steps, whole, 0, false, parts);
}

// The buffer in K chunks from `upstream` to `downstream`: step j takes chunk j from every
// upstream member while sending chunk j-1 to every downstream member, so chunks overlap along
// the way (K+1 steps in the middle of the pipeline, K at its ends).
void pipeline(const std::vector<int>& upstream, const std::vector<int>& downstream, double bytes, Lane channel,
              std::vector<Step>& steps, bool reduce) {
  const double chunk = bytes / kPipelineChunks;
  const Part whole;
  for (int j = 0; j <= kPipelineChunks; ++j) {
    Step step;
    if (j < kPipelineChunks) {
      const Part in = whole.piece(static_cast<size_t>(j), kPipelineChunks);
      for (int u : upstream) step.receives.push_back({u, 0, channel, in.begin, in.end, reduce});
    }
    if (j > 0) {
      const Part out = whole.piece(static_cast<size_t>(j - 1), kPipelineChunks);
      for (int d : downstream) step.sends.push_back({d, chunk, channel, out.begin, out.end, false});
    }
    if (!step.sends.empty() || !step.receives.empty()) steps.push_back(std::move(step));
  }
}

// The members starting `offset` places after the root, along the ring order.
std::vector<int> from_root(const CollectiveSpec& c, size_t offset) {
  const size_t n = c.devices.size();
  std::vector<int> order;
  for (size_t i = 0; i < n; ++i) order.push_back(c.devices[(static_cast<size_t>(c.root) + offset + i) % n]);
  return order;
}

// A binary tree laid over `order` in heap order: position q's children are 2q+1 and 2q+2.
struct TreeLinks {
  std::vector<int> parent;  // empty at the root
  std::vector<int> children;
};

TreeLinks tree_links(const std::vector<int>& order, int device) {
  const size_t n = order.size(), q = position(order, device);
  TreeLinks links;
  if (q > 0) links.parent.push_back(order[(q - 1) / 2]);
  for (size_t child : {2 * q + 1, 2 * q + 2}) {
    if (child < n) links.children.push_back(order[child]);
  }
  return links;
}

// A chain along `order` is a tree with one child each: the predecessor is the parent.
TreeLinks chain_links(const std::vector<int>& order, int device) {
  const size_t n = order.size(), q = position(order, device);
  TreeLinks links;
  if (q > 0) links.parent.push_back(order[q - 1]);
  if (q + 1 < n) links.children.push_back(order[q + 1]);
  return links;
}

// Reduce up the tree and broadcast down, one chunk at a time in each direction.
void tree_all_reduce(const std::vector<int>& group, int device, double bytes, std::vector<Step>& steps) {
  const double chunk = bytes / kPipelineChunks;
  const TreeLinks links = tree_links(group, device);
  const Part whole;
  for (int k = 0; k < kPipelineChunks; ++k) {  // reduce: gather the children's chunk, pass it up
    const Part part = whole.piece(static_cast<size_t>(k), kPipelineChunks);
    Step gather;
    for (int c : links.children) gather.receives.push_back({c, 0, Lane::tree, part.begin, part.end, true});
    if (!gather.receives.empty()) steps.push_back(gather);
    for (int p : links.parent) steps.push_back(Step{{{p, chunk, Lane::tree, part.begin, part.end, false}}, {}});
  }
  for (int k = 0; k < kPipelineChunks; ++k) {  // broadcast: take the chunk from above, pass it down
    const Part part = whole.piece(static_cast<size_t>(k), kPipelineChunks);
    for (int p : links.parent) steps.push_back(Step{{}, {{p, 0, Lane::tree, part.begin, part.end, false}}});
    Step scatter;
    for (int c : links.children) scatter.sends.push_back({c, chunk, Lane::tree, part.begin, part.end, false});
    if (!scatter.sends.empty()) steps.push_back(scatter);
  }
}

// The hierarchical algorithms' two rings for one device: the members on its node, and its
// peers (the members with its local index, one per node that has one, in the group's order).
struct NodeRings {
  std::vector<int> local, peers;
};

NodeRings node_rings(const std::vector<int>& group, int device, const NodeOf& node_of) {
  std::vector<int> nodes;  // in order of first appearance in the group
  std::map<int, std::vector<int>> local;
  for (int d : group) {
    const int node = node_of(d);
    if (local.count(node) == 0) nodes.push_back(node);
    local[node].push_back(d);
  }
  NodeRings rings;
  rings.local = local[node_of(device)];
  const size_t local_index = position(rings.local, device);
  for (int node : nodes) {
    const std::vector<int>& members = local[node];
    if (members.size() > local_index) rings.peers.push_back(members[local_index]);
  }
  return rings;
}

void hierarchical(const CollectiveSpec& c, int device, const NodeOf& node_of, std::vector<Step>& steps) {
  const NodeRings rings = node_rings(c.devices, device, node_of);
  const int k = static_cast<int>(rings.local.size()), m = static_cast<int>(rings.peers.size());
  const double slice = c.bytes / k, piece = c.bytes / k / m;  // one member's share on its node, and across nodes
  // The intra-node rings cut the whole buffer; the peers' rings the slice of their local index.
  const Part mine = Part{}.piece(position(rings.local, device), static_cast<size_t>(k));
  switch (c.kind) {
    case CollectiveKind::all_reduce:
      reduce_scatter_ring(rings.local, device, slice, Lane::intra_scatter, steps);
      reduce_scatter_ring(rings.peers, device, piece, Lane::inter_ring, steps, mine);
      all_gather_ring(rings.peers, device, piece, Lane::inter_ring, steps, mine);
      all_gather_ring(rings.local, device, slice, Lane::intra_gather, steps);
      break;
    case CollectiveKind::reduce_scatter:
      reduce_scatter_ring(rings.local, device, slice, Lane::intra_scatter, steps);
      reduce_scatter_ring(rings.peers, device, piece, Lane::inter_ring, steps, mine);
      break;
    case CollectiveKind::all_gather:
      all_gather_ring(rings.peers, device, piece, Lane::inter_ring, steps, mine);
      all_gather_ring(rings.local, device, slice, Lane::intra_gather, steps);
      break;
    case CollectiveKind::broadcast:
    case CollectiveKind::reduce:
    case CollectiveKind::all_to_all:
    case CollectiveKind::sendrecv:
      break;  // refused by check_collective
  }
}

void ring_kind(const CollectiveSpec& c, int device, std::vector<Step>& steps) {
  const int n = static_cast<int>(c.devices.size());
  switch (c.kind) {
    case CollectiveKind::all_reduce:
      reduce_scatter_ring(c.devices, device, c.bytes / n, Lane::ring, steps);
      all_gather_ring(c.devices, device, c.bytes / n, Lane::ring, steps);
      break;
    case CollectiveKind::reduce_scatter:
      reduce_scatter_ring(c.devices, device, c.bytes / n, Lane::ring, steps, {}, c.parts);
      break;
    case CollectiveKind::all_gather:
      all_gather_ring(c.devices, device, c.bytes / n, Lane::ring, steps, {}, c.parts);
      break;
    case CollectiveKind::broadcast: {
      const TreeLinks chain = chain_links(from_root(c, 0), device);
      pipeline(chain.parent, chain.children, c.bytes, Lane::chain, steps, false);
      break;
    }
    case CollectiveKind::reduce: {  // from the root's successor round to the root
      const TreeLinks chain = chain_links(from_root(c, 1), device);
      pipeline(chain.parent, chain.children, c.bytes, Lane::chain, steps, true);
      break;
    }
    case CollectiveKind::sendrecv:  // the whole buffer to the next member, the previous one's into it
      if (n >= 2) {
        const size_t me = position(c.devices, device);
        steps.push_back(Step{{{c.devices[(me + 1) % static_cast<size_t>(n)], c.bytes, Lane::ring, 0, 1, false}},
                             {{c.devices[(me + static_cast<size_t>(n) - 1) % static_cast<size_t>(n)], 0, Lane::ring, 0, 1, false}}});
      }
      break;
    case CollectiveKind::all_to_all:
      break;  // refused by check_collective
  }
}

// Every pair directly, at once: the sender's part q (the shares before it to its own) to
// member q, which keeps it as its output's piece of the sender's index.
void pairwise_all_to_all(const CollectiveSpec& c, int device, std::vector<Step>& steps) {
  const size_t n = c.devices.size(), me = position(c.devices, device);
  std::vector<double> start(n + 1, 0.0);  // where each member's part begins in a sender's buffer
  for (size_t q = 0; q < n; ++q) start[q + 1] = start[q] + all_to_all_part(c, q);
  Step step;
  for (size_t j = 1; j < n; ++j) {
    const size_t to = (me + j) % n, from = (me + n - j) % n;
    step.sends.push_back({c.devices[to], c.bytes * all_to_all_part(c, to), Lane::meet, start[to], start[to + 1], false});
    const Part in = Part{}.piece(from, n);
    step.receives.push_back({c.devices[from], 0, Lane::meet, in.begin, in.end, false});
  }
  steps.push_back(std::move(step));
}

}  // namespace

std::vector<std::vector<int>> node_major_groups(const std::vector<int>& group, const NodeOf& node_of) {
  std::vector<std::vector<int>> nodes;
  for (int d : group) {
    if (nodes.empty() || node_of(nodes.back().front()) != node_of(d)) {
      for (const std::vector<int>& earlier : nodes) {
        if (node_of(earlier.front()) == node_of(d)) return {};  // a node's members not together
      }
      nodes.emplace_back();
    }
    nodes.back().push_back(d);
  }
  for (const std::vector<int>& node : nodes) {
    if (node.size() != nodes.front().size()) return {};
  }
  return nodes;
}

namespace {

// Inside each node, then across (collective_steps.hpp). Slot i of n is member i's piece:
// after the first phase member (a, l) holds in slot (b, l'') what (a, l'') sends (b, l), so
// the k slots of node b go to peer (b, l) in one message, into the slots it sent away.
void hierarchical_all_to_all(const CollectiveSpec& c, int device, const NodeOf& node_of, std::vector<Step>& steps) {
  const std::vector<std::vector<int>> nodes = node_major_groups(c.devices, node_of);
  if (nodes.size() < 2 || nodes.front().size() < 2) {
    pairwise_all_to_all(c, device, steps);
    return;
  }
  const size_t m = nodes.size(), k = nodes.front().size(), n = m * k, me = position(c.devices, device);
  const size_t a = me / k, l = me % k;
  std::vector<double> start(n + 1, 0.0);
  for (size_t q = 0; q < n; ++q) start[q + 1] = start[q] + all_to_all_part(c, q);
  const auto slot = [n](size_t i) { return Part{}.piece(i, n); };
  Step inside;
  for (size_t other = 0; other < k; ++other) {
    if (other == l) continue;
    for (size_t b = 0; b < m; ++b) {
      const size_t q = b * k + other;  // bound for local index `other` on node b
      inside.sends.push_back({c.devices[a * k + other], c.bytes * all_to_all_part(c, q), Lane::intra_scatter, start[q],
                              start[q + 1], false});
      const Part in = slot(b * k + other);  // from (a, other), bound for (b, l)
      inside.receives.push_back({c.devices[a * k + other], 0, Lane::intra_scatter, in.begin, in.end, false});
    }
  }
  steps.push_back(std::move(inside));
  Step across;
  for (size_t b = 0; b < m; ++b) {
    if (b == a) continue;
    const Part region{slot(b * k).begin, slot(b * k + k - 1).end};  // node b's k slots
    across.sends.push_back({c.devices[b * k + l], static_cast<double>(k) * c.bytes * all_to_all_part(c, b * k + l),
                            Lane::inter_ring, region.begin, region.end, false});
    across.receives.push_back({c.devices[b * k + l], 0, Lane::inter_ring, region.begin, region.end, false});
  }
  steps.push_back(std::move(across));
}

void tree_kind(const CollectiveSpec& c, int device, std::vector<Step>& steps) {
  switch (c.kind) {
    case CollectiveKind::all_reduce:
      tree_all_reduce(c.devices, device, c.bytes, steps);
      break;
    case CollectiveKind::broadcast: {
      const TreeLinks links = tree_links(from_root(c, 0), device);
      pipeline(links.parent, links.children, c.bytes, Lane::tree, steps, false);
      break;
    }
    case CollectiveKind::reduce: {
      const TreeLinks links = tree_links(from_root(c, 0), device);
      pipeline(links.children, links.parent, c.bytes, Lane::tree, steps, true);
      break;
    }
    case CollectiveKind::reduce_scatter:
    case CollectiveKind::all_gather:
    case CollectiveKind::all_to_all:
    case CollectiveKind::sendrecv:
      break;  // refused by check_collective
  }
}

}  // namespace

std::vector<Step> coalesced_all_to_all(const CollectiveSpec& c, int device, const NodeOf& node_of) {
  if (c.kind != CollectiveKind::all_to_all || c.devices.size() < 2) return {};
  const std::vector<std::vector<int>> nodes = node_major_groups(c.devices, node_of);
  if (nodes.empty()) return {};
  const size_t m = nodes.size(), k = nodes.front().size(), n = m * k, me = position(c.devices, device);
  if (me == n) throw Error("coalesced_all_to_all: device " + std::to_string(device) + " is not a member");
  const bool hierarchical = c.algorithm == CollectiveAlgorithm::hierarchical && m >= 2 && k >= 2;
  const auto p = [&](size_t node, size_t local) { return all_to_all_part(c, node * k + local); };
  std::vector<double> column(k, 0.0), row(m, 0.0);  // parts bound for a local index on every node; for a node
  for (size_t b = 0; b < m; ++b) {
    for (size_t o = 0; o < k; ++o) {
      column[o] += p(b, o);
      row[b] += p(b, o);
    }
  }
  // What member (a, l) sends inside its node and across, as parts of its buffer; what it
  // receives so is what its predecessor that way must send for the flows to be exact.
  struct Ways {
    double inside_sent, inside_received, across_sent, across_received;
  };
  const auto ways = [&](size_t a, size_t l) -> Ways {
    if (hierarchical) {  // collective_steps' phases: columns to the node's others, then k parts a peer
      return {1 - column[l], static_cast<double>(k - 1) * column[l], static_cast<double>(k) * (column[l] - p(a, l)),
              static_cast<double>(k * (m - 1)) * p(a, l)};
    }
    return {row[a] - p(a, l), static_cast<double>(k - 1) * p(a, l), 1 - row[a], static_cast<double>(n - k) * p(a, l)};
  };
  // Every member decides alike: the flows are exact for all of them, or none coalesces.
  const auto alike = [](double x, double y) { return std::abs(x - y) <= 1e-9 * std::max({1.0, x, y}); };
  for (size_t a = 0; a < m; ++a) {
    for (size_t l = 0; l < k; ++l) {
      const Ways here = ways(a, l), inside_next = ways(a, (l + 1) % k), across_next = ways((a + 1) % m, l);
      if (k >= 2 && !alike(here.inside_sent, inside_next.inside_received)) return {};
      if (m >= 2 && !alike(here.across_sent, across_next.across_received)) return {};
    }
  }
  const size_t a = me / k, l = me % k;
  const Ways mine = ways(a, l);
  Step inside, across;
  if (k >= 2) {
    inside.sends.push_back({c.devices[a * k + (l + 1) % k], c.bytes * mine.inside_sent, Lane::intra_scatter, 0, 0, false});
    inside.receives.push_back({c.devices[a * k + (l + k - 1) % k], 0, Lane::intra_scatter, 0, 0, false});
  }
  if (m >= 2) {
    Step& step = hierarchical ? across : inside;
    step.sends.push_back({c.devices[(a + 1) % m * k + l], c.bytes * mine.across_sent, Lane::inter_ring, 0, 0, false});
    step.receives.push_back({c.devices[(a + m - 1) % m * k + l], 0, Lane::inter_ring, 0, 0, false});
  }
  std::vector<Step> steps{std::move(inside)};
  if (hierarchical) steps.push_back(std::move(across));
  return steps;
}

std::vector<Step> collective_steps(const CollectiveSpec& c, int device, const NodeOf& node_of) {
  check_collective(c);
  if (position(c.devices, device) == c.devices.size()) {
    throw Error("collective_steps: device " + std::to_string(device) + " is not a member");
  }
  std::vector<Step> steps;
  if (c.devices.size() < 2 || c.bytes <= 0) {
    ring(c.devices, device, 1, 0, Lane::meet, steps, Part{0, 0});
    return steps;
  }
  if (c.messages > 1) {
    // One message's steps over each m-th of the buffer in turn: the i-th m-th of the whole
    // buffer, or for a reduce-scatter or all-gather the i-th m-th of every member's part
    // (a message over several parts becomes one message per part, in order, on its lane).
    CollectiveSpec one = c;
    one.messages = 1;
    one.bytes = c.bytes / c.messages;
    const std::vector<Step> each = collective_steps(one, device, node_of);
    const double m = c.messages, n = static_cast<double>(c.devices.size());
    const bool by_part = c.kind == CollectiveKind::reduce_scatter || c.kind == CollectiveKind::all_gather;
    const std::vector<double> cuts = by_part && !c.parts.empty() ? part_cuts(c.parts, c.devices.size()) : std::vector<double>{};
    const auto add = [&](const Message& msg, int i, std::vector<Message>& out) {
      // An all-to-all's message of one part: its i-th m-th; of node b's slots (hierarchical,
      // across): the i-th m-th of each slot, as a reduce-scatter's of each member's part.
      if (c.kind == CollectiveKind::all_to_all && msg.lane != Lane::inter_ring) {
        Message part = msg;
        part.begin = msg.begin + (msg.end - msg.begin) * i / m;
        part.end = msg.begin + (msg.end - msg.begin) * (i + 1) / m;
        out.push_back(part);
        return;
      }
      if (!by_part && c.kind != CollectiveKind::all_to_all) {
        Message part = msg;
        part.begin = (i + msg.begin) / m;
        part.end = (i + msg.end) / m;
        out.push_back(part);
        return;
      }
      for (double b = msg.begin; b < msg.end;) {
        // The member part b lies in, [from, to): of it the i-th m-th.
        double from = 0, to = 0, shift = 0;  // shift: i x the part's width
        if (cuts.empty()) {  // (even: k / n)
          const double k = std::min(n - 1, std::floor(b * n + 1e-9));
          from = k / n, to = (k + 1) / n, shift = i / n;
        } else {
          const auto k = static_cast<size_t>(std::upper_bound(cuts.begin() + 1, cuts.end() - 1, b + 1e-12) - cuts.begin() - 1);
          from = cuts[k], to = cuts[k + 1], shift = i * (to - from);
        }
        const double end = std::min(msg.end, to);
        Message part = msg;
        part.begin = from + (b - from + shift) / m;
        part.end = from + (end - from + shift) / m;
        if (msg.end > msg.begin) part.bytes = msg.bytes * (end - b) / (msg.end - msg.begin);
        out.push_back(part);
        if (!(end > b)) break;  // (a part of no width: nothing further)
        b = end;
      }
    };
    steps.reserve(each.size() * static_cast<size_t>(c.messages));
    for (int i = 0; i < c.messages; ++i) {
      for (const Step& s : each) {
        Step& step = steps.emplace_back();
        for (const Message& msg : s.sends) add(msg, i, step.sends);
        for (const Message& msg : s.receives) add(msg, i, step.receives);
      }
    }
    return steps;
  }
  switch (c.algorithm) {
    case CollectiveAlgorithm::ring:
      ring_kind(c, device, steps);
      break;
    case CollectiveAlgorithm::tree:
      tree_kind(c, device, steps);
      break;
    case CollectiveAlgorithm::hierarchical:
      if (c.kind == CollectiveKind::all_to_all) {
        hierarchical_all_to_all(c, device, node_of, steps);
      } else {
        hierarchical(c, device, node_of, steps);
      }
      break;
    case CollectiveAlgorithm::pairwise:
      pairwise_all_to_all(c, device, steps);
      break;
  }
  return steps;
}

std::optional<RingSteps> ring_steps(const CollectiveSpec& c, int device) { return ring_steps(c, c.devices, device); }

std::optional<RingSteps> ring_steps(const CollectiveSpec& c, const std::vector<int>& devices, int device) {
  if (!c.parts.empty()) return std::nullopt;  // uneven parts: steps of different sizes (collective_steps checks them)
  check_collective(c);
  const size_t n = devices.size(), me = position(devices, device);
  if (n > 0 && static_cast<size_t>(c.root) >= n) {
    throw Error(std::string(to_string(c.kind)) + ": root " + std::to_string(c.root) + " is not an index into its " +
                std::to_string(n) + " participants");
  }
  if (me == n) throw Error("ring_steps: device " + std::to_string(device) + " is not a member");
  const bool ring_kind = c.kind == CollectiveKind::all_reduce || c.kind == CollectiveKind::reduce_scatter ||
                         c.kind == CollectiveKind::all_gather;
  if (c.algorithm != CollectiveAlgorithm::ring || !ring_kind || c.messages > 1 || n < 2 || c.bytes <= 0) {
    return std::nullopt;
  }
  // ring_kind() above: n - 1 steps per reduce-scatter or all-gather, both for an all-reduce.
  const int count = static_cast<int>(n - 1) * (c.kind == CollectiveKind::all_reduce ? 2 : 1);
  return RingSteps{count, c.bytes / static_cast<double>(n), devices[(me + 1) % n], devices[(me + n - 1) % n], Lane::ring};
}

double bytes_sent(const CollectiveSpec& c, int device, const NodeOf& node_of) {
  double total = 0;
  if (const std::optional<RingSteps> ring = ring_steps(c, device)) {
    for (int s = 0; s < ring->count; ++s) total += ring->bytes;  // summed as the steps are, in turn
    return total;
  }
  for (const Step& step : collective_steps(c, device, node_of)) {
    for (const Message& m : step.sends) total += m.bytes;
  }
  return total;
}

std::pair<double, double> member_part(const CollectiveSpec& c, int device, const NodeOf& node_of) {
  const size_t i = position(c.devices, device), n = c.devices.size();
  if (i == n) throw Error("member_part: device " + std::to_string(device) + " is not a member");
  Part part = Part{}.piece(i, n);
  if (!c.parts.empty() && c.kind != CollectiveKind::all_to_all) {
    const std::vector<double> cuts = part_cuts(c.parts, n);
    part = {cuts[i], cuts[i + 1]};
  }
  if (c.algorithm == CollectiveAlgorithm::hierarchical && n > 1) {
    const NodeRings rings = node_rings(c.devices, device, node_of);
    part = Part{}.piece(position(rings.local, device), rings.local.size()).piece(position(rings.peers, device),
                                                                              rings.peers.size());
  }
  return {part.begin, part.end};
}

}  // namespace hetflow::partition
