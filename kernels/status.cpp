#include "kernels/status.hpp"

#include <string>

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

namespace {
thread_local std::string last_failure;
}  // namespace

const char* failure_detail() { return last_failure.c_str(); }

namespace detail {
void note_failure(const char* name, const char* description) {
  last_failure = name;
  if (description != nullptr && *description != '\0') last_failure += std::string(": ") + description;
}
}  // namespace detail

}  // namespace hetflow::kernels
