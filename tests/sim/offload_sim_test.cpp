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
