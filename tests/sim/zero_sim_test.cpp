// A ZeRO-3 layer simulated against its hand-computed transfers: two replicas of one layer of
// 100 M parameters (200 MB in fp16) on a flat network of 10 GB/s and 10 us. A ring
// all-gather or reduce-scatter of S bytes over n = 2 moves (n - 1) / n S over one route and
// pays (n - 1) latencies: 10 ms + 10 us here, far longer than the layer's forward.
//  - Resharding after the forward: the forward's all-gather, then the backward's, prefetched
//    behind the forward but longer than it (the backward waits for it: 2 G), the backward, its
//    reduce-scatter, the optimizer: 2 G + B + R + O.
//  - Without: one all-gather, the forward, the backward, the reduce-scatter, the optimizer:
//    G + F + B + R + O.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "model/io.hpp"
#include "partition/estimate.hpp"
#include "partition/plan_builder.hpp"
#include "partition/policy.hpp"
#include "partition/validate.hpp"
#include "sim/simulator.hpp"

using namespace hetflow;
using partition::TaskKind;

namespace {

// One GPU a node of each type given, on a flat 10 GB/s, 5 us network (free inside a node).
model::Cluster flat_cluster(const std::vector<std::string>& gpus) {
  std::string yaml = "name: flat\nfabric: {kind: switch, latency: 0 s}\nnodes:\n";
  for (size_t i = 0; i < gpus.size(); ++i) {
    yaml += "  - {name: n" + std::to_string(i) + ", gpu: " + gpus[i] +
            ", gpus: 1, intra: {kind: nvswitch, bandwidth: 1000 TB/s, latency: 0 s}, "
            "nic: {count: 1, bandwidth: 10000000000 B/s, latency: 0.000005 s}}\n";
  }
  return model::parse_cluster(yaml, "flat.yaml");
}

// One layer of 100 M fp16 parameters.
model::Network one_layer() {
  return model::parse_network(
      "name: one\nprecision: fp16\nlayers:\n  - {name: l0, forward_flops: 1e12, params: 1e8, output_elems: 1000}\n",
      "one.yaml");
}

}  // namespace

TEST(SimulatedZero, AShardedLayerTakesItsHandComputedTransfers) {
  const double bandwidth = 10e9, latency = 10e-6;
  const model::Cluster cluster = flat_cluster({"A100-80", "A100-80"});
  const model::Network net = one_layer();
  const double bytes = 2e8;  // the layer's fp16 parameters, and its gradients
  const double transfer = (2 - 1) / 2.0 * bytes / bandwidth + (2 - 1) * latency;
  for (const bool reshard : {true, false}) {
    partition::PlanOptions o;
    o.data = 2;
    o.microbatches = 1;
    o.workspace_bytes = 0;
    o.zero_stage = 3;
    o.reshard_after_forward = reshard;
    o.precision = net.precision;
    const partition::CostModel cost(cluster, net.precision);
    const partition::Plan plan = partition::build_plan(cluster, net, partition::make_layout(cluster, net, o, cost), cost);
    ASSERT_TRUE(partition::validate_plan(plan).ok());
    std::map<TaskKind, double> s;
    for (size_t t = 0; t < plan.tasks.size(); ++t) {
      if (plan.tasks[t].device == 0 && plan.tasks[t].kind != TaskKind::collective) {
        s[plan.tasks[t].kind] = partition::task_duration_s(plan, cost, static_cast<int>(t));
      }
    }
    const double f = s[TaskKind::forward], b = s[TaskKind::backward], opt = s[TaskKind::optimizer];
    ASSERT_LT(f, transfer);
    const double expected = reshard ? 2 * transfer + b + transfer + opt : transfer + f + b + transfer + opt;
    const sim::SimResult r = sim::simulate(plan, {});
    ASSERT_TRUE(r.completed);
    EXPECT_NEAR(r.simulated_s / expected, 1.0, 0.01) << (reshard ? "resharding" : "kept gathered");
    EXPECT_NEAR(partition::estimate_plan(plan, cost).iteration_time_s / expected, 1.0, 0.01);
  }
}

// The same layer with shares by memory on an A100-80 and an A100-40: the 80 GB replica keeps
// two thirds of it, and each transfer of the ring (one step over two members) moves the
// larger part, 2/3 S, so that G = R = 2/3 S / B + a; the optimizer steps two thirds of the
// parameters on the larger replica, which the iteration waits for.
TEST(SimulatedZero, SharesByMemoryTakeTheLargerPartsTransfer) {
  const double bandwidth = 10e9, latency = 10e-6;
  const model::Cluster cluster = flat_cluster({"A100-80", "A100-40"});
  const model::Network net = one_layer();
  const double bytes = 2e8;
  const double transfer = 2.0 / 3 * bytes / bandwidth + latency;
  partition::PlanOptions o;
  o.data = 2;
  o.microbatches = 1;
  o.workspace_bytes = 0;
  o.zero_stage = 3;
  o.zero_shares = partition::ZeroShares::memory;
  o.precision = net.precision;
  const partition::CostModel cost(cluster, net.precision);
  const partition::Plan plan = partition::build_plan(cluster, net, partition::make_layout(cluster, net, o, cost), cost);
  ASSERT_TRUE(partition::validate_plan(plan).ok());
  std::map<TaskKind, double> s;  // each kind's longest, over both replicas
  for (size_t t = 0; t < plan.tasks.size(); ++t) {
    if (plan.tasks[t].kind == TaskKind::collective) continue;
    s[plan.tasks[t].kind] = std::max(s[plan.tasks[t].kind], partition::task_duration_s(plan, cost, static_cast<int>(t)));
  }
  EXPECT_NEAR(plan.memory[0].optimizer_bytes / plan.memory[1].optimizer_bytes, 2.0, 1e-6);
  const double b = s[TaskKind::backward], opt = s[TaskKind::optimizer];
  ASSERT_LT(s[TaskKind::forward], transfer);
  const double expected = 2 * transfer + b + transfer + opt;
  const sim::SimResult r = sim::simulate(plan, {});
  ASSERT_TRUE(r.completed);
  EXPECT_NEAR(r.simulated_s / expected, 1.0, 0.01);
  EXPECT_NEAR(partition::estimate_plan(plan, cost).iteration_time_s / expected, 1.0, 0.01);
}

// Four replicas of alternating memory (parts 1/3, 1/6, 1/3, 1/6): the estimate's ring, in
// which a member paces only its neighbours, against the simulated steps.
TEST(SimulatedZero, AnUnevenRingOfFourEstimatesAsItSimulates) {
  const model::Cluster cluster = flat_cluster({"A100-80", "A100-40", "A100-80", "A100-40"});
  const model::Network net = one_layer();
  for (int stage = 1; stage <= 3; ++stage) {
    partition::PlanOptions o;
    o.data = 4;
    o.microbatches = 1;
    o.workspace_bytes = 0;
    o.zero_stage = stage;
    o.zero_shares = partition::ZeroShares::memory;
    o.precision = net.precision;
    const partition::CostModel cost(cluster, net.precision);
    const partition::Plan plan = partition::build_plan(cluster, net, partition::make_layout(cluster, net, o, cost), cost);
    ASSERT_TRUE(partition::validate_plan(plan).ok());
    const sim::SimResult r = sim::simulate(plan, {});
    ASSERT_TRUE(r.completed);
    EXPECT_NEAR(partition::estimate_plan(plan, cost).iteration_time_s / r.simulated_s, 1.0, 0.01) << "stage " << stage;
  }
}
