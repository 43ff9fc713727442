#pragma once
// What every `hetflow` subcommand shares: its signature, option parsing, and output helpers.
#include <iosfwd>
#include <string>
#include <vector>

#include <boost/program_options.hpp>
#include <nlohmann/json.hpp>

namespace hetflow::tools {

using Json = nlohmann::ordered_json;
namespace po = boost::program_options;

// A subcommand gets its own arguments (after the command name) and writes to `out`.
// It returns the process exit status; errors are thrown (hetflow::Error) and mapped by main.
struct Command {
  const char* name;
  const char* summary;
  int (*run)(const std::vector<std::string>& args, std::ostream& out);
};

const std::vector<Command>& commands();

// Parses args against `options` (plus --help and --json, added here) and the positional
// arguments, if any. Returns false when --help was given (usage already printed to out,
// whatever else is missing or wrong). Throws InputError on bad options.
bool parse_options(const std::string& command, const std::string& usage, po::options_description& options,
                   const std::vector<std::string>& args, po::variables_map& vm, std::ostream& out,
                   const po::positional_options_description* positional = nullptr);

void print_json(std::ostream& out, const Json& j);

}  // namespace hetflow::tools
