// hetflow validate: check a plan file before anything runs it.
#include <fstream>
#include <ostream>
#include <sstream>

#include "model/error.hpp"
#include "model/io.hpp"
#include "partition/estimate.hpp"
#include "partition/plan_io.hpp"
#include "partition/validate.hpp"
#include "tools/cli.hpp"
#include "tools/plan_options.hpp"
#include "tools/plan_summary.hpp"

namespace hetflow::tools {

int run_validate(const std::vector<std::string>& args, std::ostream& out) {
  po::options_description options("validate options");
  options.add_options()
      ("plan", po::value<std::string>()->required(), "plan JSON written by `hetflow plan --out`")
      ("calibration", po::value<std::string>(), "calibration YAML for the estimate");
  po::positional_options_description positional;
  po::variables_map vm;
  if (!parse_options("validate", "--plan plan.json [--json]", options, args, vm, out)) return 0;
  const std::string path = vm["plan"].as<std::string>();
  std::ifstream in(path);
  if (!in) throw InputError(path, 0, "--plan", "cannot be read");
  std::stringstream text;
  text << in.rdbuf();
  const partition::Plan plan = partition::read_plan_json(text.str(), path);
  const partition::Validation v = partition::validate_plan(plan);
  if (!v.ok()) {
    if (vm.count("json")) {
      print_json(out, Json{{"valid", false}, {"problems", v.problems}});
      return 3;
    }
    partition::require_valid(plan);  // throws with every problem named
  }
  const model::Cluster cluster = model::parse_cluster(plan.cluster_yaml, path + " (cluster)");
  const partition::CostModel cost(cluster, plan.layout.precision, read_calibration_option(vm));
  const partition::Estimate estimate = partition::estimate_plan(plan, cost);
  if (vm.count("json")) {
    Json j = estimate_json(plan, estimate, 1);
    j["valid"] = true;
    print_json(out, j);
    return 0;
  }
  out << path << ": valid (" << plan.tasks.size() << " tasks; transfers matched, no deadlock, every layer once, "
      << "memory fits)\n\n";
  print_layout(out, plan);
  out << "\n";
  print_estimate(out, plan, estimate, 1);
  return 0;
}

}  // namespace hetflow::tools
