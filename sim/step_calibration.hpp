#pragma once
// Calibration from step times: what most users have is seconds per iteration of a few plans
// run with their own framework, not hetflow's traces. This fits a small, named set of
// parameters of a model::Calibration so that the simulator's iteration time of each plan
// matches its measured one:
//   <GPU type>.max_efficiency   per GPU type the runs use: the fraction of the data-sheet
//                               peak its large tasks reach (the prior's per-kind and
//                               per-operation efficiencies scale with it); at most 1
//   overhead                    per compute task, every GPU type alike: what the framework
//                               costs beyond the kernels (launches, Python, hooks)
//   <link class>.bandwidth_factor, <link class>.latency_factor   per class the runs cross
// by robust least squares (traces/robust_fit.hpp: Huber, Levenberg-Marquardt) on relative
// error, in the logarithm of each parameter, with derivatives by finite differences through
// the model (the simulator, or the analytic estimate where asked: fast, no contention), from
// the prior and from other deterministic starts (the model has kinks where another path
// becomes critical, and a fit can stop in a local minimum): the start points are screened
// by their error, the best few fitted, and the best fit kept. A parameter no run's time
// depends on (a 10 % change moves no prediction by 0.1 %) is not fitted and keeps the
// prior's value. Parameters the runs cannot tell apart are named: those strongly correlated
// with a poorly determined one, and those on which another start's fit, as good, differs.
// design_step_runs chooses, before anything is measured, which of many candidate runs
// determine the parameters best (a greedy D-optimal design on the derivatives at the prior).
//
// What it does not fit: dispatch (a per-task delay the same in step times as the overhead;
// trace-based calibration measures it), per-kind curves and saturation (task sizes are not
// in step times), and per-stage times.
#include <set>
#include <string>
#include <vector>

#include "model/calibration.hpp"
#include "partition/plan.hpp"

namespace hetflow::sim {

struct StepRun {
  std::string name;  // for messages and the report (where it was read)
  partition::Plan plan;
  double measured_s = 0;  // seconds per iteration, steady state
};

enum class StepParameterKind { max_efficiency, overhead, bandwidth_factor, latency_factor };

struct StepParameter {
  std::string name;     // "TITAN-V.max_efficiency", "overhead", "nic.bandwidth_factor"
  StepParameterKind kind{};
  std::string subject;  // the GPU type or link class; empty for the overhead
  double prior = 0;     // the starting value
  double value = 0;
  double relative_error = 0;  // one standard deviation, relative to the value (infinite: not determined)
  double lower = 0, upper = 0;
  bool at_bound = false;
};

struct StepFitOptions {
  model::Calibration prior;
  int folds = 4;                // k-fold cross-validation (0: none; at most the number of runs)
  bool simulate = true;         // false: the estimate alone (fast, no contention)
  int threads = 0;              // simulations at once (0: the host's cores)
  double poorly_determined = 0.1;  // relative error above which a parameter is warned about
  int starts = 3;               // fits from the prior and from the best starts-1 screened points (1: the prior alone)
  // The kinds of parameter to fit (the others keep the prior's values).
  std::set<StepParameterKind> groups = {StepParameterKind::max_efficiency, StepParameterKind::overhead,
                                        StepParameterKind::bandwidth_factor, StepParameterKind::latency_factor};
};

struct StepFit {
  std::vector<StepParameter> parameters;  // fitted
  std::vector<std::string> not_fitted;    // parameter names no run determines
  std::vector<double> predicted_s;        // per run, under the fitted calibration
  std::vector<double> weights;            // Huber's weight of each run (below 1: treated as an outlier)
  double mape = 0, spearman = 0;          // of the fitted predictions against the measurements
  int folds = 0;
  std::vector<double> cv_predicted_s;     // per run, from the fit of the folds without it
  double cv_mape = 0, cv_spearman = 0;
  std::vector<std::string> warnings;      // a parameter at a bound or poorly determined, too few runs
  // Groups of parameters the runs do not tell apart (each group's names, sorted): strongly
  // correlated with a poorly determined one, or different in another start's fit as good.
  std::vector<std::vector<std::string>> confounded;
  int starts = 0;                         // fits made from different starts (the best kept)
  model::Calibration calibration;         // the prior with the fitted values
  int evaluations = 0;                    // model evaluations (plans simulated or estimated)
};

// Throws InputError when a run's measured time is not positive or there are no runs.
StepFit calibrate_step_times(const std::vector<StepRun>& runs, const StepFitOptions& options);

// Which `count` of the candidate runs to measure (their measured_s is not read): greedily, the
// run that most increases the determinant of the information matrix of the parameters'
// logarithms (derivatives of each run's log time at the prior, 10 % steps), the first from
// an empty set with a small ridge. Each parameter's relative_error is what the chosen runs
// would leave it at `noise` relative error per measured time, linearised at the prior.
struct StepDesign {
  std::vector<size_t> chosen;             // indices of the candidates, in the order chosen
  std::vector<StepParameter> parameters;  // every candidate parameter, value = prior
  std::vector<std::string> not_determined;  // no candidate's time depends on it
  int evaluations = 0;
};
StepDesign design_step_runs(const std::vector<StepRun>& candidates, const StepFitOptions& options, size_t count,
                            double noise = 0.01);

// One plan's iteration time under a calibration: the simulator's (2 iterations, the second
// timed) or the estimate's. Throws hetflow::Error when the simulation does not complete.
double predict_step_time_s(const partition::Plan& plan, const model::Calibration& calibration, bool simulate);

// The calibration with each named parameter set (the prior's per-kind and per-operation
// efficiencies scaled with a GPU type's max_efficiency; the overhead given to every GPU
// type and kind).
model::Calibration with_step_parameters(const model::Calibration& prior, const std::vector<StepParameter>& parameters,
                                        const std::vector<double>& values);

}  // namespace hetflow::sim
