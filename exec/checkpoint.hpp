#pragma once
// Where --init-weights finds a model's weights: one safetensors file, or a HuggingFace
// sharded checkpoint (model-00001-of-00004.safetensors, ... beside the index
// model.safetensors.index.json that maps each tensor to its shard), or a directory holding
// either, as `huggingface-cli download` leaves one.
//
// What it promises:
//  - The tensors of every shard, read as read_safetensors reads one file (each refusal names
//    the shard), in the index's shard order and each shard's own order.
//  - The index is checked against the shards before anything is trained: every tensor it
//    names is in the shard it names, every tensor of a shard is named there, no name in two
//    shards. A shard is a file name beside the index (no directory part: an index cannot
//    reach outside its folder).
//  - A refusal is an InputError naming the index (its line, and "weight_map.<tensor>" or
//    "weight_map" as the field) or the shard.
#include <string>
#include <string_view>
#include <vector>

#include "exec/safetensors.hpp"

namespace hetflow::exec {

// model.safetensors.index.json: {"metadata": {...}, "weight_map": {"<tensor>": "<shard file>"}}.
struct SafetensorsIndex {
  std::vector<std::string> shards;  // each file once, in the order the weight map first names it
  std::vector<std::pair<std::string, std::string>> weight_map;  // tensor -> shard, in the file's order
};

SafetensorsIndex parse_safetensors_index(const std::string& text, const std::string& file);

// A safetensors file, an index (a path ending in .json), or a directory with
// model.safetensors.index.json or, failing that, model.safetensors.
SafetensorsFile read_checkpoint(const std::string& path);

}  // namespace hetflow::exec
