// The context axis: the virtual workers of a context group each compute 1/C of every
// sequence's tokens (Layout::axes), Llama 3's context parallelism by all-gather (Dubey et al.
// 2024, section 3.3.2): a layer's attention needs every key and value of the sequence, so
// each pass all-gathers them over the group just before the attention, inside its compute
// task, one group per position (rank and tensor rank) across the C workers. The backward
// all-gathers them again (the stash keeps the device's own keys and values only) and
// reduce-scatters their gradients back to the tokens' owners after the attention's backward.
// Full recomputation reruns the forward's gather first. Everything else a device does is per
// token, and so 1/C of the whole (chunk_work, layer_ops' OpShape::context).
//
// Under a ring (Layout::context_comm, Megatron's p2p and Transformer Engine's ring attention,
// Liu et al. 2023) no rank holds the whole sequence's keys and values. The attention runs in
// C steps, one per rank's block (a rank's two chunks), starting with its own: while it
// computes on one block, the block it will use next arrives from the previous rank and the
// one it holds goes to the next (a sendrecv of 1/C of the keys and values, overlapped with
// the step: Collective::until). The forward sends C - 1 blocks. The backward passes the blocks
// around again, and with each the gradient sums of the keys and values of the block its
// receiver worked on last: each block's sum starts at its owner and gains a rank's part per
// step, so after the C steps it is one rank short of home and takes a last, unoverlapped hop.
// The steps of a layer split its attention's work evenly: the zoo counts every query against
// every key (layer_ops), so every block costs alike.
#include <algorithm>
#include <cmath>

#include "partition/axis_registry.hpp"
#include "partition/expert_shard.hpp"

namespace hetflow::partition {

namespace {

// Where a decoder layer's attention sits in its forward FLOPs: after the QKV projection, for
// attention_core_flops (a multi-token prediction module's after its eh_proj too).
struct AttentionPlace {
  double begin = 0, end = 0;  // parts of the layer's forward FLOPs
};

AttentionPlace attention_place(const model::TransformerConfig& c, const model::Layer& l) {
  const double d = c.head_size(), q = c.heads * d, kv = c.kv_head_count() * d;
  const double eh = l.kind == "mtp" ? 2.0 * c.seq * (2.0 * c.hidden) * c.hidden : 0;
  const double qkv = 2.0 * c.seq * c.hidden * (q + 2 * kv);
  const double begin = std::clamp((eh + qkv) / l.forward_flops, 0.0, 1.0);
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

double context_gathered_bytes(const model::Network& net, const Layout& layout, int layer_begin, int layer_end,
                              int tensor) {
  const int group = layout.size(Axis::context);
  if (group <= 1 || !net.architecture) return 0;
  for (int i = layer_begin; i < layer_end; ++i) {
    if (net.layers[static_cast<size_t>(i)].attention_core_flops > 0) {
      const double e = model::element_bytes(layout.precision);
      const double held = layout.context_comm == ContextComm::ring ? 2.0 / group : 1.0;  // two blocks, or all
      return context_kv_elems(*net.architecture, tensor) * held * layout.micro_batch_size * e;
    }
  }
  return 0;
}

namespace {

// A ring's calls in one layer part (the file's comment): `begin` and `end` bound the
// attention's work in the part, `gradients` the backward's.
void ring_calls(double kv, int group, double begin, double end, bool gradients, std::vector<PassCall>& out) {
  const double block = kv / group, step = (end - begin) / group;
  for (int j = 0; j < group - 1; ++j) {  // the block for step j + 1, and the sums of step j - 1
    const double elems = gradients && j > 0 ? 2 * block : block;
    out.push_back({CollectiveKind::sendrecv, elems, begin + j * step, begin + (j + 1) * step});
  }
  if (!gradients) return;
  out.push_back({CollectiveKind::sendrecv, block, begin + (group - 1) * step, end});  // the sums of step C - 2
  out.push_back({CollectiveKind::sendrecv, block, end, -1});  // the sums of step C - 1, home
}

}  // namespace

std::vector<PassCall> pass_context_calls(const model::Network& net, const PassShape& pass) {
  if (pass.context <= 1 || !net.architecture) return {};
  const model::TransformerConfig& c = *net.architecture;
  const double kv = context_kv_elems(c, pass.tensor);
  // (The router's statistics are the micro-batch's, not a sample's: per sample, a share;
  // under a sequence-wise balance loss, each sequence's own.)
  const double statistics = 2.0 * c.moe.experts / (c.moe.sequence_aux_loss ? 1 : std::max(1, pass.micro_batch));
  return place_pass_calls(net, pass, [&](const model::Layer& l, LayerPart part, std::vector<PassCall>& out) {
    if (l.attention_core_flops <= 0 || l.forward_flops <= 0) return;
    const AttentionPlace a = attention_place(c, l);
    const bool forward = part == LayerPart::forward || (part == LayerPart::rerun && pass.recompute == Recompute::full);
    // The router's counts and probability sums, summed over the group just before the
    // dispatch (as far before it as the tensor group's gather is after it, tp_calls.cpp: a
    // step that survives the pass's placement, so the calls of the two axes keep their order).
    const auto router = [&] {
      if (forward && l.experts > 0) {
        const ExchangePoints x = exchange_points(c, l);
        out.push_back({CollectiveKind::all_reduce, statistics, x.dispatch - (x.combine - x.dispatch) * 1e-6});
      }
    };
    if (pass.context_comm == ContextComm::ring) {
      if (forward) ring_calls(kv, pass.context, a.begin, a.end, false, out);
      router();
      if (part == LayerPart::backward) ring_calls(kv, pass.context, 1 - a.end, 1 - a.begin, true, out);
      return;
    }
    if (forward) {
      out.push_back({CollectiveKind::all_gather, kv, a.begin});  // (the rerun: the forward's gather again)
      router();
    } else if (part == LayerPart::backward) {
      // The backward mirrors the forward: the MLP's, then the attention's, then QKV's.
      out.push_back({CollectiveKind::all_gather, kv, 1 - a.end});
      out.push_back({CollectiveKind::reduce_scatter, kv, 1 - a.begin});
    }
  });
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
