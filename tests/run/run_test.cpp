// A run of a plan, whole, without the command line: the request's training setup, the back
// end and engine options, and the comparison with the simulator and the estimate, each
// checked against a figure the test computes on its own from the trace or the plan.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "exec/engine.hpp"
#include "model/error.hpp"
#include "model/io.hpp"
#include "partition/estimate.hpp"
#include "run/compare.hpp"
#include "run/run.hpp"
#include "sim/simulator.hpp"
#include "tests/exec/exec_test_util.hpp"

namespace hetflow {
namespace {

using test_support::planned;
using test_support::tiny_gpt;

// Two pipeline stages on two CPU devices, two micro-batches, `iterations` iterations.
partition::Plan two_stages(int iterations) {
  partition::PlanOptions o;
  o.pipeline = 2;
  o.data = 1;
  o.microbatches = 2;
  o.iterations = iterations;
  partition::Plan plan = planned(model::cpu_cluster(2), tiny_gpt(), o);
  return plan;
}

run::Request proxy_request(partition::Plan plan, int warmup, int steps) {
  run::Request r;
  r.plan = std::move(plan);
  r.plan.layout.iterations = warmup + steps;
  r.plan.fingerprint = partition::plan_fingerprint(r.plan);
  r.warmup = warmup;
  r.steps = steps;
  r.compute = "proxy";
  return r;
}

// The oracle for step times: each iteration ends with its last event, and a step is the
// time from the previous iteration's end to its own.
std::vector<double> steps_of(const traces::Trace& trace, int iterations) {
  std::vector<double> end(static_cast<size_t>(iterations), 0);
  for (const traces::Event& e : trace.events) end[static_cast<size_t>(e.iteration)] = std::max(end[static_cast<size_t>(e.iteration)], e.end_s);
  std::vector<double> steps;
  double previous = 0;
  for (double t : end) {
    steps.push_back(std::max(t, previous) - previous);
    previous = std::max(t, previous);
  }
  return steps;
}

double mean_after(const std::vector<double>& v, int warmup) {
  double sum = 0;
  for (size_t i = static_cast<size_t>(warmup); i < v.size(); ++i) sum += v[i];
  return sum / static_cast<double>(v.size() - static_cast<size_t>(warmup));
}

// The model's FLOPs per iteration over the cluster's summed peak, in closed form.
double mfu_of(const partition::Plan& plan, double iteration_time_s, double flop_scale) {
  double peak = 0;
  for (const model::Device& d : plan.cluster.devices()) {
    peak += plan.cluster.device_gpu(d).peak_flops_per_s(plan.layout.precision);
  }
  return plan.network.training_flops_per_sample() * plan.layout.samples_per_iteration() * flop_scale /
         (iteration_time_s * peak);
}

// A trace of `plan` where every task of iteration i ends at ends_s[i].
traces::Trace trace_ending_at(const partition::Plan& plan, const std::vector<double>& ends_s) {
  traces::Trace trace;
  for (size_t i = 0; i < ends_s.size(); ++i) {
    for (size_t t = 0; t < plan.tasks.size(); ++t) {
      traces::Event e;
      e.task = static_cast<int>(t);
      e.device = plan.tasks[t].device;
      e.iteration = static_cast<int>(i);
      e.start_s = i == 0 ? 0 : ends_s[i - 1];
      e.end_s = ends_s[i];
      trace.events.push_back(e);
    }
  }
  return trace;
}

TEST(RunFigures, StepsAreIterationEndsAndTheMeanLeavesTheWarmupOut) {
  const partition::Plan plan = two_stages(3);
  const run::Figures f = run::step_figures(trace_ending_at(plan, {1.0, 1.5, 2.25}), plan, 1);
  EXPECT_EQ(f.step_s, (std::vector<double>{1.0, 0.5, 0.75}));
  EXPECT_DOUBLE_EQ(f.iteration_time_s, 0.625);
  EXPECT_DOUBLE_EQ(f.samples_per_s, plan.layout.samples_per_iteration() / 0.625);
  EXPECT_DOUBLE_EQ(f.tokens_per_s, f.samples_per_s * plan.network.tokens_per_sample);
  EXPECT_EQ(plan.network.tokens_per_sample, 32);  // seq=32: tokens are not samples
}

TEST(RunFigures, AStoppedRunCountsTheStepsBeforeTheFirstWithATaskMissing) {
  const partition::Plan plan = two_stages(3);
  traces::Trace trace = trace_ending_at(plan, {1.0, 1.5, 2.25});
  // One task of iteration 1 never ran: iteration 2, whole, is not counted either.
  trace.events.erase(trace.events.begin() + static_cast<std::ptrdiff_t>(plan.tasks.size()));
  const run::Figures f = run::step_figures(trace, plan, 0);
  EXPECT_EQ(f.step_s, (std::vector<double>{1.0}));
  EXPECT_DOUBLE_EQ(f.iteration_time_s, 1.0);
  // After a warm-up of one step nothing is measured: no figures rather than made-up ones.
  const run::Figures after_warmup = run::step_figures(trace, plan, 1);
  EXPECT_EQ(after_warmup.iteration_time_s, 0);
  EXPECT_EQ(after_warmup.samples_per_s, 0);
}

TEST(RunCompare, ARunThatDidNotCompleteIsNotSimulated) {
  const run::Request r = proxy_request(two_stages(1), 1, 2);
  exec::RunResult result;
  result.completed = false;
  result.trace = trace_ending_at(r.plan, {1.0, 3.0});
  result.trace.events.pop_back();  // iteration 1 lacks a task
  const run::TrainingSetup no_training;
  const run::Comparison c = run::compare(r, no_training, result, {});
  EXPECT_FALSE(c.simulated.completed);
  EXPECT_EQ(c.simulated.error, "");  // not tried, rather than failed
  EXPECT_EQ(c.measured.step_s, (std::vector<double>{1.0}));
  EXPECT_EQ(c.measured.iteration_time_s, 0);  // the one whole step was the warm-up
  const partition::CostModel cost(r.plan.cluster, r.plan.layout.precision);
  EXPECT_DOUBLE_EQ(c.analytic.iteration_time_s, partition::estimate_plan(r.plan, cost).iteration_time_s);
  const double analytic_mfu = mfu_of(r.plan, c.analytic.iteration_time_s, 1);
  EXPECT_GT(analytic_mfu, 0);
  EXPECT_NEAR(c.measured.analytic_mfu, analytic_mfu, 1e-12 * analytic_mfu);
}

TEST(Run, ProxiesOnCpuThreadsBesideTheSimulatorAndTheEstimateOfThePlanAsRun) {
  run::Request r = proxy_request(two_stages(1), 1, 2);
  r.flop_scale = 0.01;  // the plan's work, a hundredth of it: the predictions follow
  exec::Ranks& ranks = exec::Ranks::world();
  const run::TrainingSetup training = run::make_training(r, ranks);
  EXPECT_EQ(training.training, nullptr);
  EXPECT_EQ(training.proxy_reason, "");  // proxies were asked for: no reason to give
  const partition::CostModel cost(r.plan.cluster, r.plan.layout.precision);
  const exec::EngineOptions engine = run::engine_options(r, cost, ranks);
  const exec::RunResult result = exec::run_plan(r.plan, *run::make_backend(r, training, ranks), engine);
  ASSERT_TRUE(result.completed) << result.error;
  const run::Comparison c = run::compare(r, training, result, {});

  const std::vector<double> steps = steps_of(result.trace, 3);
  EXPECT_EQ(c.measured.step_s, steps);
  EXPECT_DOUBLE_EQ(c.measured.iteration_time_s, mean_after(steps, 1));
  EXPECT_DOUBLE_EQ(c.measured.samples_per_s, r.plan.layout.samples_per_iteration() / mean_after(steps, 1));
  EXPECT_NEAR(c.measured.mfu, mfu_of(r.plan, c.measured.iteration_time_s, 0.01), 1e-12 * c.measured.mfu);
  EXPECT_TRUE(c.measured.losses.empty());
  EXPECT_EQ(c.gemms, model::Precision::fp32);  // a proxy's is the plan's

  // The estimate and the simulation are of the plan as run: its compute a hundredth.
  const partition::Plan as_run = run::scaled(r.plan, 0.01);
  for (size_t t = 0; t < r.plan.tasks.size(); ++t) {
    EXPECT_DOUBLE_EQ(as_run.tasks[t].flops, r.plan.tasks[t].flops * 0.01);
  }
  EXPECT_DOUBLE_EQ(c.analytic.iteration_time_s, partition::estimate_plan(as_run, cost).iteration_time_s);
  EXPECT_LT(c.analytic.iteration_time_s, partition::estimate_plan(r.plan, cost).iteration_time_s);
  ASSERT_TRUE(c.simulated.completed) << c.simulated.error;
  sim::SimOptions options;
  const sim::SimResult simulated = sim::simulate(as_run, options);
  ASSERT_TRUE(simulated.completed);
  EXPECT_EQ(c.simulated.f.step_s, steps_of(simulated.trace, 3));
  EXPECT_DOUBLE_EQ(c.simulated.f.iteration_time_s, mean_after(steps_of(simulated.trace, 3), 1));
  const double simulated_mfu = mfu_of(r.plan, c.simulated.f.iteration_time_s, 0.01);
  EXPECT_NEAR(c.simulated.f.mfu, simulated_mfu, 1e-12 * simulated_mfu);
  ASSERT_EQ(c.metrics.devices.size(), 2u);
  ASSERT_EQ(c.simulated.m.devices.size(), 2u);
  for (const traces::DeviceMetrics& d : c.metrics.devices) EXPECT_GT(d.busy_s, 0);
  EXPECT_EQ(result.task_instances, static_cast<long long>(3 * r.plan.tasks.size()));
}

TEST(Run, RealMathTrainsAndReportsEachStepsLossAndRate) {
  partition::PlanOptions o;
  o.pipeline = 1;
  o.data = 1;
  o.microbatches = 2;
  run::Request r;
  r.plan = planned(model::cpu_cluster(1), tiny_gpt(), o);
  r.warmup = 0;
  r.steps = 2;
  r.plan.layout.iterations = 2;
  r.plan.fingerprint = partition::plan_fingerprint(r.plan);
  r.optimizer.lr = 1e-3;
  exec::Ranks& ranks = exec::Ranks::world();
  const run::TrainingSetup training = run::make_training(r, ranks);  // compute auto: a tiny GPT is covered
  ASSERT_NE(training.training, nullptr) << training.proxy_reason;
  EXPECT_GT(training.entropy_nats, 0);  // the seeded Markov stream, whose entropy is the loss floor
  const partition::CostModel cost(r.plan.cluster, r.plan.layout.precision);
  const exec::RunResult result =
      exec::run_plan(r.plan, *run::make_backend(r, training, ranks), run::engine_options(r, cost, ranks));
  ASSERT_TRUE(result.completed) << result.error;
  training.training->collect_at_root();
  const run::Comparison c = run::compare(r, training, result, {});
  ASSERT_EQ(c.measured.losses.size(), 2u);
  // Random weights predict about uniformly over the 256 tokens: the first loss is near ln 256.
  EXPECT_NEAR(c.measured.losses[0], std::log(256.0), 0.5);
  EXPECT_EQ(c.measured.learning_rates, (std::vector<double>{1e-3, 1e-3}));  // constant rate
  EXPECT_EQ(c.gemms, model::Precision::fp32);
  EXPECT_EQ(c.measured.step_s, steps_of(result.trace, 2));
}

TEST(Run, TrainingSetupSaysWhyItRunsProxiesAndRefusesWhatNeedsTheOtherKind) {
  partition::PlanOptions o;
  o.pipeline = 1;
  o.data = 1;
  o.microbatches = 1;
  run::Request r;
  r.plan = planned(model::cpu_cluster(1), model::network_from_spec("resnet50", model::Precision::fp32), o);
  exec::Ranks& ranks = exec::Ranks::world();
  const run::TrainingSetup t = run::make_training(r, ranks);  // auto
  EXPECT_EQ(t.training, nullptr);
  EXPECT_NE(t.proxy_reason.find("is not a transformer"), std::string::npos) << t.proxy_reason;
  r.compute = "real";
  EXPECT_THROW(run::make_training(r, ranks), PlanError);
  r.compute = "auto";
  r.data_path = "tokens.bin";
  try {
    run::make_training(r, ranks);
    ADD_FAILURE() << "no error";
  } catch (const InputError& e) {
    EXPECT_EQ(e.field(), "--data-path");
    EXPECT_NE(e.message().find("needs real math"), std::string::npos) << e.message();
  }

  run::Request gpt;
  gpt.plan = planned(model::cpu_cluster(1), tiny_gpt(), o);
  gpt.flop_scale = 0.5;  // real math does all of the model's work
  try {
    run::make_training(gpt, ranks);
    ADD_FAILURE() << "no error";
  } catch (const InputError& e) {
    EXPECT_EQ(e.field(), "--flop-scale");
  }
}

TEST(Run, TheWatchdogWaitsTenLongestTasksUnlessGiven) {
  run::Request r = proxy_request(two_stages(1), 0, 1);
  r.watchdog_s = 1e-9;
  r.flop_scale = 3;
  const partition::CostModel cost(r.plan.cluster, r.plan.layout.precision);
  double longest = 0;  // the passes and the optimizer, each with three times its work
  for (partition::Task t : r.plan.tasks) {
    if (t.kind == partition::TaskKind::send || t.kind == partition::TaskKind::recv ||
        t.kind == partition::TaskKind::collective) {
      continue;
    }
    t.flops *= 3, t.recompute_flops *= 3, t.memory_bytes *= 3;
    longest = std::max(longest, cost.task_compute_time_s(r.plan, t));
  }
  ASSERT_GT(longest, 0);
  exec::Ranks& ranks = exec::Ranks::world();
  EXPECT_DOUBLE_EQ(run::engine_options(r, cost, ranks).watchdog_s, 10 * longest);
  EXPECT_DOUBLE_EQ(run::longest_task_s(r.plan, cost, 3), longest);
  r.watchdog_given = true;
  EXPECT_EQ(run::engine_options(r, cost, ranks).watchdog_s, 1e-9);
  r.max_buffer_bytes = 1024;
  EXPECT_EQ(run::engine_options(r, cost, ranks).max_buffer_bytes, 1024);
  EXPECT_EQ(run::engine_options(r, cost, ranks).ranks, &ranks);
}

// --save-interval's cuts count the steps from the first run's first (Megatron's iteration %
// save_interval), a resumed run's included, and leave the last step to the end's checkpoint.
TEST(Run, CheckpointCutsFallOnMultiplesOfTheIntervalSinceTheFirstRunsFirstStep) {
  run::Request r;
  r.warmup = 1;
  r.steps = 6;  // 7 iterations
  r.save_checkpoint = "ckpt";
  r.save_interval = 2;
  EXPECT_EQ(run::checkpoint_cuts(r), (std::vector<int>{2, 4, 6}));
  r.resumed_iterations = 3;  // 4 to 10 steps done: cut at 4, 6 and 8; 10 is the end's
  EXPECT_EQ(run::checkpoint_cuts(r), (std::vector<int>{1, 3, 5}));
  r.resumed_iterations = 4;  // 5 to 11 steps done: cut at 6, 8 and 10
  EXPECT_EQ(run::checkpoint_cuts(r), (std::vector<int>{2, 4, 6}));
  r.save_interval = 7;
  EXPECT_EQ(run::checkpoint_cuts(r), (std::vector<int>{3}));
  r.save_interval = 100;
  EXPECT_TRUE(run::checkpoint_cuts(r).empty());
  r.save_interval = 1;
  EXPECT_EQ(run::checkpoint_cuts(r).size(), 6u);
  r.save_checkpoint.clear();  // nowhere to write: no cut
  EXPECT_TRUE(run::checkpoint_cuts(r).empty());
}

}  // namespace
}  // namespace hetflow
