#pragma once
// CUDA kernels for training decoder transformers: the device counterparts of transformer.hpp's
// CPU references (and of cast.hpp's conversions), with the same semantics, compared against
// them in tests/kernels/transformer_cuda_test.cpp. Includable without CUDA: streams are the
// opaque CUstream_st* that cudaStream_t names, and every function links in a build without
// nvcc, where it answers Status::not_built.
//
// Conventions, for every kernel here (beyond transformer.hpp's, which all hold):
// - Pointers are DEVICE pointers (tokens and targets too), fp32 row-major contiguous arrays
//   unless the name says otherwise; sizes are as in the reference.
// - Work is enqueued on `stream` (nullptr: the legacy default stream) and the call returns
//   once it is launched: Status::success means enqueued, and a fault during execution shows
//   up at the next synchronizing call (cuda_synchronize). Outputs are unspecified unless the
//   call and that synchronization succeeded. Some calls take stream-ordered scratch memory
//   (cudaMallocAsync, freed on the same stream): the column sums of the norms' and linear's
//   weight gradients, 16-bit GEMMs' operands (and results of up to 64 MiB, where padded), the
//   embedding backward's sort, attention's backward (dS).
// - Checks, in this order: a negative size, a null pointer where data is read or written, or
//   a shape the kernel cannot take -> Status::invalid_value; nothing to do (an empty output,
//   or every gradient nullptr) -> Status::success, without touching the device; no CUDA in
//   this build -> Status::not_built; no visible device -> Status::no_device.
// - Forward functions write (=) every output; backward functions add (+=) into every gradient
//   they are given and skip a nullptr one; rope_backward_cuda rotates in place.
// - Deterministic: no floating-point atomics, reductions in a fixed order (warp shuffles and
//   shared memory), and a launch shape that depends on the sizes only, so the same inputs give
//   bitwise the same outputs on every call. Reductions accumulate in fp32 (the reference uses
//   double), so results agree with the reference within a tolerance (see the tests), except
//   where noted as bitwise.
#include <cstddef>
#include <cstdint>

#include "kernels/rope_frequencies.hpp"
#include "kernels/status.hpp"

struct CUstream_st;  // cudaStream_t is CUstream_st*

namespace hetflow::kernels {

using CudaStream = CUstream_st*;

// ---------------------------------------------------------------------------------------------
// Host helpers. cuda_built(), cuda_device_count() and cuda_status() are in matmul.hpp.

// *ptr = device memory of `bytes` bytes (nullptr for 0 bytes, or when it fails).
Status cuda_malloc(void** ptr, std::size_t bytes);
// Frees what cuda_malloc gave; nullptr is a no-op.
Status cuda_free(void* ptr);
// Stream-ordered memory (cudaMallocAsync on `stream`: no wait for the device's other work);
// *stream_ordered says whether it was (false: cudaMalloc, where memory pools are not
// supported). Free it with cuda_free_on_stream when stream-ordered, cuda_free otherwise.
Status cuda_malloc_on_stream(void** ptr, std::size_t bytes, CudaStream stream, bool* stream_ordered);
Status cuda_free_on_stream(void* ptr, CudaStream stream);
// Synchronous copies between host and device memory (they wait for the legacy default
// stream; call cuda_synchronize first for work on another stream).
Status cuda_copy_to_device(void* device, const void* host, std::size_t bytes);
Status cuda_copy_to_host(void* host, const void* device, std::size_t bytes);
// Copies `bytes` bytes of device memory to device memory, enqueued on `stream`.
Status cuda_copy_on_stream(void* dst, const void* src, std::size_t bytes, CudaStream stream);
// Host to device and device to host, ordered on `stream` (cudaMemcpyAsync). From pageable
// host memory the host bytes are staged before the call returns, so `host` may be reused at
// once; to the host, the bytes are there after cuda_synchronize(stream).
Status cuda_copy_to_device_on_stream(void* device, const void* host, std::size_t bytes, CudaStream stream);
Status cuda_copy_to_host_on_stream(void* host, const void* device, std::size_t bytes, CudaStream stream);
// Zeroes `bytes` bytes of device memory, enqueued on `stream`.
Status cuda_memset_zero(void* device, std::size_t bytes, CudaStream stream);
// Waits for everything enqueued on `stream`; Status::execution_failed if any of it faulted.
Status cuda_synchronize(CudaStream stream);

// Owns one cuda_malloc allocation; move-only, freed on destruction.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& other) noexcept : ptr_(other.ptr_), bytes_(other.bytes_) {
    other.ptr_ = nullptr;
    other.bytes_ = 0;
  }
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    if (this != &other) {
      reset();
      ptr_ = other.ptr_;
      bytes_ = other.bytes_;
      other.ptr_ = nullptr;
      other.bytes_ = 0;
    }
    return *this;
  }
  ~DeviceBuffer() { reset(); }

  // Frees what it held, then allocates `bytes` (none for 0).
  Status allocate(std::size_t bytes) {
    reset();
    const Status status = cuda_malloc(&ptr_, bytes);
    if (status == Status::success) bytes_ = bytes;
    return status;
  }
  void reset() {
    if (ptr_ != nullptr) cuda_free(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
  }
  void* get() const { return ptr_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  std::size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
};

// ---------------------------------------------------------------------------------------------
// Linear layers through cuBLAS (one handle per device and stream, created on first use and
// kept until release_linear_handles). Status::not_built where cuBLAS was not found. Bitwise
// repeatable as cuBLAS is: same toolkit, same GPU model, one stream per handle.
//
// `inputs` says what the GEMM multiplies: fp32 (cublasSgemm, no TF32), or both operands
// rounded to bf16 or fp16 (nearest even, as the cast kernels round; into stream-ordered
// scratch) and multiplied by cublasGemmEx with fp32 accumulation into the fp32 output, as
// mixed-precision training multiplies (PyTorch's autocast, Megatron's bf16). The bias and
// its gradient stay fp32. A 16-bit product is exact in fp32, so these equal the reference run
// on inputs rounded the same way, within fp32 summation order. Sizes that are not multiples of
// 8 (GPT-2's 50,257-row head) are padded with zeros in scratch, so that cuBLAS keeps to its
// aligned kernels; the padding never reaches an output.
enum class GemmInputs { fp32, bf16, fp16 };

// y[N,OC] = x[N,C] * w[OC,C]^T (+ b[OC] when b != nullptr).
Status linear_forward_cuda(float* y, const float* x, const float* w, const float* b, int N, int C, int OC,
                           CudaStream stream, GemmInputs inputs = GemmInputs::fp32);
// dx[N,C] += dy[N,OC] * w[OC,C]
Status linear_backward_input_cuda(float* dx, const float* dy, const float* w, int N, int C, int OC, CudaStream stream,
                                  GemmInputs inputs = GemmInputs::fp32);
// dw[OC,C] += dy^T * x; db[OC] += column sums of dy (a fixed-order two-pass sum, not an atomic one).
Status linear_backward_weight_cuda(float* dw, float* db, const float* dy, const float* x, int N, int C, int OC,
                                   CudaStream stream, GemmInputs inputs = GemmInputs::fp32);
// Destroys the handles the linear layers made for `stream` (waiting for their work), before the
// stream itself is destroyed; success when there were none.
Status release_linear_handles(CudaStream stream);

// ---------------------------------------------------------------------------------------------
// Embedding. Both bitwise equal to the reference: the forward is one fp32 add per element,
// and the backward adds each row's gradients in the reference's order (increasing n) onto
// what the gradient held. The backward owns each gradient row in one block: token rows are
// grouped by a stable radix sort of (token, n) (CUB), and each group's first block adds the
// group's rows in order; position rows are owned column by column. No atomics.

Status embedding_forward_cuda(float* y, const int* tokens, const float* wte, const float* wpe, int N, int T, int C,
                              CudaStream stream);
Status embedding_backward_cuda(float* dwte, float* dwpe, const float* dy, const int* tokens, int N, int T, int C,
                               CudaStream stream);

// ---------------------------------------------------------------------------------------------
// LayerNorm and RMSNorm: one block of 256 threads per row for the forward and for dx (two-pass
// mean and variance, fp32 accumulation); dw and db are column sums over row chunks of 256,
// written to scratch and added in chunk order.

Status layernorm_forward_cuda(float* y, float* mean, float* rstd, const float* x, const float* w, const float* b,
                              int N, int C, float eps, CudaStream stream);
Status layernorm_backward_cuda(float* dx, float* dw, float* db, const float* dy, const float* x, const float* w,
                               const float* mean, const float* rstd, int N, int C, CudaStream stream);
Status rmsnorm_forward_cuda(float* y, float* rstd, const float* x, const float* w, int N, int C, float eps,
                            CudaStream stream);
Status rmsnorm_backward_cuda(float* dx, float* dw, const float* dy, const float* x, const float* w, const float* rstd,
                             int N, int C, CudaStream stream);

// ---------------------------------------------------------------------------------------------
// Pointwise: the reference's fp32 formulas, element by element (CUDA's expf, and nvcc's FMA
// contraction, differ from the host's by an ulp or two).
// residual_add_cuda and bias_add_cuda are one fp32 add per element: bitwise the reference.

Status residual_add_cuda(float* y, const float* x, long n, CudaStream stream);
Status bias_add_cuda(float* y, const float* b, int N, int C, CudaStream stream);

Status gelu_forward_cuda(float* y, const float* x, long n, CudaStream stream);
Status gelu_backward_cuda(float* dx, const float* dy, const float* x, long n, CudaStream stream);
Status swiglu_forward_cuda(float* y, const float* gate, const float* up, long n, CudaStream stream);
Status swiglu_backward_cuda(float* dgate, float* dup, const float* dy, const float* gate, const float* up, long n,
                            CudaStream stream);

// RoPE, in place, as rope_forward / rope_backward: angles pos * rope_inv_freq(rope, i, head_dim)
// (the reference's own function), their cosines and sines, and the rotation all in double (one
// block per row computes the row's table in shared memory), rounded to fp32 once. head_dim even
// and at most 6144.
Status rope_forward_cuda(float* x, int N, int T, int heads, int head_dim, const RopeFrequencies& rope,
                         CudaStream stream);
Status rope_backward_cuda(float* dx, int N, int T, int heads, int head_dim, const RopeFrequencies& rope,
                          CudaStream stream);

// ---------------------------------------------------------------------------------------------
// Causal grouped-query attention, as attention_forward / attention_backward (same layouts and
// sliding window; probs [B,NH,T,T] saved by the forward, zero outside each row's keys;
// NH % NKV == 0; HS at most kMaxCudaHeadSize; window >= 0), as tiled matrix products (64 x 64
// output tiles through shared memory, fp32): the forward computes each (batch, head)'s scores
// into probs, only in tiles that hold some row's keys, takes each row's softmax in place, and
// multiplies by v; a masked key's score is computed in a diagonal tile at most, then
// overwritten by the softmax's zero, and a masked value is never multiplied in, so not even a
// non-finite one reaches an earlier row. The backward computes dS = scale P (dP - D) for a chunk of kv groups
// at a time in stream-ordered scratch of at most `scratch_bytes` (but one group's
// group x T x T floats at least), then dq, and dk and dv summing the group's query heads in a
// fixed order: no atomics. probs is kept (a flash-style kernel without it is future work).
constexpr int kMaxCudaHeadSize = 1024;  // the widest head the tests cover
constexpr std::size_t kAttentionScratchBytes = std::size_t{256} << 20;
Status attention_forward_cuda(float* out, float* probs, const float* q, const float* k, const float* v, int B, int T,
                              int NH, int NKV, int HS, int window, CudaStream stream);
Status attention_backward_cuda(float* dq, float* dk, float* dv, const float* dout, const float* probs, const float* q,
                               const float* k, const float* v, int B, int T, int NH, int NKV, int HS, int window,
                               CudaStream stream, std::size_t scratch_bytes = kAttentionScratchBytes);

// ---------------------------------------------------------------------------------------------
// Cross-entropy with the softmax fused in: one block per row (max, then sum of exponentials,
// in fp32; the loss's last step in double). targets are device ints, trusted to be in [0, V).
Status crossentropy_forward_cuda(float* losses, const float* logits, const int* targets, int N, int V,
                                 CudaStream stream);
// dlogits[n] += (softmax(logits[n]) - onehot(targets[n])) * dloss, the softmax recomputed.
Status crossentropy_backward_cuda(float* dlogits, const float* logits, const int* targets, float dloss, int N, int V,
                                  CudaStream stream);

// ---------------------------------------------------------------------------------------------
// Megatron's vocabulary-parallel embedding and loss, as the references of the same names
// (this rank's vocabulary rows [V0, V0 + V); V > 0). The embedding is the kernels above with
// tokens outside the range giving a zero row and no gradient: bitwise the reference. The
// loss's steps take one block per row: the maximum (bitwise, but for a NaN logit, which
// fmaxf skips and the reference keeps only in a row's first place: the loss is NaN either
// way), the sum of exponentials in double (exp and log are CUDA's, within 1 ulp of the
// host's), and the gradient with each row's loss (losses: N device doubles).
Status vocab_embedding_forward_cuda(float* y, const int* tokens, const float* wte, int V0, int V, const float* wpe,
                                    int N, int T, int C, CudaStream stream);
Status vocab_embedding_backward_cuda(float* dwte, float* dwpe, const float* dy, const int* tokens, int V0, int V, int N,
                                     int T, int C, CudaStream stream);
Status logits_row_max_cuda(float* row_max, const float* logits, int N, int V, CudaStream stream);
Status logits_exp_sums_cuda(float* sums, const float* logits, const float* row_max, const int* targets, int V0, int N,
                            int V, CudaStream stream);
Status vocab_crossentropy_backward_cuda(float* dlogits, double* losses, const float* logits, const float* row_max,
                                        const float* sums, const int* targets, int V0, float dloss, int N, int V,
                                        CudaStream stream);

// ---------------------------------------------------------------------------------------------
// The optimizer's helpers. scale_cuda: x[i] *= factor, one fp32 multiply (bitwise the
// reference). sum_of_squares_cuda: kSumOfSquaresParts partial sums of x[i]^2 in double into
// `parts` (device doubles), each a fixed set of elements added in a fixed order; the caller
// adds the parts in order (so the result is repeatable, though not the reference's order).
constexpr int kSumOfSquaresParts = 256;
Status scale_cuda(float* x, float factor, long n, CudaStream stream);
Status sum_of_squares_cuda(double* parts, const float* x, long n, CudaStream stream);

// ---------------------------------------------------------------------------------------------
// AdamW, as adamw_update: the bias corrections and the step size computed in double on the
// host, the element update in the reference's double operations in its order, without fused
// multiply-adds (so it should match the reference bitwise where the host compiler does not
// fuse either). step >= 1.
Status adamw_update_cuda(float* p, const float* g, float* m, float* v, long n, float lr, float beta1, float beta2,
                         float eps, float weight_decay, int step, CudaStream stream);

// ---------------------------------------------------------------------------------------------
// fp32 <-> bf16 / fp16 (IEEE binary16), 16-bit values as their bit patterns. To 16 bits:
// round to nearest even (overflow to infinity), as cast.hpp's references, bitwise, except
// that a NaN's payload is unspecified (it stays a NaN). From 16 bits: exact.
Status cast_fp32_to_bf16_cuda(std::uint16_t* out, const float* in, long n, CudaStream stream);
Status cast_bf16_to_fp32_cuda(float* out, const std::uint16_t* in, long n, CudaStream stream);
Status cast_fp32_to_fp16_cuda(std::uint16_t* out, const float* in, long n, CudaStream stream);
Status cast_fp16_to_fp32_cuda(float* out, const std::uint16_t* in, long n, CudaStream stream);

}  // namespace hetflow::kernels
