// A mixture-of-experts MLP's forward and backward (decoder.hpp's promises; decoder_ops.def's
// MoE ops): the router's softmax and top-k (or DeepSeek-V3's sigmoid, its balancing bias
// choosing within the best groups) on the device, the copies' order built on the host
// from the choices (as Megatron's dispatcher syncs its token counts), copies past an expert's
// capacity dropped where the shape asks, each expert's SwiGLU as linear ops on its run of
// rows, the weighted combine, the shared experts beside.
//
// The load-balancing loss is Megatron-Core's (switch_load_balancing_loss_func), per layer and
// micro-batch of N tokens: aux = coef E / (N^2 K) sum_e P_e c_e, with P_e the sum over tokens
// of expert e's router probability (a sigmoid router's: its scores over their sum) and c_e
// the tokens that chose e. It enters the objective weighted as the micro-batch's tokens are
// (loss_scale N), so its gradient of each probability is loss_scale coef E c_e / (N K), the
// same for every token. Under context
// parallelism N, P and c are the group's (summed over it: one all-reduce of 2 E floats, where
// Megatron-Core reduces the counts alone and leaves each rank its part of the loss's value),
// and capacity is each rank's own tokens', as Megatron-Core drops them. A sequence-wise loss
// (DeepSeek-V2/V3's; Megatron-Core's seq_aux_loss) is the same over each sequence's T tokens,
// averaged over the micro-batch's sequences: per sequence its own statistics (2 E a sequence
// in the all-reduce) and gradient loss_scale coef E c / (T K).
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
// smallest weights are dropped (slot -1). Fills a.rows, a.slots, a.offsets and `chosen`
// (the choices [N, K], on the host); returns the tokens that chose each expert (dropped or
// not: what the load-balancing loss counts).
std::vector<int> order_copies(const Dims& d, MoeActs& a, std::vector<int>& chosen) {
  const DecoderShape::Moe& m = *d.moe;
  const size_t choices = sz(1LL * d.N * m.K);
  chosen.resize(choices);
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
  // The experts by holder, then index (one holder without expert parallelism).
  const int G = d.experts->size;
  const std::vector<int> holder = d.experts->holders(m.E);
  a.order.resize(sz(m.E));
  for (int e = 0; e < m.E; ++e) a.order[sz(e)] = e;
  std::stable_sort(a.order.begin(), a.order.end(), [&](int x, int y) { return holder[sz(x)] < holder[sz(y)]; });
  std::vector<int> position(sz(m.E));
  a.rank_begin.assign(sz(G) + 1, 0);
  for (int j = 0; j < m.E; ++j) {
    position[sz(a.order[sz(j)])] = j;
    ++a.rank_begin[sz(holder[sz(a.order[sz(j)])]) + 1];
  }
  for (int r = 0; r < G; ++r) a.rank_begin[sz(r) + 1] += a.rank_begin[sz(r)];
  std::vector<int> copies(sz(m.E), 0);  // kept, per position
  for (size_t i = 0; i < choices; ++i) copies[sz(position[sz(chosen[i])])] += kept[i];
  a.offsets.assign(sz(m.E) + 1, 0);
  for (int j = 0; j < m.E; ++j) a.offsets[sz(j) + 1] = a.offsets[sz(j)] + copies[sz(j)];
  std::vector<int> next(a.offsets.begin(), a.offsets.end() - 1), rows(sz(a.offsets.back())), slots(choices, -1);
  for (size_t i = 0; i < choices; ++i) {
    if (!kept[i]) continue;
    const int copy = next[sz(position[sz(chosen[i])])]++;
    rows[sz(copy)] = static_cast<int>(i / sz(m.K));
    slots[i] = copy;
  }
  a.rows = d.ops.ints(rows.data(), rows.size());
  a.slots = d.ops.ints(slots.data(), choices);
  return count;
}

// f(expert, its first row of xe, its rows) for each expert this rank runs that has rows.
template <class F>
void each_run(const MoeActs& a, F f) {
  for (size_t j = 0; j < a.held.size(); ++j) {
    const int at = a.eoffsets[j], rows = a.eoffsets[j + 1] - at;
    if (rows > 0) f(sz(a.held[j]), sz(at), rows);
  }
}

// Expert parallelism's dispatch: this rank's copies [M, C] (in a.order) to their experts'
// holders, and what the other ranks send this one's experts, grouped by expert then source.
// With `counts_first` (the forward's) each message leads with its experts' counts, which fill
// a.held, a.eoffsets and a.recv_counts; later ones (the backward's) reuse them.
Floats to_holders(const Dims& d, MoeActs& a, const Floats& local, bool counts_first) {
  const int G = d.experts->size, C = d.C, E = d.moe->E;
  std::vector<float> host(local.size());
  d.ops.download(host.data(), local.data(), host.size());
  std::vector<float> send;
  std::vector<size_t> parts{0};
  for (int r = 0; r < G; ++r) {
    const int p0 = a.rank_begin[sz(r)], p1 = a.rank_begin[sz(r) + 1];
    if (counts_first) {
      for (int j = p0; j < p1; ++j) send.push_back(static_cast<float>(a.offsets[sz(j) + 1] - a.offsets[sz(j)]));
    }
    send.insert(send.end(), host.begin() + static_cast<std::ptrdiff_t>(sz(a.offsets[sz(p0)]) * sz(C)),
                host.begin() + static_cast<std::ptrdiff_t>(sz(a.offsets[sz(p1)]) * sz(C)));
    parts.push_back(send.size());
  }
  std::vector<size_t> at;
  const std::vector<float> recv = d.egroup->all_to_all(send, parts, at);
  if (counts_first) {
    a.held = d.experts->held(E);
  }
  const size_t H = a.held.size();
  if (at.size() != sz(G) + 1) {
    throw std::logic_error("an expert all-to-all returned " + std::to_string(at.size()) + " offsets");
  }
  if (counts_first) {
    a.recv_counts.assign(sz(G) * H, 0);
    a.eoffsets.assign(H + 1, 0);
    for (int s = 0; s < G; ++s) {
      for (size_t j = 0; j < H; ++j) {
        const int n = static_cast<int>(recv[at[sz(s)] + j]);
        a.recv_counts[sz(s) * H + j] = n;
        a.eoffsets[j + 1] += n;
      }
    }
    for (size_t j = 0; j < H; ++j) a.eoffsets[j + 1] += a.eoffsets[j];
  }
  std::vector<float> grouped(sz(a.eoffsets.back()) * sz(C));
  std::vector<int> filled(a.eoffsets.begin(), a.eoffsets.end() - 1);  // per expert: its next row
  for (int s = 0; s < G; ++s) {
    size_t from = at[sz(s)] + (counts_first ? H : 0);
    size_t expected = from;
    for (size_t j = 0; j < H; ++j) expected += sz(a.recv_counts[sz(s) * H + j]) * sz(C);
    if (expected != at[sz(s) + 1]) {
      throw std::logic_error("expert rank " + std::to_string(s) + " sent " + std::to_string(at[sz(s) + 1] - at[sz(s)]) +
                             " floats where its counts make " + std::to_string(expected - at[sz(s)]));
    }
    for (size_t j = 0; j < H; ++j) {
      const size_t n = sz(a.recv_counts[sz(s) * H + j]) * sz(C);
      std::copy_n(recv.begin() + static_cast<std::ptrdiff_t>(from), n,
                  grouped.begin() + static_cast<std::ptrdiff_t>(sz(filled[j]) * sz(C)));
      filled[j] += a.recv_counts[sz(s) * H + j];
      from += n;
    }
  }
  Floats out = d.ops.floats(grouped.size());
  d.ops.upload(out.data(), grouped.data(), grouped.size());
  return out;
}

// The combine's way back: rows grouped as to_holders made them [R, C] to the ranks whose
// copies they are, and this rank's own [M, C] back in a.order.
Floats to_owners(const Dims& d, const MoeActs& a, const Floats& grouped) {
  const int G = d.experts->size, C = d.C;
  const size_t H = a.held.size();
  std::vector<float> host(grouped.size());
  d.ops.download(host.data(), grouped.data(), host.size());
  std::vector<float> send;
  std::vector<size_t> parts{0};
  std::vector<int> taken(a.eoffsets.begin(), a.eoffsets.end() - 1);
  for (int s = 0; s < G; ++s) {
    for (size_t j = 0; j < H; ++j) {
      const size_t n = sz(a.recv_counts[sz(s) * H + j]) * sz(C);
      send.insert(send.end(), host.begin() + static_cast<std::ptrdiff_t>(sz(taken[j]) * sz(C)),
                  host.begin() + static_cast<std::ptrdiff_t>(sz(taken[j]) * sz(C) + n));
      taken[j] += a.recv_counts[sz(s) * H + j];
    }
    parts.push_back(send.size());
  }
  std::vector<size_t> at;
  const std::vector<float> recv = d.egroup->all_to_all(send, parts, at);
  const size_t mine = sz(a.offsets.back()) * sz(C);
  if (recv.size() != mine) {
    throw std::logic_error("the experts' holders sent back " + std::to_string(recv.size()) + " floats for " +
                           std::to_string(mine));
  }
  Floats out = d.ops.floats(mine);
  d.ops.upload(out.data(), recv.data(), mine);
  return out;
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
  const int N = d.N, C = d.C, E = m.E, K = m.K, FE = d.FE;
  // The router.
  const Floats logits = ops.floats(sz(1LL * N * E));
  ops.linear_forward(logits.data(), x.data(), w + p.router_w, nullptr, N, C, E);
  a.probs = ops.floats(logits.size());
  a.weights = ops.floats(sz(1LL * N * K));
  const std::vector<int> none(a.weights.size(), 0);
  a.experts = ops.ints(none.data(), none.size());
  if (m.sigmoid) {
    ops.moe_sigmoid_router_forward(a.probs.data(), a.weights.data(), a.experts.data(), logits.data(), w + p.router_bias,
                                   N, E, K, m.groups, m.groups_chosen, m.normalize ? 1 : 0, static_cast<float>(m.scale));
  } else {
    ops.moe_router_forward(a.probs.data(), a.weights.data(), a.experts.data(), logits.data(), N, E, K,
                           m.normalize ? 1 : 0);
  }
  std::vector<int> chosen;
  const std::vector<int> count = order_copies(d, a, chosen);
  if (m.sigmoid) {  // (this rank's tokens: the gradients' sum over ranks gives the step's)
    long long all = 0;
    for (const int c : count) all += c;
    a.underload.resize(sz(E));
    for (int e = 0; e < E; ++e) a.underload[sz(e)] = static_cast<float>(all - 1LL * E * count[sz(e)]);
  }
  const int M = a.offsets.back();  // the copies kept
  // The loss's statistics: each expert's tokens and its probability summed over them (the
  // value, for the report; its gradient needs only the counts), over the micro-batch's
  // tokens or, for a sequence-wise loss, over each sequence's (rows of a sample are
  // contiguous). Under context parallelism the tokens are the group's: the plan's all-reduce
  // sums both over it, so every rank's loss and gradient are the whole sequence's.
  const int groups = m.per_sequence ? d.B : 1, group_rows = N / groups;
  std::vector<double> P(sz(groups) * sz(E), 0.0), counted(P.size(), 0.0);
  {
    std::vector<float> probs(a.probs.size());
    ops.download(probs.data(), a.probs.data(), probs.size());
    // (A sigmoid router's probabilities are its scores over their sum, Megatron-Core's.)
    for (size_t row = 0; row < sz(N); ++row) {
      const float* s = probs.data() + row * sz(E);
      double total = 1;
      if (m.sigmoid) {
        total = 1e-20;
        for (int e = 0; e < E; ++e) total += s[e];
      }
      double* into = P.data() + row / sz(group_rows) * sz(E);
      for (int e = 0; e < E; ++e) into[e] += m.sigmoid ? s[e] / total : s[e];
    }
    for (size_t i = 0; i < chosen.size(); ++i) counted[i / sz(K) / sz(group_rows) * sz(E) + sz(chosen[i])] += 1;
  }
  double tokens = group_rows;  // of a group
  if (d.cp > 1) {
    if (d.cgroup == nullptr) throw std::invalid_argument("a mixture of experts under context parallelism needs its group");
    std::vector<float> stats(2 * P.size());  // per group: its counts, then its probability sums
    for (size_t g = 0; g < sz(groups); ++g) {
      for (size_t e = 0; e < sz(E); ++e) {
        stats[2 * g * sz(E) + e] = static_cast<float>(counted[g * sz(E) + e]);  // (exact: fewer than 2^24 tokens)
        stats[(2 * g + 1) * sz(E) + e] = static_cast<float>(P[g * sz(E) + e]);
      }
    }
    d.cgroup->all_reduce(stats, false);
    for (size_t g = 0; g < sz(groups); ++g) {
      for (size_t e = 0; e < sz(E); ++e) {
        counted[g * sz(E) + e] = std::round(stats[2 * g * sz(E) + e]);
        P[g * sz(E) + e] = stats[(2 * g + 1) * sz(E) + e];
      }
    }
    tokens *= d.cp;
  }
  double sum = 0;
  for (size_t i = 0; i < P.size(); ++i) sum += P[i] * counted[i];
  a.balance = sum * E / (tokens * tokens * K) / groups;  // (a sequence-wise loss: the sequences' mean)
  if (m.aux_coef > 0) {
    // Weighted as the micro-batch's tokens (N, or a sequence's T for each of B sequences'
    // losses averaged): each probability's gradient is loss_scale coef E c / (tokens K).
    std::vector<float> dprobs(P.size());
    for (size_t i = 0; i < P.size(); ++i) {
      dprobs[i] = static_cast<float>(static_cast<double>(d.loss_scale) * m.aux_coef * E * counted[i] / (tokens * K));
    }
    a.dprobs = ops.floats(dprobs.size());
    ops.upload(a.dprobs.data(), dprobs.data(), dprobs.size());
  }
  // The copies, to their experts' holders under expert parallelism.
  a.xp = ops.floats(sz(1LL * M * C));
  ops.moe_permute(a.xp.data(), x.data(), a.rows.data(), M, C);
  const bool parallel = d.experts->size > 1;
  if (parallel) {
    if (d.egroup == nullptr) throw std::invalid_argument("an expert-parallel chunk's forward needs its expert group");
    a.xe = to_holders(d, a, a.xp, true);
  } else {
    a.held = a.order;
    a.eoffsets = a.offsets;
    a.xe = a.xp;
  }
  // Each expert's SwiGLU on its run of rows.
  const size_t R = sz(a.eoffsets.back());
  a.gate = ops.floats(R * sz(FE));
  a.up = ops.floats(a.gate.size());
  a.act = ops.floats(a.gate.size());
  const Floats out = ops.floats(R * sz(C));
  each_run(a, [&](size_t e, size_t at, int rows) {
    swiglu_in(ops, a.gate.data() + at * sz(FE), a.up.data() + at * sz(FE), a.xe.data() + at * sz(C),
              w + p.expert_gate_w[e], w + p.expert_up_w[e], rows, C, FE);
  });
  ops.swiglu_forward(a.act.data(), a.gate.data(), a.up.data(), static_cast<long>(a.act.size()));
  each_run(a, [&](size_t e, size_t at, int rows) {
    ops.linear_forward(out.data() + at * sz(C), a.act.data() + at * sz(FE), w + p.expert_down_w[e], nullptr, rows, FE,
                       C);
  });
  a.out = parallel ? to_owners(d, a, out) : out;  // (back to this rank's copies)
  ops.moe_combine(y, a.out.data(), a.slots.data(), a.weights.data(), N, K, C);
  // The shared experts, every token through them.
  if (m.FS == 0) return;
  const size_t ns = sz(1LL * N * d.FS);
  a.shared_gate = ops.floats(ns);
  a.shared_up = ops.floats(ns);
  a.shared_act = ops.floats(ns);
  swiglu_in(ops, a.shared_gate.data(), a.shared_up.data(), x.data(), w + p.shared_gate_w, w + p.shared_up_w, N, C,
            d.FS);
  ops.swiglu_forward(a.shared_act.data(), a.shared_gate.data(), a.shared_up.data(), static_cast<long>(ns));
  const Floats shared = ops.floats(sz(1LL * N * C));
  ops.linear_forward(shared.data(), a.shared_act.data(), w + p.shared_down_w, nullptr, N, d.FS, C);
  if (p.shared_scale_w == npos) {
    ops.residual_add(y, shared.data(), static_cast<long>(shared.size()));
    return;
  }
  a.shared_out = shared;
  a.scale = ops.floats(sz(N));
  ops.linear_forward(a.scale.data(), x.data(), w + p.shared_scale_w, nullptr, N, C, 1);
  ops.gated_add(y, a.shared_out.data(), a.scale.data(), N, C);
}

void decoder_detail::moe_backward(const Dims& d, const BlockParams& p, const float* w, MoeActs& a, const Floats& x,
                                  const Floats& dy, float* dx, WeightGrads& wg) {
  const DecoderOps& ops = d.ops;
  const DecoderShape::Moe& m = *d.moe;
  const int N = d.N, C = d.C, E = m.E, K = m.K, FE = d.FE, FS = d.FS, M = a.offsets.back();
  // Under tensor parallelism every rank routed the same tokens and its experts' columns gave
  // a part of each output: the gradients of the combine's weights and of the shared gate are
  // parts too, summed over the group (the plan's all-reduce) before the router's and the
  // gate's backward, which every rank then runs alike; their input gradients go in on rank 0
  // alone, since the plan's reduction of dx adds every rank's.
  const bool split = d.tp > 1, once = !split || d.rank == 0;
  Floats dscale;  // the shared gate's output gradient
  // The shared experts.
  if (m.FS > 0) {
    const size_t ns = sz(1LL * N * FS);
    Floats dout = dy;
    if (p.shared_scale_w != npos) {
      dout = ops.zeros(dy.size());
      dscale = ops.zeros(sz(N));
      ops.gated_add_backward(dout.data(), dscale.data(), dy.data(), a.shared_out.data(), a.scale.data(), N, C);
      if (!split) {
        ops.linear_backward_input(dx, dscale.data(), w + p.shared_scale_w, N, C, 1);
        wg.add(p.shared_scale_w, npos, dscale, x, N, C, 1);
      }
    }
    const Floats dact = ops.zeros(ns), dgate = ops.zeros(ns), dup = ops.zeros(ns);
    ops.linear_backward_input(dact.data(), dout.data(), w + p.shared_down_w, N, FS, C);
    wg.add(p.shared_down_w, npos, dout, a.shared_act, N, FS, C);
    ops.swiglu_backward(dgate.data(), dup.data(), dact.data(), a.shared_gate.data(), a.shared_up.data(),
                        static_cast<long>(ns));
    ops.linear_backward_input(dx, dgate.data(), w + p.shared_gate_w, N, C, FS);
    ops.linear_backward_input(dx, dup.data(), w + p.shared_up_w, N, C, FS);
    wg.add(p.shared_gate_w, npos, dgate, x, N, C, FS);
    wg.add(p.shared_up_w, npos, dup, x, N, C, FS);
  }
  // The routed experts, from the combine back to the copies.
  const Floats dout = ops.zeros(sz(1LL * M * C)), dweights = ops.zeros(sz(1LL * N * K));
  ops.moe_combine_backward(dout.data(), dweights.data(), dy.data(), a.out.data(), a.slots.data(), a.weights.data(), N,
                           K, C);
  const bool parallel = d.experts->size > 1;
  if (parallel && d.egroup == nullptr) {
    throw std::invalid_argument("an expert-parallel chunk's backward needs its expert group");
  }
  const Floats dout_e = parallel ? to_holders(d, a, dout, false) : dout;  // (to the experts' holders)
  const Floats dact = ops.zeros(a.act.size());
  each_run(a, [&](size_t e, size_t at, int rows) {
    const size_t f = at * sz(FE), c = at * sz(C);
    ops.linear_backward_input(dact.data() + f, dout_e.data() + c, w + p.expert_down_w[e], rows, FE, C);
    wg.add_rows(p.expert_down_w[e], npos, dout_e, c, a.act, f, rows, FE, C);
  });
  const Floats dgate = ops.zeros(a.gate.size()), dup = ops.zeros(a.up.size());
  ops.swiglu_backward(dgate.data(), dup.data(), dact.data(), a.gate.data(), a.up.data(),
                      static_cast<long>(dact.size()));
  const Floats dxe = ops.zeros(a.xe.size());
  each_run(a, [&](size_t e, size_t at, int rows) {
    const size_t f = at * sz(FE), c = at * sz(C);
    ops.linear_backward_input(dxe.data() + c, dgate.data() + f, w + p.expert_gate_w[e], rows, C, FE);
    ops.linear_backward_input(dxe.data() + c, dup.data() + f, w + p.expert_up_w[e], rows, C, FE);
    wg.add_rows(p.expert_gate_w[e], npos, dgate, f, a.xe, c, rows, C, FE);
    wg.add_rows(p.expert_up_w[e], npos, dup, f, a.xe, c, rows, C, FE);
  });
  const Floats dxp = parallel ? to_owners(d, a, dxe) : dxe;  // (back to this rank's copies)
  ops.moe_permute_backward(dx, dxp.data(), a.slots.data(), N, K, C);
  if (split) {
    // One message: the combine's weights' parts, then the gate's.
    const size_t nw = dweights.size(), n = nw + dscale.size();
    const Floats parts = ops.floats(n);
    ops.copy(parts.data(), dweights.data(), nw);
    if (!dscale.empty()) ops.copy(parts.data() + nw, dscale.data(), dscale.size());
    d.all_reduce(parts.data(), n);
    ops.copy(dweights.data(), parts.data(), nw);
    if (!dscale.empty()) {
      ops.copy(dscale.data(), parts.data() + nw, dscale.size());
      if (once) ops.linear_backward_input(dx, dscale.data(), w + p.shared_scale_w, N, C, 1);
      wg.add(p.shared_scale_w, npos, dscale, x, N, C, 1);
    }
  }
  // The router: the weights' gradient and the load-balancing loss's, through the softmax
  // (or the sigmoid). A sigmoid router's bias takes the loads instead (ParamSlot::balancing).
  // A sequence-wise balance loss gives each sequence's rows their own dprobs.
  const Floats dlogits = ops.zeros(sz(1LL * N * E));
  const int groups = m.per_sequence ? d.B : 1, group_rows = N / groups;
  for (int g = 0; g < groups; ++g) {
    const size_t r = sz(1LL * g * group_rows);
    const float* dprobs = a.dprobs.empty() ? nullptr : a.dprobs.data() + sz(g) * sz(E);
    if (m.sigmoid) {
      ops.moe_sigmoid_router_backward(dlogits.data() + r * sz(E), dweights.data() + r * sz(K), dprobs,
                                      a.probs.data() + r * sz(E), a.experts.data() + r * sz(K), group_rows, E, K,
                                      m.normalize ? 1 : 0, static_cast<float>(m.scale));
    } else {
      ops.moe_router_backward(dlogits.data() + r * sz(E), dweights.data() + r * sz(K), dprobs,
                              a.probs.data() + r * sz(E), a.weights.data() + r * sz(K), a.experts.data() + r * sz(K),
                              group_rows, E, K, m.normalize ? 1 : 0);
    }
  }
  if (m.sigmoid) wg.add_values(p.router_bias, a.underload);
  if (once) ops.linear_backward_input(dx, dlogits.data(), w + p.router_w, N, C, E);
  wg.add(p.router_w, npos, dlogits, x, N, C, E);
}

}  // namespace hetflow::exec
