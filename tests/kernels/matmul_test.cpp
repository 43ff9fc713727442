// The CUDA matmul against its CPU reference; the reference against products known by hand.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/matmul.hpp"

using namespace hetflow::kernels;

TEST(MatmulReference, KnownProducts) {
  const std::vector<float> a = {1, 2, 3, 4, 5, 6};        // 2 x 3
  const std::vector<float> b = {7, 8, 9, 10, 11, 12};     // 3 x 2
  std::vector<float> c(4);
  matmul_reference(a.data(), b.data(), c.data(), 2, 2, 3);
  EXPECT_EQ(c, (std::vector<float>{58, 64, 139, 154}));
  const std::vector<float> identity = {1, 0, 0, 0, 1, 0, 0, 0, 1};
  std::vector<float> same(6);
  matmul_reference(a.data(), identity.data(), same.data(), 2, 3, 3);
  EXPECT_EQ(same, a);
}

TEST(MatmulCuda, MatchesTheReference) {
  if (!cuda_built()) GTEST_SKIP() << "CUDA kernels not built: " << cuda_status();
  if (cuda_device_count() == 0) GTEST_SKIP() << "skipped, needs a GPU: " << cuda_status();
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-1, 1);
  for (const auto& [m, n, k] : {std::tuple{1, 1, 1}, std::tuple{33, 65, 17}, std::tuple{256, 128, 512}}) {
    std::vector<float> a(static_cast<size_t>(m * k)), b(static_cast<size_t>(k * n)), want(static_cast<size_t>(m * n)),
        got(static_cast<size_t>(m * n));
    for (float& x : a) x = dist(rng);
    for (float& x : b) x = dist(rng);
    matmul_reference(a.data(), b.data(), want.data(), m, n, k);
    const Status status = matmul_cuda(a.data(), b.data(), got.data(), m, n, k);
    ASSERT_EQ(status, Status::success) << status_string(status);
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_NEAR(got[i], want[i], 1e-4 * std::sqrt(static_cast<double>(k))) << "m=" << m << " n=" << n << " k=" << k;
    }
  }
}

// The status codes are what a caller sees without a GPU as well: a build without CUDA says
// not_built, a build without a visible device no_device; bad sizes are refused before either.
TEST(MatmulCuda, SaysWhyItCannotRun) {
  float x = 1;
  EXPECT_EQ(matmul_cuda(&x, &x, &x, -1, 1, 1), Status::invalid_value);
  EXPECT_EQ(matmul_cuda(nullptr, &x, &x, 1, 1, 1), Status::invalid_value);
  EXPECT_EQ(matmul_cuda(&x, &x, &x, 0, 1, 1), Status::success);  // an empty product is done
  if (!cuda_built()) {
    EXPECT_EQ(matmul_cuda(&x, &x, &x, 1, 1, 1), Status::not_built);
  } else if (cuda_device_count() == 0) {
    EXPECT_EQ(matmul_cuda(&x, &x, &x, 1, 1, 1), Status::no_device);
  }
  EXPECT_STREQ(status_string(Status::no_device), "no CUDA device visible");
}
