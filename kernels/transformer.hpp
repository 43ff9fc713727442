#pragma once
// CPU reference kernels for training decoder transformers (GPT-2 and LLaMA style), llm.c's
// layer by layer: the forward and backward of each operation and the optimizer step. They are
// the oracle faster kernels are compared against, and what the CPU back end runs.
//
// Conventions, for every function here:
// - fp32, row-major, contiguous arrays; sizes are positive and arrays hold what the sizes say
//   (nothing is validated).
// - Forward functions write (=) their outputs, including what they save for the backward
//   (mean, rstd, probs).
// - Backward functions accumulate (+=) into every gradient pointer they are given, so the
//   gradients of a tensor used twice (a tied embedding, a residual) add up; a nullptr
//   gradient is not wanted and is skipped. rope_backward is the one exception: it rotates
//   the gradient in place, as rope_forward rotates its input.
// - Deterministic: the same inputs give bitwise the same outputs on every call (loops and
//   reductions run in a fixed order; OpenBLAS's sgemm is called with the caller's single
//   thread). Row reductions in the norms, softmaxes and cross-entropy accumulate in double.
#include "kernels/rope_frequencies.hpp"

namespace hetflow::kernels {

// y[N,OC] = x[N,C] * w[OC,C]^T (+ b[OC] when b != nullptr): PyTorch nn.Linear's layout. cblas_sgemm.
void linear_forward(float* y, const float* x, const float* w, const float* b, int N, int C, int OC);
// dx[N,C] += dy[N,OC] * w[OC,C]
void linear_backward_input(float* dx, const float* dy, const float* w, int N, int C, int OC);
// dw[OC,C] += dy^T * x; db[OC] += column sums of dy (db may be nullptr)
void linear_backward_weight(float* dw, float* db, const float* dy, const float* x, int N, int C, int OC);

// Row n (N = B*T rows, T tokens per sequence): y[n] = wte[tokens[n]] + wpe[n % T] (wpe may be
// nullptr: no positions). tokens index rows of wte and are trusted.
void embedding_forward(float* y, const int* tokens, const float* wte, const float* wpe, int N, int T, int C);
// dwte[tokens[n]] += dy[n]; dwpe[n % T] += dy[n] (a token seen twice gets both rows).
void embedding_backward(float* dwte, float* dwpe, const float* dy, const int* tokens, int N, int T, int C);

// LayerNorm over the last dimension (biased variance, eps inside the sqrt), saving mean and
// 1/std per row: y = (x - mean) * rstd * w + b. w and b are required.
void layernorm_forward(float* y, float* mean, float* rstd, const float* x, const float* w, const float* b, int N, int C,
                       float eps);
// From the mean and rstd the forward saved.
void layernorm_backward(float* dx, float* dw, float* db, const float* dy, const float* x, const float* w,
                        const float* mean, const float* rstd, int N, int C);

// RMSNorm: y = x / sqrt(mean(x^2) + eps) * w, saving 1/rms per row
void rmsnorm_forward(float* y, float* rstd, const float* x, const float* w, int N, int C, float eps);
void rmsnorm_backward(float* dx, float* dw, const float* dy, const float* x, const float* w, const float* rstd, int N,
                      int C);

// y[i] += x[i]: a residual connection.
void residual_add(float* y, const float* x, long n);
// y[n][c] += b[c] over N rows of C: a bias added after a row-parallel layer's sum.
void bias_add(float* y, const float* b, int N, int C);

// GELU, tanh approximation (GPT-2's "gelu_new"): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
void gelu_forward(float* y, const float* x, long n);
void gelu_backward(float* dx, const float* dy, const float* x, long n);

// SwiGLU: y = silu(gate) * up, silu(g) = g / (1 + exp(-g))
void swiglu_forward(float* y, const float* gate, const float* up, long n);
void swiglu_backward(float* dgate, float* dup, const float* dy, const float* gate, const float* up, long n);

// Rotary position embedding, HuggingFace's rotate-half convention, in place. x holds N = B*T rows of
// `heads` heads of head_dim (even) values; the position of row n is n % T. For i < head_dim/2 the pair
// (x[i], x[i + head_dim/2]) of each head is rotated by the angle pos * rope_inv_freq(rope, i, head_dim)
// (theta^(-2i/head_dim) unless `rope` rescales it: rope_frequencies.hpp):
// x1' = x1 cos - x2 sin, x2' = x2 cos + x1 sin. Angles, cosines and sines are computed in double.
void rope_forward(float* x, int N, int T, int heads, int head_dim, const RopeFrequencies& rope);
// The gradient through rope_forward (the inverse rotation), in place on dx: not accumulated,
// since the operation has no other input to take a gradient.
void rope_backward(float* dx, int N, int T, int heads, int head_dim, const RopeFrequencies& rope);

// Causal self-attention with grouped-query heads: q [B,T,NH,HS], k and v [B,T,NKV,HS] (NH % NKV == 0;
// query head h reads kv head h / (NH / NKV), as HuggingFace's repeat_kv), scores scaled by 1/sqrt(HS),
// softmax over keys t' <= t, or under a sliding window (window > 0) over the window keys
// t - window < t' <= t (HuggingFace's mask: `window` keys, the query's own included; 0: no
// window). out [B,T,NH,HS]; probs [B,NH,T,T] the softmax (zero outside each row's keys), saved
// for the backward. A future key or value is never multiplied in, so even a non-finite one
// cannot reach an earlier position (keys before a window are, with weight zero, within a
// block of rows).
void attention_forward(float* out, float* probs, const float* q, const float* k, const float* v, int B, int T, int NH,
                       int NKV, int HS, int window);
// From the probs the forward saved; dk and dv sum the gradients of every query head sharing a kv head.
void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* probs, const float* q,
                        const float* k, const float* v, int B, int T, int NH, int NKV, int HS, int window);

// Cross-entropy of each row: losses[n] = logsumexp(logits[n]) - logits[n][targets[n]] (numerically
// stable). The caller guarantees 0 <= targets[n] < V; nothing else is read.
void crossentropy_forward(float* losses, const float* logits, const int* targets, int N, int V);
// dlogits[n] += (softmax(logits[n]) - onehot(targets[n])) * dloss  (dloss: the weight of each row's loss,
// e.g. 1 / tokens in the global batch). The softmax is recomputed from the logits.
void crossentropy_backward(float* dlogits, const float* logits, const int* targets, float dloss, int N, int V);
// Both at once, each row's exponentials taken once (llm.c's fused loss): losses as
// crossentropy_forward, and dlogits WRITTEN (=) with what crossentropy_backward adds, so
// bitwise the same as the two calls into zeroed gradients.
void crossentropy_forward_backward(float* losses, float* dlogits, const float* logits, const int* targets, float dloss,
                                   int N, int V);

// Megatron's vocabulary-parallel embedding and loss: a rank holds vocabulary rows [V0, V0 + V)
// of the token table and of the head; the ranks' results add up (through all-reduces the
// caller runs between the loss's three steps) to the whole vocabulary's.
// y[n] = wte[tokens[n] - V0] where this rank holds the token, else zero; + wpe[n % T] when
// wpe != nullptr (one rank adds the positions).
void vocab_embedding_forward(float* y, const int* tokens, const float* wte, int V0, int V, const float* wpe, int N,
                             int T, int C);
// dwte[tokens[n] - V0] += dy[n] for the tokens this rank holds; dwpe[n % T] += dy[n] (each may be nullptr).
void vocab_embedding_backward(float* dwte, float* dwpe, const float* dy, const int* tokens, int V0, int V, int N,
                              int T, int C);
// row_max[n] = the largest of this rank's V logits of row n.
void logits_row_max(float* row_max, const float* logits, int N, int V);
// With the row maxima over every rank: sums[n] = sum_v exp(logits[n][v] - row_max[n])
// (accumulated in double); sums[N + n] = the target's logit where this rank holds it, else 0.
void logits_exp_sums(float* sums, const float* logits, const float* row_max, const int* targets, int V0, int N, int V);
// With the maxima and both sums over every rank: dlogits WRITTEN (=) with this rank's part of
// (softmax - onehot(target)) * dloss, and losses[n] = log(sums[n]) + row_max[n] - sums[N + n],
// in double.
void vocab_crossentropy_backward(float* dlogits, double* losses, const float* logits, const float* row_max,
                                 const float* sums, const int* targets, int V0, float dloss, int N, int V);

// x[i] *= factor: gradient clipping's rescale.
void scale(float* x, float factor, long n);
// start + the sum of x[i]^2, accumulated in double in index order (a gradient norm's part).
double sum_of_squares(const float* x, long n, double start = 0);

// One AdamW step as torch.optim.AdamW (decoupled weight decay): p -= lr*weight_decay*p; m = b1 m + (1-b1) g;
// v = b2 v + (1-b2) g^2; p -= (lr / (1 - b1^step)) * m / (sqrt(v) / sqrt(1 - b2^step) + eps). step >= 1.
// m and v are rounded to fp32 before p's update reads them, as the in-place PyTorch ops do.
void adamw_update(float* p, const float* g, float* m, float* v, long n, float lr, float beta1, float beta2, float eps,
                  float weight_decay, int step);

}  // namespace hetflow::kernels
