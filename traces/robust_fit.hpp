#pragma once
// Robust nonlinear least squares for calibration: Levenberg-Marquardt on Huber-weighted
// residuals (iteratively reweighted), numerical derivatives, box bounds, and the covariance
// of the result from the Jacobian. The model is a black box (the estimate or the simulator):
// it maps a parameter vector to one prediction per observation.
#include <functional>
#include <string>
#include <vector>

namespace hetflow::traces {

// Predictions for several parameter vectors at once (the caller may evaluate them in
// parallel): result[k][i] = observation i's prediction under points[k].
using BatchModel = std::function<std::vector<std::vector<double>>(const std::vector<std::vector<double>>& points)>;

struct RobustFitOptions {
  std::vector<double> lower, upper;  // per parameter (empty: unbounded)
  double derivative_step = 1e-3;     // forward difference, in the parameter's own units
  int max_iterations = 40;
  // Huber's threshold on a residual, as a multiple of the residuals' robust scale
  // (1.4826 x their median absolute value); 1.345 keeps 95 % efficiency on normal noise.
  double huber_k = 1.345;
  double min_huber_delta = 1e-3;  // never below this (noise-free data would make every point an outlier)
};

struct RobustFitResult {
  std::vector<double> parameters;
  std::vector<double> residuals;   // observation's (prediction - measured) / measured at the result
  std::vector<double> weights;     // Huber's weight of each observation at the result (1: inside the threshold)
  std::vector<double> std_error;   // per parameter, from the covariance; infinite when not determined
  std::vector<std::vector<double>> correlation;  // between parameters
  std::vector<bool> at_bound;      // the result sits on a bound
  int iterations = 0;
  int evaluations = 0;             // parameter vectors the model was asked for
  bool converged = false;
};

// Fits `model` to `measured` (every entry > 0) on relative residuals (prediction / measured
// - 1) from `start`. Parameters whose every derivative is zero keep their start value and get
// an infinite std_error.
RobustFitResult robust_fit(const BatchModel& model, const std::vector<double>& measured, const std::vector<double>& start,
                           const RobustFitOptions& options = {});

// Spearman's rank correlation (ties take their mean rank); 0 with fewer than two values.
double spearman(const std::vector<double>& a, const std::vector<double>& b);

}  // namespace hetflow::traces
