#include "kernels/status.hpp"

namespace hetflow::kernels {

const char* status_string(Status status) {
  switch (status) {
    case Status::success: return "success";
    case Status::not_built: return "this build has no CUDA kernels";
    case Status::no_device: return "no CUDA device visible";
    case Status::invalid_value: return "invalid value (a negative size or a null pointer)";
    case Status::alloc_failed: return "device memory allocation failed";
    case Status::execution_failed: return "kernel launch or copy failed";
    case Status::library_missing: return "the cuBLAS library could not be opened";
  }
  return "unknown status";
}

}  // namespace hetflow::kernels
