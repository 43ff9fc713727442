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
};

Dims dims_of(const model::TransformerConfig& c, const OpShape& shape) {
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

void transformer_forward(Ops& o, const Dims& x, const OpOptions& opt) {
  const double heads = x.a / x.t, scores = x.b * heads * x.s * x.keys;
  o.memory("input norm", 2 * x.e * x.Tn * x.h);
  o.gemm("qkv", x.T, (x.q + 2 * x.kv) / x.t, x.h, 1, x.e);
  if (x.qk_norm) o.memory("qk norm", 2 * x.e * x.T * (x.q + x.kv) / x.t);
  if (x.rope) o.memory("rotary", 2 * x.e * x.T * (x.q + x.kv) / x.t);
  if (opt.flash_attention) {
    o.attention("flash attention", 2 * 2 * scores * x.d, x.e * x.T * (2 * x.q + 2 * x.kv) / x.t);
  } else {
    o.gemm("scores", x.s, x.keys, x.d, x.b * heads, x.e);
    o.memory("softmax", (opt.fused_softmax ? 2 : 6) * x.e * scores);
    if (x.dropout) o.memory("attention dropout", (2 * x.e + 1) * scores);
    o.gemm("context", x.s, x.d, x.keys, x.b * heads, x.e);
  }
  o.gemm("attention projection", x.T, x.h, x.q / x.t, 1, x.e);
  bias_dropout_add(o, x, opt, x.out_bias);
  o.memory("post-attention norm", 2 * x.e * x.Tn * x.h);
  o.gemm("mlp up", x.T, (x.gated ? 2 : 1) * x.f / x.t, x.h, 1, x.e);
  const double wide = x.T * x.f / x.t;
  if (x.gated) {
    o.memory("swiglu", 3 * x.e * wide);
  } else if (opt.fused_bias_gelu || !x.biases) {
    o.memory("bias gelu", 2 * x.e * wide);
  } else {
    o.memory("bias", 2 * x.e * wide);
    o.memory("gelu", 2 * x.e * wide);
  }
  o.gemm("mlp down", x.T, x.h, x.f / x.t, 1, x.e);
  bias_dropout_add(o, x, opt, x.biases);
}

void transformer_backward_data(Ops& o, const Dims& x, const OpOptions& opt) {
  const double heads = x.a / x.t, scores = x.b * heads * x.s * x.keys, residual = x.Tn * x.h;
  // Dropout's backward reads the gradient and the mask; the residual branch adds gradients.
  o.memory("dropout add (backward)", (2 * x.e + x.mask + 3 * x.e) * residual);
  o.gemm("mlp down (data)", x.T, x.f / x.t, x.h, 1, x.e);
  o.memory(x.gated ? "swiglu (backward)" : "gelu (backward)", (x.gated ? 5 : 3) * x.e * x.T * x.f / x.t);
  o.gemm("mlp up (data)", x.T, x.h, (x.gated ? 2 : 1) * x.f / x.t, 1, x.e);
  o.memory("post-attention norm (backward)", 3 * x.e * residual);
  o.memory("dropout add (backward)", (2 * x.e + x.mask + 3 * x.e) * residual);
  o.gemm("attention projection (data)", x.T, x.q / x.t, x.h, 1, x.e);
  if (opt.flash_attention) {
    // Reads Q, K, V, the output and its gradient; writes the gradients of Q, K and V.
    o.attention("flash attention (backward)", 2 * 2 * 2 * scores * x.d, x.e * x.T * (4 * x.q + 4 * x.kv) / x.t);
  } else {
    // Under a sliding window each query meets `keys` keys and each key as many queries.
    o.gemm("context (data)", x.s, x.keys, x.d, x.b * heads, x.e);     // dP = dO V^T
    o.gemm("context (values)", x.s, x.d, x.keys, x.b * heads, x.e);   // dV = P^T dO
    if (x.dropout) o.memory("attention dropout (backward)", (2 * x.e + 1) * scores);
    o.memory("softmax (backward)", 3 * x.e * scores);
    o.gemm("scores (queries)", x.s, x.d, x.keys, x.b * heads, x.e);   // dQ = dS K
    o.gemm("scores (keys)", x.s, x.d, x.keys, x.b * heads, x.e);      // dK = dS^T Q
  }
  if (x.rope) o.memory("rotary (backward)", 2 * x.e * x.T * (x.q + x.kv) / x.t);
  if (x.qk_norm) o.memory("qk norm (backward)", 3 * x.e * x.T * (x.q + x.kv) / x.t);
  o.gemm("qkv (data)", x.T, x.h, (x.q + 2 * x.kv) / x.t, 1, x.e);
  o.memory("input norm (backward)", 3 * x.e * residual);
}

void transformer_backward_weight(Ops& o, const Dims& x) {
  const double up = (x.gated ? 2 : 1) * x.f / x.t;
  o.gemm("qkv (weight)", x.h, (x.q + 2 * x.kv) / x.t, x.T, 1, x.e);
  o.gemm("attention projection (weight)", x.q / x.t, x.h, x.T, 1, x.e);
  o.gemm("mlp up (weight)", x.h, up, x.T, 1, x.e);
  o.gemm("mlp down (weight)", x.f / x.t, x.h, x.T, 1, x.e);
  // Bias gradients: each a sum of the output gradient over the tokens.
  const double bias_rows = (x.qkv_bias ? (x.q + 2 * x.kv) / x.t : 0) + (x.out_bias ? x.h : 0) + (x.biases ? up + x.h : 0);
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
  const Dims x = dims_of(*network.architecture, shape);
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
    head(o, x, pass);
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
