// hetflow search: the best plan for a cluster and a model. The command reads its options
// into a search::Request, runs search/search.hpp (or search/compare.hpp for --clusters) and
// prints the outcome (tools/search_report.hpp); under mpirun the ranks share the work.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <optional>
#include <ostream>
#include <span>
#include <sstream>
#include <thread>

#include "exec/ranks.hpp"
#include "model/error.hpp"
#include "model/units.hpp"
#include "partition/layout_file.hpp"
#include "partition/plan_io.hpp"
#include "search/compare.hpp"
#include "search/search.hpp"
#include "tools/cli.hpp"
#include "tools/options.hpp"
#include "tools/plan_options.hpp"
#include "tools/progress.hpp"
#include "tools/search_report.hpp"

namespace hetflow::tools {
namespace {

namespace u = model::units;

// Parses option `name` with `parse`; its std::invalid_argument becomes the option's InputError.
template <typename Parse>
auto parsed(const po::variables_map& vm, const char* name, Parse parse) {
  try {
    return parse(vm[name].as<std::string>());
  } catch (const std::invalid_argument& e) {
    throw InputError("<command line>", 0, std::string("--") + name, e.what());
  }
}

// The processes `mpirun -np N hetflow search` started (one outside mpirun), as the search
// spreads its work over them.
partition::SearchSpread spread_over(exec::Ranks& ranks) {
  partition::SearchSpread spread;
  spread.rank = ranks.rank();
  spread.size = ranks.size();
  if (ranks.alone()) return spread;
  spread.all_gather = [&ranks](const std::vector<double>& mine) {
    static const std::atomic<bool> never{false};
    std::vector<int> among(static_cast<size_t>(ranks.size()));
    std::iota(among.begin(), among.end(), 0);
    const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(mine.data()), mine.size() * sizeof(double));
    std::vector<double> all;
    for (const std::vector<std::byte>& part : ranks.exchange(among, bytes, never)) {
      const size_t at = all.size();
      all.resize(at + part.size() / sizeof(double));
      std::memcpy(all.data() + at, part.data(), part.size());
    }
    return all;
  };
  return spread;
}

// The space of candidates the options ask for.
partition::SearchSpace read_space(const po::variables_map& vm, int global_batch) {
  partition::SearchSpace space;
  if (vm.count("policies")) space.policies = split_list(vm["policies"].as<std::string>());
  space.tensors = int_list(vm, "tensor");
  space.pipelines = int_list(vm, "pipeline");
  space.contexts = int_list(vm, "context-parallel");
  space.context_comms = parsed_list<partition::ContextComm>(vm, "cp-comm", partition::parse_context_comm);
  space.experts = int_list(vm, "expert-parallel");
  space.micro_batches = int_list(vm, "micro-batch");
  for (const int m : space.micro_batches) {
    if (global_batch % m != 0) {
      throw InputError("<command line>", 0, "--micro-batch",
                       "expected sizes that divide --global-batch " + std::to_string(global_batch) + ", found " +
                           std::to_string(m));
    }
  }
  if (vm.count("schedules")) space.schedules = split_list(vm["schedules"].as<std::string>());
  space.staleness = int_option_in(vm, "staleness", 0, 64);
  space.zero = vm.count("no-zero") == 0;
  space.offload = vm.count("no-offload") == 0;
  if (vm.count("groupings")) {
    std::stringstream in(vm["groupings"].as<std::string>());
    for (std::string g; std::getline(in, g, ';');) {
      if (g.find_first_not_of(" \t") != std::string::npos) space.groupings.push_back(g);
    }
    if (space.groupings.empty()) throw InputError("<command line>", 0, "--groupings", "expected groupings separated by ';'");
  }
  for (const std::string& r : vm.count("recompute") ? split_list(vm["recompute"].as<std::string>()) : std::vector<std::string>{}) {
    space.recomputes.push_back(parsed(vm, "recompute", [&](const std::string&) { return partition::parse_recompute(r); }));
  }
  for (const std::string& s : vm.count("sync") ? split_list(vm["sync"].as<std::string>()) : std::vector<std::string>{}) {
    space.syncs.push_back(parsed(vm, "sync", [&](const std::string&) { return partition::parse_sync(s); }));
  }
  for (const std::string& p : space.policies) {
    bool known = false;
    for (const partition::PolicyInfo& info : partition::policies()) known = known || info.name == p;
    if (!known) throw InputError("<command line>", 0, "--policies", "unknown policy '" + p + "'");
  }
  return space;
}

// Everything but the cluster: what to search, how, and within which budget.
search::Request read_request(const po::variables_map& vm, const model::Network& network, exec::Ranks& ranks) {
  search::Request r;
  r.global_batch = vm["global-batch"].as<int>();
  if (r.global_batch < 1) {
    throw InputError("<command line>", 0, "--global-batch", "expected at least 1 sample, found " + std::to_string(r.global_batch));
  }
  r.top = int_option_in(vm, "top", 0, 1000);
  r.sim_iterations = int_option_in(vm, "sim-iterations", 1, 100);
  r.threads = int_option_in(vm, "threads", 0, 1024);
  const std::string objective = vm["objective"].as<std::string>();
  if (objective != "time" && objective != "cost") {
    throw InputError("<command line>", 0, "--objective", "expected time or cost, found '" + objective + "'");
  }
  r.by_cost = objective == "cost";
  r.budget_s = parsed(vm, "search-time", u::parse_time_s);
  if (!(r.budget_s >= 0)) throw InputError("<command line>", 0, "--search-time", "expected a duration of 0 s or more");
  if (vm.count("calibration")) r.calibration = vm["calibration"].as<std::string>();
  r.spread = spread_over(ranks);
  if (r.threads == 0 && !ranks.alone()) {
    // The cores of a node shared by its ranks (OpenMPI says how many it started here).
    const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    const int here = local != nullptr ? std::max(1, std::atoi(local)) : 1;
    r.threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / here);
  }
  r.space = read_space(vm, r.global_batch);
  partition::PlanOptions& base = r.base;
  base.precision = network.precision;
  base.kernels = read_kernel_options(vm);
  base.workspace_bytes = parsed(vm, "workspace", u::parse_bytes);
  base.bucket_bytes = parsed(vm, "bucket-size", u::parse_bytes);
  if (!(base.bucket_bytes >= 1)) throw InputError("<command line>", 0, "--bucket-size", "expected a size of at least 1 B");
  base.overlap_grad_reduce = vm.count("overlap-grad-reduce") > 0;
  if (vm.count("axis-order")) base.axis_order = vm["axis-order"].as<std::string>();
  return r;
}

std::vector<std::string> cluster_list(const po::variables_map& vm) {
  if (!vm.count("clusters")) return {};
  std::vector<std::string> names = split_list(vm["clusters"].as<std::string>());
  if (names.size() < 2) throw InputError("<command line>", 0, "--clusters", "expected two or more comma-separated clusters");
  if (!vm["cluster"].defaulted()) throw InputError("<command line>", 0, "--clusters", "give --cluster or --clusters, not both");
  return names;
}

}  // namespace

void search_options(po::options_description& options) {
  add_cluster_model_options(options);
  options.add_options()
      ("global-batch", po::value<int>()->required(), "samples per iteration over all virtual workers")
      ("top", po::value<int>()->default_value(3),
       "simulate at least this many of the best estimates, then on in estimate order until the next estimate exceeds "
       "the best simulated (0: none, rank by the estimate)")
      ("search-time", po::value<std::string>()->default_value("10 min"),
       "no simulation starts after this much time (the search's first aside): '90 s', '30 min'")
      ("threads", po::value<int>()->default_value(0), "threads scoring candidates (0: every core)")
      ("policies", po::value<std::string>(),
       "policies to try (default uniform,balanced,hetpipe-np,hetpipe-ed,hetpipe-hd,grouped)")
      ("tensor", po::value<std::string>(), "tensor-parallel degrees to try (default powers of 2 up to a node)")
      ("pipeline", po::value<std::string>(), "pipeline depths to try (default every divisor of the devices up to the layers)")
      ("context-parallel", po::value<std::string>(),
       "context-parallel sizes to try (uniform and balanced; default 1, and for long sequences powers of 2 up to 16 "
       "leaving each GPU 8,192 tokens or more)")
      ("cp-comm", po::value<std::string>(), "how context groups exchange keys and values, to try: allgather,ring (default both)")
      ("expert-parallel", po::value<std::string>(),
       "expert-parallel sizes to try (uniform and balanced at tensor 1; default 1, and for a mixture of experts powers of "
       "2 dividing its experts; on mixed clusters each placed contiguously and by speed)")
      ("axis-order", po::value<std::string>(),
       "device placement of the uniform and balanced candidates, innermost axis first (default tensor,data,pipeline)")
      ("micro-batch", po::value<std::string>(), "micro-batch sizes to try (default powers of 2 up to 32 dividing the batch)")
      ("schedules", po::value<std::string>(), "schedules to try (default 1f1b,gpipe,interleaved; bfs too on request, at 2 chunks a rank)")
      ("recompute", po::value<std::string>(), "recomputation to try (default none,selective,full)")
      ("sync", po::value<std::string>(), "synchronisation to try (default allreduce,ps; add wsp for WSP at --staleness)")
      ("staleness", po::value<int>()->default_value(1), "WSP's staleness bound D, the most your training tolerates")
      ("no-zero", "never shard over the data axis: an all-reduce candidate that overflows unsharded is not tried at "
                  "ZeRO stages 1-3")
      ("no-offload", "never offload: an all-reduce candidate that overflows is not tried with its optimizer state or "
                     "its stashes in host memory (--offload-optimizer, --offload-activations)")
      ("groupings", po::value<std::string>(),
       "policy grouped's groupings to try, separated by ';' (default: by GPU type and mixed, fastest types first)")
      ("dropped", po::value<int>()->default_value(3),
       "dropped candidates shown for each reason (0: the counts alone; --json lists every one)")
      ("sim-iterations", po::value<int>()->default_value(3), "iterations of each re-simulation (the first warms up)")
      ("objective", po::value<std::string>()->default_value("time"),
       "time (the fastest plan) or cost (the most samples per dollar: needs `price` on every node of the cluster)")
      ("clusters", po::value<std::string>(),
       "compare these clusters (comma-separated names or files) by the time and cost of training --tokens tokens")
      ("tokens", po::value<std::string>()->default_value("1e9"), "tokens to train, for --clusters")
      ("workspace", po::value<std::string>()->default_value("1 GiB"), "per-device memory reserved for workspace")
      ("bucket-size", po::value<std::string>()->default_value("25 MiB"), "gradient all-reduce bucket size")
      ("overlap-grad-reduce", "all-reduce candidates start each bucket as the last backward makes its gradients")
      ("calibration", po::value<std::string>(), "calibration YAML or published:NAME, for estimates and simulations")
      ("out", po::value<std::string>(), "write the best plan here (for hetflow simulate --plan / run --plan)")
      ("out-layout", po::value<std::string>(), "write the best plan's layout file here (hetflow plan --layout)");
  add_kernel_options(options);
}

int run_search(const std::vector<std::string>& args, std::ostream& to_user) {
  const auto command_started = std::chrono::steady_clock::now();
  po::options_description options("search options");
  po::variables_map vm;
  if (!parse_command_options("search", args, options, vm, to_user)) return 0;
  // Under mpirun every rank searches its share and all reach the same result; rank 0 tells.
  exec::Ranks& ranks = exec::Ranks::world();
  std::ostringstream discarded;
  std::ostream& out = ranks.rank() == 0 ? to_user : discarded;
  const bool writes = ranks.rank() == 0;
  const std::vector<std::string> compared = cluster_list(vm);
  const model::Network network = load_network_option(vm);
  search::Request request = read_request(vm, network, ranks);
  const auto dropped_shown = static_cast<size_t>(int_option_in(vm, "dropped", 0, 1'000'000));
  // On a terminal while the search runs; erased before the report.
  std::optional<SearchProgressLine> progress(std::in_place, request.by_cost);
  request.on_scoring = progress->scoring();
  request.on_simulation = progress->simulation();
  if (!compared.empty()) {
    if (vm.count("out") || vm.count("out-layout")) {
      throw InputError("<command line>", 0, "--clusters", "writes no plan: search one cluster for --out and --out-layout");
    }
    const double tokens = parsed(vm, "tokens", u::parse_number);
    if (!(tokens > 0)) throw InputError("<command line>", 0, "--tokens", "expected a positive number of tokens");
    const search::Comparison c = search::compare_clusters(compared, network, request, tokens);
    progress.reset();
    if (vm.count("json")) {
      print_json(out, comparison_json(c, tokens));
    } else {
      print_comparison(out, network, request, c, tokens);
    }
    return 0;
  }

  const model::Cluster cluster = load_cluster_option(vm);
  if (request.by_cost && !cluster.priced()) {
    throw InputError(cluster.name, 0, "nodes.price", "--objective cost needs a price on every node (price: 2.1 USD/h)");
  }
  const search::Outcome outcome = search::search_cluster(cluster, network, request);
  progress.reset();
  const partition::CostModel cost(cluster, network.precision, read_calibration_option(vm, cluster));
  const partition::Plan best_plan = search::build_candidate_plan(cluster, network, outcome.ranked.front().candidate.options, cost);
  if (vm.count("out") && writes) write_file(vm["out"].as<std::string>(), partition::write_plan_json(best_plan), "--out");
  const std::string layout = partition::write_layout_file(best_plan.layout, cluster);
  if (vm.count("out-layout") && writes) write_file(vm["out-layout"].as<std::string>(), layout, "--out-layout");
  if (vm.count("json")) {
    Json j = search_json(request, outcome);
    j["best"]["layout"] = layout;
    j["wall_s"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - command_started).count();
    print_json(out, j);
    return 0;
  }
  print_search(out, network, cluster, request, outcome, dropped_shown);
  if (vm.count("out")) out << "wrote " << vm["out"].as<std::string>() << " (hetflow simulate --plan, hetflow run --plan)\n";
  if (vm.count("out-layout")) out << "wrote " << vm["out-layout"].as<std::string>() << " (hetflow plan --layout)\n";
  return 0;
}

}  // namespace hetflow::tools
