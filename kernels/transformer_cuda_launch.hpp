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

// The op table's launchers: Status name(parameters, tail) for every op of
// kernels/decoder_ops.def, defined in the .cu file of its family (gemm ops in linear_cuda.cu).
#define HETFLOW_OP(name, tail, params, ...) Status name HETFLOW_OP_CUDA_DEF(params, tail);
#define HETFLOW_KERNEL(name, tail, params, ...) Status name HETFLOW_OP_CUDA_DEF(params, tail);
#include "kernels/decoder_ops.def"

Status release_linear_handles(CudaStream stream);
// out[c] += sum over rows n of dy[n][c] (linear's db), in the norms' fixed-order column sums.
Status column_sums(float* out, const float* dy, int N, int C, CudaStream stream);
// Whether column_sums (and the norms' weight gradients) can take C columns: checked before a
// caller enqueues other work, so that a refused call leaves its outputs untouched.
bool column_sums_fit(int C);
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
