#pragma once
// A DNN as hetflow sees it: an ordered list of layers (topological order of a DAG), each with
// the per-sample arithmetic and memory every planner and back end needs. A "sample" is one
// input example: an image, or one sequence of `tokens_per_sample` tokens for language models
// (per-token figures are per-sample ones divided by tokens_per_sample).
#include <string>
#include <vector>

#include "model/precision.hpp"

namespace hetflow::model {

struct Layer {
  std::string name;
  std::string kind;   // "embedding", "transformer", "conv", "fc", "head", ... (free text)
  std::string shape;  // human-readable shape that produced the numbers, e.g. "h=1024 s=2048"
  std::vector<int> inputs;  // indices of the layers feeding this one; empty = the network input

  double forward_flops = 0;   // per sample
  double backward_flops = 0;  // per sample (input + weight gradients)
  double params = 0;          // parameter count (elements)
  double output_elems = 0;    // elements of the output activation, per sample
  // Bytes kept from the forward pass for the backward pass, per sample, at the network's
  // precision, with no recomputation.
  double stashed_bytes = 0;
  // Transformer layers only: the part of stashed_bytes that selective recomputation drops
  // (attention scores, softmax, dropout mask), and the forward FLOPs it costs to redo them.
  double attention_stash_bytes = 0;
  double attention_core_flops = 0;
  // Tensor parallelism (Megatron split): elements all-reduced per sample in each forward pass
  // (and again in each backward pass); 0 = the layer is not tensor-parallel.
  double tp_allreduce_elems = 0;

  bool operator==(const Layer&) const = default;
};

struct Network {
  std::string name;
  std::string description;
  Precision precision = Precision::fp16;
  double tokens_per_sample = 1;  // sequence length for language models, 1 otherwise
  std::vector<Layer> layers;

  double param_count() const;
  double forward_flops_per_sample() const;
  double backward_flops_per_sample() const;
  double training_flops_per_sample() const { return forward_flops_per_sample() + backward_flops_per_sample(); }
  double param_bytes() const { return param_count() * element_bytes(precision); }
  // Weights + gradients + Adam state: 16 B/param mixed precision (2 + 2 + 4 master + 4 + 4),
  // 16 B/param fp32 (4 + 4 + 4 + 4).
  double adam_training_state_bytes() const { return param_count() * 16.0; }
  // Bytes of activations that cross a cut placed before layer `first_after`, per sample:
  // outputs of layers < first_after read by layers >= first_after (the network input counts
  // as nothing). This is what a pipeline stage boundary sends forward.
  double cut_bytes(size_t first_after) const;

  bool operator==(const Network&) const = default;
};

}  // namespace hetflow::model
