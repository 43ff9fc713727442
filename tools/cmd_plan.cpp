// hetflow plan: build a plan, validate it, print its grid and analytic estimate, write it.
#include <fstream>
#include <ostream>

#include "model/error.hpp"
#include "partition/estimate.hpp"
#include "partition/plan_io.hpp"
#include "partition/validate.hpp"
#include "tools/cli.hpp"
#include "tools/plan_options.hpp"
#include "tools/plan_summary.hpp"

namespace hetflow::tools {

void plan_command_options(po::options_description& options) {
  add_plan_options(options);
  options.add_options()
      ("out,o", po::value<std::string>(), "write the plan JSON here")
      ("grid", "print each device's compute order");
}

int run_plan(const std::vector<std::string>& args, std::ostream& out) {
  po::options_description options("plan options");
  po::variables_map vm;
  if (!parse_command_options("plan", args, options, vm, out)) return 0;

  Planned p = plan_from_options(vm);
  require_valid_or_advise(p.plan, vm);  // throws PlanError: exit 3 with every problem named
  const partition::CostModel cost(p.cluster, p.network.precision, read_calibration_option(vm, p.cluster));
  const partition::Estimate estimate = partition::estimate_plan(p.plan, cost);
  if (vm.count("out")) {
    const std::string path = vm["out"].as<std::string>();
    std::ofstream file(path);
    if (!file) throw InputError(path, 0, "--out", "cannot be written");
    file << partition::write_plan_json(p.plan);
  }
  if (vm.count("json")) {
    Json j = estimate_json(p.plan, estimate);
    j["fingerprint"] = p.plan.fingerprint;
    if (vm.count("out")) j["plan_file"] = vm["out"].as<std::string>();
    print_json(out, j);
    return 0;
  }
  print_layout(out, p.plan);
  if (vm.count("grid")) out << "\n" << partition::plan_grid(p.plan);
  out << "\n";
  print_estimate(out, p.plan, estimate);
  if (vm.count("out")) out << "\nwrote " << vm["out"].as<std::string>() << " (" << p.plan.tasks.size() << " tasks)\n";
  return 0;
}

}  // namespace hetflow::tools
