#include "tools/plan_options.hpp"

#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/error.hpp"
#include "model/units.hpp"
#include "partition/plan_builder.hpp"
#include "partition/plan_io.hpp"
#include "tools/options.hpp"

namespace hetflow::tools {

void add_plan_options(po::options_description& options) {
  add_cluster_model_options(options);
  options.add_options()
      ("policy", po::value<std::string>()->default_value("uniform"),
       "uniform | balanced | hetpipe-np | hetpipe-ed | hetpipe-hd | hetpipe-ed-local (layout-file: see --layout)")
      ("layout", po::value<std::string>(), "your own layout: a YAML file of virtual workers and stages (policy layout-file)")
      ("tensor", po::value<int>()->default_value(1), "tensor-parallel degree t")
      ("pipeline", po::value<int>()->default_value(0), "pipeline ranks per virtual worker (uniform/balanced; default 1)")
      ("data", po::value<int>()->default_value(0), "virtual workers (data-parallel size; default: all devices used)")
      ("virtual-stages", po::value<int>()->default_value(1), "model chunks per rank (--schedule interleaved)")
      ("stage-layers", po::value<std::string>(), "layers per stage in model order, e.g. 7,7,6,10 (uniform/balanced)")
      ("micro-batch", po::value<int>()->default_value(1), "samples per micro-batch")
      ("global-batch", po::value<int>()->default_value(0), "samples per iteration over all virtual workers")
      ("microbatches", po::value<int>()->default_value(0), "micro-batches per virtual worker (default 2 x pipeline)")
      ("schedule", po::value<std::string>()->default_value("1f1b"), "gpipe | 1f1b | interleaved | 1f1b-split-w")
      ("recompute", po::value<std::string>()->default_value("none"), "none | selective | full")
      ("sequence-parallel", "sequence parallelism (with --tensor > 1)")
      ("sync", po::value<std::string>(), "allreduce | ps | wsp (default allreduce; wsp for hetpipe policies)")
      ("staleness", po::value<int>()->default_value(0), "WSP staleness bound D")
      ("allreduce", po::value<std::string>()->default_value("ring"), "ring | tree | hierarchical")
      ("bucket-size", po::value<std::string>()->default_value("25 MiB"), "gradient all-reduce bucket size")
      ("iterations", po::value<int>()->default_value(1), "training iterations in the plan")
      ("fp32-grad-accumulation", "keep fp32 gradients (Megatron's main_grad): +4 B/param")
      ("workspace", po::value<std::string>()->default_value("1 GiB"), "per-device memory reserved for workspace")
      ("calibration", po::value<std::string>(), "calibration YAML (efficiencies, link factors)");
}

namespace {
template <typename T, typename Parse>
T parse_option(const po::variables_map& vm, const char* name, Parse parse) {
  try {
    return parse(vm[name].as<std::string>());
  } catch (const std::invalid_argument& e) {
    throw InputError("<command line>", 0, std::string("--") + name, e.what());
  }
}
// "7,7,6,10" -> {7, 7, 6, 10}; sizes and sums are the policies' to check.
std::vector<int> parse_counts(const std::string& text) {
  std::vector<int> counts;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    size_t used = 0;
    int value = 0;
    try {
      value = std::stoi(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || item.find_first_not_of(' ', used) != std::string::npos) {
      throw InputError("<command line>", 0, "--stage-layers",
                       "expected layer counts separated by commas, e.g. 7,7,6,10, found '" + text + "'");
    }
    counts.push_back(value);
  }
  if (counts.empty()) throw InputError("<command line>", 0, "--stage-layers", "expected layer counts, e.g. 7,7,6,10");
  return counts;
}
}  // namespace

partition::PlanOptions read_plan_options(const po::variables_map& vm) {
  partition::PlanOptions o;
  o.policy = vm["policy"].as<std::string>();
  o.tensor = vm["tensor"].as<int>();
  o.pipeline = vm["pipeline"].as<int>();
  o.data = vm["data"].as<int>();
  o.virtual_stages = vm["virtual-stages"].as<int>();
  o.micro_batch = vm["micro-batch"].as<int>();
  o.global_batch = vm["global-batch"].as<int>();
  o.microbatches = vm["microbatches"].as<int>();
  o.schedule = vm["schedule"].as<std::string>();
  if (vm.count("stage-layers")) o.stage_layers = parse_counts(vm["stage-layers"].as<std::string>());
  if (vm.count("layout")) o.layout_file = vm["layout"].as<std::string>();
  o.recompute = parse_option<partition::Recompute>(vm, "recompute", partition::parse_recompute);
  o.sequence_parallel = vm.count("sequence-parallel") > 0;
  if (vm.count("sync")) o.sync = parse_option<partition::SyncKind>(vm, "sync", partition::parse_sync);
  o.staleness = vm["staleness"].as<int>();
  o.allreduce = parse_option<partition::CollectiveAlgorithm>(vm, "allreduce", partition::parse_collective_algorithm);
  o.bucket_bytes = parse_option<double>(vm, "bucket-size", model::units::parse_bytes);
  o.iterations = vm["iterations"].as<int>();
  o.fp32_grad_accumulation = vm.count("fp32-grad-accumulation") > 0;
  o.workspace_bytes = parse_option<double>(vm, "workspace", model::units::parse_bytes);
  if (o.pipeline < 0 || o.data < 0 || o.global_batch < 0 || o.microbatches < 0) {
    throw InputError("<command line>", 0, "--pipeline/--data/--global-batch/--microbatches", "expected 0 (automatic) or more");
  }
  return o;
}

model::Calibration read_calibration_option(const po::variables_map& vm) {
  return vm.count("calibration") ? model::load_calibration(vm["calibration"].as<std::string>()) : model::Calibration{};
}

Planned plan_from_options(const po::variables_map& vm) {
  model::Cluster cluster = load_cluster_option(vm);
  model::Network network = load_network_option(vm);
  partition::PlanOptions options = read_plan_options(vm);
  options.precision = network.precision;
  const partition::CostModel cost(cluster, network.precision, read_calibration_option(vm));
  const partition::Layout layout = partition::make_layout(cluster, network, options, cost);
  partition::Plan plan = partition::build_plan(cluster, network, layout, cost);
  plan.fingerprint = partition::plan_fingerprint(plan);
  return Planned{std::move(cluster), std::move(network), std::move(plan)};
}

partition::Plan read_plan_file(const std::string& path, const std::string& option) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path, 0, option, "cannot be read");
  std::stringstream text;
  text << in.rdbuf();
  return partition::read_plan_json(text.str(), path);
}

}  // namespace hetflow::tools
