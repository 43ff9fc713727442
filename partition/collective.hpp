#pragma once
// Collective operations as the plan names them: what is computed (kind) and how the bytes
// move (algorithm). Pure vocabulary, shared by the plan, the cost model, the point-to-point
// steps both back ends run, and the layout's synchronisation settings.
#include <string_view>
#include <vector>

namespace hetflow::partition {

// Sizes follow NCCL's convention of the larger buffer: for all_reduce, broadcast and reduce
// the buffer every participant holds; for reduce_scatter the input each participant holds
// (each ends with 1/n of it); for all_gather the output each participant ends with (each
// contributes 1/n of it); for all_to_all the buffer each participant sends, one part bound
// for every participant (itself included), the parts' shares alike on every sender; for
// sendrecv the buffer each participant sends to the next member in ring order while it
// receives the previous member's into its own (one step of a ring: nccl-tests' sendrecv,
// the ring attention's exchange of keys and values).
enum class CollectiveKind { all_reduce, reduce_scatter, all_gather, broadcast, reduce, all_to_all, sendrecv };
// pairwise: every member sends each other member its part directly, all at once (NCCL's
// grouped send/receive); for all_to_all only.
enum class CollectiveAlgorithm { ring, tree, hierarchical, pairwise };

std::string_view to_string(CollectiveKind k);
std::string_view to_string(CollectiveAlgorithm a);
// These throw std::invalid_argument naming the accepted values.
CollectiveKind parse_collective_kind(std::string_view text);
CollectiveAlgorithm parse_collective_algorithm(std::string_view text);

// One collective as the back ends and the cost model see it, whatever structure holds it.
struct CollectiveSpec {
  CollectiveKind kind = CollectiveKind::all_reduce;
  CollectiveAlgorithm algorithm = CollectiveAlgorithm::ring;
  std::vector<int> devices;  // participants, in ring order
  double bytes = 0;          // per the convention above
  int root = 0;              // broadcast and reduce: index into devices of the root
  // Back-to-back collectives of bytes / messages each, one after the other over consecutive
  // parts of the buffer: a chunk's per-layer tensor-parallel all-reduces as one task. Each
  // pays its own latencies and moves its own size (partition/collective_steps.hpp).
  int messages = 1;
  // The share of the buffer each member's part is, in member order, adding up to 1; empty:
  // 1/n each. all_to_all: the part of every member's buffer bound for each member (an uneven
  // router sends the members holding its busiest experts more). reduce_scatter and
  // all_gather (ring only): the part each member ends with or brings (ZeRO's shards in
  // proportion to device memory). Empty for the other kinds.
  std::vector<double> parts{};
  bool operator==(const CollectiveSpec&) const = default;
};

// The share of an all_to_all's buffer bound for member `member` of `members`.
double all_to_all_part(const CollectiveSpec& c, size_t member);

// Where each member's part begins, as fractions of the buffer, and 1 at the end: n + 1
// ascending cuts from 0 to exactly 1 (`parts` summed in order; empty parts: i / n).
std::vector<double> part_cuts(const std::vector<double>& parts, size_t members);

// The algorithms each kind runs:
//   all_reduce                  ring, tree, hierarchical
//   reduce_scatter, all_gather  ring, hierarchical; not tree: a tree funnels the whole buffer
//                               through one root, which a scatter or gather never needs
//   broadcast, reduce           ring (a pipelined chain), tree; not hierarchical (it would
//                               need a root per node, which NCCL does not offer either)
//   all_to_all                  pairwise, hierarchical (inside each node, then across nodes);
//                               and pairwise no other kind
//   sendrecv                    ring
bool supports(CollectiveKind kind, CollectiveAlgorithm algorithm);
// Throws hetflow::Error when the algorithm does not apply to the kind (naming the ones that
// do), the root is not an index into devices, or parts are not one share >= 0 per member
// adding up to 1 (or belong to a kind other than all_to_all, or a reduce_scatter or
// all_gather other than a ring's).
void check_collective(const CollectiveSpec& c);

}  // namespace hetflow::partition
