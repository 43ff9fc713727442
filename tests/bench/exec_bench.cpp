// Engine overhead: a plan of N zero-FLOP tasks, each depending on the one before on its
// stream, run on the CPU back end. What is left is the engine's own cost per task: waiting
// for inputs, buffers, bookkeeping, timing (target: under 20 us per task). And the check a
// one-copy-per-tensor back end runs before it starts (exec/copy_reuse.hpp) on a large plan.
//   ./build/tests/exec_bench --benchmark_repetitions=3
#include <benchmark/benchmark.h>

#include "exec/copy_reuse.hpp"
#include "exec/cpu_backend.hpp"
#include "exec/engine.hpp"
#include "model/io.hpp"
#include "model/zoo.hpp"
#include "partition/plan_builder.hpp"
#include "partition/policy.hpp"

using namespace hetflow;

namespace {

// `devices` devices, each with `streams` streams of `per_stream` tasks; task k on a stream
// writes a 64-byte tensor the next one reads (a data edge) and frees it.
partition::Plan empty_tasks(int devices, int streams, int per_stream) {
  partition::Plan plan;
  plan.cluster = model::cpu_cluster(devices);
  plan.network.name = "empty";
  for (const model::Device& d : plan.cluster.devices()) plan.device_names.push_back(d.name);
  plan.programs.resize(static_cast<size_t>(devices));
  for (int s = 0; s < streams; ++s) plan.streams.push_back("s" + std::to_string(s));
  plan.layout.workers.clear();
  plan.layout.iterations = 1;
  for (int d = 0; d < devices; ++d) {
    for (int s = 0; s < streams; ++s) {
      int previous = -1;
      for (int k = 0; k < per_stream; ++k) {
        partition::Tensor t;
        t.kind = partition::TensorKind::activation;
        t.device = d;
        t.bytes = 64;
        t.shape = {16};
        const int out = plan.add_tensor(t);
        partition::Task task;
        task.kind = partition::TaskKind::forward;
        task.device = d;
        task.stream = s;
        std::vector<int> reads;
        if (previous >= 0) reads.push_back(previous);
        const int id = plan.add_task(task, reads, std::vector<int>{out});
        if (previous >= 0) plan.tensors[static_cast<size_t>(previous)].free_after = id;
        previous = out;
      }
    }
  }
  plan.finish();
  return plan;
}

void run(benchmark::State& state, int devices, int streams) {
  const int per_stream = static_cast<int>(state.range(0));
  const partition::Plan plan = empty_tasks(devices, streams, per_stream);
  exec::EngineOptions options;
  options.watchdog_s = 60;
  double per_task_us = 0;
  for (auto _ : state) {
    exec::CpuBackend backend;
    const exec::RunResult r = exec::run_plan(plan, backend, options);
    if (!r.completed) state.SkipWithError(r.error.c_str());
    per_task_us = 1e6 * r.wall_s / static_cast<double>(plan.tasks.size());
  }
  state.counters["tasks"] = static_cast<double>(plan.tasks.size());
  state.counters["us_per_task"] = per_task_us;
}

void BM_EmptyTasksOneStream(benchmark::State& state) { run(state, 1, 1); }
void BM_EmptyTasksFourDevicesTwoStreams(benchmark::State& state) { run(state, 4, 2); }

}  // namespace

// 48 layers on 8 stages x 4 workers x tensor 2 + sequence parallel (64 devices), 32
// micro-batches under 1F1B: about 20,000 tasks and 16,600 tensors.
void BM_CopyReuseHazardsLargePlan(benchmark::State& state) {
  const model::Network net =
      model::network_from_spec("gpt:layers=48,hidden=256,heads=4,seq=64,vocab=256", model::Precision::fp32);
  const model::Cluster cluster = model::cpu_cluster(64);
  partition::PlanOptions o;
  o.pipeline = 8;
  o.data = 4;
  o.tensor = 2;
  o.sequence_parallel = true;
  o.microbatches = 32;
  o.micro_batch = 1;
  o.schedule = "1f1b";
  o.precision = net.precision;
  const partition::CostModel cost(cluster, net.precision);
  const partition::Plan plan = partition::build_plan(cluster, net, partition::make_layout(cluster, net, o, cost), cost);
  size_t hazards = 0;
  for (auto _ : state) {
    hazards = exec::copy_reuse_hazards(plan).size();
    benchmark::DoNotOptimize(hazards);
  }
  state.counters["tasks"] = static_cast<double>(plan.tasks.size());
  state.counters["hazards"] = static_cast<double>(hazards);
}

BENCHMARK(BM_CopyReuseHazardsLargePlan)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_EmptyTasksOneStream)->Arg(10000)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_EmptyTasksFourDevicesTwoStreams)->Arg(2500)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_MAIN();
