#pragma once
// A collective as the point-to-point steps one participant runs, as plain data: in each step
// it posts all its sends and receives at once and moves on when all have completed. Every
// back end runs these same steps: the simulator turns each message into a SimGrid
// communication (so collectives share links with everything else), an executor into device
// copies. Promise: over all participants, every send has exactly one matching receive (same
// sender, receiver and lane, in the same order on that lane), so a collective whose
// participants all arrive always completes.
//
// n = members, S = bytes (partition/collective.hpp's convention), K = kPipelineChunks; the
// hierarchical forms group members by node: k = members on this node, m = nodes that have a
// member with this one's local index (its peers, one per node, in the members' order).
//
//   all_reduce      ring:          2(n-1) steps; in each, S/n to the next member and S/n from
//                                  the previous one (reduce-scatter then all-gather).
//                   tree:          reduce up a binary tree then broadcast down, in K chunks
//                                  of S/K (as NCCL pipelines them).
//                   hierarchical:  intra-node ring reduce-scatter (k-1 steps of S/k), a ring
//                                  all-reduce of each slice among the peers (2(m-1) steps of
//                                  S/(k m)), intra-node ring all-gather (k-1 steps of S/k).
//   reduce_scatter  ring:          n-1 steps of S/n to the next member, S/n from the previous.
//                   hierarchical:  intra-node ring reduce-scatter (k-1 steps of S/k), then a
//                                  ring reduce-scatter of each slice among the peers (m-1
//                                  steps of S/(k m)).
//   all_gather      ring:          n-1 steps of S/n.
//                   hierarchical:  the reverse: ring all-gather among the peers (m-1 steps of
//                                  S/(k m)), then intra-node ring all-gather (k-1 steps of S/k).
//   broadcast       ring:          a chain from the root along the ring order, S in K chunks:
//                                  a member receives chunk j from its predecessor while passing
//                                  chunk j-1 on (NCCL's ring broadcast).
//                   tree:          the same pipeline down a binary tree: the members taken from
//                                  the root along the ring order, position q's children at
//                                  2q+1 and 2q+2; a parent sends each chunk to every child.
//   reduce          ring:          broadcast mirrored: a chain from the root's successor along
//                                  the ring order to the root, receiving chunk j while passing
//                                  the sum of chunk j-1 on.
//                   tree:          up the broadcast's tree: chunk j from every child while
//                                  sending chunk j-1 to the parent.
//   all_to_all      pairwise:      one step: to every other member q its part (S x
//                                  parts[q], or S/n), from every other member its part bound
//                                  here, all posted at once (NCCL's grouped send/receive).
//                   hierarchical:  members listed node by node, k on each of m nodes: first
//                                  to each other member of its node (local index l') the m
//                                  parts bound for local index l' on every node, then to each
//                                  peer (its local index on another node b) the k parts its
//                                  node holds for that peer, in one message: k S/n. Each
//                                  phase one step, all at once. Members not listed node by
//                                  node with k on every node, one node or one member a
//                                  node: pairwise.
//   sendrecv        ring:          one step: S to the next member, S from the previous one.
// Data: every member starts with its own buffer of S bytes. Running the steps (a receive
// applied when it completes, a send carrying the sender's part as it stands when the step
// starts) leaves: all_reduce, the sum everywhere; broadcast, the root's buffer everywhere;
// reduce, the sum at the root; sendrecv, the previous member's buffer at each; reduce_scatter, the sum of part i of n at ring position i
// (hierarchical: part l*m + q of k*m at local index l, peer position q); all_gather, part i
// of n from position i everywhere (hierarchical: part l*m + q from local index l, peer
// position q) — every node holding the same number of members; all_to_all, member q's
// output holds as its i-th n-th the part q of member i's buffer (a send names the part of the
// sender's buffer, a receive the part of the receiver's output: they differ).
// So ring reduce-scatter and all-gather send (n-1)/n S per member, all-reduce 2(n-1)/n S; a
// broadcast delivers S once to every non-root member, and a reduce sends S once from every
// non-root member. Algorithms that collective.hpp refuses for a kind throw hetflow::Error.
// With m messages (CollectiveSpec::messages), the steps of one collective of S/m bytes, run
// m times in turn, the i-th over the part [i/m, (i+1)/m) of the buffer as its own buffer
// (all_reduce, broadcast, reduce), or over the i-th m-th of every member's part (reduce_scatter,
// all_gather: a member's part holds its sequence shard; all_to_all: of every pair's part,
// and of each of the k slots a hierarchical message across nodes carries):
// each kind leaves what one collective leaves.
// With fewer than two members or no bytes, a collective is still a rendezvous: one step of
// zero bytes around the ring.
#include <functional>
#include <utility>
#include <vector>

#include "partition/collective.hpp"

namespace hetflow::partition {

// Chunks the pipelined algorithms (tree all-reduce, broadcast, reduce) cut the buffer into;
// the cost model's closed forms use the same number.
inline constexpr int kPipelineChunks = 4;

// A message's lane: messages between the same two devices on different lanes never match
// each other. Phases of one algorithm use different lanes. (Not the plan's Channel, which
// names a point-to-point transfer's source, destination and tag.)
enum class Lane { meet, ring, tree, intra_scatter, inter_ring, intra_gather, chain };

// What a message carries, for back ends that move real data: the part [begin, end) of the
// collective's buffer (fractions of it; sender and receiver name the same part), and whether
// the receiver adds it into its buffer (reductions) or overwrites its part.
struct Message {
  int peer = -1;      // the device sent to or received from
  double bytes = 0;   // sends only
  Lane lane = Lane::ring;
  double begin = 0;   // the part of the buffer carried, as fractions of it
  double end = 0;
  bool reduce = false;  // receives: add into the buffer instead of overwriting
  bool operator==(const Message&) const = default;
};

struct Step {
  std::vector<Message> sends;
  std::vector<Message> receives;
};

// The steps `device` runs in collective `c` (it must be one of c.devices). `node_of` maps a
// device to its node (the hierarchical algorithms group by it). Throws hetflow::Error for a
// device that is not a member or a collective check_collective() refuses.
std::vector<Step> collective_steps(const CollectiveSpec& c, int device, const std::function<int(int)>& node_of);

// The members of `group` node by node (in their order) when each node's members are listed
// together and every node holds as many; empty otherwise. A hierarchical all-to-all's nodes.
std::vector<std::vector<int>> node_major_groups(const std::vector<int>& group, const std::function<int(int)>& node_of);

// An all-to-all's traffic as the simulator may run it, coalesced: per phase (pairwise one,
// hierarchical its two) at most two flows a member, one to its successor inside its node
// (local index l + 1) and one to its successor across nodes (the next node's member at l),
// each carrying what the member sends that way in the phase. Only where that is exactly what
// the successor receives that way (even parts, as a balanced router's), so that every link
// out of or into a member carries what it carries in the steps; empty otherwise, or where the
// members do not lie node by node, as many on each (node_major_groups): run the steps. Sends
// carry the bytes, not the data (begin = end = 0): for simulation only.
std::vector<Step> coalesced_all_to_all(const CollectiveSpec& c, int device, const std::function<int(int)>& node_of);

// The bytes `device` sends in collective `c`: the sum of its steps' sends.
double bytes_sent(const CollectiveSpec& c, int device, const std::function<int(int)>& node_of);

// The part of the buffer, as fractions [first, second) of it, that member `device` holds
// reduced after a reduce_scatter and brings to an all_gather (Data above): part i of n at
// ring position i; hierarchical, part l*m + q of k*m at local index l and peer position q.
// Whatever the messages. Throws hetflow::Error for a device that is not a member.
std::pair<double, double> member_part(const CollectiveSpec& c, int device, const std::function<int(int)>& node_of);

}  // namespace hetflow::partition
