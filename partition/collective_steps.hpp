#pragma once
// A collective as the point-to-point steps one participant runs, as plain data: in each step
// it posts all its sends and receives at once and moves on when all have completed. The
// simulator turns each message into a SimGrid communication, so collectives share links
// with everything else. Promise: over all participants, every send has exactly one
// matching receive (same sender, receiver and channel, in the same order on that channel),
// so a collective whose participants all arrive always completes.
//
//   ring:         2(n-1) steps; in each, S/n to the next member, S/n from the previous one
//                 (reduce-scatter then all-gather).
//   tree:         reduce up a binary tree then broadcast down, in 4 chunks of S/4 (as NCCL
//                 pipelines them).
//   hierarchical: intra-node ring reduce-scatter (k-1 steps of S/k), a ring all-reduce of
//                 each slice among the members with the same local index on every node
//                 (2(m-1) steps of S/(k m)), intra-node ring all-gather (k-1 steps of S/k);
//                 k = members on this node, m = nodes.
// With fewer than two members or no bytes, a collective is still a rendezvous: one step
// of zero bytes around the ring.
#include <functional>
#include <vector>

#include "partition/plan.hpp"

namespace hetflow::partition {

// A message's channel: messages between the same two devices on different channels never
// match each other. Phases of one algorithm use different channels.
enum class Channel { meet, ring, tree, intra_scatter, inter_ring, intra_gather };

struct Message {
  int peer = -1;      // the device sent to or received from
  double bytes = 0;   // sends only
  Channel channel = Channel::ring;
  bool operator==(const Message&) const = default;
};

struct Step {
  std::vector<Message> sends;
  std::vector<Message> receives;
};

// The steps `device` runs in collective `c` (it must be one of c.devices). `node_of` maps a
// device to its node (the hierarchical algorithm groups by it).
std::vector<Step> collective_steps(const Collective& c, int device, const std::function<int(int)>& node_of);

}  // namespace hetflow::partition
