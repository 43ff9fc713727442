// hetflow describe: what a cluster and a network amount to, before any plan.
#include <ostream>

#include "model/io.hpp"
#include "tools/cli.hpp"
#include "tools/options.hpp"
#include "tools/summary.hpp"

namespace hetflow::tools {

void describe_options(po::options_description& options) { add_cluster_model_options(options); }

int run_describe(const std::vector<std::string>& args, std::ostream& out) {
  po::options_description options("describe options");
  po::variables_map vm;
  if (!parse_command_options("describe", args, options, vm, out)) return 0;
  const model::Cluster cluster = load_cluster_option(vm);
  const model::Network network = load_network_option(vm);
  if (vm.count("json")) {
    print_json(out, Json{{"cluster", cluster_json(cluster)}, {"network", network_json(network)}});
    return 0;
  }
  print_cluster(out, cluster);
  out << "\n";
  print_network(out, network);
  return 0;
}

}  // namespace hetflow::tools
