// Campaign speed: 30 days of a 100,352-GPU job (12,544 nodes of 8 H100, TP 8 x PP 16 x DP 784)
// at the default fleet rates, restart and drop-replica, ten Monte Carlo runs each. The event
// loop's time is what is measured here (the iteration times of its states are given: the
// simulator's speed on such plans is sim_bench's); counters give failures per run.
// BM_CampaignWithStates adds the simulations of the states of a folded plan of the same
// shape on fewer replicas (selene-128: 1,024 A100, TP 8 x PP 16 x DP 8), which a campaign
// runs once before its loop.
#include <benchmark/benchmark.h>

#include "campaign/campaign.hpp"
#include "model/io.hpp"
#include "model/zoo.hpp"
#include "partition/plan_builder.hpp"
#include "partition/policy.hpp"

using namespace hetflow;

namespace {

campaign::Job job_100k() {
  campaign::Job job;
  job.gpus = 100352;
  job.nodes = job.gpus / 8;
  job.gpus_per_node = 8;
  job.replicas = 784;
  job.samples_per_step = 1568;
  job.times = {10, 10, 10 * 784.0 / 783, 10};
  job.reliability = campaign::default_reliability();
  job.checkpoint = {1.4e12, 1.4e12 / 2e12, 1.4e12 * 784 / 2e12, 1};
  return job;
}

void BM_Campaign30Days100kGpus(benchmark::State& state) {
  const campaign::Job job = job_100k();
  campaign::CampaignOptions o;
  o.duration_s = 30 * 86400.0;
  o.spares = 16;
  o.seeds = 10;
  o.fault_tolerance = state.range(0) ? campaign::FaultTolerance::drop_replica : campaign::FaultTolerance::restart;
  campaign::CampaignResult r;
  for (auto _ : state) r = campaign::simulate_campaign(job, o);
  double failures = 0;
  for (const auto& run : r.runs) {
    for (int n : run.interruptions) failures += n;
  }
  state.counters["failures_per_run"] = failures / o.seeds;
  state.counters["goodput"] = r.goodput.mean;
  state.SetLabel(state.range(0) ? "drop-replica" : "restart");
}
BENCHMARK(BM_Campaign30Days100kGpus)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);

void BM_CampaignWithStates(benchmark::State& state) {
  const model::Cluster cluster = model::load_cluster("selene-128");
  const model::Network net = model::network_from_spec("gpt3-175b", model::Precision::fp16);
  partition::PlanOptions po;
  po.tensor = 8;
  po.pipeline = 16;
  po.microbatches = 16;
  po.fold = true;
  const partition::CostModel cost(cluster, net.precision);
  const partition::Plan plan = partition::build_plan(cluster, net, partition::make_layout(cluster, net, po, cost), cost);
  campaign::CampaignOptions o;
  o.duration_s = 30 * 86400.0;
  o.seeds = 10;
  for (auto _ : state) {
    campaign::Job job = campaign::describe_job(plan, campaign::default_reliability());
    campaign::measure_states(plan, {}, job);
    benchmark::DoNotOptimize(campaign::simulate_campaign(job, o));
  }
}
BENCHMARK(BM_CampaignWithStates)->Unit(benchmark::kSecond)->Iterations(1);

}  // namespace

BENCHMARK_MAIN();
