// A mixture-of-experts MLP's forward and backward (decoder.hpp's promises; decoder_ops.def's
// MoE ops): the router's softmax and top-k on the device, the copies' order built on the host
// from the choices (as Megatron's dispatcher syncs its token counts), copies past an expert's
// capacity dropped where the shape asks, each expert's SwiGLU as linear ops on its run of
// rows, the weighted combine, the shared experts beside.
//
// The load-balancing loss is Megatron-Core's (switch_load_balancing_loss_func), per layer and
// micro-batch of N tokens: aux = coef E / (N^2 K) sum_e P_e c_e, with P_e the sum over tokens
// of expert e's router probability and c_e the tokens that chose e. It enters the objective
// weighted as the micro-batch's tokens are (loss_scale N), so its gradient of each
// probability is loss_scale coef E c_e / (N K), the same for every token.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "exec/decoder_detail.hpp"

namespace hetflow::exec {

using namespace decoder_detail;

namespace {

// The copies' order from the router's choices: expert by expert, each expert's tokens in
// order; past an expert's capacity (DecoderShape::Moe::capacity_factor) the copies of the
// smallest weights are dropped (slot -1). Fills a.rows, a.slots, a.offsets; returns the
// tokens that chose each expert (dropped or not: what the load-balancing loss counts).
std::vector<int> order_copies(const Dims& d, MoeActs& a) {
  const DecoderShape::Moe& m = *d.moe;
  const size_t choices = sz(1LL * d.N * m.K);
  std::vector<int> chosen(choices);
  d.ops.download_ints(chosen.data(), a.experts.data(), choices);
  std::vector<int> count(sz(m.E), 0);
  for (const int e : chosen) ++count[sz(e)];
  std::vector<char> kept(choices, 1);
  if (m.capacity_factor > 0) {
    const int capacity = static_cast<int>(std::ceil(static_cast<double>(choices) / m.E * m.capacity_factor));
    std::vector<float> weights(choices);
    d.ops.download(weights.data(), a.weights.data(), choices);
    std::vector<std::vector<size_t>> of(sz(m.E));
    for (size_t i = 0; i < choices; ++i) of[sz(chosen[i])].push_back(i);
    for (std::vector<size_t>& copies : of) {
      if (static_cast<int>(copies.size()) <= capacity) continue;
      // (the choices are in token order: a stable sort breaks ties to the earlier token)
      std::stable_sort(copies.begin(), copies.end(), [&](size_t x, size_t y) { return weights[x] > weights[y]; });
      for (size_t j = sz(capacity); j < copies.size(); ++j) kept[copies[j]] = 0;
    }
  }
  std::vector<int> held(sz(m.E), 0);
  for (size_t i = 0; i < choices; ++i) held[sz(chosen[i])] += kept[i];
  a.offsets.assign(sz(m.E) + 1, 0);
  for (int e = 0; e < m.E; ++e) a.offsets[sz(e) + 1] = a.offsets[sz(e)] + held[sz(e)];
  std::vector<int> next(a.offsets.begin(), a.offsets.end() - 1), rows(sz(a.offsets.back())), slots(choices, -1);
  for (size_t i = 0; i < choices; ++i) {
    if (!kept[i]) continue;
    const int copy = next[sz(chosen[i])]++;
    rows[sz(copy)] = static_cast<int>(i / sz(m.K));
    slots[i] = copy;
  }
  a.rows = d.ops.ints(rows.data(), rows.size());
  a.slots = d.ops.ints(slots.data(), choices);
  return count;
}

// f(expert, its first copy, its copies) for each expert with copies, in expert order.
template <class F>
void each_run(const MoeActs& a, F f) {
  for (size_t e = 0; e + 1 < a.offsets.size(); ++e) {
    const int at = a.offsets[e], rows = a.offsets[e + 1] - at;
    if (rows > 0) f(e, sz(at), rows);
  }
}

// A SwiGLU's two input projections: gate and up [rows, F] from x [rows, C].
void swiglu_in(const DecoderOps& ops, float* gate, float* up, const float* x, const float* gate_w, const float* up_w,
               int rows, int C, int F) {
  ops.linear_forward(gate, x, gate_w, nullptr, rows, C, F);
  ops.linear_forward(up, x, up_w, nullptr, rows, C, F);
}

}  // namespace

void decoder_detail::moe_forward(const Dims& d, const BlockParams& p, const float* w, MoeActs& a, const Floats& x,
                                 float* y) {
  const DecoderOps& ops = d.ops;
  const DecoderShape::Moe& m = *d.moe;
  const int N = d.N, C = d.C, E = m.E, K = m.K, FE = m.FE;
  // The router.
  const Floats logits = ops.floats(sz(1LL * N * E));
  ops.linear_forward(logits.data(), x.data(), w + p.router_w, nullptr, N, C, E);
  a.probs = ops.floats(logits.size());
  a.weights = ops.floats(sz(1LL * N * K));
  const std::vector<int> none(a.weights.size(), 0);
  a.experts = ops.ints(none.data(), none.size());
  ops.moe_router_forward(a.probs.data(), a.weights.data(), a.experts.data(), logits.data(), N, E, K, m.normalize ? 1 : 0);
  const std::vector<int> count = order_copies(d, a);
  const int M = a.offsets.back();  // the copies kept
  {  // The loss's value, for the report (its gradient needs only the counts).
    std::vector<float> probs(a.probs.size());
    ops.download(probs.data(), a.probs.data(), probs.size());
    std::vector<double> P(sz(E), 0.0);
    for (size_t i = 0; i < probs.size(); ++i) P[i % sz(E)] += probs[i];
    double sum = 0;
    for (int e = 0; e < E; ++e) sum += P[sz(e)] * count[sz(e)];
    a.balance = sum * E / (1.0 * N * N * K);
  }
  if (m.aux_coef > 0) {
    std::vector<float> dprobs(sz(E));
    for (int e = 0; e < E; ++e) {
      dprobs[sz(e)] = static_cast<float>(static_cast<double>(d.loss_scale) * m.aux_coef * E * count[sz(e)] / (1.0 * N * K));
    }
    a.dprobs = ops.floats(sz(E));
    ops.upload(a.dprobs.data(), dprobs.data(), sz(E));
  }
  // Each expert's SwiGLU on its run of copies.
  a.xp = ops.floats(sz(1LL * M * C));
  ops.moe_permute(a.xp.data(), x.data(), a.rows.data(), M, C);
  a.gate = ops.floats(sz(1LL * M * FE));
  a.up = ops.floats(a.gate.size());
  a.act = ops.floats(a.gate.size());
  a.out = ops.floats(a.xp.size());
  each_run(a, [&](size_t e, size_t at, int rows) {
    swiglu_in(ops, a.gate.data() + at * sz(FE), a.up.data() + at * sz(FE), a.xp.data() + at * sz(C),
              w + p.expert_gate_w[e], w + p.expert_up_w[e], rows, C, FE);
  });
  ops.swiglu_forward(a.act.data(), a.gate.data(), a.up.data(), static_cast<long>(a.act.size()));
  each_run(a, [&](size_t e, size_t at, int rows) {
    ops.linear_forward(a.out.data() + at * sz(C), a.act.data() + at * sz(FE), w + p.expert_down_w[e], nullptr, rows,
                       FE, C);
  });
  ops.moe_combine(y, a.out.data(), a.slots.data(), a.weights.data(), N, K, C);
  // The shared experts, every token through them.
  if (m.FS == 0) return;
  const size_t ns = sz(1LL * N * m.FS);
  a.shared_gate = ops.floats(ns);
  a.shared_up = ops.floats(ns);
  a.shared_act = ops.floats(ns);
  swiglu_in(ops, a.shared_gate.data(), a.shared_up.data(), x.data(), w + p.shared_gate_w, w + p.shared_up_w, N, C, m.FS);
  ops.swiglu_forward(a.shared_act.data(), a.shared_gate.data(), a.shared_up.data(), static_cast<long>(ns));
  const Floats out = ops.floats(sz(1LL * N * C));
  ops.linear_forward(out.data(), a.shared_act.data(), w + p.shared_down_w, nullptr, N, m.FS, C);
  if (p.shared_scale_w == npos) {
    ops.residual_add(y, out.data(), static_cast<long>(out.size()));
    return;
  }
  a.shared_out = out;
  a.scale = ops.floats(sz(N));
  ops.linear_forward(a.scale.data(), x.data(), w + p.shared_scale_w, nullptr, N, C, 1);
  ops.gated_add(y, a.shared_out.data(), a.scale.data(), N, C);
}

void decoder_detail::moe_backward(const Dims& d, const BlockParams& p, const float* w, MoeActs& a, const Floats& x,
                                  const Floats& dy, float* dx, WeightGrads& wg) {
  const DecoderOps& ops = d.ops;
  const DecoderShape::Moe& m = *d.moe;
  const int N = d.N, C = d.C, E = m.E, K = m.K, FE = m.FE, M = a.offsets.back();
  // The shared experts.
  if (m.FS > 0) {
    const size_t ns = sz(1LL * N * m.FS);
    Floats dout = dy;
    if (p.shared_scale_w != npos) {
      dout = ops.zeros(dy.size());
      const Floats dscale = ops.zeros(sz(N));
      ops.gated_add_backward(dout.data(), dscale.data(), dy.data(), a.shared_out.data(), a.scale.data(), N, C);
      ops.linear_backward_input(dx, dscale.data(), w + p.shared_scale_w, N, C, 1);
      wg.add(p.shared_scale_w, npos, dscale, x, N, C, 1);
    }
    const Floats dact = ops.zeros(ns), dgate = ops.zeros(ns), dup = ops.zeros(ns);
    ops.linear_backward_input(dact.data(), dout.data(), w + p.shared_down_w, N, m.FS, C);
    wg.add(p.shared_down_w, npos, dout, a.shared_act, N, m.FS, C);
    ops.swiglu_backward(dgate.data(), dup.data(), dact.data(), a.shared_gate.data(), a.shared_up.data(),
                        static_cast<long>(ns));
    ops.linear_backward_input(dx, dgate.data(), w + p.shared_gate_w, N, C, m.FS);
    ops.linear_backward_input(dx, dup.data(), w + p.shared_up_w, N, C, m.FS);
    wg.add(p.shared_gate_w, npos, dgate, x, N, C, m.FS);
    wg.add(p.shared_up_w, npos, dup, x, N, C, m.FS);
  }
  // The routed experts, from the combine back to the copies.
  const Floats dout = ops.zeros(sz(1LL * M * C)), dweights = ops.zeros(sz(1LL * N * K));
  ops.moe_combine_backward(dout.data(), dweights.data(), dy.data(), a.out.data(), a.slots.data(), a.weights.data(), N,
                           K, C);
  const Floats dact = ops.zeros(a.act.size());
  each_run(a, [&](size_t e, size_t at, int rows) {
    const size_t f = at * sz(FE), c = at * sz(C);
    ops.linear_backward_input(dact.data() + f, dout.data() + c, w + p.expert_down_w[e], rows, FE, C);
    wg.add_rows(p.expert_down_w[e], npos, dout, c, a.act, f, rows, FE, C);
  });
  const Floats dgate = ops.zeros(a.gate.size()), dup = ops.zeros(a.up.size());
  ops.swiglu_backward(dgate.data(), dup.data(), dact.data(), a.gate.data(), a.up.data(), static_cast<long>(dact.size()));
  const Floats dxp = ops.zeros(a.xp.size());
  each_run(a, [&](size_t e, size_t at, int rows) {
    const size_t f = at * sz(FE), c = at * sz(C);
    ops.linear_backward_input(dxp.data() + c, dgate.data() + f, w + p.expert_gate_w[e], rows, C, FE);
    ops.linear_backward_input(dxp.data() + c, dup.data() + f, w + p.expert_up_w[e], rows, C, FE);
    wg.add_rows(p.expert_gate_w[e], npos, dgate, f, a.xp, c, rows, C, FE);
    wg.add_rows(p.expert_up_w[e], npos, dup, f, a.xp, c, rows, C, FE);
  });
  ops.moe_permute_backward(dx, dxp.data(), a.slots.data(), N, K, C);
  // The router: the weights' gradient and the load-balancing loss's, through the softmax.
  const Floats dlogits = ops.zeros(sz(1LL * N * E));
  ops.moe_router_backward(dlogits.data(), dweights.data(), a.dprobs.empty() ? nullptr : a.dprobs.data(),
                          a.probs.data(), a.weights.data(), a.experts.data(), N, E, K, m.normalize ? 1 : 0);
  ops.linear_backward_input(dx, dlogits.data(), w + p.router_w, N, C, E);
  wg.add(p.router_w, npos, dlogits, x, N, C, E);
}

}  // namespace hetflow::exec
