#include "tools/plan_options.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iomanip>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/error.hpp"
#include "model/limits.hpp"
#include "model/units.hpp"
#include "partition/fit_advice.hpp"
#include "partition/layout_file.hpp"
#include "partition/plan_builder.hpp"
#include "partition/plan_io.hpp"
#include "partition/routing.hpp"
#include "partition/validate.hpp"
#include "tools/chakra_files.hpp"
#include "tools/options.hpp"

namespace hetflow::tools {

void add_plan_options(po::options_description& options, PlanCommand command) {
  add_cluster_model_options(options);
  options.add_options()
      ("policy", po::value<std::string>()->default_value("uniform"),
       "uniform | balanced | hetpipe-np | hetpipe-ed | hetpipe-hd | hetpipe-ed-local | grouped (layout-file: see --layout)")
      ("groups", po::value<std::string>(),
       "policy grouped's virtual workers by GPU type, e.g. \"*x4 V100-16, 2x(2 A100-80 + 1 T4)\" (*: as many as fit)")
      ("layout", po::value<std::string>(), "your own layout: a YAML file of virtual workers and stages (policy layout-file)")
      ("tensor", po::value<int>()->default_value(1), "tensor-parallel degree t")
      ("pipeline", po::value<int>()->default_value(0), "pipeline ranks per virtual worker (uniform/balanced; default 1)")
      ("data", po::value<int>()->default_value(0), "data-parallel replicas (default: all devices used)")
      ("context-parallel", po::value<int>()->default_value(1),
       "context-parallel size: workers that split each sequence (uniform/balanced)")
      ("cp-comm", po::value<std::string>()->default_value("allgather"),
       "how a context group exchanges keys and values: allgather (whole, before each attention) | ring (blocks passed "
       "around the group while the attention computes; Megatron's p2p)")
      ("expert-parallel", po::value<int>()->default_value(1),
       "expert-parallel size EP: consecutive data-parallel replicas that split each MoE layer's experts and "
       "exchange tokens by all-to-all (Megatron's --expert-model-parallel-size)")
      ("routing", po::value<std::string>()->default_value("balanced"),
       "how the router spreads tokens over the experts: balanced | zipf:S | histogram:N0,N1,... (tokens per expert)")
      ("expert-placement", po::value<std::string>()->default_value("contiguous"),
       "which expert rank holds each expert: contiguous | speed (more experts on faster, larger ranks) | R0,R1,...")
      ("expert-dispatch", po::value<std::string>()->default_value("pairwise"),
       "the dispatch and combine all-to-alls: pairwise | hierarchical (inside each node, then across)")
      ("virtual-stages", po::value<int>()->default_value(1), "model chunks per rank (--schedule interleaved or bfs)")
      ("stage-layers", po::value<std::string>(), "layers per stage in model order, e.g. 7,7,6,10 (uniform/balanced)")
      ("axis-order", po::value<std::string>(),
       "device placement, innermost axis first (uniform/balanced; default tensor,data,pipeline)")
      ("micro-batch", po::value<int>()->default_value(1), "samples per micro-batch")
      ("global-batch", po::value<int>()->default_value(0), "samples per iteration over all virtual workers")
      ("microbatches", po::value<int>()->default_value(0), "micro-batches per virtual worker (default 2 x pipeline)")
      ("schedule", po::value<std::string>()->default_value("1f1b"), "gpipe | 1f1b | interleaved | 1f1b-split-w | bfs")
      ("recompute", po::value<std::string>()->default_value("none"), "none | selective | full")
      ("sequence-parallel", "sequence parallelism (with --tensor > 1)")
      ("sync", po::value<std::string>(), "allreduce | ps | wsp (default allreduce; wsp for hetpipe policies)")
      ("staleness", po::value<int>()->default_value(0), "WSP staleness bound D")
      ("allreduce", po::value<std::string>()->default_value("ring"), "ring | tree | hierarchical")
      ("bucket-size", po::value<std::string>()->default_value("25 MiB"),
       "gradient all-reduce bucket size (at most 1,000,000 buckets per iteration)")
      ("overlap-grad-reduce",
       "start each bucket's all-reduce as the last backward makes its gradients (Megatron's option)")
      ("zero-stage", po::value<int>()->default_value(0),
       "ZeRO sharding over the data-parallel replicas: 1 optimizer state (Megatron's distributed optimizer), "
       "2 also gradients, 3 also parameters (FSDP)")
      ("zero-shares", po::value<std::string>()->default_value("equal"),
       "equal | memory: ZeRO's shares of each piece equal, or in proportion to the replicas' device memory "
       "(mixed GPUs: a larger one keeps more)")
      ("no-reshard-after-forward", "ZeRO-3: gather a chunk's parameters once per iteration and keep them until its "
                                   "last backward (FSDP's reshard_after_forward=False)")
      ("offload-optimizer", "keep fp32 master weights and Adam moments in host memory and step the optimizer on "
                            "the node's CPUs, gradients down and parameters up over PCIe (ZeRO-Offload)")
      ("offload-activations", "copy each stash to host memory after its forward and back, prefetched, before its "
                              "backward, on the GPU's copy streams (a stash whose backward comes next stays)")
      ("max-tasks", po::value<long long>()->default_value(kDefaultMaxTasks),
       "refuse a plan of more tasks per iteration, or a simulation of more tasks in all (tasks x iterations)")
      ("fp32-grad-accumulation", "keep fp32 gradients (Megatron's main_grad): +4 B/param")
      ("workspace", po::value<std::string>()->default_value("1 GiB"), "per-device memory reserved for workspace (0 to 1 PiB)")
      ("calibration", po::value<std::string>(), "calibration YAML (efficiencies, link factors)");
  if (command == PlanCommand::plan) {
    options.add_options()("iterations", po::value<int>()->default_value(1),
                          "training iterations in the plan (simulate's own default is 3)");
  } else if (command == PlanCommand::simulate) {
    options.add_options()("iterations", po::value<int>()->default_value(3),
                          "iterations simulated, the first warm-up (with --plan: the plan's own unless given)");
  }
  if (command != PlanCommand::run) {
    options.add_options()("fold", "plan one replica for identical data-parallel workers (for simulation: much "
                                  "faster for many replicas; hetflow run runs every device)");
  }
  if (command == PlanCommand::simulate) {
    options.add_options()("no-fold", "simulate every data-parallel replica (simulate folds identical replicas "
                                     "where the cluster makes the fold exact)");
  }
  add_kernel_options(options);
}

void add_kernel_options(po::options_description& options) {
  options.add_options()
      ("use-flash-attn", "flash attention: no s x s scores in memory (timed where a calibration gives operation costs)")
      ("no-masked-softmax-fusion", "scale, mask and softmax as separate kernels (Megatron's option)")
      ("no-bias-gelu-fusion", "MLP bias and GeLU as separate kernels (Megatron's option)")
      ("no-bias-dropout-fusion", "bias, dropout and residual add as separate kernels (Megatron's option)")
      ("no-fused-adam", "the optimizer step as PyTorch's AdamW runs it op by op (9 kernels), not one fused kernel");
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
std::vector<int> parse_counts(const std::string& text, const std::string& option = "--stage-layers") {
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
      throw InputError("<command line>", 0, option, "expected numbers separated by commas, e.g. 7,7,6,10, found '" + text + "'");
    }
    counts.push_back(value);
  }
  if (counts.empty()) throw InputError("<command line>", 0, option, "expected numbers separated by commas, e.g. 7,7,6,10");
  return counts;
}
}  // namespace

namespace {
// A layout file's own options (`hetflow search --out-layout` writes them) for those the
// command line does not give: the command line wins.
void apply_file_options(const po::variables_map& vm, partition::PlanOptions& o) {
  std::ifstream in(o.layout_file);
  if (!in) return;  // the layout-file policy says it cannot read it
  std::stringstream text;
  text << in.rdbuf();
  const auto given = [&](const std::string& option) { return vm.count(option) > 0 && !vm[option].defaulted(); };
  partition::apply_layout_file_options(text.str(), o.layout_file, o, [&](std::string_view member) {
    if (member == "kernels") {
      return given("use-flash-attn") || given("no-masked-softmax-fusion") || given("no-bias-gelu-fusion") ||
             given("no-bias-dropout-fusion") || given("no-fused-adam");
    }
    return given(option_of(std::string(member)).substr(2));
  });
}
}  // namespace

partition::PlanOptions read_plan_options(const po::variables_map& vm) {
  partition::PlanOptions o;
  o.policy = vm["policy"].as<std::string>();
  o.tensor = vm["tensor"].as<int>();
  o.pipeline = vm["pipeline"].as<int>();
  o.data = vm["data"].as<int>();
  o.context = vm["context-parallel"].as<int>();
  o.context_comm = parse_option<partition::ContextComm>(vm, "cp-comm", partition::parse_context_comm);
  o.experts.parallel = vm["expert-parallel"].as<int>();
  o.experts.routing = partition::parse_routing(vm["routing"].as<std::string>(), "<command line>", "--routing");
  o.experts.dispatch = parse_option<partition::CollectiveAlgorithm>(vm, "expert-dispatch", partition::parse_collective_algorithm);
  if (const std::string placement = vm["expert-placement"].as<std::string>(); placement == "speed") {
    o.experts_by_speed = true;
  } else if (placement != "contiguous") {
    o.experts.placement = parse_counts(placement, "--expert-placement");
  }
  o.virtual_stages = vm["virtual-stages"].as<int>();
  o.micro_batch = vm["micro-batch"].as<int>();
  o.global_batch = vm["global-batch"].as<int>();
  o.microbatches = vm["microbatches"].as<int>();
  o.schedule = vm["schedule"].as<std::string>();
  if (vm.count("stage-layers")) o.stage_layers = parse_counts(vm["stage-layers"].as<std::string>());
  if (vm.count("axis-order")) o.axis_order = vm["axis-order"].as<std::string>();
  if (vm.count("layout")) o.layout_file = vm["layout"].as<std::string>();
  if (vm.count("groups")) o.groups = vm["groups"].as<std::string>();
  o.recompute = parse_option<partition::Recompute>(vm, "recompute", partition::parse_recompute);
  o.sequence_parallel = vm.count("sequence-parallel") > 0;
  if (vm.count("sync")) o.sync = parse_option<partition::SyncKind>(vm, "sync", partition::parse_sync);
  o.staleness = vm["staleness"].as<int>();
  o.allreduce = parse_option<partition::CollectiveAlgorithm>(vm, "allreduce", partition::parse_collective_algorithm);
  o.bucket_bytes = parse_option<double>(vm, "bucket-size", model::units::parse_bytes);
  o.overlap_grad_reduce = vm.count("overlap-grad-reduce") > 0;
  o.zero_stage = vm["zero-stage"].as<int>();
  o.reshard_after_forward = vm.count("no-reshard-after-forward") == 0;
  o.zero_shares = parse_option<partition::ZeroShares>(vm, "zero-shares", partition::parse_zero_shares);
  o.offload_optimizer = vm.count("offload-optimizer") > 0;
  o.offload_activations = vm.count("offload-activations") > 0;
  o.iterations = vm.count("iterations") ? vm["iterations"].as<int>() : 1;
  o.fp32_grad_accumulation = vm.count("fp32-grad-accumulation") > 0;
  o.kernels = read_kernel_options(vm);
  o.fold = vm.count("fold") > 0;
  o.workspace_bytes = parse_option<double>(vm, "workspace", model::units::parse_bytes);
  if (!o.layout_file.empty()) apply_file_options(vm, o);
  for (const auto& [option, value] : {std::pair{"--pipeline", o.pipeline}, {"--data", o.data},
                                      {"--global-batch", o.global_batch}, {"--microbatches", o.microbatches}}) {
    if (value < 0) {
      throw InputError("<command line>", 0, option, "expected 0 (automatic) or more, found " + std::to_string(value));
    }
  }
  // Sizes are finite once parsed; here they must also make sense.
  if (!(o.workspace_bytes >= 0 && o.workspace_bytes <= model::limits::kMaxMemory)) {
    throw InputError("<command line>", 0, "--workspace",
                     "expected a size between 0 and " + model::units::format_bytes(model::limits::kMaxMemory) +
                         ", found '" + vm["workspace"].as<std::string>() + "'");
  }
  if (!(o.bucket_bytes >= 1)) {
    throw InputError("<command line>", 0, "--bucket-size",
                     "expected a size of at least 1 B, found '" + vm["bucket-size"].as<std::string>() + "'");
  }
  (void)read_max_tasks(vm);
  return o;
}

partition::KernelOptions read_kernel_options(const po::variables_map& vm) {
  partition::KernelOptions k;
  k.flash_attention = vm.count("use-flash-attn") > 0;
  k.fused_softmax = vm.count("no-masked-softmax-fusion") == 0;
  k.fused_bias_gelu = vm.count("no-bias-gelu-fusion") == 0;
  k.fused_bias_dropout_add = vm.count("no-bias-dropout-fusion") == 0;
  k.fused_adam = vm.count("no-fused-adam") == 0;
  return k;
}

long long read_max_tasks(const po::variables_map& vm) {
  const long long max_tasks = vm.count("max-tasks") ? vm["max-tasks"].as<long long>() : kDefaultMaxTasks;
  if (max_tasks < 1) {
    throw InputError("<command line>", 0, "--max-tasks", "expected a positive number, found " + std::to_string(max_tasks));
  }
  return max_tasks;
}

model::Calibration read_calibration_option(const po::variables_map& vm, const model::Cluster& cluster) {
  if (!vm.count("calibration")) return model::Calibration{};
  const std::string path = vm["calibration"].as<std::string>();
  return model::resolve_calibration(model::load_calibration(path), cluster, path);
}

namespace {

constexpr long long kMaxSamples = std::numeric_limits<int>::max();
constexpr long long kMaxBuckets = 1'000'000;
constexpr int kMaxStaleness = 1'000'000;

std::string count_text(long long n) {
  return n >= 10'000'000 ? model::units::human_count(static_cast<double>(n)) + " (" + std::to_string(n) + ")"
                         : std::to_string(n);
}

// Before a policy multiplies options in `int`: every product or sum it may form, in 64 bits.
void check_option_products(const partition::PlanOptions& o, const model::Cluster& cluster,
                           const model::Network& network) {
  const long long layers = static_cast<long long>(network.layers.size());
  const long long chunks = static_cast<long long>(std::max(1, o.pipeline)) * std::max(1, o.virtual_stages);
  if (chunks > layers && chunks > std::numeric_limits<int>::max() / 4) {
    throw InputError("<command line>", 0, "--virtual-stages",
                     "pipeline x virtual stages = " + std::to_string(chunks) + " model chunks, more than the " +
                         std::to_string(layers) + " layers of " + network.name);
  }
  long long stage_sum = 0;
  for (int count : o.stage_layers) stage_sum += count;
  if (stage_sum > std::numeric_limits<int>::max()) {
    throw InputError("<command line>", 0, "--stage-layers",
                     "the counts add up to " + std::to_string(stage_sum) + " layers, but " + network.name + " has " +
                         std::to_string(layers));
  }
  if (o.staleness > kMaxStaleness) {
    throw InputError("<command line>", 0, "--staleness",
                     "expected at most " + std::to_string(kMaxStaleness) + " iterations, found " +
                         std::to_string(o.staleness));
  }
  const long long devices = cluster.device_count();
  const long long tensor = std::max(1, o.tensor);
  const long long workers = o.data > 0 ? o.data : std::max(1LL, devices / (std::max(1, o.pipeline) * tensor * std::max(1, o.context)));
  const long long micro_batch = std::max(1, o.micro_batch);
  const std::string workers_text =
      std::to_string(workers) + (o.data > 0 ? " virtual workers (--data)" : " virtual workers (at most, on this cluster)");
  if (o.global_batch > 0 && micro_batch * workers > kMaxSamples) {
    throw InputError("<command line>", 0, "--micro-batch",
                     "--micro-batch " + std::to_string(micro_batch) + " x " + workers_text + " = " +
                         std::to_string(micro_batch * workers) + " samples per round of micro-batches, more than " +
                         std::to_string(kMaxSamples));
  }
  if (o.microbatches > 0 && micro_batch * o.microbatches * workers > kMaxSamples) {
    throw InputError("<command line>", 0, "--microbatches",
                     "--micro-batch " + std::to_string(micro_batch) + " x --microbatches " +
                         std::to_string(o.microbatches) + " x " + workers_text + " = " +
                         std::to_string(micro_batch * o.microbatches * workers) +
                         " samples per iteration, more than " + std::to_string(kMaxSamples));
  }
}

// After the layout, before the plan is built: the plan's size, estimated in 64 bits, against
// the bounds (all-reduce buckets, --max-tasks, samples per iteration).
void check_layout_size(const partition::Layout& layout, const model::Network& network, long long max_tasks,
                       const po::variables_map& vm) {
  long long samples = 0, tasks = 0;
  const bool split_w = layout.schedule == "1f1b-split-w";
  // A folded plan holds the tasks of its first workers alone (Layout::task_workers): its
  // size, not the unfolded one, is what --max-tasks bounds.
  for (size_t i = 0; i < layout.workers.size(); ++i) {
    const partition::VirtualWorker& w = layout.workers[i];
    samples += static_cast<long long>(w.microbatches) * layout.micro_batch_size;
    if (i >= layout.task_workers()) continue;
    const long long chunks = static_cast<long long>(w.stages.size());
    // Per micro-batch and chunk: forward, backward (and weight gradient), and a send and a
    // receive each way at every chunk boundary; on every device of the chunk's tensor group.
    const long long per = (split_w ? 3 : 2) + (chunks > 1 ? 4 : 0);
    for (size_t k = 0; k < w.stages.size(); ++k) {
      tasks += static_cast<long long>(w.microbatches) * w.tensor_of(k) * per;
    }
  }
  samples /= std::max(1, layout.size(partition::Axis::context));  // a context group trains its samples once
  if (samples > kMaxSamples) {
    throw InputError("<command line>", 0, "--micro-batch",
                     "the layout trains " + std::to_string(samples) + " samples per iteration, more than " +
                         std::to_string(kMaxSamples) + "; lower --micro-batch, --microbatches or --global-batch");
  }
  if (layout.sync.kind == partition::SyncKind::allreduce && layout.workers.size() > 1) {
    double params = 0;
    for (const model::Layer& l : network.layers) params += l.params + l.tied_params;
    const double grad_bytes =
        params * (layout.fp32_grad_accumulation ? 4.0 : model::element_bytes(layout.precision));
    const double buckets = std::ceil(grad_bytes / layout.sync.bucket_bytes);
    if (buckets > kMaxBuckets) {
      throw InputError("<command line>", 0, "--bucket-size",
                       "'" + vm["bucket-size"].as<std::string>() + "' would split " +
                           model::units::human_bytes(grad_bytes) + " of gradients into about " +
                           count_text(static_cast<long long>(buckets)) + " all-reduce buckets per iteration, more than " +
                           std::to_string(kMaxBuckets) + "; give --bucket-size " +
                           model::units::format_bytes(std::ceil(grad_bytes / kMaxBuckets)) + " or more");
    }
    tasks += static_cast<long long>(buckets) * static_cast<long long>(layout.task_workers());
  }
  if (tasks > max_tasks) {
    throw InputError("<command line>", 0, "--max-tasks",
                     "the plan would hold about " + count_text(tasks) + " tasks per iteration, more than --max-tasks " +
                         std::to_string(max_tasks) +
                         "; lower --microbatches, --global-batch or the number of stages, or raise --max-tasks");
  }
}

}  // namespace

Planned plan_from_options(const po::variables_map& vm, std::optional<bool> fold) {
  if (vm.count("model") && is_chakra_model(vm["model"].as<std::string>())) {
    partition::Plan plan = plan_from_chakra(vm);
    if (static_cast<long long>(plan.tasks.size()) > read_max_tasks(vm)) {
      throw InputError("<command line>", 0, "--max-tasks",
                       "the Chakra workload has " + std::to_string(plan.tasks.size()) + " tasks, more than --max-tasks");
    }
    return Planned{plan.cluster, plan.network, std::move(plan)};
  }
  model::Cluster cluster = load_cluster_option(vm);
  model::Network network = load_network_option(vm);
  partition::PlanOptions options = read_plan_options(vm);
  if (fold) options.fold = *fold;
  options.precision = network.precision;
  check_option_products(options, cluster, network);
  const partition::CostModel cost(cluster, network.precision, read_calibration_option(vm, cluster));
  const partition::Layout layout = partition::make_layout(cluster, network, options, cost);
  check_layout_size(layout, network, read_max_tasks(vm), vm);
  partition::Plan plan = partition::build_plan(cluster, network, layout, cost);
  plan.fingerprint = partition::plan_fingerprint(plan);
  return Planned{std::move(cluster), std::move(network), std::move(plan)};
}

void require_valid_or_advise(const partition::Plan& plan, const po::variables_map& vm) {
  try {
    partition::require_valid(plan);
  } catch (const PlanError& e) {
    if (partition::fits_in_memory(plan)) throw;
    partition::PlanOptions options = read_plan_options(vm);
    options.precision = plan.network.precision;
    const partition::CostModel cost(plan.cluster, plan.network.precision, read_calibration_option(vm, plan.cluster));
    const std::vector<partition::FitAdvice> advice = partition::what_would_fit(plan, options, cost);
    std::ostringstream message;
    message << e.what() << "\n";
    if (advice.empty()) {
      message << "nothing nearby fits (deeper pipelines, recomputation, tensor parallelism up to a node, ZeRO sharding, offload): "
                 "a smaller model, micro-batch or --workspace, or more devices";
      throw PlanError(message.str());
    }
    message << "what would fit (analytic iteration time; the fullest device's memory):";
    std::vector<std::string> changes;
    size_t width = 0;
    for (const partition::FitAdvice& a : advice) {
      std::string change;
      for (const auto& [member, value] : a.changes) {
        // Resharding is the absence of a flag: say to drop it, or to give it.
        const std::string flag = option_of(member);
        change += (change.empty() ? "" : " ") +
                  (member == "offload_optimizer" || member == "offload_activations" ? flag
                   : member != "reshard_after_forward" ? flag + " " + value
                   : value == "true"                   ? "without " + flag
                                                       : flag);
      }
      width = std::max(width, change.size());
      changes.push_back(change);
    }
    for (size_t i = 0; i < advice.size(); ++i) {
      message << "\n  " << std::left << std::setw(static_cast<int>(width)) << changes[i] << "   "
              << model::units::human_time_s(advice[i].iteration_time_s) << " per iteration, "
              << static_cast<int>(std::round(100 * advice[i].peak_fraction)) << "% full";
    }
    throw PlanError(message.str());
  }
}

partition::Plan read_plan_file(const std::string& path, const std::string& option) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path, 0, option, "cannot be read");
  std::stringstream text;
  text << in.rdbuf();
  return partition::read_plan_json(text.str(), path);
}

}  // namespace hetflow::tools
