// A run cut into segments (exec/segmented_run.hpp) on the CPU back end's proxies: every task
// instance once with the run's iteration numbers, a drain at each cut, the pauses left out
// of the timeline and listed, and a failure or a signal ending the run where it happened.
// That real-math training cut anywhere reaches the bits of one run is
// training_checkpoint_test.cpp's (SegmentedTraining).
#include <gtest/gtest.h>

#include <csignal>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "exec/cpu_backend.hpp"
#include "exec/segmented_run.hpp"
#include "model/error.hpp"
#include "tests/exec/exec_test_util.hpp"

using namespace hetflow;
using partition::Plan;

namespace {

exec::EngineOptions options(int iterations) {
  exec::EngineOptions o;
  o.iterations = iterations;
  o.watchdog_s = 20;
  o.max_buffer_bytes = 64 * 1024;
  return o;
}

Plan pipeline_plan() {
  return test_support::planned(model::cpu_cluster(4), test_support::tiny_gpt(), test_support::pipeline_options(2, 2, 4, "1f1b"));
}

// Task events (in-task messages left out) by (task, iteration).
std::set<std::pair<int, int>> instances(const traces::Trace& trace) {
  std::set<std::pair<int, int>> out;
  for (const traces::Event& e : trace.events) {
    if (e.message >= 0) continue;
    EXPECT_TRUE(out.insert({e.task, e.iteration}).second) << "task " << e.task << " iteration " << e.iteration;
  }
  return out;
}

TEST(SegmentedRun, RunsEveryIterationOnceAndDrainsAtEachCut) {
  const Plan plan = pipeline_plan();
  exec::CpuBackend cpu({1, 64 * 1024});
  std::vector<int> calls;
  const auto start = std::chrono::steady_clock::now();
  const exec::SegmentedResult r = exec::run_in_segments(plan, cpu, options(5), {2, 3}, [&](int done) {
    calls.push_back(done);
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
  });
  const double call_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(r.run.completed) << r.run.error;
  EXPECT_EQ(calls, (std::vector<int>{2, 3}));
  ASSERT_EQ(r.pauses.size(), 2u);
  EXPECT_EQ(r.pauses[0].after_iterations, 2);
  EXPECT_EQ(r.pauses[1].after_iterations, 3);
  for (const exec::Pause& p : r.pauses) EXPECT_GE(p.s, 0.03);

  const auto seen = instances(r.run.trace);
  EXPECT_EQ(seen.size(), plan.tasks.size() * 5);
  EXPECT_EQ(r.run.task_instances, static_cast<long long>(plan.tasks.size() * 5));
  EXPECT_EQ(seen.rbegin()->second, 4);
  EXPECT_TRUE(r.run.trace.partial.empty());
  EXPECT_EQ(r.run.trace.source, "exec-cpu");
  EXPECT_EQ(r.run.trace.fingerprint, plan.fingerprint);
  // A drain at each cut: nothing after it starts before everything before it ended.
  for (const int cut : {2, 3}) {
    double before_end = 0, after_start = 1e30;
    for (const traces::Event& e : r.run.trace.events) {
      if (e.iteration < cut) before_end = std::max(before_end, e.end_s);
      if (e.iteration >= cut) after_start = std::min(after_start, e.start_s);
    }
    EXPECT_LE(before_end, after_start) << "cut " << cut;
  }
  // One timeline without the pauses: it ends within the segments' wall time, which with the
  // pauses fits in the call's.
  double last_end = 0;
  for (const traces::Event& e : r.run.trace.events) last_end = std::max(last_end, e.end_s);
  EXPECT_LE(last_end, r.run.wall_s + 1e-9);
  EXPECT_LE(r.run.wall_s + r.pauses[0].s + r.pauses[1].s, call_s + 1e-9);
  EXPECT_TRUE(std::is_sorted(r.run.trace.events.begin(), r.run.trace.events.end(),
                             [](const traces::Event& a, const traces::Event& b) { return a.start_s < b.start_s; }));
  ASSERT_EQ(r.run.memory.size(), static_cast<size_t>(plan.device_count()));
  for (const exec::DeviceMemoryUse& m : r.run.memory) EXPECT_GT(m.persistent_bytes, 0);
}

TEST(SegmentedRun, CutsOutsideTheRunAreIgnoredAndOutOfOrderOnesRefused) {
  const Plan plan = pipeline_plan();
  exec::CpuBackend cpu({1, 64 * 1024});
  int calls = 0;
  const exec::SegmentedResult r = exec::run_in_segments(plan, cpu, options(3), {0, 3, 7}, [&](int) { ++calls; });
  ASSERT_TRUE(r.run.completed) << r.run.error;
  EXPECT_EQ(calls, 0);
  EXPECT_TRUE(r.pauses.empty());
  EXPECT_EQ(instances(r.run.trace).size(), plan.tasks.size() * 3);
  EXPECT_THROW(exec::run_in_segments(plan, cpu, options(3), {2, 1}, [](int) {}), InputError);
}

TEST(SegmentedRun, AFailingSegmentEndsTheRunAndItsTraceSaysWhere) {
  const Plan plan = pipeline_plan();
  int victim = -1;
  for (size_t t = 0; t < plan.tasks.size() && victim < 0; ++t) {
    if (plan.tasks[t].kind == partition::TaskKind::backward) victim = static_cast<int>(t);
  }
  test_support::ThrowingBackend backend(victim);  // (throws at iteration 1: the second segment's first)
  std::vector<int> calls;
  const exec::SegmentedResult r = exec::run_in_segments(plan, backend, options(4), {1, 2}, [&](int done) { calls.push_back(done); });
  EXPECT_FALSE(r.run.completed);
  EXPECT_EQ(calls, (std::vector<int>{1}));
  EXPECT_NE(r.run.error.find("injected failure"), std::string::npos) << r.run.error;
  EXPECT_NE(r.run.error.find("iteration 1"), std::string::npos) << r.run.error;
  EXPECT_FALSE(r.run.trace.partial.empty());
  EXPECT_EQ(r.run.trace.planned_iterations, 4);
  const auto seen = instances(r.run.trace);
  for (size_t t = 0; t < plan.tasks.size(); ++t) EXPECT_TRUE(seen.count({static_cast<int>(t), 0})) << "task " << t;
  for (const auto& [task, iteration] : seen) EXPECT_LE(iteration, 1);
}

TEST(SegmentedRun, ASignalWhileBetweenRunsStopsBeforeTheNextSegment) {
  const Plan plan = pipeline_plan();
  exec::CpuBackend cpu({1, 64 * 1024});
  std::atomic<int> signal{0};
  exec::EngineOptions o = options(4);
  o.interrupt = &signal;
  const exec::SegmentedResult r = exec::run_in_segments(plan, cpu, o, {2}, [&](int) { signal.store(SIGINT); });
  EXPECT_FALSE(r.run.completed);
  EXPECT_EQ(r.run.interrupted, SIGINT);
  EXPECT_EQ(r.run.error, "interrupted by SIGINT (Ctrl-C) after step 2");
  EXPECT_EQ(r.run.trace.partial, r.run.error);
  EXPECT_EQ(r.run.trace.planned_iterations, 4);
  EXPECT_EQ(r.run.task_instances, static_cast<long long>(plan.tasks.size() * 2));
  ASSERT_EQ(r.pauses.size(), 1u);
}

// A run that goes on from another numbers its iterations from there: what the back end sees,
// the trace and the failures say the run's numbers.
TEST(SegmentedRun, AFirstIterationNumbersTheRunFromThere) {
  const Plan plan = pipeline_plan();
  exec::CpuBackend cpu({1, 64 * 1024});
  exec::EngineOptions o = options(2);
  o.first_iteration = 7;
  std::set<int> seen_by_hook;
  std::mutex mutex;
  o.on_task_end = [&](const exec::TaskView& v) {
    std::lock_guard lock(mutex);
    seen_by_hook.insert(v.iteration);
  };
  const exec::RunResult r = exec::run_plan(plan, cpu, o);
  ASSERT_TRUE(r.completed) << r.error;
  EXPECT_EQ(seen_by_hook, (std::set<int>{7, 8}));
  std::set<int> traced;
  for (const traces::Event& e : r.trace.events) traced.insert(e.iteration);
  EXPECT_EQ(traced, (std::set<int>{7, 8}));
  o.first_iteration = -1;
  EXPECT_THROW(exec::run_plan(plan, cpu, o), InputError);
}

}  // namespace
