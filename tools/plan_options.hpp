#pragma once
// The options of `hetflow plan` (Megatron's vocabulary), shared with later commands that
// build a plan themselves (simulate, run, search).
#include <optional>

#include "partition/cost_model.hpp"
#include "partition/plan.hpp"
#include "partition/policy.hpp"
#include "tools/cli.hpp"

namespace hetflow::tools {

// Which command takes the options: simulate runs 3 iterations unless told (the first is
// warm-up); run measures --steps after --warmup and runs every device, so it takes neither
// --iterations nor --fold.
enum class PlanCommand { plan, simulate, run };
void add_plan_options(po::options_description& options, PlanCommand command = PlanCommand::plan);
partition::PlanOptions read_plan_options(const po::variables_map& vm);
// --calibration, its GPU type names resolved against the cluster (an unknown name is an
// error naming the file); the defaults without the option.
model::Calibration read_calibration_option(const po::variables_map& vm, const model::Cluster& cluster);

// The most tasks a plan (one iteration) or a simulation (all iterations) may hold: --max-tasks.
constexpr long long kDefaultMaxTasks = 10'000'000;
long long read_max_tasks(const po::variables_map& vm);
// Megatron's kernel options (--use-flash-attn, --no-masked-softmax-fusion,
// --no-bias-gelu-fusion, --no-bias-dropout-fusion): the plan's layout.kernels.
void add_kernel_options(po::options_description& options);
partition::KernelOptions read_kernel_options(const po::variables_map& vm);

// Everything a command needs after planning.
struct Planned {
  model::Cluster cluster;
  model::Network network;
  partition::Plan plan;
};
// Cluster + network + options -> plan (not yet validated), its fingerprint set. `fold`, when
// given, replaces --fold.
Planned plan_from_options(const po::variables_map& vm, std::optional<bool> fold = std::nullopt);

// Validates a plan made from the options (PlanError: exit 3 with every problem named). When
// it overflows device memory, the error also says which nearby options would fit
// (partition::what_would_fit), fastest first.
void require_valid_or_advise(const partition::Plan& plan, const po::variables_map& vm);

// Reads a plan file (named by `option` in errors) with its fingerprint set.
partition::Plan read_plan_file(const std::string& path, const std::string& option);

}  // namespace hetflow::tools
