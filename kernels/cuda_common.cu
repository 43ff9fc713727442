// The host side of cuda_common.cuh and the memory helpers of transformer_cuda.hpp.
#include "kernels/cuda_common.cuh"
#include "kernels/transformer_cuda_launch.hpp"

namespace hetflow::kernels {

namespace cuda {

Status status_of(cudaError_t error) {
  if (error == cudaSuccess) return Status::success;
  cudaGetLastError();  // clear it, so that the next call starts clean
  detail::note_failure(cudaGetErrorName(error), cudaGetErrorString(error));
  switch (error) {
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorDevicesUnavailable:
      return Status::no_device;
    case cudaErrorMemoryAllocation:
      return Status::alloc_failed;
    default:
      return Status::execution_failed;
  }
}

Status launched() { return status_of(cudaGetLastError()); }

Scratch::~Scratch() {
  if (ptr_ == nullptr) return;
  if (pooled_) {
    cudaFreeAsync(ptr_, stream_);
  } else {
    cudaStreamSynchronize(stream_);
    cudaFree(ptr_);
  }
}

Status Scratch::allocate(std::size_t bytes) {
  cudaError_t error = cudaMallocAsync(&ptr_, bytes, stream_);
  if (error == cudaErrorNotSupported) {
    cudaGetLastError();
    pooled_ = false;
    error = cudaMalloc(&ptr_, bytes);
  }
  if (error != cudaSuccess) ptr_ = nullptr;
  return status_of(error);
}

}  // namespace cuda

namespace launch {

Status malloc_device(void** ptr, std::size_t bytes) {
  const Status status = cuda::status_of(cudaMalloc(ptr, bytes));
  if (status != Status::success) *ptr = nullptr;
  return status;
}

Status free_device(void* ptr) { return cuda::status_of(cudaFree(ptr)); }

Status malloc_on_stream(void** ptr, std::size_t bytes, CudaStream stream, bool* stream_ordered) {
  *stream_ordered = true;
  cudaError_t error = cudaMallocAsync(ptr, bytes, stream);
  if (error == cudaErrorNotSupported) {
    cudaGetLastError();
    *stream_ordered = false;
    error = cudaMalloc(ptr, bytes);
  }
  if (error != cudaSuccess) *ptr = nullptr;
  return cuda::status_of(error);
}

Status free_on_stream(void* ptr, CudaStream stream) { return cuda::status_of(cudaFreeAsync(ptr, stream)); }

Status copy_to_device(void* device, const void* host, std::size_t bytes) {
  return cuda::status_of(cudaMemcpy(device, host, bytes, cudaMemcpyHostToDevice));
}

Status copy_to_host(void* host, const void* device, std::size_t bytes) {
  return cuda::status_of(cudaMemcpy(host, device, bytes, cudaMemcpyDeviceToHost));
}

Status copy_on_stream(void* dst, const void* src, std::size_t bytes, CudaStream stream) {
  return cuda::status_of(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream));
}

Status copy_to_device_on_stream(void* device, const void* host, std::size_t bytes, CudaStream stream) {
  return cuda::status_of(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, stream));
}

Status copy_to_host_on_stream(void* host, const void* device, std::size_t bytes, CudaStream stream) {
  return cuda::status_of(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, stream));
}

Status memset_zero(void* device, std::size_t bytes, CudaStream stream) {
  return cuda::status_of(cudaMemsetAsync(device, 0, bytes, stream));
}

Status synchronize(CudaStream stream) { return cuda::status_of(cudaStreamSynchronize(stream)); }

}  // namespace launch

}  // namespace hetflow::kernels
