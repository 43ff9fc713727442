#pragma once
// Dense matrix multiply, the executor's workhorse: C[m x n] = A[m x k] * B[k x n], row-major,
// fp32. A CPU reference (always built) and a CUDA kernel (built where nvcc is found) that
// tests compare against it.
#include <string>

namespace hetflow::kernels {

// The reference: plain loops in double accumulation, easy to trust.
void matmul_reference(const float* a, const float* b, float* c, int m, int n, int k);

// True when this build has the CUDA kernels (nvcc was found at configure time).
bool cuda_built();
// GPUs visible to this process (0 without CUDA or without a device); never throws.
int cuda_device_count();
// A short description of why CUDA is unavailable, or the first device's name.
std::string cuda_status();

// The CUDA kernel (shared-memory tiles). Host pointers in and out; copies to and from the
// device. Returns false, with `error` set, when there is no CUDA build or device.
bool matmul_cuda(const float* a, const float* b, float* c, int m, int n, int k, std::string* error);

}  // namespace hetflow::kernels
