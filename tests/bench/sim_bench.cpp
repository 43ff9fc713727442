// Simulator speed: one iteration of GPT-3 175B (PP 16, 64 micro-batches, 1F1B, DP over the
// rest, one hierarchical all-reduce per stage) on 64, 1,024 and 8,192 GPUs, half A100-80 and
// half H100 nodes on a 2:1 fat tree. The time reported is the simulating child's own
// wall-clock time (manual time), without forking and shipping the trace back; counters give
// simulated activities per second and the child's peak memory; ship_s is what the caller
// pays on top (fork, the trace sent back through the pipe and parsed).
// (TP 1 does not fit GPT-3 175B in 80 GB: validation would reject these plans; the simulator
// does not check memory, and the benchmark measures the simulator, not the plan.)
// BM_MegatronTable1 simulates rows of Narayanan et al. (SC'21) Table 1 as
// tools/validate-table1.sh does (selene-N, folded, the published A100 calibration, a
// warm-up and one measured iteration): its counters are the simulation's peak memory and
// the predicted against the published TFLOP/s per GPU. Row 10 is 1T parameters on 3,072 GPUs.
// HETFLOW_BENCH_FREE_COMM=1 makes every transfer free, to split the cost between
// synchronisation and communications; HETFLOW_SIM_PHASES=1 prints setup/run/collect times.
// The counters cpu_s and faults are the CPU seconds and minor page faults of the simulating
// child (and of the caller's fork and parse) per simulation (tests/bench/bench_usage.hpp):
// the child's wall-clock time swings with the machine's load, its CPU time far less.
#include <benchmark/benchmark.h>

#include <array>
#include <chrono>
#include <cstdlib>

#include "model/calibration.hpp"
#include "model/io.hpp"
#include "model/zoo.hpp"
#include "partition/plan_builder.hpp"
#include "partition/policy.hpp"
#include "sim/simulator.hpp"
#include "tests/bench/bench_usage.hpp"
#include "traces/metrics.hpp"

using namespace hetflow;

namespace {

model::Cluster mixed_cluster(int gpus) {
  const int nodes = gpus / 8;
  const std::string yaml = "name: mixed-" + std::to_string(gpus) +
                           "\nfabric: {kind: fat-tree, nodes_per_leaf: 16, oversubscription: 2, latency: 1 us}\nnodes:\n"
                           "  - {name: a100, count: " + std::to_string(nodes / 2) +
                           ", gpu: A100-80, gpus: 8, intra: {kind: nvswitch, bandwidth: 300 GB/s}, nic: {count: 8, bandwidth: 200 Gb/s}}\n"
                           "  - {name: h100, count: " + std::to_string(nodes - nodes / 2) +
                           ", gpu: H100-SXM, gpus: 8, intra: {kind: nvswitch, bandwidth: 450 GB/s}, nic: {count: 8, bandwidth: 400 Gb/s}}\n";
  return model::parse_cluster(yaml, "mixed.yaml");
}

void BM_SimulateGpt3_175b(benchmark::State& state) {
  const int gpus = static_cast<int>(state.range(0));
  const model::Cluster cluster = mixed_cluster(gpus);
  const model::Network net = model::network_from_spec("gpt3-175b", model::Precision::fp16);
  partition::PlanOptions o;
  o.pipeline = 16;
  o.microbatches = 64;
  o.bucket_bytes = 1e15;  // one all-reduce per stage
  o.allreduce = partition::CollectiveAlgorithm::hierarchical;
  const partition::CostModel cost(cluster, net.precision);
  const partition::Plan plan = partition::build_plan(cluster, net, partition::make_layout(cluster, net, o, cost), cost);
  sim::SimResult last;
  double ship_s = 0;
  bench::UsageMeter usage;
  for (auto _ : state) {
    sim::SimOptions options;
    options.free_communication = std::getenv("HETFLOW_BENCH_FREE_COMM") != nullptr;
    usage.start();
    const auto called = std::chrono::steady_clock::now();
    last = sim::simulate(plan, options);
    ship_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - called).count() - last.wall_s;
    usage.stop();
    state.SetIterationTime(last.wall_s);
  }
  usage.report(state);
  state.counters["tasks"] = static_cast<double>(plan.tasks.size());
  state.counters["activities"] = static_cast<double>(last.activities);
  state.counters["activities_per_s"] = static_cast<double>(last.activities) / last.wall_s;
  state.counters["peak_rss_MiB"] = static_cast<double>(last.peak_rss_bytes) / (1024.0 * 1024.0);
  state.counters["simulated_s"] = last.simulated_s;
  state.counters["ship_s"] = ship_s;
  state.counters["completed"] = last.completed ? 1 : 0;
}
BENCHMARK(BM_SimulateGpt3_175b)->Arg(64)->Arg(1024)->Arg(2048)->Arg(4096)->Arg(8192)->UseManualTime()->Iterations(1)->Unit(benchmark::kSecond);

struct Table1Row {
  int layers, hidden, heads, tensor, pipeline, gpus, micro_batch, global_batch, layers_per_virtual_stage;
  double published_tflops_per_gpu;
};
// Rows 1, 8 and 10 of the table (tools/validate-table1.sh has them all).
constexpr std::array<Table1Row, 11> kTable1 = {{{},
                                               {24, 2304, 24, 1, 1, 32, 16, 512, 0, 137},
                                               {}, {}, {}, {}, {}, {},
                                               {96, 16384, 128, 8, 16, 1920, 1, 2160, 3, 155},
                                               {},
                                               {128, 25600, 160, 8, 64, 3072, 1, 3072, 0, 163}}};

void BM_MegatronTable1(benchmark::State& state) {
  const Table1Row& row = kTable1.at(static_cast<size_t>(state.range(0)));
  const int seq = 2048, vocab = 51200;
  const model::Cluster cluster = model::builtin_cluster("selene-" + std::to_string(row.gpus / 8));
  const model::Network net = model::network_from_spec(
      "gpt:layers=" + std::to_string(row.layers) + ",hidden=" + std::to_string(row.hidden) + ",heads=" +
          std::to_string(row.heads) + ",seq=" + std::to_string(seq) + ",vocab=" + std::to_string(vocab),
      model::Precision::fp16);
  partition::PlanOptions o;
  o.precision = model::Precision::fp16;
  o.tensor = row.tensor;
  o.pipeline = row.pipeline;
  o.data = row.gpus / (row.tensor * row.pipeline);
  o.micro_batch = row.micro_batch;
  o.microbatches = row.global_batch / o.data / row.micro_batch;
  o.recompute = partition::Recompute::full;
  o.iterations = 2;
  o.fold = true;
  if (row.layers_per_virtual_stage > 0) {
    o.schedule = "interleaved";
    o.virtual_stages = row.layers / row.pipeline / row.layers_per_virtual_stage;
  }
  sim::SimOptions options;
  options.calibration = model::resolve_calibration(model::load_calibration("published:a100"), cluster, "published:a100");
  const partition::CostModel cost(cluster, net.precision, options.calibration);
  const partition::Plan plan = partition::build_plan(cluster, net, partition::make_layout(cluster, net, o, cost), cost);
  sim::SimResult last;
  bench::UsageMeter usage;
  for (auto _ : state) {
    usage.start();
    last = sim::simulate(plan, options);
    usage.stop();
    state.SetIterationTime(last.wall_s);
  }
  usage.report(state);
  // 96 B s l h^2 (1 + s / 6h + V / 16lh) per iteration, the paper's count.
  const double b = row.global_batch, l = row.layers, h = row.hidden;
  const double flops = 96 * b * seq * l * h * h * (1 + seq / (6 * h) + vocab / (16 * l * h));
  const double iteration_s = last.completed ? traces::compute_metrics(last.trace, plan, cost).iteration_time_s : 0;
  const double predicted = iteration_s > 0 ? flops / iteration_s / row.gpus / 1e12 : 0;
  state.counters["tasks"] = static_cast<double>(plan.tasks.size());
  state.counters["peak_rss_MiB"] = static_cast<double>(last.peak_rss_bytes) / (1024.0 * 1024.0);
  state.counters["iteration_s"] = iteration_s;
  state.counters["predicted_tflops_per_gpu"] = predicted;
  state.counters["published_tflops_per_gpu"] = row.published_tflops_per_gpu;
  state.counters["completed"] = last.completed ? 1 : 0;
}
BENCHMARK(BM_MegatronTable1)->Arg(1)->Arg(8)->Arg(10)->UseManualTime()->Iterations(1)->Unit(benchmark::kSecond);

}  // namespace

BENCHMARK_MAIN();
