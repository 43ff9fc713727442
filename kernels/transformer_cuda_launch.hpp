#pragma once
// Inside kernels/ only: the launchers behind transformer_cuda.hpp. transformer_cuda.cpp checks
// the arguments and that a device is there, then calls one of these with arguments known
// good (sizes positive, required pointers non-null, at least one gradient wanted). The .cu
// files define them; a build without nvcc links transformer_cuda_absent.cpp instead, and a
// build without cuBLAS linear_cuda_absent.cpp for the linear ones.
#include <cstdint>

#include "kernels/transformer_cuda.hpp"

namespace hetflow::kernels::launch {

Status malloc_device(void** ptr, std::size_t bytes);
Status free_device(void* ptr);
Status malloc_on_stream(void** ptr, std::size_t bytes, CudaStream stream, bool* stream_ordered);
Status free_on_stream(void* ptr, CudaStream stream);
Status copy_to_device(void* device, const void* host, std::size_t bytes);
Status copy_to_host(void* host, const void* device, std::size_t bytes);
Status copy_on_stream(void* dst, const void* src, std::size_t bytes, CudaStream stream);
Status copy_to_device_on_stream(void* device, const void* host, std::size_t bytes, CudaStream stream);
Status copy_to_host_on_stream(void* host, const void* device, std::size_t bytes, CudaStream stream);
Status memset_zero(void* device, std::size_t bytes, CudaStream stream);
Status synchronize(CudaStream stream);

Status linear_forward(float* y, const float* x, const float* w, const float* b, int N, int C, int OC,
                      CudaStream stream, GemmInputs inputs);
Status linear_backward_input(float* dx, const float* dy, const float* w, int N, int C, int OC, CudaStream stream,
                             GemmInputs inputs);
Status linear_backward_weight(float* dw, float* db, const float* dy, const float* x, int N, int C, int OC,
                              CudaStream stream, GemmInputs inputs);
Status release_linear_handles(CudaStream stream);
Status embedding_forward(float* y, const int* tokens, const float* wte, const float* wpe, int N, int T, int C,
                         CudaStream stream);
Status embedding_backward(float* dwte, float* dwpe, const float* dy, const int* tokens, int N, int T, int C,
                          CudaStream stream);
Status vocab_embedding_forward(float* y, const int* tokens, const float* wte, int V0, int V, const float* wpe, int N,
                               int T, int C, CudaStream stream);
Status vocab_embedding_backward(float* dwte, float* dwpe, const float* dy, const int* tokens, int V0, int V, int N,
                                int T, int C, CudaStream stream);
Status layernorm_forward(float* y, float* mean, float* rstd, const float* x, const float* w, const float* b, int N,
                         int C, float eps, CudaStream stream);
Status layernorm_backward(float* dx, float* dw, float* db, const float* dy, const float* x, const float* w,
                          const float* mean, const float* rstd, int N, int C, CudaStream stream);
Status rmsnorm_forward(float* y, float* rstd, const float* x, const float* w, int N, int C, float eps,
                       CudaStream stream);
Status rmsnorm_backward(float* dx, float* dw, const float* dy, const float* x, const float* w, const float* rstd, int N,
                        int C, CudaStream stream);
// out[c] += sum over rows n of dy[n][c] (linear's db), in the norms' fixed-order column sums.
Status column_sums(float* out, const float* dy, int N, int C, CudaStream stream);
// Whether column_sums (and the norms' weight gradients) can take C columns: checked before a
// caller enqueues other work, so that a refused call leaves its outputs untouched.
bool column_sums_fit(int C);
Status residual_add(float* y, const float* x, long n, CudaStream stream);
Status bias_add(float* y, const float* b, int N, int C, CudaStream stream);
Status gelu_forward(float* y, const float* x, long n, CudaStream stream);
Status gelu_backward(float* dx, const float* dy, const float* x, long n, CudaStream stream);
Status swiglu_forward(float* y, const float* gate, const float* up, long n, CudaStream stream);
Status swiglu_backward(float* dgate, float* dup, const float* dy, const float* gate, const float* up, long n,
                       CudaStream stream);
// sign +1: the forward rotation; -1: its inverse (the gradient).
Status rope_rotate(float* x, int N, int T, int heads, int head_dim, const RopeFrequencies& rope, double sign,
                   CudaStream stream);
Status attention_forward(float* out, float* probs, const float* q, const float* k, const float* v, int B, int T, int NH,
                         int NKV, int HS, int window, CudaStream stream);
Status attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* probs, const float* q,
                          const float* k, const float* v, int B, int T, int NH, int NKV, int HS, int window,
                          std::size_t scratch_bytes, CudaStream stream);
Status crossentropy_forward(float* losses, const float* logits, const int* targets, int N, int V, CudaStream stream);
Status crossentropy_backward(float* dlogits, const float* logits, const int* targets, float dloss, int N, int V,
                             CudaStream stream);
Status logits_row_max(float* row_max, const float* logits, int N, int V, CudaStream stream);
Status logits_exp_sums(float* sums, const float* logits, const float* row_max, const int* targets, int V0, int N, int V,
                       CudaStream stream);
Status vocab_crossentropy_backward(float* dlogits, double* losses, const float* logits, const float* row_max,
                                   const float* sums, const int* targets, int V0, float dloss, int N, int V,
                                   CudaStream stream);
Status scale(float* x, float factor, long n, CudaStream stream);
Status sum_of_squares(double* parts, const float* x, long n, CudaStream stream);
// The scalars as adamw_update computes them on the host, in double.
struct AdamwScalars {
  double beta1, one_minus_beta1, beta2, one_minus_beta2, eps, decay, step_size, bias2_sqrt;
};
Status adamw_update(float* p, const float* g, float* m, float* v, long n, const AdamwScalars& scalars,
                    CudaStream stream);
Status cast_fp32_to_bf16(std::uint16_t* out, const float* in, long n, CudaStream stream);
Status cast_bf16_to_fp32(float* out, const std::uint16_t* in, long n, CudaStream stream);
Status cast_fp32_to_fp16(std::uint16_t* out, const float* in, long n, CudaStream stream);
Status cast_fp16_to_fp32(float* out, const std::uint16_t* in, long n, CudaStream stream);

}  // namespace hetflow::kernels::launch
