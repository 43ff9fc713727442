// cuBLAS is opened the first time a GEMM needs it (kernels/cublas_loader.hpp), not linked.
// Whether any process opens it early is checked on the real command (Cli.NothingButAGpuGemm
// OpensCublas); here, that asking opens it and finds every entry point. No GPU is needed:
// opening a library and looking up its symbols does not touch a device.
#include <gtest/gtest.h>

#ifdef HETFLOW_CUBLAS_AT_FIRST_USE
#include <dlfcn.h>

#include <string>

#include "kernels/cublas_loader.hpp"
#include "kernels/matmul.hpp"
#include "kernels/status.hpp"

namespace cublas = hetflow::kernels::cublas;

TEST(CublasLoader, AskingOpensTheLibraryWithEveryEntryPoint) {
  ASSERT_TRUE(cublas::available()) << cublas::load_error();
  EXPECT_STREQ(cublas::load_error(), "");
  EXPECT_STREQ(hetflow::kernels::missing_library_reason(), "");
  EXPECT_EQ(std::string(cublas::library_name()).rfind("libcublas.so.", 0), 0u) << cublas::library_name();
  void* opened = dlopen(cublas::library_name(), RTLD_NOW | RTLD_NOLOAD);  // already open: no new load
  ASSERT_NE(opened, nullptr) << cublas::library_name() << " is not open after available()";
  dlclose(opened);
  // cuBLAS's own strings and answers come through: a handle needs a GPU.
  EXPECT_STREQ(cublas::status_string(CUBLAS_STATUS_SUCCESS), "success");
  cublasHandle_t handle = nullptr;
  if (hetflow::kernels::cuda_device_count() == 0) {
    EXPECT_EQ(cublas::create(&handle), CUBLAS_STATUS_NOT_INITIALIZED);
  } else {
    ASSERT_EQ(cublas::create(&handle), CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(cublas::destroy(handle), CUBLAS_STATUS_SUCCESS);
  }
}
#else
TEST(CublasLoader, AskingOpensTheLibraryWithEveryEntryPoint) {
  GTEST_SKIP() << "this build has no cuBLAS (nvcc or libcublas not found at configure time)";
}
#endif
