// Offloading activations (--offload-activations): each forward's stash goes to the host on
// the device's to_host stream and comes back on its to_device stream before its backward,
// started one compute task ahead; a stash whose backward comes next stays. The device then
// holds a stash only around its passes and the host the rest, which validation holds to the
// node's memory; plans and layout files keep the choice.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "model/io.hpp"
#include "model/zoo.hpp"
#include "partition/layout_estimate.hpp"
#include "partition/layout_file.hpp"
#include "partition/memory.hpp"
#include "partition/plan_builder.hpp"
#include "partition/plan_io.hpp"
#include "partition/policy.hpp"
#include "partition/schedule.hpp"
#include "partition/validate.hpp"
#include "tests/partition/plan_test_util.hpp"

using namespace hetflow;
using namespace hetflow::partition;

namespace {

using test_support::plan_of;

PlanOptions options(int pipeline, int microbatches, bool offload, const std::string& schedule = "1f1b") {
  PlanOptions o;
  o.pipeline = pipeline;
  o.microbatches = microbatches;
  o.schedule = schedule;
  o.offload_activations = offload;
  return o;
}

const model::Network& gpt() {
  static const model::Network net =
      model::network_from_spec("gpt:layers=8,hidden=256,heads=8,seq=128,vocab=1000", model::Precision::fp16);
  return net;
}

// The task of `kind` on `stage` for micro-batch `mb`, or -1.
int task_of(const Plan& plan, TaskKind kind, int stage, int mb) {
  for (size_t t = 0; t < plan.tasks.size(); ++t) {
    const Task& task = plan.tasks[t];
    if (task.kind == kind && task.stage == stage && task.microbatch == mb) return static_cast<int>(t);
  }
  return -1;
}

}  // namespace

TEST(OffloadActivations, EachStashLeavesAfterItsForwardAndIsBackBeforeItsBackward) {
  const model::Cluster cluster = test_support::identical_cluster(4);
  const Plan plan = plan_of(cluster, gpt(), options(4, 8, true));
  ASSERT_TRUE(validate_plan(plan).ok()) << validate_plan(plan).problems.front();
  EXPECT_TRUE(plan.layout.offload.activations);
  const RankPrograms programs = schedule_by_name("1f1b").build(4, 8, 1);
  std::map<std::pair<int, int>, int> order;  // (from, to) -> offset
  for (const OrderEdge& e : plan.order) order[{e.from, e.to}] = e.offset;
  int copied = 0;
  for (int stage = 0; stage < 4; ++stage) {
    const std::vector<ScheduledOp>& program = programs[static_cast<size_t>(stage)];
    for (size_t i = 0; i < program.size(); ++i) {
      if (program[i].kind != OpKind::F) continue;
      const int mb = program[i].microbatch;
      const int f = task_of(plan, TaskKind::forward, stage, mb), b = task_of(plan, TaskKind::backward, stage, mb);
      const int out = task_of(plan, TaskKind::to_host, stage, mb), back = task_of(plan, TaskKind::to_device, stage, mb);
      ASSERT_GE(f, 0);
      ASSERT_GE(b, 0);
      int stash = -1;
      for (const int t : plan.writes(f)) stash = plan.tensor(t).kind == TensorKind::stash ? t : stash;
      ASSERT_GE(stash, 0);
      // The last stage runs each backward right after its forward: nothing to gain there.
      const bool next = i + 1 < program.size() && program[i + 1] == ScheduledOp{OpKind::B, mb, 0};
      if (next) {
        EXPECT_EQ(out, -1) << stage << " " << mb;
        EXPECT_EQ(back, -1) << stage << " " << mb;
        EXPECT_EQ(plan.tensor(stash).free_after, b);
        continue;
      }
      ++copied;
      ASSERT_GE(out, 0) << stage << " " << mb;
      ASSERT_GE(back, 0) << stage << " " << mb;
      const Task &down = plan.task(out), &up = plan.task(back);
      // Out: reads the forward's stash, which it frees, into a host_stash of the same bytes.
      ASSERT_EQ(plan.reads(out).size(), 1u);
      EXPECT_EQ(plan.reads(out)[0], stash);
      EXPECT_EQ(plan.tensor(stash).free_after, out);
      const int host = plan.writes(out)[0];
      EXPECT_EQ(plan.tensor(host).kind, TensorKind::host_stash);
      EXPECT_DOUBLE_EQ(down.bytes, plan.tensor(stash).bytes);
      EXPECT_DOUBLE_EQ(plan.tensor(host).bytes, plan.tensor(stash).bytes);
      EXPECT_EQ(plan.stream_name(down.stream), "to_host");
      EXPECT_EQ(down.purpose, Purpose::offload);
      // Back: reads the host copy, which it frees, into the stash the backward reads.
      EXPECT_EQ(plan.reads(back)[0], host);
      EXPECT_EQ(plan.tensor(host).free_after, back);
      const int again = plan.writes(back)[0];
      EXPECT_EQ(plan.tensor(again).kind, TensorKind::stash);
      EXPECT_EQ(plan.tensor(again).free_after, b);
      const auto reads = plan.reads(b);
      EXPECT_NE(std::find(reads.begin(), reads.end(), again), reads.end());
      EXPECT_DOUBLE_EQ(up.bytes, down.bytes);
      EXPECT_EQ(plan.stream_name(up.stream), "to_device");
      // Started when the compute task before the backward starts: after the one before that.
      const std::vector<int>& computes = plan.program(up.device, plan.task(b).stream);
      const auto at = std::find(computes.begin(), computes.end(), b) - computes.begin();
      ASSERT_GE(at, 2);
      EXPECT_EQ(order.count({computes[static_cast<size_t>(at - 2)], back}), 1u) << stage << " " << mb;
    }
  }
  EXPECT_EQ(copied, 3 * 8);  // every micro-batch of the first three stages
}

// The first stage of eight holds eight micro-batches' stashes at its peak under 1F1B;
// offloaded, at most three: the one a pass makes or reads, the next backward's coming back
// and the last forward's leaving. Its host holds the ones between.
TEST(OffloadActivations, TheDeviceHoldsFewerStashesAndTheHostTheRest) {
  const model::Cluster cluster = test_support::identical_cluster(8);
  const Plan plain = plan_of(cluster, gpt(), options(8, 16, false));
  const Plan plan = plan_of(cluster, gpt(), options(8, 16, true));
  const DeviceMemory &before = plain.memory[0], &after = plan.memory[0];
  EXPECT_EQ(before.peak_in_flight, 8);
  EXPECT_LE(after.peak_in_flight, 3);
  EXPECT_LE(after.activations_bytes, 3.0 / 8 * before.activations_bytes * (1 + 1e-12));
  EXPECT_EQ(before.host_bytes, 0);
  // The host holds what is in flight and not on the device, at most every stash but one.
  EXPECT_GT(after.host_bytes, 0);
  EXPECT_LE(after.host_bytes, before.activations_bytes);
  EXPECT_EQ(after.weights_bytes, before.weights_bytes);
  EXPECT_EQ(after.optimizer_bytes, before.optimizer_bytes);
  // The closed form the policies size stages with: three stashes on the device, every one in
  // flight in host memory; a bound of what the lifetimes give.
  const std::vector<Stage>& stages = plan.layout.workers[0].stages;
  const DeviceMemory closed = device_memory(gpt(), plan.layout, {stages[0]}, {8}, true, 0);
  const DeviceMemory closed_plain = device_memory(gpt(), plain.layout, {stages[0]}, {8}, true, 0);
  EXPECT_DOUBLE_EQ(closed.activations_bytes, closed_plain.activations_bytes * 3 / 8);
  EXPECT_DOUBLE_EQ(closed.host_bytes, closed_plain.activations_bytes);
  EXPECT_LE(after.activations_bytes, closed.activations_bytes * (1 + 1e-12));
  EXPECT_LE(after.host_bytes, closed.host_bytes * (1 + 1e-12));
  // The last stage copies nothing: its memory is as before.
  EXPECT_DOUBLE_EQ(plan.memory[7].total_bytes(), plain.memory[7].total_bytes());
  EXPECT_EQ(plan.memory[7].host_bytes, 0);
}

TEST(OffloadActivations, APlanAndALayoutFileKeepIt) {
  const model::Cluster cluster = test_support::identical_cluster(4);
  PlanOptions o = options(2, 4, true, "gpipe");
  o.data = 2;
  o.offload_optimizer = true;
  o.zero_stage = 1;
  const Plan plan = plan_of(cluster, gpt(), o);
  ASSERT_TRUE(validate_plan(plan).ok()) << validate_plan(plan).problems.front();
  const Plan back = read_plan_json(write_plan_json(plan), "offload.json");
  EXPECT_TRUE(same_plan(plan, back));
  EXPECT_TRUE(back.layout.offload.activations);
  EXPECT_TRUE(back.layout.offload.optimizer);
  EXPECT_EQ(plan_fingerprint(back), plan_fingerprint(plan));
  o.offload_activations = false;
  EXPECT_NE(plan_fingerprint(plan), plan_fingerprint(plan_of(cluster, gpt(), o)));
  const std::string text = write_layout_file(plan.layout, cluster);
  EXPECT_NE(text.find("\n  offload_activations: true\n"), std::string::npos) << text;
  PlanOptions read;
  apply_layout_file_options(text, "layout.yaml", read, [](std::string_view) { return false; });
  EXPECT_TRUE(read.offload_activations);
}

// Under every schedule, with the split backward's W and interleaving's chunks, each copy
// back precedes the passes that read its stash and the plan validates.
TEST(OffloadActivations, EverySchedulePlansAndValidates) {
  const model::Cluster cluster = test_support::identical_cluster(2);
  for (const Schedule& s : schedules()) {
    PlanOptions o = options(2, 4, true, s.name);
    if (s.interleaved) o.virtual_stages = 2;
    for (const Recompute r : {Recompute::none, Recompute::full}) {
      o.recompute = r;
      const Plan plan = plan_of(cluster, gpt(), o);
      const Validation v = validate_plan(plan);
      ASSERT_TRUE(v.ok()) << s.name << ": " << v.problems.front();
      int copies = 0;
      for (const Task& t : plan.tasks) copies += t.kind == TaskKind::to_device;
      EXPECT_GT(copies, 0) << s.name;
    }
  }
}

// Without a pipeline, 1F1B runs each backward right after its forward: the option would
// change nothing, and says so; GPipe's forwards all run first, so its stashes leave.
TEST(OffloadActivations, APlanWithNothingToOffloadIsRefusedNamingTheOption) {
  const model::Cluster cluster = test_support::identical_cluster(2);
  PlanOptions o = options(1, 4, true);
  o.data = 2;
  EXPECT_EQ(test_support::error_of([&] { plan_of(cluster, gpt(), o); }).substr(0, 82),
            "offload_activations: has nothing to offload: every backward follows its own forwar");
  o.schedule = "gpipe";
  EXPECT_TRUE(validate_plan(plan_of(cluster, gpt(), o)).ok());
}

// A host too small for the stashes in flight: validation names the node.
TEST(OffloadActivations, ANodesHostMustHoldTheStashes) {
  const model::Cluster cluster = model::parse_cluster(
      "name: small-host\nnodes:\n  - {name: n, gpu: A100-80, gpus: 4, host: {memory: 1 MiB}}\n", "small-host.yaml");
  const Plan plan = plan_of(cluster, gpt(), options(4, 8, true));
  const Validation v = validate_plan(plan);
  ASSERT_EQ(v.problems.size(), 1u);
  EXPECT_NE(v.problems[0].find("node n's host memory holds 1 MiB but its 3 devices offload"), std::string::npos)
      << v.problems[0];
  // The layout estimate (the search's screen) holds every stash in flight there: at least
  // what the plan's peak holds.
  const LayoutEstimate e = estimate_layout(gpt(), plan.layout, CostModel(cluster, gpt().precision));
  double host = 0;
  for (const DeviceMemory& m : plan.memory) host += m.host_bytes;
  EXPECT_LE(e.host_headroom_bytes, (1 << 20) - host);
}
