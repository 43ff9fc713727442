// Planning speed: build + validate + analytic estimate of GPT-3 175B on 1,024 GPUs
// (PP 16, DP 64, 64 micro-batches, 1F1B), the estimate alone on a small plan (what a
// search evaluates thousands of times), and reading plan files of two sizes.
// Each runs its work once before timing and a fixed number of times timed (so two builds do
// the same work); the counters cpu_s and faults are CPU seconds and minor page faults per
// iteration (tests/bench/bench_usage.hpp): on a shared machine compare cpu_s.
#include <benchmark/benchmark.h>

#include "tests/bench/bench_usage.hpp"
#include "model/io.hpp"
#include "model/zoo.hpp"
#include "partition/estimate.hpp"
#include "partition/plan_builder.hpp"
#include "partition/plan_io.hpp"
#include "partition/policy.hpp"
#include "partition/validate.hpp"

using namespace hetflow;

namespace {

// 128 nodes of 8 GPUs: half A100-80 nodes, half H100 nodes, on a fat tree.
model::Cluster mixed_1024() {
  const std::string yaml = R"(name: mixed-1024
fabric: {kind: fat-tree, nodes_per_leaf: 16, oversubscription: 2, latency: 1 us}
nodes:
  - {name: a100, count: 64, gpu: A100-80, gpus: 8, intra: {kind: nvswitch, bandwidth: 300 GB/s},
     nic: {count: 8, bandwidth: 200 Gb/s}}
  - {name: h100, count: 64, gpu: H100-SXM, gpus: 8, intra: {kind: nvswitch, bandwidth: 450 GB/s},
     nic: {count: 8, bandwidth: 400 Gb/s}}
)";
  return model::parse_cluster(yaml, "mixed-1024.yaml");
}

void BM_Gpt3_175b_1024Gpus_BuildValidateEstimate(benchmark::State& state) {
  const model::Cluster cluster = mixed_1024();
  const model::Network net = model::network_from_spec("gpt3-175b", model::Precision::fp16);
  partition::PlanOptions o;
  o.pipeline = 16;
  o.data = 64;
  o.microbatches = 64;
  const partition::CostModel cost(cluster, net.precision);
  size_t tasks = 0;
  bench::run_warm(state, [&] {
    const partition::Layout layout = partition::make_layout(cluster, net, o, cost);
    const partition::Plan plan = partition::build_plan(cluster, net, layout, cost);
    const partition::Validation v = partition::validate_plan(plan);  // reports memory: 175B needs TP
    const partition::Estimate e = partition::estimate_plan(plan, cost);
    benchmark::DoNotOptimize(v.problems.size());
    tasks = plan.tasks.size();
    return e.iteration_time_s;
  });
  state.counters["tasks"] = static_cast<double>(tasks);
  state.counters["tasks_per_s"] = benchmark::Counter(static_cast<double>(tasks), benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_Gpt3_175b_1024Gpus_BuildValidateEstimate)->Unit(benchmark::kMillisecond)->Iterations(5);

// The same plan's phases one by one, to see where the time goes.
struct Phases {
  model::Cluster cluster = mixed_1024();
  model::Network net = model::network_from_spec("gpt3-175b", model::Precision::fp16);
  partition::PlanOptions options() const {
    partition::PlanOptions o;
    o.pipeline = 16;
    o.data = 64;
    o.microbatches = 64;
    return o;
  }
};

void BM_Gpt3_175b_1024Gpus_Build(benchmark::State& state) {
  const Phases p;
  const partition::CostModel cost(p.cluster, p.net.precision);
  const partition::Layout layout = partition::make_layout(p.cluster, p.net, p.options(), cost);
  bench::run_warm(state, [&] { return partition::build_plan(p.cluster, p.net, layout, cost).tasks.size(); });
}
BENCHMARK(BM_Gpt3_175b_1024Gpus_Build)->Unit(benchmark::kMillisecond)->Iterations(5);

void BM_Gpt3_175b_1024Gpus_Validate(benchmark::State& state) {
  const Phases p;
  const partition::CostModel cost(p.cluster, p.net.precision);
  const partition::Plan plan = partition::build_plan(p.cluster, p.net, partition::make_layout(p.cluster, p.net, p.options(), cost), cost);
  bench::run_warm(state, [&] { return partition::validate_plan(plan).problems.size(); });
}
BENCHMARK(BM_Gpt3_175b_1024Gpus_Validate)->Unit(benchmark::kMillisecond)->Iterations(5);

void BM_Gpt3_175b_1024Gpus_Estimate(benchmark::State& state) {
  const Phases p;
  const partition::CostModel cost(p.cluster, p.net.precision);
  const partition::Plan plan = partition::build_plan(p.cluster, p.net, partition::make_layout(p.cluster, p.net, p.options(), cost), cost);
  bench::run_warm(state, [&] { return partition::estimate_plan(plan, cost).iteration_time_s; });
}
BENCHMARK(BM_Gpt3_175b_1024Gpus_Estimate)->Unit(benchmark::kMillisecond)->Iterations(10);

void BM_SmallPlanEstimate(benchmark::State& state) {
  const model::Cluster cluster = model::builtin_cluster("hetpipe-testbed");
  const model::Network net = model::network_from_spec("vgg19", model::Precision::fp16);
  partition::PlanOptions o;
  o.pipeline = 4;
  o.microbatches = 8;
  const partition::CostModel cost(cluster, net.precision);
  const partition::Plan plan = partition::build_plan(cluster, net, partition::make_layout(cluster, net, o, cost), cost);
  const partition::TaskOrder order = partition::order_tasks(plan);
  bench::run_warm(state, [&] { return partition::estimate_plan(plan, cost, order).iteration_time_s; });
  state.counters["tasks"] = static_cast<double>(plan.tasks.size());
}
BENCHMARK(BM_SmallPlanEstimate)->Unit(benchmark::kMicrosecond);

// Reading a plan file at two sizes, to see how the time grows with the task table (the
// library's callback parser once made it quadratic: 40 s for a 140 MB file).
void BM_ReadPlanFile(benchmark::State& state) {
  const model::Cluster cluster = model::builtin_cluster("dgx-a100-x4");
  const model::Network net = model::network_from_spec("gpt:layers=48,hidden=4096,heads=32,seq=2048", model::Precision::fp16);
  partition::PlanOptions o;
  o.pipeline = 8;
  o.tensor = 2;
  o.microbatches = static_cast<int>(state.range(0));
  const partition::CostModel cost(cluster, net.precision);
  const partition::Plan plan = partition::build_plan(cluster, net, partition::make_layout(cluster, net, o, cost), cost);
  const std::string text = partition::write_plan_json(plan);
  bench::run_warm(state, [&] { return partition::read_plan_json(text, "plan.json").tasks.size(); });
  state.counters["tasks"] = static_cast<double>(plan.tasks.size());
  state.counters["MB"] = static_cast<double>(text.size()) / 1e6;
  state.counters["tasks_per_s"] =
      benchmark::Counter(static_cast<double>(plan.tasks.size()), benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_ReadPlanFile)->Arg(32)->Arg(128)->Unit(benchmark::kMillisecond)->Iterations(10);

}  // namespace

BENCHMARK_MAIN();
