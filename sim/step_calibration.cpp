#include "sim/step_calibration.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <exception>
#include <iomanip>
#include <limits>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "model/error.hpp"
#include "model/limits.hpp"
#include "partition/cost_model.hpp"
#include "partition/estimate.hpp"
#include "sim/simulator.hpp"
#include "traces/metrics.hpp"
#include "traces/robust_fit.hpp"

namespace hetflow::sim {

namespace {

// A 10 % change that moves no run's prediction by 0.1 % (d ln t / d ln p below 0.01): the
// runs do not determine the parameter.
constexpr double kMinSensitivity = 0.01;
// Each parameter's range, in its own units: an efficiency of a tenth of a percent to the
// cap; an overhead of 0.1 us to 1 s a task; link factors as calibration files bound them.
constexpr double kMinEfficiency = 1e-3;
constexpr double kMinOverhead_s = 1e-7, kMaxOverhead_s = 1;

double highest_efficiency(const model::GpuEfficiency& g) {
  double e = g.max_efficiency;
  for (const auto& [kind, k] : g.kinds) e = std::max(e, k.max_efficiency);
  for (const auto& [op, o] : g.ops) {
    if (op != "memory") e = std::max(e, o.max_efficiency);
  }
  return e;
}

std::string format_percent(double fraction) {
  std::ostringstream s;
  s << std::setprecision(3) << 100 * fraction << " %";
  return s.str();
}

// The k-th point of the Halton sequence in base b (its radical inverse), in [0, 1).
double halton(size_t k, unsigned b) {
  double f = 1, r = 0;
  for (; k > 0; k /= b) {
    f /= b;
    r += f * static_cast<double>(k % b);
  }
  return r;
}
constexpr unsigned kHaltonBases[] = {2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53};
// Start points spread a factor of this either way of the prior in each parameter: wide enough
// to leave a local minimum, and a parameter's prior is rarely further off than that.
constexpr double kStartSpread = 4;
// Another start's fit is as good when its mean relative error exceeds the best's by at most
// 10 % of it plus kAsGood (0.1 %, timing noise), and differs on a parameter when the two
// values are more than kDiffers (10 %) apart.
constexpr double kAsGood = 1e-3, kDiffers = 0.1;
// Correlation above which two parameters, one poorly determined, are named as confounded.
constexpr double kConfounded = 0.9;

double mean_abs(const std::vector<double>& r) {
  double s = 0;
  for (double x : r) s += std::abs(x);
  return r.empty() ? 0 : s / static_cast<double>(r.size());
}

// The inverse of a small symmetric positive definite matrix (Gauss-Jordan with pivoting).
std::vector<std::vector<double>> inverse(std::vector<std::vector<double>> a) {
  const size_t n = a.size();
  std::vector<std::vector<double>> b(n, std::vector<double>(n, 0));
  for (size_t i = 0; i < n; ++i) b[i][i] = 1;
  for (size_t c = 0; c < n; ++c) {
    size_t p = c;
    for (size_t r = c + 1; r < n; ++r) {
      if (std::abs(a[r][c]) > std::abs(a[p][c])) p = r;
    }
    std::swap(a[p], a[c]);
    std::swap(b[p], b[c]);
    const double d = a[c][c];
    for (size_t k = 0; k < n; ++k) a[c][k] /= d, b[c][k] /= d;
    for (size_t r = 0; r < n; ++r) {
      if (r == c || a[r][c] == 0) continue;
      const double f = a[r][c];
      for (size_t k = 0; k < n; ++k) a[r][k] -= f * a[c][k], b[r][k] -= f * b[c][k];
    }
  }
  return b;
}

// Every parameter the runs' clusters could have: the GPU types their devices are, the
// shared overhead, and the link classes of their nodes, NICs and WAN links.
std::vector<StepParameter> candidates(const std::vector<StepRun>& runs, const model::Calibration& prior) {
  std::set<std::string> gpus, links;
  for (const StepRun& r : runs) {
    for (const model::Device& d : r.plan.cluster.devices()) gpus.insert(r.plan.cluster.device_gpu(d).name);
    for (const model::Node& n : r.plan.cluster.nodes) {
      links.insert(std::string(model::to_string(n.intra.kind)));
      if (n.intra.uplink_bandwidth_bytes_per_s > 0) links.insert("pcie");
    }
    if (r.plan.cluster.nodes.size() > 1) links.insert("nic");
    if (!r.plan.cluster.wan.empty()) links.insert("wan");
  }
  std::vector<StepParameter> out;
  for (const std::string& g : gpus) {
    const model::GpuEfficiency& e = prior.gpu(g);
    StepParameter p{g + ".max_efficiency", StepParameterKind::max_efficiency, g, e.max_efficiency};
    p.lower = kMinEfficiency;
    p.upper = e.max_efficiency / highest_efficiency(e);  // no kind's or operation's above 1
    out.push_back(p);
  }
  StepParameter overhead{"overhead", StepParameterKind::overhead, "", std::max(prior.default_gpu.overhead_s, kMinOverhead_s)};
  overhead.lower = kMinOverhead_s;
  overhead.upper = kMaxOverhead_s;
  out.push_back(overhead);
  for (const std::string& l : links) {
    const model::LinkCalibration c = prior.link(l);
    StepParameter bw{l + ".bandwidth_factor", StepParameterKind::bandwidth_factor, l, c.bandwidth_factor};
    bw.lower = model::limits::kMinLinkFactor;
    bw.upper = model::limits::kMaxLinkFactor;
    StepParameter lat{l + ".latency_factor", StepParameterKind::latency_factor, l,
                      std::max(c.latency_factor, model::limits::kMinLinkFactor)};
    lat.lower = model::limits::kMinLinkFactor;
    lat.upper = model::limits::kMaxLinkFactor;
    out.push_back(bw);
    out.push_back(lat);
  }
  for (StepParameter& p : out) p.value = p.prior = std::clamp(p.prior, p.lower, p.upper);
  return out;
}

// Runs every (point, run) pair on `threads` threads: simulate() forks a child per call, so
// the simulations run side by side.
std::vector<std::vector<double>> predict_all(const std::vector<StepRun>& runs, const std::vector<size_t>& subset,
                                             const model::Calibration& prior, const std::vector<StepParameter>& params,
                                             const std::vector<std::vector<double>>& log_points, bool simulate,
                                             int threads, std::atomic<int>& evaluations) {
  std::vector<std::vector<double>> out(log_points.size(), std::vector<double>(subset.size(), 0));
  std::vector<model::Calibration> calibrations;
  for (const std::vector<double>& lp : log_points) {
    std::vector<double> values;
    for (double x : lp) values.push_back(std::exp(x));
    calibrations.push_back(with_step_parameters(prior, params, values));
  }
  const size_t jobs = log_points.size() * subset.size();
  std::atomic<size_t> next{0};
  std::exception_ptr failure;
  std::mutex failure_mutex;
  const auto work = [&] {
    for (size_t j = next++; j < jobs; j = next++) {
      const size_t k = j / subset.size(), i = j % subset.size();
      try {
        out[k][i] = predict_step_time_s(runs[subset[i]].plan, calibrations[k], simulate);
      } catch (...) {
        const std::lock_guard<std::mutex> lock(failure_mutex);
        if (!failure) failure = std::current_exception();
      }
    }
  };
  const size_t n = std::min(jobs, static_cast<size_t>(std::max(1, simulate ? threads : 1)));
  std::vector<std::thread> pool;
  for (size_t t = 1; t < n; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  if (failure) std::rethrow_exception(failure);
  evaluations += static_cast<int>(jobs);
  return out;
}

struct Fitter {
  const std::vector<StepRun>& runs;
  const StepFitOptions& options;
  int threads = 1;
  std::atomic<int> evaluations{0};

  traces::BatchModel model(const std::vector<size_t>& subset, const std::vector<StepParameter>& params, bool simulate) {
    return [this, subset, params, simulate](const std::vector<std::vector<double>>& points) {
      return predict_all(runs, subset, options.prior, params, points, simulate, threads, evaluations);
    };
  }

  std::vector<double> measured(const std::vector<size_t>& subset) const {
    std::vector<double> m;
    for (size_t i : subset) m.push_back(runs[i].measured_s);
    return m;
  }

  // Fits from the prior and from the best starts - 1 of 4 x starts screened points, best
  // first (by mean relative error; the prior's first among equals).
  std::vector<traces::RobustFitResult> fit(const std::vector<size_t>& subset, const std::vector<StepParameter>& params,
                                           int starts) {
    traces::RobustFitOptions o;
    std::vector<double> prior;
    for (const StepParameter& p : params) {
      prior.push_back(std::log(p.prior));
      o.lower.push_back(std::log(p.lower));
      o.upper.push_back(std::log(p.upper));
    }
    o.max_iterations = 40;
    o.derivative_step = 1e-2;  // 1 %: wide enough to step over the simulator's kinks (a path that becomes critical)
    // From the prior through the model asked for: a first fit through the estimate would be
    // cheaper, but where contention makes the simulator's times differ from the estimate's
    // (often by 2x), it lands where the simulator's fit starts worse than from the prior.
    std::vector<std::vector<double>> from{prior};
    if (starts > 1 && !params.empty()) {
      std::vector<std::vector<double>> points;
      for (size_t s = 1; s <= 4 * static_cast<size_t>(starts); ++s) {
        std::vector<double> q = prior;
        for (size_t k = 0; k < q.size(); ++k) {
          const double u = halton(s, kHaltonBases[k % std::size(kHaltonBases)]) * 2 - 1;
          q[k] = std::clamp(q[k] + u * std::log(kStartSpread), o.lower[k], o.upper[k]);
        }
        points.push_back(q);
      }
      const auto predicted = model(subset, params, options.simulate)(points);
      const std::vector<double> m = measured(subset);
      std::vector<std::pair<double, size_t>> score;
      for (size_t s = 0; s < points.size(); ++s) {
        std::vector<double> r;
        for (size_t i = 0; i < m.size(); ++i) r.push_back(predicted[s][i] / m[i] - 1);
        score.emplace_back(mean_abs(r), s);
      }
      std::sort(score.begin(), score.end());
      for (size_t s = 0; s + 1 < static_cast<size_t>(starts) && s < score.size(); ++s) from.push_back(points[score[s].second]);
    }
    std::vector<traces::RobustFitResult> fits;
    for (const std::vector<double>& start : from) fits.push_back(traces::robust_fit(model(subset, params, options.simulate), measured(subset), start, o));
    std::stable_sort(fits.begin(), fits.end(), [](const auto& a, const auto& b) { return mean_abs(a.residuals) < mean_abs(b.residuals); });
    return fits;
  }
};

double mape_of(const std::vector<double>& predicted, const std::vector<StepRun>& runs) {
  double sum = 0;
  for (size_t i = 0; i < runs.size(); ++i) sum += std::abs(predicted[i] / runs[i].measured_s - 1);
  return runs.empty() ? 0 : sum / static_cast<double>(runs.size());
}

std::vector<double> measured_of(const std::vector<StepRun>& runs) {
  std::vector<double> m;
  for (const StepRun& r : runs) m.push_back(r.measured_s);
  return m;
}

// Groups of parameters the runs do not tell apart: a poorly determined one with those
// strongly correlated with it, and the parameters on which a fit from another start, as good
// as the best, differs from it.
std::vector<std::vector<std::string>> confounded(const std::vector<StepParameter>& params,
                                                 const std::vector<traces::RobustFitResult>& fits,
                                                 const StepFitOptions& options) {
  std::set<std::vector<std::string>> groups;
  const traces::RobustFitResult& best = fits.front();
  for (size_t k = 0; k < params.size(); ++k) {
    if (best.std_error[k] <= options.poorly_determined || best.correlation.size() != params.size()) continue;
    std::vector<std::string> g{params[k].name};
    for (size_t l = 0; l < params.size(); ++l) {
      if (l != k && std::abs(best.correlation[k][l]) >= kConfounded) g.push_back(params[l].name);
    }
    std::sort(g.begin(), g.end());
    if (g.size() > 1) groups.insert(g);
  }
  const double best_error = mean_abs(best.residuals);
  for (size_t f = 1; f < fits.size(); ++f) {
    if (mean_abs(fits[f].residuals) > best_error * (1 + kDiffers) + kAsGood) continue;
    std::vector<std::string> g;
    for (size_t k = 0; k < params.size(); ++k) {
      if (std::abs(fits[f].parameters[k] - best.parameters[k]) > std::log1p(kDiffers)) g.push_back(params[k].name);
    }
    std::sort(g.begin(), g.end());
    if (!g.empty()) groups.insert(g);
  }
  return {groups.begin(), groups.end()};
}

// What a user should not take on trust, each with what to do about it.
void warn(StepFit& fit, const std::vector<StepRun>& runs, const StepFitOptions& options) {
  double rms = 0;
  for (size_t i = 0; i < runs.size(); ++i) rms += std::pow(fit.predicted_s[i] / runs[i].measured_s - 1, 2);
  rms = runs.empty() ? 0 : std::sqrt(rms / static_cast<double>(runs.size()));
  for (const StepParameter& p : fit.parameters) {
    if (p.at_bound) {
      const bool cap = p.kind == StepParameterKind::max_efficiency && p.value >= p.upper * (1 - 1e-9);
      fit.warnings.push_back(p.name + " is at its " + (p.value <= p.lower * (1 + 1e-9) ? "lower" : "upper") + " bound " +
                             std::to_string(p.value) +
                             (cap ? " (the efficiency cap: the runs are faster than the data-sheet peak allows; check "
                                    "the GPU type and the precision)"
                                  : "") +
                             " with an RMS residual of " + format_percent(rms) + ": the model cannot follow the runs");
    } else if (!(p.relative_error <= options.poorly_determined)) {
      fit.warnings.push_back(p.name + " is poorly determined (+/- " +
                             (std::isfinite(p.relative_error) ? format_percent(p.relative_error) : std::string("unbounded")) +
                             "): add runs whose times depend on it differently");
    }
  }
  for (const std::vector<std::string>& g : fit.confounded) {
    std::string names;
    for (size_t k = 0; k < g.size(); ++k) names += (k == 0 ? "" : k + 1 == g.size() ? " and " : ", ") + g[k];
    fit.warnings.push_back(names + (g.size() == 1 ? " differs between fits from other starts that follow the runs as well"
                                                  : " trade against each other: the runs do not tell them apart") +
                           "; add runs that load them differently (calibrate --design chooses them from candidates)");
  }
  for (size_t i = 0; i < runs.size(); ++i) {
    // Down-weighted and off by more than timings of one plan usually differ.
    if (fit.weights[i] < 1 && std::abs(fit.predicted_s[i] / runs[i].measured_s - 1) > 0.02) {
      fit.warnings.push_back(runs[i].name + " is off by " + format_percent(fit.predicted_s[i] / runs[i].measured_s - 1) +
                             " and was down-weighted as an outlier: check its measurement");
    }
  }
}

}  // namespace

model::Calibration with_step_parameters(const model::Calibration& prior, const std::vector<StepParameter>& parameters,
                                        const std::vector<double>& values) {
  model::Calibration c = prior;
  const StepParameter* overhead = nullptr;
  double overhead_s = 0;
  for (size_t k = 0; k < parameters.size(); ++k) {
    const StepParameter& p = parameters[k];
    switch (p.kind) {
      case StepParameterKind::max_efficiency: {
        model::GpuEfficiency g = prior.gpu(p.subject);
        const double scale = values[k] / g.max_efficiency;
        g.max_efficiency = values[k];
        for (auto& [kind, e] : g.kinds) e.max_efficiency = std::min(1.0, e.max_efficiency * scale);
        for (auto& [op, e] : g.ops) {
          if (op != "memory") e.max_efficiency = std::min(1.0, e.max_efficiency * scale);
        }
        c.gpus[p.subject] = g;
        break;
      }
      case StepParameterKind::overhead:
        overhead = &p;
        overhead_s = values[k];
        break;
      case StepParameterKind::bandwidth_factor: c.links[p.subject].bandwidth_factor = values[k]; break;
      case StepParameterKind::latency_factor: c.links[p.subject].latency_factor = values[k]; break;
    }
  }
  if (overhead != nullptr) {
    const auto set = [overhead_s](model::GpuEfficiency& g) {
      g.overhead_s = overhead_s;
      for (auto& [kind, e] : g.kinds) e.overhead_s = overhead_s;
    };
    set(c.default_gpu);
    for (auto& [name, g] : c.gpus) set(g);
  }
  return c;
}

double predict_step_time_s(const partition::Plan& plan, const model::Calibration& calibration, bool simulate) {
  const partition::CostModel cost(plan.cluster, plan.layout.precision, calibration);
  if (!simulate) return partition::estimate_plan(plan, cost).iteration_time_s;
  SimOptions options;
  options.calibration = calibration;
  const SimResult r = sim::simulate(plan, options);
  if (!r.completed) throw Error("the simulation of " + plan.network.name + " on " + plan.cluster.name + " did not complete");
  return traces::compute_metrics(r.trace, plan, cost).iteration_time_s;
}

StepFit calibrate_step_times(const std::vector<StepRun>& given, const StepFitOptions& options) {
  if (given.empty()) throw InputError("<runs>", 0, "runs", "expected at least one measured run");
  std::vector<StepRun> runs = given;
  for (StepRun& r : runs) {
    if (!(r.measured_s > 0) || !std::isfinite(r.measured_s)) {
      throw InputError(r.name, 0, "step_s", "expected a positive number of seconds per iteration");
    }
    // Two iterations, the second timed: the steady state without the first's warm-up.
    r.plan.layout.iterations = std::max(2, r.plan.layout.iterations);
  }
  Fitter fitter{runs, options};
  fitter.threads = options.threads > 0 ? options.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::vector<size_t> all(runs.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = i;

  // Which parameters the runs determine: their derivatives at the prior.
  std::vector<StepParameter> every;
  for (const StepParameter& p : candidates(runs, options.prior)) {
    if (options.groups.count(p.kind) != 0) every.push_back(p);
  }
  StepFit fit;
  std::vector<StepParameter> params;
  {
    std::vector<std::vector<double>> points(1);
    for (const StepParameter& p : every) points[0].push_back(std::log(p.prior));
    for (size_t k = 0; k < every.size(); ++k) {
      points.push_back(points[0]);
      points.back()[k] += 0.1;
    }
    const auto predicted =
        predict_all(runs, all, options.prior, every, points, options.simulate, fitter.threads, fitter.evaluations);
    std::vector<std::pair<double, size_t>> sensitivity;
    for (size_t k = 0; k < every.size(); ++k) {
      double most = 0;
      for (size_t i = 0; i < runs.size(); ++i) most = std::max(most, std::abs(std::log(predicted[k + 1][i] / predicted[0][i])) / 0.1);
      sensitivity.emplace_back(most, k);
    }
    // The most telling first; fewer parameters than runs, so that the fit is checked by the
    // runs it need not follow.
    std::stable_sort(sensitivity.begin(), sensitivity.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    std::vector<bool> keep(every.size(), false);
    size_t kept = 0;
    for (const auto& [most, k] : sensitivity) {
      if (most < kMinSensitivity) continue;
      if (kept + 1 >= std::max<size_t>(runs.size(), 2)) {
        fit.warnings.push_back(every[k].name + " is not fitted: " + std::to_string(runs.size()) +
                               " runs determine fewer parameters; add runs");
        continue;
      }
      keep[k] = true;
      ++kept;
    }
    for (size_t k = 0; k < every.size(); ++k) (keep[k] ? params.push_back(every[k]) : fit.not_fitted.push_back(every[k].name));
  }

  const std::vector<traces::RobustFitResult> fits = fitter.fit(all, params, std::max(1, options.starts));
  const traces::RobustFitResult& r = fits.front();
  fit.starts = static_cast<int>(fits.size());
  std::vector<double> values;
  for (size_t k = 0; k < params.size(); ++k) {
    params[k].value = std::exp(r.parameters[k]);
    params[k].relative_error = r.std_error[k];  // of the logarithm: a relative error
    params[k].at_bound = r.at_bound[k];
    values.push_back(params[k].value);
  }
  fit.parameters = params;
  fit.calibration = with_step_parameters(options.prior, params, values);
  fit.weights = r.weights;
  for (size_t i = 0; i < runs.size(); ++i) fit.predicted_s.push_back(runs[i].measured_s * (1 + r.residuals[i]));
  fit.mape = mape_of(fit.predicted_s, runs);
  fit.spearman = traces::spearman(fit.predicted_s, measured_of(runs));

  // k-fold: each fold's runs predicted by a fit, from the prior, of the others alone.
  fit.folds = runs.size() >= 3 ? std::min<int>(options.folds, static_cast<int>(runs.size())) : 0;
  if (fit.folds >= 2) {
    fit.cv_predicted_s.assign(runs.size(), 0);
    for (int f = 0; f < fit.folds; ++f) {
      std::vector<size_t> train, test;
      for (size_t i = 0; i < runs.size(); ++i) (static_cast<int>(i % static_cast<size_t>(fit.folds)) == f ? test : train).push_back(i);
      const traces::RobustFitResult fr = fitter.fit(train, params, 1).front();
      const auto predicted = predict_all(runs, test, options.prior, params, {fr.parameters}, options.simulate,
                                         fitter.threads, fitter.evaluations);
      for (size_t i = 0; i < test.size(); ++i) fit.cv_predicted_s[test[i]] = predicted[0][i];
    }
    fit.cv_mape = mape_of(fit.cv_predicted_s, runs);
    fit.cv_spearman = traces::spearman(fit.cv_predicted_s, measured_of(runs));
  } else {
    fit.folds = 0;
  }
  fit.confounded = confounded(params, fits, options);
  warn(fit, runs, options);
  fit.evaluations = fitter.evaluations;
  return fit;
}

}  // namespace hetflow::sim

namespace hetflow::sim {

StepDesign design_step_runs(const std::vector<StepRun>& given, const StepFitOptions& options, size_t count, double noise) {
  if (given.empty()) throw InputError("<runs>", 0, "runs", "expected at least one candidate run");
  std::vector<StepRun> runs = given;
  for (StepRun& r : runs) r.plan.layout.iterations = std::max(2, r.plan.layout.iterations);
  const int threads = options.threads > 0 ? options.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::vector<size_t> all(runs.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = i;
  StepDesign design;
  std::vector<StepParameter> every;
  for (const StepParameter& p : candidates(runs, options.prior)) {
    if (options.groups.count(p.kind) != 0) every.push_back(p);
  }
  // d ln t / d ln p of every candidate run, by a 10 % step from the prior.
  constexpr double kStep = 0.1;
  std::vector<std::vector<double>> points(1);
  for (const StepParameter& p : every) points[0].push_back(std::log(p.prior));
  for (size_t k = 0; k < every.size(); ++k) {
    points.push_back(points[0]);
    points.back()[k] += kStep;
  }
  std::atomic<int> evaluations{0};
  const auto predicted = predict_all(runs, all, options.prior, every, points, options.simulate, threads, evaluations);
  design.evaluations = evaluations;
  std::vector<size_t> seen;  // parameters some run's time depends on
  for (size_t k = 0; k < every.size(); ++k) {
    double most = 0;
    for (size_t i = 0; i < runs.size(); ++i) most = std::max(most, std::abs(std::log(predicted[k + 1][i] / predicted[0][i])) / kStep);
    (most >= kMinSensitivity ? seen.push_back(k) : design.not_determined.push_back(every[k].name));
  }
  std::vector<std::vector<double>> j(runs.size(), std::vector<double>(seen.size()));
  for (size_t i = 0; i < runs.size(); ++i) {
    for (size_t k = 0; k < seen.size(); ++k) j[i][k] = std::log(predicted[seen[k] + 1][i] / predicted[0][i]) / kStep;
  }
  // Greedy D-optimal: by the matrix determinant lemma, adding run i multiplies det(M) by
  // 1 + j_i^T M^-1 j_i. The ridge makes the empty set's M invertible (and favours the run
  // that moves most first).
  constexpr double kRidge = 1e-6;
  const size_t p = seen.size();
  std::vector<std::vector<double>> m(p, std::vector<double>(p, 0));
  for (size_t k = 0; k < p; ++k) m[k][k] = kRidge;
  std::vector<bool> taken(runs.size(), false);
  for (size_t step = 0; step < std::min(count, runs.size()); ++step) {
    const auto mi = inverse(m);
    double best_gain = -1;
    size_t best = 0;
    for (size_t i = 0; i < runs.size(); ++i) {
      if (taken[i]) continue;
      double gain = 0;
      for (size_t r = 0; r < p; ++r) {
        for (size_t c = 0; c < p; ++c) gain += j[i][r] * mi[r][c] * j[i][c];
      }
      if (gain > best_gain * (1 + 1e-9)) best_gain = gain, best = i;
    }
    taken[best] = true;
    design.chosen.push_back(best);
    for (size_t r = 0; r < p; ++r) {
      for (size_t c = 0; c < p; ++c) m[r][c] += j[best][r] * j[best][c];
    }
  }
  // What the chosen runs would leave each parameter at: noise x sqrt(diag(M^-1)), the ridge
  // taken out again (a direction it alone holds is undetermined).
  for (size_t k = 0; k < p; ++k) m[k][k] -= kRidge * (1 - 1e-6);
  const auto mi = inverse(m);
  design.parameters = every;
  for (StepParameter& q : design.parameters) q.relative_error = std::numeric_limits<double>::infinity();
  for (size_t k = 0; k < p; ++k) {
    const double v = mi[k][k];
    design.parameters[seen[k]].relative_error = v > 0 && std::isfinite(v) && noise * std::sqrt(v) < 1e3 ? noise * std::sqrt(v)
                                                                                                     : std::numeric_limits<double>::infinity();
  }
  return design;
}

}  // namespace hetflow::sim
