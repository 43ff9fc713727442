// How cuBLAS is opened on first use (what it promises: cublas_loader.hpp): dlopen by soname,
// which honours LD_LIBRARY_PATH and the loader's cache, then by the path the build found it
// at; dlsym each entry point once; keep the result in a function-local static, which C++
// initialises exactly once even when several device threads reach it together.
#include "kernels/cublas_loader.hpp"

#include <dlfcn.h>

#include <string>

namespace hetflow::kernels::cublas {

namespace {

struct Library {
  // cuBLAS's own signatures; the `_v2` names are what cublas_v2.h's macros call.
  decltype(&::cublasCreate_v2) create = nullptr;
  decltype(&::cublasDestroy_v2) destroy = nullptr;
  decltype(&::cublasSetStream_v2) set_stream = nullptr;
  decltype(&::cublasSetWorkspace_v2) set_workspace = nullptr;
  decltype(&::cublasSgemm_v2) sgemm = nullptr;
  // cublasGemmEx is overloaded in C++ (a cudaDataType compute-type shim), so spelled out.
  cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
                            const void*, cudaDataType, int, const void*, cudaDataType, int, const void*, void*,
                            cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t) = nullptr;
  decltype(&::cublasGetStatusString) status_string = nullptr;
  std::string error;  // empty when every entry point was found
};

template <class Function>
void find(void* handle, const char* symbol, Function& function, std::string& error) {
  function = reinterpret_cast<Function>(dlsym(handle, symbol));
  if (function == nullptr && error.empty()) error = std::string(HETFLOW_CUBLAS_SONAME) + " has no " + symbol;
}

Library open_library() {
  Library lib;
  void* handle = dlopen(HETFLOW_CUBLAS_SONAME, RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const std::string by_name = dlerror();
    handle = dlopen(HETFLOW_CUBLAS_PATH, RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      lib.error = "cuBLAS could not be opened: " + by_name + "; " + dlerror();
      return lib;
    }
  }
  find(handle, "cublasCreate_v2", lib.create, lib.error);
  find(handle, "cublasDestroy_v2", lib.destroy, lib.error);
  find(handle, "cublasSetStream_v2", lib.set_stream, lib.error);
  find(handle, "cublasSetWorkspace_v2", lib.set_workspace, lib.error);
  find(handle, "cublasSgemm_v2", lib.sgemm, lib.error);
  find(handle, "cublasGemmEx", lib.gemm_ex, lib.error);
  find(handle, "cublasGetStatusString", lib.status_string, lib.error);
  return lib;
}

// Never destroyed: a handle released at exit could outlive it (as linear_cuda.cu's map).
const Library& library() {
  static const Library* lib = new Library(open_library());
  return *lib;
}

}  // namespace

bool available() { return library().error.empty(); }
const char* load_error() { return library().error.c_str(); }
const char* library_name() { return HETFLOW_CUBLAS_SONAME; }

const char* status_string(cublasStatus_t status) {
  const Library& lib = library();
  return lib.error.empty() ? lib.status_string(status) : lib.error.c_str();
}

cublasStatus_t create(cublasHandle_t* handle) {
  const Library& lib = library();
  return lib.error.empty() ? lib.create(handle) : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t destroy(cublasHandle_t handle) {
  const Library& lib = library();
  return lib.error.empty() ? lib.destroy(handle) : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t set_stream(cublasHandle_t handle, cudaStream_t stream) {
  const Library& lib = library();
  return lib.error.empty() ? lib.set_stream(handle, stream) : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t set_workspace(cublasHandle_t handle, void* workspace, size_t bytes) {
  const Library& lib = library();
  return lib.error.empty() ? lib.set_workspace(handle, workspace, bytes) : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t sgemm(cublasHandle_t handle, cublasOperation_t op_a, cublasOperation_t op_b, int m, int n, int k,
                     const float* alpha, const float* a, int lda, const float* b, int ldb, const float* beta, float* c,
                     int ldc) {
  const Library& lib = library();
  return lib.error.empty() ? lib.sgemm(handle, op_a, op_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
                           : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t gemm_ex(cublasHandle_t handle, cublasOperation_t op_a, cublasOperation_t op_b, int m, int n, int k,
                       const void* alpha, const void* a, cudaDataType a_type, int lda, const void* b,
                       cudaDataType b_type, int ldb, const void* beta, void* c, cudaDataType c_type, int ldc,
                       cublasComputeType_t compute, cublasGemmAlgo_t algo) {
  const Library& lib = library();
  return lib.error.empty() ? lib.gemm_ex(handle, op_a, op_b, m, n, k, alpha, a, a_type, lda, b, b_type, ldb, beta, c,
                                         c_type, ldc, compute, algo)
                           : CUBLAS_STATUS_NOT_INITIALIZED;
}

}  // namespace hetflow::kernels::cublas

namespace hetflow::kernels {

const char* missing_library_reason() { return cublas::load_error(); }

}  // namespace hetflow::kernels
