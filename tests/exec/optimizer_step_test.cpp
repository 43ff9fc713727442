// The optimizer step against closed forms: torch's clipping factor, Megatron's dynamic loss
// scale through a skipped step, the schedule's rates counted in steps taken, and one AdamW
// step written out by hand.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "exec/backend.hpp"
#include "exec/optimizer_step.hpp"
#include "model/error.hpp"

namespace hetflow {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

TEST(OptimizerStep, ClipsByTorchsFactorOnlyAboveTheLimit) {
  exec::OptimizerOptions o;
  o.clip_grad = 1.0;
  exec::OptimizerStep step(o, 8, 0);
  EXPECT_TRUE(step.needs_norm());
  EXPECT_FLOAT_EQ(step.judge(0, 4.0).clip, static_cast<float>(1.0 / (4.0 + 1e-6)));  // clip_grad_norm_'s
  EXPECT_EQ(step.judge(1, 0.5).clip, 1.0f);
  EXPECT_FALSE(step.judge(2, kInf).skip);  // no loss scaling: nothing is skipped
  o.clip_grad = 0;
  EXPECT_FALSE(exec::OptimizerStep(o, 8, 0).needs_norm());
}

TEST(OptimizerStep, ADynamicScaleSkipsANonFiniteStepAndHalves) {
  exec::OptimizerOptions o;
  o.loss_scale.dynamic = true;
  o.loss_scale.initial_loss_scale = 8;
  o.loss_scale.hysteresis = 1;
  exec::OptimizerStep step(o, 8, 0);
  EXPECT_EQ(step.scale_of(0), 8);
  EXPECT_THROW(step.scale_of(1), PlanError);  // step 0's verdict is not in yet
  EXPECT_TRUE(step.judge(0, kInf).skip);
  EXPECT_TRUE(step.judge(0, kInf).skip);  // a second device of step 0 agrees
  EXPECT_THROW(step.judge(0, 1.0), Error);  // one that disagrees: the norm was not global
  EXPECT_EQ(step.scale_of(1), 4);
  EXPECT_FALSE(step.judge(1, 1.0).skip);
  EXPECT_EQ(step.loss_scale(), 4);
  EXPECT_THROW(step.judge(3, 1.0), Error);  // step 2's optimizer has not run
}

TEST(OptimizerStep, ASkippedStepDoesNotAdvanceTheSchedule) {
  exec::OptimizerOptions o;
  o.lr = 1.0;
  o.lr_decay_style = exec::LrSchedule::Style::linear;
  o.lr_warmup_iters = 0;
  o.lr_decay_iters = 4;
  exec::OptimizerStep step(o, 1, 0);
  const auto rates = step.learning_rates({0, 1, 2, 3}, {1});
  ASSERT_EQ(rates.size(), 4u);
  EXPECT_EQ(rates[0], step.lr(0));
  EXPECT_TRUE(std::isnan(rates[1]));
  EXPECT_EQ(rates[2], step.lr(1));  // the step after a skipped one runs at the rate it would have had
  EXPECT_EQ(rates[3], step.lr(2));
  EXPECT_DOUBLE_EQ(step.lr(0), 1.0);
  EXPECT_DOUBLE_EQ(step.lr(2), 0.5);
}

TEST(OptimizerStep, OneAdamwStepIsTheClosedForm) {
  exec::OptimizerOptions o;
  o.weight_decay = 0.01;
  exec::OptimizerStep step(o, 1, 0);
  float p[2] = {1.0f, 1.0f}, m[2] = {}, v[2] = {};
  const float g[2] = {0.5f, -2.0f};
  step.adamw_host(p, g, m, v, 2, 0.1, true, 1);
  // Step 1: the bias-corrected moments are g and g^2, so the update is lr g / (|g| + eps),
  // after the decoupled decay p (1 - lr wd).
  for (int i = 0; i < 2; ++i) {
    const double want = 1.0 * (1 - 0.1 * 0.01) - 0.1 * g[i] / (std::abs(g[i]) + 1e-8);
    EXPECT_NEAR(p[i], want, 1e-6) << i;
    EXPECT_NEAR(m[i], (1 - 0.9) * g[i], 1e-7);
    EXPECT_NEAR(v[i], (1 - 0.999) * g[i] * g[i], 1e-7);
  }
}

}  // namespace
}  // namespace hetflow
