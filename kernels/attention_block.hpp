#pragma once
// Attention by blocks of keys (ring attention's step, Liu et al. 2023; FlashAttention's
// online softmax, Dao et al. 2022): queries at their positions of a sequence meet one block
// of keys and values at theirs, and a block's normalised output and log-sum-exp merge with
// the blocks' before it into exactly what attention over all of them gives. The backward
// needs no probabilities: each block's are recomputed from the final log-sum-exp.
//
// Shapes as attention_forward's (kernels/decoder_ops.def): q [B,Tq,NH,HS], k and v
// [B,Tk,NKV,HS] (query head h reads kv head h / (NH / NKV)), out [B,Tq,NH,HS], lse [B,NH,Tq].
// qpos [Tq] and kpos [Tk] are each row's position in its sequence (the same for every
// sample); a query sees the keys at positions p' <= p, under a sliding window (window > 0)
// only p - window < p'. Scores are scaled by 1/sqrt(HS).
//
// CPU references only (no CUDA counterpart yet, so not in the op table): host arrays,
// deterministic, sgemm on the caller's thread, row reductions in double. Conventions as
// kernels/transformer.hpp's: forwards write, backwards add into non-null gradients.
namespace hetflow::kernels {

// out = softmax over the block's visible keys of the scores, times v; lse = log of the sum
// of exp(score) over them. A query that sees none of the block's keys gets out 0, lse -inf.
void attention_block_forward(float* out, float* lse, const float* q, const float* k, const float* v, const int* qpos,
                             const int* kpos, int B, int Tq, int Tk, int NH, int NKV, int HS, int window);

// Folds a block's (block_out, block_lse) into the running (out, lse) of the blocks before it:
// lse' = log(exp(lse) + exp(block_lse)), out' = out exp(lse - lse') + block_out exp(block_lse - lse').
// (-inf, the start, takes the block as it is.)
void attention_block_merge(float* out, float* lse, const float* block_out, const float* block_lse, int B, int T,
                           int NH, int HS);

// delta [B,NH,T] = the sum over a head's HS of dout * out: each query row's dot product
// of its output with its gradient, which every block's backward needs.
void attention_block_delta(float* delta, const float* dout, const float* out, int B, int T, int NH, int HS);

// One block's part of the gradients of attention over all blocks, from the final lse and
// delta: p = exp(score - lse) over the visible keys, dv += p^T dout, ds = p (dout v^T -
// delta) / sqrt(HS), dq += ds k, dk += ds^T q (dk and dv summing the query heads of a kv
// head in order).
void attention_block_backward(float* dq, float* dk, float* dv, const float* dout, const float* lse, const float* delta,
                              const float* q, const float* k, const float* v, const int* qpos, const int* kpos, int B,
                              int Tq, int Tk, int NH, int NKV, int HS, int window);

}  // namespace hetflow::kernels
