// hetflow validate: check a plan file before anything runs it.
#include <ostream>

#include "exec/copy_reuse.hpp"
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
      print_json(out, Json{{"valid", false}, {"problem_count", v.count()}, {"problems", v.problems}, {"unlisted", v.unlisted}});
      return 3;
    }
    partition::require_valid(plan);  // throws with every problem named
  }
  const partition::CostModel cost(plan.cluster, plan.layout.precision, read_calibration_option(vm, plan.cluster));
  const partition::Estimate estimate = partition::estimate_plan(plan, cost);
  // Not a fault of the plan as such: the cpu back end gives each instance its own buffer. The
  // cuda back end's real math keeps one device copy per tensor and refuses a plan with any.
  const auto hazards = exec::copy_reuse_hazards(
      plan, [&](int tensor) { return exec::one_device_copy_under_real_math(plan, tensor); });
  if (vm.count("json")) {
    Json j = estimate_json(plan, estimate);
    j["valid"] = true;
    j["fingerprint"] = plan.fingerprint;
    Json examples = Json::array();
    for (size_t k = 0; k < hazards.size() && k < 3; ++k) examples.push_back(exec::describe(plan, hazards[k]));
    j["copy_reuse_hazards"] = hazards.size();
    j["copy_reuse_examples"] = std::move(examples);
    print_json(out, j);
    return 0;
  }
  out << path << ": valid, plan " << plan.fingerprint << " (" << plan.tasks.size() << " tasks per iteration x "
      << plan.iterations() << "; channels matched, tensors live until their last reader, no deadlock, every layer "
      << "once, memory fits)\n";
  if (hazards.empty()) {
    out << "  one device copy per tensor (the cuda back end's real math): safe, every read of an iteration is "
           "ordered before the next iteration's write\n\n";
  } else {
    out << "  one device copy per tensor (the cuda back end's real math): " << hazards.size()
        << " read(s) not ordered before the next iteration's write, so `run --backend cuda` refuses it with real "
           "math (`--compute real`, or `auto` on a decoder; the cpu back end and proxies run it); first: "
        << exec::describe(plan, hazards[0]) << "\n\n";
  }
  print_layout(out, plan);
  out << "\n";
  print_estimate(out, plan, estimate);
  return 0;
}

}  // namespace hetflow::tools
