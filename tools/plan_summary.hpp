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
// Where the cluster has an input path: the loader's closed-form rate (partition/loading.hpp)
// against what the GPUs could take, `compute_samples_per_s`; one line, "input-bound: ..." when
// the loader is the slower. Nothing (text) or null (JSON) without load tasks.
void print_input_bound(std::ostream& out, const partition::Plan& plan, double compute_samples_per_s);
// Offload: per node (at most 8), the host memory its devices' optimizer state takes, of its own.
void print_host_memory(std::ostream& out, const partition::Plan& plan);
Json input_bound_json(const partition::Plan& plan, double compute_samples_per_s);

}  // namespace hetflow::tools
