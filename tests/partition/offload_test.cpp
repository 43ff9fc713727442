// Offloading the optimizer (--offload-optimizer, ZeRO-Offload): each device's step becomes a
// copy of its gradients to the host, the step on the node's CPUs and a copy of its parameters
// back, ordered before its next forward; its state moves from device to host memory, which
// validation holds to the node's; plans round-trip through their file; layouts it cannot
// serve are refused naming the option.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "model/error.hpp"
#include "model/io.hpp"
#include "model/zoo.hpp"
#include "partition/layout_estimate.hpp"
#include "partition/layout_file.hpp"
#include "partition/memory.hpp"
#include "partition/plan_builder.hpp"
#include "partition/plan_io.hpp"
#include "partition/policy.hpp"
#include "partition/validate.hpp"
#include "tests/partition/plan_test_util.hpp"

using namespace hetflow;
using namespace hetflow::partition;
using hetflow::test_support::error_of;

namespace {

using test_support::plan_of;

PlanOptions offloaded(int data, int pipeline, bool offload = true) {
  PlanOptions o;
  o.data = data;
  o.pipeline = pipeline;
  o.microbatches = 4;
  o.offload_optimizer = offload;
  return o;
}

const model::Network& gpt() {
  static const model::Network net =
      model::network_from_spec("gpt:layers=4,hidden=256,heads=8,seq=128,vocab=1000", model::Precision::fp16);
  return net;
}

}  // namespace

TEST(Offload, EachDeviceStepsOnItsHostBetweenTwoCopies) {
  const model::Cluster cluster = test_support::identical_cluster(4);
  const Plan plain = plan_of(cluster, gpt(), offloaded(2, 2, false));
  const Plan plan = plan_of(cluster, gpt(), offloaded(2, 2));
  ASSERT_TRUE(validate_plan(plan).ok()) << validate_plan(plan).problems.front();
  EXPECT_TRUE(plan.layout.offload.optimizer);
  for (int d = 0; d < 4; ++d) {
    std::map<TaskKind, std::vector<int>> of;
    for (size_t t = 0; t < plan.tasks.size(); ++t) {
      if (plan.tasks[t].device == d) of[plan.tasks[t].kind].push_back(static_cast<int>(t));
    }
    ASSERT_EQ(of[TaskKind::optimizer].size(), 0u) << d;
    ASSERT_EQ(of[TaskKind::to_host].size(), 1u) << d;
    ASSERT_EQ(of[TaskKind::host_optimizer].size(), 1u) << d;
    ASSERT_EQ(of[TaskKind::to_device].size(), 1u) << d;
    const Task& down = plan.task(of[TaskKind::to_host][0]);
    const Task& step = plan.task(of[TaskKind::host_optimizer][0]);
    const Task& up = plan.task(of[TaskKind::to_device][0]);
    // The state the device's optimizer held without offload: 12 bytes (fp32 master, two
    // moments) per parameter.
    const double params = plain.memory[static_cast<size_t>(d)].optimizer_bytes / 12;
    ASSERT_GT(params, 0);
    EXPECT_DOUBLE_EQ(down.bytes, 2 * params);  // fp16 gradients down
    EXPECT_DOUBLE_EQ(up.bytes, 2 * params);    // fp16 parameters up
    EXPECT_DOUBLE_EQ(step.flops, 12 * params);
    EXPECT_DOUBLE_EQ(step.memory_bytes, (2 + 24 + 2) * params);
    EXPECT_EQ(down.purpose, Purpose::offload);
    EXPECT_EQ(plan.stream_name(down.stream), "to_host");  // a copy engine per direction
    EXPECT_EQ(plan.stream_name(up.stream), "to_device");
    EXPECT_EQ(plan.stream_name(step.stream), "host");
    // Device memory loses the state; the host holds it and the two staging buffers.
    const DeviceMemory& m = plan.memory[static_cast<size_t>(d)];
    EXPECT_EQ(m.optimizer_bytes, 0);
    EXPECT_DOUBLE_EQ(m.host_bytes, (12 + 2 + 2) * params);
    EXPECT_DOUBLE_EQ(m.total_bytes(), plain.memory[static_cast<size_t>(d)].total_bytes() - 12 * params);
    // In order, and the next iteration's first compute (here a forward) waits for the
    // parameters to be back.
    std::map<std::pair<int, int>, int> edges;  // (from, to) -> offset
    for (const OrderEdge& e : plan.order) edges[{e.from, e.to}] = e.offset;
    const int down_id = of[TaskKind::to_host][0], step_id = of[TaskKind::host_optimizer][0],
              up_id = of[TaskKind::to_device][0];
    EXPECT_EQ(edges.count({down_id, step_id}), 1u);
    EXPECT_EQ(edges.count({step_id, up_id}), 1u);
    int first_forward = -1;
    for (const int t : of[TaskKind::forward]) first_forward = first_forward < 0 ? t : first_forward;
    ASSERT_EQ(edges.count({up_id, first_forward}), 1u) << d;
    EXPECT_EQ((edges[{up_id, first_forward}]), 1);
  }
}

// The closed form the policies size stages with agrees with the plan's tensors.
TEST(Offload, TheClosedFormMovesTheStateToTheHostAsThePlanDoes) {
  const model::Cluster cluster = test_support::identical_cluster(2);
  const Plan plan = plan_of(cluster, gpt(), offloaded(2, 1));
  const DeviceMemory closed = device_memory(gpt(), plan.layout, plan.layout.workers[0].stages, {1}, true, 0);
  EXPECT_EQ(closed.optimizer_bytes, 0);
  EXPECT_DOUBLE_EQ(closed.host_bytes, plan.memory[0].host_bytes);
}

TEST(Offload, AnOffloadedPlanRoundTripsThroughItsFile) {
  const model::Cluster cluster = test_support::identical_cluster(4);
  PlanOptions o = offloaded(2, 2);
  o.zero_stage = 1;
  const Plan plan = plan_of(cluster, gpt(), o);
  ASSERT_TRUE(validate_plan(plan).ok());
  const Plan back = read_plan_json(write_plan_json(plan), "offload.json");
  EXPECT_TRUE(same_plan(plan, back));
  EXPECT_TRUE(back.layout.offload.optimizer);
  EXPECT_GT(back.memory[0].host_bytes, 0);
  EXPECT_EQ(plan_fingerprint(back), plan_fingerprint(plan));
  EXPECT_NE(plan_fingerprint(plan), plan_fingerprint(plan_of(cluster, gpt(), offloaded(2, 2, false))));
}

// Eight GPUs offloading a 1.3 B-parameter GPT's state (16 bytes a parameter: 21 GB each, 168
// GB in all) into a host of 8 GiB: validation names the node, what it holds and what they
// offload.
TEST(Offload, ANodesHostMustHoldWhatItsDevicesOffload) {
  const model::Cluster cluster = model::parse_cluster(
      "name: small-host\nnodes:\n  - {name: n, gpu: A100-80, gpus: 8, host: {memory: 8 GiB}}\n", "small-host.yaml");
  const model::Network net = model::network_from_spec("gpt:layers=24,hidden=2048,heads=16,seq=1024,vocab=50257",
                                                      model::Precision::fp16);
  const Plan plan = plan_of(cluster, net, offloaded(8, 1));
  const Validation v = validate_plan(plan);
  ASSERT_EQ(v.problems.size(), 1u);
  EXPECT_NE(v.problems[0].find("node n's host memory holds 8 GiB but its 8 devices offload"), std::string::npos)
      << v.problems[0];
  EXPECT_THROW(require_valid(plan), PlanError);
  // The layout estimate, which the search screens with, sees the same overflow: 8 devices'
  // state and staging buffers against the 8 GiB host; a host of 256 GiB holds them.
  const CostModel cost(cluster, net.precision);
  const LayoutEstimate e = estimate_layout(net, plan.layout, cost);
  double host = 0;
  for (const DeviceMemory& m : plan.memory) host += m.host_bytes;
  EXPECT_NEAR(e.host_headroom_bytes, 8.0 * (1 << 30) - host, 1e-6 * host);
  const model::Cluster roomy = model::parse_cluster(
      "name: roomy-host\nnodes:\n  - {name: n, gpu: A100-80, gpus: 8, host: {memory: 256 GiB}}\n", "roomy-host.yaml");
  EXPECT_GT(estimate_layout(net, plan.layout, CostModel(roomy, net.precision)).host_headroom_bytes, 0);
}

TEST(Offload, WhatCannotOffloadIsRefusedNamingTheOption) {
  const model::Cluster cluster = test_support::identical_cluster(4);
  PlanOptions ps = offloaded(2, 1);
  ps.sync = SyncKind::ps;
  EXPECT_EQ(error_of([&] { plan_of(cluster, gpt(), ps); }).substr(0, 60),
            "offload_optimizer: moves each device's own optimizer state t");
  PlanOptions fold = offloaded(4, 1);
  fold.fold = true;
  EXPECT_EQ(error_of([&] { plan_of(cluster, gpt(), fold); }).substr(0, 47), "fold: does not fold a plan that offloads: the r");
}

// A layout file (search --out-layout, plan --layout) keeps the choice to offload.
TEST(Offload, ALayoutFileKeepsIt) {
  const model::Cluster cluster = test_support::identical_cluster(2);
  const Plan plan = plan_of(cluster, gpt(), offloaded(2, 1));
  const std::string text = write_layout_file(plan.layout, cluster);
  EXPECT_NE(text.find("\n  offload_optimizer: true\n"), std::string::npos) << text;
  PlanOptions o;
  apply_layout_file_options(text, "layout.yaml", o, [](std::string_view) { return false; });
  EXPECT_TRUE(o.offload_optimizer);
  EXPECT_EQ(write_layout_file(plan_of(cluster, gpt(), offloaded(2, 1, false)).layout, cluster).find("offload"),
            std::string::npos);
}
