#pragma once
// cuBLAS, opened the first time a GEMM needs it instead of when the program starts.
//
// Why: libcublas pulls in libcublasLt, and loading that alone makes a process ~200 MiB
// resident and ~70 ms slower to start (measured: README, "Start-up"). Linked, every hetflow
// process paid it -- `hetflow simulate`, `hetflow --version`, every test -- though only GPU
// GEMMs use it. The CUDA runtime and NCCL stay linked: together they cost ~4 MiB.
//
// Each function has the signature of the cuBLAS entry point it names and forwards to it.
// When libcublas cannot be opened (or lacks an entry point), each returns
// CUBLAS_STATUS_NOT_INITIALIZED and load_error() says why. Opening happens once per process,
// thread-safe; the library is never closed.
#include <cublas_v2.h>

namespace hetflow::kernels::cublas {

cublasStatus_t create(cublasHandle_t* handle);
cublasStatus_t destroy(cublasHandle_t handle);
cublasStatus_t set_stream(cublasHandle_t handle, cudaStream_t stream);
cublasStatus_t set_workspace(cublasHandle_t handle, void* workspace, size_t bytes);
cublasStatus_t sgemm(cublasHandle_t handle, cublasOperation_t op_a, cublasOperation_t op_b, int m, int n, int k,
                     const float* alpha, const float* a, int lda, const float* b, int ldb, const float* beta, float* c,
                     int ldc);
cublasStatus_t gemm_ex(cublasHandle_t handle, cublasOperation_t op_a, cublasOperation_t op_b, int m, int n, int k,
                       const void* alpha, const void* a, cudaDataType a_type, int lda, const void* b,
                       cudaDataType b_type, int ldb, const void* beta, void* c, cudaDataType c_type, int ldc,
                       cublasComputeType_t compute, cublasGemmAlgo_t algo);

// cuBLAS's description of `status`; when the library could not be opened, why not.
const char* status_string(cublasStatus_t status);

// Opens the library now if it is not open yet. True when every entry point above was found.
bool available();
// Why available() is false ("libcublas.so.13: cannot open shared object file: ..."); "" when
// it is true.
const char* load_error();
// The name the library is opened by (its soname, e.g. "libcublas.so.13"), for tests and messages.
const char* library_name();

}  // namespace hetflow::kernels::cublas
