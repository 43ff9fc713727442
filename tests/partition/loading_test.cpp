// Load tasks in plans: one per virtual worker and micro-batch where the cluster has an input
// path, on the worker's first device, whose first forward waits for it; prefetch edges bound how far they run ahead, and plans
// without an input path have none.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "model/io.hpp"
#include "model/zoo.hpp"
#include "partition/layout_estimate.hpp"
#include "partition/loading.hpp"
#include "partition/plan_builder.hpp"
#include "partition/plan_io.hpp"
#include "partition/policy.hpp"
#include "partition/validate.hpp"

using namespace hetflow;
using partition::Plan;
using partition::TaskKind;

namespace {

// Two nodes of two GPUs, ResNet-50 data parallel over the four, 2 micro-batches of 16.
Plan resnet_plan(const std::string& input) {
  const model::Cluster cluster = model::parse_cluster(
      "name: lab\nnodes:\n  - {name: n, count: 2, gpu: A100-80, gpus: 2, nic: {count: 1, bandwidth: 100 Gb/s}}\n" + input,
      "lab.yaml");
  const model::Network net = model::network_from_spec("resnet50", model::Precision::fp16);
  partition::PlanOptions o;
  o.precision = net.precision;
  o.pipeline = 1;
  o.data = 4;
  o.micro_batch = 16;
  o.microbatches = 2;
  const partition::CostModel cost(cluster, net.precision);
  return partition::build_plan(cluster, net, partition::make_layout(cluster, net, o, cost), cost);
}

}  // namespace

TEST(LoadTasks, NoneWithoutAnInputPath) {
  const Plan plan = resnet_plan("");
  for (const partition::Task& t : plan.tasks) EXPECT_NE(t.kind, TaskKind::load);
  EXPECT_FALSE(partition::loader_bound(plan).bounded);
}

TEST(LoadTasks, OnePerWorkerAndMicroBatchThatItsFirstForwardWaitsFor) {
  const Plan plan = resnet_plan("input: {shared_read: 1 GB/s, prefetch: 1}\n");
  const Plan plain = resnet_plan("");
  std::map<std::pair<int, int>, int> load_of;  // (device, micro-batch) -> load task
  for (size_t id = 0; id < plan.tasks.size(); ++id) {
    const partition::Task& t = plan.tasks[id];
    if (t.kind != TaskKind::load) continue;
    EXPECT_EQ(plan.stream_name(t.stream), "load");
    EXPECT_EQ(t.worker, t.device);  // data parallel: worker w is device w
    EXPECT_DOUBLE_EQ(t.bytes, 16 * plan.network.stored_sample_bytes());
    EXPECT_DOUBLE_EQ(partition::load_samples(plan, t), 16);
    load_of[{t.device, t.microbatch}] = static_cast<int>(id);
  }
  ASSERT_EQ(load_of.size(), 8u);  // 4 workers x 2 micro-batches
  EXPECT_EQ(plan.tasks.size(), plain.tasks.size() + load_of.size());
  // Every forward waits for its load (same device, same iteration); each load waits for the
  // forward one micro-batch earlier (prefetch 1): of the previous iteration for micro-batch 0.
  std::set<std::pair<int, int>> waits;
  int prefetch_edges = 0;
  for (const partition::OrderEdge& e : plan.order) {
    const partition::Task& from = plan.task(e.from);
    const partition::Task& to = plan.task(e.to);
    if (from.kind == TaskKind::load) {
      ASSERT_EQ(to.kind, TaskKind::forward);
      EXPECT_EQ(e.offset, 0);
      EXPECT_EQ(e.from, load_of.at({to.device, to.microbatch}));
      waits.insert({to.device, to.microbatch});
    } else if (to.kind == TaskKind::load) {
      ASSERT_EQ(from.kind, TaskKind::forward);
      ++prefetch_edges;
      EXPECT_EQ(from.device, to.device);
      EXPECT_EQ(from.microbatch, 1 - to.microbatch);
      EXPECT_EQ(e.offset, to.microbatch == 0 ? 1 : 0);
    }
  }
  EXPECT_EQ(waits.size(), 8u);
  EXPECT_EQ(prefetch_edges, 8);
  const partition::Validation v = partition::validate_plan(plan);
  EXPECT_TRUE(v.ok()) << (v.problems.empty() ? "" : v.problems.front());
  // The plan file keeps it all: the kind, the cluster's input path, the edges.
  const Plan back = partition::read_plan_json(partition::write_plan_json(plan), "p.json");
  EXPECT_TRUE(partition::same_plan(back, plan));
  EXPECT_EQ(back.cluster.input, plan.cluster.input);
  // The closed form: 4 workers x 2 micro-batches x 16 samples an iteration, at 1 GB/s.
  const partition::LoaderBound b = partition::loader_bound(plan);
  EXPECT_DOUBLE_EQ(b.samples, 128);
  EXPECT_NEAR(b.samples_per_s, 1e9 / plan.network.stored_sample_bytes(), 1e-6);
}

TEST(LoadTasks, PrefetchDeeperThanAnIterationReachesFurtherBack) {
  const Plan plan = resnet_plan("input: {shared_read: 1 GB/s, prefetch: 3}\n");
  for (const partition::OrderEdge& e : plan.order) {
    const partition::Task& to = plan.task(e.to);
    if (to.kind != TaskKind::load) continue;
    // Micro-batch m waits for the forward 3 earlier: m - 3 + 2k with offset k >= 0.
    const partition::Task& from = plan.task(e.from);
    EXPECT_EQ(from.microbatch - 2 * e.offset, to.microbatch - 3);
  }
}

// Each load's time is its share of the loader's closed form: 4 workers on 2 nodes, each
// loading 2 micro-batches of 16 samples an iteration, all at once; so a worker gets a quarter
// of the file system (128 samples an iteration) and half its node's read path and workers (64
// samples), and a load, half its worker's samples, lasts half the slowest resource's iteration.
TEST(LoadTasks, ALoadLastsItsShareOfTheSlowestResource) {
  const Plan shared = resnet_plan("input: {shared_read: 1 GB/s}\n");
  const double sample_bytes = shared.network.stored_sample_bytes();
  const Plan read = resnet_plan("input: {node_read: 100 MB/s}\n");
  const Plan cpu = resnet_plan("input: {preprocess: 10 ms, workers: 4}\n");
  const Plan both = resnet_plan("input: {shared_read: 1 GB/s, preprocess: 10 ms, workers: 4}\n");
  int loads = 0;
  for (size_t id = 0; id < shared.tasks.size(); ++id) {
    if (shared.tasks[id].kind != TaskKind::load) continue;
    ++loads;
    EXPECT_NEAR(partition::load_time_s(shared, shared.tasks[id]), 128 * sample_bytes / 1e9 / 2, 1e-12);
    EXPECT_NEAR(partition::load_time_s(read, read.tasks[id]), 64 * sample_bytes / 100e6 / 2, 1e-12);
    EXPECT_NEAR(partition::load_time_s(cpu, cpu.tasks[id]), 64 * 10e-3 / 4 / 2, 1e-12);
    // The slower of the two: 80 ms of preprocessing against 7.4 ms of file system.
    EXPECT_NEAR(partition::load_time_s(both, both.tasks[id]), 0.08, 1e-12);
  }
  EXPECT_EQ(loads, 8);
}

// The search's estimate of a layout is at least the loader's closed form, and a loader that
// keeps up changes nothing.
TEST(LoadTasks, TheLayoutEstimateIsAtLeastTheLoaders) {
  const model::Network net = model::network_from_spec("resnet50", model::Precision::fp16);
  const Plan plain = resnet_plan("");
  const double gpus = partition::estimate_layout(net, plain.layout, partition::CostModel(plain.cluster, net.precision))
                          .iteration_time_s;
  // 128 samples an iteration through 1 MB/s: two minutes and more, far above the GPUs' time.
  const Plan slow = resnet_plan("input: {shared_read: 1 MB/s}\n");
  const double slow_s =
      partition::estimate_layout(net, slow.layout, partition::CostModel(slow.cluster, net.precision)).iteration_time_s;
  ASSERT_LT(gpus, 128 * net.stored_sample_bytes() / 1e6 / 100);
  EXPECT_NEAR(slow_s, 128 * net.stored_sample_bytes() / 1e6, 1e-9);
  const Plan fast = resnet_plan("input: {shared_read: 1 PB/s}\n");
  EXPECT_EQ(partition::estimate_layout(net, fast.layout, partition::CostModel(fast.cluster, net.precision)).iteration_time_s,
            gpus);
}
