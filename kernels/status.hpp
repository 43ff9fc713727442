#pragma once
// What a kernel call returns, in the style of cublasStatus_t: a plain code, no exceptions and
// no strings built on the hot path. kernels/ is a leaf; the executor is the one place that
// turns a status into the project's errors (with the task and device it was running).
namespace hetflow::kernels {

enum class Status {
  success,
  not_built,         // this build has no CUDA (nvcc was not found at configure time)
  no_device,         // CUDA is built but no GPU is visible to this process
  invalid_value,     // a size is negative, or a pointer is null where data is needed
  alloc_failed,      // device memory could not be allocated
  execution_failed,  // a launch, copy or synchronisation reported an error
  library_missing,   // a CUDA library opened at first use (cuBLAS) could not be opened
};

// A short lower-case description ("no CUDA device visible"), like cublasGetStatusString.
const char* status_string(Status status);

// After a library_missing: why the library could not be opened, naming it ("libcublas.so.13:
// cannot open shared object file: ..."); "" while nothing has failed to open.
const char* missing_library_reason();

// After an execution_failed, alloc_failed or no_device on this thread: the CUDA or cuBLAS
// error behind it, named ("cudaErrorIllegalAddress: an illegal memory access was
// encountered", "CUBLAS_STATUS_NOT_SUPPORTED"); "" before any. A fault of an asynchronous
// kernel is reported by whichever later call returns it, so the name matters more than the
// call that carried it.
const char* failure_detail();

namespace detail {
// Called by the CUDA code where an error becomes a Status.
void note_failure(const char* name, const char* description);
}  // namespace detail

}  // namespace hetflow::kernels
