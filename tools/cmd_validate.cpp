// hetflow validate: check a plan file before anything runs it.
#include <ostream>

#include "model/error.hpp"
#include "partition/estimate.hpp"
#include "partition/validate.hpp"
#include "tools/cli.hpp"
#include "tools/plan_options.hpp"
#include "tools/plan_summary.hpp"

namespace hetflow::tools {

void validate_options(po::options_description& options) {
  options.add_options()
      ("plan", po::value<std::string>()->required(), "plan JSON written by `hetflow plan --out` (or give it as the argument)")
      ("calibration", po::value<std::string>(), "calibration YAML for the estimate");
}

int run_validate(const std::vector<std::string>& args, std::ostream& out) {
  po::options_description options("validate options");
  po::variables_map vm;
  if (!parse_command_options("validate", args, options, vm, out)) return 0;
  const std::string path = vm["plan"].as<std::string>();
  const partition::Plan plan = read_plan_file(path, "--plan");
  const partition::Validation v = partition::validate_plan(plan);
  if (!v.ok()) {
    if (vm.count("json")) {
      print_json(out, Json{{"valid", false}, {"problems", v.problems}});
      return 3;
    }
    partition::require_valid(plan);  // throws with every problem named
  }
  const partition::CostModel cost(plan.cluster, plan.layout.precision, read_calibration_option(vm, plan.cluster));
  const partition::Estimate estimate = partition::estimate_plan(plan, cost);
  if (vm.count("json")) {
    Json j = estimate_json(plan, estimate);
    j["valid"] = true;
    j["fingerprint"] = plan.fingerprint;
    print_json(out, j);
    return 0;
  }
  out << path << ": valid, plan " << plan.fingerprint << " (" << plan.tasks.size() << " tasks per iteration x "
      << plan.iterations() << "; channels matched, tensors live until their last reader, no deadlock, every layer "
      << "once, memory fits)\n\n";
  print_layout(out, plan);
  out << "\n";
  print_estimate(out, plan, estimate);
  return 0;
}

}  // namespace hetflow::tools
