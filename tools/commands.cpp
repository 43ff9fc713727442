// The table of subcommands. A new command is one cmd_*.cpp file plus one line here.
#include "tools/cli.hpp"

namespace hetflow::tools {

int run_list(const std::vector<std::string>& args, std::ostream& out);
int run_describe(const std::vector<std::string>& args, std::ostream& out);
int run_plan(const std::vector<std::string>& args, std::ostream& out);
int run_validate(const std::vector<std::string>& args, std::ostream& out);
int run_simulate(const std::vector<std::string>& args, std::ostream& out);
int run_run(const std::vector<std::string>& args, std::ostream& out);

const std::vector<Command>& commands() {
  static const std::vector<Command> list = {
      {"list", "list the built-in clusters, networks and GPU types", run_list},
      {"describe", "summarise a cluster and a network: devices, peaks, links, parameters, FLOPs", run_describe},
      {"plan", "build a plan (layout, schedule, sync), validate it, print its grid and estimate", run_plan},
      {"validate", "check a plan file: transfers, deadlock, layer coverage, memory", run_validate},
      {"simulate", "run a plan on a SimGrid model of the cluster; metrics and a trace", run_simulate},
      {"run", "execute a plan (cpu back end: threads, proxy compute); measured vs estimated, a trace", run_run},
  };
  return list;
}

}  // namespace hetflow::tools
