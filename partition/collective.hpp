#pragma once
// Collective operations as the plan names them: what is computed (kind) and how the bytes
// move (algorithm). Pure vocabulary, shared by the plan, the cost model, the point-to-point
// steps both back ends run, and the layout's synchronisation settings.
#include <string_view>

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

}  // namespace hetflow::partition
