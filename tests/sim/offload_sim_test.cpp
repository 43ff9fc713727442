// Offload's copies and host step simulated against hand-computed times. One node of two
// GPUs, data parallel over both, one layer of 100 M parameters in fp16; the host's PCIe
// bridge moves 10 GB/s each way after 10 us, its CPUs stream 100 GB/s of DRAM (and compute
// far faster, so the step is memory bound). Each device copies its 200 MB of gradients down
// (T = 10 us + 20 ms), steps 100 M x (2 + 24 + 2) = 2.8 GB of host memory traffic (S = 28 ms)
// and copies its 200 MB of parameters back (T).
//  - Both GPUs behind one bridge: their copies share each direction, and their steps the
//    CPUs, so each takes twice as long: F + B + R + 2 T + 2 S + 2 T.
//  - A bridge each: the copies run alone, the steps still share the CPUs: F + B + R + T + 2 S + T.
// The analytic estimate sees no sharing (CostModel::host_copy_time_s): F + B + R + T + S + T.
#include <gtest/gtest.h>

#include <string>

#include "model/io.hpp"
#include "partition/estimate.hpp"
#include "partition/plan_builder.hpp"
#include "partition/policy.hpp"
#include "partition/validate.hpp"
#include "sim/simulator.hpp"

using namespace hetflow;
using partition::TaskKind;

TEST(SimulatedOffload, CopiesAndStepsTakeTheirHandComputedTimesSharingBridgeAndCpus) {
  const double copy = 10e-6 + 2e8 / 10e9, step = 2.8e9 / 100e9;
  const model::Network net = model::parse_network(
      "name: one\nprecision: fp16\nlayers:\n  - {name: l0, forward_flops: 1e11, params: 1e8, output_elems: 1000}\n",
      "one.yaml");
  for (const int per_bridge : {2, 1}) {
    const std::string cluster_yaml =
        "name: one-node\nnodes:\n  - {name: n, gpu: A100-80, gpus: 2, intra: {kind: nvswitch, bandwidth: 1000 TB/s, "
        "latency: 0 s}, host: {memory: 1 TiB, pcie: 10 GB/s, pcie_latency: 10 us, gpus_per_bridge: " +
        std::to_string(per_bridge) + ", cpu_flops: 1000 TFLOP/s, cpu_memory_bandwidth: 100 GB/s}}\n";
    const model::Cluster cluster = model::parse_cluster(cluster_yaml, "one-node.yaml");
    partition::PlanOptions o;
    o.data = 2;
    o.microbatches = 1;
    o.workspace_bytes = 0;
    o.offload_optimizer = true;
    o.precision = net.precision;
    const partition::CostModel cost(cluster, net.precision);
    const partition::Plan plan = partition::build_plan(cluster, net, partition::make_layout(cluster, net, o, cost), cost);
    ASSERT_TRUE(partition::validate_plan(plan).ok());
    // The device's own work before its copies: its passes and its collectives, one after another.
    double on_device = 0;
    for (size_t t = 0; t < plan.tasks.size(); ++t) {
      const partition::Task& task = plan.tasks[t];
      if (task.device != 0) continue;
      if (task.kind == TaskKind::to_host || task.kind == TaskKind::to_device) {
        EXPECT_NEAR(partition::task_duration_s(plan, cost, static_cast<int>(t)), copy, 1e-12);
      } else if (task.kind == TaskKind::host_optimizer) {
        EXPECT_NEAR(partition::task_duration_s(plan, cost, static_cast<int>(t)), step, 1e-12);
      } else {
        on_device += partition::task_duration_s(plan, cost, static_cast<int>(t));
      }
    }
    ASSERT_LT(on_device, 0.5 * copy);  // the copies and the step dominate: the check measures them
    const double shared = per_bridge == 2 ? 2 : 1;
    const double expected = on_device + shared * copy + 2 * step + shared * copy;
    const sim::SimResult r = sim::simulate(plan, {});
    ASSERT_TRUE(r.completed);
    EXPECT_NEAR(r.simulated_s / expected, 1.0, 0.002) << per_bridge << " GPUs per bridge";
    EXPECT_NEAR(partition::estimate_plan(plan, cost).iteration_time_s / (on_device + copy + step + copy), 1.0, 0.002);
  }
}

// Activation offload's copies against hand-computed times. One GPU behind a 1 GB/s bridge of
// 10 us, one layer stashing 100 MB a micro-batch (c = 10 us + 0.1 s a copy each way, far
// longer than a pass), two micro-batches under GPipe: F0 F1 B0 B1, the optimizer R.
//  - F0's stash leaves over [f, f + c], F1's after it over [f + c, f + 2c] (one copy engine
//    a direction); F0's comes back as soon as it is out, over [f + c, f + 2c] (the other
//    direction), and F1's after it and after F1, over [f + 2c, f + 3c].
//  - B0 waits for its stash: [f + 2c, f + 2c + b]; B1 for its: [f + 3c, f + 3c + b].
// The iteration: f + 3c + b + R, against 2f + 2b + R without offload. With a bridge a
// thousand times faster the copies hide behind the passes: the time is as without.
TEST(SimulatedOffload, StashCopiesTakeTheirHandComputedTimesAndHideOnAFastBridge) {
  const model::Network net = model::parse_network(
      "name: one\nprecision: fp16\nlayers:\n  - {name: l0, forward_flops: 1e11, params: 1e6, output_elems: 1000, "
      "stashed_bytes: 1e8}\n",
      "one.yaml");
  for (const double pcie : {1e9, 1e12}) {
    const std::string cluster_yaml =
        "name: one-gpu\nnodes:\n  - {name: n, gpu: A100-80, gpus: 1, host: {memory: 1 TiB, pcie: " +
        std::to_string(pcie / 1e9) + " GB/s, pcie_latency: 10 us}}\n";
    const model::Cluster cluster = model::parse_cluster(cluster_yaml, "one-gpu.yaml");
    partition::PlanOptions o;
    o.microbatches = 2;
    o.schedule = "gpipe";
    o.workspace_bytes = 0;
    o.precision = net.precision;
    const partition::CostModel cost(cluster, net.precision);
    const partition::Plan plain = partition::build_plan(cluster, net, partition::make_layout(cluster, net, o, cost), cost);
    o.offload_activations = true;
    const partition::Plan plan = partition::build_plan(cluster, net, partition::make_layout(cluster, net, o, cost), cost);
    ASSERT_TRUE(partition::validate_plan(plan).ok()) << partition::validate_plan(plan).problems.front();
    const double c = 10e-6 + 1e8 / pcie;
    double f = 0, b = 0, r = 0;
    int copies = 0;
    for (size_t t = 0; t < plan.tasks.size(); ++t) {
      const partition::Task& task = plan.tasks[t];
      const double d = partition::task_duration_s(plan, cost, static_cast<int>(t));
      if (task.kind == TaskKind::to_host || task.kind == TaskKind::to_device) {
        EXPECT_DOUBLE_EQ(task.bytes, 1e8);
        EXPECT_NEAR(d, c, 1e-12 * c);
        ++copies;
      } else if (task.kind == TaskKind::forward) {
        f = d;
      } else if (task.kind == TaskKind::backward) {
        b = d;
      } else if (task.kind == TaskKind::optimizer) {
        r = d;
      }
    }
    ASSERT_EQ(copies, 4);
    const sim::SimResult without = sim::simulate(plain, {});
    const sim::SimResult with = sim::simulate(plan, {});
    ASSERT_TRUE(without.completed && with.completed);
    EXPECT_NEAR(without.simulated_s / (2 * f + 2 * b + r), 1.0, 0.002);
    if (pcie == 1e9) {
      ASSERT_GT(c, 2 * (f + b));  // the copies dominate: the check measures them
      EXPECT_NEAR(with.simulated_s / (f + 3 * c + b + r), 1.0, 0.002);
      EXPECT_NEAR(partition::estimate_plan(plan, cost).iteration_time_s / (f + 3 * c + b + r), 1.0, 0.002);
    } else {
      ASSERT_LT(2 * c, f);  // each copy fits inside a pass
      EXPECT_NEAR(with.simulated_s / without.simulated_s, 1.0, 0.002);
    }
  }
}
