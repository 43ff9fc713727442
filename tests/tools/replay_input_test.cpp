// tools/replay_input.hpp without the command line: a simulated trace read back as the
// durations a replay runs, each the event's own time plus its device's dispatch.
#include "tools/replay_input.hpp"

#include <gtest/gtest.h>

#include "model/error.hpp"
#include "model/io.hpp"
#include "model/zoo.hpp"
#include "partition/plan_builder.hpp"
#include "partition/plan_io.hpp"
#include "partition/policy.hpp"
#include "traces/event_index.hpp"

namespace hetflow {
namespace {

tools::Replay simulated_replay() {
  const model::Cluster cluster = model::builtin_cluster("cpu-4");
  const model::Network net = model::network_from_spec("gpt:layers=2,hidden=64,heads=4,seq=32,vocab=256", model::Precision::fp32);
  partition::PlanOptions o;
  o.pipeline = 2;
  o.data = 2;
  o.global_batch = 8;
  o.precision = net.precision;
  o.iterations = 2;
  const partition::CostModel cost(cluster, net.precision);
  tools::Replay r;
  r.plan = partition::build_plan(cluster, net, partition::make_layout(cluster, net, o, cost), cost);
  r.plan.fingerprint = partition::plan_fingerprint(r.plan);
  r.trace_path = "simulated.csv";
  r.measured = sim::simulate(r.plan, {}).trace;
  return r;
}

TEST(ReplayInput, EveryComputeInstanceTakesItsMeasuredTimeAndDispatch) {
  tools::Replay r = simulated_replay();
  r.options.calibration.default_gpu.dispatch_s = 1e-3;
  tools::take_measured_durations(r);
  const size_t tasks = r.plan.tasks.size();
  ASSERT_EQ(r.options.compute_s.size(), tasks * 2);
  const traces::EventIndex index(r.measured, r.plan);
  const std::vector<double> dispatch = tools::dispatch_of_devices(r.plan, r.options.calibration);
  int compute = 0;
  for (size_t i = 0; i < r.options.compute_s.size(); ++i) {
    const int task = static_cast<int>(i % tasks), iteration = static_cast<int>(i / tasks);
    if (!partition::is_compute(r.plan.tasks[static_cast<size_t>(task)].kind)) continue;
    ++compute;
    const double want = index.own_s(r.measured, task, iteration) + dispatch[static_cast<size_t>(r.plan.tasks[static_cast<size_t>(task)].device)];
    EXPECT_DOUBLE_EQ(r.options.compute_s[i], want) << "task " << task << " iteration " << iteration;
  }
  EXPECT_GT(compute, 0);
}

TEST(ReplayInput, AMissingComputeInstanceBlamesTheTrace) {
  tools::Replay r = simulated_replay();
  for (size_t e = 0; e < r.measured.events.size(); ++e) {
    if (partition::is_compute(r.measured.events[e].kind)) {
      r.measured.events.erase(r.measured.events.begin() + static_cast<std::ptrdiff_t>(e));
      break;
    }
  }
  try {
    tools::take_measured_durations(r);
    FAIL() << "a trace without one compute instance replayed";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("simulated.csv"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("1 compute task instances of the plan are not in the trace"), std::string::npos)
        << e.what();
  }
}

// A partial trace keeps its complete iterations: the plan is cut to them.
TEST(ReplayInput, APartialTraceKeepsItsCompleteIterations) {
  tools::Replay r = simulated_replay();
  int last = -1;
  for (size_t e = 0; e < r.measured.events.size(); ++e) {
    if (r.measured.events[e].iteration == 1 && partition::is_compute(r.measured.events[e].kind)) last = static_cast<int>(e);
  }
  ASSERT_GE(last, 0);
  r.measured.events.erase(r.measured.events.begin() + last);
  r.measured.partial = "interrupted";
  tools::keep_complete_iterations(r);
  EXPECT_EQ(r.plan.layout.iterations, 1);
  EXPECT_EQ(r.planned_iterations, 2);
  for (const traces::Event& e : r.measured.events) EXPECT_EQ(e.iteration, 0);
}

}  // namespace
}  // namespace hetflow
