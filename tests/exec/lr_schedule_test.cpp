// Megatron's learning-rate schedule (OptimizerParamScheduler.get_lr, iteration-based) against
// its closed forms, step by step.
#include "exec/lr_schedule.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "model/error.hpp"

namespace hetflow {
namespace {

using exec::LrSchedule;
using Style = LrSchedule::Style;

TEST(LrSchedule, WarmsUpFromZeroThenDecaysToTheFloor) {
  const LrSchedule cosine{Style::cosine, 1e-3, 1e-4, 10, 110};
  EXPECT_EQ(cosine.at(0), 0.0);  // Megatron's first step under warm-up: --lr-warmup-init 0
  EXPECT_DOUBLE_EQ(cosine.at(5), 5e-4);
  EXPECT_DOUBLE_EQ(cosine.at(10), 1e-3);  // the peak closes the warm-up
  EXPECT_DOUBLE_EQ(cosine.at(60), 1e-4 + 0.5 * 9e-4);  // half way: cos(pi / 2) = 0
  EXPECT_DOUBLE_EQ(cosine.at(35), 1e-4 + 9e-4 * 0.5 * (1 + std::cos(std::numbers::pi * 0.25)));
  EXPECT_DOUBLE_EQ(cosine.at(110), 1e-4);
  EXPECT_DOUBLE_EQ(cosine.at(1000), 1e-4);  // past the decay: the floor
  const LrSchedule linear{Style::linear, 1e-3, 0, 0, 100};
  EXPECT_DOUBLE_EQ(linear.at(0), 1e-3);  // no warm-up: the peak first
  EXPECT_DOUBLE_EQ(linear.at(25), 7.5e-4);
  EXPECT_DOUBLE_EQ(linear.at(100), 0);
  const LrSchedule isqrt{Style::inverse_square_root, 1e-3, 1e-5, 4, 1000};
  EXPECT_DOUBLE_EQ(isqrt.at(4), 1e-3);
  EXPECT_DOUBLE_EQ(isqrt.at(16), 1e-3 * 2 / 4);  // lr sqrt(warmup) / sqrt(n)
  EXPECT_DOUBLE_EQ(isqrt.at(1000000), 1e-5);     // past the decay: the floor
  // Megatron counts it in samples: without warm-up, step n of B samples is at lr / sqrt(n B).
  const LrSchedule isqrt_batches{Style::inverse_square_root, 1e-3, 0, 0, 1000, 4};
  EXPECT_DOUBLE_EQ(isqrt_batches.at(0), 1e-3);
  EXPECT_DOUBLE_EQ(isqrt_batches.at(1), 1e-3 / 2);
  EXPECT_DOUBLE_EQ(isqrt_batches.at(4), 1e-3 / 4);
  const LrSchedule isqrt_warm{Style::inverse_square_root, 1e-3, 0, 4, 1000, 32};
  EXPECT_DOUBLE_EQ(isqrt_warm.at(16), 1e-3 / 2);  // with a warm-up the batch cancels out
  const LrSchedule constant{Style::constant, 3e-4, 0, 0, 0};
  for (long long n : {0LL, 1LL, 1000000LL}) EXPECT_EQ(constant.at(n), 3e-4);
  const LrSchedule warm_constant{Style::constant, 3e-4, 0, 3, 0};
  EXPECT_DOUBLE_EQ(warm_constant.at(1), 1e-4);
  EXPECT_EQ(warm_constant.at(4), 3e-4);
}

TEST(LrSchedule, SettingsThatMakeNoScheduleAreRefusedByOption) {
  const auto field_of = [](const LrSchedule& s) {
    try {
      s.check();
    } catch (const InputError& e) {
      return e.field();
    }
    return std::string("(accepted)");
  };
  EXPECT_EQ(field_of({Style::cosine, 1e-3, 1e-2, 0, 10}), "--min-lr");
  EXPECT_EQ(field_of({Style::cosine, 1e-3, 0, 10, 10}), "--lr-decay-iters");
  EXPECT_EQ(field_of({Style::constant, 1e-3, 0, 10, 10}), "(accepted)");  // no decay to end
  std::string describe = LrSchedule{Style::cosine, 1e-3, 1e-4, 10, 110}.describe();
  EXPECT_EQ(describe, "cosine to 0.0001 by step 110, after 10 of warm-up from 0");
  EXPECT_EQ(LrSchedule({Style::inverse_square_root, 1e-3, 1e-4, 0, 50}).describe(),
            "inverse-square-root, not below 0.0001, then 0.0001 after step 50");
  LrSchedule::Style parsed = Style::constant;
  EXPECT_TRUE(exec::parse_lr_style("inverse-square-root", parsed));
  EXPECT_EQ(parsed, Style::inverse_square_root);
  EXPECT_FALSE(exec::parse_lr_style("cosine-annealing", parsed));
}

}  // namespace
}  // namespace hetflow
