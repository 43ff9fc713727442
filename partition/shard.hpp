#pragma once
// Megatron's tensor-parallel split of a decoder's parameters, counted: which part of each
// parameter a tensor-parallel rank holds. The one definition the plan (the bytes of
// gradient all-reduces, tied-embedding all-reduces and server pushes) and the executor's
// real math (exec/decoder_params.hpp lays out exactly these floats) share.
//
// Split parameters (column-parallel rows, row-parallel columns, vocabulary rows) divide their
// units (query heads, key/value heads, MLP columns, vocabulary rows) among the ranks;
// replicated ones (norms, biases added after a row-parallel sum, learned positions) are
// whole on every rank, and so in every part.
#include <cstdint>
#include <optional>
#include <utility>

#include "model/network.hpp"

namespace hetflow::partition {

// A part of the split: [lo, hi) of every split dimension's units, as fractions. Rank j of t
// holds [j/t, (j+1)/t); ranks of different degrees hold parts in common (partition's Share).
struct SplitPart {
  long long lo_num = 0, lo_den = 1, hi_num = 1, hi_den = 1;
  static SplitPart rank(int j, int t) { return {j, t, j + 1, t}; }
};

// [floor(n lo), floor(n hi)): the units of `n` a part covers (rank i of t gets
// [n i / t, n (i + 1) / t); the first ranges one shorter when t does not divide n).
std::pair<std::int64_t, std::int64_t> split_units(std::int64_t n, const SplitPart& part);

// Whether the split covers the network: a GPT-2 or LLaMA style decoder (the families the
// executor's real math runs), whose layers are the embedding, the blocks and the LM head.
bool split_covers(const model::Network& net);

// Parameters of network layer `layer`, in a chunk whose layers begin at `chunk_begin`, that
// `part` holds: its share of the split ones, the replicated ones whole, and on the LM head
// the tied embedding's copy when the chunk does not hold the embedding. nullopt where
// split_covers is false.
std::optional<double> shard_params(const model::Network& net, int layer, int chunk_begin, const SplitPart& part);
// The tied embedding matrix's rows `part` holds (vocabulary rows x hidden); nullopt as above.
std::optional<double> shard_tied_params(const model::Network& net, const SplitPart& part);

// What the plan counts: shard_params where the split covers the network; elsewhere each
// splittable layer's parameters in proportion to the part (and the others whole), summed over
// layers [begin, end) of a chunk beginning at `begin`.
double part_params(const model::Network& net, int begin, int end, const SplitPart& part);
// The same of one layer in a chunk beginning at `chunk_begin`.
double layer_part_params(const model::Network& net, int layer, int chunk_begin, const SplitPart& part);
// The tied embedding's part: shard_tied_params, or the tied parameters in proportion.
double tied_part_params(const model::Network& net, int layer, const SplitPart& part);

}  // namespace hetflow::partition
