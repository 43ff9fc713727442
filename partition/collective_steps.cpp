#include "partition/collective_steps.hpp"

#include <algorithm>
#include <map>
#include <string>

#include "model/error.hpp"

namespace hetflow::partition {

namespace {

using NodeOf = std::function<int(int)>;

size_t position(const std::vector<int>& group, int device) {
  return static_cast<size_t>(std::find(group.begin(), group.end(), device) - group.begin());
}

// `count` steps: send `chunk_bytes` to the next member while receiving from the previous.
void ring(const std::vector<int>& group, int device, int count, double chunk_bytes, Channel channel,
          std::vector<Step>& steps) {
  const size_t n = group.size(), me = position(group, device);
  if (n < 2) return;
  const int next = group[(me + 1) % n], previous = group[(me + n - 1) % n];
  for (int s = 0; s < count; ++s) steps.push_back(Step{{{next, chunk_bytes, channel}}, {{previous, 0, channel}}});
}

// The buffer in K chunks from `upstream` to `downstream`: step j takes chunk j from every
// upstream member while sending chunk j-1 to every downstream member, so chunks overlap along
// the way (K+1 steps in the middle of the pipeline, K at its ends).
void pipeline(const std::vector<int>& upstream, const std::vector<int>& downstream, double bytes, Channel channel,
              std::vector<Step>& steps) {
  const double chunk = bytes / kPipelineChunks;
  for (int j = 0; j <= kPipelineChunks; ++j) {
    Step step;
    if (j < kPipelineChunks) {
      for (int u : upstream) step.receives.push_back({u, 0, channel});
    }
    if (j > 0) {
      for (int d : downstream) step.sends.push_back({d, chunk, channel});
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
  for (int k = 0; k < kPipelineChunks; ++k) {  // reduce: gather the children's chunk, pass it up
    Step gather;
    for (int c : links.children) gather.receives.push_back({c, 0, Channel::tree});
    if (!gather.receives.empty()) steps.push_back(gather);
    for (int p : links.parent) steps.push_back(Step{{{p, chunk, Channel::tree}}, {}});
  }
  for (int k = 0; k < kPipelineChunks; ++k) {  // broadcast: take the chunk from above, pass it down
    for (int p : links.parent) steps.push_back(Step{{}, {{p, 0, Channel::tree}}});
    Step scatter;
    for (int c : links.children) scatter.sends.push_back({c, chunk, Channel::tree});
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
  switch (c.kind) {
    case CollectiveKind::all_reduce:
      ring(rings.local, device, k - 1, slice, Channel::intra_scatter, steps);
      ring(rings.peers, device, 2 * (m - 1), piece, Channel::inter_ring, steps);
      ring(rings.local, device, k - 1, slice, Channel::intra_gather, steps);
      break;
    case CollectiveKind::reduce_scatter:
      ring(rings.local, device, k - 1, slice, Channel::intra_scatter, steps);
      ring(rings.peers, device, m - 1, piece, Channel::inter_ring, steps);
      break;
    case CollectiveKind::all_gather:
      ring(rings.peers, device, m - 1, piece, Channel::inter_ring, steps);
      ring(rings.local, device, k - 1, slice, Channel::intra_gather, steps);
      break;
    case CollectiveKind::broadcast:
    case CollectiveKind::reduce:
      break;  // refused by check_collective
  }
}

void ring_kind(const CollectiveSpec& c, int device, std::vector<Step>& steps) {
  const int n = static_cast<int>(c.devices.size());
  switch (c.kind) {
    case CollectiveKind::all_reduce:
      ring(c.devices, device, 2 * (n - 1), c.bytes / n, Channel::ring, steps);
      break;
    case CollectiveKind::reduce_scatter:
    case CollectiveKind::all_gather:
      ring(c.devices, device, n - 1, c.bytes / n, Channel::ring, steps);
      break;
    case CollectiveKind::broadcast: {
      const TreeLinks chain = chain_links(from_root(c, 0), device);
      pipeline(chain.parent, chain.children, c.bytes, Channel::chain, steps);
      break;
    }
    case CollectiveKind::reduce: {  // from the root's successor round to the root
      const TreeLinks chain = chain_links(from_root(c, 1), device);
      pipeline(chain.parent, chain.children, c.bytes, Channel::chain, steps);
      break;
    }
  }
}

void tree_kind(const CollectiveSpec& c, int device, std::vector<Step>& steps) {
  switch (c.kind) {
    case CollectiveKind::all_reduce:
      tree_all_reduce(c.devices, device, c.bytes, steps);
      break;
    case CollectiveKind::broadcast: {
      const TreeLinks links = tree_links(from_root(c, 0), device);
      pipeline(links.parent, links.children, c.bytes, Channel::tree, steps);
      break;
    }
    case CollectiveKind::reduce: {
      const TreeLinks links = tree_links(from_root(c, 0), device);
      pipeline(links.children, links.parent, c.bytes, Channel::tree, steps);
      break;
    }
    case CollectiveKind::reduce_scatter:
    case CollectiveKind::all_gather:
      break;  // refused by check_collective
  }
}

}  // namespace

std::vector<Step> collective_steps(const CollectiveSpec& c, int device, const NodeOf& node_of) {
  check_collective(c);
  if (position(c.devices, device) == c.devices.size()) {
    throw Error("collective_steps: device " + std::to_string(device) + " is not a member");
  }
  std::vector<Step> steps;
  if (c.devices.size() < 2 || c.bytes <= 0) {
    ring(c.devices, device, 1, 0, Channel::meet, steps);
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
      hierarchical(c, device, node_of, steps);
      break;
  }
  return steps;
}

double bytes_sent(const CollectiveSpec& c, int device, const NodeOf& node_of) {
  double total = 0;
  for (const Step& step : collective_steps(c, device, node_of)) {
    for (const Message& m : step.sends) total += m.bytes;
  }
  return total;
}

}  // namespace hetflow::partition
