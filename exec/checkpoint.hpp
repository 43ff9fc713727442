#pragma once
// Where --init-weights finds a model's weights: one safetensors file, or a HuggingFace
// sharded checkpoint (model-00001-of-00004.safetensors, ... beside the index
// model.safetensors.index.json that maps each tensor to its shard), or a directory holding
// either, as `huggingface-cli download` leaves one.
//
// What it promises:
//  - Opening reads and checks every file's header (as read_safetensors checks one) and no
//    tensor data: a tensor is read, converted to fp32, when read() asks for it, so a rank
//    that loads its share of an 8B model holds one whole tensor at a time, not the model.
//  - The index is checked against the shards when it opens, before anything trains: every
//    tensor it names is in the shard it names, every tensor of a shard is named there, no
//    name in two shards. A shard is a file name beside the index (no directory part: an
//    index cannot reach outside its folder).
//  - A refusal is an InputError naming the index (the line of the entry at fault, and
//    "weight_map.<tensor>" or "weight_map" as the field) or the shard. Only regular files
//    are opened (a FIFO is refused, not waited on).
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "exec/safetensors.hpp"

namespace hetflow::exec {

// Named tensors to start a training from, read one at a time.
class WeightSource {
 public:
  virtual ~WeightSource() = default;
  virtual const std::vector<TensorInfo>& tensors() const = 0;  // each name once
  virtual std::vector<float> read(size_t index) const = 0;     // tensors()[index], fp32
  virtual const std::string& path() const = 0;                 // what errors name
};

// A SafetensorsFile already in memory, as a WeightSource (it must outlive this).
class InMemoryWeights : public WeightSource {
 public:
  InMemoryWeights(const SafetensorsFile& file, std::string path);
  const std::vector<TensorInfo>& tensors() const override { return tensors_; }
  std::vector<float> read(size_t index) const override { return file_.tensors.at(index).data; }
  const std::string& path() const override { return path_; }

 private:
  const SafetensorsFile& file_;
  std::vector<TensorInfo> tensors_;
  std::string path_;
};

// model.safetensors.index.json: {"metadata": {...}, "weight_map": {"<tensor>": "<shard file>"}}.
struct SafetensorsIndex {
  std::vector<std::string> shards;  // each file once, in the order the weight map first names it
  std::vector<std::pair<std::string, std::string>> weight_map;  // tensor -> shard, in the file's order
};

SafetensorsIndex parse_safetensors_index(const std::string& text, const std::string& file);

// A checkpoint opened: a safetensors file, an index (a path ending in .json), or a directory
// with model.safetensors or, failing that, model.safetensors.index.json (transformers' order).
// Tensors come in the index's shard order and each shard's own order.
class Checkpoint : public WeightSource {
 public:
  explicit Checkpoint(const std::string& path);
  const std::vector<TensorInfo>& tensors() const override { return tensors_; }
  std::vector<float> read(size_t index) const override;
  const std::string& path() const override { return path_; }

 private:
  std::string path_;
  std::vector<SafetensorsReader> files_;
  std::vector<TensorInfo> tensors_;
  std::vector<std::pair<size_t, size_t>> where_;  // tensor -> (file, index in it)
};

// Every tensor of a checkpoint, read (for tests and small models; its metadata is not kept).
SafetensorsFile read_checkpoint(const std::string& path);

}  // namespace hetflow::exec
