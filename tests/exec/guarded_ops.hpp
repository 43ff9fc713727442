#pragma once
// Test support: DecoderOps whose memory only the ops may touch (exec/decoder_ops.hpp), so
// code that reads or writes device memory from the host faults on a machine without a GPU.
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <iterator>
#include <new>
#include <stdexcept>
#include <string>

#include "exec/decoder_ops.hpp"

namespace hetflow::test_support {

using exec::OpsFloats;
using exec::OpsInts;

// The CPU reference's math on page ranges that only the ops themselves may touch: every range
// is PROT_NONE except while one of the ops runs (ops are serialized by a mutex, so threads
// see no false alarm; a thread touching memory while another's op has it open goes unseen).
class GuardedOps final : public exec::CpuDecoderOps {
 public:
  GuardedOps() {
    struct sigaction action {};
    action.sa_handler = [](int) {
      static const char message[] = "guarded ops: memory touched outside an op\n";
      [[maybe_unused]] const ssize_t written = write(2, message, sizeof message - 1);
      signal(SIGSEGV, SIG_DFL);  // the faulting access repeats and ends the process
    };
    sigaction(SIGSEGV, &action, &previous_);
  }
  ~GuardedOps() override { sigaction(SIGSEGV, &previous_, nullptr); }
  GuardedOps(const GuardedOps&) = delete;
  GuardedOps& operator=(const GuardedOps&) = delete;

  // While one lives, every guarded range is readable and writable (an op calling another
  // nests).
  class Open {
   public:
    explicit Open(const GuardedOps& ops) : ops_(ops), lock_(ops.mutex_) {
      if (ops_.depth_++ == 0) ops_.protect(PROT_READ | PROT_WRITE);
    }
    ~Open() {
      if (--ops_.depth_ == 0) ops_.protect(PROT_NONE);
    }
    Open(const Open&) = delete;
    Open& operator=(const Open&) = delete;

   private:
    const GuardedOps& ops_;
    std::lock_guard<std::recursive_mutex> lock_;
  };

  bool host_addressable() const override { return false; }  // only inside an op
  OpsFloats floats(size_t n) const override { return guarded<float>(n); }
  // (zeros and ints allocate under the lock too: the registry is shared.)
  OpsFloats zeros(size_t n) const override { return guarded<float>(n); }  // fresh pages are zero
  OpsInts ints(const int* host, size_t n) const override {
    OpsInts a = guarded<int>(n);
    const Open open(*this);
    if (n > 0) std::memcpy(a.data(), host, n * sizeof(int));
    return a;
  }

#define HETFLOW_GUARDED(ret, name, params, args) \
  ret name params const override {               \
    const Open open(*this);                      \
    return CpuDecoderOps::name args;             \
  }
  HETFLOW_GUARDED(void, copy, (float* d, const float* s, size_t n), (d, s, n))
  HETFLOW_GUARDED(void, zero, (float* d, size_t n), (d, n))
  // The device side of a copy to or from the host must be this ops' memory: an array of other
  // ops handed here (a chunk whose arrays and ops disagree) is an error, not a silent copy.
  void upload(float* d, const float* h, size_t n) const override {
    require_mine(d, n, "upload");
    const Open open(*this);
    CpuDecoderOps::upload(d, h, n);
  }
  void download(float* h, const float* s, size_t n) const override {
    require_mine(s, n, "download");
    const Open open(*this);
    CpuDecoderOps::download(h, s, n);
  }
  void download_ints(int* h, const int* s, size_t n) const override {
    const Open open(*this);
    CpuDecoderOps::download_ints(h, s, n);
  }
  HETFLOW_GUARDED(double, sum, (const float* x, size_t n), (x, n))
  // The op table's ops (kernels/decoder_ops.def), each inside an Open.
#define HETFLOW_OP(name, tail, params, args, ...) HETFLOW_GUARDED(void, name, params, args)
#define HETFLOW_KERNEL(...)
#include "kernels/decoder_ops.def"
  HETFLOW_GUARDED(void, crossentropy_forward_backward,
                  (float* losses, float* dl, const float* logits, const int* t, float dloss, int N, int V),
                  (losses, dl, logits, t, dloss, N, V))
  HETFLOW_GUARDED(double, vocab_crossentropy_backward,
                  (float* dl, const float* l, const float* m, const float* s, const int* t, int V0, float dloss, int N,
                   int V),
                  (dl, l, m, s, t, V0, dloss, N, V))
  HETFLOW_GUARDED(void, scale, (float* x, float f, size_t n), (x, f, n))
  HETFLOW_GUARDED(double, sum_of_squares, (const float* x, size_t n, double start), (x, n, start))
  HETFLOW_GUARDED(void, adamw_update,
                  (float* p, const float* g, float* m, float* v, size_t n, float lr, float b1, float b2, float eps,
                   float wd, int step),
                  (p, g, m, v, n, lr, b1, b2, eps, wd, step))
#undef HETFLOW_GUARDED

  size_t live_ranges() const {
    std::lock_guard lock(mutex_);
    return ranges_.size();
  }

 private:
  template <class T>
  exec::OpsArray<T> guarded(size_t n) const {
    if (n == 0) return {};
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    const size_t bytes = (n * sizeof(T) + page - 1) / page * page;
    void* p = mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    std::lock_guard lock(mutex_);
    ranges_[p] = bytes;
    if (depth_ > 0) mprotect(p, bytes, PROT_READ | PROT_WRITE);  // allocated inside an op
    memory_->allocated(bytes);
    return exec::OpsArray<T>(std::shared_ptr<T>(static_cast<T*>(p),
                                                [this, bytes](T* q) {
                                                  std::lock_guard inner(mutex_);
                                                  ranges_.erase(q);
                                                  munmap(q, bytes);
                                                  memory_->freed(bytes);
                                                }),
                             n);
  }
  void require_mine(const float* p, size_t n, const char* what) const {
    if (n == 0) return;
    std::lock_guard lock(mutex_);
    const auto* at = reinterpret_cast<const char*>(p);
    auto after = ranges_.upper_bound(const_cast<char*>(at));
    if (after != ranges_.begin()) {
      const auto& [start, bytes] = *std::prev(after);
      if (at + n * sizeof(float) <= static_cast<const char*>(start) + bytes) return;
    }
    throw std::logic_error(std::string("guarded ops: ") + what + " of memory that is not theirs");
  }
  void protect(int how) const {
    for (const auto& [p, bytes] : ranges_) mprotect(p, bytes, how);
  }

  mutable std::recursive_mutex mutex_;
  mutable std::map<void*, size_t> ranges_;
  mutable int depth_ = 0;
  struct sigaction previous_ {};
};


}  // namespace hetflow::test_support
