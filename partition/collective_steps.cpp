#include "partition/collective_steps.hpp"

#include <algorithm>
#include <map>

#include "model/error.hpp"

namespace hetflow::partition {

namespace {

size_t position(const std::vector<int>& group, int device) {
  return static_cast<size_t>(std::find(group.begin(), group.end(), device) - group.begin());
}

// `count` steps: send `chunk_bytes` to the next member while receiving from the previous.
void ring(const std::vector<int>& group, size_t me, int count, double chunk_bytes, Channel channel,
          std::vector<Step>& steps) {
  const size_t n = group.size();
  if (n < 2) return;
  const int next = group[(me + 1) % n], previous = group[(me + n - 1) % n];
  for (int s = 0; s < count; ++s) steps.push_back(Step{{{next, chunk_bytes, channel}}, {{previous, 0, channel}}});
}

void tree(const std::vector<int>& group, size_t me, double bytes, std::vector<Step>& steps) {
  constexpr int kChunks = 4;
  const size_t n = group.size();
  const double chunk = bytes / kChunks;
  std::vector<int> children;
  for (size_t c : {2 * me + 1, 2 * me + 2}) {
    if (c < n) children.push_back(group[c]);
  }
  const bool root = me == 0;
  const int parent = root ? -1 : group[(me - 1) / 2];
  for (int k = 0; k < kChunks; ++k) {  // reduce: gather the children's chunk, pass it up
    Step gather;
    for (int c : children) gather.receives.push_back({c, 0, Channel::tree});
    if (!gather.receives.empty()) steps.push_back(gather);
    if (!root) steps.push_back(Step{{{parent, chunk, Channel::tree}}, {}});
  }
  for (int k = 0; k < kChunks; ++k) {  // broadcast: take the chunk from above, pass it down
    if (!root) steps.push_back(Step{{}, {{parent, 0, Channel::tree}}});
    Step scatter;
    for (int c : children) scatter.sends.push_back({c, chunk, Channel::tree});
    if (!scatter.sends.empty()) steps.push_back(scatter);
  }
}

void hierarchical(const std::vector<int>& group, int device, double bytes, const std::function<int(int)>& node_of,
                  std::vector<Step>& steps) {
  std::vector<int> nodes;  // in order of first appearance in the group
  std::map<int, std::vector<int>> local;
  for (int d : group) {
    const int node = node_of(d);
    if (local.count(node) == 0) nodes.push_back(node);
    local[node].push_back(d);
  }
  const std::vector<int>& mine = local[node_of(device)];
  const size_t local_index = position(mine, device);
  const int k = static_cast<int>(mine.size());
  ring(mine, local_index, k - 1, bytes / k, Channel::intra_scatter, steps);
  std::vector<int> peers;  // the members with my local index, one per node that has one
  for (int node : nodes) {
    const std::vector<int>& members = local[node];
    if (members.size() > local_index) peers.push_back(members[local_index]);
  }
  const int m = static_cast<int>(peers.size());
  ring(peers, position(peers, device), 2 * (m - 1), bytes / k / m, Channel::inter_ring, steps);
  ring(mine, local_index, k - 1, bytes / k, Channel::intra_gather, steps);
}

}  // namespace

std::vector<Step> collective_steps(const Collective& c, int device, const std::function<int(int)>& node_of) {
  const size_t me = position(c.devices, device);
  if (me == c.devices.size()) throw Error("collective_steps: device " + std::to_string(device) + " is not a member");
  std::vector<Step> steps;
  if (c.devices.size() < 2 || c.bytes <= 0) {
    ring(c.devices, me, 1, 0, Channel::meet, steps);
    return steps;
  }
  switch (c.algorithm) {
    case CollectiveAlgorithm::ring:
      ring(c.devices, me, 2 * (static_cast<int>(c.devices.size()) - 1), c.bytes / static_cast<double>(c.devices.size()),
           Channel::ring, steps);
      break;
    case CollectiveAlgorithm::tree:
      tree(c.devices, me, c.bytes, steps);
      break;
    case CollectiveAlgorithm::hierarchical:
      hierarchical(c.devices, device, c.bytes, node_of, steps);
      break;
  }
  return steps;
}

}  // namespace hetflow::partition
