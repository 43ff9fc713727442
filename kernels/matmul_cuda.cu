// The CUDA matmul: 32x32 tiles of A and B staged in shared memory, one thread per output
// element. Not cuBLAS-fast; correct, small, and a baseline for the executor's own kernels.
#include <cuda_runtime.h>

#include "kernels/matmul.hpp"

namespace hetflow::kernels {

namespace {

constexpr int kTile = 32;

// Rows go on grid.x (up to 2^31 - 1 blocks; grid.y stops at 65535), columns on grid.y; indices
// are 64-bit, since m * k may pass INT_MAX.
__global__ void matmul_tiled(const float* a, const float* b, float* c, int m, int n, int k) {
  __shared__ float tile_a[kTile][kTile];
  __shared__ float tile_b[kTile][kTile];
  const long long row = static_cast<long long>(blockIdx.x) * kTile + threadIdx.y;
  const long long col = static_cast<long long>(blockIdx.y) * kTile + threadIdx.x;
  float sum = 0;
  for (int t = 0; t < k; t += kTile) {
    tile_a[threadIdx.y][threadIdx.x] = row < m && t + threadIdx.x < k ? a[row * k + t + threadIdx.x] : 0.0f;
    const long long b_row = t + threadIdx.y;
    tile_b[threadIdx.y][threadIdx.x] = col < n && b_row < k ? b[b_row * n + col] : 0.0f;
    __syncthreads();
    for (int p = 0; p < kTile; ++p) sum += tile_a[threadIdx.y][p] * tile_b[p][threadIdx.x];
    __syncthreads();
  }
  if (row < m && col < n) c[row * n + col] = sum;
}

// A CUDA error as the kernel's status; the sticky error state is cleared so that the next
// call starts clean.
Status status_of(cudaError_t error, Status on_failure) {
  if (error == cudaSuccess) return Status::success;
  cudaGetLastError();
  return on_failure;
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

std::string cuda_device_name(int device) {
  cudaDeviceProp prop{};
  if (device < 0 || device >= cuda_device_count() || cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    cudaGetLastError();
    return "";
  }
  return prop.name;
}

Status matmul_cuda(const float* a, const float* b, float* c, int m, int n, int k) {
  if (const Status arguments = matmul_arguments(a, b, c, m, n, k); arguments != Status::success) return arguments;
  if (m == 0 || n == 0) return Status::success;
  if (cuda_device_count() == 0) return Status::no_device;
  float *da = nullptr, *db = nullptr, *dc = nullptr;
  const size_t bytes_a = sizeof(float) * static_cast<size_t>(m) * static_cast<size_t>(k);
  const size_t bytes_b = sizeof(float) * static_cast<size_t>(k) * static_cast<size_t>(n);
  const size_t bytes_c = sizeof(float) * static_cast<size_t>(m) * static_cast<size_t>(n);
  Status status = status_of(cudaMalloc(&da, bytes_a > 0 ? bytes_a : 1), Status::alloc_failed);
  if (status == Status::success) status = status_of(cudaMalloc(&db, bytes_b > 0 ? bytes_b : 1), Status::alloc_failed);
  if (status == Status::success) status = status_of(cudaMalloc(&dc, bytes_c), Status::alloc_failed);
  if (status == Status::success && bytes_a > 0) {
    status = status_of(cudaMemcpy(da, a, bytes_a, cudaMemcpyHostToDevice), Status::execution_failed);
  }
  if (status == Status::success && bytes_b > 0) {
    status = status_of(cudaMemcpy(db, b, bytes_b, cudaMemcpyHostToDevice), Status::execution_failed);
  }
  if (status == Status::success) {
    const dim3 block(kTile, kTile);
    const unsigned column_blocks = static_cast<unsigned>((n + kTile - 1) / kTile);
    if (column_blocks > 65535) {
      status = Status::invalid_value;  // n above 2 million columns: beyond this demo
    } else {
      const dim3 grid(static_cast<unsigned>((m + kTile - 1) / kTile), column_blocks);
      matmul_tiled<<<grid, block>>>(da, db, dc, m, n, k);
      status = status_of(cudaGetLastError(), Status::execution_failed);
    }
  }
  if (status == Status::success) {
    status = status_of(cudaMemcpy(c, dc, bytes_c, cudaMemcpyDeviceToHost), Status::execution_failed);
  }
  cudaFree(da);
  cudaFree(db);
  cudaFree(dc);
  return status;
}

}  // namespace hetflow::kernels
