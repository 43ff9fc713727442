#pragma once
// Where a decoder chunk's arrays live and the kernels that run on them: the one thing the
// decoder math (exec/decoder.hpp) needs from a device. The decoder holds only pointers into
// arrays these ops allocate and calls only these ops on them, so the same code trains on the
// CPU reference kernels (CpuDecoderOps, host memory) and on the CUDA kernels
// (exec/cuda_decoder_ops.hpp, device memory).
//
// Promises of every implementation:
//  - The kernels have kernels/transformer.hpp's semantics (forward writes, backward adds,
//    nullptr gradients skipped); pointers are this ops' memory unless a name says `host`.
//  - Work may be asynchronous (a CUDA stream): it runs in call order, and only the calls that
//    return host values (sum) wait for it.
//  - A failure throws hetflow::Error naming the kernel and why.
//  - memory() counts the bytes of every array it gives out until the array's last handle
//    goes (what a device really holds, for the run's report).
#include <atomic>
#include <cstddef>
#include <memory>
#include <span>
#include <string>

#include "kernels/rope_frequencies.hpp"

namespace hetflow::exec {

// n elements of T in some DecoderOps' memory: a shared handle (copies share the elements),
// freed when the last copy goes. Empty by default.
template <class T>
class OpsArray {
 public:
  OpsArray() = default;
  OpsArray(std::shared_ptr<T> data, size_t n) : data_(std::move(data)), size_(n) {}
  OpsArray(const OpsArray&) = default;
  OpsArray& operator=(const OpsArray&) = default;
  OpsArray(OpsArray&& other) noexcept : data_(std::move(other.data_)), size_(other.size_) { other.size_ = 0; }
  OpsArray& operator=(OpsArray&& other) noexcept {
    data_ = std::move(other.data_);
    size_ = other.size_;
    if (&other != this) other.size_ = 0;
    return *this;
  }
  T* data() const { return data_.get(); }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  std::span<T> span() const { return {data_.get(), size_}; }

 private:
  std::shared_ptr<T> data_;
  size_t size_ = 0;
};
using OpsFloats = OpsArray<float>;
using OpsInts = OpsArray<int>;

// The bytes of an ops' arrays alive now and the most alive at once: what the decoder math
// really holds on a device (parameters, gradients, optimizer state, the stash, temporaries).
// Thread-safe; the arrays' deleters share it, so it outlives the ops when they do.
class OpsMemory {
 public:
  void allocated(size_t bytes);
  void freed(size_t bytes);
  size_t live_bytes() const { return live_.load(); }
  size_t peak_bytes() const { return peak_.load(); }
  void reset_peak() { peak_.store(live_.load()); }  // from now on: the peak of what follows

 private:
  std::atomic<size_t> live_{0}, peak_{0};
};

class DecoderOps {
 public:
  virtual ~DecoderOps() = default;
  virtual std::string name() const = 0;  // "cpu", "cuda:0"
  // Whether this ops' memory is plain host memory the caller may touch directly.
  virtual bool host_addressable() const { return false; }
  // What its arrays hold (every implementation counts each array it gives out).
  OpsMemory& memory() const { return *memory_; }

  // Memory.
  virtual OpsFloats floats(size_t n) const = 0;  // unspecified values
  virtual OpsFloats zeros(size_t n) const = 0;
  virtual OpsInts ints(const int* host, size_t n) const = 0;  // a copy of host ints
  virtual void copy(float* dst, const float* src, size_t n) const = 0;
  virtual void zero(float* dst, size_t n) const = 0;
  // Between host memory and this ops' memory; download waits for the work before it.
  virtual void upload(float* dst, const float* host, size_t n) const = 0;
  virtual void download(float* host, const float* src, size_t n) const = 0;
  // Ints back to the host (a router's choices, from which the host orders the copies).
  virtual void download_ints(int* host, const int* src, size_t n) const = 0;
  // The sum of n floats in double, in index order; waits for the work before it.
  virtual double sum(const float* x, size_t n) const = 0;

  // The op table's ops (kernels/decoder_ops.def): `virtual void name(parameters) const = 0`
  // for each HETFLOW_OP line, with the reference's semantics.
#define HETFLOW_OP(name, tail, params, ...) virtual void name params const = 0;
#define HETFLOW_KERNEL(...)
#include "kernels/decoder_ops.def"

  // losses = the cross-entropy of each row; dlogits WRITTEN (=) with its gradient x dloss.
  virtual void crossentropy_forward_backward(float* losses, float* dlogits, const float* logits, const int* targets,
                                             float dloss, int N, int V) const = 0;

  // The optimizer's: x *= factor; start + sum of x^2 in double (waits for the work before
  // it); one AdamW step (kernels/transformer.hpp's adamw_update).
  virtual void scale(float* x, float factor, size_t n) const = 0;
  virtual double sum_of_squares(const float* x, size_t n, double start) const = 0;
  virtual void adamw_update(float* p, const float* g, float* m, float* v, size_t n, float lr, float beta1, float beta2,
                            float eps, float weight_decay, int step) const = 0;

  // Megatron's vocabulary-parallel loss's last step (this rank holds vocabulary rows
  // [V0, V0 + V) of the head; its first steps are table ops).
  // With the ranks' row maxima and sums combined: dlogits WRITTEN with this rank's part of
  // the loss gradient x dloss; returns the sum over rows of the losses (in double).
  virtual double vocab_crossentropy_backward(float* dlogits, const float* logits, const float* row_max,
                                             const float* sums, const int* targets, int V0, float dloss, int N,
                                             int V) const = 0;

 protected:
  std::shared_ptr<OpsMemory> memory_ = std::make_shared<OpsMemory>();  // (a deleter keeps its copy)
};

// The CPU reference kernels on host memory (kernels/transformer.hpp), synchronous.
class CpuDecoderOps : public DecoderOps {
 public:
  std::string name() const override { return "cpu"; }
  bool host_addressable() const override { return true; }
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
};

// One CpuDecoderOps for everyone (its memory() counts every user's arrays together).
const DecoderOps& cpu_decoder_ops();

}  // namespace hetflow::exec
