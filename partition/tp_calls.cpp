#include "partition/tp_calls.hpp"

#include <algorithm>
#include <cmath>

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
    if (part == LayerPart::forward || rerun) {
      forward_calls(model::tp_calls_of(l), pass.sequence_parallel, out);  // (the rerun: the layer's forward again)
    } else if (part == LayerPart::backward) {
      backward_calls(model::tp_calls_of(l), pass.sequence_parallel, out);
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
