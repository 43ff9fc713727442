// Where an iteration's time goes. The oracle: a trace made by hand whose compute,
// overlapping communication of two purposes and idle gaps are known to the microsecond.
#include "traces/breakdown.hpp"

#include <gtest/gtest.h>

#include "partition/plan_builder.hpp"
#include "partition/policy.hpp"
#include "tests/partition/plan_test_util.hpp"

using namespace hetflow;
using partition::Plan;
using partition::TaskKind;

namespace {

Plan two_stage_plan() {
  const model::Cluster cluster = test_support::identical_cluster(2);
  const model::Network net = test_support::equal_layers(4, 1e9, 2e9);
  partition::PlanOptions o;
  o.precision = net.precision;
  o.pipeline = 2;
  o.data = 1;
  o.microbatches = 1;
  o.workspace_bytes = 0;
  const partition::CostModel cost(cluster, net.precision);
  return partition::build_plan(cluster, net, partition::make_layout(cluster, net, o, cost), cost);
}

int first_task(const Plan& plan, int device, TaskKind kind) {
  for (size_t id = 0; id < plan.tasks.size(); ++id) {
    if (plan.tasks[id].device == device && plan.tasks[id].kind == kind) return static_cast<int>(id);
  }
  return -1;
}

traces::Event event(int task, int device, std::string kind, std::string purpose, int iteration, double start_s, double end_s) {
  traces::Event e;
  e.task = task;
  e.device = device;
  e.kind = partition::parse_task_kind(kind);
  e.purpose = partition::parse_purpose(purpose);
  e.iteration = iteration;
  e.start_s = start_s;
  e.end_s = end_s;
  return e;
}

}  // namespace

TEST(Breakdown, ComputeOverlappingCommunicationAndIdleAddUp) {
  const Plan plan = two_stage_plan();
  const partition::CostModel cost(plan.cluster, plan.layout.precision);
  const int f0 = first_task(plan, 0, TaskKind::forward), b0 = first_task(plan, 0, TaskKind::backward);
  const int f1 = first_task(plan, 1, TaskKind::forward);
  ASSERT_GE(f0, 0);
  ASSERT_GE(b0, 0);
  ASSERT_GE(f1, 0);
  traces::Trace trace;
  trace.device_names = plan.device_names;
  // Iteration 0 (warm-up) ends at 1 s. Iteration 1, from 1 s to 5 s, on device 0: forward
  // 1-2 s, a data-parallel transfer 1.5-2.5 s and a tensor-parallel one 2.2-3 s, backward
  // 3.5-4 s, idle the rest. Device 1 computes 1-5 s without a pause.
  trace.events = {event(f0, 0, "forward", "compute", 0, 0.0, 1.0),
                  event(f0, 0, "forward", "compute", 1, 1.0, 2.0),
                  event(-1, 0, "collective", "data_parallel", 1, 1.5, 2.5),
                  event(-1, 0, "collective", "tensor_parallel", 1, 2.2, 3.0),
                  event(b0, 0, "backward", "compute", 1, 3.5, 4.0),
                  event(f1, 1, "forward", "compute", 1, 1.0, 5.0)};
  const traces::Breakdown b = traces::compute_breakdown(trace, plan, cost);
  EXPECT_EQ(b.devices, 2);
  EXPECT_NEAR(b.iteration_time_s, 4.0, 1e-12);
  // Device 0: compute 1.5 s; exposed 2-2.2 data-parallel alone (0.2), 2.2-2.5 both (0.15
  // each), 2.5-3 tensor-parallel alone (0.5); idle 3-3.5 and 4-5 (1.5). Device 1: 4 s compute.
  EXPECT_NEAR(b.compute_s, (1.5 + 4.0) / 2, 1e-12);
  EXPECT_NEAR(b.exposed_comm_s, 1.0 / 2, 1e-12);
  EXPECT_NEAR(b.idle_s, 1.5 / 2, 1e-12);
  EXPECT_NEAR(b.compute_s + b.exposed_comm_s + b.idle_s, b.iteration_time_s, 1e-12);
  ASSERT_EQ(b.exposed_comm_by_purpose_s.size(), 2u);
  EXPECT_EQ(b.exposed_comm_by_purpose_s[0].first, "tensor_parallel");
  EXPECT_NEAR(b.exposed_comm_by_purpose_s[0].second, 0.65 / 2, 1e-12);
  EXPECT_EQ(b.exposed_comm_by_purpose_s[1].first, "data_parallel");
  EXPECT_NEAR(b.exposed_comm_by_purpose_s[1].second, 0.35 / 2, 1e-12);
  // Compute by operation: this network has no operation list, so by task kind.
  ASSERT_EQ(b.compute_by_operation_s.size(), 2u);
  EXPECT_EQ(b.compute_by_operation_s[0].first, "forward");
  EXPECT_NEAR(b.compute_by_operation_s[0].second, (1.0 + 4.0) / 2, 1e-12);
  EXPECT_EQ(b.compute_by_operation_s[1].first, "backward");
  EXPECT_NEAR(b.compute_by_operation_s[1].second, 0.5 / 2, 1e-12);
}

TEST(Breakdown, AnEmptyTraceHasNothingToSplit) {
  const Plan plan = two_stage_plan();
  const partition::CostModel cost(plan.cluster, plan.layout.precision);
  traces::Trace trace;
  trace.device_names = plan.device_names;
  const traces::Breakdown b = traces::compute_breakdown(trace, plan, cost);
  EXPECT_EQ(b.devices, 0);
  EXPECT_EQ(b.iteration_time_s, 0);
}
