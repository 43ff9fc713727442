#include "model/network.hpp"

#include <algorithm>
#include <utility>

namespace hetflow::model {

namespace {
constexpr std::pair<CnnOp::Kind, std::string_view> kCnnOpNames[] = {
    {CnnOp::Kind::conv, "conv"}, {CnnOp::Kind::fc, "fc"}, {CnnOp::Kind::batch_norm, "batch_norm"},
    {CnnOp::Kind::relu, "relu"}, {CnnOp::Kind::max_pool, "max_pool"}, {CnnOp::Kind::avg_pool, "avg_pool"},
    {CnnOp::Kind::add, "add"},   {CnnOp::Kind::bias, "bias"}};
}  // namespace

std::string_view to_string(CnnOp::Kind kind) {
  for (const auto& [k, name] : kCnnOpNames) {
    if (k == kind) return name;
  }
  return "?";
}

std::optional<CnnOp::Kind> cnn_op_kind(std::string_view name) {
  for (const auto& [k, n] : kCnnOpNames) {
    if (n == name) return k;
  }
  return std::nullopt;
}

std::vector<TpCall> tp_calls_of(const Layer& l) {
  if (!l.tp_calls.empty()) return l.tp_calls;
  std::vector<TpCall> calls;
  const int nf = l.tp_backward_allreduce_elems > 0 ? std::max(1, l.tp_backward_allreduces) : 0;
  const int ng = l.tp_allreduce_elems > 0 ? std::max(1, l.tp_allreduces) : 0;
  const int n = std::max(nf, ng);
  for (int k = 0; k < n; ++k) {
    if (k < nf) calls.push_back({TpCall::Op::f, l.tp_backward_allreduce_elems / nf, static_cast<double>(k) / n});
    if (k < ng) calls.push_back({TpCall::Op::g, l.tp_allreduce_elems / ng, static_cast<double>(k + 1) / n});
  }
  return calls;
}

std::string_view to_string(TpCall::Op op) {
  switch (op) {
    case TpCall::Op::f: return "f";
    case TpCall::Op::g: return "g";
    case TpCall::Op::loss: return "loss";
  }
  return "?";
}

std::optional<TpCall::Op> tp_call_op(std::string_view name) {
  for (const TpCall::Op op : {TpCall::Op::f, TpCall::Op::g, TpCall::Op::loss}) {
    if (to_string(op) == name) return op;
  }
  return std::nullopt;
}

double cnn_op_macs(const CnnOp& op) {
  const auto elems = [](const std::array<std::int64_t, 3>& d) {
    return static_cast<double>(d[0]) * static_cast<double>(d[1]) * static_cast<double>(d[2]);
  };
  if (op.kind == CnnOp::Kind::conv) return elems(op.out) * static_cast<double>(op.in[2]) * op.kernel * op.kernel;
  if (op.kind == CnnOp::Kind::fc) return elems(op.in) * elems(op.out);
  return 0;
}

namespace {
// Token files hold one 2-byte id per token: llm.c's format (version 1, uint16 tokens; see
// exec/token_data.hpp), as GPT-2's 50,257-entry vocabulary fits 16 bits.
constexpr double kTokenBytes = 2;
// ImageNet (ILSVRC-2012) training set: ILSVRC2012_img_train.tar is 147,897,477,120 bytes for
// 1,281,167 JPEGs (image-net.org download page; Russakovsky et al., IJCV 2015, table 2 for the
// count): 115.4 kB a sample, tar headers included.
constexpr double kImageNetJpegBytes = 147897477120.0 / 1281167.0;
}  // namespace

double Network::stored_sample_bytes() const {
  if (sample_bytes > 0) return sample_bytes;
  if (architecture) return tokens_per_sample * kTokenBytes;
  return kImageNetJpegBytes;
}

double Network::param_count() const {
  double total = 0;
  for (const Layer& l : layers) total += l.params;
  return total;
}

double Network::active_param_count() const {
  double total = 0;
  for (const Layer& l : layers) total += l.active_params();
  return total;
}

double Network::forward_flops_per_sample() const {
  double total = 0;
  for (const Layer& l : layers) total += l.forward_flops;
  return total;
}

double Network::backward_flops_per_sample() const {
  double total = 0;
  for (const Layer& l : layers) total += l.backward_flops;
  return total;
}

double Network::cut_bytes(size_t first_after) const {
  // A producer's output crosses the cut once, however many consumers read it after the cut.
  double elems = 0;
  std::vector<bool> counted(layers.size(), false);
  for (size_t c = first_after; c < layers.size(); ++c) {
    for (int p : layers[c].inputs) {
      const auto producer = static_cast<size_t>(p);
      if (producer < first_after && !counted[producer]) {
        counted[producer] = true;
        elems += layers[producer].output_elems;
      }
    }
  }
  return elems * element_bytes(precision);
}

}  // namespace hetflow::model
