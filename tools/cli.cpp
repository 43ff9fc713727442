#include "tools/cli.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iomanip>
#include <limits>
#include <ostream>
#include <sstream>
#include <string>
#include <system_error>

#include "exec/atomic_file.hpp"
#include "model/error.hpp"
#include "model/gpu.hpp"

namespace hetflow::tools {

namespace {
// Boost.Program_options (1.74) builds its error messages by replacing placeholders such as
// %value% in a loop that starts over after each replacement: an argument that holds its own
// placeholder (`--pipeline %value%`) makes what() loop forever, its message growing. Such
// arguments are refused before Boost sees them.
void refuse_boost_placeholders(const std::string& command, const std::vector<std::string>& args) {
  for (const std::string& arg : args) {
    for (const char* token : {"%value%", "%option%", "%original_token%", "%canonical_option%", "%prefix%"}) {
      if (arg.find(token) != std::string::npos) {
        throw InputError("<command line>", 0, "hetflow " + command,
                         "an argument holds '" + std::string(token) +
                             "', which the option parser cannot quote in its messages; leave it out");
      }
    }
  }
}

// The long names of `options` ("--pipeline").
std::vector<std::string> option_names(const po::options_description& options) {
  std::vector<std::string> names;
  for (const auto& o : options.options()) names.push_back("--" + o->long_name());
  return names;
}

// What to use instead of an option another command takes ("" for none known).
std::string instead_of(const std::string& command, const std::string& option) {
  if (command == "run" && option == "--iterations") return " (hetflow run takes --steps and --warmup instead)";
  if (command == "run" && option == "--fold") {
    return " (folded replicas are for simulation: hetflow run runs every device)";
  }
  return "";
}
}  // namespace

bool parse_options(const std::string& command, const std::string& usage, po::options_description& options,
                   const std::vector<std::string>& args, po::variables_map& vm, std::ostream& out,
                   const po::positional_options_description* positional) {
  options.add_options()
      ("json", "print the summary as one JSON object on stdout instead of tables")
      ("help,h", "show this help");
  refuse_boost_placeholders(command, args);
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
  } catch (const po::unknown_option& e) {
    const std::string option = e.get_option_name();  // "--iterations=2" when given with '='
    const std::string name = option.substr(0, option.find('='));
    const std::string instead = instead_of(command, name);
    throw InputError("<command line>", 0, "hetflow " + command,
                     e.what() + (instead.empty() ? did_you_mean(name, option_names(options)) : instead));
  } catch (const po::error& e) {
    throw InputError("<command line>", 0, "hetflow " + command, e.what());
  }
  return true;
}

std::string did_you_mean(const std::string& given, const std::vector<std::string>& known) {
  const std::optional<std::string> nearest = model::likely_misspelling(given, known);
  return nearest ? "; did you mean '" + *nearest + "'?" : "";
}

void print_json(std::ostream& out, const Json& j) { out << j.dump(2) << "\n"; }

void write_file(const std::string& path, const std::string& text, const std::string& option) {
  try {
    exec::AtomicFile file(path);
    file.write(text.data(), text.size());
    file.commit();
  } catch (const InputError& e) {  // (the same reason, blamed on the option that named the file)
    throw InputError(path, 0, option, e.message());
  }
}

namespace {

// `path` (what errors name) goes in `folder`, which must exist and be writable.
void check_folder_writable(const std::string& path, const std::filesystem::path& folder, const std::string& option) {
  std::error_code error;
  if (!std::filesystem::is_directory(folder, error)) {
    throw InputError(path, 0, option, "cannot be written: its folder " + folder.string() + " does not exist");
  }
  if (::access(folder.c_str(), W_OK) != 0) {
    throw InputError(path, 0, option, "cannot be written: its folder " + folder.string() + " is not writable");
  }
}

std::filesystem::path folder_of(const std::filesystem::path& p) {
  return p.has_parent_path() ? p.parent_path() : std::filesystem::path(".");
}

}  // namespace

void check_writable(const std::string& path, const std::string& option) {
  const std::filesystem::path target(path);
  check_folder_writable(path, folder_of(target), option);
  std::error_code error;
  if (std::filesystem::is_directory(target, error)) throw InputError(path, 0, option, "cannot be written: it is a folder");
}

void check_writable_folder(const std::string& path, const std::string& option) {
  const std::filesystem::path target = std::filesystem::path(path).lexically_normal();
  const std::filesystem::path named = target.filename().empty() ? target.parent_path() : target;  // ("dir/" is dir)
  check_folder_writable(path, folder_of(named), option);
  std::error_code error;
  if (std::filesystem::exists(named, error) && !std::filesystem::is_directory(named, error)) {
    throw InputError(path, 0, option, "cannot be written: it is a file, not a folder");
  }
}

double relative_error(double value, double reference) {
  if (reference > 0) return (value - reference) / reference;
  return value == 0 && reference == 0 ? 0 : std::numeric_limits<double>::quiet_NaN();
}

std::string signed_percent(double fraction, int digits) {
  if (std::isnan(fraction)) return "-";
  std::ostringstream s;
  s << std::showpos << std::fixed << std::setprecision(digits) << 100 * fraction << " %";
  return s.str();
}

}  // namespace hetflow::tools
