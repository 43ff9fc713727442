#pragma once
// Test support for kernels: random inputs, central finite differences against an analytic
// gradient, and llm.c's backward convention (backwards add, nullptr gradients skipped).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace hetflow::test_support {

using Vec = std::vector<float>;

inline Vec random_vec(std::size_t n, std::mt19937& rng, float lo = -1, float hi = 1) {
  std::uniform_real_distribution<float> dist(lo, hi);
  Vec v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// L = sum(r ⊙ y) in double: the scalar whose gradient with respect to y is r.
inline double weighted_sum(const Vec& r, const Vec& y) {
  double sum = 0;
  for (std::size_t i = 0; i < y.size(); ++i) sum += static_cast<double>(r[i]) * y[i];
  return sum;
}

// Central differences of `loss` in every element of `input` (perturbed in place, restored),
// compared with `analytic`; the error allowed is `tol` times the largest numeric entry. The
// step is ±h (relative above 1) rounded to float, and the difference is divided by the step
// actually taken. The float forward's rounding puts noise of about 1e-7 |L| / h into each
// numeric entry and the truncation error grows as h^2: at h = 1e-2 the worst entry of any
// check here is off by under 1e-4 of the largest; at 1e-3 attention's came to 1e-3.
inline void expect_gradient(const std::string& what, Vec& input, const Vec& analytic, const std::function<double()>& loss,
                     double tol = 1e-3, float h = 1e-2f) {
  ASSERT_EQ(input.size(), analytic.size()) << what;
  std::vector<double> numeric(input.size());
  double scale = 1e-3;
  for (std::size_t i = 0; i < input.size(); ++i) {
    const float x = input[i];
    const float step = h * std::max(1.0f, std::fabs(x));
    input[i] = x + step;
    const double up_at = input[i], up = loss();
    input[i] = x - step;
    const double down_at = input[i], down = loss();
    input[i] = x;
    numeric[i] = (up - down) / (up_at - down_at);
    scale = std::max(scale, std::fabs(numeric[i]));
  }
  for (std::size_t i = 0; i < input.size(); ++i) {
    ASSERT_NEAR(analytic[i], numeric[i], tol * scale) << what << "[" << i << "] (largest entry " << scale << ")";
  }
}

// llm.c's backward convention, checked on `backward(grads)` whose i-th gradient has sizes[i]
// elements: from zeroed buffers it gives G; from buffers holding B it gives B + G (it adds);
// and asked for one gradient alone (the others nullptr) it gives that gradient of G bitwise.
// Returns G, for the finite-difference checks.
inline std::vector<Vec> check_convention(const std::string& what, const std::vector<std::size_t>& sizes,
                                  const std::function<void(const std::vector<float*>&)>& backward) {
  const auto pointers = [](std::vector<Vec>& grads) {
    std::vector<float*> p;
    for (Vec& g : grads) p.push_back(g.data());
    return p;
  };
  std::vector<Vec> fresh;
  for (std::size_t n : sizes) fresh.emplace_back(n, 0.0f);
  backward(pointers(fresh));

  std::mt19937 rng(99);
  std::vector<Vec> base, added;
  for (std::size_t n : sizes) base.push_back(random_vec(n, rng));
  added = base;
  backward(pointers(added));
  for (std::size_t g = 0; g < sizes.size(); ++g) {
    for (std::size_t i = 0; i < sizes[g]; ++i) {
      const float want = base[g][i] + fresh[g][i];
      EXPECT_NEAR(added[g][i], want, 1e-6 * (1 + std::fabs(base[g][i]) + std::fabs(fresh[g][i])))
          << what << ": gradient " << g << " does not add onto what it held, at " << i;
    }
  }

  backward(std::vector<float*>(sizes.size(), nullptr));  // nothing wanted: nothing written, nothing read
  for (std::size_t g = 0; g < sizes.size(); ++g) {
    std::vector<Vec> alone;
    for (std::size_t n : sizes) alone.emplace_back(n, 0.0f);
    std::vector<float*> p(sizes.size(), nullptr);
    p[g] = alone[g].data();
    backward(p);
    EXPECT_EQ(alone[g], fresh[g]) << what << ": gradient " << g << " differs when the others are skipped";
  }
  return fresh;
}

// An output buffer full of NaN: a forward must write every element, never read or add to it.
inline Vec unwritten(std::size_t n) { return Vec(n, std::numeric_limits<float>::quiet_NaN()); }

inline bool bitwise_equal(const Vec& a, const Vec& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace hetflow::test_support
