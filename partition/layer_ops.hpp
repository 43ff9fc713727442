#pragma once
// The operations of one pass of one layer as a GPU runs them, for one micro-batch on one
// tensor-parallel rank (Megatron's split): the GEMMs of a decoder layer with their shapes,
// and the memory-bound operations around them (norms, softmax, dropout, activation, bias and
// residual adds, rotary embedding, the embedding look-up, the cross-entropy) with the bytes
// they move. A compute task's time is the sum of its operations' times (CostModel): a GEMM at
// the device's peak times the calibration's efficiency for its size, a memory-bound
// operation at its bytes over the memory bandwidth times an efficiency.
//
// What is counted (T = micro-batch x sequence tokens, h hidden, a heads of d = h / a (or the
// config's head_dim), q = a d, g KV heads, f MLP width, V vocabulary, t the tensor-parallel
// degree, e bytes per element):
//  - GEMM FLOPs are 2 m n k, exactly the zoo's (model/zoo_transformer.cpp): a layer's forward
//    GEMMs add up to its forward_flops / t, its backward GEMMs (data + weight) to twice that.
//    Forward: QKV (m T, n (q + 2gd) / t, k h), scores and context (a / t batched GEMMs of
//    s x s x d), output projection (T, h, q / t), MLP up (T, f / t, or 2f / t gated, h), MLP
//    down (T, h, f / t); the LM head's logits (T, V / t, h). Backward data and backward weight
//    each repeat every GEMM once (dX = dY W^T, dW = X^T dY).
//  - Memory-bound bytes, each operation reading its inputs and writing its outputs once
//    (fused kernels as Megatron runs them: fused scale-mask-softmax, fused bias-GeLU, fused
//    bias-dropout-add, unless OpOptions turns them off): norms 2 T h e forward and 3 T h e
//    backward; softmax 2 and 3 (a / t) b s^2 e; attention dropout (2e + 1) per score forward
//    and backward (a mask byte); bias-dropout-add (3e + 1) T h; activation 2 T f / t e (SwiGLU
//    3) forward, 3 (4) backward; rotary 2 T (q + gd) / t e (QK-norm as much forward, 3 T
//    (q + gd) / t e backward); the embedding look-up, position add and dropout; the
//    cross-entropy over fp32 logits (5 fp32 passes forward, 2 backward).
//    Sequence parallelism divides the norm and dropout-add tokens by t. With flash attention
//    the scores, softmax, dropout and context are one operation: their GEMM FLOPs, and the
//    bytes of Q, K, V and the output (the s^2 scores never reach memory).
//  - Mixtures of experts (model::MoeConfig), for tokens routed evenly: the router's GEMM
//    (T, experts, h), whole on every tensor-parallel rank as Megatron runs it, its fp32 scores
//    and top-k; the permutation of each token's k copies into expert order and back (under
//    expert parallelism all three of the device's sequence-parallel T / t tokens alone, which
//    its all-to-all dispatches); the
//    routed experts as grouped GEMMs, `experts` of them of T k / experts rows, their widths
//    split by t (expert tensor parallelism = t); under expert parallelism the rank's held
//    experts of T k load / held rows each, and the sorts of the copies it received by expert
//    and back (Megatron's sort_chunks_by_idxs); the shared experts as one SwiGLU MLP of their
//    total width. Latent attention (model::MlaConfig): the query and key/value down
//    projections whole on every rank (Megatron duplicates them), their norms, the up
//    projections and the output projection split by heads; the scores qk_nope + qk_rope wide,
//    the values v_head_dim. These whole GEMMs are the exception to "forward_flops / t".
//  - Convolutional networks (layers listing model::CnnOp): convolutions and fully connected
//    layers as implicit GEMMs, their FLOPs the zoo's (forward 2 x the multiply-adds, data and
//    weight gradients as much again each, no data gradient for the layer reading the image),
//    and BatchNorm, ReLU, pools, bias and residual adds memory-bound (layer_ops.cpp gives
//    each one's bytes). Tensor parallelism does not split them.
//  - Not here: communication (the plan's tasks), the optimizer (its own task: a fused Adam
//    reads and writes its bytes, memory-bound).
#include <string_view>
#include <vector>

#include "model/network.hpp"
#include "partition/layout.hpp"

namespace hetflow::partition {

enum class OpClass { gemm, attention, memory };  // attention: flash attention's fused kernel

struct Op {
  std::string_view name;  // "qkv", "scores", "softmax", ...
  OpClass cls = OpClass::memory;
  double flops = 0;  // GEMM FLOPs (2 per multiply-add); 0 for memory-bound operations
  double bytes = 0;  // device memory read and written
  double m = 0, n = 0, k = 0, batch = 1;  // GEMM shape (batched GEMMs: `batch` of m x n x k)
  bool operator==(const Op&) const = default;
};

enum class OpPass { forward, backward_data, backward_weight };

using OpOptions = KernelOptions;  // a plan's layout.kernels

struct OpShape {
  int micro_batch = 1;
  int tensor = 1;               // the stage's tensor-parallel degree
  bool sequence_parallel = false;
  double element_bytes = 2;     // the plan's precision
  // Context parallelism: the device computes 1/context of each sequence's tokens (its
  // queries), whose attention meets every key of the sequence (gathered), so every
  // operation moves and computes 1/context of the whole, the scores included.
  int context = 1;
  // Expert parallelism (Layout::experts): the expert group's size, the routed experts this
  // rank holds (-1: every one) and the copies they compute as a multiple of tokens x top-k
  // (ExpertShare). With more than one member the rank's experts run on the copies every
  // member sends them, sorted by expert after the dispatch and back before the combine.
  int experts = 1;
  int experts_held = -1;
  double expert_load = 1;
};

// The operations of `pass` of layer `layer`, or an empty list when the network is neither a
// decoder built from an architecture nor a CNN whose computing layers list their operations
// (network.architecture unset, an encoder, a layer list without `ops`): such layers keep
// the FLOPs-only model.
std::vector<Op> layer_ops(const model::Network& network, int layer, OpPass pass, const OpShape& shape,
                          const OpOptions& options = {});

// Whether layer_ops describes the network's layers.
bool has_layer_ops(const model::Network& network);

std::string_view to_string(OpClass c);

}  // namespace hetflow::partition
