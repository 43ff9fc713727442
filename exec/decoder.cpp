#include "exec/decoder.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <vector>

#include "kernels/transformer.hpp"

namespace hetflow::exec {

namespace k = hetflow::kernels;
using Floats = std::vector<float>;
constexpr size_t npos = BlockParams::npos;

namespace {

const float* at(const float* base, size_t offset) { return offset == npos ? nullptr : base + offset; }
float* at(float* base, size_t offset) { return offset == npos ? nullptr : base + offset; }

// A weight gradient left for later: dw += dy^T x (and db += column sums of dy).
struct WeightGrad {
  size_t w = npos, b = npos;
  std::shared_ptr<const Floats> dy;
  const float* x = nullptr;  // lives in the stash until backward_weight
  int C = 0, OC = 0;
};

}  // namespace

// One block's activations for one micro-batch. Under full recomputation only `x` survives the
// forward; the rest is rebuilt before the block's backward.
struct BlockActs {
  Floats x;                 // input [N, C]
  Floats n1, mean1, rstd1;  // first norm
  Floats q, k, v;           // after rotary positions (LLaMA)
  Floats probs;             // [B, NH, T, T]; dropped under selective recomputation
  Floats att;               // attention output before o_proj [N, C]
  Floats x2;                // after the attention residual
  Floats n2, mean2, rstd2;
  Floats up, gate, act;     // MLP: c_fc / up_proj (pre-activation), gate_proj, activation output
  bool complete = false;
};

struct HeadActs {
  Floats x, nf, mean, rstd;  // input, normalised
  Floats dlogits;            // [N, V]: the loss gradient, computed with the loss
  bool complete = false;
};

struct DecoderChunk::Stash {
  int samples = 0;
  std::vector<int> tokens, targets;
  float loss_scale = 0;
  std::vector<BlockActs> blocks;
  HeadActs head;
  std::vector<WeightGrad> deferred;  // split backward: the GEMMs backward_weight runs
  std::shared_ptr<const Floats> dembed;  // split backward: the embedding's output gradient
};

void DecoderChunk::StashDeleter::operator()(Stash* s) const { delete s; }

DecoderChunk::DecoderChunk(DecoderShape shape, int layer_begin, int layer_end, partition::Recompute recompute, int tp_rank,
                           int tp)
    : shape_(shape), params_(chunk_params(shape, layer_begin, layer_end, tp_rank, tp)), recompute_(recompute) {}

namespace {

// Sizes as this rank sees them: NH, NKV, F and V are its shares under tensor parallelism.
struct Dims {
  int B, T, N, C, NH, NKV, HS, QD, KV, F, V, V0;
  float eps, theta;
  bool gpt;
  int tp, rank;
  TensorParallelGroup* group;
  void all_reduce(std::span<float> x, bool max = false) const {
    if (tp > 1) group->all_reduce(x, max);
  }
};

Dims dims_of(const DecoderShape& s, const ChunkParams& p, int samples, TensorParallelGroup* group) {
  return {samples, s.S, samples * s.S, s.C, p.NH, p.NKV, s.HS, p.NH * s.HS, p.NKV * s.HS, p.F, p.V, p.V0,
          s.eps, s.theta, s.family == DecoderFamily::gpt2, p.tp, p.tp_rank, group};
}

size_t sz(long long n) { return static_cast<size_t>(n); }

void norm_forward(const Dims& d, Floats& y, Floats& mean, Floats& rstd, const Floats& x, const float* w, const float* b) {
  y.resize(sz(1LL * d.N * d.C));
  rstd.resize(sz(d.N));
  if (d.gpt) {
    mean.resize(sz(d.N));
    k::layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w, b, d.N, d.C, d.eps);
  } else {
    k::rmsnorm_forward(y.data(), rstd.data(), x.data(), w, d.N, d.C, d.eps);
  }
}

void norm_backward(const Dims& d, float* dx, float* dw, float* db, const float* dy, const Floats& x, const float* w,
                   const Floats& mean, const Floats& rstd) {
  if (d.gpt) {
    k::layernorm_backward(dx, dw, db, dy, x.data(), w, mean.data(), rstd.data(), d.N, d.C);
  } else {
    k::rmsnorm_backward(dx, dw, dy, x.data(), w, rstd.data(), d.N, d.C);
  }
}

// The block's forward from a.x; writes the output [N, C] (or, when `partial`, this rank's
// part of it: its last row-parallel partial sums, plus the residual and bias on rank 0).
void block_forward(const Dims& d, const BlockParams& p, const float* w, BlockActs& a, float* out, bool partial = false) {
  const bool split = d.tp > 1;  // biases after a row-parallel layer are added once, after the sum
  norm_forward(d, a.n1, a.mean1, a.rstd1, a.x, at(w, p.norm1_w), at(w, p.norm1_b));
  a.q.resize(sz(1LL * d.N * d.QD));
  a.k.resize(sz(1LL * d.N * d.KV));
  a.v.resize(sz(1LL * d.N * d.KV));
  k::linear_forward(a.q.data(), a.n1.data(), w + p.q_w, at(w, p.q_b), d.N, d.C, d.QD);
  k::linear_forward(a.k.data(), a.n1.data(), w + p.k_w, at(w, p.k_b), d.N, d.C, d.KV);
  k::linear_forward(a.v.data(), a.n1.data(), w + p.v_w, at(w, p.v_b), d.N, d.C, d.KV);
  if (!d.gpt) {
    k::rope_forward(a.q.data(), d.N, d.T, d.NH, d.HS, d.theta);
    k::rope_forward(a.k.data(), d.N, d.T, d.NKV, d.HS, d.theta);
  }
  a.att.resize(sz(1LL * d.N * d.QD));
  a.probs.resize(sz(1LL * d.B * d.NH * d.T * d.T));
  k::attention_forward(a.att.data(), a.probs.data(), a.q.data(), a.k.data(), a.v.data(), d.B, d.T, d.NH, d.NKV, d.HS);
  a.x2.resize(sz(1LL * d.N * d.C));
  k::linear_forward(a.x2.data(), a.att.data(), w + p.o_w, split ? nullptr : at(w, p.o_b), d.N, d.QD, d.C);
  d.all_reduce(a.x2);
  for (size_t i = 0; i < a.x2.size(); ++i) {
    if (split && p.o_b != npos) a.x2[i] += w[p.o_b + i % static_cast<size_t>(d.C)];
    a.x2[i] += a.x[i];
  }
  norm_forward(d, a.n2, a.mean2, a.rstd2, a.x2, at(w, p.norm2_w), at(w, p.norm2_b));
  const size_t nf = sz(1LL * d.N * d.F);
  a.up.resize(nf);
  a.act.resize(nf);
  k::linear_forward(a.up.data(), a.n2.data(), w + p.up_w, at(w, p.up_b), d.N, d.C, d.F);
  if (d.gpt) {
    k::gelu_forward(a.act.data(), a.up.data(), static_cast<long>(nf));
  } else {
    a.gate.resize(nf);
    k::linear_forward(a.gate.data(), a.n2.data(), w + p.gate_w, nullptr, d.N, d.C, d.F);
    k::swiglu_forward(a.act.data(), a.gate.data(), a.up.data(), static_cast<long>(nf));
  }
  k::linear_forward(out, a.act.data(), w + p.down_w, split ? nullptr : at(w, p.down_b), d.N, d.F, d.C);
  const size_t n = a.x2.size();
  if (partial) {  // the plan's all-reduce adds the ranks' parts: the residual and bias once
    if (d.rank == 0) {
      for (size_t i = 0; i < n; ++i) out[i] += a.x2[i] + (p.down_b != npos ? w[p.down_b + i % static_cast<size_t>(d.C)] : 0.0f);
    }
  } else {
    if (split) {
      d.all_reduce(std::span<float>(out, n));  // in place: the exchange copies what it sends
    }
    for (size_t i = 0; i < n; ++i) {
      if (split && p.down_b != npos) out[i] += w[p.down_b + i % static_cast<size_t>(d.C)];
      out[i] += a.x2[i];
    }
  }
  a.complete = true;
}

// Weight gradients: now, or recorded for backward_weight.
class WeightGrads {
 public:
  WeightGrads(float* grads, std::vector<WeightGrad>* deferred) : grads_(grads), deferred_(deferred) {}
  void add(size_t w, size_t b, std::shared_ptr<const Floats> dy, const float* x, int N, int C, int OC) {
    if (deferred_ != nullptr) {
      deferred_->push_back({w, b, std::move(dy), x, C, OC});
    } else {
      k::linear_backward_weight(grads_ + w, at(grads_, b), dy->data(), x, N, C, OC);
    }
  }

 private:
  float* grads_;
  std::vector<WeightGrad>* deferred_;
};

std::shared_ptr<Floats> zeros(long long n) { return std::make_shared<Floats>(sz(n), 0.0f); }

// The block's backward: dy is the gradient of its output; writes the gradient of its input
// into dx (overwritten).
void block_backward(const Dims& d, const BlockParams& p, const float* w, float* g, BlockActs& a,
                    const std::shared_ptr<const Floats>& dy, float* dx, WeightGrads& wg) {
  // MLP: out = x2 + down(act)
  auto dact = zeros(1LL * d.N * d.F);
  k::linear_backward_input(dact->data(), dy->data(), w + p.down_w, d.N, d.F, d.C);
  wg.add(p.down_w, p.down_b, dy, a.act.data(), d.N, d.F, d.C);
  auto dup = zeros(1LL * d.N * d.F);
  Floats dn2(sz(1LL * d.N * d.C), 0.0f);
  if (d.gpt) {
    k::gelu_backward(dup->data(), dact->data(), a.up.data(), static_cast<long>(dup->size()));
  } else {
    auto dgate = zeros(1LL * d.N * d.F);
    k::swiglu_backward(dgate->data(), dup->data(), dact->data(), a.gate.data(), a.up.data(), static_cast<long>(dup->size()));
    k::linear_backward_input(dn2.data(), dgate->data(), w + p.gate_w, d.N, d.C, d.F);
    wg.add(p.gate_w, npos, dgate, a.n2.data(), d.N, d.C, d.F);
  }
  k::linear_backward_input(dn2.data(), dup->data(), w + p.up_w, d.N, d.C, d.F);
  wg.add(p.up_w, p.up_b, dup, a.n2.data(), d.N, d.C, d.F);
  d.all_reduce(dn2);  // the column-parallel MLP's input gradient: a sum over the ranks
  auto dx2 = std::make_shared<Floats>(*dy);  // the residual
  norm_backward(d, dx2->data(), g + p.norm2_w, at(g, p.norm2_b), dn2.data(), a.x2, w + p.norm2_w, a.mean2, a.rstd2);
  // Attention: x2 = x + o(attn(q, k, v))
  auto datt = zeros(1LL * d.N * d.QD);
  k::linear_backward_input(datt->data(), dx2->data(), w + p.o_w, d.N, d.QD, d.C);
  wg.add(p.o_w, p.o_b, dx2, a.att.data(), d.N, d.QD, d.C);
  auto dq = zeros(1LL * d.N * d.QD), dk = zeros(1LL * d.N * d.KV), dv = zeros(1LL * d.N * d.KV);
  k::attention_backward(dq->data(), dk->data(), dv->data(), datt->data(), a.probs.data(), a.q.data(), a.k.data(),
                        a.v.data(), d.B, d.T, d.NH, d.NKV, d.HS);
  if (!d.gpt) {
    k::rope_backward(dq->data(), d.N, d.T, d.NH, d.HS, d.theta);
    k::rope_backward(dk->data(), d.N, d.T, d.NKV, d.HS, d.theta);
  }
  Floats dn1(sz(1LL * d.N * d.C), 0.0f);
  k::linear_backward_input(dn1.data(), dq->data(), w + p.q_w, d.N, d.C, d.QD);
  k::linear_backward_input(dn1.data(), dk->data(), w + p.k_w, d.N, d.C, d.KV);
  k::linear_backward_input(dn1.data(), dv->data(), w + p.v_w, d.N, d.C, d.KV);
  wg.add(p.q_w, p.q_b, dq, a.n1.data(), d.N, d.C, d.QD);
  wg.add(p.k_w, p.k_b, dk, a.n1.data(), d.N, d.C, d.KV);
  wg.add(p.v_w, p.v_b, dv, a.n1.data(), d.N, d.C, d.KV);
  d.all_reduce(dn1);
  std::copy(dx2->begin(), dx2->end(), dx);
  norm_backward(d, dx, g + p.norm1_w, at(g, p.norm1_b), dn1.data(), a.x, w + p.norm1_w, a.mean1, a.rstd1);
}

// Cross-entropy over a vocabulary split across the ranks (Megatron's vocab-parallel loss):
// each row's maximum and sum of exponentials, and the target's logit from the rank that
// holds it, combined by all-reduces; then this rank's part of the loss gradient.
void parallel_crossentropy(const Dims& d, const Floats& logits, const int* targets, float scale, Floats& dlogits,
                           double* loss_sum) {
  const size_t N = sz(d.N), V = sz(d.V);
  Floats row_max(N), sums(2 * N, 0.0f);  // sums: [sum of exp | target logit]
  for (size_t n = 0; n < N; ++n) {
    const float* l = logits.data() + n * V;
    row_max[n] = V > 0 ? *std::max_element(l, l + V) : -std::numeric_limits<float>::infinity();
  }
  d.all_reduce(row_max, true);
  for (size_t n = 0; n < N; ++n) {
    const float* l = logits.data() + n * V;
    double sum = 0;
    for (size_t v = 0; v < V; ++v) sum += std::exp(static_cast<double>(l[v]) - row_max[n]);
    sums[n] = static_cast<float>(sum);
    const int t = targets[n] - d.V0;
    if (t >= 0 && static_cast<size_t>(t) < V) sums[N + n] = l[t];
  }
  d.all_reduce(sums);
  double total = 0;
  for (size_t n = 0; n < N; ++n) {
    total += std::log(static_cast<double>(sums[n])) + row_max[n] - sums[N + n];
    const float* l = logits.data() + n * V;
    float* dl = dlogits.data() + n * V;
    for (size_t v = 0; v < V; ++v) {
      const double p = std::exp(static_cast<double>(l[v]) - row_max[n]) / sums[n];
      dl[v] = static_cast<float>((p - (static_cast<int>(v) + d.V0 == targets[n] ? 1.0 : 0.0)) * scale);
    }
  }
  if (loss_sum != nullptr) *loss_sum = total;
}

void head_forward(const Dims& d, const ChunkParams& cp, const float* w, HeadActs& h, const int* targets, float scale,
                  double* loss_sum) {
  norm_forward(d, h.nf, h.mean, h.rstd, h.x, w + cp.final_norm_w, at(w, cp.final_norm_b));
  Floats logits(sz(1LL * d.N * d.V));
  k::linear_forward(logits.data(), h.nf.data(), w + cp.head_w, nullptr, d.N, d.C, d.V);
  if (d.tp > 1) {
    h.dlogits.assign(logits.size(), 0.0f);
    parallel_crossentropy(d, logits, targets, scale, h.dlogits, loss_sum);
  } else {
    // The loss and its gradient in one pass over the logits (each exponential taken once).
    h.dlogits.resize(logits.size());
    Floats losses(sz(d.N));
    k::crossentropy_forward_backward(losses.data(), h.dlogits.data(), logits.data(), targets, scale, d.N, d.V);
    if (loss_sum != nullptr) {
      double sum = 0;
      for (const float l : losses) sum += l;
      *loss_sum = sum;
    }
  }
  h.complete = true;
}

// The token embedding of this rank's vocabulary rows (zero for the others), positions
// added on rank 0: the ranks' outputs add up to the embedding (Megatron's vocab-parallel
// embedding).
void parallel_embedding_forward(const Dims& d, const ChunkParams& cp, const float* w, const int* tokens, Floats& x) {
  const size_t C = sz(d.C);
  std::fill(x.begin(), x.end(), 0.0f);
  for (size_t n = 0; n < sz(d.N); ++n) {
    const int t = tokens[n] - d.V0;
    float* row = x.data() + n * C;
    if (t >= 0 && t < d.V) {
      const float* e = w + cp.wte + sz(t) * C;
      for (size_t c = 0; c < C; ++c) row[c] = e[c];
    }
    if (d.rank == 0 && cp.wpe != npos) {
      const float* p = w + cp.wpe + (n % sz(d.T)) * C;
      for (size_t c = 0; c < C; ++c) row[c] += p[c];
    }
  }
}

void parallel_embedding_backward(const Dims& d, const ChunkParams& cp, float* g, const float* dx, const int* tokens) {
  const size_t C = sz(d.C);
  for (size_t n = 0; n < sz(d.N); ++n) {
    const int t = tokens[n] - d.V0;
    const float* row = dx + n * C;
    if (t >= 0 && t < d.V) {
      float* e = g + cp.wte + sz(t) * C;
      for (size_t c = 0; c < C; ++c) e[c] += row[c];
    }
    if (cp.wpe != npos) {  // replicated: every rank adds the same gradient
      float* p = g + cp.wpe + (n % sz(d.T)) * C;
      for (size_t c = 0; c < C; ++c) p[c] += row[c];
    }
  }
}

void release(BlockActs& a) {
  Floats x = std::move(a.x);
  a = BlockActs{};
  a.x = std::move(x);
}

}  // namespace

DecoderChunk::StashPtr DecoderChunk::forward(const float* w, const Input& in, double& loss_sum) const {
  const Dims d = dims_of(shape_, params_, in.samples, in.group);
  StashPtr s(new Stash);
  s->samples = in.samples;
  s->loss_scale = in.loss_scale;
  const size_t rows_by_c = sz(1LL * d.N * d.C);
  const bool last_block_partial = in.output_partial && !params_.has_head;
  Floats x(rows_by_c);
  if (params_.has_embedding) {
    s->tokens.assign(in.tokens, in.tokens + d.N);
    if (d.tp > 1) {
      parallel_embedding_forward(d, params_, w, in.tokens, x);
      if (!(in.output_partial && params_.blocks.empty())) d.all_reduce(x);
    } else {
      k::embedding_forward(x.data(), in.tokens, w + params_.wte, at(w, params_.wpe), d.N, d.T, d.C);
    }
  } else {
    std::copy(in.input, in.input + rows_by_c, x.begin());
  }
  s->blocks.resize(params_.blocks.size());
  for (size_t b = 0; b < params_.blocks.size(); ++b) {
    BlockActs& a = s->blocks[b];
    a.x = std::move(x);
    x.assign(rows_by_c, 0.0f);
    block_forward(d, params_.blocks[b], w, a, x.data(), last_block_partial && b + 1 == params_.blocks.size());
    if (recompute_ == partition::Recompute::full) {
      release(a);
    } else if (recompute_ == partition::Recompute::selective) {
      Floats().swap(a.probs);
    }
  }
  loss_sum = 0;
  if (params_.has_head) {
    s->targets.assign(in.targets, in.targets + d.N);
    s->head.x = std::move(x);
    head_forward(d, params_, w, s->head, in.targets, in.loss_scale, &loss_sum);
    if (recompute_ == partition::Recompute::full) {
      Floats keep = std::move(s->head.x);
      s->head = HeadActs{};
      s->head.x = std::move(keep);
    }
  } else {
    std::copy(x.begin(), x.end(), in.output);
  }
  return s;
}

void DecoderChunk::backward(Stash& s, const float* w, float* g, const float* dout, float* dinput, bool split,
                            bool dinput_partial, TensorParallelGroup* group) const {
  const Dims d = dims_of(shape_, params_, s.samples, group);
  const size_t rows_by_c = sz(1LL * d.N * d.C);
  s.deferred.clear();
  WeightGrads wg(g, split ? &s.deferred : nullptr);
  auto dy = std::make_shared<Floats>(rows_by_c, 0.0f);
  if (params_.has_head) {
    HeadActs& h = s.head;
    if (!h.complete) head_forward(d, params_, w, h, s.targets.data(), s.loss_scale, nullptr);
    Floats dnf(rows_by_c, 0.0f);
    k::linear_backward_input(dnf.data(), h.dlogits.data(), w + params_.head_w, d.N, d.C, d.V);
    wg.add(params_.head_w, npos, std::make_shared<const Floats>(std::move(h.dlogits)), h.nf.data(), d.N, d.C, d.V);
    d.all_reduce(dnf);  // the vocabulary-parallel head's input gradient
    norm_backward(d, dy->data(), g + params_.final_norm_w, at(g, params_.final_norm_b), dnf.data(), h.x,
                  w + params_.final_norm_w, h.mean, h.rstd);
  } else {
    std::copy(dout, dout + rows_by_c, dy->begin());
  }
  for (size_t b = s.blocks.size(); b-- > 0;) {
    BlockActs& a = s.blocks[b];
    if (!a.complete) {  // full recomputation: this layer's forward again, from its input
      Floats out(rows_by_c);
      block_forward(d, params_.blocks[b], w, a, out.data());
    } else if (a.probs.empty()) {  // selective: the attention probabilities again
      a.probs.resize(sz(1LL * d.B * d.NH * d.T * d.T));
      Floats out(sz(1LL * d.N * d.QD));
      k::attention_forward(out.data(), a.probs.data(), a.q.data(), a.k.data(), a.v.data(), d.B, d.T, d.NH, d.NKV, d.HS);
    }
    auto dx = std::make_shared<Floats>(rows_by_c);
    block_backward(d, params_.blocks[b], w, g, a, dy, dx->data(), wg);
    dy = std::move(dx);
    if (!split) release(a);  // its gradients are taken: only what a split W needs stays
  }
  if (params_.has_embedding) {
    if (split) {
      s.dembed = dy;
    } else if (d.tp > 1) {
      parallel_embedding_backward(d, params_, g, dy->data(), s.tokens.data());
    } else {
      k::embedding_backward(g + params_.wte, at(g, params_.wpe), dy->data(), s.tokens.data(), d.N, d.T, d.C);
    }
  } else if (dinput_partial && d.rank != 0) {
    std::fill(dinput, dinput + rows_by_c, 0.0f);
  } else {
    std::copy(dy->begin(), dy->end(), dinput);
  }
}

void DecoderChunk::backward_weight(Stash& s, float* g) const {
  const Dims d = dims_of(shape_, params_, s.samples, nullptr);
  for (const WeightGrad& x : s.deferred) {
    k::linear_backward_weight(g + x.w, at(g, x.b), x.dy->data(), x.x, d.N, x.C, x.OC);
  }
  s.deferred.clear();
  if (s.dembed) {
    if (d.tp > 1) {
      parallel_embedding_backward(d, params_, g, s.dembed->data(), s.tokens.data());
    } else {
      k::embedding_backward(g + params_.wte, at(g, params_.wpe), s.dembed->data(), s.tokens.data(), d.N, d.T, d.C);
    }
    s.dembed.reset();
  }
}

}  // namespace hetflow::exec
