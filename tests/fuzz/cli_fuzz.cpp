// Fuzz target: the `hetflow` command line (tools::read_command_line: the command, its options
// through Boost.Program_options, and the values the command reads from them), fed one
// argument per line of the input. A --model that names a zoo network or a gpt:/llama: spec
// and a --cluster that names a built-in cluster are resolved as the command resolves them;
// files are never opened and nothing is planned or run.
#include <ostream>
#include <vector>

#include "model/io.hpp"
#include "model/zoo.hpp"
#include "tests/fuzz/fuzz_check.hpp"
#include "tools/cli.hpp"
#include "tools/options.hpp"

namespace {

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> args;
  size_t begin = 0;
  while (begin <= text.size()) {
    size_t end = text.find('\n', begin);
    if (end == std::string::npos) end = text.size();
    args.push_back(text.substr(begin, end - begin));
    begin = end + 1;
  }
  if (!args.empty() && args.back().empty()) args.pop_back();  // a final line end ends the last argument
  return args;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace hetflow;
  const std::string text = fuzz::text_of(data, size);
  const std::vector<std::string> args = split_lines(text);
  std::ostream discard(nullptr);  // --help's usage goes nowhere
  try {
    const tools::CommandLine line = tools::read_command_line(args, discard);
    if (line.help) return 0;
    const tools::po::variables_map& vm = line.vm;
    if (vm.count("cluster")) {
      const std::string name = vm["cluster"].as<std::string>();
      for (const model::ClusterPreset& p : model::cluster_presets()) {
        if (p.name == name) (void)model::builtin_cluster(name);
      }
    }
    if (vm.count("model") && model::is_zoo_spec(vm["model"].as<std::string>())) {
      (void)model::network_from_spec(vm["model"].as<std::string>(),
                                     tools::read_precision_option(vm).value_or(model::Precision::fp16));
    }
  } catch (const InputError& e) {
    // From the options: "<command line>: --option: ..."; from a zoo spec: "<spec '...'>: field: ...".
    const bool spec = e.file().rfind("<spec", 0) == 0;
    fuzz::check_refusal(e, spec ? e.file() : std::string("<command line>"), text);
  }
  return 0;
}
