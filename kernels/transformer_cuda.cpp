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

Status linear_forward_cuda(float* y, const float* x, const float* w, const float* b, int N, int C, int OC,
                           CudaStream stream, GemmInputs inputs) {
  if (N < 0 || C < 0 || OC < 0) return Status::invalid_value;
  if (N == 0 || OC == 0) return Status::success;
  if (!all_present(y) || (C > 0 && !all_present(x, w))) return Status::invalid_value;
  HETFLOW_CHECK_READY();
  return launch::linear_forward(y, x, w, b, N, C, OC, stream, inputs);
}

Status linear_backward_input_cuda(float* dx, const float* dy, const float* w, int N, int C, int OC, CudaStream stream,
                                  GemmInputs inputs) {
  if (N < 0 || C < 0 || OC < 0) return Status::invalid_value;
  if (dx == nullptr || N == 0 || C == 0 || OC == 0) return Status::success;
  if (!all_present(dy, w)) return Status::invalid_value;
  HETFLOW_CHECK_READY();
  return launch::linear_backward_input(dx, dy, w, N, C, OC, stream, inputs);
}

Status linear_backward_weight_cuda(float* dw, float* db, const float* dy, const float* x, int N, int C, int OC,
                                   CudaStream stream, GemmInputs inputs) {
  if (N < 0 || C < 0 || OC < 0) return Status::invalid_value;
  if (C == 0) dw = nullptr;  // an empty weight gradient
  if ((dw == nullptr && db == nullptr) || N == 0 || OC == 0) return Status::success;
  if (!all_present(dy) || (dw != nullptr && !all_present(x))) return Status::invalid_value;
  HETFLOW_CHECK_READY();
  return launch::linear_backward_weight(dw, db, dy, x, N, C, OC, stream, inputs);
}

Status release_linear_handles(CudaStream stream) {
  if (!cuda_built()) return Status::success;  // nothing was ever made
  return launch::release_linear_handles(stream);
}

// ---------------------------------------------------------------------------------------------

Status embedding_forward_cuda(float* y, const int* tokens, const float* wte, const float* wpe, int N, int T, int C,
                              CudaStream stream) {
  if (N < 0 || T < 0 || C < 0) return Status::invalid_value;
  if (N == 0 || C == 0) return Status::success;
  if (T == 0 || !all_present(y, tokens, wte)) return Status::invalid_value;
  HETFLOW_CHECK_READY();
  return launch::embedding_forward(y, tokens, wte, wpe, N, T, C, stream);
}

Status embedding_backward_cuda(float* dwte, float* dwpe, const float* dy, const int* tokens, int N, int T, int C,
                               CudaStream stream) {
  if (N < 0 || T < 0 || C < 0) return Status::invalid_value;
  if ((dwte == nullptr && dwpe == nullptr) || N == 0 || C == 0) return Status::success;
  if (T == 0 || !all_present(dy) || (dwte != nullptr && tokens == nullptr)) return Status::invalid_value;
  HETFLOW_CHECK_READY();
  return launch::embedding_backward(dwte, dwpe, dy, tokens, N, T, C, stream);
}

// ---------------------------------------------------------------------------------------------

Status layernorm_forward_cuda(float* y, float* mean, float* rstd, const float* x, const float* w, const float* b,
                              int N, int C, float eps, CudaStream stream) {
  if (N < 0 || C < 0) return Status::invalid_value;
  if (N == 0) return Status::success;
  if (C == 0 || !all_present(y, mean, rstd, x, w, b)) return Status::invalid_value;
  HETFLOW_CHECK_READY();
  return launch::layernorm_forward(y, mean, rstd, x, w, b, N, C, eps, stream);
}

Status layernorm_backward_cuda(float* dx, float* dw, float* db, const float* dy, const float* x, const float* w,
                               const float* mean, const float* rstd, int N, int C, CudaStream stream) {
  if (N < 0 || C < 0) return Status::invalid_value;
  if ((dx == nullptr && dw == nullptr && db == nullptr) || N == 0 || C == 0) return Status::success;
  if (!all_present(dy, x, w, mean, rstd)) return Status::invalid_value;
  HETFLOW_CHECK_READY();
  return launch::layernorm_backward(dx, dw, db, dy, x, w, mean, rstd, N, C, stream);
}

Status rmsnorm_forward_cuda(float* y, float* rstd, const float* x, const float* w, int N, int C, float eps,
                            CudaStream stream) {
  if (N < 0 || C < 0) return Status::invalid_value;
  if (N == 0) return Status::success;
  if (C == 0 || !all_present(y, rstd, x, w)) return Status::invalid_value;
  HETFLOW_CHECK_READY();
  return launch::rmsnorm_forward(y, rstd, x, w, N, C, eps, stream);
}

Status rmsnorm_backward_cuda(float* dx, float* dw, const float* dy, const float* x, const float* w, const float* rstd,
                             int N, int C, CudaStream stream) {
  if (N < 0 || C < 0) return Status::invalid_value;
  if ((dx == nullptr && dw == nullptr) || N == 0 || C == 0) return Status::success;
  if (!all_present(dy, x, w, rstd)) return Status::invalid_value;
  HETFLOW_CHECK_READY();
  return launch::rmsnorm_backward(dx, dw, dy, x, w, rstd, N, C, stream);
}

// ---------------------------------------------------------------------------------------------

Status residual_add_cuda(float* y, const float* x, long n, CudaStream stream) {
  if (n < 0) return Status::invalid_value;
  if (n == 0) return Status::success;
  if (!all_present(y, x)) return Status::invalid_value;
  HETFLOW_CHECK_READY();
  return launch::residual_add(y, x, n, stream);
}

Status bias_add_cuda(float* y, const float* b, int N, int C, CudaStream stream) {
  if (N < 0 || C < 0) return Status::invalid_value;
  if (N == 0 || C == 0) return Status::success;
  if (!all_present(y, b)) return Status::invalid_value;
  HETFLOW_CHECK_READY();
  return launch::bias_add(y, b, N, C, stream);
}

Status gelu_forward_cuda(float* y, const float* x, long n, CudaStream stream) {
  if (n < 0) return Status::invalid_value;
  if (n == 0) return Status::success;
  if (!all_present(y, x)) return Status::invalid_value;
  HETFLOW_CHECK_READY();
  return launch::gelu_forward(y, x, n, stream);
}

Status gelu_backward_cuda(float* dx, const float* dy, const float* x, long n, CudaStream stream) {
  if (n < 0) return Status::invalid_value;
  if (dx == nullptr || n == 0) return Status::success;
  if (!all_present(dy, x)) return Status::invalid_value;
  HETFLOW_CHECK_READY();
  return launch::gelu_backward(dx, dy, x, n, stream);
}

Status swiglu_forward_cuda(float* y, const float* gate, const float* up, long n, CudaStream stream) {
  if (n < 0) return Status::invalid_value;
  if (n == 0) return Status::success;
  if (!all_present(y, gate, up)) return Status::invalid_value;
  HETFLOW_CHECK_READY();
  return launch::swiglu_forward(y, gate, up, n, stream);
}

Status swiglu_backward_cuda(float* dgate, float* dup, const float* dy, const float* gate, const float* up, long n,
                            CudaStream stream) {
  if (n < 0) return Status::invalid_value;
  if ((dgate == nullptr && dup == nullptr) || n == 0) return Status::success;
  if (!all_present(dy, gate, up)) return Status::invalid_value;
  HETFLOW_CHECK_READY();
  return launch::swiglu_backward(dgate, dup, dy, gate, up, n, stream);
}

namespace {

Status rope(float* x, int N, int T, int heads, int head_dim, const RopeFrequencies& frequencies, double sign,
            CudaStream stream) {
  if (N < 0 || T < 0 || heads < 0 || head_dim < 0 || head_dim % 2 != 0) return Status::invalid_value;
  if (x == nullptr && sign < 0) return Status::success;  // rope_backward skips a gradient not wanted
  if (N == 0 || heads == 0 || head_dim == 0) return Status::success;
  if (T == 0 || head_dim > 6144 || x == nullptr || !fits_int(static_cast<long long>(heads) * head_dim) ||
      !rope_frequencies_valid(frequencies)) {
    return Status::invalid_value;
  }
  HETFLOW_CHECK_READY();
  return launch::rope_rotate(x, N, T, heads, head_dim, frequencies, sign, stream);
}

}  // namespace

Status rope_forward_cuda(float* x, int N, int T, int heads, int head_dim, const RopeFrequencies& frequencies,
                         CudaStream stream) {
  return rope(x, N, T, heads, head_dim, frequencies, 1.0, stream);
}

Status rope_backward_cuda(float* dx, int N, int T, int heads, int head_dim, const RopeFrequencies& frequencies,
                          CudaStream stream) {
  return rope(dx, N, T, heads, head_dim, frequencies, -1.0, stream);
}

// ---------------------------------------------------------------------------------------------

namespace {

// Sizes attention can take: NH a multiple of NKV, HS within the kernels' shared memory, and
// every (batch, head, row) block numbered by an int.
bool attention_shape(int B, int T, int NH, int NKV, int HS) {
  return NKV > 0 && NH % NKV == 0 && HS <= kMaxCudaHeadSize && fits_int(static_cast<long long>(B) * NH * T);
}

}  // namespace

Status attention_forward_cuda(float* out, float* probs, const float* q, const float* k, const float* v, int B, int T,
                              int NH, int NKV, int HS, int window, CudaStream stream) {
  if (B < 0 || T < 0 || NH < 0 || NKV < 0 || HS < 0 || window < 0) return Status::invalid_value;
  if (B == 0 || T == 0 || NH == 0 || HS == 0) return Status::success;
  if (!attention_shape(B, T, NH, NKV, HS) || !all_present(out, probs, q, k, v)) return Status::invalid_value;
  HETFLOW_CHECK_READY();
  return launch::attention_forward(out, probs, q, k, v, B, T, NH, NKV, HS, window, stream);
}

Status attention_backward_cuda(float* dq, float* dk, float* dv, const float* dout, const float* probs, const float* q,
                               const float* k, const float* v, int B, int T, int NH, int NKV, int HS, int window,
                               CudaStream stream, std::size_t scratch_bytes) {
  if (B < 0 || T < 0 || NH < 0 || NKV < 0 || HS < 0 || window < 0) return Status::invalid_value;
  if ((dq == nullptr && dk == nullptr && dv == nullptr) || B == 0 || T == 0 || NH == 0 || HS == 0) {
    return Status::success;
  }
  if (!attention_shape(B, T, NH, NKV, HS) || !all_present(dout, probs, q, k, v)) return Status::invalid_value;
  HETFLOW_CHECK_READY();
  return launch::attention_backward(dq, dk, dv, dout, probs, q, k, v, B, T, NH, NKV, HS, window, scratch_bytes,
                                    stream);
}

// ---------------------------------------------------------------------------------------------

Status vocab_embedding_forward_cuda(float* y, const int* tokens, const float* wte, int V0, int V, const float* wpe,
                                    int N, int T, int C, CudaStream stream) {
  if (N < 0 || T < 0 || C < 0 || V < 0) return Status::invalid_value;
  if (N == 0 || C == 0) return Status::success;
  if (T == 0 || V == 0 || !all_present(y, tokens, wte)) return Status::invalid_value;
  HETFLOW_CHECK_READY();
  return launch::vocab_embedding_forward(y, tokens, wte, V0, V, wpe, N, T, C, stream);
}

Status vocab_embedding_backward_cuda(float* dwte, float* dwpe, const float* dy, const int* tokens, int V0, int V, int N,
                                     int T, int C, CudaStream stream) {
  if (N < 0 || T < 0 || C < 0 || V < 0) return Status::invalid_value;
  if ((dwte == nullptr && dwpe == nullptr) || N == 0 || C == 0) return Status::success;
  if (T == 0 || V == 0 || !all_present(dy, tokens)) return Status::invalid_value;
  HETFLOW_CHECK_READY();
  return launch::vocab_embedding_backward(dwte, dwpe, dy, tokens, V0, V, N, T, C, stream);
}

Status logits_row_max_cuda(float* row_max, const float* logits, int N, int V, CudaStream stream) {
  if (N < 0 || V < 0) return Status::invalid_value;
  if (N == 0) return Status::success;
  if (V == 0 || !all_present(row_max, logits)) return Status::invalid_value;
  HETFLOW_CHECK_READY();
  return launch::logits_row_max(row_max, logits, N, V, stream);
}

Status logits_exp_sums_cuda(float* sums, const float* logits, const float* row_max, const int* targets, int V0, int N,
                            int V, CudaStream stream) {
  if (N < 0 || V < 0) return Status::invalid_value;
  if (N == 0) return Status::success;
  if (V == 0 || !all_present(sums, logits, row_max, targets)) return Status::invalid_value;
  HETFLOW_CHECK_READY();
  return launch::logits_exp_sums(sums, logits, row_max, targets, V0, N, V, stream);
}

Status vocab_crossentropy_backward_cuda(float* dlogits, double* losses, const float* logits, const float* row_max,
                                        const float* sums, const int* targets, int V0, float dloss, int N, int V,
                                        CudaStream stream) {
  if (N < 0 || V < 0) return Status::invalid_value;
  if (N == 0) return Status::success;
  if (V == 0 || !all_present(dlogits, logits, row_max, sums, targets) || losses == nullptr) {
    return Status::invalid_value;
  }
  HETFLOW_CHECK_READY();
  return launch::vocab_crossentropy_backward(dlogits, losses, logits, row_max, sums, targets, V0, dloss, N, V, stream);
}

Status crossentropy_forward_cuda(float* losses, const float* logits, const int* targets, int N, int V,
                                 CudaStream stream) {
  if (N < 0 || V < 0) return Status::invalid_value;
  if (N == 0) return Status::success;
  if (V == 0 || !all_present(losses, logits, targets)) return Status::invalid_value;
  HETFLOW_CHECK_READY();
  return launch::crossentropy_forward(losses, logits, targets, N, V, stream);
}

Status crossentropy_backward_cuda(float* dlogits, const float* logits, const int* targets, float dloss, int N, int V,
                                  CudaStream stream) {
  if (N < 0 || V < 0) return Status::invalid_value;
  if (dlogits == nullptr || N == 0 || V == 0) return Status::success;
  if (!all_present(logits, targets)) return Status::invalid_value;
  HETFLOW_CHECK_READY();
  return launch::crossentropy_backward(dlogits, logits, targets, dloss, N, V, stream);
}

// ---------------------------------------------------------------------------------------------

Status scale_cuda(float* x, float factor, long n, CudaStream stream) {
  if (n < 0) return Status::invalid_value;
  if (n == 0) return Status::success;
  if (x == nullptr) return Status::invalid_value;
  HETFLOW_CHECK_READY();
  return launch::scale(x, factor, n, stream);
}

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
