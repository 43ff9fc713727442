// Data loading in the simulator: a loader-bound plan runs at the loader's closed-form rate,
// min(compute, loader), and a fast loader leaves the plan as it was; the analytic estimate
// agrees.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "model/io.hpp"
#include "model/zoo.hpp"
#include "partition/estimate.hpp"
#include "partition/loading.hpp"
#include "partition/plan_builder.hpp"
#include "partition/policy.hpp"
#include "sim/simulator.hpp"
#include "traces/metrics.hpp"

using namespace hetflow;
using partition::Plan;
using partition::TaskKind;

namespace {

constexpr int kNodes = 4, kGpus = 8, kMicroBatch = 32, kMicrobatches = 2, kIterations = 8;

// Four nodes of eight A100s; `input` is the cluster file's input section ("" for none).
model::Cluster cluster_with(const std::string& input) {
  return model::parse_cluster("name: lab\nnodes:\n  - {name: n, count: " + std::to_string(kNodes) +
                                  ", gpu: A100-80, gpus: " + std::to_string(kGpus) +
                                  ", nic: {count: 8, bandwidth: 200 Gb/s}}\n" + input,
                              "lab.yaml");
}

// ResNet-50, data parallel over every GPU (folded: worker 0's tasks standing for all).
Plan resnet_plan(const model::Cluster& cluster, bool fold = false) {
  const model::Network net = model::network_from_spec("resnet50", model::Precision::fp16);
  partition::PlanOptions o;
  o.precision = net.precision;
  o.pipeline = 1;
  o.data = kNodes * kGpus;
  o.micro_batch = kMicroBatch;
  o.microbatches = kMicrobatches;
  o.iterations = kIterations;
  o.fold = fold;
  const partition::CostModel cost(cluster, net.precision);
  return partition::build_plan(cluster, net, partition::make_layout(cluster, net, o, cost), cost);
}

double samples_per_iteration() { return double(kNodes) * kGpus * kMicroBatch * kMicrobatches; }

// Samples per second in the steady state: from the end of iteration 2's last optimizer step
// to the end of the last iteration's (the first iterations fill the prefetch).
double steady_samples_per_s(const Plan& plan) {
  const sim::SimResult r = sim::simulate(plan, {});
  EXPECT_TRUE(r.completed);
  std::map<int, double> end_of;
  for (const traces::Event& e : r.trace.events) {
    if (e.kind == TaskKind::optimizer) end_of[e.iteration] = std::max(end_of[e.iteration], e.end_s);
  }
  const int first = 2, last = kIterations - 1;
  return samples_per_iteration() * (last - first) / (end_of.at(last) - end_of.at(first));
}

}  // namespace

TEST(Loading, SlowSharedFileSystemBoundsResnetAtItsBandwidthOverTheSampleSize) {
  const double compute = steady_samples_per_s(resnet_plan(cluster_with("")));
  const double shared = 1e9;  // 1 GB/s: about 8,700 ImageNet JPEGs a second
  const Plan plan = resnet_plan(cluster_with("input: {shared_read: 1 GB/s}\n"));
  const double loader = shared / plan.network.stored_sample_bytes();
  ASSERT_LT(loader, compute / 2) << "the test wants a loader-bound plan";
  EXPECT_NEAR(steady_samples_per_s(plan) / std::min(compute, loader), 1.0, 0.01);
  const partition::LoaderBound bound = partition::loader_bound(plan);
  EXPECT_TRUE(bound.bounded);
  EXPECT_NEAR(bound.samples_per_s / loader, 1.0, 1e-12);
  EXPECT_STREQ(bound.limit, "shared file system");
}

TEST(Loading, FastFileSystemLeavesThePlanAsFastAsWithoutALoader) {
  const double compute = steady_samples_per_s(resnet_plan(cluster_with("")));
  const Plan plan = resnet_plan(cluster_with("input: {shared_read: 1 PB/s, prefetch: 2}\n"));
  ASSERT_GT(partition::loader_bound(plan).samples_per_s, 100 * compute);
  EXPECT_NEAR(steady_samples_per_s(plan) / compute, 1.0, 0.01);
}

TEST(Loading, NodeReadAndPreprocessingBoundEachNode) {
  const double compute = steady_samples_per_s(resnet_plan(cluster_with("")));
  // Each node reads at 200 MB/s: four nodes, 4 x 200 MB/s over the sample size.
  const Plan read = resnet_plan(cluster_with("input: {node_read: 200 MB/s}\n"));
  const double read_rate = kNodes * 200e6 / read.network.stored_sample_bytes();
  ASSERT_LT(read_rate, compute / 2);
  EXPECT_NEAR(steady_samples_per_s(read) / read_rate, 1.0, 0.01);
  EXPECT_STREQ(partition::loader_bound(read).limit, "node read");
  // 10 ms of CPU per sample on 4 workers a node: 400 samples/s a node.
  const Plan cpu = resnet_plan(cluster_with("input: {preprocess: 10 ms, workers: 4}\n"));
  const double cpu_rate = kNodes * 4 / 10e-3;
  EXPECT_NEAR(steady_samples_per_s(cpu) / cpu_rate, 1.0, 0.01);
  EXPECT_NEAR(partition::loader_bound(cpu).samples_per_s / cpu_rate, 1.0, 1e-12);
  EXPECT_STREQ(partition::loader_bound(cpu).limit, "preprocessing");
}

// A folded plan simulates worker 0 alone; its loads stand for every replica's, so the file
// system is as loaded as in the whole plan.
TEST(Loading, AFoldedPlanIsBoundAsTheWholeOne) {
  const model::Cluster cluster = cluster_with("input: {shared_read: 1 GB/s, preprocess: 20 ms, workers: 2}\n");
  const Plan folded = resnet_plan(cluster, true);
  ASSERT_TRUE(folded.layout.folded);
  // Per node: 2 workers / 20 ms = 100 samples/s, 400 for the four; the file system's
  // 8,700 is not the limit.
  EXPECT_NEAR(steady_samples_per_s(folded) / 400, 1.0, 0.01);
  EXPECT_NEAR(partition::loader_bound(folded).samples_per_s / 400, 1.0, 1e-12);
}

// The analytic estimate times each load at its share of the loader, so the critical path of
// an input-bound plan runs along the load streams at the loader's closed-form rate, as the
// simulation does; the GPUs' own rate (loads taking no time) stays beside it.
TEST(Loading, TheEstimateOfAnInputBoundPlanIsTheLoadersRateAndTheSimulations) {
  const model::Cluster plain = cluster_with("");
  const partition::CostModel cost(plain, model::Precision::fp16);
  const partition::Estimate compute = partition::estimate_plan(resnet_plan(plain), cost);
  struct Case {
    std::string input;
    double samples_per_s;  // the closed form, independently
  };
  const double sample_bytes = resnet_plan(plain).network.stored_sample_bytes();
  const Case cases[] = {
      {"input: {shared_read: 1 GB/s}\n", 1e9 / sample_bytes},
      {"input: {node_read: 200 MB/s}\n", kNodes * 200e6 / sample_bytes},
      {"input: {preprocess: 10 ms, workers: 4}\n", kNodes * 4 / 10e-3},
  };
  for (const Case& c : cases) {
    const Plan plan = resnet_plan(cluster_with(c.input));
    ASSERT_LT(c.samples_per_s, compute.throughput_samples_per_s / 2) << c.input << "the test wants an input-bound plan";
    const partition::Estimate e = partition::estimate_plan(plan, cost);
    EXPECT_NEAR(e.throughput_samples_per_s / c.samples_per_s, 1.0, 0.02) << c.input;
    EXPECT_NEAR(e.iteration_time_s * steady_samples_per_s(plan) / samples_per_iteration(), 1.0, 0.03) << c.input;
    // The GPUs' rate: the plan without a loader's.
    EXPECT_NEAR(e.compute_throughput_samples_per_s / compute.throughput_samples_per_s, 1.0, 1e-9) << c.input;
  }
}

TEST(Loading, TheEstimateOfAPlanWhoseLoaderKeepsUpIsTheGpus) {
  const model::Cluster plain = cluster_with("");
  const partition::CostModel cost(plain, model::Precision::fp16);
  const partition::Estimate without = partition::estimate_plan(resnet_plan(plain), cost);
  EXPECT_EQ(without.compute_iteration_time_s, without.iteration_time_s);
  const Plan fast = resnet_plan(cluster_with("input: {shared_read: 1 PB/s, prefetch: 2}\n"));
  const partition::Estimate e = partition::estimate_plan(fast, cost);
  EXPECT_NEAR(e.iteration_time_s / without.iteration_time_s, 1.0, 1e-6);
  EXPECT_NEAR(e.compute_iteration_time_s / without.iteration_time_s, 1.0, 1e-9);
}

// A folded plan's loads stand for every replica's in the estimate too.
TEST(Loading, TheEstimateOfAFoldedPlanIsBoundAsTheWholeOne) {
  const model::Cluster cluster = cluster_with("input: {shared_read: 1 GB/s, preprocess: 20 ms, workers: 2}\n");
  const partition::CostModel cost(cluster, model::Precision::fp16);
  const Plan folded = resnet_plan(cluster, true);
  ASSERT_TRUE(folded.layout.folded);
  EXPECT_NEAR(partition::estimate_plan(folded, cost).throughput_samples_per_s / 400, 1.0, 0.02);
  EXPECT_NEAR(partition::estimate_plan(resnet_plan(cluster), cost).throughput_samples_per_s / 400, 1.0, 0.02);
}

// Waiting for the loader is the loader's time, not the pipeline's: an input-bound one-stage
// plan keeps the bubble it has with no loader at all, and each device waits, per iteration,
// the loader's surplus over the GPUs: the closed-form loader iteration (samples over the file
// system's rate) less the plan's iteration without a loader. The estimate and the
// simulation alike.
TEST(Loading, AnInputBoundPlansWaitsAreInputWaitNotBubble) {
  const model::Cluster plain = cluster_with("");
  const partition::CostModel cost(plain, model::Precision::fp16);
  const Plan unloaded = resnet_plan(plain);
  const Plan plan = resnet_plan(cluster_with("input: {shared_read: 1 GB/s}\n"));
  const double loader_s = samples_per_iteration() * plan.network.stored_sample_bytes() / 1e9;

  const partition::Estimate gpus = partition::estimate_plan(unloaded, cost);
  const partition::Estimate e = partition::estimate_plan(plan, cost);
  ASSERT_GT(loader_s, 2 * gpus.iteration_time_s) << "the test wants an input-bound plan";
  EXPECT_EQ(gpus.input_wait_s, 0);
  EXPECT_NEAR(e.bubble_fraction, gpus.bubble_fraction, 1e-3);
  EXPECT_NEAR(e.input_wait_s, loader_s - gpus.iteration_time_s, 0.02 * loader_s);

  const sim::SimResult without = sim::simulate(unloaded, {});
  const sim::SimResult with = sim::simulate(plan, {});
  ASSERT_TRUE(without.completed && with.completed);
  const traces::Metrics m0 = traces::compute_metrics(without.trace, unloaded, cost);
  const traces::Metrics m = traces::compute_metrics(with.trace, plan, cost);
  EXPECT_NEAR(m.iteration_time_s / loader_s, 1.0, 0.02);
  EXPECT_NEAR(m.bubble_fraction, m0.bubble_fraction, 1e-3);
  EXPECT_NEAR(m.input_wait_s, loader_s - m0.iteration_time_s, 0.02 * loader_s);
  for (const traces::DeviceMetrics& d : m.devices) {
    // Busy, exposed communication, input wait and the rest add up to the iteration.
    EXPECT_LE(d.input_wait_s, d.idle_s + 1e-12) << d.name;
    EXPECT_NEAR(d.busy_s + d.exposed_comm_s + d.idle_s, m.iteration_time_s, 1e-9) << d.name;
  }
}

// Replay's durations replace the input path's for load tasks too (SimOptions::compute_s): each
// load of a plan whose file system would be far faster lasts a given time, one after another
// on its device's load stream, so a loader-bound iteration takes the micro-batches' loads
// back to back, kMicrobatches x the given time; a negative entry keeps the input path's.
TEST(Loading, ReplayedLoadsLastTheirGivenTime) {
  const Plan plan = resnet_plan(cluster_with("input: {shared_read: 1 PB/s}\n"));
  const double load_s = 0.05;  // far above the 10-odd ms of compute an iteration
  sim::SimOptions options;
  options.compute_s.assign(plan.tasks.size() * kIterations, -1);
  for (int i = 0; i < kIterations; ++i) {
    for (size_t t = 0; t < plan.tasks.size(); ++t) {
      if (plan.tasks[t].kind == TaskKind::load) options.compute_s[static_cast<size_t>(i) * plan.tasks.size() + t] = load_s;
    }
  }
  const sim::SimResult r = sim::simulate(plan, options);
  ASSERT_TRUE(r.completed);
  const partition::CostModel cost(plan.cluster, plan.layout.precision);
  const traces::Metrics m = traces::compute_metrics(r.trace, plan, cost);
  EXPECT_NEAR(m.iteration_time_s / (kMicrobatches * load_s), 1.0, 1e-6);
  for (const traces::Event& e : r.trace.events) {
    if (e.kind == TaskKind::load) {
      EXPECT_NEAR(e.end_s - e.start_s, load_s, 1e-9);
    }
  }
  // Without them, the input path's: the GPUs' rate.
  EXPECT_LT(traces::compute_metrics(sim::simulate(plan, {}).trace, plan, cost).iteration_time_s, 0.5 * kMicrobatches * load_s);
}
