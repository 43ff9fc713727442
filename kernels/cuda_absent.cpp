// Built instead of matmul_cuda.cu where nvcc is not found: the CUDA entry points say so.
#include "kernels/matmul.hpp"

namespace hetflow::kernels {

bool cuda_built() { return false; }
int cuda_device_count() { return 0; }
std::string cuda_status() { return "this build has no CUDA (nvcc was not found at configure time)"; }

bool matmul_cuda(const float*, const float*, float*, int, int, int, std::string* error) {
  if (error) *error = cuda_status();
  return false;
}

}  // namespace hetflow::kernels
