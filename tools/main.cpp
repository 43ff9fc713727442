// hetflow: plan, simulate and execute training on heterogeneous GPU clusters.
// Exit status: 0 success, 2 bad input (file, option, spec), 3 a plan that cannot run,
// 4 a run that did not complete (a simulated fault, an executed run that failed or stalled),
// 1 anything else.
#include <algorithm>
#include <exception>
#include <new>
#include <iostream>
#include <string>
#include <vector>

#include "exec/ranks.hpp"
#include "kernels/matmul.hpp"
#include "model/error.hpp"
#include "partition/plan.hpp"
#include "sim/simulator.hpp"
#include "tools/cli.hpp"
#include "tools/options.hpp"

namespace {

void print_usage(std::ostream& out) {
  out << "hetflow: plan, simulate and execute deep-learning training on heterogeneous GPU clusters\n\n"
         "usage: hetflow <command> [options]     (hetflow <command> --help for its options)\n\n"
         "commands:\n";
  size_t width = 0;  // the longest name, and two spaces
  for (const auto& c : hetflow::tools::commands()) width = std::max(width, std::string(c.name).size() + 2);
  for (const auto& c : hetflow::tools::commands()) {
    std::string name = c.name;
    name.resize(width, ' ');
    out << "  " << name << c.summary << "\n";
  }
  out << "\nEvery command takes --json to print its summary as one JSON object; hetflow --version says\n"
         "which build this is.\n";
}

// What this build is: the version, the plan format it reads and writes, and its back ends.
void print_version(std::ostream& out) {
  out << "hetflow " << HETFLOW_VERSION << " (plan format " << hetflow::partition::Plan::kFormatVersion << ", "
      << hetflow::sim::engine_version() << ", CUDA "
      << (hetflow::kernels::cuda_built() ? "built" : "not built: nvcc was not found at configure time") << ")\n";
}

// Runs one command; an error it throws becomes its message on stderr and an exit status
// (`threw` then set).
int run_command(const std::string& name, const std::vector<std::string>& args, bool& threw) {
  threw = true;
  try {
    for (const auto& c : hetflow::tools::commands()) {
      if (name != c.name) continue;
      const int status = c.run(args, std::cout);
      threw = false;
      return status;
    }
    threw = false;
    std::vector<std::string> names;
    for (const auto& c : hetflow::tools::commands()) names.push_back(c.name);
    const std::string hint = hetflow::tools::did_you_mean(name, names);
    std::cerr << "hetflow: unknown command '" << name << "'" << hint << "\n";
    if (hint.empty()) {
      std::cerr << "\n";
      print_usage(std::cerr);
    } else {
      std::cerr << "(hetflow --help lists the commands)\n";
    }
    return 2;
  } catch (const hetflow::InputError& e) {
    std::cerr << "hetflow: " << hetflow::tools::as_command_line_error(e).what() << "\n";
    return 2;
  } catch (const hetflow::PlanError& e) {
    std::cerr << "hetflow: plan cannot run: " << e.what() << "\n";
    return 3;
  } catch (const std::bad_alloc&) {
    std::cerr << "hetflow: out of memory: the request needs more memory than this process may use "
                 "(see ulimit -v); make it smaller\n";
    return 1;
  } catch (const hetflow::Error& e) {
    std::cerr << "hetflow: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    // Not one of hetflow's own errors: a bug. Say so rather than pass a library's words on.
    std::cerr << "hetflow: internal error (please report it): " << e.what() << "\n";
    return 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    print_usage(std::cout);
    return args.empty() ? 2 : 0;
  }
  if (args[0] == "--version" || args[0] == "version") {
    print_version(std::cout);
    return 0;
  }
  const std::string name = args[0];
  args.erase(args.begin());
  bool threw = false;
  const int status = run_command(name, args, threw);
  // Under mpirun an error may be one rank's alone (a path only rank 0 checks, a file its node
  // lacks, its memory): the job ends with it, as the other ranks would wait for this one.
  if (threw) hetflow::exec::Ranks::abort_job(status);
  return status;
}
