#include "exec/cuda_decoder_ops.hpp"

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "model/error.hpp"

namespace hetflow::exec {

namespace k = hetflow::kernels;
using k::Status;

void CudaDecoderOps::check(Status status, const char* kernel) const {
  if (status != Status::success) {
    std::string why = k::status_string(status);
    if (status == Status::library_missing) why += std::string(" (") + k::missing_library_reason() + ")";
    // (Both always come from a CUDA or cuBLAS error, noted as it became the status; no_device
    // may come from the device count alone, with no note of its own.)
    const bool from_cuda = status == Status::execution_failed || status == Status::alloc_failed;
    if (from_cuda && *k::failure_detail() != '\0') why += std::string(" (") + k::failure_detail() + ")";
    throw Error(std::string(kernel) + " on " + name() + ": " + why);
  }
}

// Free device blocks by size (rounded up to 512 bytes, so near sizes share blocks).
class CudaDecoderOps::Pool {
 public:
  Pool() = default;
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;
  // (Every array is gone, so is the work that used it: the back end drained its streams.)
  ~Pool() {
    for (auto& [bytes, blocks] : free_) {
      for (const Block& b : blocks) k::cuda_free(b.ptr);  // (cudaFree takes stream-ordered memory too)
    }
  }
  struct Block {
    void* ptr = nullptr;
    bool stream_ordered = false;  // from cudaMallocAsync
  };
  static size_t rounded(size_t bytes) { return (bytes + 511) / 512 * 512; }
  Block take(size_t bytes) {
    std::lock_guard lock(mutex_);
    auto found = free_.find(bytes);
    if (found == free_.end() || found->second.empty()) return {};
    const Block b = found->second.back();
    found->second.pop_back();
    return b;
  }
  void give(Block b, size_t bytes) {
    std::lock_guard lock(mutex_);
    free_[bytes].push_back(b);
  }

 private:
  std::mutex mutex_;
  std::map<size_t, std::vector<Block>> free_;
};

CudaDecoderOps::CudaDecoderOps(int device, kernels::CudaStream stream, kernels::GemmInputs gemm_inputs)
    : device_(device), stream_(stream), gemm_inputs_(gemm_inputs), pool_(std::make_shared<Pool>()) {}

template <class T>
OpsArray<T> CudaDecoderOps::allocate(size_t n) const {
  if (n == 0) return {};
  const size_t bytes = Pool::rounded(n * sizeof(T));
  Pool::Block block = pool_->take(bytes);
  // A new block is ordered on the stream: cudaMalloc could wait for the device's other work,
  // an NCCL kernel spinning on a peer among it.
  if (block.ptr == nullptr) check(k::cuda_malloc_on_stream(&block.ptr, bytes, stream_, &block.stream_ordered), "cudaMallocAsync");
  memory_->allocated(bytes);  // the block's (rounded) bytes: what the array holds on the GPU
  return OpsArray<T>(std::shared_ptr<T>(static_cast<T*>(block.ptr),
                                        [pool = pool_, memory = memory_, block, bytes](T*) {
                                          pool->give(block, bytes);
                                          memory->freed(bytes);
                                        }),
                     n);
}

OpsFloats CudaDecoderOps::floats(size_t n) const { return allocate<float>(n); }

OpsFloats CudaDecoderOps::zeros(size_t n) const {
  OpsFloats a = allocate<float>(n);
  zero(a.data(), n);
  return a;
}

OpsInts CudaDecoderOps::ints(const int* host, size_t n) const {
  OpsInts a = allocate<int>(n);
  check(k::cuda_copy_to_device_on_stream(a.data(), host, n * sizeof(int), stream_), "copy to device");
  return a;
}

void CudaDecoderOps::copy(float* dst, const float* src, size_t n) const {
  check(k::cuda_copy_on_stream(dst, src, n * sizeof(float), stream_), "copy");
}

void CudaDecoderOps::zero(float* dst, size_t n) const {
  check(k::cuda_memset_zero(dst, n * sizeof(float), stream_), "memset");
}

void CudaDecoderOps::upload(float* dst, const float* host, size_t n) const {
  check(k::cuda_copy_to_device_on_stream(dst, host, n * sizeof(float), stream_), "copy to device");
}

void CudaDecoderOps::download(float* host, const float* src, size_t n) const {
  check(k::cuda_copy_to_host_on_stream(host, src, n * sizeof(float), stream_), "copy to host");
  check(k::cuda_synchronize(stream_), "synchronize");
}

void CudaDecoderOps::download_ints(int* host, const int* src, size_t n) const {
  check(k::cuda_copy_to_host_on_stream(host, src, n * sizeof(int), stream_), "copy to host");
  check(k::cuda_synchronize(stream_), "synchronize");
}

double CudaDecoderOps::sum(const float* x, size_t n) const {
  std::vector<float> host(n);
  download(host.data(), x, n);
  double total = 0;
  for (const float v : host) total += v;
  return total;
}

// The op table's ops: the CUDA entry point on this ops' stream (with its GEMM inputs, for
// the gemm ops), or throw.
#define HETFLOW_OPS_TAIL_stream stream_
#define HETFLOW_OPS_TAIL_gemm stream_, gemm_inputs_
#define HETFLOW_OPS_TAIL_scratch stream_, hetflow::kernels::kAttentionScratchBytes  // (k: a parameter)
#define HETFLOW_OP(name, tail, params, args, ...)                                                      \
  void CudaDecoderOps::name params const {                                                             \
    check(hetflow::kernels::name##_cuda(HETFLOW_OP_UNPAREN args, HETFLOW_OPS_TAIL_##tail), #name); \
  }
#define HETFLOW_KERNEL(...)
#include "kernels/decoder_ops.def"
#undef HETFLOW_OPS_TAIL_stream
#undef HETFLOW_OPS_TAIL_gemm
#undef HETFLOW_OPS_TAIL_scratch

void CudaDecoderOps::warm_up() const {
  constexpr int n = 8;
  const OpsFloats x = zeros(n * n), w = zeros(n * n), b = zeros(n), y = zeros(n * n);
  linear_forward(y.data(), x.data(), w.data(), b.data(), n, n, n);
  linear_backward_input(x.data(), y.data(), w.data(), n, n, n);
  linear_backward_weight(w.data(), b.data(), y.data(), x.data(), n, n, n);
  check(k::cuda_synchronize(stream_), "cudaStreamSynchronize (warm-up)");
}
void CudaDecoderOps::crossentropy_forward_backward(float* losses, float* dlogits, const float* logits,
                                                   const int* targets, float dloss, int N, int V) const {
  check(k::crossentropy_forward_cuda(losses, logits, targets, N, V, stream_), "crossentropy_forward");
  zero(dlogits, static_cast<size_t>(N) * static_cast<size_t>(V));  // the backward adds
  check(k::crossentropy_backward_cuda(dlogits, logits, targets, dloss, N, V, stream_), "crossentropy_backward");
}

void CudaDecoderOps::scale(float* x, float factor, size_t n) const {
  check(k::scale_cuda(x, factor, static_cast<long>(n), stream_), "scale");
}

double CudaDecoderOps::sum_of_squares(const float* x, size_t n, double start) const {
  const OpsArray<double> parts = allocate<double>(k::kSumOfSquaresParts);
  check(k::sum_of_squares_cuda(parts.data(), x, static_cast<long>(n), stream_), "sum_of_squares");
  std::vector<double> host(parts.size());
  check(k::cuda_copy_to_host_on_stream(host.data(), parts.data(), host.size() * sizeof(double), stream_),
        "copy to host");
  check(k::cuda_synchronize(stream_), "synchronize");
  for (const double part : host) start += part;
  return start;
}

void CudaDecoderOps::adamw_update(float* p, const float* g, float* m, float* v, size_t n, float lr, float beta1,
                                  float beta2, float eps, float weight_decay, int step) const {
  check(k::adamw_update_cuda(p, g, m, v, static_cast<long>(n), lr, beta1, beta2, eps, weight_decay, step, stream_),
        "adamw_update");
}

double CudaDecoderOps::vocab_crossentropy_backward(float* dlogits, const float* logits, const float* row_max,
                                                   const float* sums, const int* targets, int V0, float dloss, int N,
                                                   int V) const {
  const OpsArray<double> losses = allocate<double>(static_cast<size_t>(N));
  check(k::vocab_crossentropy_backward_cuda(dlogits, losses.data(), logits, row_max, sums, targets, V0, dloss, N, V,
                                            stream_),
        "vocab_crossentropy_backward");
  std::vector<double> host(losses.size());
  check(k::cuda_copy_to_host_on_stream(host.data(), losses.data(), host.size() * sizeof(double), stream_),
        "copy to host");
  check(k::cuda_synchronize(stream_), "synchronize");
  double total = 0;
  for (const double l : host) total += l;  // in row order, as the CPU
  return total;
}

}  // namespace hetflow::exec
