#include "kernels/matmul.hpp"

namespace hetflow::kernels {

Status matmul_arguments(const float* a, const float* b, const float* c, int m, int n, int k) {
  if (m < 0 || n < 0 || k < 0) return Status::invalid_value;
  const bool output = m > 0 && n > 0;
  if (output && (c == nullptr || (k > 0 && (a == nullptr || b == nullptr)))) return Status::invalid_value;
  return Status::success;
}

void matmul_reference(const float* a, const float* b, float* c, int m, int n, int k) {
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      double sum = 0;
      for (int p = 0; p < k; ++p) sum += static_cast<double>(a[i * k + p]) * b[p * n + j];
      c[i * n + j] = static_cast<float>(sum);
    }
  }
}

}  // namespace hetflow::kernels
