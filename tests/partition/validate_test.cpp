// Hand-broken plans: each is rejected with a message that names what is wrong.
#include <gtest/gtest.h>

#include <algorithm>

#include "model/error.hpp"
#include "partition/estimate.hpp"
#include "partition/plan_builder.hpp"
#include "partition/plan_io.hpp"
#include "partition/policy.hpp"
#include "partition/validate.hpp"
#include "tests/partition/plan_test_util.hpp"

using namespace hetflow;
using namespace hetflow::partition;

namespace {

Plan small_plan(double memory_per_layer_bytes = 1e7) {
  const model::Cluster cluster = test_support::identical_cluster(4);
  model::Network net = test_support::equal_layers(8);
  for (model::Layer& l : net.layers) l.stashed_bytes = memory_per_layer_bytes;
  PlanOptions o;
  o.pipeline = 4;
  o.data = 1;
  o.microbatches = 4;
  const CostModel cost(cluster, net.precision);
  return build_plan(cluster, net, make_layout(cluster, net, o, cost), cost);
}

bool mentions(const Validation& v, const std::string& text) {
  return std::any_of(v.problems.begin(), v.problems.end(),
                     [&](const std::string& p) { return p.find(text) != std::string::npos; });
}

int first_task(const Plan& plan, TaskKind kind) {
  for (size_t i = 0; i < plan.tasks.size(); ++i) {
    if (plan.tasks[i].kind == kind) return static_cast<int>(i);
  }
  return -1;
}

}  // namespace

TEST(Validate, AWellFormedPlanIsValid) {
  const Plan plan = small_plan();
  const Validation v = validate_plan(plan);
  EXPECT_TRUE(v.ok()) << (v.ok() ? "" : v.problems.front());
  EXPECT_NO_THROW(require_valid(plan));
}

TEST(Validate, MissingReceiveIsNamed) {
  Plan plan = small_plan();
  const int recv = first_task(plan, TaskKind::recv);
  ASSERT_GE(recv, 0);
  plan.tasks[static_cast<size_t>(recv)].group = 100000;  // no longer pairs with its send
  const Validation v = validate_plan(plan);
  EXPECT_TRUE(mentions(v, "unmatched send")) << v.problems.front();
  EXPECT_TRUE(mentions(v, "has no matching receive"));
  EXPECT_THROW(require_valid(plan), PlanError);
}

TEST(Validate, MismatchedBytesAreNamed) {
  Plan plan = small_plan();
  const int recv = first_task(plan, TaskKind::recv);
  plan.tasks[static_cast<size_t>(recv)].bytes *= 2;
  EXPECT_TRUE(mentions(validate_plan(plan), "but receive of"));
}

TEST(Validate, CycleIsReportedAsDeadlockWithItsTasks) {
  Plan plan = small_plan();
  // Make rank 0's first forward wait for its own last backward.
  const auto program = plan.program(0, 0);
  plan.add_dependency(program.back(), program.front());
  const Validation v = validate_plan(plan);
  ASSERT_TRUE(mentions(v, "deadlock")) << (v.ok() ? "ok" : v.problems.front());
  EXPECT_TRUE(mentions(v, "forward #"));
  const CostModel cost(test_support::identical_cluster(4), model::Precision::fp16);
  EXPECT_THROW(estimate_plan(plan, cost), PlanError);
}

TEST(Validate, CrossedChannelsDeadlock) {
  // Two devices each send to the other before receiving, on one channel each way, where the
  // receives are ordered the other way round: a classic send/recv deadlock.
  Plan plan = small_plan();
  const int a = first_task(plan, TaskKind::send);
  const Task send_a = plan.tasks[static_cast<size_t>(a)];
  // Put device A's receive of the reverse transfer before its send, on the same stream.
  Task forged = send_a;
  forged.kind = TaskKind::recv;
  forged.peer = send_a.peer;
  forged.group = 5000;
  Task forged_send = send_a;
  forged_send.device = send_a.peer;
  forged_send.peer = send_a.device;
  forged_send.group = 5000;
  const int r = plan.add_task(forged);
  auto& streams = plan.programs[static_cast<size_t>(send_a.device)];
  auto& stream = std::find_if(streams.begin(), streams.end(), [&](const auto& p) { return p.stream == send_a.stream; })->tasks;
  std::rotate(stream.begin(), stream.end() - 1, stream.end());  // the forged recv goes first
  const int s = plan.add_task(forged_send);
  // The peer sends only after it has received A's first transfer.
  int peer_recv = -1;
  for (size_t i = 0; i < plan.tasks.size(); ++i) {
    if (plan.tasks[i].kind == TaskKind::recv && plan.tasks[i].group == send_a.group) peer_recv = static_cast<int>(i);
  }
  plan.add_dependency(peer_recv, s);
  (void)r;
  EXPECT_TRUE(mentions(validate_plan(plan), "deadlock"));
}

TEST(Validate, OversizedStageNamesDeviceTermAndExcess) {
  const Plan plan = small_plan(40e9);  // 2 layers x 40 GB per micro-batch per stage
  const Validation v = validate_plan(plan);
  ASSERT_FALSE(v.ok());
  EXPECT_TRUE(mentions(v, "n-0/gpu0 needs")) << v.problems.front();
  EXPECT_TRUE(mentions(v, "over by"));
  EXPECT_TRUE(mentions(v, "largest term: activations"));
  EXPECT_TRUE(mentions(v, "micro-batches in flight"));
}

TEST(Validate, LayerCoverageIsChecked) {
  Plan plan = small_plan();
  plan.layout.workers[0].stages[1].layer_begin += 1;  // a gap after the first chunk
  EXPECT_TRUE(mentions(validate_plan(plan), "do not cover the layers"));
}

TEST(Validate, BrokenPlanFilesGetFieldNamesNotCrashes) {
  const std::string good = write_plan_json(small_plan());
  auto error_of = [](const std::string& text) {
    try {
      read_plan_json(text, "p.json");
    } catch (const InputError& e) {
      return e.field() + ": " + e.message();
    }
    return std::string("no error");
  };
  EXPECT_NE(error_of(good.substr(0, good.size() / 2)).find("json: not valid JSON"), std::string::npos);
  EXPECT_NE(error_of("{\"format\": \"something\"}").find("format"), std::string::npos);
  std::string bad_device = good;
  const size_t at = bad_device.find("\"device\": ");
  bad_device.replace(at, std::string("\"device\": 0").size(), "\"device\": \"x\"");
  EXPECT_EQ(error_of(bad_device), "tasks[0].device: expected an integer, found \"x\"");
  std::string bad_version = good;
  bad_version.replace(bad_version.find("\"version\": 1"), 12, "\"version\": 9");
  EXPECT_NE(error_of(bad_version).find("version: expected 1, found 9"), std::string::npos);
  // A file that parses but whose tasks point nowhere: validation names it, nothing crashes.
  Plan plan = read_plan_json(good, "p.json");
  plan.tasks[0].device = 99;
  EXPECT_TRUE(mentions(validate_plan(plan), "device 99 does not exist"));
}
