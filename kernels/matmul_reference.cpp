#include "kernels/matmul.hpp"

namespace hetflow::kernels {

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
