#pragma once
// The decoder math's kernels on a GPU (exec/decoder_ops.hpp over kernels/transformer_cuda.hpp):
// every array is device memory, every kernel is enqueued on one CUDA stream, and the
// calling thread's current device is the one used (the back end sets it). Built in every
// build: without CUDA, or without a visible GPU, the first allocation or kernel throws
// hetflow::Error saying so ("not built with CUDA", "no CUDA device visible").
//
// What differs from the CPU reference, by design:
//  - reductions accumulate in fp32 (the reference uses double), so results agree with the
//    CPU ops within the kernels' tolerances (tests/kernels/transformer_cuda_test.cpp), not
//    bitwise; the same inputs still give the same bits on every run;
//  - the loss and its gradient are two kernels (the CPU fuses them), with the same result;
//  - with 16-bit GEMM inputs, the linear layers' products are those of rounded operands.
// Memory: a pool per ops object. New blocks are stream-ordered (cudaMallocAsync on this
// stream: no wait for the device's other work, NCCL's among it). When an array's last handle
// goes its block returns to the pool (no cudaFree, which would wait for the whole device),
// and the next array of the same rounded size takes it. That is safe because every use of an ops array is ordered on this
// stream, or awaited on the host before its handle goes (a collective's NCCL call on another
// stream): a block taken again is touched only after its earlier uses. Copies from and to
// the host are ordered on the stream too. The pool frees its blocks when the ops object and
// every array it gave are gone. Arrays are allocated on the calling thread's current device.
#include <memory>

#include "exec/decoder_ops.hpp"
#include "kernels/transformer_cuda.hpp"

namespace hetflow::exec {

class CudaDecoderOps final : public DecoderOps {
 public:
  // `device`: the GPU's ordinal, for names and messages; `stream`: where kernels go
  // (nullptr: the legacy default stream); `gemm_inputs`: what the linear layers' GEMMs
  // multiply (fp32, or operands rounded to bf16 / fp16 with fp32 accumulation; everything
  // else stays fp32: master weights, activations, gradients, the optimizer).
  CudaDecoderOps(int device, kernels::CudaStream stream, kernels::GemmInputs gemm_inputs = kernels::GemmInputs::fp32);
  std::string name() const override { return "cuda:" + std::to_string(device_); }
  kernels::CudaStream stream() const { return stream_; }
  // Runs each linear layer once on a few zeros and waits: cuBLAS is opened, this stream's
  // handle made and its kernels loaded now, not inside the first task (where NCCL kernels of
  // other streams may be spinning on the same GPU while a module loads).
  void warm_up() const;

  OpsFloats floats(size_t n) const override;
  OpsFloats zeros(size_t n) const override;
  OpsInts ints(const int* host, size_t n) const override;
  void copy(float* dst, const float* src, size_t n) const override;
  void zero(float* dst, size_t n) const override;
  void upload(float* dst, const float* host, size_t n) const override;
  void download(float* host, const float* src, size_t n) const override;
  void download_ints(int* host, const int* src, size_t n) const override;
  double sum(const float* x, size_t n) const override;
#define HETFLOW_OP(name, tail, params, ...) void name params const override;
#define HETFLOW_KERNEL(...)
#include "kernels/decoder_ops.def"
  void crossentropy_forward_backward(float* losses, float* dlogits, const float* logits, const int* targets,
                                     float dloss, int N, int V) const override;
  void scale(float* x, float factor, size_t n) const override;
  double sum_of_squares(const float* x, size_t n, double start) const override;
  void adamw_update(float* p, const float* g, float* m, float* v, size_t n, float lr, float beta1, float beta2,
                    float eps, float weight_decay, int step) const override;
  double vocab_crossentropy_backward(float* dlogits, const float* logits, const float* row_max, const float* sums,
                                     const int* targets, int V0, float dloss, int N, int V) const override;

 private:
  // Throws hetflow::Error("<kernel> on cuda:<device>: <status>") unless status is success.
  void check(kernels::Status status, const char* kernel) const;
  template <class T>
  OpsArray<T> allocate(size_t n) const;

  int device_;
  kernels::CudaStream stream_;
  kernels::GemmInputs gemm_inputs_;
  class Pool;
  std::shared_ptr<Pool> pool_;  // shared with the arrays' deleters
};

}  // namespace hetflow::exec
