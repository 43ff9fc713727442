// Built instead of matmul_cuda.cu where nvcc is not found: the CUDA entry points say so.
#include "kernels/matmul.hpp"

namespace hetflow::kernels {

bool cuda_built() { return false; }
int cuda_device_count() { return 0; }
std::string cuda_status() { return "this build has no CUDA (nvcc was not found at configure time)"; }
std::string cuda_device_name(int) { return ""; }

Status matmul_cuda(const float* a, const float* b, float* c, int m, int n, int k) {
  if (const Status arguments = matmul_arguments(a, b, c, m, n, k); arguments != Status::success) return arguments;
  return m == 0 || n == 0 ? Status::success : Status::not_built;
}

}  // namespace hetflow::kernels
