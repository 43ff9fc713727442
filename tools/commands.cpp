// The table of subcommands. A new command is one cmd_*.cpp file plus one line here.
#include <ostream>

#include "model/error.hpp"
#include "tools/cli.hpp"
#include "tools/options.hpp"
#include "tools/plan_options.hpp"

namespace hetflow::tools {

void list_options(po::options_description& options);
void describe_options(po::options_description& options);
void plan_command_options(po::options_description& options);
void validate_options(po::options_description& options);
void simulate_options(po::options_description& options);
void run_options(po::options_description& options);
void replay_options(po::options_description& options);
void timeline_options(po::options_description& options);
void calibrate_options(po::options_description& options);
void export_chakra_options(po::options_description& options);
void check_timeline_options(const po::variables_map& vm);  // --iterations, --width as timeline reads them
int run_list(const std::vector<std::string>& args, std::ostream& out);
int run_describe(const std::vector<std::string>& args, std::ostream& out);
int run_plan(const std::vector<std::string>& args, std::ostream& out);
int run_validate(const std::vector<std::string>& args, std::ostream& out);
int run_simulate(const std::vector<std::string>& args, std::ostream& out);
int run_run(const std::vector<std::string>& args, std::ostream& out);
int run_replay(const std::vector<std::string>& args, std::ostream& out);
int run_timeline(const std::vector<std::string>& args, std::ostream& out);
int run_calibrate(const std::vector<std::string>& args, std::ostream& out);
int run_export_chakra(const std::vector<std::string>& args, std::ostream& out);
void search_options(po::options_description& options);
void export_launch_options(po::options_description& options);
int run_export_launch(const std::vector<std::string>& args, std::ostream& out);
int run_search(const std::vector<std::string>& args, std::ostream& out);
void campaign_options(po::options_description& options);
int run_campaign(const std::vector<std::string>& args, std::ostream& out);

const std::vector<Command>& commands() {
  static const std::vector<Command> list = {
      {"list", "list the built-in clusters, networks and GPU types", "[--json]", nullptr, list_options, run_list},
      {"describe", "summarise a cluster and a network: devices, peaks, links, parameters, FLOPs",
       "[--cluster C] [--model M] [--precision P] [--json]", nullptr, describe_options, run_describe},
      {"plan", "build a plan (layout, schedule, sync), validate it, print its grid and estimate",
       "[options] [--out plan.json] [--grid] [--json]", nullptr, plan_command_options, run_plan},
      {"validate", "check a plan file: transfers, deadlock, layer coverage, memory, GPU copy reuse",
       "[--plan] plan.json [--json]",
       "plan", validate_options, run_validate},
      {"simulate", "run a plan on a SimGrid model of the cluster; metrics and a trace",
       "[plan options | --plan plan.json] [--trace t.csv] [--chrome t.json] [--json]", nullptr, simulate_options,
       run_simulate},
      {"run", "execute a plan (cpu: threads or mpirun ranks; cuda: GPUs and NCCL; real or proxy math); measured vs predicted",
       "[plan options | --plan plan.json] [--backend cpu|cuda] [--steps N] [--warmup W] [--json]", nullptr, run_options,
       run_run},
      {"replay", "simulate a trace's plan with its measured compute times; replayed vs measured iteration time",
       "TRACE --plan plan.json [--trace replayed.csv] [--json]", "trace-file", replay_options, run_replay},
      {"timeline", "draw a trace as an SVG picture: the schedule per device, or --utilization",
       "[--trace] t.csv -o timeline.svg [--utilization] [--iterations A:B] [--width PX]", "trace", timeline_options,
       run_timeline},
      {"calibrate", "fit efficiencies, overheads, dispatch and link factors to measured traces or step times; write a calibration",
       "TRACE... --plan plan.json... | --measured runs.csv; -o calibration.yaml [--calibration prior.yaml] [--json]", "trace",
       calibrate_options, run_calibrate, -1},
      {"export-chakra", "write a plan as Chakra execution traces (one file per device, as ASTRA-sim reads them)",
       "[--plan] plan.json -o DIR [--prefix NAME] [--calibration FILE]", "plan", export_chakra_options,
       run_export_chakra},
      {"search", "find the best plan: candidates scored analytically, the best re-simulated, baselines beside",
       "[--cluster C] [--model M] --global-batch B [--top K] [--out plan.json] [--out-layout layout.yaml] [--json]",
       nullptr, search_options, run_search},
      {"campaign", "a whole training run over days: failures, checkpoints, stragglers, fault tolerance, cost",
       "[plan options | --plan plan.json] --tokens N | --steps N | --duration D [--json] [--svg FILE]", nullptr,
       campaign_options, run_campaign},
      {"export-launch", "print the launch command and config of Megatron-LM, DeepSpeed or torchtitan for a plan",
       "--framework megatron|deepspeed|torchtitan [plan options | --plan plan.json] [--json]", nullptr,
       export_launch_options, run_export_launch},
  };
  return list;
}

namespace {
const Command* find_command(const std::string& name) {
  for (const Command& c : commands()) {
    if (name == c.name) return &c;
  }
  return nullptr;
}
}  // namespace

bool parse_command_options(const std::string& name, const std::vector<std::string>& args,
                           po::options_description& options, po::variables_map& vm, std::ostream& out) {
  const Command* command = find_command(name);
  if (command == nullptr) {
    std::vector<std::string> names;
    for (const Command& c : commands()) names.push_back(c.name);
    throw InputError("<command line>", 0, "command", "unknown command '" + name + "'" + did_you_mean(name, names));
  }
  command->options(options);
  po::positional_options_description positional;
  if (command->positional != nullptr) positional.add(command->positional, command->positional_count);
  return parse_options(name, command->usage, options, args, vm, out,
                       command->positional != nullptr ? &positional : nullptr);
}

CommandLine read_command_line(const std::vector<std::string>& args, std::ostream& out) {
  CommandLine line;
  if (args.empty()) throw InputError("<command line>", 0, "command", "expected a command");
  line.command = args[0];
  const std::vector<std::string> rest(args.begin() + 1, args.end());
  po::options_description options(line.command + " options");
  line.help = !parse_command_options(line.command, rest, options, line.vm, out);
  if (line.help) return line;
  const bool plans = line.command == "plan" || line.command == "simulate";
  if (line.command == "simulate") {
    (void)read_max_tasks(line.vm);
  }
  if (plans && !line.vm.count("plan")) (void)read_plan_options(line.vm);
  if (line.vm.count("precision")) (void)read_precision_option(line.vm);
  if (line.command == "timeline") check_timeline_options(line.vm);
  return line;
}

}  // namespace hetflow::tools
