#include "tools/run_prediction.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <thread>

#include "exec/cpu_backend.hpp"
#include "model/error.hpp"
#include "model/units.hpp"
#include "partition/estimate.hpp"
#include "partition/loading.hpp"

namespace hetflow::tools {

double predicted_run_wall_s(const partition::Plan& as_run, int iterations, const std::string& backend,
                            const partition::CostModel& cost) {
  double per_iteration_s = partition::estimate_plan(as_run, cost).iteration_time_s;
  if (backend == "cpu") {
    // Every device's compute is done here, by threads sharing the host's cores: at best the
    // FLOPs of an iteration at the measured sgemm rate of one core, times the cores in use.
    const double flops = as_run.network.training_flops_per_sample() * as_run.layout.samples_per_iteration();
    const double cores = std::max(1u, std::thread::hardware_concurrency());
    const double in_use = std::min(cores, static_cast<double>(as_run.device_count()));
    per_iteration_s = std::max(per_iteration_s, flops / (exec::probe_sgemm_flops_per_s(0.05) * in_use));
  }
  // A throttled loader (run::as_run's input path) may be slower still.
  per_iteration_s = std::max(per_iteration_s, partition::loader_bound(as_run).iteration_s);
  return per_iteration_s * iterations;
}

namespace {
// Minutes and hours as such: "16.3 h", not "5.86e+04 s".
std::string duration_text(double s) {
  char text[32];
  if (s >= 3600) {
    std::snprintf(text, sizeof text, "%.3g h", s / 3600);
  } else if (s >= 60) {
    std::snprintf(text, sizeof text, "%.3g min", s / 60);
  } else {
    return model::units::human_time_s(s);
  }
  return text;
}
}  // namespace

void confirm_run(double predicted_s, int iterations, bool confirmed) {
  const std::string text = "about " + duration_text(predicted_s) + " for " + std::to_string(iterations) +
                           (iterations == 1 ? " iteration" : " iterations");
  if (::isatty(::fileno(stdin)) != 0 && !confirmed && predicted_s > kConfirmRunAbove_s) {
    throw InputError("<command line>", 0, "--yes",
                     "this run is predicted to take " + text +
                         " on this machine; give --yes to start it (or fewer --steps, a smaller model, or --flop-scale)");
  }
  if (::isatty(::fileno(stderr)) != 0) std::cerr << "hetflow: predicted wall time " << text << " on this machine\n";
}

}  // namespace hetflow::tools
