#include "tools/cli.hpp"

#include <ostream>

#include "model/error.hpp"

namespace hetflow::tools {

bool parse_options(const std::string& command, const std::string& usage, po::options_description& options,
                   const std::vector<std::string>& args, po::variables_map& vm, std::ostream& out,
                   const po::positional_options_description* positional) {
  options.add_options()
      ("json", "print the summary as one JSON object on stdout instead of tables")
      ("help,h", "show this help");
  try {
    po::command_line_parser parser(args);
    parser.options(options);
    // Without a positional description Boost keeps stray arguments and store() drops them:
    // `hetflow plan 4` would plan as if the 4 were not there. An empty one refuses them.
    const po::positional_options_description none;
    parser.positional(positional != nullptr ? *positional : none);
    po::store(parser.run(), vm);
    // --help wins over everything, required options included (notify would refuse them).
    if (vm.count("help")) {
      out << "usage: hetflow " << command << " " << usage << "\n\n" << options << "\n";
      return false;
    }
    po::notify(vm);
  } catch (const po::error& e) {
    throw InputError("<command line>", 0, "hetflow " + command, e.what());
  }
  return true;
}

void print_json(std::ostream& out, const Json& j) { out << j.dump(2) << "\n"; }

}  // namespace hetflow::tools
