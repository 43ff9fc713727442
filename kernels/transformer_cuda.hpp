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
// The ops of the op table (kernels/decoder_ops.def: each op's semantics, and how each family
// is computed on the device): `Status name_cuda(the reference's parameters, CudaStream stream)`
// for every `name` there, with a tail where its line says so:
//  - gemm (the linear layers, through cuBLAS; Status::not_built where cuBLAS was not found):
//    `GemmInputs inputs` after the stream, what the GEMM multiplies: fp32 (cublasSgemm, no
//    TF32), or both operands rounded to bf16 or fp16 (nearest even, as the cast kernels round;
//    into stream-ordered scratch) and multiplied by cublasGemmEx with fp32 accumulation into
//    the fp32 output, as mixed-precision training multiplies (PyTorch's autocast, Megatron's
//    bf16). The bias and its gradient stay fp32. A 16-bit product is exact in fp32, so these
//    equal the reference run on inputs rounded the same way, within fp32 summation order.
//    Sizes that are not multiples of 8 (GPT-2's 50,257-row head) are padded with zeros in
//    scratch, so that cuBLAS keeps to its aligned kernels; the padding never reaches an
//    output. One handle per device and stream, created on first use and kept until
//    release_linear_handles; bitwise repeatable as cuBLAS is (same toolkit, same GPU model,
//    one stream per handle).
//  - scratch (attention_backward): `std::size_t scratch_bytes` after the stream, the most
//    stream-ordered scratch its dS takes at once (one kv group's at least).
// Pointers are device pointers (tokens and targets too); vocab_crossentropy_backward's
// losses are N device doubles.
enum class GemmInputs { fp32, bf16, fp16 };
constexpr int kMaxCudaHeadSize = 1024;  // the widest attention head the tests cover
constexpr std::size_t kAttentionScratchBytes = std::size_t{256} << 20;

#define HETFLOW_OP(name, tail, params, ...) Status name##_cuda HETFLOW_OP_CUDA_DECL(params, tail);
#define HETFLOW_KERNEL(name, tail, params, ...) Status name##_cuda HETFLOW_OP_CUDA_DECL(params, tail);
#include "kernels/decoder_ops.def"

// Destroys the handles the linear layers made for `stream` (waiting for their work), before the
// stream itself is destroyed; success when there were none.
Status release_linear_handles(CudaStream stream);

// ---------------------------------------------------------------------------------------------
// The optimizer's sum of squares (scale_cuda is in the table): kSumOfSquaresParts partial
// sums of x[i]^2 in double into `parts` (device doubles), each a fixed set of elements added
// in a fixed order; the caller adds the parts in order (so the result is repeatable, though
// not the reference's order).
constexpr int kSumOfSquaresParts = 256;
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
