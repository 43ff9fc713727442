// Search speed: candidates evaluated per second on one core (make_layout, build_plan and the
// analytic estimate of each), and each phase alone, for a GPT of 13B parameters on 64 GPUs
// of four types (V100-32, A100-40, A100-80, H100, two nodes of 8 each) and for GPT-2 medium
// on 16 GPUs (12 V100 + 4 T4). Candidates cycle through a sample of the search's own space.
// BM_FullSearch times `hetflow search` itself on both, end to end: every candidate scored
// on every core, the best built into plans, the finalists simulated. The counters cpu_s and
// faults are CPU seconds and minor page faults per iteration, of every thread and of the
// simulations' child processes (tests/bench/bench_usage.hpp): on a shared machine, compare cpu_s.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <unistd.h>

#include "model/error.hpp"
#include "model/io.hpp"
#include "model/zoo.hpp"
#include "partition/estimate.hpp"
#include "partition/layout_estimate.hpp"
#include "partition/plan_builder.hpp"
#include "partition/search.hpp"
#include "tests/bench/bench_usage.hpp"
#include "tools/cli.hpp"

using namespace hetflow;

namespace {

struct Case {
  model::Cluster cluster;
  model::Network network;
  int global_batch;
};

// The two cases as cluster files and command lines (make_case below parses the same YAML).
const char* kV100T4Yaml =
    "name: v100-t4\nnodes:\n"
    "  - {name: v100, count: 3, gpu: V100-16, gpus: 4, intra: {kind: nvlink, bandwidth: 150 GB/s}, "
    "nic: {count: 1, bandwidth: 25 Gb/s}}\n"
    "  - {name: t4, count: 1, gpu: T4, gpus: 4, intra: {kind: pcie, bandwidth: 16 GB/s}, "
    "nic: {count: 1, bandwidth: 25 Gb/s}}\n";
const char* kGpt2Medium = "gpt:layers=24,hidden=1024,heads=16,seq=1024,vocab=50257";
const char* kGpt13B = "gpt:layers=40,hidden=5120,heads=40,seq=2048,vocab=50257";

std::string four_types_yaml() {
  std::string yaml = "name: four-types\nnodes:\n";
  for (const char* gpu : {"V100-32", "A100-40", "A100-80", "H100-SXM"}) {
    yaml += std::string("  - {name: ") + gpu + ", count: 2, gpu: " + gpu +
            ", gpus: 8, intra: {kind: nvswitch, bandwidth: 300 GB/s}, nic: {count: 8, bandwidth: 200 Gb/s}}\n";
  }
  return yaml;
}

Case make_case(int which) {
  if (which == 0) {
    return {model::parse_cluster(kV100T4Yaml, "v100-t4.yaml"), model::network_from_spec(kGpt2Medium, model::Precision::fp16),
            32};
  }
  return {model::parse_cluster(four_types_yaml(), "four-types.yaml"),
          model::network_from_spec(kGpt13B, model::Precision::fp16), 256};
}

// phase: 0 everything (evaluate_candidate), 1 make_layout alone, 2 build_plan alone, 3 the estimate alone;
// 4 the layout's estimate alone (estimate_layout), 5 make_layout and estimate_layout: what the
// search spends on every candidate before it builds the best; 6 estimate_layout with every
// flow alone on its routes (no shared links): what sharing links costs, beside 4.
void BM_SearchCandidates(benchmark::State& state) {
  const Case c = make_case(static_cast<int>(state.range(0)));
  const int phase = static_cast<int>(state.range(1));
  partition::PlanOptions base;
  base.precision = c.network.precision;
  const partition::CostModel cost(c.cluster, c.network.precision);
  // 64 candidates the policies and the builder accept, spread over the search's space (its order groups
  // policies and degrees): the first accepted one of each 64th of it.
  std::vector<partition::PlanOptions> accepted;
  std::vector<partition::Layout> layouts;
  std::vector<partition::Plan> plans;
  const std::vector<partition::PlanOptions> all = partition::search_candidates(c.cluster, c.network, c.global_batch, {}, base, cost);
  const size_t stride = std::max<size_t>(1, all.size() / 64);
  for (size_t from = 0; from < all.size(); from += stride) {
    for (size_t at = from; at < std::min(all.size(), from + stride); ++at) {
      try {
        partition::Layout l = partition::make_layout(c.cluster, c.network, all[at], cost);
        partition::Plan plan = partition::build_plan(c.cluster, c.network, l, cost);  // buildable ones only
        if (phase == 3) plans.push_back(std::move(plan));
        layouts.push_back(std::move(l));
        accepted.push_back(all[at]);
        break;
      } catch (const Error&) {
      }
    }
  }
  size_t i = 0;
  bench::UsageMeter usage;
  usage.start();
  for (auto _ : state) {
    const size_t k = i++ % accepted.size();
    if (phase == 0) {
      partition::Candidate out;
      benchmark::DoNotOptimize(partition::evaluate_candidate(c.cluster, c.network, accepted[k], cost, &out, nullptr));
    } else if (phase == 1) {
      benchmark::DoNotOptimize(partition::make_layout(c.cluster, c.network, accepted[k], cost));
    } else if (phase == 2) {
      benchmark::DoNotOptimize(partition::build_plan(c.cluster, c.network, layouts[k], cost));
    } else if (phase == 3) {
      benchmark::DoNotOptimize(partition::estimate_plan(plans[k], cost));
    } else if (phase == 4) {
      benchmark::DoNotOptimize(partition::estimate_layout(c.network, layouts[k], cost));
    } else if (phase == 6) {
      benchmark::DoNotOptimize(partition::estimate_layout(c.network, layouts[k], cost, {.shared_links = false}));
    } else {
      benchmark::DoNotOptimize(
          partition::estimate_layout(c.network, partition::make_layout(c.cluster, c.network, accepted[k], cost), cost));
    }
  }
  usage.stop();
  usage.report(state);
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()));
}
BENCHMARK(BM_SearchCandidates)
    ->ArgNames({"case", "phase"})
    ->ArgsProduct({{0, 1}, {0, 1, 2, 3, 4, 5, 6}})
    ->Unit(benchmark::kMillisecond);

// `hetflow search --cluster C --model M --global-batch B`, as a user runs it, on every core:
// the wall time of the whole search (the 13B target is under 30 s on this 2-core
// machine). One search per iteration; use --benchmark_repetitions for a median.
void BM_FullSearch(benchmark::State& state) {
  const bool big = state.range(0) == 1;
  char dir[] = "/tmp/hetflow-search-bench-XXXXXX";
  if (mkdtemp(dir) == nullptr) {
    state.SkipWithError("mkdtemp failed");
    return;
  }
  const std::string cluster = std::string(dir) + "/cluster.yaml";
  std::ofstream(cluster) << (big ? four_types_yaml() : std::string(kV100T4Yaml));
  const std::vector<std::string> args = {"--cluster", cluster, "--model", big ? kGpt13B : kGpt2Medium,
                                         "--global-batch", big ? "256" : "32"};
  const tools::Command* search = nullptr;
  for (const tools::Command& c : tools::commands()) {
    if (std::string(c.name) == "search") search = &c;
  }
  bench::UsageMeter usage;
  for (auto _ : state) {
    std::ostringstream out;
    usage.start();
    benchmark::DoNotOptimize(search->run(args, out));
    usage.stop();
  }
  usage.report(state);
  std::remove(cluster.c_str());
  rmdir(dir);
}
BENCHMARK(BM_FullSearch)->ArgName("case")->Arg(0)->Arg(1)->Iterations(1)->Unit(benchmark::kSecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
