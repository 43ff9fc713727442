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

// The ops of the op table (kernels/decoder_ops.def, where each is documented): linear layers,
// embeddings (whole and vocabulary-parallel), LayerNorm and RMSNorm, the residual and bias
// adds, GELU and SwiGLU, RoPE, attention, cross-entropy and its vocabulary-parallel steps,
// and the optimizer's rescale.
#define HETFLOW_OP(name, tail, params, ...) void name params;
#define HETFLOW_KERNEL(name, tail, params, ...) void name params;
#include "kernels/decoder_ops.def"

// Both at once, each row's exponentials taken once (llm.c's fused loss): losses as
// crossentropy_forward, and dlogits WRITTEN (=) with what crossentropy_backward adds, so
// bitwise the same as the two calls into zeroed gradients.
void crossentropy_forward_backward(float* losses, float* dlogits, const float* logits, const int* targets, float dloss,
                                   int N, int V);

// start + the sum of x[i]^2, accumulated in double (a gradient norm's part): eight running
// sums, so the result is the index-order sum's up to a double's rounding.
double sum_of_squares(const float* x, long n, double start = 0);

// One AdamW step as torch.optim.AdamW (decoupled weight decay): p -= lr*weight_decay*p; m = b1 m + (1-b1) g;
// v = b2 v + (1-b2) g^2; p -= (lr / (1 - b1^step)) * m / (sqrt(v) / sqrt(1 - b2^step) + eps). step >= 1.
// m and v are rounded to fp32 before p's update reads them, as the in-place PyTorch ops do.
void adamw_update(float* p, const float* g, float* m, float* v, long n, float lr, float beta1, float beta2, float eps,
                  float weight_decay, int step);

}  // namespace hetflow::kernels
