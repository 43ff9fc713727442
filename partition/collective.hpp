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
// contributes 1/n of it).
enum class CollectiveKind { all_reduce, reduce_scatter, all_gather, broadcast, reduce };
enum class CollectiveAlgorithm { ring, tree, hierarchical };

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
  bool operator==(const CollectiveSpec&) const = default;
};

// The algorithms each kind runs:
//   all_reduce                  ring, tree, hierarchical
//   reduce_scatter, all_gather  ring, hierarchical; not tree: a tree funnels the whole buffer
//                               through one root, which a scatter or gather never needs
//   broadcast, reduce           ring (a pipelined chain), tree; not hierarchical (it would
//                               need a root per node, which NCCL does not offer either)
bool supports(CollectiveKind kind, CollectiveAlgorithm algorithm);
// Throws hetflow::Error when the algorithm does not apply to the kind (naming the ones that
// do) or the root is not an index into devices.
void check_collective(const CollectiveSpec& c);

}  // namespace hetflow::partition
