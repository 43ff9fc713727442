// The context axis: the virtual workers of a context group each compute 1/C of every
// sequence's tokens (Layout::axes), Llama 3's context parallelism by all-gather (Dubey et al.
// 2024, section 3.3.2): a layer's attention needs every key and value of the sequence, so
// each pass all-gathers them over the group just before the attention, inside its compute
// task, one group per position (rank and tensor rank) across the C workers. The backward
// all-gathers them again (the stash keeps the device's own keys and values only) and
// reduce-scatters their gradients back to the tokens' owners after the attention's backward.
// Full recomputation reruns the forward's gather first. Everything else a device does is per
// token, and so 1/C of the whole (chunk_work, layer_ops' OpShape::context).
#include <algorithm>
#include <cmath>

#include "partition/axis_registry.hpp"

namespace hetflow::partition {

namespace {

// Where a decoder layer's attention sits in its forward FLOPs: after the QKV projection, for
// attention_core_flops.
struct AttentionPlace {
  double begin = 0, end = 0;  // parts of the layer's forward FLOPs
};

AttentionPlace attention_place(const model::TransformerConfig& c, const model::Layer& l) {
  const double d = c.head_size(), q = c.heads * d, kv = c.kv_head_count() * d;
  const double qkv = 2.0 * c.seq * c.hidden * (q + 2 * kv);
  const double begin = std::clamp(qkv / l.forward_flops, 0.0, 1.0);
  return {begin, std::clamp(begin + l.attention_core_flops / l.forward_flops, begin, 1.0)};
}

}  // namespace

// Keys and values of the whole sequence on one tensor rank, per sample: the rank's KV heads
// (a 1/t share of them, or one head where there are fewer than t, replicated as Megatron
// does), twice (keys and values).
double context_kv_elems(const model::TransformerConfig& c, int tensor) {
  const int g = c.kv_head_count();
  const double heads = g >= tensor ? static_cast<double>(g) / tensor : 1.0;
  return 2.0 * c.seq * heads * c.head_size();
}

std::vector<PassCall> pass_context_calls(const model::Network& net, const PassShape& pass) {
  std::vector<PassCall> out;
  if (pass.context <= 1 || !net.architecture) return out;
  const model::TransformerConfig& c = *net.architecture;
  const double kv = context_kv_elems(c, pass.tensor), t = pass.tensor;
  double total = 0;
  struct Placed {
    double begin, work;
    size_t first, count;
  };
  std::vector<Placed> layers;
  const auto place = [&](double work, auto&& add) {
    const size_t first = out.size();
    add();
    layers.push_back({total, work, first, out.size() - first});
    total += work;
  };
  for (int k = 0; k < pass.layer_end - pass.layer_begin; ++k) {
    const int i = pass.backward ? pass.layer_end - 1 - k : pass.layer_begin + k;
    const model::Layer& l = net.layers[static_cast<size_t>(i)];
    const double split = l.tp_splittable ? t : 1;
    const bool attends = l.attention_core_flops > 0 && l.forward_flops > 0;
    const AttentionPlace a = attends ? attention_place(c, l) : AttentionPlace{};
    if (!pass.backward) {
      place(l.forward_flops / split, [&] {
        if (attends) out.push_back({CollectiveKind::all_gather, kv, a.begin});
      });
      continue;
    }
    const double backward = (pass.split_backward ? l.backward_flops / 2 : l.backward_flops) / split;
    double rerun = 0;
    if (pass.recompute == Recompute::full && l.forward_flops > 0) rerun = l.forward_flops / split;
    if (pass.recompute == Recompute::selective) rerun = l.attention_core_flops / split;
    if (pass.recompute == Recompute::full && attends) {  // the forward again, its gather first
      place(rerun, [&] { out.push_back({CollectiveKind::all_gather, kv, a.begin}); });
    } else {
      total += rerun;
    }
    // The backward mirrors the forward: the MLP's, then the attention's, then QKV's.
    place(backward, [&] {
      if (!attends) return;
      out.push_back({CollectiveKind::all_gather, kv, 1 - a.end});
      out.push_back({CollectiveKind::reduce_scatter, kv, 1 - a.begin});
    });
  }
  for (const Placed& p : layers) {
    for (size_t k = p.first; k < p.first + p.count; ++k) out[k].at = total > 0 ? (p.begin + out[k].at * p.work) / total : 1;
  }
  strictly_increasing(out);
  return out;
}

AxisRules context_axis() {
  AxisRules rules;
  rules.axis = Axis::context;
  rules.role = CommRole::context;
  rules.scope = AxisScope::in_context_group;
  rules.pass_calls = pass_context_calls;
  rules.group_prefix = "cp";
  rules.call_purpose = [](CollectiveKind) { return Purpose::context_parallel; };
  return rules;
}

}  // namespace hetflow::partition
