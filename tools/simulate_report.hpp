#pragma once
// What `hetflow simulate` prints: a simulated run (sim/simulator.hpp) with its metrics, the
// plan's analytic estimate beside it, as text or JSON.
#include <ostream>

#include "partition/estimate.hpp"
#include "partition/plan.hpp"
#include "sim/simulator.hpp"
#include "tools/cli.hpp"
#include "traces/metrics.hpp"

namespace hetflow::tools {

// The simulation's report as JSON: the figures of merit, the estimate, the loader, traffic.
Json simulate_json(const sim::SimResult& result, const traces::Metrics& m, const partition::Estimate& analytic,
                   const partition::Plan& plan);

// The same as text: the layout that ran, then the figures of merit with their formulas.
void print_simulation(std::ostream& out, const sim::SimResult& result, const traces::Metrics& m,
                      const partition::Estimate& analytic, const partition::Plan& plan);

}  // namespace hetflow::tools
