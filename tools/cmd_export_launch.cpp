// hetflow export-launch: a plan as the launch command and configuration of the framework the
// user already trains with, and what the framework cannot be told (tools/launch_export.hpp).
#include <algorithm>
#include <ostream>

#include "model/error.hpp"
#include "partition/plan_io.hpp"
#include "tools/cli.hpp"
#include "tools/launch_export.hpp"
#include "tools/options.hpp"
#include "tools/plan_options.hpp"

namespace hetflow::tools {

void export_launch_options(po::options_description& options) {
  add_plan_options(options);
  options.add_options()
      ("framework", po::value<std::string>()->required(), "megatron | deepspeed | torchtitan")
      ("plan", po::value<std::string>(), "a plan file (else the plan options make one)");
}

int run_export_launch(const std::vector<std::string>& args, std::ostream& out) {
  po::options_description options("export-launch options");
  po::variables_map vm;
  if (!parse_command_options("export-launch", args, options, vm, out)) return 0;
  const std::string framework = vm["framework"].as<std::string>();
  const std::vector<std::string>& frameworks = launch_frameworks();
  if (std::find(frameworks.begin(), frameworks.end(), framework) == frameworks.end()) {
    throw InputError("<command line>", 0, "--framework",
                     "expected megatron, deepspeed or torchtitan, found '" + framework + "'" + did_you_mean(framework, frameworks));
  }
  partition::Plan plan = vm.count("plan") ? read_plan_file(vm["plan"].as<std::string>(), "--plan") : plan_from_options(vm).plan;
  if (!plan.network.architecture || plan.network.architecture->encoder) {
    throw InputError("<command line>", 0, vm.count("plan") ? "--plan" : "--model",
                     "the network '" + plan.network.name + "' is not a decoder built from its architecture; the frameworks' launchers train decoders");
  }
  const Launch launch = export_launch(plan, framework);
  const LaunchGrid& g = launch.grid;
  if (vm.count("json")) {
    print_json(out, Json{{"framework", framework}, {"fingerprint", plan.fingerprint}, {"launch", launch.text}, {"cannot_express", g.cannot}});
    return 0;
  }
  out << "# " << plan.network.name << " on " << plan.cluster.name << ": data " << g.data << " x pipeline " << g.pipeline
      << " x tensor " << g.tensor << (g.context > 1 ? " x context " + std::to_string(g.context) : std::string())
      << ", plan " << plan.fingerprint << "\n" << launch.text << "\n";
  if (g.cannot.empty()) {
    out << framework << " can be told everything this plan does.\n";
  } else {
    out << "What the plan does that " << framework << " cannot be told (launched as above, it runs without them):\n";
    for (const std::string& c : g.cannot) out << "  - " << c << "\n";
  }
  return 0;
}

}  // namespace hetflow::tools
