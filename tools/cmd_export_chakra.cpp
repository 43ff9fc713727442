// hetflow export-chakra: a plan file as Chakra execution traces (traces/chakra.hpp), one
// file per device and ASTRA-sim's comm_group.json, in a directory.
#include <filesystem>
#include <fstream>
#include <ostream>

#include "model/error.hpp"
#include "partition/validate.hpp"
#include "tools/cli.hpp"
#include "tools/plan_options.hpp"
#include "traces/chakra.hpp"

namespace hetflow::tools {

void export_chakra_options(po::options_description& options) {
  options.add_options()
      ("plan", po::value<std::string>()->required(), "the plan file to export")
      ("out,o", po::value<std::string>()->required(), "the directory to write (created when missing)")
      ("prefix", po::value<std::string>()->default_value("hetflow"), "file names <prefix>.<rank>.et")
      ("calibration", po::value<std::string>(), "calibration YAML: the compute nodes' duration_micros follow it");
}

int run_export_chakra(const std::vector<std::string>& args, std::ostream& out) {
  po::options_description options("export-chakra options");
  po::variables_map vm;
  if (!parse_command_options("export-chakra", args, options, vm, out)) return 0;
  const partition::Plan plan = read_plan_file(vm["plan"].as<std::string>(), "--plan");
  partition::require_valid(plan);
  const std::string prefix = vm["prefix"].as<std::string>();
  if (prefix.empty() || prefix.find_first_of("/\\") != std::string::npos || prefix == "." || prefix == "..") {
    throw InputError("<command line>", 0, "--prefix", "expected a file name without a directory, found '" + prefix + "'");
  }
  const partition::CostModel cost(plan.cluster, plan.layout.precision, read_calibration_option(vm, plan.cluster));
  const std::vector<traces::ChakraFile> files = traces::write_chakra(plan, cost, prefix);

  const std::filesystem::path dir = vm["out"].as<std::string>();
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (!std::filesystem::is_directory(dir, ec)) throw InputError(dir.string(), 0, "--out", "is not a directory and cannot be made one");
  // A node per task, and a pass with in-task collectives two more per message: a collective
  // node and the part of its work after it.
  size_t nodes = plan.tasks.size();
  for (size_t t = 0; t < plan.tasks.size(); ++t) nodes += 2 * plan.inside(static_cast<int>(t)).size();
  size_t bytes = 0;
  for (const traces::ChakraFile& f : files) {
    const std::filesystem::path path = dir / f.name;
    std::ofstream file(path, std::ios::binary);
    if (!(file << f.bytes) || !file.flush()) throw InputError(path.string(), 0, "--out", "cannot be written");
    bytes += f.bytes.size();
  }
  if (vm.count("json")) {
    Json names = Json::array();
    for (const traces::ChakraFile& f : files) names.push_back(f.name);
    print_json(out, Json{{"directory", dir.string()}, {"files", names}, {"ranks", files.size() - 1},
                         {"tasks", plan.tasks.size()}, {"nodes", nodes}, {"bytes", bytes}, {"fingerprint", plan.fingerprint}});
    return 0;
  }
  out << "wrote " << plan.network.name << " on " << plan.cluster.name << " as Chakra execution traces (schema 0.0.4): "
      << files.size() - 1 << " ranks, " << nodes << " nodes, " << bytes << " bytes in " << dir.string() << "/\n"
      << "  " << prefix << ".0.et ... " << prefix << "." << files.size() - 2 << ".et, comm_group.json"
      << " (ASTRA-sim: --workload-configuration=" << (dir / prefix).string()
      << " --comm-group-configuration=" << (dir / "comm_group.json").string() << ")\n"
      << "  read back with --model chakra:" << dir.string() << " on plan, simulate or run\n";
  return 0;
}

}  // namespace hetflow::tools
