#pragma once
// How a plan and its analytic estimate are shown: text tables or the --json object.
#include <iosfwd>

#include "model/network.hpp"
#include "partition/estimate.hpp"
#include "partition/plan.hpp"
#include "tools/cli.hpp"

namespace hetflow::tools {

void print_layout(std::ostream& out, const partition::Plan& plan);
void print_estimate(std::ostream& out, const partition::Plan& plan, const partition::Estimate& estimate);
Json estimate_json(const partition::Plan& plan, const partition::Estimate& estimate);

}  // namespace hetflow::tools
