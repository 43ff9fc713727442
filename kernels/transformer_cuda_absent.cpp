// Built instead of the transformer .cu files where nvcc is not found. The entry points
// (transformer_cuda.cpp) answer Status::not_built before reaching a launcher; these only let
// the library link.
#include "kernels/transformer_cuda_launch.hpp"

namespace hetflow::kernels::launch {

Status malloc_device(void**, std::size_t) { return Status::not_built; }
Status free_device(void*) { return Status::not_built; }
Status malloc_on_stream(void**, std::size_t, CudaStream, bool*) { return Status::not_built; }
Status free_on_stream(void*, CudaStream) { return Status::not_built; }
Status copy_to_device(void*, const void*, std::size_t) { return Status::not_built; }
Status copy_to_host(void*, const void*, std::size_t) { return Status::not_built; }
Status copy_on_stream(void*, const void*, std::size_t, CudaStream) { return Status::not_built; }
Status copy_to_device_on_stream(void*, const void*, std::size_t, CudaStream) { return Status::not_built; }
Status copy_to_host_on_stream(void*, const void*, std::size_t, CudaStream) { return Status::not_built; }
Status memset_zero(void*, std::size_t, CudaStream) { return Status::not_built; }
Status synchronize(CudaStream) { return Status::not_built; }

// The op table's launchers (the gemm ops' stubs are linear_cuda_absent.cpp's). Named
// parameters go unused here, by design.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-parameter"
#define HETFLOW_OP(name, tail, params, ...) \
  HETFLOW_OP_UNLESS_GEMM(tail, Status name HETFLOW_OP_CUDA_DEF(params, tail) { return Status::not_built; })
#define HETFLOW_KERNEL(...) HETFLOW_OP(__VA_ARGS__)
#include "kernels/decoder_ops.def"
#pragma GCC diagnostic pop

Status column_sums(float*, const float*, int, int, CudaStream) { return Status::not_built; }
Status sum_of_squares(double*, const float*, long, CudaStream) { return Status::not_built; }
Status adamw_update(float*, const float*, float*, float*, long, const AdamwScalars&, CudaStream) {
  return Status::not_built;
}
Status cast_fp32_to_bf16(std::uint16_t*, const float*, long, CudaStream) { return Status::not_built; }
Status cast_bf16_to_fp32(float*, const std::uint16_t*, long, CudaStream) { return Status::not_built; }
Status cast_fp32_to_fp16(std::uint16_t*, const float*, long, CudaStream) { return Status::not_built; }
Status cast_fp16_to_fp32(float*, const std::uint16_t*, long, CudaStream) { return Status::not_built; }

}  // namespace hetflow::kernels::launch
