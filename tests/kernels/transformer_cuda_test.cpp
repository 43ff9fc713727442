// The CUDA transformer kernels (transformer_cuda.hpp) against their CPU references
// (transformer.hpp, cast.hpp), on random inputs of the odd sizes the CPU tests use and larger
// ones that cross the kernels' blocks and chunks. Each check runs the GPU side twice from the
// same inputs and requires bitwise equal results (determinism), compares the first run with
// the reference within a stated tolerance (or bitwise, where the kernel promises it), and, for
// a backward, checks that it adds (+=) onto what the gradients held and that a gradient asked
// for alone is bitwise the one asked for with the others.
//
// Tolerances: |gpu - cpu| <= rtol * |cpu| + atol * max |cpu| over the tensor, so relative for
// large entries and absolute, at the tensor's scale, near zero (where a cancellation leaves
// rounding noise).
//   pointwise (GELU, SwiGLU, RoPE):            rtol 1e-5, atol 1e-6 (CUDA's expf: 2 ulp; FMA contraction)
//   reductions (norms, attention, loss, linear): rtol 1e-4, atol 1e-5 (fp32 sums, the reference's double)
//   AdamW:                                      rtol 1e-6, atol 1e-7 (the same double operations)
//   embedding, casts:                           bitwise
//
// Every GPU test skips, saying why, without a CUDA build or a visible device. The last test
// runs anywhere: the entry points' argument checks, and, without a device, that each one says
// not_built or no_device instead of touching memory.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/cast.hpp"
#include "kernels/matmul.hpp"
#include "kernels/transformer.hpp"
#include "kernels/transformer_cuda.hpp"

using namespace hetflow::kernels;

namespace {

using Vec = std::vector<float>;

#define SKIP_WITHOUT_GPU()                                                           \
  if (!cuda_built()) GTEST_SKIP() << "CUDA kernels not built: " << cuda_status();   \
  if (cuda_device_count() == 0) GTEST_SKIP() << "skipped, needs a GPU: " << cuda_status()

#define EXPECT_OK(call)                                                                         \
  do {                                                                                          \
    const Status status_ = (call);                                                              \
    EXPECT_EQ(status_, Status::success) << #call << ": " << status_string(status_);             \
  } while (false)

struct Tolerance {
  double rtol, atol;
};
constexpr Tolerance kPointwise{1e-5, 1e-6};
constexpr Tolerance kReduction{1e-4, 1e-5};
constexpr Tolerance kAdamw{1e-6, 1e-7};

Vec random_vec(std::size_t n, std::mt19937& rng, float lo = -1, float hi = 1) {
  std::uniform_real_distribution<float> dist(lo, hi);
  Vec v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// An output buffer full of NaN: a forward must write every element.
Vec unwritten(std::size_t n) { return Vec(n, std::numeric_limits<float>::quiet_NaN()); }

std::size_t size_of(long long n) { return static_cast<std::size_t>(n); }

void expect_close(const std::string& what, const Vec& got, const Vec& want, Tolerance tol) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double largest = 0;
  for (const float w : want) largest = std::max(largest, std::fabs(static_cast<double>(w)));
  std::size_t bad = 0, first = 0;
  double worst = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double error = std::fabs(static_cast<double>(got[i]) - want[i]);
    const double allowed = tol.rtol * std::fabs(static_cast<double>(want[i])) + tol.atol * largest;
    if (!(error <= allowed)) {
      if (bad++ == 0) first = i;
    }
    if (allowed > 0) worst = std::max(worst, error / allowed);
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << want.size() << " outside rtol " << tol.rtol << " atol "
                     << tol.atol << " (largest |want| " << largest << ", worst error " << worst
                     << " times the allowed); first at " << first << ": got " << (bad > 0 ? got[first] : 0.0f)
                     << ", want " << (bad > 0 ? want[first] : 0.0f);
}

template <class T>
bool bitwise_equal(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

template <class T>
void expect_bitwise(const std::string& what, const std::vector<T>& got, const std::vector<T>& want) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(std::memcmp(&got[i], &want[i], sizeof(T)), 0)
        << what << ": not bitwise equal at " << i << ": got " << got[i] << ", want " << want[i];
  }
}

// Device copies of host vectors, freed with this object; downloads wait for the stream.
class Device {
 public:
  template <class T>
  T* upload(const std::vector<T>& host) {
    DeviceBuffer& buffer = buffers_.emplace_back();
    const std::size_t bytes = host.size() * sizeof(T);
    EXPECT_OK(buffer.allocate(bytes));
    EXPECT_OK(cuda_copy_to_device(buffer.get(), host.data(), bytes));
    return buffer.as<T>();
  }
  // Fills n floats of device memory with NaN: what a forward must overwrite, every run.
  void poison(float* device, std::size_t n) {
    const Vec nan = unwritten(n);
    EXPECT_OK(cuda_copy_to_device(device, nan.data(), n * sizeof(float)));
  }
  template <class T>
  std::vector<T> download(const T* device, std::size_t n) {
    EXPECT_OK(cuda_synchronize(nullptr));
    std::vector<T> host(n);
    EXPECT_OK(cuda_copy_to_host(host.data(), device, n * sizeof(T)));
    return host;
  }

 private:
  std::vector<DeviceBuffer> buffers_;
};

// Runs `gpu` (it enqueues kernels and downloads their outputs) twice from the same inputs: the
// runs must agree bitwise. Returns the first run's outputs.
std::vector<Vec> run_twice(const std::string& what, const std::function<std::vector<Vec>()>& gpu) {
  const std::vector<Vec> first = gpu(), second = gpu();
  EXPECT_EQ(first.size(), second.size()) << what;
  for (std::size_t i = 0; i < std::min(first.size(), second.size()); ++i) {
    EXPECT_TRUE(bitwise_equal(first[i], second[i])) << what << ": output " << i << " differs between two runs";
  }
  return first;
}

// A backward on the device, `backward(grads)` taking device gradient pointers, against the
// reference `reference(grads)` taking host ones (sizes as in `base`). From zeroed gradients
// and from gradients holding `base`, the device must give what the reference gives (within
// `tol`): the gradient itself, and that it adds (+=) onto what the buffers held. Asked for one
// gradient alone (the others nullptr), it must give bitwise the same gradient; asked for none,
// success. All of it twice, bitwise the same.
void check_backward(const std::string& what, const std::vector<Vec>& base, Tolerance tol,
                    const std::function<void(const std::vector<float*>&)>& reference,
                    const std::function<Status(const std::vector<float*>&)>& backward) {
  const std::size_t count = base.size();
  std::vector<Vec> zeros;
  for (const Vec& b : base) zeros.emplace_back(b.size(), 0.0f);
  const auto pointers = [](std::vector<Vec>& grads) {
    std::vector<float*> p;
    for (Vec& g : grads) p.push_back(g.data());
    return p;
  };
  std::vector<Vec> want_fresh = zeros, want_added = base;
  reference(pointers(want_fresh));
  reference(pointers(want_added));

  const std::vector<Vec> got = run_twice(what, [&] {
    std::vector<Vec> out;
    for (const std::vector<Vec>* start : {static_cast<const std::vector<Vec>*>(&zeros), &base}) {
      Device device;
      std::vector<float*> all;
      for (const Vec& b : *start) all.push_back(device.upload(b));
      EXPECT_OK(backward(all));
      for (std::size_t g = 0; g < count; ++g) out.push_back(device.download(all[g], base[g].size()));
    }
    for (std::size_t g = 0; g < count; ++g) {
      Device alone;
      std::vector<float*> one(count, nullptr);
      one[g] = alone.upload(base[g]);
      EXPECT_OK(backward(one));
      out.push_back(alone.download(one[g], base[g].size()));
    }
    EXPECT_OK(backward(std::vector<float*>(count, nullptr)));
    return out;
  });
  ASSERT_EQ(got.size(), 3 * count);
  for (std::size_t g = 0; g < count; ++g) {
    const std::string gradient = what + ": gradient " + std::to_string(g);
    expect_close(gradient + " from zero", got[g], want_fresh[g], tol);
    expect_close(gradient + " added", got[count + g], want_added[g], tol);
    EXPECT_TRUE(bitwise_equal(got[2 * count + g], got[count + g])) << gradient << " differs when asked alone";
  }
}

// ---------------------------------------------------------------------------------------------
// Norms

TEST(TransformerCuda, LayerNormMatchesTheReference) {
  SKIP_WITHOUT_GPU();
  // 300 rows cross the column sums' 256-row chunks; 769 columns, the row blocks' 256 threads.
  for (const auto& [N, C] : {std::pair{5, 7}, std::pair{33, 65}, std::pair{300, 769}}) {
    const std::string shape = "layernorm N=" + std::to_string(N) + " C=" + std::to_string(C);
    std::mt19937 rng(6);
    const Vec x = random_vec(size_of(N * C), rng, -2, 3), w = random_vec(size_of(C), rng, 0.5, 1.5),
              b = random_vec(size_of(C), rng), dy = random_vec(size_of(N * C), rng);
    const std::vector<Vec> base = {random_vec(size_of(N * C), rng), random_vec(size_of(C), rng),
                                   random_vec(size_of(C), rng)};
    Vec y(size_of(N * C)), mean(size_of(N)), rstd(size_of(N));
    layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C, 1e-5f);

    Device device;
    const float *dx_ = device.upload(x), *dw_ = device.upload(w), *db_ = device.upload(b), *ddy = device.upload(dy);
    float *dy_out = device.upload(unwritten(y.size())), *dmean = device.upload(unwritten(mean.size())),
          *drstd = device.upload(unwritten(rstd.size()));
    const std::vector<Vec> forward = run_twice(shape, [&] {
      device.poison(dy_out, y.size());
      device.poison(dmean, mean.size());
      device.poison(drstd, rstd.size());
      EXPECT_OK(layernorm_forward_cuda(dy_out, dmean, drstd, dx_, dw_, db_, N, C, 1e-5f, nullptr));
      return std::vector<Vec>{device.download(dy_out, y.size()), device.download(dmean, mean.size()),
                              device.download(drstd, rstd.size())};
    });
    expect_close(shape + " y", forward[0], y, kReduction);
    expect_close(shape + " mean", forward[1], mean, kReduction);
    expect_close(shape + " rstd", forward[2], rstd, kReduction);
    check_backward(
        shape + " backward", base, kReduction,
        [&](const std::vector<float*>& g) {
          layernorm_backward(g[0], g[1], g[2], dy.data(), x.data(), w.data(), mean.data(), rstd.data(), N, C);
        },
        [&](const std::vector<float*>& g) {
          return layernorm_backward_cuda(g[0], g[1], g[2], ddy, dx_, dw_, dmean, drstd, N, C, nullptr);
        });
  }
}

TEST(TransformerCuda, RmsNormMatchesTheReference) {
  SKIP_WITHOUT_GPU();
  for (const auto& [N, C] : {std::pair{5, 7}, std::pair{33, 65}, std::pair{300, 769}}) {
    const std::string shape = "rmsnorm N=" + std::to_string(N) + " C=" + std::to_string(C);
    std::mt19937 rng(8);
    const Vec x = random_vec(size_of(N * C), rng, -2, 3), w = random_vec(size_of(C), rng, 0.5, 1.5),
              dy = random_vec(size_of(N * C), rng);
    const std::vector<Vec> base = {random_vec(size_of(N * C), rng), random_vec(size_of(C), rng)};
    Vec y(size_of(N * C)), rstd(size_of(N));
    rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), N, C, 1e-6f);

    Device device;
    const float *dx_ = device.upload(x), *dw_ = device.upload(w), *ddy = device.upload(dy);
    float *dy_out = device.upload(unwritten(y.size())), *drstd = device.upload(unwritten(rstd.size()));
    const std::vector<Vec> forward = run_twice(shape, [&] {
      device.poison(dy_out, y.size());
      device.poison(drstd, rstd.size());
      EXPECT_OK(rmsnorm_forward_cuda(dy_out, drstd, dx_, dw_, N, C, 1e-6f, nullptr));
      return std::vector<Vec>{device.download(dy_out, y.size()), device.download(drstd, rstd.size())};
    });
    expect_close(shape + " y", forward[0], y, kReduction);
    expect_close(shape + " rstd", forward[1], rstd, kReduction);
    check_backward(
        shape + " backward", base, kReduction,
        [&](const std::vector<float*>& g) {
          rmsnorm_backward(g[0], g[1], dy.data(), x.data(), w.data(), rstd.data(), N, C);
        },
        [&](const std::vector<float*>& g) {
          return rmsnorm_backward_cuda(g[0], g[1], ddy, dx_, dw_, drstd, N, C, nullptr);
        });
  }
}

// ---------------------------------------------------------------------------------------------
// GELU, SwiGLU, RoPE

TEST(TransformerCuda, ResidualAndBiasAddsMatchTheReferenceBitwise) {
  SKIP_WITHOUT_GPU();
  for (const auto& [N, C] : {std::pair{3, 5}, std::pair{1031, 769}}) {
    const std::string shape = "adds N=" + std::to_string(N) + " C=" + std::to_string(C);
    std::mt19937 rng(21);
    const std::size_t n = size_of(1LL * N * C);
    const Vec y = random_vec(n, rng), x = random_vec(n, rng), b = random_vec(size_of(C), rng);
    Vec want_residual = y, want_bias = y;
    residual_add(want_residual.data(), x.data(), static_cast<long>(n));
    bias_add(want_bias.data(), b.data(), N, C);

    Device device;
    const float *dx = device.upload(x), *db = device.upload(b);
    float* dy = device.upload(y);
    const std::vector<Vec> got = run_twice(shape, [&] {
      EXPECT_OK(cuda_copy_to_device(dy, y.data(), n * sizeof(float)));
      EXPECT_OK(residual_add_cuda(dy, dx, static_cast<long>(n), nullptr));
      Vec residual = device.download(dy, n);
      EXPECT_OK(cuda_copy_to_device(dy, y.data(), n * sizeof(float)));
      EXPECT_OK(bias_add_cuda(dy, db, N, C, nullptr));
      return std::vector<Vec>{residual, device.download(dy, n)};
    });
    expect_bitwise(shape + " residual", got[0], want_residual);
    expect_bitwise(shape + " bias", got[1], want_bias);
  }
}

// bias_residual_add, the reference (runs anywhere): a closed form, bias_add then residual_add
// bitwise, no bias as no add (a -0 stays -0), and its entry point's checks.
TEST(TransformerCuda, BiasResidualAddReferenceIsTheBiasThenTheResidual) {
  Vec y = {1, 2, 3, 4};
  const Vec b = {10, 20}, residual = {100, 200, 300, 400};
  bias_residual_add(y.data(), b.data(), residual.data(), 2, 2);
  EXPECT_EQ(y, (Vec{111, 222, 313, 424}));
  Vec zero = {-0.0f};
  const Vec minus_zero = {-0.0f};
  bias_residual_add(zero.data(), nullptr, minus_zero.data(), 1, 1);
  EXPECT_TRUE(std::signbit(zero[0]));

  for (const auto& [N, C] : {std::pair{3, 5}, std::pair{64, 129}}) {
    std::mt19937 rng(23);
    const std::size_t n = size_of(1LL * N * C);
    const Vec start = random_vec(n, rng, -1e3f, 1e3f), r = random_vec(n, rng), bias = random_vec(size_of(C), rng);
    for (const bool with_bias : {true, false}) {
      Vec want = start, got = start;
      if (with_bias) bias_add(want.data(), bias.data(), N, C);
      residual_add(want.data(), r.data(), static_cast<long>(n));
      bias_residual_add(got.data(), with_bias ? bias.data() : nullptr, r.data(), N, C);
      expect_bitwise("bias_residual_add N=" + std::to_string(N) + (with_bias ? " with bias" : " without"), got, want);
    }
  }

  float f[4] = {};
  EXPECT_EQ(bias_residual_add_cuda(f, f, f, -1, 2, nullptr), Status::invalid_value);
  EXPECT_EQ(bias_residual_add_cuda(f, f, nullptr, 2, 2, nullptr), Status::invalid_value);
  EXPECT_EQ(bias_residual_add_cuda(nullptr, f, f, 2, 2, nullptr), Status::invalid_value);
  EXPECT_EQ(bias_residual_add_cuda(f, f, f, 2, 0, nullptr), Status::success);
  if (!cuda_built() || cuda_device_count() == 0) {
    EXPECT_EQ(bias_residual_add_cuda(f, nullptr, f, 2, 2, nullptr), cuda_built() ? Status::no_device : Status::not_built);
  }
}

TEST(TransformerCuda, BiasResidualAddMatchesTheReferenceBitwise) {
  SKIP_WITHOUT_GPU();
  for (const auto& [N, C] : {std::pair{3, 5}, std::pair{1031, 769}}) {
    std::mt19937 rng(22);
    const std::size_t n = size_of(1LL * N * C);
    const Vec y = random_vec(n, rng), r = random_vec(n, rng), b = random_vec(size_of(C), rng);
    for (const bool with_bias : {true, false}) {
      const std::string what = "bias_residual_add N=" + std::to_string(N) + " C=" + std::to_string(C) +
                               (with_bias ? " with bias" : " without");
      Vec want = y;
      bias_residual_add(want.data(), with_bias ? b.data() : nullptr, r.data(), N, C);
      Device device;
      const float *dr = device.upload(r), *db = with_bias ? device.upload(b) : nullptr;
      float* dy = device.upload(y);
      const std::vector<Vec> got = run_twice(what, [&] {
        EXPECT_OK(cuda_copy_to_device(dy, y.data(), n * sizeof(float)));
        EXPECT_OK(bias_residual_add_cuda(dy, db, dr, N, C, nullptr));
        return std::vector<Vec>{device.download(dy, n)};
      });
      expect_bitwise(what, got[0], want);
    }
  }
}

TEST(TransformerCuda, ScaleAndSumOfSquaresMatchTheReference) {
  SKIP_WITHOUT_GPU();
  for (const long n : {0L, 7L, 1000003L}) {
    std::mt19937 rng(25);
    const Vec x = random_vec(size_of(n), rng);
    Vec scaled = x;
    scale(scaled.data(), 0.375f, n);
    const double want = sum_of_squares(x.data(), n);
    Device device;
    float* d_x = device.upload(n > 0 ? x : Vec(1));
    double* parts = device.upload(std::vector<double>(kSumOfSquaresParts, -1.0));
    EXPECT_OK(sum_of_squares_cuda(parts, d_x, n, nullptr));
    double got = 0;
    for (const double part : device.download(parts, kSumOfSquaresParts)) got += part;
    // Both sum exact double squares, in different orders: each within n 2^-53 of the exact sum.
    EXPECT_NEAR(got, want, 2 * static_cast<double>(n) * 0x1p-53 * want) << "n=" << n;
    EXPECT_OK(scale_cuda(d_x, 0.375f, n, nullptr));
    if (n > 0) expect_bitwise("scale n=" + std::to_string(n), device.download(d_x, x.size()), scaled);
  }
}

TEST(TransformerCuda, CopiesOnAStreamMoveTheBytes) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(22);
  const Vec x = random_vec(4099, rng);
  Device device;
  float* src = device.upload(unwritten(x.size()));
  float* dst = device.upload(unwritten(x.size()));
  EXPECT_OK(cuda_copy_to_device_on_stream(src, x.data(), x.size() * sizeof(float), nullptr));
  EXPECT_OK(cuda_copy_on_stream(dst, src, x.size() * sizeof(float), nullptr));
  Vec back = unwritten(x.size());
  EXPECT_OK(cuda_copy_to_host_on_stream(back.data(), dst, x.size() * sizeof(float), nullptr));
  EXPECT_OK(cuda_synchronize(nullptr));
  expect_bitwise("copies", back, x);
}

TEST(TransformerCuda, GeluMatchesTheReference) {
  SKIP_WITHOUT_GPU();
  for (const long n : {35L, 100003L}) {
    const std::string shape = "gelu n=" + std::to_string(n);
    std::mt19937 rng(9);
    const Vec x = random_vec(size_of(n), rng, -5, 5), dy = random_vec(size_of(n), rng);
    const std::vector<Vec> base = {random_vec(size_of(n), rng)};
    Vec y(size_of(n));
    gelu_forward(y.data(), x.data(), n);

    Device device;
    const float *dx_ = device.upload(x), *ddy = device.upload(dy);
    float* dy_out = device.upload(unwritten(y.size()));
    const std::vector<Vec> forward = run_twice(shape, [&] {
      device.poison(dy_out, y.size());
      EXPECT_OK(gelu_forward_cuda(dy_out, dx_, n, nullptr));
      return std::vector<Vec>{device.download(dy_out, y.size())};
    });
    expect_close(shape + " y", forward[0], y, kPointwise);
    check_backward(
        shape + " backward", base, kPointwise,
        [&](const std::vector<float*>& g) { gelu_backward(g[0], dy.data(), x.data(), n); },
        [&](const std::vector<float*>& g) { return gelu_backward_cuda(g[0], ddy, dx_, n, nullptr); });
  }
}

TEST(TransformerCuda, SwiGluMatchesTheReference) {
  SKIP_WITHOUT_GPU();
  for (const long n : {35L, 100003L}) {
    const std::string shape = "swiglu n=" + std::to_string(n);
    std::mt19937 rng(10);
    Vec gate = random_vec(size_of(n), rng, -5, 5);
    gate[0] = -100.0f;  // exp(100) overflows: silu is 0, not NaN
    gate[1] = 100.0f;
    const Vec up = random_vec(size_of(n), rng), dy = random_vec(size_of(n), rng);
    const std::vector<Vec> base = {random_vec(size_of(n), rng), random_vec(size_of(n), rng)};
    Vec y(size_of(n));
    swiglu_forward(y.data(), gate.data(), up.data(), n);

    Device device;
    const float *dgate = device.upload(gate), *dup = device.upload(up), *ddy = device.upload(dy);
    float* dy_out = device.upload(unwritten(y.size()));
    const std::vector<Vec> forward = run_twice(shape, [&] {
      device.poison(dy_out, y.size());
      EXPECT_OK(swiglu_forward_cuda(dy_out, dgate, dup, n, nullptr));
      return std::vector<Vec>{device.download(dy_out, y.size())};
    });
    expect_close(shape + " y", forward[0], y, kPointwise);
    check_backward(
        shape + " backward", base, kPointwise,
        [&](const std::vector<float*>& g) { swiglu_backward(g[0], g[1], dy.data(), gate.data(), up.data(), n); },
        [&](const std::vector<float*>& g) { return swiglu_backward_cuda(g[0], g[1], ddy, dgate, dup, n, nullptr); });
  }
}

TEST(TransformerCuda, RopeMatchesTheReference) {
  SKIP_WITHOUT_GPU();
  struct Shape {
    int N, T, heads, head_dim;
    RopeFrequencies theta;
  };
  // Plain RoPE, and the rescalings: llama3's three bands (head_dim 64 at theta 10000 spans
  // wavelengths 6 to 7e4 against bands at 64 and 256 positions) and linear.
  const RopeFrequencies llama3{10000, RopeFrequencies::Scaling::llama3, 8, 1, 4, 256};
  const RopeFrequencies linear{10000, RopeFrequencies::Scaling::linear, 2.5};
  // Partial rotary: GLM-4.5's first 64 of 128 values a head, and llama3's bands over 6 of 10.
  RopeFrequencies glm{1000000}, partial_llama3 = llama3;
  glm.rotary_dims = 64;
  partial_llama3.rotary_dims = 6;
  // YaRN as Qwen3's long-context config sets it (x4 over 32768 positions, theta 1e6, heads of
  // 128: the ramp spans pairs 23 to 40), and untruncated over the first 64 of 96 values.
  RopeFrequencies qwen_yarn{1000000, RopeFrequencies::Scaling::yarn, 4};
  qwen_yarn.original_positions = 32768;
  qwen_yarn.attention_factor = 0.1 * std::log(4.0) + 1;
  RopeFrequencies loose_yarn = qwen_yarn;
  loose_yarn.truncate = false;
  loose_yarn.rotary_dims = 64;
  for (const Shape& s : {Shape{6, 3, 2, 4, {10000}}, Shape{10, 5, 3, 8, {500000}}, Shape{300, 150, 4, 64, {10000}},
                        Shape{2, 2, 1, 640, {10000}}, Shape{300, 150, 4, 64, llama3}, Shape{40, 20, 2, 16, linear},
                        Shape{64, 32, 6, 128, glm}, Shape{30, 15, 3, 10, partial_llama3},
                        Shape{64, 32, 4, 128, qwen_yarn}, Shape{40, 20, 2, 96, loose_yarn}}) {
    const std::string shape = "rope N=" + std::to_string(s.N) + " head_dim=" + std::to_string(s.head_dim);
    std::mt19937 rng(12);
    const std::size_t n = size_of(static_cast<long long>(s.N) * s.heads * s.head_dim);
    const Vec x = random_vec(n, rng, -3, 3), dy = random_vec(n, rng);
    Vec y = x, dx = dy;
    rope_forward(y.data(), s.N, s.T, s.heads, s.head_dim, s.theta);
    rope_backward(dx.data(), s.N, s.T, s.heads, s.head_dim, s.theta);
    Vec back = y;  // x, scaled twice by YaRN's attention factor
    rope_backward(back.data(), s.N, s.T, s.heads, s.head_dim, s.theta);
    const std::vector<Vec> got = run_twice(shape, [&] {
      Device device;
      float *dev_x = device.upload(x), *dev_dy = device.upload(dy);
      EXPECT_OK(rope_forward_cuda(dev_x, s.N, s.T, s.heads, s.head_dim, s.theta, nullptr));
      EXPECT_OK(rope_backward_cuda(dev_dy, s.N, s.T, s.heads, s.head_dim, s.theta, nullptr));
      Vec rotated = device.download(dev_x, n);
      EXPECT_OK(rope_backward_cuda(dev_x, s.N, s.T, s.heads, s.head_dim, s.theta, nullptr));  // and back
      return std::vector<Vec>{rotated, device.download(dev_dy, n), device.download(dev_x, n)};
    });
    expect_close(shape + " forward", got[0], y, kPointwise);
    expect_close(shape + " backward", got[1], dx, kPointwise);
    expect_close(shape + " backward of forward", got[2], back, kPointwise);
  }
}

// ---------------------------------------------------------------------------------------------
// Attention

struct AttentionShape {
  int B, T, NH, NKV, HS;
  int window = 0;  // sliding window: keys per query; 0 none
  std::size_t q() const { return size_of(static_cast<long long>(B) * T * NH * HS); }
  std::size_t kv() const { return size_of(static_cast<long long>(B) * T * NKV * HS); }
  std::size_t probs() const { return size_of(static_cast<long long>(B) * NH * T * T); }
  std::string name() const {
    return "attention B=" + std::to_string(B) + " T=" + std::to_string(T) + " NH=" + std::to_string(NH) +
           " NKV=" + std::to_string(NKV) + " HS=" + std::to_string(HS) + " window=" + std::to_string(window);
  }
};

TEST(TransformerCuda, AttentionMatchesTheReference) {
  SKIP_WITHOUT_GPU();
  // Grouped heads both ways; one token; rows past the CPU's and the GPU's 64-row blocks; head
  // sizes below and above a warp and a 64-column tile, up to the largest taken (1024); sliding
  // windows of one key, of fewer keys than a warp's, across the CPU's blocks, wider than the
  // GPU's tiles (so that whole steps of 32 keys inside a window are taken unmasked), and wider
  // than the sequence (every key, as no window).
  for (const AttentionShape s : {AttentionShape{2, 5, 6, 2, 4}, AttentionShape{2, 5, 6, 3, 4},
                                 AttentionShape{1, 1, 2, 1, 3}, AttentionShape{1, 67, 2, 1, 4},
                                 AttentionShape{2, 150, 4, 2, 8}, AttentionShape{2, 70, 6, 3, 64},
                                 AttentionShape{1, 33, 2, 2, 160}, AttentionShape{1, 9, 2, 1, 1024},
                                 AttentionShape{1, 20, 2, 1, 4, 1}, AttentionShape{2, 70, 6, 3, 64, 7},
                                 AttentionShape{2, 150, 4, 2, 8, 37}, AttentionShape{1, 300, 4, 2, 32, 100},
                                 AttentionShape{2, 70, 6, 3, 16, 2147483647}}) {
    std::mt19937 rng(18);
    const Vec q = random_vec(s.q(), rng, -2, 2), k = random_vec(s.kv(), rng, -2, 2), v = random_vec(s.kv(), rng),
              dout = random_vec(s.q(), rng);
    const std::vector<Vec> base = {random_vec(s.q(), rng), random_vec(s.kv(), rng), random_vec(s.kv(), rng)};
    Vec out(s.q()), probs(s.probs());
    attention_forward(out.data(), probs.data(), q.data(), k.data(), v.data(), s.B, s.T, s.NH, s.NKV, s.HS, s.window);

    Device device;
    const float *dq = device.upload(q), *dk = device.upload(k), *dv = device.upload(v), *ddout = device.upload(dout);
    float *dout_ = device.upload(unwritten(out.size())), *dprobs = device.upload(unwritten(probs.size()));
    const std::vector<Vec> forward = run_twice(s.name(), [&] {
      device.poison(dout_, out.size());
      device.poison(dprobs, probs.size());
      EXPECT_OK(attention_forward_cuda(dout_, dprobs, dq, dk, dv, s.B, s.T, s.NH, s.NKV, s.HS, s.window, nullptr));
      return std::vector<Vec>{device.download(dout_, out.size()), device.download(dprobs, probs.size())};
    });
    expect_close(s.name() + " out", forward[0], out, kReduction);
    expect_close(s.name() + " probs", forward[1], probs, kReduction);
    for (int row = 0; row < s.B * s.NH * s.T; ++row) {  // zero above the diagonal and before the window, exactly
      const int t = row % s.T;
      for (int j = 0; j < s.T; ++j) {
        if (j > t || (s.window > 0 && j <= t - s.window)) {
          ASSERT_EQ(forward[1][size_of(row) * s.T + j], 0.0f) << s.name();
        }
      }
    }
    check_backward(
        s.name() + " backward", base, kReduction,
        [&](const std::vector<float*>& g) {
          attention_backward(g[0], g[1], g[2], dout.data(), probs.data(), q.data(), k.data(), v.data(), s.B, s.T,
                             s.NH, s.NKV, s.HS, s.window);
        },
        [&](const std::vector<float*>& g) {
          return attention_backward_cuda(g[0], g[1], g[2], ddout, dprobs, dq, dk, dv, s.B, s.T, s.NH, s.NKV, s.HS,
                                         s.window, nullptr);
        });
  }
}

// The forward's output on the GPU for these queries, keys and values.
Vec attention_output(const AttentionShape& s, const Vec& q, const Vec& k, const Vec& v) {
  Device inputs;
  float *out = inputs.upload(Vec(s.q())), *probs = inputs.upload(Vec(s.probs()));
  EXPECT_OK(attention_forward_cuda(out, probs, inputs.upload(q), inputs.upload(k), inputs.upload(v), s.B, s.T, s.NH,
                                   s.NKV, s.HS, s.window, nullptr));
  return inputs.download(out, s.q());
}

// Keys NaN and values infinity at positions [from, to) of every sequence.
void poison_positions(const AttentionShape& s, Vec& k, Vec& v, int from, int to) {
  for (int b = 0; b < s.B; ++b) {
    for (int t = from; t < to; ++t) {
      for (int i = 0; i < s.NKV * s.HS; ++i) {
        k[size_of((b * s.T + t) * s.NKV * s.HS + i)] = std::numeric_limits<float>::quiet_NaN();
        v[size_of((b * s.T + t) * s.NKV * s.HS + i)] = std::numeric_limits<float>::infinity();
      }
    }
  }
}

// Rows [first, last) of every sequence's output, bitwise the same in both.
void expect_same_rows(const AttentionShape& s, const Vec& a, const Vec& b, int first, int last, const std::string& what) {
  for (int batch = 0; batch < s.B; ++batch) {
    const std::size_t at = size_of((batch * s.T + first) * s.NH * s.HS), n = size_of((last - first) * s.NH * s.HS);
    EXPECT_EQ(std::memcmp(a.data() + at, b.data() + at, n * sizeof(float)), 0) << what << " batch " << batch;
  }
}

TEST(TransformerCuda, AttentionNeverReadsLaterKeysOrValues) {
  SKIP_WITHOUT_GPU();
  const AttentionShape s{2, 150, 4, 2, 8};
  std::mt19937 rng(16);
  const Vec q = random_vec(s.q(), rng), k = random_vec(s.kv(), rng), v = random_vec(s.kv(), rng);
  const Vec clean = attention_output(s, q, k, v);
  for (const int from : {1, 64, 100, 149}) {
    Vec k2 = k, v2 = v;
    poison_positions(s, k2, v2, from, s.T);
    expect_same_rows(s, clean, attention_output(s, q, k2, v2), 0, from, "from " + std::to_string(from));
  }
}

// Under a sliding window of W keys, keys and values before a row's window are never read:
// poisoned ones before position `to` leave rows from to + W - 1 on bitwise as they were.
TEST(TransformerCuda, AttentionNeverReadsKeysBeforeTheWindow) {
  SKIP_WITHOUT_GPU();
  const AttentionShape s{2, 150, 4, 2, 8, 37};
  std::mt19937 rng(17);
  const Vec q = random_vec(s.q(), rng), k = random_vec(s.kv(), rng), v = random_vec(s.kv(), rng);
  const Vec clean = attention_output(s, q, k, v);
  for (const int to : {1, 64, 100}) {
    Vec k2 = k, v2 = v;
    poison_positions(s, k2, v2, 0, to);
    expect_same_rows(s, clean, attention_output(s, q, k2, v2), to + s.window - 1, s.T, "to " + std::to_string(to));
  }
}

// The backward in chunks of kv groups (scratch for one group's dS, or for two) gives bitwise
// the gradients of the whole backward in one chunk: a group's products do not depend on its
// chunk.
TEST(TransformerCuda, AttentionBackwardInChunksIsTheWholeBackward) {
  SKIP_WITHOUT_GPU();
  for (const AttentionShape s : {AttentionShape{3, 70, 6, 3, 16, 7}, AttentionShape{2, 150, 4, 2, 8}}) {
    std::mt19937 rng(19);
    const Vec q = random_vec(s.q(), rng, -2, 2), k = random_vec(s.kv(), rng, -2, 2), v = random_vec(s.kv(), rng),
              dout = random_vec(s.q(), rng);
    Device device;
    const float *dq = device.upload(q), *dk = device.upload(k), *dv = device.upload(v), *ddout = device.upload(dout);
    float *out = device.upload(Vec(s.q())), *probs = device.upload(Vec(s.probs()));
    EXPECT_OK(attention_forward_cuda(out, probs, dq, dk, dv, s.B, s.T, s.NH, s.NKV, s.HS, s.window, nullptr));
    const auto gradients = [&](std::size_t scratch_bytes) {
      float *gq = device.upload(Vec(s.q())), *gk = device.upload(Vec(s.kv())), *gv = device.upload(Vec(s.kv()));
      EXPECT_OK(attention_backward_cuda(gq, gk, gv, ddout, probs, dq, dk, dv, s.B, s.T, s.NH, s.NKV, s.HS, s.window,
                                        nullptr, scratch_bytes));
      return std::vector<Vec>{device.download(gq, s.q()), device.download(gk, s.kv()), device.download(gv, s.kv())};
    };
    const std::vector<Vec> whole = gradients(kAttentionScratchBytes);
    const std::size_t group_bytes = sizeof(float) * size_of(s.NH / s.NKV) * size_of(s.T) * size_of(s.T);
    for (const std::size_t scratch_bytes : {std::size_t{1}, 2 * group_bytes}) {
      const std::vector<Vec> chunked = gradients(scratch_bytes);
      for (std::size_t g = 0; g < whole.size(); ++g) {
        expect_bitwise(s.name() + " gradient " + std::to_string(g) + ", scratch " + std::to_string(scratch_bytes),
                       chunked[g], whole[g]);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Cross-entropy, embedding, AdamW

TEST(TransformerCuda, CrossEntropyMatchesTheReference) {
  SKIP_WITHOUT_GPU();
  for (const auto& [N, V] : {std::pair{5, 11}, std::pair{33, 50257}}) {
    const std::string shape = "crossentropy N=" + std::to_string(N) + " V=" + std::to_string(V);
    std::mt19937 rng(20);
    Vec logits = random_vec(size_of(static_cast<long long>(N) * V), rng, -5, 5);
    std::fill(logits.begin(), logits.begin() + V, 1000.0f);  // row 0 uniform and large: log V
    logits[size_of(V)] = 1e4f;                                // row 1: the target far below the max
    std::vector<int> targets(size_of(N));
    std::uniform_int_distribution<int> token(0, V - 1);
    for (int& t : targets) t = token(rng);
    targets[1] = 1;
    const float dloss = 1.0f / static_cast<float>(N);
    const std::vector<Vec> base = {random_vec(logits.size(), rng)};
    Vec losses(size_of(N));
    crossentropy_forward(losses.data(), logits.data(), targets.data(), N, V);

    Device device;
    const float* dlogits = device.upload(logits);
    const int* dtargets = device.upload(targets);
    float* dlosses = device.upload(unwritten(losses.size()));
    const std::vector<Vec> forward = run_twice(shape, [&] {
      device.poison(dlosses, losses.size());
      EXPECT_OK(crossentropy_forward_cuda(dlosses, dlogits, dtargets, N, V, nullptr));
      return std::vector<Vec>{device.download(dlosses, losses.size())};
    });
    expect_close(shape + " losses", forward[0], losses, kReduction);
    check_backward(
        shape + " backward", base, kReduction,
        [&](const std::vector<float*>& g) { crossentropy_backward(g[0], logits.data(), targets.data(), dloss, N, V); },
        [&](const std::vector<float*>& g) {
          return crossentropy_backward_cuda(g[0], dlogits, dtargets, dloss, N, V, nullptr);
        });
  }
}

TEST(TransformerCuda, EmbeddingMatchesTheReferenceBitwise) {
  SKIP_WITHOUT_GPU();
  struct Shape {
    int T, N, C, V;
  };
  // N % T != 0 too: a last sequence cut short still takes positions 0, 1, ...
  for (const Shape s : {Shape{5, 10, 7, 4}, Shape{64, 256, 769, 50}, Shape{8, 3, 33, 6}, Shape{64, 300, 40, 9}}) {
    const std::string shape = "embedding N=" + std::to_string(s.N) + " T=" + std::to_string(s.T);
    std::mt19937 rng(4);
    std::vector<int> tokens(size_of(s.N));
    std::uniform_int_distribution<int> token(0, s.V - 1);
    for (int& t : tokens) t = token(rng);
    tokens[0] = s.V - 1;  // repeated tokens, and the last row of wte
    tokens[size_of(s.N - 1)] = s.V - 1;
    const Vec wte = random_vec(size_of(s.V * s.C), rng), wpe = random_vec(size_of(s.T * s.C), rng),
              dy = random_vec(size_of(s.N * s.C), rng);
    const std::vector<Vec> base = {random_vec(wte.size(), rng), random_vec(wpe.size(), rng)};
    Vec y(size_of(s.N * s.C)), words(y.size());
    embedding_forward(y.data(), tokens.data(), wte.data(), wpe.data(), s.N, s.T, s.C);
    embedding_forward(words.data(), tokens.data(), wte.data(), nullptr, s.N, s.T, s.C);

    Device device;
    const int* dtokens = device.upload(tokens);
    const float *dwte = device.upload(wte), *dwpe = device.upload(wpe), *ddy = device.upload(dy);
    float *dy_out = device.upload(unwritten(y.size())), *dwords = device.upload(unwritten(y.size()));
    const std::vector<Vec> forward = run_twice(shape, [&] {
      device.poison(dy_out, y.size());
      device.poison(dwords, y.size());
      EXPECT_OK(embedding_forward_cuda(dy_out, dtokens, dwte, dwpe, s.N, s.T, s.C, nullptr));
      EXPECT_OK(embedding_forward_cuda(dwords, dtokens, dwte, nullptr, s.N, s.T, s.C, nullptr));
      return std::vector<Vec>{device.download(dy_out, y.size()), device.download(dwords, y.size())};
    });
    expect_bitwise(shape + " y", forward[0], y);
    expect_bitwise(shape + " without positions", forward[1], words);
    check_backward(  // tolerance 0: bitwise (a NaN would fail too)
        shape + " backward", base, Tolerance{0, 0},
        [&](const std::vector<float*>& g) { embedding_backward(g[0], g[1], dy.data(), tokens.data(), s.N, s.T, s.C); },
        [&](const std::vector<float*>& g) {
          return embedding_backward_cuda(g[0], g[1], ddy, dtokens, s.N, s.T, s.C, nullptr);
        });
  }
}

TEST(TransformerCuda, VocabParallelEmbeddingMatchesTheReferenceBitwise) {
  SKIP_WITHOUT_GPU();
  const int N = 301, T = 7, C = 129, V = 50, V0 = 20, whole = 97;  // this rank: rows [20, 70)
  std::mt19937 rng(23);
  const Vec wte = random_vec(size_of(V * C), rng), wpe = random_vec(size_of(T * C), rng),
            dy = random_vec(size_of(N * C), rng), dwte0 = random_vec(wte.size(), rng), dwpe0 = random_vec(wpe.size(), rng);
  std::vector<int> tokens(size_of(N));
  for (int& t : tokens) t = static_cast<int>(rng() % whole);
  for (const bool positions : {true, false}) {
    const std::string what = positions ? "with positions" : "without positions";
    Vec y(size_of(N * C)), dwte = dwte0, dwpe = dwpe0;
    vocab_embedding_forward(y.data(), tokens.data(), wte.data(), V0, V, positions ? wpe.data() : nullptr, N, T, C);
    vocab_embedding_backward(dwte.data(), positions ? dwpe.data() : nullptr, dy.data(), tokens.data(), V0, V, N, T, C);
    Device device;
    const int* d_tokens = device.upload(tokens);
    const float *d_wte = device.upload(wte), *d_wpe = device.upload(wpe), *d_dy = device.upload(dy);
    float* d_y = device.upload(unwritten(y.size()));
    float *d_dwte = device.upload(dwte0), *d_dwpe = device.upload(dwpe0);
    EXPECT_OK(vocab_embedding_forward_cuda(d_y, d_tokens, d_wte, V0, V, positions ? d_wpe : nullptr, N, T, C, nullptr));
    EXPECT_OK(vocab_embedding_backward_cuda(d_dwte, positions ? d_dwpe : nullptr, d_dy, d_tokens, V0, V, N, T, C,
                                            nullptr));
    expect_bitwise(what + " y", device.download(d_y, y.size()), y);
    expect_bitwise(what + " dwte", device.download(d_dwte, dwte.size()), dwte);
    expect_bitwise(what + " dwpe", device.download(d_dwpe, dwpe.size()), dwpe);
  }
}

TEST(TransformerCuda, VocabParallelLossMatchesTheReference) {
  SKIP_WITHOUT_GPU();
  const int N = 37, V = 1031, V0 = 500;  // targets below, inside and above this rank's rows
  std::mt19937 rng(24);
  const Vec logits = random_vec(size_of(N * V), rng, -6, 6);
  std::vector<int> targets(size_of(N));
  for (int& t : targets) t = static_cast<int>(rng() % 2500);
  Vec row_max(size_of(N)), sums(size_of(2 * N)), dlogits(logits.size());
  std::vector<double> losses(size_of(N));
  logits_row_max(row_max.data(), logits.data(), N, V);
  logits_exp_sums(sums.data(), logits.data(), row_max.data(), targets.data(), V0, N, V);
  vocab_crossentropy_backward(dlogits.data(), losses.data(), logits.data(), row_max.data(), sums.data(),
                              targets.data(), V0, 0.125f, N, V);
  Device device;
  const float* d_logits = device.upload(logits);
  const int* d_targets = device.upload(targets);
  // Each step from the reference's inputs, so that each is compared alone.
  const float *d_max = device.upload(row_max), *d_sums = device.upload(sums);
  float *got_max = device.upload(unwritten(row_max.size())), *got_sums = device.upload(unwritten(sums.size()));
  float* got_dlogits = device.upload(unwritten(dlogits.size()));
  double* got_losses = device.upload(std::vector<double>(losses.size(), 0.0));
  EXPECT_OK(logits_row_max_cuda(got_max, d_logits, N, V, nullptr));
  EXPECT_OK(logits_exp_sums_cuda(got_sums, d_logits, d_max, d_targets, V0, N, V, nullptr));
  EXPECT_OK(vocab_crossentropy_backward_cuda(got_dlogits, got_losses, d_logits, d_max, d_sums, d_targets, V0, 0.125f,
                                             N, V, nullptr));
  expect_bitwise("row max", device.download(got_max, row_max.size()), row_max);
  expect_close("sums", device.download(got_sums, sums.size()), sums, kReduction);
  expect_close("dlogits", device.download(got_dlogits, dlogits.size()), dlogits, kReduction);
  const std::vector<double> got = device.download(got_losses, losses.size());
  for (std::size_t n = 0; n < losses.size(); ++n) EXPECT_NEAR(got[n], losses[n], 1e-9 * std::fabs(losses[n]) + 1e-12);
}

TEST(TransformerCuda, AdamWMatchesTheReference) {
  SKIP_WITHOUT_GPU();
  const long n = 100003;
  std::mt19937 rng(21);
  Vec p = random_vec(size_of(n), rng), m(size_of(n), 0.0f), v(size_of(n), 0.0f);
  std::vector<Vec> grads;
  for (int step = 0; step < 3; ++step) grads.push_back(random_vec(size_of(n), rng));
  grads[0][0] = 1e-9f;  // a gradient near eps
  const std::vector<Vec> got = run_twice("adamw", [&] {
    Device device;
    float *dp = device.upload(p), *dm = device.upload(m), *dv = device.upload(v);
    std::vector<Vec> out;
    for (int step = 1; step <= 3; ++step) {
      EXPECT_OK(adamw_update_cuda(dp, device.upload(grads[size_of(step - 1)]), dm, dv, n, 1e-3f, 0.9f, 0.95f, 1e-8f,
                                  0.1f, step, nullptr));
      out.push_back(device.download(dp, size_of(n)));
      out.push_back(device.download(dm, size_of(n)));
      out.push_back(device.download(dv, size_of(n)));
    }
    return out;
  });
  for (int step = 1; step <= 3; ++step) {
    adamw_update(p.data(), grads[size_of(step - 1)].data(), m.data(), v.data(), n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f,
                 step);
    const std::string what = "adamw step " + std::to_string(step);
    expect_close(what + " p", got[size_of(3 * (step - 1))], p, kAdamw);
    expect_close(what + " m", got[size_of(3 * (step - 1) + 1)], m, kAdamw);
    expect_close(what + " v", got[size_of(3 * (step - 1) + 2)], v, kAdamw);
  }
}

// ---------------------------------------------------------------------------------------------
// Casts and linear layers

TEST(TransformerCuda, CastsMatchTheReferenceBitwise) {
  SKIP_WITHOUT_GPU();
  // Special values, ties and the edges of both formats, then random floats of every magnitude.
  Vec in = {0.0f, -0.0f, 1.0f, -2.0f, 0.1f, 1.0f / 3, 1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, 65504.0f, 65519.0f,
            65520.0f, 1e10f, 0x1p-14f, 0x1p-24f, 0x1p-25f, 0x1.8p-24f, 0x1.ffcp-15f, 1e-40f,
            std::numeric_limits<float>::max(), std::numeric_limits<float>::denorm_min(),
            std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
            std::numeric_limits<float>::quiet_NaN()};
  std::mt19937 rng(23);
  std::uniform_int_distribution<std::uint32_t> bits;
  while (in.size() < 100000) {
    const std::uint32_t u = bits(rng);
    float x;
    std::memcpy(&x, &u, sizeof x);
    in.push_back(x);
  }
  std::vector<std::uint16_t> all(65536);
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = static_cast<std::uint16_t>(i);
  const long n = static_cast<long>(in.size()), n16 = static_cast<long>(all.size());

  Device device;
  const float* din = device.upload(in);
  const std::uint16_t* dall = device.upload(all);
  std::uint16_t *dbf = device.upload(std::vector<std::uint16_t>(in.size())),
                *dhf = device.upload(std::vector<std::uint16_t>(in.size()));
  float *dbf_back = device.upload(Vec(all.size())), *dhf_back = device.upload(Vec(all.size()));
  EXPECT_OK(cast_fp32_to_bf16_cuda(dbf, din, n, nullptr));
  EXPECT_OK(cast_fp32_to_fp16_cuda(dhf, din, n, nullptr));
  EXPECT_OK(cast_bf16_to_fp32_cuda(dbf_back, dall, n16, nullptr));
  EXPECT_OK(cast_fp16_to_fp32_cuda(dhf_back, dall, n16, nullptr));
  const std::vector<std::uint16_t> bf = device.download(dbf, in.size()), hf = device.download(dhf, in.size());
  const Vec bf_back = device.download(dbf_back, all.size()), hf_back = device.download(dhf_back, all.size());
  for (std::size_t i = 0; i < in.size(); ++i) {
    if (std::isnan(in[i])) {  // a NaN stays a NaN; its payload is the implementation's
      EXPECT_TRUE(std::isnan(bf16_to_float(bf[i]))) << i;
      EXPECT_TRUE(std::isnan(fp16_to_float(hf[i]))) << i;
      continue;
    }
    ASSERT_EQ(bf[i], float_to_bf16(in[i])) << "to bf16 of " << in[i];
    ASSERT_EQ(hf[i], float_to_fp16(in[i])) << "to fp16 of " << in[i];
  }
  for (std::size_t i = 0; i < all.size(); ++i) {
    const float b = bf16_to_float(all[i]), f = fp16_to_float(all[i]);
    if (std::isnan(b)) {
      EXPECT_TRUE(std::isnan(bf_back[i])) << i;
    } else {
      ASSERT_EQ(std::memcmp(&bf_back[i], &b, sizeof b), 0) << "from bf16 " << i;
    }
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(hf_back[i])) << i;
    } else {
      ASSERT_EQ(std::memcmp(&hf_back[i], &f, sizeof f), 0) << "from fp16 " << i;
    }
  }
}

TEST(TransformerCuda, LinearMatchesTheReference) {
  SKIP_WITHOUT_GPU();
  for (const auto& [N, C, OC] : {std::tuple{5, 7, 3}, std::tuple{33, 65, 17}, std::tuple{300, 769, 130}}) {
    const std::string shape = "linear N=" + std::to_string(N) + " C=" + std::to_string(C) + " OC=" + std::to_string(OC);
    std::mt19937 rng(1);
    const Vec x = random_vec(size_of(N * C), rng), w = random_vec(size_of(OC * C), rng), b = random_vec(size_of(OC), rng),
              dy = random_vec(size_of(N * OC), rng);
    const std::vector<Vec> base_input = {random_vec(x.size(), rng)};
    const std::vector<Vec> base_weight = {random_vec(w.size(), rng), random_vec(b.size(), rng)};
    Vec y(size_of(N * OC)), y_nobias(y.size());
    linear_forward(y.data(), x.data(), w.data(), b.data(), N, C, OC);
    linear_forward(y_nobias.data(), x.data(), w.data(), nullptr, N, C, OC);

    Device device;
    const float *dx = device.upload(x), *dw = device.upload(w), *db = device.upload(b), *ddy = device.upload(dy);
    float *dy_out = device.upload(unwritten(y.size())), *dy_nobias = device.upload(unwritten(y.size()));
    const Status built = linear_forward_cuda(dy_out, dx, dw, db, N, C, OC, nullptr);
    if (built == Status::not_built) GTEST_SKIP() << "this build has no cuBLAS: the CUDA linear layers are not built";
    const std::vector<Vec> forward = run_twice(shape, [&] {
      device.poison(dy_out, y.size());
      device.poison(dy_nobias, y.size());
      EXPECT_OK(linear_forward_cuda(dy_out, dx, dw, db, N, C, OC, nullptr));
      EXPECT_OK(linear_forward_cuda(dy_nobias, dx, dw, nullptr, N, C, OC, nullptr));
      return std::vector<Vec>{device.download(dy_out, y.size()), device.download(dy_nobias, y.size())};
    });
    expect_close(shape + " y", forward[0], y, kReduction);
    expect_close(shape + " y without bias", forward[1], y_nobias, kReduction);
    check_backward(
        shape + " backward input", base_input, kReduction,
        [&](const std::vector<float*>& g) { linear_backward_input(g[0], dy.data(), w.data(), N, C, OC); },
        [&](const std::vector<float*>& g) { return linear_backward_input_cuda(g[0], ddy, dw, N, C, OC, nullptr); });
    check_backward(
        shape + " backward weight", base_weight, kReduction,
        [&](const std::vector<float*>& g) { linear_backward_weight(g[0], g[1], dy.data(), x.data(), N, C, OC); },
        [&](const std::vector<float*>& g) {
          return linear_backward_weight_cuda(g[0], g[1], ddy, dx, N, C, OC, nullptr);
        });
  }
}

// 16-bit GEMM operands: the reference on operands rounded the same way (a 16-bit product is
// exact in fp32, so only the summation order differs), for bf16 and fp16. No size here but 40
// is a multiple of 8: the operands are padded with zeros in scratch, and the results computed
// there in blocks of at most 64 MiB: y [4100, 4097] in two (with a bias and without: a GEMM
// that adds onto y and one that does not read it), dw [8193, 2049] in two (B transposed).
TEST(TransformerCuda, LinearWithSixteenBitInputsMatchesTheReferenceOnRoundedOperands) {
  SKIP_WITHOUT_GPU();
  for (const GemmInputs inputs : {GemmInputs::bf16, GemmInputs::fp16}) {
    for (const auto& [N, C, OC] : {std::tuple{300, 769, 130}, std::tuple{4100, 40, 4097}, std::tuple{9, 2049, 8193}}) {
      const auto rounded = [&](Vec v) {
        for (float& x : v) {
          x = inputs == GemmInputs::bf16 ? bf16_to_float(float_to_bf16(x)) : fp16_to_float(float_to_fp16(x));
        }
        return v;
      };
      const std::string name = std::string(inputs == GemmInputs::bf16 ? "bf16" : "fp16") + " N=" + std::to_string(N) +
                               " C=" + std::to_string(C) + " OC=" + std::to_string(OC);
      std::mt19937 rng(26);
      const Vec x = random_vec(size_of(N * C), rng), w = random_vec(size_of(OC * C), rng),
                b = random_vec(size_of(OC), rng), dy = random_vec(size_of(N * OC), rng),
                dx0 = random_vec(x.size(), rng), dw0 = random_vec(w.size(), rng), db0 = random_vec(b.size(), rng);
      const Vec xr = rounded(x), wr = rounded(w), dyr = rounded(dy);
      Vec y(size_of(N * OC)), y_nobias(y.size()), dx = dx0, dw = dw0, db = db0;
      linear_forward(y.data(), xr.data(), wr.data(), b.data(), N, C, OC);
      linear_forward(y_nobias.data(), xr.data(), wr.data(), nullptr, N, C, OC);
      linear_backward_input(dx.data(), dyr.data(), wr.data(), N, C, OC);
      linear_backward_weight(dw.data(), nullptr, dyr.data(), xr.data(), N, C, OC);
      linear_backward_weight(nullptr, db.data(), dy.data(), nullptr, N, C, OC);  // the bias's gradient stays fp32

      Device device;
      const float *d_x = device.upload(x), *d_w = device.upload(w), *d_b = device.upload(b), *d_dy = device.upload(dy);
      float *d_y = device.upload(unwritten(y.size())), *d_y_nobias = device.upload(unwritten(y.size())),
            *d_dx = device.upload(dx0), *d_dw = device.upload(dw0), *d_db = device.upload(db0);
      const Status built = linear_forward_cuda(d_y, d_x, d_w, d_b, N, C, OC, nullptr, inputs);
      if (built == Status::not_built) GTEST_SKIP() << "this build has no cuBLAS: the CUDA linear layers are not built";
      EXPECT_OK(built);
      EXPECT_OK(linear_forward_cuda(d_y_nobias, d_x, d_w, nullptr, N, C, OC, nullptr, inputs));
      EXPECT_OK(linear_backward_input_cuda(d_dx, d_dy, d_w, N, C, OC, nullptr, inputs));
      EXPECT_OK(linear_backward_weight_cuda(d_dw, d_db, d_dy, d_x, N, C, OC, nullptr, inputs));
      expect_close(name + " y", device.download(d_y, y.size()), y, kReduction);
      expect_close(name + " y without a bias", device.download(d_y_nobias, y.size()), y_nobias, kReduction);
      expect_close(name + " dx", device.download(d_dx, dx.size()), dx, kReduction);
      expect_close(name + " dw", device.download(d_dw, dw.size()), dw, kReduction);
      expect_close(name + " db", device.download(d_db, db.size()), db, kReduction);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Without a GPU (and with one, the argument checks)

// ---------------------------------------------------------------------------------------------
// Mixture of experts

TEST(TransformerCuda, MoeRouterMatchesTheReference) {
  SKIP_WITHOUT_GPU();
  // 300 rows cross the 256-thread blocks; 64 experts, top 6, as the larger released configs.
  for (const auto& [N, E, K] : {std::tuple{7, 5, 2}, std::tuple{300, 64, 6}}) {
    for (const int normalize : {0, 1}) {
      const std::string shape = "router N=" + std::to_string(N) + " E=" + std::to_string(E) + " K=" +
                                std::to_string(K) + (normalize ? " normalised" : "");
      std::mt19937 rng(21);
      const Vec z = random_vec(size_of(N * E), rng, -3, 3), dweights = random_vec(size_of(N * K), rng),
                aux = random_vec(size_of(E), rng);
      Vec probs(z.size()), weights(size_of(N * K));
      std::vector<int> experts(weights.size());
      moe_router_forward(probs.data(), weights.data(), experts.data(), z.data(), N, E, K, normalize);
      Device device;
      const float *dz = device.upload(z), *ddw = device.upload(dweights), *daux = device.upload(aux);
      float *dprobs = device.upload(unwritten(probs.size())), *dweights_out = device.upload(unwritten(weights.size()));
      int* dexperts = device.upload(std::vector<int>(experts.size(), -1));
      std::vector<int> chosen;
      const std::vector<Vec> forward = run_twice(shape, [&] {
        device.poison(dprobs, probs.size());
        device.poison(dweights_out, weights.size());
        EXPECT_OK(moe_router_forward_cuda(dprobs, dweights_out, dexperts, dz, N, E, K, normalize, nullptr));
        chosen = device.download(dexperts, experts.size());
        return std::vector<Vec>{device.download(dprobs, probs.size()), device.download(dweights_out, weights.size())};
      });
      expect_close(shape + " probs", forward[0], probs, kReduction);
      expect_close(shape + " weights", forward[1], weights, kReduction);
      EXPECT_EQ(chosen, experts) << shape;  // random logits: no near-ties to round apart
      // The backward from the reference's forward, so both start from the same choice.
      const float *dp = device.upload(probs), *dw = device.upload(weights);
      const int* de = device.upload(experts);
      check_backward(
          shape + " backward", {random_vec(z.size(), rng)}, kReduction,
          [&](const std::vector<float*>& g) {
            moe_router_backward(g[0], dweights.data(), aux.data(), probs.data(), weights.data(), experts.data(), N, E,
                                K, normalize);
          },
          [&](const std::vector<float*>& g) {
            return moe_router_backward_cuda(g[0], ddw, daux, dp, dw, de, N, E, K, normalize, nullptr);
          });
    }
  }
}

TEST(TransformerCuda, MoeSigmoidRouterMatchesTheReference) {
  SKIP_WITHOUT_GPU();
  // DeepSeek-V3's shape (256 experts in 8 groups, 4 kept, top 8) and a small odd one.
  for (const auto& [N, E, K, groups, kept] : {std::tuple{7, 6, 2, 3, 2}, std::tuple{300, 256, 8, 8, 4}}) {
    for (const int normalize : {0, 1}) {
      const std::string shape = "sigmoid router N=" + std::to_string(N) + " E=" + std::to_string(E) + " K=" +
                                std::to_string(K) + " groups " + std::to_string(kept) + "/" + std::to_string(groups) +
                                (normalize ? " normalised" : "");
      std::mt19937 rng(23);
      const Vec z = random_vec(size_of(N * E), rng, -3, 3), bias = random_vec(size_of(E), rng, -0.1f, 0.1f),
                dweights = random_vec(size_of(N * K), rng), aux = random_vec(size_of(E), rng);
      Vec scores(z.size()), weights(size_of(N * K));
      std::vector<int> experts(weights.size());
      moe_sigmoid_router_forward(scores.data(), weights.data(), experts.data(), z.data(), bias.data(), N, E, K, groups,
                                 kept, normalize, 2.5f);
      Device device;
      const float *dz = device.upload(z), *dbias = device.upload(bias), *ddw = device.upload(dweights),
                  *daux = device.upload(aux);
      float *dscores = device.upload(unwritten(scores.size())), *dweights_out = device.upload(unwritten(weights.size()));
      int* dexperts = device.upload(std::vector<int>(experts.size(), -1));
      std::vector<int> chosen;
      const std::vector<Vec> forward = run_twice(shape, [&] {
        device.poison(dscores, scores.size());
        device.poison(dweights_out, weights.size());
        EXPECT_OK(moe_sigmoid_router_forward_cuda(dscores, dweights_out, dexperts, dz, dbias, N, E, K, groups, kept,
                                                  normalize, 2.5f, nullptr));
        chosen = device.download(dexperts, experts.size());
        return std::vector<Vec>{device.download(dscores, scores.size()), device.download(dweights_out, weights.size())};
      });
      expect_close(shape + " scores", forward[0], scores, kReduction);
      expect_close(shape + " weights", forward[1], weights, kReduction);
      EXPECT_EQ(chosen, experts) << shape;  // random logits: no near-ties to round apart
      const float* ds = device.upload(scores);
      const int* de = device.upload(experts);
      check_backward(
          shape + " backward", {random_vec(z.size(), rng)}, kReduction,
          [&](const std::vector<float*>& g) {
            moe_sigmoid_router_backward(g[0], dweights.data(), aux.data(), scores.data(), experts.data(), N, E, K,
                                        normalize, 2.5f);
          },
          [&](const std::vector<float*>& g) {
            return moe_sigmoid_router_backward_cuda(g[0], ddw, daux, ds, de, N, E, K, normalize, 2.5f, nullptr);
          });
    }
  }
}

TEST(TransformerCuda, MoePermuteAndCombineMatchTheReference) {
  SKIP_WITHOUT_GPU();
  for (const auto& [N, K, C] : {std::tuple{5, 2, 7}, std::tuple{300, 4, 257}}) {
    const std::string shape = "permute N=" + std::to_string(N) + " K=" + std::to_string(K) + " C=" + std::to_string(C);
    const int M = N * K;
    std::mt19937 rng(22);
    std::vector<int> slots(size_of(M)), rows(size_of(M));
    std::iota(slots.begin(), slots.end(), 0);
    std::shuffle(slots.begin(), slots.end(), rng);
    for (int i = 0; i < M; ++i) rows[size_of(slots[size_of(i)])] = i / K;
    slots[1] = -1;  // a dropped copy
    const Vec x = random_vec(size_of(N * C), rng), xm = random_vec(size_of(M * C), rng),
              weights = random_vec(size_of(M), rng), dy = random_vec(size_of(N * C), rng);
    Vec y(size_of(M * C)), combined(size_of(N * C));
    moe_permute(y.data(), x.data(), rows.data(), M, C);
    moe_combine(combined.data(), xm.data(), slots.data(), weights.data(), N, K, C);
    Device device;
    const int *drows = device.upload(rows), *dslots = device.upload(slots);
    const float *dx = device.upload(x), *dxm = device.upload(xm), *dw = device.upload(weights), *ddy = device.upload(dy);
    float *dy_out = device.upload(unwritten(y.size())), *dc = device.upload(unwritten(combined.size()));
    const std::vector<Vec> forward = run_twice(shape, [&] {
      device.poison(dy_out, y.size());
      device.poison(dc, combined.size());
      EXPECT_OK(moe_permute_cuda(dy_out, dx, drows, M, C, nullptr));
      EXPECT_OK(moe_combine_cuda(dc, dxm, dslots, dw, N, K, C, nullptr));
      return std::vector<Vec>{device.download(dy_out, y.size()), device.download(dc, combined.size())};
    });
    expect_bitwise(shape + " permuted", forward[0], y);
    expect_close(shape + " combined", forward[1], combined, kReduction);
    const Vec dperm = random_vec(size_of(M * C), rng);
    const float* ddperm = device.upload(dperm);
    check_backward(
        shape + " permute backward", {random_vec(x.size(), rng)}, Tolerance{0, 0},
        [&](const std::vector<float*>& g) { moe_permute_backward(g[0], dperm.data(), slots.data(), N, K, C); },
        [&](const std::vector<float*>& g) { return moe_permute_backward_cuda(g[0], ddperm, dslots, N, K, C, nullptr); });
    check_backward(
        shape + " combine backward", {random_vec(xm.size(), rng), random_vec(weights.size(), rng)}, kReduction,
        [&](const std::vector<float*>& g) {
          moe_combine_backward(g[0], g[1], dy.data(), xm.data(), slots.data(), weights.data(), N, K, C);
        },
        [&](const std::vector<float*>& g) {
          return moe_combine_backward_cuda(g[0], g[1], ddy, dxm, dslots, dw, N, K, C, nullptr);
        });
  }
}

TEST(TransformerCuda, MoeGatedAddMatchesTheReference) {
  SKIP_WITHOUT_GPU();
  for (const auto& [N, C] : {std::tuple{3, 5}, std::tuple{300, 769}}) {
    const std::string shape = "gated add N=" + std::to_string(N) + " C=" + std::to_string(C);
    std::mt19937 rng(23);
    const Vec x = random_vec(size_of(N * C), rng), gate = random_vec(size_of(N), rng, -4, 4),
              base = random_vec(x.size(), rng), dy = random_vec(x.size(), rng);
    Vec y = base;
    gated_add(y.data(), x.data(), gate.data(), N, C);
    Device device;
    const float *dx = device.upload(x), *dgate = device.upload(gate), *ddy = device.upload(dy);
    const std::vector<Vec> forward = run_twice(shape, [&] {
      Device fresh;
      float* out = fresh.upload(base);
      EXPECT_OK(gated_add_cuda(out, dx, dgate, N, C, nullptr));
      return std::vector<Vec>{fresh.download(out, base.size())};
    });
    expect_close(shape + " y", forward[0], y, kPointwise);
    check_backward(
        shape + " backward", {random_vec(x.size(), rng), random_vec(gate.size(), rng)}, kReduction,
        [&](const std::vector<float*>& g) { gated_add_backward(g[0], g[1], dy.data(), x.data(), gate.data(), N, C); },
        [&](const std::vector<float*>& g) { return gated_add_backward_cuda(g[0], g[1], ddy, dx, dgate, N, C, nullptr); });
  }
}

TEST(TransformerCuda, EntryPointsSayWhyTheyCannotRun) {
  // Host memory stands in for device pointers: every call below returns before touching it.
  float f[4] = {};
  int tok[4] = {};
  std::uint16_t h[4] = {};
  void* nothing = nullptr;

  // Refused before anything else, in every build: negative sizes, missing inputs, bad shapes.
  EXPECT_EQ(layernorm_forward_cuda(f, f, f, f, f, f, -1, 4, 1e-5f, nullptr), Status::invalid_value);
  EXPECT_EQ(layernorm_forward_cuda(f, f, f, nullptr, f, f, 1, 4, 1e-5f, nullptr), Status::invalid_value);
  EXPECT_EQ(layernorm_backward_cuda(f, nullptr, nullptr, nullptr, f, f, f, f, 1, 4, nullptr), Status::invalid_value);
  EXPECT_EQ(rmsnorm_forward_cuda(f, f, f, f, 1, 0, 1e-5f, nullptr), Status::invalid_value);
  EXPECT_EQ(gelu_forward_cuda(f, f, -1, nullptr), Status::invalid_value);
  EXPECT_EQ(residual_add_cuda(f, nullptr, 4, nullptr), Status::invalid_value);
  EXPECT_EQ(sum_of_squares_cuda(nullptr, f, 4, nullptr), Status::invalid_value);
  EXPECT_EQ(scale_cuda(nullptr, 2.0f, 4, nullptr), Status::invalid_value);
  EXPECT_EQ(vocab_embedding_forward_cuda(f, tok, f, 0, 0, f, 1, 1, 4, nullptr), Status::invalid_value);  // no rows
  EXPECT_EQ(logits_row_max_cuda(f, nullptr, 1, 4, nullptr), Status::invalid_value);
  EXPECT_EQ(vocab_crossentropy_backward_cuda(f, nullptr, f, f, f, tok, 0, 1.0f, 1, 4, nullptr), Status::invalid_value);
  EXPECT_EQ(bias_add_cuda(f, f, -1, 4, nullptr), Status::invalid_value);
  EXPECT_EQ(cuda_copy_on_stream(f, nullptr, 4, nullptr), Status::invalid_value);
  EXPECT_EQ(swiglu_backward_cuda(f, f, f, nullptr, f, 4, nullptr), Status::invalid_value);
  EXPECT_EQ(rope_forward_cuda(f, 1, 1, 1, 3, RopeFrequencies{10000}, nullptr), Status::invalid_value);  // odd head_dim
  EXPECT_EQ(rope_forward_cuda(f, 1, 0, 1, 4, RopeFrequencies{10000}, nullptr), Status::invalid_value);  // no positions
  EXPECT_EQ(rope_forward_cuda(f, 1, 1, 1, 4, RopeFrequencies{-1}, nullptr), Status::invalid_value);  // no frequencies
  for (const int rotary_dims : {-2, 3, 6}) {  // a partial rotary of a negative, odd or too large size
    RopeFrequencies partial{10000};
    partial.rotary_dims = rotary_dims;
    EXPECT_EQ(rope_forward_cuda(f, 1, 1, 1, 4, partial, nullptr), Status::invalid_value) << rotary_dims;
    EXPECT_EQ(rope_backward_cuda(f, 1, 1, 1, 4, partial, nullptr), Status::invalid_value) << rotary_dims;
  }
  EXPECT_EQ(rope_forward_cuda(f, 1, 1, 1, 4, RopeFrequencies{10000, RopeFrequencies::Scaling::llama3, 8, 4, 1, 8192},
                              nullptr),
            Status::invalid_value);  // llama3's bands out of order
  EXPECT_EQ(attention_forward_cuda(f, f, f, f, f, 1, 1, 3, 2, 1, 0, nullptr), Status::invalid_value);  // 3 % 2 heads
  EXPECT_EQ(attention_forward_cuda(f, f, f, f, f, 1, 1, 1, 1, 2048, 0, nullptr), Status::invalid_value);  // HS too large
  EXPECT_EQ(attention_forward_cuda(f, f, f, f, f, 1, 1, 1, 1, 4, -1, nullptr), Status::invalid_value);  // window < 0
  EXPECT_EQ(crossentropy_forward_cuda(f, f, nullptr, 1, 4, nullptr), Status::invalid_value);
  EXPECT_EQ(embedding_forward_cuda(f, nullptr, f, f, 1, 1, 4, nullptr), Status::invalid_value);
  EXPECT_EQ(adamw_update_cuda(f, f, f, f, 4, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.0f, 0, nullptr), Status::invalid_value);
  EXPECT_EQ(cast_fp32_to_bf16_cuda(nullptr, f, 4, nullptr), Status::invalid_value);
  EXPECT_EQ(linear_forward_cuda(f, f, nullptr, f, 1, 4, 1, nullptr), Status::invalid_value);
  EXPECT_EQ(cuda_malloc(nullptr, 4), Status::invalid_value);
  bool ordered = true;
  EXPECT_EQ(cuda_malloc_on_stream(nullptr, 4, nullptr, &ordered), Status::invalid_value);
  EXPECT_EQ(cuda_malloc_on_stream(&nothing, 4, nullptr, nullptr), Status::invalid_value);
  EXPECT_EQ(cuda_copy_to_device(nullptr, f, 4), Status::invalid_value);

  // Nothing to do is done, without a device: empty sizes, or no gradient wanted.
  EXPECT_EQ(layernorm_forward_cuda(f, f, f, f, f, f, 0, 4, 1e-5f, nullptr), Status::success);
  EXPECT_EQ(layernorm_backward_cuda(nullptr, nullptr, nullptr, f, f, f, f, f, 1, 4, nullptr), Status::success);
  EXPECT_EQ(attention_backward_cuda(nullptr, nullptr, nullptr, f, f, f, f, f, 1, 1, 1, 1, 4, 0, nullptr),
            Status::success);
  EXPECT_EQ(rope_backward_cuda(nullptr, 1, 1, 1, 4, RopeFrequencies{10000}, nullptr), Status::success);
  EXPECT_EQ(gelu_forward_cuda(f, f, 0, nullptr), Status::success);
  EXPECT_EQ(residual_add_cuda(f, f, 0, nullptr), Status::success);
  EXPECT_EQ(vocab_embedding_backward_cuda(nullptr, nullptr, f, tok, 0, 4, 1, 1, 4, nullptr), Status::success);
  EXPECT_EQ(logits_exp_sums_cuda(f, f, f, tok, 0, 0, 4, nullptr), Status::success);
  EXPECT_EQ(bias_add_cuda(f, f, 4, 0, nullptr), Status::success);
  EXPECT_EQ(cuda_copy_on_stream(f, f, 0, nullptr), Status::success);
  EXPECT_EQ(embedding_backward_cuda(nullptr, nullptr, f, tok, 1, 1, 4, nullptr), Status::success);
  EXPECT_EQ(cuda_malloc(&nothing, 0), Status::success);
  EXPECT_EQ(nothing, nullptr);
  EXPECT_EQ(cuda_free(nullptr), Status::success);
  EXPECT_EQ(cuda_free_on_stream(nullptr, nullptr), Status::success);
  EXPECT_EQ(cuda_malloc_on_stream(&nothing, 0, nullptr, &ordered), Status::success);
  EXPECT_EQ(nothing, nullptr);

  if (cuda_built() && cuda_device_count() > 0) {
    GTEST_SKIP() << "a GPU is visible (" << cuda_status() << "): the no-device answers are not checkable here";
  }
  // Well-formed calls: not_built without CUDA, no_device without a GPU; never a crash.
  const Status want = cuda_built() ? Status::no_device : Status::not_built;
  DeviceBuffer buffer;
  EXPECT_EQ(buffer.allocate(16), want);
  EXPECT_EQ(buffer.get(), nullptr);
  EXPECT_EQ(cuda_malloc(&nothing, 16), want);
  EXPECT_EQ(nothing, nullptr);
  EXPECT_EQ(cuda_free(f), want);
  EXPECT_EQ(cuda_malloc_on_stream(&nothing, 16, nullptr, &ordered), want);
  EXPECT_EQ(nothing, nullptr);
  EXPECT_EQ(cuda_free_on_stream(f, nullptr), want);
  EXPECT_EQ(cuda_copy_to_device(f, f, 16), want);
  EXPECT_EQ(cuda_copy_to_host(f, f, 16), want);
  EXPECT_EQ(cuda_memset_zero(f, 16, nullptr), want);
  EXPECT_EQ(cuda_copy_on_stream(f, f, 16, nullptr), want);
  EXPECT_EQ(cuda_copy_to_device_on_stream(f, f, 16, nullptr), want);
  EXPECT_EQ(cuda_copy_to_host_on_stream(f, f, 16, nullptr), want);
  EXPECT_EQ(residual_add_cuda(f, f, 4, nullptr), want);
  EXPECT_EQ(bias_add_cuda(f, f, 2, 2, nullptr), want);
  EXPECT_EQ(scale_cuda(f, 2.0f, 4, nullptr), want);
  EXPECT_EQ(vocab_embedding_forward_cuda(f, tok, f, 0, 4, f, 1, 1, 4, nullptr), want);
  EXPECT_EQ(vocab_embedding_backward_cuda(f, f, f, tok, 0, 4, 1, 1, 4, nullptr), want);
  EXPECT_EQ(logits_row_max_cuda(f, f, 1, 4, nullptr), want);
  EXPECT_EQ(logits_exp_sums_cuda(f, f, f, tok, 0, 1, 4, nullptr), want);
  double d[1] = {};
  EXPECT_EQ(vocab_crossentropy_backward_cuda(f, d, f, f, f, tok, 0, 1.0f, 1, 4, nullptr), want);
  EXPECT_EQ(cuda_synchronize(nullptr), want);
  EXPECT_EQ(linear_forward_cuda(f, f, f, f, 1, 2, 2, nullptr), want);
  EXPECT_EQ(linear_backward_input_cuda(f, f, f, 1, 2, 2, nullptr), want);
  EXPECT_EQ(linear_backward_weight_cuda(f, f, f, f, 1, 2, 2, nullptr), want);
  EXPECT_EQ(embedding_forward_cuda(f, tok, f, f, 1, 1, 4, nullptr), want);
  EXPECT_EQ(embedding_backward_cuda(f, f, f, tok, 1, 1, 4, nullptr), want);
  EXPECT_EQ(layernorm_forward_cuda(f, f, f, f, f, f, 1, 4, 1e-5f, nullptr), want);
  EXPECT_EQ(layernorm_backward_cuda(f, f, f, f, f, f, f, f, 1, 4, nullptr), want);
  EXPECT_EQ(rmsnorm_forward_cuda(f, f, f, f, 1, 4, 1e-5f, nullptr), want);
  EXPECT_EQ(rmsnorm_backward_cuda(f, f, f, f, f, f, 1, 4, nullptr), want);
  EXPECT_EQ(gelu_forward_cuda(f, f, 4, nullptr), want);
  EXPECT_EQ(gelu_backward_cuda(f, f, f, 4, nullptr), want);
  EXPECT_EQ(swiglu_forward_cuda(f, f, f, 4, nullptr), want);
  EXPECT_EQ(swiglu_backward_cuda(f, f, f, f, f, 4, nullptr), want);
  EXPECT_EQ(rope_forward_cuda(f, 1, 1, 1, 4, RopeFrequencies{10000}, nullptr), want);
  EXPECT_EQ(rope_backward_cuda(f, 1, 1, 1, 4, RopeFrequencies{10000}, nullptr), want);
  EXPECT_EQ(attention_forward_cuda(f, f, f, f, f, 1, 1, 1, 1, 4, 0, nullptr), want);
  EXPECT_EQ(attention_backward_cuda(f, f, f, f, f, f, f, f, 1, 1, 1, 1, 4, 0, nullptr), want);
  EXPECT_EQ(crossentropy_forward_cuda(f, f, tok, 1, 4, nullptr), want);
  EXPECT_EQ(crossentropy_backward_cuda(f, f, tok, 1.0f, 1, 4, nullptr), want);
  EXPECT_EQ(adamw_update_cuda(f, f, f, f, 4, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.0f, 1, nullptr), want);
  EXPECT_EQ(cast_fp32_to_bf16_cuda(h, f, 4, nullptr), want);
  EXPECT_EQ(cast_bf16_to_fp32_cuda(f, h, 4, nullptr), want);
  EXPECT_EQ(cast_fp32_to_fp16_cuda(h, f, 4, nullptr), want);
  EXPECT_EQ(cast_fp16_to_fp32_cuda(f, h, 4, nullptr), want);
  for (const float x : f) EXPECT_EQ(x, 0.0f);  // nothing was written
}

}  // namespace
