#include "partition/tp_calls.hpp"

#include <algorithm>
#include <cmath>

#include "partition/expert_shard.hpp"

namespace hetflow::partition {

namespace {

using model::TpCall;

// A layer's forward calls as the pass performs them (kind, elements, point in the layer).
void forward_calls(const std::vector<TpCall>& calls, bool sp, std::vector<PassCall>& out) {
  for (const TpCall& c : calls) {
    switch (c.op) {
      case TpCall::Op::f:
        if (sp) out.push_back({CollectiveKind::all_gather, c.elems, c.at});
        break;
      case TpCall::Op::g:
        out.push_back({sp ? CollectiveKind::reduce_scatter : CollectiveKind::all_reduce, c.elems, c.at});
        break;
      case TpCall::Op::loss:
        out.push_back({CollectiveKind::all_reduce, c.elems, c.at});
        break;
    }
  }
}

void backward_calls(const std::vector<TpCall>& calls, bool sp, std::vector<PassCall>& out) {
  for (auto c = calls.rbegin(); c != calls.rend(); ++c) {
    const double at = 1 - c->at;
    switch (c->op) {
      case TpCall::Op::g:
        if (sp) out.push_back({CollectiveKind::all_gather, c->elems, at});
        break;
      case TpCall::Op::f:
        if (sp) {
          out.push_back({CollectiveKind::all_gather, c->elems, at});
          out.push_back({CollectiveKind::reduce_scatter, c->elems, at});
        } else {
          out.push_back({CollectiveKind::all_reduce, c->elems, at});
        }
        break;
      case TpCall::Op::loss:
        break;
    }
  }
}

// An MoE layer's forward calls under expert parallelism (Megatron-Core's all-to-all dispatcher,
// sequence parallel): the attention's as any layer's; the routed experts' inputs the dispatch
// brought to each device of the rank all-gathered over the tensor group just after it, their
// outputs reduce-scattered just before the combine (`copies` elements: all the rank's copies);
// a shared expert's MLP calls after the combine. A gather's backward is a reduce-scatter alone
// (the experts keep their gathered inputs for the weight gradients), the scatter's a gather.
struct MoeCall {
  enum Kind { tp, gather_copies, scatter_copies } kind = tp;
  TpCall call;
};

std::vector<MoeCall> moe_forward_calls(const model::TransformerConfig& c, const model::Layer& l, double copies) {
  std::vector<TpCall> calls = model::tp_calls_of(l);
  std::vector<TpCall> mlp;  // the layer's last f and last g: its MLP's, the shared expert's now
  for (const TpCall::Op op : {TpCall::Op::g, TpCall::Op::f}) {
    for (size_t k = calls.size(); k-- > 0;) {
      if (calls[k].op != op) continue;
      mlp.insert(mlp.begin(), calls[k]);
      calls.erase(calls.begin() + static_cast<std::ptrdiff_t>(k));
      break;
    }
  }
  const ExchangePoints x = exchange_points(c, l);
  const double step = (x.combine - x.dispatch) * 1e-6;  // just after the dispatch, just before the combine
  std::vector<MoeCall> out;
  for (const TpCall& call : calls) out.push_back({MoeCall::tp, call});
  out.push_back({MoeCall::gather_copies, {TpCall::Op::f, copies, x.dispatch + step}});
  out.push_back({MoeCall::scatter_copies, {TpCall::Op::g, copies, x.combine - step}});
  if (c.moe.shared_experts > 0) {
    for (const TpCall& call : mlp) {
      out.push_back({MoeCall::tp, {call.op, call.elems, call.op == TpCall::Op::f ? x.combine + step : 1.0}});
    }
  }
  return out;
}

void moe_calls(const model::TransformerConfig& c, const model::Layer& l, double copies, bool backward,
               std::vector<PassCall>& out) {
  const std::vector<MoeCall> calls = moe_forward_calls(c, l, copies);
  if (!backward) {
    for (const MoeCall& m : calls) {
      if (m.kind == MoeCall::tp) forward_calls({m.call}, true, out);
      if (m.kind == MoeCall::gather_copies) out.push_back({CollectiveKind::all_gather, m.call.elems, m.call.at});
      if (m.kind == MoeCall::scatter_copies) out.push_back({CollectiveKind::reduce_scatter, m.call.elems, m.call.at});
    }
    return;
  }
  for (auto m = calls.rbegin(); m != calls.rend(); ++m) {
    if (m->kind == MoeCall::tp) backward_calls({m->call}, true, out);
    if (m->kind == MoeCall::gather_copies) out.push_back({CollectiveKind::reduce_scatter, m->call.elems, 1 - m->call.at});
    if (m->kind == MoeCall::scatter_copies) out.push_back({CollectiveKind::all_gather, m->call.elems, 1 - m->call.at});
  }
}

// A mixture of experts' layer without expert groups: every rank routes every token (the MLP's
// gather brings them under sequence parallelism) and its experts' columns give a part of each
// output, so its backward sums the combine weights' gradients (and a shared gate's) over the
// tensor group before the router's backward: an all-reduce of tokens x (top-k, + 1 for the
// gate) between the MLP's gather of its input and the reduction of its input's gradient.
void routed_backward_calls(const model::TransformerConfig& c, const model::Layer& l, bool sp, std::vector<PassCall>& out) {
  const std::vector<TpCall> calls = model::tp_calls_of(l);
  size_t mlp = calls.size();  // the layer's last f: its MLP's
  for (size_t k = calls.size(); k-- > 0 && mlp == calls.size();) {
    if (calls[k].op == TpCall::Op::f) mlp = k;
  }
  const bool gated = c.moe.shared_expert_gate && c.moe.shared_experts > 0;
  const double weights = static_cast<double>(c.seq) * (c.moe.experts_per_token + (gated ? 1 : 0));
  for (size_t k = calls.size(); k-- > 0;) {
    if (k != mlp) {
      backward_calls({calls[k]}, sp, out);
      continue;
    }
    const double at = 1 - calls[k].at;
    if (sp) out.push_back({CollectiveKind::all_gather, calls[k].elems, at});
    out.push_back({CollectiveKind::all_reduce, weights, at});
    out.push_back({sp ? CollectiveKind::reduce_scatter : CollectiveKind::all_reduce, calls[k].elems, at});
  }
}

}  // namespace

std::vector<PassCall> place_pass_calls(const model::Network& net, const PassShape& pass, const LayerCalls& calls_of) {
  // Each part's work in the pass and its calls, placed at (work before it + point x its work).
  struct Placed {
    double begin, work;
    size_t first, count;  // its calls in `raw`, with points within the part
  };
  std::vector<PassCall> raw;
  std::vector<Placed> parts;
  double total = 0;
  const auto place = [&](const model::Layer& l, LayerPart part, double work) {
    const size_t first = raw.size();
    calls_of(l, part, raw);
    parts.push_back({total, work, first, raw.size() - first});
    total += work;
  };
  const double t = pass.tensor;
  for (int k = 0; k < pass.layer_end - pass.layer_begin; ++k) {
    const int i = pass.backward ? pass.layer_end - 1 - k : pass.layer_begin + k;
    const model::Layer& l = net.layers[static_cast<size_t>(i)];
    const double split = l.tp_splittable ? t : 1;
    if (!pass.backward) {
      place(l, LayerPart::forward, l.forward_flops / split);
      continue;
    }
    const double backward = (pass.split_backward ? l.backward_flops / 2 : l.backward_flops) / split;
    double rerun = 0;
    if (pass.recompute == Recompute::full && l.forward_flops > 0) rerun = l.forward_flops / split;
    if (pass.recompute == Recompute::selective) rerun = l.attention_core_flops / split;
    if (!l.tp_splittable) {  // (the embedding, the head: no call between its rerun and its backward)
      place(l, LayerPart::backward, rerun + backward);
    } else {
      place(l, LayerPart::rerun, rerun);
      place(l, LayerPart::backward, backward);
    }
  }
  std::vector<PassCall> out;
  for (const Placed& p : parts) {
    for (size_t k = p.first; k < p.first + p.count; ++k) {
      const auto place_point = [&](double x) { return total > 0 ? (p.begin + x * p.work) / total : 1; };
      raw[k].at = place_point(raw[k].at);
      if (raw[k].until >= 0) raw[k].until = place_point(raw[k].until);
      out.push_back(raw[k]);
    }
  }
  strictly_increasing(out);
  return out;
}

std::vector<PassCall> pass_tp_calls(const model::Network& net, const PassShape& pass) {
  if (pass.tensor <= 1) return {};
  return place_pass_calls(net, pass, [&](const model::Layer& l, LayerPart part, std::vector<PassCall>& out) {
    if (!l.tp_splittable) return;
    const size_t first = out.size();
    const bool rerun = part == LayerPart::rerun && pass.recompute == Recompute::full && l.forward_flops > 0;
    const bool moe = pass.experts > 1 && l.experts > 0 && net.architecture;
    // All of the rank's copies: its tokens x top-k in its expert rank's load, a whole number of
    // them (of its 1/context of the tokens, as the division below makes it), hidden wide.
    const model::TransformerConfig* c = net.architecture ? &*net.architecture : nullptr;
    const double copies = moe ? std::round(c->seq / static_cast<double>(pass.context) * c->moe.experts_per_token *
                                           pass.expert_load) *
                                    pass.context * c->hidden
                              : 0;
    if (part == LayerPart::forward || rerun) {  // (the rerun: the layer's forward again)
      if (moe) {
        moe_calls(*net.architecture, l, copies, false, out);
      } else {
        forward_calls(model::tp_calls_of(l), pass.sequence_parallel, out);
      }
    } else if (part == LayerPart::backward) {
      if (moe) {
        moe_calls(*net.architecture, l, copies, true, out);
      } else if (c != nullptr && l.experts > 0) {
        routed_backward_calls(*c, l, pass.sequence_parallel, out);
      } else {
        backward_calls(model::tp_calls_of(l), pass.sequence_parallel, out);
      }
    }
    for (size_t k = first; k < out.size(); ++k) out[k].elems /= pass.context;  // the rank's tokens' share
  });
}

void strictly_increasing(std::vector<PassCall>& calls) {
  for (size_t k = 1; k < calls.size(); ++k) {
    if (!(calls[k].at > calls[k - 1].at)) calls[k].at = std::nextafter(calls[k - 1].at, 2.0);
  }
  for (size_t k = calls.size(); k-- > 0;) {
    const double limit = k + 1 < calls.size() ? std::nextafter(calls[k + 1].at, -1.0) : 1.0;
    if (calls[k].at > limit) calls[k].at = limit;
  }
  for (size_t k = 0; k < calls.size(); ++k) {
    if (calls[k].until < 0) continue;
    const double next = k + 1 < calls.size() ? calls[k + 1].at : 1.0;
    calls[k].until = std::clamp(calls[k].until, calls[k].at, std::max(calls[k].at, next));
  }
}

std::vector<PassCallGroup> group_calls(const std::vector<PassCall>& calls) {
  std::vector<PassCallGroup> groups;
  std::vector<char> overlapped;  // per group: whether any of its calls overlaps the pass
  for (const PassCall& call : calls) {
    size_t g = 0;
    while (g < groups.size() && (groups[g].kind != call.kind || groups[g].elems != call.elems)) ++g;
    if (g == groups.size()) {
      groups.push_back({call.kind, call.elems, {}, {}});
      overlapped.push_back(0);
    }
    groups[g].points.push_back(call.at);
    groups[g].until.push_back(call.until >= 0 ? call.until : call.at);
    overlapped[g] = overlapped[g] || call.until >= 0;
  }
  for (size_t g = 0; g < groups.size(); ++g) {
    if (!overlapped[g]) groups[g].until.clear();
  }
  return groups;
}

double summed_gain_elems(const model::Network& net, int layer_begin, int layer_end, int tensor, bool sequence_parallel) {
  if (tensor <= 1) return 0;
  double elems = 0;
  for (int i = layer_begin; i < layer_end; ++i) {
    const model::Layer& l = net.layers[static_cast<size_t>(i)];
    if (!l.tp_splittable) continue;
    elems += l.tp_summed_gains + (sequence_parallel ? l.tp_summed_gains_sequence_parallel : 0);
  }
  return elems;
}

}  // namespace hetflow::partition
