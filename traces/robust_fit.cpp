#include "traces/robust_fit.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace hetflow::traces {

namespace {

using Matrix = std::vector<std::vector<double>>;

constexpr double kInf = std::numeric_limits<double>::infinity();

// Timings are never repeatable to better than about 0.1 %: the noise the covariance assumes
// at least, so that a fit to exact (synthetic) data still says how well it is determined.
constexpr double kMinResidualScale = 1e-3;

std::vector<double> relative(const std::vector<double>& predicted, const std::vector<double>& measured) {
  std::vector<double> r(measured.size());
  for (size_t i = 0; i < r.size(); ++i) r[i] = predicted[i] / measured[i] - 1;
  return r;
}

double median_abs(std::vector<double> v) {
  if (v.empty()) return 0;
  for (double& x : v) x = std::abs(x);
  std::nth_element(v.begin(), v.begin() + static_cast<long>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

// Huber's weights for residuals at threshold delta: 1 inside, delta / |r| outside.
std::vector<double> huber_weights(const std::vector<double>& r, double delta) {
  std::vector<double> w(r.size(), 1.0);
  for (size_t i = 0; i < r.size(); ++i) {
    if (std::abs(r[i]) > delta) w[i] = delta / std::abs(r[i]);
  }
  return w;
}

double huber_cost(const std::vector<double>& r, double delta) {
  double c = 0;
  for (double x : r) c += std::abs(x) <= delta ? 0.5 * x * x : delta * (std::abs(x) - 0.5 * delta);
  return c;
}

// Solves a x = b for the rows and columns in `free` (the others' x are 0); false if singular.
bool solve(Matrix a, std::vector<double> b, const std::vector<bool>& free, std::vector<double>& x) {
  const size_t n = b.size();
  for (size_t i = 0; i < n; ++i) {
    if (free[i]) continue;
    std::fill(a[i].begin(), a[i].end(), 0.0);
    for (size_t k = 0; k < n; ++k) a[k][i] = 0;
    a[i][i] = 1;
    b[i] = 0;
  }
  for (size_t c = 0; c < n; ++c) {
    size_t p = c;
    for (size_t r = c + 1; r < n; ++r) {
      if (std::abs(a[r][c]) > std::abs(a[p][c])) p = r;
    }
    if (std::abs(a[p][c]) < 1e-300) return false;
    std::swap(a[p], a[c]);
    std::swap(b[p], b[c]);
    for (size_t r = 0; r < n; ++r) {
      if (r == c) continue;
      const double f = a[r][c] / a[c][c];
      if (f == 0) continue;
      for (size_t k = c; k < n; ++k) a[r][k] -= f * a[c][k];
      b[r] -= f * b[c];
    }
  }
  x.assign(n, 0);
  for (size_t i = 0; i < n; ++i) x[i] = b[i] / a[i][i];
  return true;
}

// Symmetric eigen decomposition by cyclic Jacobi rotations (the matrices here are a few
// dozen rows at most): a = v diag(values) v^T.
void eigen_symmetric(Matrix a, std::vector<double>& values, Matrix& v) {
  const size_t n = a.size();
  v.assign(n, std::vector<double>(n, 0));
  for (size_t i = 0; i < n; ++i) v[i][i] = 1;
  for (int sweep = 0; sweep < 100; ++sweep) {
    double off = 0;
    for (size_t p = 0; p < n; ++p) {
      for (size_t q = p + 1; q < n; ++q) off += a[p][q] * a[p][q];
    }
    if (off < 1e-30) break;
    for (size_t p = 0; p < n; ++p) {
      for (size_t q = p + 1; q < n; ++q) {
        if (std::abs(a[p][q]) < 1e-300) continue;
        const double theta = (a[q][q] - a[p][p]) / (2 * a[p][q]);
        const double t = (theta >= 0 ? 1 : -1) / (std::abs(theta) + std::sqrt(theta * theta + 1));
        const double c = 1 / std::sqrt(t * t + 1), s = t * c;
        for (size_t k = 0; k < n; ++k) {
          const double akp = a[k][p], akq = a[k][q];
          a[k][p] = c * akp - s * akq;
          a[k][q] = s * akp + c * akq;
        }
        for (size_t k = 0; k < n; ++k) {
          const double apk = a[p][k], aqk = a[q][k];
          a[p][k] = c * apk - s * aqk;
          a[q][k] = s * apk + c * aqk;
        }
        for (size_t k = 0; k < n; ++k) {
          const double vkp = v[k][p], vkq = v[k][q];
          v[k][p] = c * vkp - s * vkq;
          v[k][q] = s * vkp + c * vkq;
        }
      }
    }
  }
  values.resize(n);
  for (size_t i = 0; i < n; ++i) values[i] = a[i][i];
}

struct Linearised {
  std::vector<double> r;  // residuals at the point
  Matrix j;               // d r_i / d p_k
};

Linearised linearise(const BatchModel& model, const std::vector<double>& measured, const std::vector<double>& p,
                     const RobustFitOptions& o, int& evaluations) {
  std::vector<std::vector<double>> points{p};
  for (size_t k = 0; k < p.size(); ++k) {
    std::vector<double> q = p;
    // Step inside the bounds: backwards where forwards would leave them.
    const bool back = !o.upper.empty() && q[k] + o.derivative_step > o.upper[k];
    q[k] += back ? -o.derivative_step : o.derivative_step;
    points.push_back(q);
  }
  const std::vector<std::vector<double>> predicted = model(points);
  evaluations += static_cast<int>(points.size());
  Linearised l;
  l.r = relative(predicted[0], measured);
  l.j.assign(measured.size(), std::vector<double>(p.size(), 0));
  for (size_t k = 0; k < p.size(); ++k) {
    const std::vector<double> rk = relative(predicted[k + 1], measured);
    const double h = points[k + 1][k] - p[k];
    for (size_t i = 0; i < measured.size(); ++i) l.j[i][k] = (rk[i] - l.r[i]) / h;
  }
  return l;
}

// The covariance's diagonal and correlations at the result; a direction the data do not
// see (an eigenvalue below 1e-14 of the largest: numerically zero) makes its parameters' errors infinite.
void covariance(RobustFitResult& out, const Matrix& j, const std::vector<double>& w) {
  const size_t n = out.residuals.size(), p = out.parameters.size();
  Matrix a(p, std::vector<double>(p, 0));
  for (size_t i = 0; i < n; ++i) {
    for (size_t r = 0; r < p; ++r) {
      for (size_t c = 0; c < p; ++c) a[r][c] += w[i] * j[i][r] * j[i][c];
    }
  }
  double s2 = 0;
  for (size_t i = 0; i < n; ++i) s2 += w[i] * out.residuals[i] * out.residuals[i];
  s2 = n > p ? s2 / static_cast<double>(n - p) : 0;
  s2 = std::max(s2, kMinResidualScale * kMinResidualScale);
  std::vector<double> values;
  Matrix v;
  eigen_symmetric(a, values, v);
  const double largest = values.empty() ? 0 : *std::max_element(values.begin(), values.end());
  Matrix cov(p, std::vector<double>(p, 0));
  std::vector<bool> unseen(p, false);
  for (size_t e = 0; e < p; ++e) {
    if (!(values[e] > 1e-14 * largest) || largest <= 0) {
      for (size_t r = 0; r < p; ++r) {
        if (std::abs(v[r][e]) > 0.01) unseen[r] = true;  // a parameter with a real share in the unseen direction
      }
      continue;
    }
    for (size_t r = 0; r < p; ++r) {
      for (size_t c = 0; c < p; ++c) cov[r][c] += s2 * v[r][e] * v[c][e] / values[e];
    }
  }
  out.std_error.assign(p, kInf);
  out.correlation.assign(p, std::vector<double>(p, 0));
  for (size_t r = 0; r < p; ++r) {
    if (!unseen[r]) out.std_error[r] = std::sqrt(std::max(cov[r][r], 0.0));
  }
  for (size_t r = 0; r < p; ++r) {
    for (size_t c = 0; c < p; ++c) {
      const double d = std::sqrt(cov[r][r] * cov[c][c]);
      out.correlation[r][c] = r == c ? 1 : (d > 0 ? cov[r][c] / d : 0);
    }
  }
}

}  // namespace

RobustFitResult robust_fit(const BatchModel& model, const std::vector<double>& measured, const std::vector<double>& start,
                           const RobustFitOptions& o) {
  const size_t p = start.size();
  const auto clamp = [&](std::vector<double>& q) {
    for (size_t k = 0; k < p; ++k) {
      if (!o.lower.empty()) q[k] = std::max(q[k], o.lower[k]);
      if (!o.upper.empty()) q[k] = std::min(q[k], o.upper[k]);
    }
  };
  RobustFitResult out;
  out.parameters = start;
  clamp(out.parameters);
  double lambda = 1e-3;
  Linearised lin = linearise(model, measured, out.parameters, o, out.evaluations);
  for (out.iterations = 0; out.iterations < o.max_iterations; ++out.iterations) {
    const double delta = std::max(o.min_huber_delta, o.huber_k * 1.4826 * median_abs(lin.r));
    const std::vector<double> w = huber_weights(lin.r, delta);
    const double cost = huber_cost(lin.r, delta);
    Matrix a(p, std::vector<double>(p, 0));
    std::vector<double> g(p, 0);
    for (size_t i = 0; i < measured.size(); ++i) {
      for (size_t r = 0; r < p; ++r) {
        g[r] += w[i] * lin.j[i][r] * lin.r[i];
        for (size_t c = 0; c < p; ++c) a[r][c] += w[i] * lin.j[i][r] * lin.j[i][c];
      }
    }
    // Free: seen by the data, and not pressed against the bound it sits on.
    std::vector<bool> free(p, true);
    for (size_t k = 0; k < p; ++k) {
      if (a[k][k] <= 0) free[k] = false;
      if (!o.lower.empty() && out.parameters[k] <= o.lower[k] && g[k] > 0) free[k] = false;
      if (!o.upper.empty() && out.parameters[k] >= o.upper[k] && g[k] < 0) free[k] = false;
    }
    bool improved = false;
    for (int attempt = 0; attempt < 12 && !improved; ++attempt) {
      Matrix damped = a;
      for (size_t k = 0; k < p; ++k) damped[k][k] *= 1 + lambda;
      std::vector<double> neg_g(p), step;
      for (size_t k = 0; k < p; ++k) neg_g[k] = -g[k];
      if (!solve(damped, neg_g, free, step)) break;
      std::vector<double> next = out.parameters;
      for (size_t k = 0; k < p; ++k) next[k] += step[k];
      clamp(next);
      const std::vector<double> r_next = relative(model({next})[0], measured);
      ++out.evaluations;
      if (huber_cost(r_next, delta) < cost) {
        double moved = 0;
        for (size_t k = 0; k < p; ++k) moved = std::max(moved, std::abs(next[k] - out.parameters[k]));
        out.parameters = next;
        // A tiny step is convergence only when it was nearly Gauss-Newton's: under heavy
        // damping (a rough stretch of the model) it says nothing about the minimum.
        const bool small = moved < 1e-7 || cost - huber_cost(r_next, delta) < 1e-14 * std::max(cost, 1e-30);
        if (small && lambda <= 1e-2) out.converged = true;
        lambda = std::max(lambda / 10, 1e-9);
        improved = true;
      } else {
        lambda *= 10;
      }
    }
    if (!improved) out.converged = true;  // no step lowers the cost: a (local) minimum
    lin = linearise(model, measured, out.parameters, o, out.evaluations);
    if (out.converged) break;
  }
  out.residuals = lin.r;
  const double delta = std::max(o.min_huber_delta, o.huber_k * 1.4826 * median_abs(lin.r));
  out.weights = huber_weights(lin.r, delta);
  covariance(out, lin.j, out.weights);
  out.at_bound.assign(p, false);
  for (size_t k = 0; k < p; ++k) {
    const double tol = 1e-9 * std::max(1.0, std::abs(out.parameters[k]));
    out.at_bound[k] = (!o.lower.empty() && out.parameters[k] <= o.lower[k] + tol) ||
                      (!o.upper.empty() && out.parameters[k] >= o.upper[k] - tol);
  }
  return out;
}

double spearman(const std::vector<double>& a, const std::vector<double>& b) {
  const size_t n = std::min(a.size(), b.size());
  if (n < 2) return 0;
  const auto ranks = [n](const std::vector<double>& x) {
    std::vector<size_t> order(n);
    std::iota(order.begin(), order.end(), size_t{0});
    std::sort(order.begin(), order.end(), [&](size_t i, size_t j) { return x[i] < x[j]; });
    std::vector<double> r(n);
    for (size_t i = 0; i < n;) {
      size_t j = i;
      while (j + 1 < n && x[order[j + 1]] == x[order[i]]) ++j;
      for (size_t k = i; k <= j; ++k) r[order[k]] = 0.5 * static_cast<double>(i + j) + 1;
      i = j + 1;
    }
    return r;
  };
  const std::vector<double> ra = ranks(a), rb = ranks(b);
  const double mean = (static_cast<double>(n) + 1) / 2;
  double sab = 0, saa = 0, sbb = 0;
  for (size_t i = 0; i < n; ++i) {
    sab += (ra[i] - mean) * (rb[i] - mean);
    saa += (ra[i] - mean) * (ra[i] - mean);
    sbb += (rb[i] - mean) * (rb[i] - mean);
  }
  return saa > 0 && sbb > 0 ? sab / std::sqrt(saa * sbb) : 0;
}

}  // namespace hetflow::traces
