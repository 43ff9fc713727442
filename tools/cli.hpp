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
// Its options are described apart from running it, so that the command line can be read
// and checked without running anything (read_command_line).
struct Command {
  const char* name;
  const char* summary;
  const char* usage;        // after "hetflow <name> " in --help
  const char* positional;   // the option a lone argument gives (validate's plan file), or nullptr
  void (*options)(po::options_description& options);  // adds the command's own options
  int (*run)(const std::vector<std::string>& args, std::ostream& out);
  int positional_count = 1;  // lone arguments the positional option takes (-1: any number)
};

const std::vector<Command>& commands();

// Parses args as command `name` does: its options (Command::options, added to `options`)
// and positional argument, through parse_options. Returns false after --help.
bool parse_command_options(const std::string& name, const std::vector<std::string>& args,
                           po::options_description& options, po::variables_map& vm, std::ostream& out);

// The command line as `hetflow` reads it, stopped before anything is loaded or run: the
// command named by args[0], its options parsed as it parses them, and the values it reads
// from them checked as it checks them (the plan options, --precision, --max-tasks,
// simulate's default --iterations). Files are not opened, networks not built, nothing is
// planned or simulated. Throws InputError, as the command would; `help` is true after
// --help (usage printed to out). The command line's fuzz target calls this.
struct CommandLine {
  std::string command;
  po::variables_map vm;
  bool help = false;
};
CommandLine read_command_line(const std::vector<std::string>& args, std::ostream& out);

// Parses args against `options` (plus --help and --json, added here) and the positional
// arguments, if any. Returns false when --help was given (usage already printed to out,
// whatever else is missing or wrong). Throws InputError on bad options.
bool parse_options(const std::string& command, const std::string& usage, po::options_description& options,
                   const std::vector<std::string>& args, po::variables_map& vm, std::ostream& out,
                   const po::positional_options_description* positional = nullptr);

// "; did you mean 'simulate'?" when one of `known` is a likely misspelling of `given` (a few
// edits away, as git and cargo suggest), else "".
std::string did_you_mean(const std::string& given, const std::vector<std::string>& known);

void print_json(std::ostream& out, const Json& j);
// Writes `text` to `path`, whole or not at all (exec/atomic_file.hpp); an InputError naming
// the option that gave the path otherwise.
void write_file(const std::string& path, const std::string& text, const std::string& option);
// Throws that InputError now when `path` surely cannot be written (its folder missing or not
// writable, or it is a folder), for commands that would otherwise find out after their work.
void check_writable(const std::string& path, const std::string& option);
// The same for a folder the command writes whole (a training checkpoint): its parent must be
// a writable folder, and it a folder if it exists.
void check_writable_folder(const std::string& path, const std::string& option);

// A figure against the one it is compared with: (value - reference) / reference; NaN where
// the reference is 0 and the value is not (nothing to compare with), 0 where both are.
double relative_error(double value, double reference);
// A signed percentage of a fraction ("+12.3 %", `digits` after the point); "-" for NaN, which
// --json writes as null.
std::string signed_percent(double fraction, int digits = 1);

}  // namespace hetflow::tools
