#include "tools/chakra_files.hpp"

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>

#include "model/error.hpp"
#include "partition/plan_io.hpp"
#include "tools/options.hpp"
#include "tools/plan_options.hpp"
#include "traces/chakra.hpp"

namespace hetflow::tools {

namespace {

constexpr const char* kPrefix = "chakra:";

std::string slurp(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path.string(), 0, "file", "cannot be read");
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

bool is_chakra_model(const std::string& model) { return model.rfind(kPrefix, 0) == 0; }

partition::Plan plan_from_chakra(const po::variables_map& vm) {
  const std::string model = vm["model"].as<std::string>();
  const std::filesystem::path dir = model.substr(std::string(kPrefix).size());
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    throw InputError(dir.string(), 0, "--model", "chakra: names a directory of <prefix>.<rank>.et files; this is none");
  }
  // The trace fixes every task: the options that would shape a plan do not apply.
  po::options_description plan_options;
  add_plan_options(plan_options);
  for (const auto& option : plan_options.options()) {
    const std::string name = option->long_name();
    const bool applies = name == "cluster" || name == "model" || name == "iterations" || name == "calibration" ||
                         name == "max-tasks";
    if (!applies && vm.count(name) && !vm[name].defaulted()) {
      throw InputError("<command line>", 0, "--" + name,
                       "a Chakra workload (--model " + model + ") fixes every task; give no layout options with it");
    }
  }
  const std::regex file_name(R"((.+)\.([0-9]+)\.et)");
  std::map<int, traces::ChakraFile> ranks;
  std::string prefix;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    std::smatch m;
    const std::string leaf = entry.path().filename().string();
    if (!entry.is_regular_file() || !std::regex_match(leaf, m, file_name)) continue;
    if (!prefix.empty() && m[1] != prefix) {
      throw InputError(entry.path().string(), 0, "--model",
                       "two traces in one directory (" + prefix + ".*.et and " + m[1].str() + ".*.et)");
    }
    prefix = m[1];
    if (m[2].length() > 7) throw InputError(entry.path().string(), 0, "rank", "a rank beyond 10 million");
    ranks[std::stoi(m[2])] = {entry.path().string(), slurp(entry.path())};
  }
  if (ec) throw InputError(dir.string(), 0, "--model", "cannot be listed: " + ec.message());
  std::vector<traces::ChakraFile> files;
  for (const auto& [rank, file] : ranks) {
    if (rank != static_cast<int>(files.size())) {
      throw InputError((dir / (prefix + "." + std::to_string(files.size()) + ".et")).string(), 0, "rank",
                       "missing: the ranks must be 0 to " + std::to_string(ranks.rbegin()->first) + " without a gap");
    }
    files.push_back(file);
  }
  const std::filesystem::path groups = dir / "comm_group.json";
  const std::string group_text = std::filesystem::exists(groups, ec) ? slurp(groups) : "";
  partition::Plan plan = traces::read_chakra(files, group_text, load_cluster_option(vm), model);
  plan.layout.iterations = read_plan_options(vm).iterations;
  plan.fingerprint = partition::plan_fingerprint(plan);
  return plan;
}

}  // namespace hetflow::tools
