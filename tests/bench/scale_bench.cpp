// Speed at 100,000 GPUs, the figures a team planning such a run needs the tool to reach.
// BM_FoldedIterationGpt3_175b: one iteration of GPT-3 175B (fp16, TP 8 x PP 8, micro-batch 1,
// 8 micro-batches per replica, full recomputation, 25 MiB buckets) folded on a non-blocking
// two-level fat tree of 8-GPU H100 nodes (32 per leaf): 12,288 and 98,304 GPUs (1,536 and
// 12,288 nodes, DP 192 and 1,536). Manual time is the simulating child's own wall-clock time;
// counters give its peak memory, the planning time before it and the simulated iteration.
// The simulation builds only the nodes the folded replica and its ring neighbours use
// (sim/needed_hosts.hpp), so both sizes take about the same time.
// BM_DeepSeekV3On2048H800: one iteration of DeepSeek-V3 (bf16, PP 16 x EP 64 x DP 128,
// ZeRO-1, micro-batch 1, 120 micro-batches per replica = the report's 15,360 sequences of
// 4,096 tokens, full recomputation, flash attention) on tools/examples/h800-2048.yaml, folded
// to one expert group (64 replicas, 1,024 devices simulated). Counters as above, and
// tokens/s per GPU.
// BM_Campaign30Days100kGpus: the README's 100,352-GPU campaign end to end as `hetflow
// campaign` runs it: Llama 3 405B (bf16, TP 8 x PP 16 x DP 784, sequence parallelism, full
// recomputation, 8 GiB buckets) on tools/examples/h100-100k.yaml, planned folded, both states
// simulated (healthy, one replica out), then 30 days of drop-replica at the default fleet
// rates with 64 spare nodes, 20 Monte Carlo runs; real time, planning included. Counters:
// drop-replica's and restart's median goodputs (drop-replica beats restart).
#include <benchmark/benchmark.h>

#include <chrono>
#include <string>

#include "campaign/campaign.hpp"
#include "campaign/job.hpp"
#include "model/io.hpp"
#include "model/zoo.hpp"
#include "partition/plan_builder.hpp"
#include "partition/policy.hpp"
#include "sim/simulator.hpp"

using namespace hetflow;

namespace {

model::Cluster h100_fat_tree(int nodes) {
  const std::string n = std::to_string(nodes);
  return model::parse_cluster("name: h100-ft-" + n +
                                  "\nfabric: {kind: fat-tree, nodes_per_leaf: 32, oversubscription: 1, latency: 1 us}\n"
                                  "nodes:\n  - {name: hgx, count: " + n +
                                  ", gpu: H100-SXM, gpus: 8, intra: {kind: nvswitch, bandwidth: 450 GB/s, latency: 2 us}, "
                                  "nic: {count: 8, bandwidth: 400 Gb/s, latency: 2 us}}\n",
                              "h100-ft.yaml");
}

partition::Plan plan_of(const model::Cluster& cluster, const model::Network& net, const partition::PlanOptions& o) {
  const partition::CostModel cost(cluster, o.precision);
  return partition::build_plan(cluster, net, partition::make_layout(cluster, net, o, cost), cost);
}

// Plans `o`, simulates the plan once per benchmark iteration (the child's wall time as the
// manual time) and sets the counters every scale benchmark reports; the last result.
sim::SimResult simulate_folded(benchmark::State& state, const model::Cluster& cluster, const model::Network& net,
                               const partition::PlanOptions& o) {
  const auto planning = std::chrono::steady_clock::now();
  const partition::Plan plan = plan_of(cluster, net, o);
  const double plan_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - planning).count();
  sim::SimResult last;
  for (auto _ : state) {
    last = sim::simulate(plan, {});
    state.SetIterationTime(last.wall_s);
  }
  state.counters["plan_s"] = plan_s;
  state.counters["tasks"] = static_cast<double>(plan.tasks.size());
  state.counters["activities"] = static_cast<double>(last.activities);
  state.counters["peak_rss_MiB"] = static_cast<double>(last.peak_rss_bytes) / (1024.0 * 1024.0);
  state.counters["iteration_s"] = last.simulated_s;
  state.counters["completed"] = last.completed ? 1 : 0;
  return last;
}

void BM_FoldedIterationGpt3_175b(benchmark::State& state) {
  const int gpus = static_cast<int>(state.range(0));
  const model::Cluster cluster = h100_fat_tree(gpus / 8);
  const model::Network net = model::network_from_spec("gpt3-175b", model::Precision::fp16);
  partition::PlanOptions o;
  o.precision = model::Precision::fp16;
  o.tensor = 8;
  o.pipeline = 8;
  o.micro_batch = 1;
  o.global_batch = gpus / 8;  // 8 micro-batches per replica
  o.recompute = partition::Recompute::full;
  o.fold = true;
  o.iterations = 1;
  simulate_folded(state, cluster, net, o);
}
BENCHMARK(BM_FoldedIterationGpt3_175b)->Arg(12288)->Arg(98304)->UseManualTime()->Iterations(1)->Unit(benchmark::kSecond);

void BM_DeepSeekV3On2048H800(benchmark::State& state) {
  const model::Cluster cluster = model::load_cluster(HETFLOW_SOURCE_DIR "/tools/examples/h800-2048.yaml");
  const model::Network net = model::network_from_spec("deepseek-v3", model::Precision::bf16);
  partition::PlanOptions o;
  o.precision = model::Precision::bf16;
  o.pipeline = 16;
  o.experts.parallel = 64;
  o.zero_stage = 1;
  o.micro_batch = 1;
  o.global_batch = 15360;
  o.recompute = partition::Recompute::full;
  o.kernels.flash_attention = true;
  o.fold = true;
  o.iterations = 1;
  const sim::SimResult last = simulate_folded(state, cluster, net, o);
  state.counters["tokens_per_s_per_gpu"] = 15360.0 * 4096 / last.simulated_s / 2048;
}
BENCHMARK(BM_DeepSeekV3On2048H800)->UseManualTime()->Iterations(1)->Unit(benchmark::kSecond);

void BM_Campaign30Days100kGpus(benchmark::State& state) {
  campaign::CampaignResult r;
  campaign::Job job;
  for (auto _ : state) {
    const model::Cluster cluster = model::load_cluster(std::string(HETFLOW_SOURCE_DIR) + "/tools/examples/h100-100k.yaml");
    const model::Network net = model::network_from_spec(
        "llama:layers=126,hidden=16384,heads=128,kv_heads=8,ffn=53248,vocab=128256,seq=8192", model::Precision::bf16);
    partition::PlanOptions o;
    o.precision = model::Precision::bf16;
    o.tensor = 8;
    o.pipeline = 16;
    o.micro_batch = 1;
    o.global_batch = 12544;
    o.recompute = partition::Recompute::full;
    o.sequence_parallel = true;
    o.bucket_bytes = 8.0 * 1024 * 1024 * 1024;
    o.fold = true;
    const partition::Plan plan = plan_of(cluster, net, o);
    job = campaign::describe_job(plan, campaign::default_reliability());
    campaign::measure_states(plan, {}, job, {true, false});
    campaign::CampaignOptions c;
    c.duration_s = 30 * 86400.0;
    c.fault_tolerance = campaign::FaultTolerance::drop_replica;
    c.spares = 64;
    c.seeds = 20;
    r = campaign::simulate_campaign(job, c);
  }
  state.counters["gpus"] = job.gpus;
  state.counters["iteration_s"] = r.healthy_iteration_s;
  state.counters["goodput_drop_replica_p50"] = r.goodput.p50;
  state.counters["goodput_restart_p50"] = r.restart_goodput.p50;
}
BENCHMARK(BM_Campaign30Days100kGpus)->Iterations(1)->Unit(benchmark::kSecond);

}  // namespace

BENCHMARK_MAIN();
