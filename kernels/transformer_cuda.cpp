// The entry points of transformer_cuda.hpp, built with or without CUDA: each checks its
// arguments, returns early when there is nothing to do, checks that CUDA is built and a device
// visible, and only then calls its launcher (transformer_cuda_launch.hpp).
#include <climits>
#include <cmath>

#include "kernels/matmul.hpp"
#include "kernels/transformer_cuda_launch.hpp"

namespace hetflow::kernels {

namespace {

template <class... Pointers>
bool all_present(const Pointers*... pointers) {
  return ((pointers != nullptr) && ...);
}

// not_built, no_device or success. The device count is read once: CUDA fixes the visible
// devices when it initializes.
Status cuda_ready() {
  if (!cuda_built()) return Status::not_built;
  static const int devices = cuda_device_count();
  return devices > 0 ? Status::success : Status::no_device;
}

// Returns cuda_ready()'s answer from the calling entry point unless it is success.
#define HETFLOW_CHECK_READY()                                                     \
  do {                                                                            \
    if (const Status ready = cuda_ready(); ready != Status::success) return ready; \
  } while (false)

// Kernels index rows and blocks with int: products of sizes must fit.
bool fits_int(long long value) { return value <= INT_MAX; }

}  // namespace

Status cuda_malloc(void** ptr, std::size_t bytes) {
  if (ptr == nullptr) return Status::invalid_value;
  *ptr = nullptr;
  if (bytes == 0) return Status::success;
  HETFLOW_CHECK_READY();
  return launch::malloc_device(ptr, bytes);
}

Status cuda_free(void* ptr) {
  if (ptr == nullptr) return Status::success;
  HETFLOW_CHECK_READY();
  return launch::free_device(ptr);
}

Status cuda_malloc_on_stream(void** ptr, std::size_t bytes, CudaStream stream, bool* stream_ordered) {
  if (ptr == nullptr || stream_ordered == nullptr) return Status::invalid_value;
  *ptr = nullptr;
  *stream_ordered = false;
  if (bytes == 0) return Status::success;
  HETFLOW_CHECK_READY();
  return launch::malloc_on_stream(ptr, bytes, stream, stream_ordered);
}

Status cuda_free_on_stream(void* ptr, CudaStream stream) {
  if (ptr == nullptr) return Status::success;
  HETFLOW_CHECK_READY();
  return launch::free_on_stream(ptr, stream);
}

Status cuda_copy_to_device(void* device, const void* host, std::size_t bytes) {
  if (bytes == 0) return Status::success;
  if (!all_present(device, host)) return Status::invalid_value;
  HETFLOW_CHECK_READY();
  return launch::copy_to_device(device, host, bytes);
}

Status cuda_copy_to_host(void* host, const void* device, std::size_t bytes) {
  if (bytes == 0) return Status::success;
  if (!all_present(device, host)) return Status::invalid_value;
  HETFLOW_CHECK_READY();
  return launch::copy_to_host(host, device, bytes);
}

Status cuda_copy_on_stream(void* dst, const void* src, std::size_t bytes, CudaStream stream) {
  if (bytes == 0) return Status::success;
  if (!all_present(dst, src)) return Status::invalid_value;
  HETFLOW_CHECK_READY();
  return launch::copy_on_stream(dst, src, bytes, stream);
}

Status cuda_copy_to_device_on_stream(void* device, const void* host, std::size_t bytes, CudaStream stream) {
  if (bytes == 0) return Status::success;
  if (!all_present(device, host)) return Status::invalid_value;
  HETFLOW_CHECK_READY();
  return launch::copy_to_device_on_stream(device, host, bytes, stream);
}

Status cuda_copy_to_host_on_stream(void* host, const void* device, std::size_t bytes, CudaStream stream) {
  if (bytes == 0) return Status::success;
  if (!all_present(device, host)) return Status::invalid_value;
  HETFLOW_CHECK_READY();
  return launch::copy_to_host_on_stream(host, device, bytes, stream);
}

Status cuda_memset_zero(void* device, std::size_t bytes, CudaStream stream) {
  if (bytes == 0) return Status::success;
  if (device == nullptr) return Status::invalid_value;
  HETFLOW_CHECK_READY();
  return launch::memset_zero(device, bytes, stream);
}

Status cuda_synchronize(CudaStream stream) {
  HETFLOW_CHECK_READY();
  return launch::synchronize(stream);
}

// ---------------------------------------------------------------------------------------------

namespace {

// Sizes attention can take: NH a multiple of NKV, HS within the kernels' shared memory, and
// every (batch, head, row) block numbered by an int.
bool attention_shape(int B, int T, int NH, int NKV, int HS) {
  return NKV > 0 && NH % NKV == 0 && HS <= kMaxCudaHeadSize && fits_int(static_cast<long long>(B) * NH * T);
}

}  // namespace

// The op table's entry points: the line's three checks in their order, then CUDA ready, then
// the launcher.
#define HETFLOW_OP(name, tail, params, args, bad_size, nothing_to_do, bad_input) \
  Status name##_cuda HETFLOW_OP_CUDA_DEF(params, tail) {                        \
    if (bad_size) return Status::invalid_value;                                  \
    if (nothing_to_do) return Status::success;                                   \
    if (bad_input) return Status::invalid_value;                                 \
    HETFLOW_CHECK_READY();                                                       \
    return launch::name HETFLOW_OP_CUDA_ARGS(args, tail);                        \
  }
#define HETFLOW_KERNEL(...) HETFLOW_OP(__VA_ARGS__)
#include "kernels/decoder_ops.def"

Status release_linear_handles(CudaStream stream) {
  if (!cuda_built()) return Status::success;  // nothing was ever made
  return launch::release_linear_handles(stream);
}

// ---------------------------------------------------------------------------------------------

Status sum_of_squares_cuda(double* parts, const float* x, long n, CudaStream stream) {
  if (n < 0 || parts == nullptr) return Status::invalid_value;
  if (n > 0 && x == nullptr) return Status::invalid_value;
  HETFLOW_CHECK_READY();
  return launch::sum_of_squares(parts, x, n, stream);  // n == 0 still writes zero parts
}

Status adamw_update_cuda(float* p, const float* g, float* m, float* v, long n, float lr, float beta1, float beta2,
                         float eps, float weight_decay, int step, CudaStream stream) {
  if (n < 0 || step < 1) return Status::invalid_value;
  if (n == 0) return Status::success;
  if (!all_present(p, g, m, v)) return Status::invalid_value;
  HETFLOW_CHECK_READY();
  // Exactly adamw_update's scalars: float arguments promoted to double, pow and sqrt in double.
  launch::AdamwScalars scalars{};
  scalars.beta1 = beta1;
  scalars.one_minus_beta1 = 1.0 - beta1;
  scalars.beta2 = beta2;
  scalars.one_minus_beta2 = 1.0 - beta2;
  scalars.eps = eps;
  scalars.decay = static_cast<double>(lr) * weight_decay;
  scalars.step_size = lr / (1.0 - std::pow(static_cast<double>(beta1), step));
  scalars.bias2_sqrt = std::sqrt(1.0 - std::pow(static_cast<double>(beta2), step));
  return launch::adamw_update(p, g, m, v, n, scalars, stream);
}

// ---------------------------------------------------------------------------------------------

Status cast_fp32_to_bf16_cuda(std::uint16_t* out, const float* in, long n, CudaStream stream) {
  if (n < 0) return Status::invalid_value;
  if (n == 0) return Status::success;
  if (!all_present(out, in)) return Status::invalid_value;
  HETFLOW_CHECK_READY();
  return launch::cast_fp32_to_bf16(out, in, n, stream);
}

Status cast_bf16_to_fp32_cuda(float* out, const std::uint16_t* in, long n, CudaStream stream) {
  if (n < 0) return Status::invalid_value;
  if (n == 0) return Status::success;
  if (!all_present(out, in)) return Status::invalid_value;
  HETFLOW_CHECK_READY();
  return launch::cast_bf16_to_fp32(out, in, n, stream);
}

Status cast_fp32_to_fp16_cuda(std::uint16_t* out, const float* in, long n, CudaStream stream) {
  if (n < 0) return Status::invalid_value;
  if (n == 0) return Status::success;
  if (!all_present(out, in)) return Status::invalid_value;
  HETFLOW_CHECK_READY();
  return launch::cast_fp32_to_fp16(out, in, n, stream);
}

Status cast_fp16_to_fp32_cuda(float* out, const std::uint16_t* in, long n, CudaStream stream) {
  if (n < 0) return Status::invalid_value;
  if (n == 0) return Status::success;
  if (!all_present(out, in)) return Status::invalid_value;
  HETFLOW_CHECK_READY();
  return launch::cast_fp16_to_fp32(out, in, n, stream);
}

}  // namespace hetflow::kernels
