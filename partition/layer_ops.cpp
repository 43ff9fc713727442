#include "partition/layer_ops.hpp"

#include <array>
#include <cstdint>

namespace hetflow::partition {

namespace {

// The sizes every formula uses, for one micro-batch on one tensor-parallel rank.
struct Dims {
  double b, s, T, h, a, d, q, kv, f, V, t, e, Tn, mask;  // q: query width a d (h unless head_dim widens it)
  double keys;  // each query's keys: s, or a sliding window's
  bool gated, biases, rope, learned_positions, dropout, qk_norm;
  bool qkv_bias, out_bias;  // the attention's biases: `biases`' or, without them, Qwen2's / LLaMA's
  // Multi-head latent attention (model::MlaConfig): latent widths, and a head's query/key
  // width without and with positions and its value width.
  bool mla;
  double ql, kvl, dn, dr, dv, dqk;
  // This layer's mixture of experts (model::MoeConfig): routed experts, top-k, their width,
  // the shared experts' total width, Qwen2-MoE's shared gate.
  bool moe;
  double E, k, fe, fs;
  bool shared_gate;
  // Expert parallelism: the experts this rank holds (E without it), the copies they compute
  // (T k without it) and whether copies arrive from other members (they are sorted by expert).
  double Eh, routed;
  bool exchanged;
  // The tokens the router scores and the permutation orders: the rank's all, or under expert
  // parallelism (sequence parallel) the device's 1/t, as its all-to-all dispatches them.
  double Tr;
};

Dims dims_of(const model::TransformerConfig& c, const OpShape& shape, int transformer_layer) {
  Dims x{};
  x.b = shape.micro_batch;
  x.s = c.seq / static_cast<double>(shape.context);  // the device's queries
  x.T = x.b * x.s;
  x.h = c.hidden;
  x.a = c.heads;
  x.d = c.head_size();
  x.q = x.a * x.d;
  x.kv = c.kv_head_count() * x.d;
  x.f = c.ffn > 0 ? c.ffn : 4.0 * c.hidden;
  x.V = c.vocab;
  x.t = shape.tensor;
  x.e = shape.element_bytes;
  x.Tn = shape.sequence_parallel ? x.T / x.t : x.T;  // tokens of the norms and residual adds
  x.mask = c.dropout ? 1 : 0;
  x.gated = c.gated_mlp;
  x.biases = c.biases;
  x.keys = c.sliding_window > 0 && c.sliding_window < c.seq ? c.sliding_window : c.seq;
  x.qkv_bias = c.biases || c.attention_bias != model::TransformerConfig::AttentionBias::none;
  x.out_bias = c.biases || c.attention_bias == model::TransformerConfig::AttentionBias::qkvo;
  x.rope = !c.learned_positions;
  x.learned_positions = c.learned_positions;
  x.dropout = c.dropout;
  x.qk_norm = c.qk_norm;
  x.mla = c.mla.enabled();
  x.ql = c.mla.q_lora_rank;
  x.kvl = c.mla.kv_lora_rank;
  x.dn = c.mla.qk_nope_head_dim;
  x.dr = c.mla.qk_rope_head_dim;
  x.dv = c.mla.v_head_dim;
  x.dqk = c.mla.qk_head_dim();
  x.moe = c.moe.is_moe_layer(transformer_layer);
  x.E = c.moe.experts;
  x.k = c.moe.experts_per_token;
  x.fe = c.moe.expert_ffn;
  x.fs = static_cast<double>(c.moe.shared_experts) * c.moe.shared_width();
  x.shared_gate = c.moe.shared_expert_gate;
  x.Eh = shape.experts_held > 0 ? shape.experts_held : x.E;
  x.routed = x.T * x.k * shape.expert_load;
  x.exchanged = shape.experts > 1;
  x.Tr = x.exchanged ? x.Tn : x.T;
  return x;
}

class Ops {
 public:
  void gemm(std::string_view name, double m, double n, double k, double batch, double e) {
    // Reads both operands, writes the product.
    ops_.push_back({name, OpClass::gemm, 2 * m * n * k * batch, e * batch * (m * k + k * n + m * n), m, n, k, batch});
  }
  void memory(std::string_view name, double bytes) {
    if (bytes > 0) ops_.push_back({name, OpClass::memory, 0, bytes, 0, 0, 0, 1});
  }
  void attention(std::string_view name, double flops, double bytes) {
    ops_.push_back({name, OpClass::attention, flops, bytes, 0, 0, 0, 1});
  }
  std::vector<Op> take() { return std::move(ops_); }

 private:
  std::vector<Op> ops_;
};

// The row-parallel output's bias (when it has one), dropout and residual add (Megatron's
// bias_dropout_add).
void bias_dropout_add(Ops& o, const Dims& x, const OpOptions& opt, bool bias) {
  const double n = x.Tn * x.h;
  if (opt.fused_bias_dropout_add) {
    o.memory("bias dropout add", (3 * x.e + x.mask) * n);
    return;
  }
  if (bias) o.memory("bias", 2 * x.e * n);
  if (x.dropout) o.memory("dropout", (2 * x.e + x.mask) * n);
  o.memory("residual add", 3 * x.e * n);
}

// The attention block's operations up to its output projection, forward.
void attention_forward(Ops& o, const Dims& x, const OpOptions& opt) {
  const double heads = x.a / x.t, scores = x.b * heads * x.s * x.keys;
  if (x.mla) {
    // The down projections run whole on every tensor-parallel rank (Megatron's MLA
    // duplicates them); the up projections split the heads.
    if (x.ql > 0) {
      o.gemm("q down", x.T, x.ql, x.h, 1, x.e);
      o.memory("q latent norm", 2 * x.e * x.T * x.ql);
      o.gemm("q up", x.T, x.a * x.dqk / x.t, x.ql, 1, x.e);
    } else {
      o.gemm("q", x.T, x.a * x.dqk / x.t, x.h, 1, x.e);
    }
    o.gemm("kv down", x.T, x.kvl + x.dr, x.h, 1, x.e);
    o.memory("kv latent norm", 2 * x.e * x.T * x.kvl);
    o.gemm("kv up", x.T, x.a * (x.dn + x.dv) / x.t, x.kvl, 1, x.e);
    o.memory("rotary", 2 * x.e * x.T * (x.a * x.dr / x.t + x.dr));
  } else {
    o.gemm("qkv", x.T, (x.q + 2 * x.kv) / x.t, x.h, 1, x.e);
    if (x.qk_norm) o.memory("qk norm", 2 * x.e * x.T * (x.q + x.kv) / x.t);
    if (x.rope) o.memory("rotary", 2 * x.e * x.T * (x.q + x.kv) / x.t);
  }
  const double dqk = x.mla ? x.dqk : x.d, dv = x.mla ? x.dv : x.d;
  if (opt.flash_attention) {
    const double io = x.mla ? x.a * (2 * x.dqk + 2 * x.dv) : 2 * x.q + 2 * x.kv;  // Q, K, V, output
    o.attention("flash attention", 2 * scores * (dqk + dv), x.e * x.T * io / x.t);
  } else {
    o.gemm("scores", x.s, x.keys, dqk, x.b * heads, x.e);
    o.memory("softmax", (opt.fused_softmax ? 2 : 6) * x.e * scores);
    if (x.dropout) o.memory("attention dropout", (2 * x.e + 1) * scores);
    o.gemm("context", x.s, dv, x.keys, x.b * heads, x.e);
  }
  o.gemm("attention projection", x.T, x.h, (x.mla ? x.a * x.dv : x.q) / x.t, 1, x.e);
}

// A SwiGLU or GeLU MLP of width `f` (split over the tensor-parallel ranks), forward.
void mlp_forward(Ops& o, const Dims& x, const OpOptions& opt, double f, bool gated, bool biases,
                 std::string_view up, std::string_view act, std::string_view down) {
  o.gemm(up, x.T, (gated ? 2 : 1) * f / x.t, x.h, 1, x.e);
  const double wide = x.T * f / x.t;
  if (gated) {
    o.memory(act, 3 * x.e * wide);
  } else if (opt.fused_bias_gelu || !biases) {
    o.memory("bias gelu", 2 * x.e * wide);
  } else {
    o.memory("bias", 2 * x.e * wide);
    o.memory("gelu", 2 * x.e * wide);
  }
  o.gemm(down, x.T, x.h, f / x.t, 1, x.e);
}

// A mixture of experts, forward, for tokens routed evenly: the router (whole on every
// tensor-parallel rank, as Megatron runs it; under expert parallelism on the device's own
// sequence-parallel tokens, Dims::Tr) and its fp32 softmax or sigmoid and top-k, the
// permutation of each token's k copies into expert order, the experts as grouped GEMMs
// (`experts` GEMMs of T k / experts rows each, their widths split over the tensor-parallel
// ranks), the weighted un-permutation back to token order, and the shared experts as one
// MLP of their total width.
void moe_forward(Ops& o, const Dims& x, const OpOptions& opt) {
  const double copies = x.Tr * x.k;
  o.gemm("router", x.Tr, x.E, x.h, 1, x.e);
  o.memory("router scores and top-k", (x.e + 8) * x.Tr * x.E);
  o.memory("permute", 2 * x.e * copies * x.h);
  if (x.exchanged) o.memory("sort by expert", 2 * x.e * x.routed * x.h);
  o.gemm("experts up", x.routed / x.Eh, 2 * x.fe / x.t, x.h, x.Eh, x.e);
  o.memory("experts swiglu", 3 * x.e * x.routed * x.fe / x.t);
  o.gemm("experts down", x.routed / x.Eh, x.h, x.fe / x.t, x.Eh, x.e);
  if (x.exchanged) o.memory("unsort", 2 * x.e * x.routed * x.h);
  o.memory("unpermute", x.e * (copies + x.Tr) * x.h + 4 * copies);
  if (x.fs > 0) {
    mlp_forward(o, x, opt, x.fs, true, false, "shared up", "shared swiglu", "shared down");
    if (x.shared_gate) o.gemm("shared gate", x.T, 1, x.h, 1, x.e);
    o.memory("shared add", 3 * x.e * x.T * x.h);
  }
}

void transformer_forward(Ops& o, const Dims& x, const OpOptions& opt) {
  o.memory("input norm", 2 * x.e * x.Tn * x.h);
  attention_forward(o, x, opt);
  bias_dropout_add(o, x, opt, x.out_bias);
  o.memory("post-attention norm", 2 * x.e * x.Tn * x.h);
  if (x.moe) {
    moe_forward(o, x, opt);
  } else {
    mlp_forward(o, x, opt, x.f, x.gated, x.biases, "mlp up", "swiglu", "mlp down");
  }
  bias_dropout_add(o, x, opt, x.biases);
}

// A SwiGLU or GeLU MLP of width `f`, data gradients.
void mlp_backward_data(Ops& o, const Dims& x, double f, bool gated, std::string_view down, std::string_view act,
                       std::string_view up) {
  o.gemm(down, x.T, f / x.t, x.h, 1, x.e);
  o.memory(act, (gated ? 5 : 3) * x.e * x.T * f / x.t);
  o.gemm(up, x.T, x.h, (gated ? 2 : 1) * f / x.t, 1, x.e);
}

void moe_backward_data(Ops& o, const Dims& x) {
  const double copies = x.Tr * x.k;
  // The weighted sum's gradient: to each copy, and to each weight (a dot with its output).
  o.memory("unpermute (backward)", x.e * (2 * copies + x.Tr) * x.h + 4 * copies);
  if (x.exchanged) o.memory("unsort (backward)", 2 * x.e * x.routed * x.h);
  o.gemm("experts down (data)", x.routed / x.Eh, x.fe / x.t, x.h, x.Eh, x.e);
  o.memory("experts swiglu (backward)", 5 * x.e * x.routed * x.fe / x.t);
  o.gemm("experts up (data)", x.routed / x.Eh, x.h, 2 * x.fe / x.t, x.Eh, x.e);
  if (x.exchanged) o.memory("sort by expert (backward)", 2 * x.e * x.routed * x.h);
  o.memory("permute (backward)", 2 * x.e * copies * x.h);
  o.memory("router scores and top-k (backward)", (x.e + 8) * x.Tr * x.E);
  o.gemm("router (data)", x.Tr, x.h, x.E, 1, x.e);
  if (x.fs > 0) {
    o.memory("shared add (backward)", 3 * x.e * x.T * x.h);
    if (x.shared_gate) o.gemm("shared gate (data)", x.T, x.h, 1, 1, x.e);
    mlp_backward_data(o, x, x.fs, true, "shared down (data)", "shared swiglu (backward)", "shared up (data)");
  }
}

void attention_backward_data(Ops& o, const Dims& x, const OpOptions& opt) {
  const double heads = x.a / x.t, scores = x.b * heads * x.s * x.keys;
  const double dqk = x.mla ? x.dqk : x.d, dv = x.mla ? x.dv : x.d;
  o.gemm("attention projection (data)", x.T, (x.mla ? x.a * x.dv : x.q) / x.t, x.h, 1, x.e);
  if (opt.flash_attention) {
    // Reads Q, K, V, the output and its gradient; writes the gradients of Q, K and V.
    const double io = x.mla ? x.a * (4 * x.dqk + 4 * x.dv) : 4 * x.q + 4 * x.kv;
    o.attention("flash attention (backward)", 2 * 2 * scores * (dqk + dv), x.e * x.T * io / x.t);
  } else {
    // Under a sliding window each query meets `keys` keys and each key as many queries.
    o.gemm("context (data)", x.s, x.keys, dv, x.b * heads, x.e);     // dP = dO V^T
    o.gemm("context (values)", x.s, dv, x.keys, x.b * heads, x.e);   // dV = P^T dO
    if (x.dropout) o.memory("attention dropout (backward)", (2 * x.e + 1) * scores);
    o.memory("softmax (backward)", 3 * x.e * scores);
    o.gemm("scores (queries)", x.s, dqk, x.keys, x.b * heads, x.e);   // dQ = dS K
    o.gemm("scores (keys)", x.s, dqk, x.keys, x.b * heads, x.e);      // dK = dS^T Q
  }
  if (x.mla) {
    o.memory("rotary (backward)", 2 * x.e * x.T * (x.a * x.dr / x.t + x.dr));
    o.gemm("kv up (data)", x.T, x.kvl, x.a * (x.dn + x.dv) / x.t, 1, x.e);
    o.memory("kv latent norm (backward)", 3 * x.e * x.T * x.kvl);
    o.gemm("kv down (data)", x.T, x.h, x.kvl + x.dr, 1, x.e);
    if (x.ql > 0) {
      o.gemm("q up (data)", x.T, x.ql, x.a * x.dqk / x.t, 1, x.e);
      o.memory("q latent norm (backward)", 3 * x.e * x.T * x.ql);
      o.gemm("q down (data)", x.T, x.h, x.ql, 1, x.e);
    } else {
      o.gemm("q (data)", x.T, x.h, x.a * x.dqk / x.t, 1, x.e);
    }
    return;
  }
  if (x.rope) o.memory("rotary (backward)", 2 * x.e * x.T * (x.q + x.kv) / x.t);
  if (x.qk_norm) o.memory("qk norm (backward)", 3 * x.e * x.T * (x.q + x.kv) / x.t);
  o.gemm("qkv (data)", x.T, x.h, (x.q + 2 * x.kv) / x.t, 1, x.e);
}

void transformer_backward_data(Ops& o, const Dims& x, const OpOptions& opt) {
  const double residual = x.Tn * x.h;
  // Dropout's backward reads the gradient and the mask; the residual branch adds gradients.
  o.memory("dropout add (backward)", (2 * x.e + x.mask + 3 * x.e) * residual);
  if (x.moe) {
    moe_backward_data(o, x);
  } else {
    mlp_backward_data(o, x, x.f, x.gated, "mlp down (data)", x.gated ? "swiglu (backward)" : "gelu (backward)",
                      "mlp up (data)");
  }
  o.memory("post-attention norm (backward)", 3 * x.e * residual);
  o.memory("dropout add (backward)", (2 * x.e + x.mask + 3 * x.e) * residual);
  attention_backward_data(o, x, opt);
  o.memory("input norm (backward)", 3 * x.e * residual);
}

void transformer_backward_weight(Ops& o, const Dims& x) {
  if (x.mla) {
    if (x.ql > 0) {
      o.gemm("q down (weight)", x.h, x.ql, x.T, 1, x.e);
      o.gemm("q up (weight)", x.ql, x.a * x.dqk / x.t, x.T, 1, x.e);
    } else {
      o.gemm("q (weight)", x.h, x.a * x.dqk / x.t, x.T, 1, x.e);
    }
    o.gemm("kv down (weight)", x.h, x.kvl + x.dr, x.T, 1, x.e);
    o.gemm("kv up (weight)", x.kvl, x.a * (x.dn + x.dv) / x.t, x.T, 1, x.e);
    o.gemm("attention projection (weight)", x.a * x.dv / x.t, x.h, x.T, 1, x.e);
  } else {
    o.gemm("qkv (weight)", x.h, (x.q + 2 * x.kv) / x.t, x.T, 1, x.e);
    o.gemm("attention projection (weight)", x.q / x.t, x.h, x.T, 1, x.e);
  }
  const double up = (x.gated ? 2 : 1) * x.f / x.t;
  if (x.moe) {
    o.gemm("router (weight)", x.h, x.E, x.Tr, 1, x.e);
    o.gemm("experts up (weight)", x.h, 2 * x.fe / x.t, x.routed / x.Eh, x.Eh, x.e);
    o.gemm("experts down (weight)", x.fe / x.t, x.h, x.routed / x.Eh, x.Eh, x.e);
    if (x.fs > 0) {
      o.gemm("shared up (weight)", x.h, 2 * x.fs / x.t, x.T, 1, x.e);
      o.gemm("shared down (weight)", x.fs / x.t, x.h, x.T, 1, x.e);
      if (x.shared_gate) o.gemm("shared gate (weight)", x.h, 1, x.T, 1, x.e);
    }
  } else {
    o.gemm("mlp up (weight)", x.h, up, x.T, 1, x.e);
    o.gemm("mlp down (weight)", x.f / x.t, x.h, x.T, 1, x.e);
  }
  // Bias gradients: each a sum of the output gradient over the tokens.
  const double mlp_bias = x.biases && !x.moe ? up + x.h : 0;
  const double bias_rows = (x.qkv_bias ? (x.q + 2 * x.kv) / x.t : 0) + (x.out_bias ? x.h : 0) + mlp_bias;
  if (bias_rows > 0) o.memory("bias gradients", x.e * x.T * bias_rows);
}

void embedding(Ops& o, const Dims& x, OpPass pass) {
  const double n = x.T * x.h;  // a vocab-parallel rank looks up every token (masking its rows)
  switch (pass) {
    case OpPass::forward:
      o.memory("embedding look-up", 2 * x.e * n);
      if (x.learned_positions) o.memory("position add", 3 * x.e * n);
      if (x.dropout) o.memory("embedding dropout", (2 * x.e + 1) * n);
      break;
    case OpPass::backward_data:
      if (x.dropout) o.memory("embedding dropout (backward)", (2 * x.e + 1) * n);
      break;
    case OpPass::backward_weight:
      // Scatter-add of the gradient rows into fp32 gradient tables (word, and positions).
      o.memory("embedding gradient", (x.e + 8) * n * (x.learned_positions ? 2 : 1));
      break;
  }
}

// Multi-token prediction's module (model/zoo_transformer.cpp, mtp_layer): the look-up of the
// tokens ahead (vocabulary-parallel: every rank looks up every token), the two inputs' norms
// and their concatenation, eh_proj (2h -> h, column-parallel), the decoder block. Its final
// norm runs in the head's pass for it.
void mtp(Ops& o, const Dims& x, OpPass pass, const OpOptions& opt) {
  const double n = x.Tn * x.h;
  switch (pass) {
    case OpPass::forward:
      o.memory("mtp embedding look-up", 2 * x.e * x.T * x.h);
      o.memory("mtp input norms", 2 * 2 * x.e * n);
      o.memory("mtp concatenation", 2 * 2 * x.e * x.T * x.h);
      o.gemm("eh_proj", x.T, x.h / x.t, 2 * x.h, 1, x.e);
      transformer_forward(o, x, opt);
      break;
    case OpPass::backward_data:
      transformer_backward_data(o, x, opt);
      o.gemm("eh_proj (data)", x.T, 2 * x.h, x.h / x.t, 1, x.e);
      o.memory("mtp input norms (backward)", 2 * 3 * x.e * n);
      break;
    case OpPass::backward_weight:
      transformer_backward_weight(o, x);
      o.gemm("eh_proj (weight)", 2 * x.h, x.h / x.t, x.T, 1, x.e);
      o.memory("mtp embedding gradient", (x.e + 8) * x.T * x.h);  // scatter-add into the copy's fp32 rows
      break;
  }
}

void head(Ops& o, const Dims& x, OpPass pass) {
  const double logits = x.T * x.V / x.t;
  switch (pass) {
    case OpPass::forward:
      o.memory("final norm", 2 * x.e * x.Tn * x.h);
      o.gemm("logits", x.T, x.V / x.t, x.h, 1, x.e);
      // Megatron's vocab-parallel cross-entropy: the logits as fp32, max, exp, sum, loss.
      o.memory("cross entropy", (x.e + 5 * 4) * logits);
      break;
    case OpPass::backward_data:
      o.memory("cross entropy (backward)", (4 + x.e) * logits);
      o.gemm("logits (data)", x.T, x.h, x.V / x.t, 1, x.e);
      o.memory("final norm (backward)", 3 * x.e * x.Tn * x.h);
      break;
    case OpPass::backward_weight:
      o.gemm("logits (weight)", x.h, x.V / x.t, x.T, 1, x.e);
      break;
  }
}

double elems(const std::array<std::int64_t, 3>& d) {
  return static_cast<double>(d[0]) * static_cast<double>(d[1]) * static_cast<double>(d[2]);
}

// A convolutional network's layer (model::CnnOp) for b images: convolutions as implicit
// GEMMs (cuDNN's): forward m = b x output pixels, n = output channels, k = input channels x
// kernel^2; the data gradient as many multiply-adds over the input's pixels (m = b x input
// pixels, n = input channels), none for the layer reading the image; the weight gradient
// m = output channels, n = input channels x kernel^2, k = b x output pixels. A fully
// connected layer is the 1 x 1 case. Memory-bound operations read and write their tensors
// once: BatchNorm 2 forward, 3 backward (x, dY in; dX out); ReLU 2 and 3 (Y, dY in);
// max pool input + output forward, plus 8 bytes an output for its int64 indices, and back;
// average pool input + output each way; residual add 3 forward, 3 backward (the block
// input's two gradients summed); bias 2 forward, its gradient a read of dY.
void cnn_layer(Ops& o, const model::Layer& layer, OpPass pass, double b, double e) {
  using K = model::CnnOp::Kind;
  // A memory-bound operation: its bytes forward, and in the data gradient's pass.
  const auto memory_pass = [&o, pass](std::string_view forward, double forward_bytes, std::string_view backward,
                                      double backward_bytes) {
    if (pass == OpPass::forward) o.memory(forward, forward_bytes);
    if (pass == OpPass::backward_data) o.memory(backward, backward_bytes);
  };
  for (const model::CnnOp& op : layer.cnn_ops) {
    const double in = b * elems(op.in), out = b * elems(op.out);
    switch (op.kind) {
      case K::conv:
      case K::fc: {
        const bool conv = op.kind == K::conv;
        const double pixels_out = conv ? b * static_cast<double>(op.out[0] * op.out[1]) : b;
        const double pixels_in = conv ? b * static_cast<double>(op.in[0] * op.in[1]) : b;
        const double n = conv ? static_cast<double>(op.out[2]) : elems(op.out);
        const double k = conv ? static_cast<double>(op.in[2]) * op.kernel * op.kernel : elems(op.in);
        const double in_channels = conv ? static_cast<double>(op.in[2]) : elems(op.in);
        if (pass == OpPass::forward) {
          o.gemm(conv ? "convolution" : "fully connected", pixels_out, n, k, 1, e);
        } else if (pass == OpPass::backward_data && op.input_grad) {
          o.gemm(conv ? "convolution (data)" : "fully connected (data)", pixels_in, in_channels,
                 pixels_out * n * k / (pixels_in * in_channels), 1, e);
        } else if (pass == OpPass::backward_weight) {
          o.gemm(conv ? "convolution (weight)" : "fully connected (weight)", n, k, pixels_out, 1, e);
        }
        break;
      }
      case K::batch_norm:
        memory_pass("batch norm", 2 * e * out, "batch norm (backward)", 3 * e * out);
        break;
      case K::relu:
        memory_pass("relu", 2 * e * out, "relu (backward)", 3 * e * out);
        break;
      case K::max_pool:
        memory_pass("max pool", e * in + (e + 8) * out, "max pool (backward)", (e + 8) * out + e * in);
        break;
      case K::avg_pool:
        memory_pass("average pool", e * (in + out), "average pool (backward)", e * (in + out));
        break;
      case K::add:
        memory_pass("residual add", 3 * e * out, "residual add (backward)", 3 * e * out);
        break;
      case K::bias:
        if (pass == OpPass::forward) o.memory("bias", 2 * e * out);
        if (pass == OpPass::backward_weight) o.memory("bias (weight)", e * out);
        break;
    }
  }
}

bool is_decoder(const model::Network& network) {
  return network.architecture.has_value() && !network.architecture->encoder && network.architecture->hidden > 0 &&
         network.architecture->heads > 0 && network.architecture->seq > 0;
}

// Every layer that computes lists its operations.
bool is_cnn(const model::Network& network) {
  bool any = false;
  for (const model::Layer& l : network.layers) {
    if (l.forward_flops > 0 && l.cnn_ops.empty()) return false;
    any = any || !l.cnn_ops.empty();
  }
  return any;
}

}  // namespace

bool has_layer_ops(const model::Network& network) { return is_decoder(network) || is_cnn(network); }

std::vector<Op> layer_ops(const model::Network& network, int layer, OpPass pass, const OpShape& shape,
                          const OpOptions& options) {
  if (!has_layer_ops(network) || layer < 0 || static_cast<size_t>(layer) >= network.layers.size() || shape.tensor < 1 ||
      shape.micro_batch < 1) {
    return {};
  }
  if (!is_decoder(network)) {
    Ops o;
    cnn_layer(o, network.layers[static_cast<size_t>(layer)], pass, shape.micro_batch, shape.element_bytes);
    return o.take();
  }
  const Dims x = dims_of(*network.architecture, shape, layer - 1);  // layer 0 is the embedding
  const std::string& kind = network.layers[static_cast<size_t>(layer)].kind;
  Ops o;
  if (kind == "transformer") {
    switch (pass) {
      case OpPass::forward: transformer_forward(o, x, options); break;
      case OpPass::backward_data: transformer_backward_data(o, x, options); break;
      case OpPass::backward_weight: transformer_backward_weight(o, x); break;
    }
  } else if (kind == "embedding") {
    embedding(o, x, pass);
  } else if (kind == "head") {
    // The main model's pass and one for each multi-token prediction module's output.
    for (int p = 0; p <= network.architecture->mtp_layers; ++p) head(o, x, pass);
  } else if (kind == "mtp") {
    mtp(o, x, pass, options);
  }
  return o.take();
}

std::string_view to_string(OpClass c) {
  switch (c) {
    case OpClass::gemm: return "gemm";
    case OpClass::attention: return "attention";
    case OpClass::memory: return "memory";
  }
  return "memory";
}

}  // namespace hetflow::partition
