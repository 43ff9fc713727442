#include "exec/decoder.hpp"

#include <algorithm>
#include <functional>
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

DecoderChunk::DecoderChunk(DecoderShape shape, int layer_begin, int layer_end, partition::Recompute recompute)
    : shape_(shape), params_(chunk_params(shape, layer_begin, layer_end)), recompute_(recompute) {}

namespace {

struct Dims {
  int B, T, N, C, NH, NKV, HS, KV, F, V;
  float eps, theta;
  bool gpt;
};

Dims dims_of(const DecoderShape& s, int samples) {
  return {samples, s.S, samples * s.S, s.C, s.NH, s.NKV, s.HS, s.NKV * s.HS, s.F, s.V, s.eps, s.theta,
          s.family == DecoderFamily::gpt2};
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

// The block's forward from a.x; writes the output [N, C].
void block_forward(const Dims& d, const BlockParams& p, const float* w, BlockActs& a, float* out) {
  norm_forward(d, a.n1, a.mean1, a.rstd1, a.x, at(w, p.norm1_w), at(w, p.norm1_b));
  a.q.resize(sz(1LL * d.N * d.C));
  a.k.resize(sz(1LL * d.N * d.KV));
  a.v.resize(sz(1LL * d.N * d.KV));
  k::linear_forward(a.q.data(), a.n1.data(), w + p.q_w, at(w, p.q_b), d.N, d.C, d.C);
  k::linear_forward(a.k.data(), a.n1.data(), w + p.k_w, at(w, p.k_b), d.N, d.C, d.KV);
  k::linear_forward(a.v.data(), a.n1.data(), w + p.v_w, at(w, p.v_b), d.N, d.C, d.KV);
  if (!d.gpt) {
    k::rope_forward(a.q.data(), d.N, d.T, d.NH, d.HS, d.theta);
    k::rope_forward(a.k.data(), d.N, d.T, d.NKV, d.HS, d.theta);
  }
  a.att.resize(sz(1LL * d.N * d.C));
  a.probs.resize(sz(1LL * d.B * d.NH * d.T * d.T));
  k::attention_forward(a.att.data(), a.probs.data(), a.q.data(), a.k.data(), a.v.data(), d.B, d.T, d.NH, d.NKV, d.HS);
  a.x2.resize(sz(1LL * d.N * d.C));
  k::linear_forward(a.x2.data(), a.att.data(), w + p.o_w, at(w, p.o_b), d.N, d.C, d.C);
  for (size_t i = 0; i < a.x2.size(); ++i) a.x2[i] += a.x[i];
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
  k::linear_forward(out, a.act.data(), w + p.down_w, at(w, p.down_b), d.N, d.F, d.C);
  for (size_t i = 0; i < a.x2.size(); ++i) out[i] += a.x2[i];
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
  auto dn2 = zeros(1LL * d.N * d.C);
  if (d.gpt) {
    k::gelu_backward(dup->data(), dact->data(), a.up.data(), static_cast<long>(dup->size()));
  } else {
    auto dgate = zeros(1LL * d.N * d.F);
    k::swiglu_backward(dgate->data(), dup->data(), dact->data(), a.gate.data(), a.up.data(), static_cast<long>(dup->size()));
    k::linear_backward_input(dn2->data(), dgate->data(), w + p.gate_w, d.N, d.C, d.F);
    wg.add(p.gate_w, npos, dgate, a.n2.data(), d.N, d.C, d.F);
  }
  k::linear_backward_input(dn2->data(), dup->data(), w + p.up_w, d.N, d.C, d.F);
  wg.add(p.up_w, p.up_b, dup, a.n2.data(), d.N, d.C, d.F);
  auto dx2 = std::make_shared<Floats>(*dy);  // the residual
  norm_backward(d, dx2->data(), g + p.norm2_w, at(g, p.norm2_b), dn2->data(), a.x2, w + p.norm2_w, a.mean2, a.rstd2);
  // Attention: x2 = x + o(attn(q, k, v))
  auto datt = zeros(1LL * d.N * d.C);
  k::linear_backward_input(datt->data(), dx2->data(), w + p.o_w, d.N, d.C, d.C);
  wg.add(p.o_w, p.o_b, dx2, a.att.data(), d.N, d.C, d.C);
  auto dq = zeros(1LL * d.N * d.C), dk = zeros(1LL * d.N * d.KV), dv = zeros(1LL * d.N * d.KV);
  k::attention_backward(dq->data(), dk->data(), dv->data(), datt->data(), a.probs.data(), a.q.data(), a.k.data(),
                        a.v.data(), d.B, d.T, d.NH, d.NKV, d.HS);
  if (!d.gpt) {
    k::rope_backward(dq->data(), d.N, d.T, d.NH, d.HS, d.theta);
    k::rope_backward(dk->data(), d.N, d.T, d.NKV, d.HS, d.theta);
  }
  Floats dn1(sz(1LL * d.N * d.C), 0.0f);
  k::linear_backward_input(dn1.data(), dq->data(), w + p.q_w, d.N, d.C, d.C);
  k::linear_backward_input(dn1.data(), dk->data(), w + p.k_w, d.N, d.C, d.KV);
  k::linear_backward_input(dn1.data(), dv->data(), w + p.v_w, d.N, d.C, d.KV);
  wg.add(p.q_w, p.q_b, dq, a.n1.data(), d.N, d.C, d.C);
  wg.add(p.k_w, p.k_b, dk, a.n1.data(), d.N, d.C, d.KV);
  wg.add(p.v_w, p.v_b, dv, a.n1.data(), d.N, d.C, d.KV);
  std::copy(dx2->begin(), dx2->end(), dx);
  norm_backward(d, dx, g + p.norm1_w, at(g, p.norm1_b), dn1.data(), a.x, w + p.norm1_w, a.mean1, a.rstd1);
}

void head_forward(const Dims& d, const ChunkParams& cp, const float* w, HeadActs& h, const int* targets, float scale,
                  double* loss_sum) {
  norm_forward(d, h.nf, h.mean, h.rstd, h.x, w + cp.final_norm_w, at(w, cp.final_norm_b));
  Floats logits(sz(1LL * d.N * d.V));
  k::linear_forward(logits.data(), h.nf.data(), w + cp.head_w, nullptr, d.N, d.C, d.V);
  if (loss_sum != nullptr) {
    Floats losses(sz(d.N));
    k::crossentropy_forward(losses.data(), logits.data(), targets, d.N, d.V);
    double sum = 0;
    for (const float l : losses) sum += l;
    *loss_sum = sum;
  }
  h.dlogits.assign(logits.size(), 0.0f);
  k::crossentropy_backward(h.dlogits.data(), logits.data(), targets, scale, d.N, d.V);
  h.complete = true;
}

void release(BlockActs& a) {
  Floats x = std::move(a.x);
  a = BlockActs{};
  a.x = std::move(x);
}

}  // namespace

DecoderChunk::StashPtr DecoderChunk::forward(const float* w, const Input& in, double& loss_sum) const {
  const Dims d = dims_of(shape_, in.samples);
  StashPtr s(new Stash);
  s->samples = in.samples;
  s->loss_scale = in.loss_scale;
  const size_t rows_by_c = sz(1LL * d.N * d.C);
  Floats x(rows_by_c);
  if (params_.has_embedding) {
    s->tokens.assign(in.tokens, in.tokens + d.N);
    k::embedding_forward(x.data(), in.tokens, w + params_.wte, at(w, params_.wpe), d.N, d.T, d.C);
  } else {
    std::copy(in.input, in.input + rows_by_c, x.begin());
  }
  s->blocks.resize(params_.blocks.size());
  for (size_t b = 0; b < params_.blocks.size(); ++b) {
    BlockActs& a = s->blocks[b];
    a.x = std::move(x);
    x.assign(rows_by_c, 0.0f);
    block_forward(d, params_.blocks[b], w, a, x.data());
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

void DecoderChunk::backward(Stash& s, const float* w, float* g, const float* dout, float* dinput, bool split) const {
  const Dims d = dims_of(shape_, s.samples);
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
      Floats out(rows_by_c);
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
    } else {
      k::embedding_backward(g + params_.wte, at(g, params_.wpe), dy->data(), s.tokens.data(), d.N, d.T, d.C);
    }
  } else {
    std::copy(dy->begin(), dy->end(), dinput);
  }
}

void DecoderChunk::backward_weight(Stash& s, float* g) const {
  const Dims d = dims_of(shape_, s.samples);
  for (const WeightGrad& x : s.deferred) {
    k::linear_backward_weight(g + x.w, at(g, x.b), x.dy->data(), x.x, d.N, x.C, x.OC);
  }
  s.deferred.clear();
  if (s.dembed) {
    k::embedding_backward(g + params_.wte, at(g, params_.wpe), s.dembed->data(), s.tokens.data(), d.N, d.T, d.C);
    s.dembed.reset();
  }
}

}  // namespace hetflow::exec
