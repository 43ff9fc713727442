// The CUDA matmul: 32x32 tiles of A and B staged in shared memory, one thread per output
// element. Not cuBLAS-fast; correct, small, and a baseline for the executor's own kernels.
#include <cuda_runtime.h>

#include "kernels/matmul.hpp"

namespace hetflow::kernels {

namespace {

constexpr int kTile = 32;

__global__ void matmul_tiled(const float* a, const float* b, float* c, int m, int n, int k) {
  __shared__ float tile_a[kTile][kTile];
  __shared__ float tile_b[kTile][kTile];
  const int row = blockIdx.y * kTile + threadIdx.y;
  const int col = blockIdx.x * kTile + threadIdx.x;
  float sum = 0;
  for (int t = 0; t < k; t += kTile) {
    tile_a[threadIdx.y][threadIdx.x] = row < m && t + threadIdx.x < k ? a[row * k + t + threadIdx.x] : 0.0f;
    tile_b[threadIdx.y][threadIdx.x] = col < n && t + threadIdx.y < k ? b[(t + threadIdx.y) * n + col] : 0.0f;
    __syncthreads();
    for (int p = 0; p < kTile; ++p) sum += tile_a[threadIdx.y][p] * tile_b[p][threadIdx.x];
    __syncthreads();
  }
  if (row < m && col < n) c[row * n + col] = sum;
}

bool check(cudaError_t status, const char* what, std::string* error) {
  if (status == cudaSuccess) return true;
  if (error) *error = std::string(what) + ": " + cudaGetErrorString(status);
  return false;
}

}  // namespace

bool cuda_built() { return true; }

int cuda_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) return 0;
  return count;
}

std::string cuda_status() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) return std::string("no CUDA device visible: ") + cudaGetErrorString(status);
  if (count == 0) return "no CUDA device visible";
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  return std::to_string(count) + " CUDA device(s), the first a " + prop.name;
}

bool matmul_cuda(const float* a, const float* b, float* c, int m, int n, int k, std::string* error) {
  if (cuda_device_count() == 0) {
    if (error) *error = cuda_status();
    return false;
  }
  float *da = nullptr, *db = nullptr, *dc = nullptr;
  const size_t bytes_a = sizeof(float) * static_cast<size_t>(m) * k;
  const size_t bytes_b = sizeof(float) * static_cast<size_t>(k) * n;
  const size_t bytes_c = sizeof(float) * static_cast<size_t>(m) * n;
  bool ok = check(cudaMalloc(&da, bytes_a), "cudaMalloc", error) && check(cudaMalloc(&db, bytes_b), "cudaMalloc", error) &&
            check(cudaMalloc(&dc, bytes_c), "cudaMalloc", error) &&
            check(cudaMemcpy(da, a, bytes_a, cudaMemcpyHostToDevice), "cudaMemcpy", error) &&
            check(cudaMemcpy(db, b, bytes_b, cudaMemcpyHostToDevice), "cudaMemcpy", error);
  if (ok) {
    const dim3 block(kTile, kTile);
    const dim3 grid((n + kTile - 1) / kTile, (m + kTile - 1) / kTile);
    matmul_tiled<<<grid, block>>>(da, db, dc, m, n, k);
    ok = check(cudaGetLastError(), "kernel launch", error) &&
         check(cudaMemcpy(c, dc, bytes_c, cudaMemcpyDeviceToHost), "cudaMemcpy", error);
  }
  cudaFree(da);
  cudaFree(db);
  cudaFree(dc);
  return ok;
}

}  // namespace hetflow::kernels
