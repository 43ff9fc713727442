#pragma once
// Dense matrix multiply, the executor's workhorse: C[m x n] = A[m x k] * B[k x n], row-major,
// fp32. A CPU reference (always built) and a CUDA kernel (built where nvcc is found) that
// tests compare against it.
#include <string>

#include "kernels/status.hpp"

namespace hetflow::kernels {

// The reference: plain loops in double accumulation, easy to trust.
void matmul_reference(const float* a, const float* b, float* c, int m, int n, int k);

// Whether the arguments describe a product: Status::invalid_value for a negative size or a
// null pointer where data is read or written; both implementations check this first.
Status matmul_arguments(const float* a, const float* b, const float* c, int m, int n, int k);

// True when this build has the CUDA kernels (nvcc was found at configure time).
bool cuda_built();
// GPUs visible to this process (0 without CUDA or without a device); never throws.
int cuda_device_count();
// A short description of why CUDA is unavailable, or the first device's name.
std::string cuda_status();
// The name CUDA gives device `device` ("NVIDIA H200"), "" when there is no such device.
std::string cuda_device_name(int device);

// The CUDA kernel (shared-memory tiles). Host pointers in and out; copies to and from the
// device. Status::success, or why not (no CUDA build, no device, a bad size, a CUDA error);
// `c` is unspecified unless it succeeded.
Status matmul_cuda(const float* a, const float* b, float* c, int m, int n, int k);

}  // namespace hetflow::kernels
