// The step-time calibration's solver against closed forms: a straight line through exact
// points with one gross outlier (Huber's loss must ignore it; plain least squares would
// not), a parameter no observation depends on, a bound, the covariance of a linear fit, and
// Spearman's rank correlation.
#include "traces/robust_fit.hpp"

#include <gtest/gtest.h>

#include <cmath>

using hetflow::traces::BatchModel;
using hetflow::traces::robust_fit;
using hetflow::traces::RobustFitOptions;
using hetflow::traces::spearman;

namespace {

const std::vector<double> kX = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};

// y = a x + b with (a, b) = (p[0], p[1]); p[2] changes nothing.
BatchModel line() {
  return [](const std::vector<std::vector<double>>& points) {
    std::vector<std::vector<double>> out;
    for (const std::vector<double>& p : points) {
      std::vector<double> y;
      for (double x : kX) y.push_back(p[0] * x + p[1]);
      out.push_back(y);
    }
    return out;
  };
}

std::vector<double> measured(double a, double b) {
  std::vector<double> y;
  for (double x : kX) y.push_back(a * x + b);
  return y;
}

}  // namespace

TEST(RobustFit, RecoversALineDespiteAGrossOutlier) {
  std::vector<double> y = measured(2, 5);
  y[3] *= 1.5;  // one run 50 % slow
  const auto r = robust_fit(line(), y, {1, 1, 1});
  EXPECT_NEAR(r.parameters[0], 2, 0.01 * 2);
  EXPECT_NEAR(r.parameters[1], 5, 0.01 * 5);
  EXPECT_LT(r.weights[3], 0.1);  // the outlier, nearly ignored
  EXPECT_NEAR(r.residuals[3], 1 / 1.5 - 1, 0.01);
  // The parameter nothing depends on: kept, and not determined.
  EXPECT_EQ(r.parameters[2], 1);
  EXPECT_TRUE(std::isinf(r.std_error[2]));
  EXPECT_TRUE(std::isfinite(r.std_error[0]));
}

TEST(RobustFit, StopsAtABoundAndSaysSo) {
  RobustFitOptions o;
  o.lower = {0, 0, 0};
  o.upper = {1.5, 100, 10};  // the slope wants 2
  const auto r = robust_fit(line(), measured(2, 5), {1, 1, 1}, o);
  EXPECT_DOUBLE_EQ(r.parameters[0], 1.5);
  EXPECT_TRUE(r.at_bound[0]);
  EXPECT_FALSE(r.at_bound[1]);
}

TEST(RobustFit, StandardErrorsAreTheLinearModelsClosedForm) {
  // Exact data: residual scale at its floor of 0.1 %. With relative residuals the Jacobian
  // has rows (x / y, 1 / y), and the covariance is 1e-6 (J^T J)^-1: a 2 x 2 inverse.
  const std::vector<double> y = measured(2, 5);
  const auto r = robust_fit(line(), y, {1, 1, 1});
  double saa = 0, sab = 0, sbb = 0;
  for (size_t i = 0; i < kX.size(); ++i) {
    saa += kX[i] * kX[i] / (y[i] * y[i]);
    sab += kX[i] / (y[i] * y[i]);
    sbb += 1 / (y[i] * y[i]);
  }
  const double det = saa * sbb - sab * sab;
  EXPECT_NEAR(r.std_error[0], std::sqrt(1e-6 * sbb / det), 1e-3 * std::sqrt(1e-6 * sbb / det));
  EXPECT_NEAR(r.std_error[1], std::sqrt(1e-6 * saa / det), 1e-3 * std::sqrt(1e-6 * saa / det));
  EXPECT_NEAR(r.correlation[0][1], -sab / std::sqrt(saa * sbb), 1e-3);
}

TEST(Spearman, RanksWithTies) {
  EXPECT_DOUBLE_EQ(spearman({1, 2, 3, 4}, {10, 20, 30, 40}), 1);
  EXPECT_DOUBLE_EQ(spearman({1, 2, 3, 4}, {4, 3, 2, 1}), -1);
  // x = 1 2 3 4 5, y ranks 2 1 4 3 5: 1 - 6 x 4 / (5 x 24) = 0.8
  EXPECT_NEAR(spearman({1, 2, 3, 4, 5}, {2, 1, 4, 3, 5}), 0.8, 1e-12);
  EXPECT_EQ(spearman({1}, {1}), 0);
}
