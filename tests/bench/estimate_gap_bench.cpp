// The analytic estimate against the simulation, over a corpus of layouts: how far the number
// the search ranks by is from the one it re-ranks by. For each cluster, every candidate of the
// search's default space that builds and fits is ranked; an even sample of them (at least 70
// a cluster, over 200 in all) is planned over 3 iterations (WSP: its steady state, as the
// search does), estimated by the layout estimate the search scores with
// (partition::estimate_layout) and simulated with contention (sim::simulate), and the gap
// (simulated - estimated) / simulated reported per cluster and for the corpus: median and
// largest |gap|, and how many simulate slower than estimated. Two estimates side by side:
// "alone", every transfer and collective alone on its routes (LayoutEstimateOptions::
// shared_links false, equal to estimate_plan of the built plan), and "shared", concurrent
// flows sharing the links they cross (a PCIe host bridge, a NIC carrying tensor- and
// data-parallel traffic) as the simulation shares them.
//
// Not a speed benchmark: one pass (--benchmark_repetitions has no meaning here), minutes on
// two cores. Run: ./build/tests/estimate_gap_bench [--benchmark_filter=CLUSTER]
// HETFLOW_GAP_PER_CLUSTER=N changes the sample size (default 70); HETFLOW_GAP_FREE_COMM=1 makes
// every transfer free in both, which leaves the compute model's part of the gap;
// HETFLOW_GAP_LIST=1 prints each layout's gaps. HETFLOW_GAP_ZERO=1|2|3|3k shards every sampled
// all-reduce layout of two or more workers at that ZeRO stage (3k: kept gathered) and leaves the
// others out, which measures the gap of ZeRO's collectives.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "model/error.hpp"
#include "model/io.hpp"
#include "model/zoo.hpp"
#include "partition/estimate.hpp"
#include "partition/layout_estimate.hpp"
#include "partition/plan_builder.hpp"
#include "partition/search.hpp"
#include "partition/validate.hpp"
#include "sim/simulator.hpp"
#include "traces/metrics.hpp"

using namespace hetflow;

namespace {

struct Corpus {
  const char* name;
  const char* cluster;  // built-in name or a file under the source tree
  const char* model;
  int global_batch;
};

// Built-in clusters with shared links (mixed-academic: 8 RTX 3090 behind one PCIe host
// bridge; v100-t4: two node types on Ethernet) and HetPipe's testbed.
const Corpus kCorpora[] = {
    {"mixed-academic", "mixed-academic", "gpt:layers=16,hidden=1024,heads=16,seq=1024,vocab=50257", 32},
    {"v100-t4", HETFLOW_SOURCE_DIR "/tools/examples/v100-t4.yaml", "gpt:layers=16,hidden=1024,heads=16,seq=1024,vocab=50257",
     32},
    {"hetpipe-testbed", "hetpipe-testbed", "vgg19", 256},
};

std::vector<double> all_alone, all_shared;

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

void print_summary(const char* what, const std::vector<double>& gaps) {
  std::vector<double> sizes;
  int slower = 0, above = 0;
  double most_above = 0;  // the estimate's largest excess over the simulation, a fraction of the simulation
  for (double g : gaps) {
    sizes.push_back(std::fabs(g));
    slower += g > 0;
    above += g < 0;
    most_above = std::max(most_above, -g);
  }
  std::printf("%-22s %4zu layouts: median |gap| %5.1f %%, largest %6.1f %%, simulated slower than estimated: %d; "
              "estimate above the simulation: %d (by at most %.3g %%)\n",
              what, gaps.size(), 100 * median(sizes), 100 * (sizes.empty() ? 0 : *std::max_element(sizes.begin(), sizes.end())),
              slower, above, 100 * most_above);
}

void BM_EstimateGap(benchmark::State& state, const Corpus& corpus) {
  const char* per = std::getenv("HETFLOW_GAP_PER_CLUSTER");
  const size_t wanted = per != nullptr ? static_cast<size_t>(std::max(1, std::atoi(per))) : 70;
  const model::Cluster cluster = model::load_cluster(corpus.cluster);
  const model::Network network = model::network_from_spec(corpus.model, model::Precision::fp16);
  const bool free_comm = std::getenv("HETFLOW_GAP_FREE_COMM") != nullptr;
  partition::CostModel cost(cluster, network.precision);
  cost.set_free_communication(free_comm);
  sim::SimOptions simulation;
  simulation.free_communication = free_comm;
  std::vector<double> alone, shared;
  for (auto _ : state) {
    partition::PlanOptions base;
    base.precision = network.precision;
    const partition::SearchResult found =
        partition::search_plans(cluster, network, corpus.global_batch, partition::SearchSpace{}, base, cost);
    const auto& ranked = found.ranked;
    const size_t n = std::min(wanted, ranked.size());
    for (size_t i = 0; i < n; ++i) {
      partition::PlanOptions o = ranked[i * ranked.size() / n].options;  // evenly over the ranking
      o.iterations = std::max(3, partition::estimated_iterations(o));
      partition::Layout layout;
      partition::Plan plan;
      if (const char* zero = std::getenv("HETFLOW_GAP_ZERO")) {
        if (o.sync.value_or(partition::SyncKind::allreduce) != partition::SyncKind::allreduce) continue;
        o.zero_stage = std::atoi(zero);
        o.reshard_after_forward = std::string(zero) != "3k";
        try {
          layout = partition::make_layout(cluster, network, o, cost);
          if (layout.workers.size() < 2) continue;
          plan = partition::build_plan(cluster, network, layout, cost);
        } catch (const Error&) {  // workers cut unlike
          continue;
        }
      } else {
        layout = partition::make_layout(cluster, network, o, cost);
        plan = partition::build_plan(cluster, network, layout, cost);
      }
      if (!partition::validate_plan(plan).ok()) continue;
      const double alone_s = partition::estimate_layout(network, layout, cost, {.shared_links = false}).iteration_time_s;
      const double shared_s = partition::estimate_layout(network, layout, cost).iteration_time_s;
      const double plan_s = partition::estimate_plan(plan, cost).iteration_time_s;
      const sim::SimResult r = sim::simulate(plan, simulation);
      if (!r.completed) continue;
      const double simulated_s = traces::compute_metrics(r.trace, plan, cost).iteration_time_s;
      if (simulated_s <= 0) continue;
      alone.push_back((simulated_s - alone_s) / simulated_s);
      shared.push_back((simulated_s - shared_s) / simulated_s);
      if (std::getenv("HETFLOW_GAP_LIST") != nullptr) {
        // Alone, the layout's estimate equals the plan's (estimate_plan): both printed.
        std::printf("  %-78s simulated %9.4g s, alone %+6.1f %% (%.6g s, the plan's %.6g s), shared %+6.1f %%\n",
                    partition::candidate_summary(o, static_cast<int>(layout.workers.size())).c_str(), simulated_s,
                    100 * alone.back(), alone_s, plan_s, 100 * shared.back());
      }
    }
  }
  state.counters["layouts"] = static_cast<double>(shared.size());
  std::vector<double> sizes;
  for (double g : shared) sizes.push_back(std::fabs(g));
  state.counters["median_gap_pct"] = 100 * median(sizes);
  state.counters["largest_gap_pct"] = sizes.empty() ? 0 : 100 * *std::max_element(sizes.begin(), sizes.end());
  print_summary((std::string(corpus.name) + " alone").c_str(), alone);
  print_summary((std::string(corpus.name) + " shared").c_str(), shared);
  all_alone.insert(all_alone.end(), alone.begin(), alone.end());
  all_shared.insert(all_shared.end(), shared.begin(), shared.end());
}

}  // namespace

int main(int argc, char** argv) {
  for (const Corpus& c : kCorpora) {
    benchmark::RegisterBenchmark(c.name, [&c](benchmark::State& s) { BM_EstimateGap(s, c); })
        ->Iterations(1)
        ->Unit(benchmark::kSecond);
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  print_summary("corpus alone", all_alone);
  print_summary("corpus shared", all_shared);
  benchmark::Shutdown();
  return 0;
}
