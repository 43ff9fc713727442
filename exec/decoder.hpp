#pragma once
// The real training math of one chunk of a decoder transformer (exec/decoder_params.hpp) for
// one micro-batch: forward, backward, and the weight-gradient half of a split backward, in
// FP32 on the CPU reference kernels (kernels/transformer.hpp).
//
// What it promises:
//  - GPT-2 blocks: x + attn(LN(x)), then + MLP(LN(.)) with GELU (tanh); LLaMA blocks the same
//    with RMSNorm, rotary q/k (rotate-half), grouped-query attention and SwiGLU. Causal
//    attention scaled by 1/sqrt(head size), no dropout. The head normalises, multiplies by
//    the head matrix (the tied embedding or lm_head) and takes the cross-entropy of every
//    token, each weighted by `loss_scale` (1 / tokens of the global batch, so gradients added
//    over micro-batches and workers are the gradient of the global mean loss).
//  - Recomputation really recomputes: `selective` drops the attention probabilities after
//    the forward and rebuilds them in the backward; `full` keeps only each layer's input and
//    reruns that layer's forward just before its backward.
//  - backward() accumulates (+=) weight gradients into `grads` (the chunk's flat gradient
//    array, same layout as the parameters). With split = true it computes only what the
//    input gradient needs and leaves the weight-gradient GEMMs (and the embedding's scatter)
//    for backward_weight(), zero-bubble style: the results are the same.
//  - Deterministic: the same inputs give bitwise the same outputs.
#include <memory>

#include "exec/decoder_params.hpp"
#include "partition/layout.hpp"

namespace hetflow::exec {

class DecoderChunk {
 public:
  DecoderChunk(DecoderShape shape, int layer_begin, int layer_end, partition::Recompute recompute);

  const DecoderShape& shape() const { return shape_; }
  const ChunkParams& params() const { return params_; }

  struct Input {
    int samples = 0;                // sequences in the micro-batch (each of shape().S tokens)
    const int* tokens = nullptr;    // first chunk: samples * S token ids
    const float* input = nullptr;   // other chunks: [samples * S, C]
    float* output = nullptr;        // not the last chunk: [samples * S, C]
    const int* targets = nullptr;   // last chunk: samples * S next tokens
    float loss_scale = 0;           // last chunk: weight of each token's loss
  };
  // What the forward keeps for the backward (opaque).
  struct Stash;
  struct StashDeleter {
    void operator()(Stash* s) const;
  };
  using StashPtr = std::unique_ptr<Stash, StashDeleter>;

  // The forward pass; on the last chunk `loss_sum` gets the sum of the token losses
  // (unweighted, in double).
  StashPtr forward(const float* params, const Input& in, double& loss_sum) const;
  // dout: gradient of the chunk's output (nullptr on the last chunk); dinput: where the
  // input's gradient goes (nullptr on the first chunk), overwritten.
  void backward(Stash& stash, const float* params, float* grads, const float* dout, float* dinput, bool split) const;
  // The weight gradients a split backward left (requires backward(..., split = true) first).
  void backward_weight(Stash& stash, float* grads) const;

 private:
  DecoderShape shape_;
  ChunkParams params_;
  partition::Recompute recompute_;
};

}  // namespace hetflow::exec
