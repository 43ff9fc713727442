// The loss scaler against Megatron's DynamicGradScaler (megatron/core/optimizer/
// grad_scaler.py), step by step: the oracle is its update rule written out by hand.
#include <gtest/gtest.h>

#include <cmath>

#include "exec/loss_scale.hpp"

namespace hetflow {
namespace {

exec::LossScaleOptions dynamic(double initial, int window, int hysteresis, double min = 1) {
  exec::LossScaleOptions o;
  o.dynamic = true;
  o.initial_loss_scale = initial;
  o.loss_scale_window = window;
  o.hysteresis = hysteresis;
  o.min_loss_scale = min;
  return o;
}

TEST(LossScaler, NoneAndConstantNeverMove) {
  exec::LossScaler none;
  exec::LossScaleOptions constant;
  constant.loss_scale = 1024;
  constant.dynamic = true;  // a constant scale wins, as Megatron's --loss-scale does
  exec::LossScaler fixed(constant);
  for (const bool inf : {true, true, true, false}) {
    none.update(inf);
    fixed.update(inf);
  }
  EXPECT_EQ(none.scale(), 1);
  EXPECT_EQ(fixed.scale(), 1024);
}

TEST(LossScaler, HalvesAfterHysteresisOverflowsAndNotBelowTheMinimum) {
  exec::LossScaler s(dynamic(65536, 1000, 2, 16384));
  s.update(true);
  EXPECT_EQ(s.scale(), 65536);  // the first overflow spends the hysteresis
  s.update(true);
  EXPECT_EQ(s.scale(), 32768);
  s.update(true);  // the tracker stays spent: every further overflow halves
  EXPECT_EQ(s.scale(), 16384);
  s.update(true);
  EXPECT_EQ(s.scale(), 16384);  // the minimum
  s.update(false);  // a good step does not restore the hysteresis
  s.update(true);
  EXPECT_EQ(s.scale(), 16384);
}

TEST(LossScaler, DoublesAfterAWindowOfGoodStepsAndResetsTheHysteresis) {
  exec::LossScaler s(dynamic(8, 3, 2));
  s.update(true);  // hysteresis 2 -> 1
  s.update(false);
  s.update(false);
  EXPECT_EQ(s.scale(), 8);
  s.update(false);  // third good step in a row
  EXPECT_EQ(s.scale(), 16);
  s.update(true);  // hysteresis reset to 2: one overflow does not halve
  EXPECT_EQ(s.scale(), 16);
  s.update(false);
  s.update(false);
  s.update(true);  // an overflow resets the growth count (2 good steps, not 3)
  EXPECT_EQ(s.scale(), 8);  // the second overflow since the reset
}

TEST(LossScaler, StopsGrowingWhereOneOverTheScaleIsStillANormalFloat) {
  exec::LossScaler s(dynamic(std::ldexp(1.0, 125), 1, 2));
  s.update(false);
  EXPECT_EQ(s.scale(), std::ldexp(1.0, 126));
  s.update(false);
  EXPECT_EQ(s.scale(), exec::kMaxLossScale);
}

}  // namespace
}  // namespace hetflow
