#pragma once
// How long `hetflow run` will take on this machine, said before it starts, and the --yes a
// long run needs when a person is at the terminal (a 16-GPU plan of proxies on two CPU cores
// otherwise runs for hours before anyone learns so).
#include <string>

#include "partition/cost_model.hpp"
#include "partition/plan.hpp"

namespace hetflow::tools {

// Runs predicted longer than this ask for --yes when stdin is a terminal.
constexpr double kConfirmRunAbove_s = 600;

// The predicted wall time of `iterations` iterations of `as_run` (the plan with its compute
// scaled as the run scales it): the analytic estimate on the plan's cluster; on the cpu back
// end at least the run's FLOPs over this host's measured sgemm rate on as many cores as there
// are devices to share them.
double predicted_run_wall_s(const partition::Plan& as_run, int iterations, const std::string& backend,
                            const partition::CostModel& cost);

// Says the prediction on stderr when it is a terminal; when stdin is a terminal, the run is
// predicted past kConfirmRunAbove_s and `confirmed` (--yes) is false, throws an InputError
// naming --yes instead of starting it.
void confirm_run(double predicted_s, int iterations, bool confirmed);

}  // namespace hetflow::tools
