// The engine on the CPU back end: plans from the partition API run to completion with one
// trace event per task instance; failures and stalls end the run promptly with a report.
#include <gtest/gtest.h>

#include <csignal>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <functional>
#include <map>
#include <optional>
#include <set>

#include "exec/cpu_backend.hpp"
#include "exec/engine.hpp"
#include "partition/task_order.hpp"
#include "partition/validate.hpp"
#include "tests/exec/exec_test_util.hpp"

using namespace hetflow;
using partition::Plan;
using partition::TaskKind;

namespace {

exec::EngineOptions fast(double watchdog_s = 20) {
  exec::EngineOptions o;
  o.watchdog_s = watchdog_s;
  o.max_buffer_bytes = 64 * 1024;
  return o;
}

exec::CpuBackend backend() { return exec::CpuBackend({1, 64 * 1024}); }

// Every (task, iteration) exactly once, every device's trace events ordered on each stream.
void expect_complete_trace(const Plan& plan, const exec::RunResult& r) {
  ASSERT_TRUE(r.completed) << r.error;
  size_t messages = 0;  // in-task collectives' messages: an event each, within its task's
  for (size_t t = 0; t < plan.tasks.size(); ++t) messages += plan.inside(static_cast<int>(t)).size();
  ASSERT_EQ(r.trace.events.size(), (plan.tasks.size() + messages) * static_cast<size_t>(plan.iterations()));
  std::map<std::pair<int, int>, const traces::Event*> task_event;
  std::map<std::pair<int, int>, std::vector<const traces::Event*>> message_events;
  for (const traces::Event& e : r.trace.events) {
    if (e.message >= 0) {
      message_events[{e.task, e.iteration}].push_back(&e);
    } else {
      EXPECT_TRUE(task_event.emplace(std::pair{e.task, e.iteration}, &e).second) << "task " << e.task << " iteration " << e.iteration;
    }
    EXPECT_LE(e.start_s, e.end_s);
    EXPECT_GE(e.start_s, 0);
  }
  for (const auto& [instance, events] : message_events) {
    const auto calls = plan.inside(instance.first);
    ASSERT_EQ(events.size(), calls.size()) << "task " << instance.first;
    const traces::Event& task = *task_event.at(instance);
    double after = task.start_s;
    for (size_t k = 0; k < events.size(); ++k) {  // (events are in start order)
      const traces::Event& m = *events[k];
      EXPECT_EQ(m.message, static_cast<int>(k));
      EXPECT_EQ(m.group, calls[k].collective);
      EXPECT_EQ(m.kind, partition::TaskKind::collective);
      EXPECT_GE(m.start_s, after) << "task " << instance.first << " message " << k;
      EXPECT_LE(m.end_s, task.end_s) << "task " << instance.first << " message " << k;
      after = m.end_s;
    }
  }
  EXPECT_EQ(r.trace.source, "exec-cpu");
  EXPECT_EQ(r.trace.compute, "proxy");
  EXPECT_EQ(r.trace.fingerprint, plan.fingerprint);
}

// A run on CPU proxies whose buffers are large enough to move every byte the plan lists.
exec::RunResult run_moving_every_byte(const Plan& plan) {
  exec::CpuBackend cpu({1, 64.0 * 1024 * 1024});
  exec::EngineOptions e = fast();
  e.max_buffer_bytes = 64.0 * 1024 * 1024;
  return exec::run_plan(plan, cpu, e);
}

struct Case {
  const char* name;
  int devices;
  partition::PlanOptions options;
};

std::vector<Case> cases() {
  std::vector<Case> out;
  auto add = [&](const char* name, int devices, int pipeline, int data, int tensor, const char* schedule,
                 std::optional<partition::SyncKind> sync, int staleness = 0, int context = 1) {
    partition::PlanOptions o;
    o.pipeline = pipeline;
    o.data = data;
    o.tensor = tensor;
    o.context = context;
    o.schedule = schedule;
    o.microbatches = 4;
    o.sync = sync;
    o.staleness = staleness;
    o.iterations = 3;
    out.push_back({name, devices, o});
  };
  add("gpipe_pp2_dp2_allreduce", 4, 2, 2, 1, "gpipe", partition::SyncKind::allreduce);
  add("1f1b_pp2_tp2", 4, 2, 1, 2, "1f1b", partition::SyncKind::allreduce);
  add("1f1b_pp2_dp2_tp2", 8, 2, 2, 2, "1f1b", partition::SyncKind::allreduce);
  add("gpipe_pp2_dp2_ps", 4, 2, 2, 1, "gpipe", partition::SyncKind::ps);
  add("1f1b_pp2_dp2_wsp_d1", 4, 2, 2, 1, "1f1b", partition::SyncKind::wsp, 1);
  // Context groups of 2 workers: each pass's gathers and scatters meet across workers.
  add("1f1b_pp2_cp2_tp2", 8, 2, 1, 2, "1f1b", partition::SyncKind::allreduce, 0, 2);
  // ... or pass blocks around a ring of 4, each message beside the work it overlaps.
  add("1f1b_cp4_ring", 4, 1, 1, 1, "1f1b", partition::SyncKind::allreduce, 0, 4);
  out.back().options.context_comm = partition::ContextComm::ring;
  return out;
}

class EnginePlans : public testing::TestWithParam<Case> {};

TEST_P(EnginePlans, RunToCompletionWithOneEventPerTaskInstance) {
  const Case& c = GetParam();
  const Plan plan = test_support::planned(model::cpu_cluster(c.devices), test_support::tiny_gpt(), c.options);
  ASSERT_NO_THROW(partition::require_valid(plan));
  auto cpu = backend();
  const exec::RunResult r = exec::run_plan(plan, cpu, fast());
  expect_complete_trace(plan, r);
  // Program order: on each stream, iteration after iteration, a task ends before the next
  // starts (its in-task messages are within it, as expect_complete_trace checks).
  std::map<std::pair<int, std::string>, double> last_end;
  std::vector<traces::Event> events = r.trace.events;
  std::sort(events.begin(), events.end(), [](const auto& a, const auto& b) { return a.start_s < b.start_s; });
  for (const traces::Event& e : events) {
    if (e.message >= 0) continue;
    double& end = last_end[{e.device, e.stream}];
    if (e.kind != partition::TaskKind::send && e.kind != partition::TaskKind::recv) {  // transfers start at the later side
      EXPECT_GE(e.start_s, end) << e.task;
    }
    end = std::max(end, e.end_s);
  }
}

INSTANTIATE_TEST_SUITE_P(Plans, EnginePlans, testing::ValuesIn(cases()),
                         [](const testing::TestParamInfo<Case>& param_info) { return std::string(param_info.param.name); });

// Context parallelism on the CPU back end's proxies: every communicator, the context groups'
// included, carries what the plan says (real math: training_test.cpp's ContextTraining).
TEST(Engine, AContextGroupCarriesWhatThePlanSays) {
  partition::PlanOptions o = cases()[cases().size() - 2].options;
  ASSERT_EQ(o.context, 2);
  o.data = 2;
  const Plan plan = test_support::planned(model::cpu_cluster(16), test_support::tiny_gpt(), o);
  const exec::RunResult r = run_moving_every_byte(plan);
  ASSERT_TRUE(r.completed) << r.error;
  const std::vector<double> planned = test_support::expect_carries_what_the_plan_says(plan, r.trace, plan.iterations(), "");
  int context_groups = 0;
  for (size_t k = 0; k < planned.size(); ++k) {
    if (plan.communicators[k].role != partition::CommRole::context) continue;
    ++context_groups;
    EXPECT_GT(planned[k], 0) << plan.communicators[k].name;
  }
  EXPECT_EQ(context_groups, 2 * 2 * 2);  // per replica, pipeline rank and tensor rank
}

// A ring's sendrecvs on the CPU back end's proxies: each member sends the plan's bytes to the
// next and takes the previous one's, while its work goes on up to where the plan waits.
TEST(Engine, ARingCarriesWhatThePlanSaysBesideTheWork) {
  partition::PlanOptions o = cases().back().options;
  ASSERT_EQ(o.context_comm, partition::ContextComm::ring);
  const Plan plan = test_support::planned(model::cpu_cluster(4), test_support::tiny_gpt(), o);
  const exec::RunResult r = run_moving_every_byte(plan);
  ASSERT_TRUE(r.completed) << r.error;
  expect_complete_trace(plan, r);
  const std::vector<double> planned = test_support::expect_carries_what_the_plan_says(plan, r.trace, plan.iterations(), "");
  int rings = 0, overlapped = 0;
  for (size_t k = 0; k < planned.size(); ++k) rings += plan.communicators[k].role == partition::CommRole::context && planned[k] > 0;
  EXPECT_EQ(rings, 1);
  for (const partition::Collective& c : plan.collectives) overlapped += !c.until.empty();
  EXPECT_GT(overlapped, 0);
  // The work goes on beside a message only where the plan says (the hop home holds it).
  int held = 0;
  for (const traces::Event& e : r.trace.events) {
    if (e.message < 0) continue;
    EXPECT_LE(e.overlap_s, e.end_s - e.start_s);
    if (plan.inside(e.task)[static_cast<size_t>(e.message)].overlaps()) continue;
    EXPECT_EQ(e.overlap_s, 0) << e.task << " message " << e.message;
    ++held;
  }
  EXPECT_GT(held, 0);
}

// Expert parallelism on the CPU back end's proxies: groups of 2 replicas exchange each MoE
// layer's tokens in a skewed router's parts, dense gradients sum over all 4 replicas and each
// rank's experts over its 2 holders; over tensor-parallel ranks (TP 2, SP) each tensor rank's
// group exchanges its share and the tensor groups gather and scatter what arrived; under ZeRO
// 3 every pass gathers the dense part from every replica and its experts from their holders.
// Every communicator carries what the plan says.
TEST(Engine, AnExpertGroupCarriesWhatThePlanSays) {
  const model::Network net = model::network_from_spec(
      "llama:layers=2,hidden=64,heads=4,kv_heads=2,ffn=128,vocab=256,seq=32,experts=4,experts_per_token=2,expert_ffn=64",
      model::Precision::fp32);
  for (const auto& [tensor, zero] : {std::pair{1, 0}, {2, 0}, {1, 3}}) {
    SCOPED_TRACE("tensor " + std::to_string(tensor) + ", zero " + std::to_string(zero));
    partition::PlanOptions o;
    o.pipeline = 2;
    o.tensor = tensor;
    o.zero_stage = zero;
    o.sequence_parallel = tensor > 1;
    o.microbatches = 2;
    o.experts.parallel = 2;
    o.experts.routing = partition::parse_routing("zipf:1", "test", "routing");
    const Plan plan = test_support::planned(model::cpu_cluster(8), net, o);
    ASSERT_NO_THROW(partition::require_valid(plan));
    const exec::RunResult r = run_moving_every_byte(plan);
    ASSERT_TRUE(r.completed) << r.error;
    expect_complete_trace(plan, r);
    const std::vector<double> planned =
        test_support::expect_carries_what_the_plan_says(plan, r.trace, plan.iterations(), "");
    int expert_groups = 0;
    for (size_t k = 0; k < planned.size(); ++k) {
      if (plan.communicators[k].role != partition::CommRole::expert) continue;
      ++expert_groups;
      EXPECT_GT(planned[k], 0) << plan.communicators[k].name;
    }
    // Per expert group, pipeline rank and tensor rank: 2 x 2 x 1, or 1 x 2 x 2.
    EXPECT_EQ(expert_groups, 2 * 2);
  }
}

// An in-task all-to-all with uneven parts (the expert axis's dispatch) on the CPU back end's
// proxies: each member sends each other its part and takes its own part from each, the sizes
// checked on receipt; every communicator carries what the plan says.
TEST(Engine, AnInTaskAllToAllSendsEachMemberItsPart) {
  partition::PlanOptions o;
  o.tensor = 2;
  o.pipeline = 2;
  o.data = 1;
  o.microbatches = 2;
  Plan plan = test_support::planned(model::cpu_cluster(4), test_support::tiny_gpt(), o);
  int converted = 0;
  for (partition::Collective& c : plan.collectives) {
    if (!c.in_task()) continue;
    c.kind = partition::CollectiveKind::all_to_all;
    c.algorithm = partition::CollectiveAlgorithm::pairwise;
    c.parts = {0.75, 0.25};
    ++converted;
  }
  ASSERT_GT(converted, 0);
  ASSERT_TRUE(partition::validate_plan(plan).ok()) << partition::validate_plan(plan).problems.front();
  const exec::RunResult r = run_moving_every_byte(plan);
  ASSERT_TRUE(r.completed) << r.error;
  test_support::expect_carries_what_the_plan_says(plan, r.trace, plan.iterations(), "all-to-all");
}

// WSP with staleness 0 against 1: the offset edges are honoured (a pull of iteration i
// precedes iteration i + D + 1's first forward on that worker).
TEST(Engine, OffsetEdgesHoldAcrossIterations) {
  partition::PlanOptions o = cases()[4].options;
  const Plan plan = test_support::planned(model::cpu_cluster(4), test_support::tiny_gpt(), o);
  auto cpu = backend();
  const exec::RunResult r = exec::run_plan(plan, cpu, fast());
  ASSERT_TRUE(r.completed) << r.error;
  std::map<std::pair<int, int>, const traces::Event*> at;
  for (const traces::Event& e : r.trace.events) at[{e.task, e.iteration}] = &e;
  int checked = 0;
  for (const partition::OrderEdge& edge : plan.order) {
    for (int i = edge.offset; i < plan.iterations(); ++i) {
      const auto* from = at[{edge.from, i - edge.offset}];
      const auto* to = at[{edge.to, i}];
      ASSERT_TRUE(from && to);
      EXPECT_LE(from->end_s, to->start_s) << edge.from << " -> " << edge.to << " offset " << edge.offset;
      checked += edge.offset > 0;
    }
  }
  EXPECT_GT(checked, 0) << "the WSP plan has offset edges";
}

// A task that throws ends the run with its error; the trace holds what completed.
TEST(Engine, FirstErrorStopsTheRunWithAPartialTrace) {
  const Plan plan = test_support::planned(model::cpu_cluster(4), test_support::tiny_gpt(), cases()[0].options);
  int victim = -1;
  for (size_t t = 0; t < plan.tasks.size() && victim < 0; ++t) {
    if (plan.tasks[t].kind == TaskKind::backward) victim = static_cast<int>(t);
  }
  test_support::ThrowingBackend backend(victim);
  const auto start = std::chrono::steady_clock::now();
  const exec::RunResult r = exec::run_plan(plan, backend, fast(30));
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 5);
  EXPECT_FALSE(r.completed);
  EXPECT_FALSE(r.stalled);
  EXPECT_NE(r.error.find("injected failure"), std::string::npos) << r.error;
  EXPECT_NE(r.error.find("backward #" + std::to_string(victim)), std::string::npos) << r.error;
  EXPECT_NE(r.error.find("iteration 1"), std::string::npos) << r.error;
  EXPECT_GT(r.trace.events.size(), plan.tasks.size() - 1);  // iteration 0 completed
  EXPECT_LT(r.trace.events.size(), plan.tasks.size() * 3);
  for (const traces::Event& e : r.trace.events) EXPECT_FALSE(e.task == victim && e.iteration >= 1);
}

// The plan's first tensor that `want` picks; -1 when none.
int first_tensor(const Plan& plan, const std::function<bool(const partition::Tensor&)>& want) {
  for (size_t t = 0; t < plan.tensors.size(); ++t) {
    if (want(plan.tensors[t])) return static_cast<int>(t);
  }
  return -1;
}

// The CPU back end, but asking 4 EiB for one tensor's host buffer: more than any host can
// allocate, so the engine's allocation of it fails.
class GreedyBackend final : public exec::Backend {
 public:
  explicit GreedyBackend(int tensor) : tensor_(tensor), inner_({1, 64 * 1024}) {}
  std::string name() const override { return inner_.name(); }
  std::string compute() const override { return inner_.compute(); }
  void prepare(const partition::Plan& p) override { inner_.prepare(p); }
  void stop() override { inner_.stop(); }
  void run(exec::TaskContext& t) override { inner_.run(t); }
  std::optional<size_t> buffer_bytes(int tensor) const override {
    return tensor == tensor_ ? std::optional<size_t>(size_t{1} << 62) : std::nullopt;
  }

 private:
  int tensor_;
  exec::CpuBackend inner_;
};

// A buffer the host cannot allocate fails its task, as a throwing back end does: a message
// naming the task, a partial trace (it ended the process with std::terminate).
TEST(Engine, AnUnallocatableBufferFailsItsTask) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "the sanitizers' allocators end the process on a request this size instead of throwing";
#endif
  const Plan plan = test_support::planned(model::cpu_cluster(4), test_support::tiny_gpt(), cases()[0].options);
  const int victim = first_tensor(plan, [](const partition::Tensor& t) {
    return t.producer >= 0 && !partition::is_persistent(t.kind) && t.device == 1;
  });
  ASSERT_GE(victim, 0);
  GreedyBackend greedy(victim);
  const exec::RunResult r = exec::run_plan(plan, greedy, fast(30));
  EXPECT_FALSE(r.completed);
  EXPECT_FALSE(r.stalled);
  EXPECT_NE(r.error.find("out of memory for the host buffers"), std::string::npos) << r.error;
  EXPECT_NE(r.error.find(partition::describe_task(plan, plan.tensors[static_cast<size_t>(victim)].producer)),
            std::string::npos)
      << r.error;
  EXPECT_LT(r.trace.events.size(), plan.tasks.size());
}

// A buffer that lives for the whole run is allocated before the run starts: failing that is an
// error naming the tensor, its device and size, not the bare std::bad_alloc.
TEST(Engine, AnUnallocatablePersistentBufferIsNamed) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "the sanitizers' allocators end the process on a request this size instead of throwing";
#endif
  const Plan plan = test_support::planned(model::cpu_cluster(4), test_support::tiny_gpt(), cases()[0].options);
  const int victim =
      first_tensor(plan, [](const partition::Tensor& t) { return partition::is_persistent(t.kind) && t.device == 2; });
  ASSERT_GE(victim, 0);
  GreedyBackend greedy(victim);
  try {
    exec::run_plan(plan, greedy, fast(30));
    FAIL() << "expected an error";
  } catch (const hetflow::Error& e) {
    const std::string want = "out of memory for the host buffer of tensor " + std::to_string(victim) + " (" +
                             std::string(partition::to_string(plan.tensors[static_cast<size_t>(victim)].kind)) +
                             " on device 2, ";
    EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what() << "\nwanted: " << want;
    EXPECT_NE(std::string(e.what()).find("lives for the whole run"), std::string::npos) << e.what();
  }
}

// A receive removed from its program (validation bypassed): its send waits for ever, and so
// does what reads the received tensor. The watchdog names both.
TEST(Engine, WatchdogNamesWhatEachDeviceWaitsFor) {
  Plan plan = test_support::planned(model::cpu_cluster(2), test_support::tiny_gpt(), [] {
    partition::PlanOptions o;
    o.pipeline = 2;
    o.microbatches = 2;
    return o;
  }());
  int removed = -1;
  for (auto& device : plan.programs) {
    for (partition::StreamProgram& s : device) {
      for (size_t k = 0; k < s.tasks.size() && removed < 0; ++k) {
        if (plan.tasks[static_cast<size_t>(s.tasks[k])].kind != TaskKind::recv) continue;
        removed = s.tasks[k];
        s.tasks.erase(s.tasks.begin() + static_cast<std::ptrdiff_t>(k));
      }
    }
  }
  ASSERT_GE(removed, 0);
  const int waiting = plan.tasks[static_cast<size_t>(removed)].device;
  const int sender = plan.peer(removed);
  auto cpu = backend();
  const auto start = std::chrono::steady_clock::now();
  const exec::RunResult r = exec::run_plan(plan, cpu, fast(1));
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(took, 10);  // the watchdog (1 s) and prompt stopping, with room for sanitizer builds
  EXPECT_FALSE(r.completed);
  EXPECT_TRUE(r.stalled);
  EXPECT_NE(r.error.find("watchdog"), std::string::npos) << r.error;
  const std::string waiter = "device " + std::to_string(waiting) + " (" + plan.device_names[static_cast<size_t>(waiting)] + ")";
  EXPECT_NE(r.error.find(waiter), std::string::npos) << r.error;
  EXPECT_NE(r.error.find("recv #" + std::to_string(removed)), std::string::npos) << r.error;  // the missing producer
  EXPECT_NE(r.error.find("device " + std::to_string(waiting) + " to receive on channel"), std::string::npos)
      << r.error;  // the sender's side
  EXPECT_NE(r.error.find("device " + std::to_string(sender) + " ("), std::string::npos) << r.error;
}

// On one device with one stream, the engine allocates in the plan's canonical order, so the
// measured transient peak is the plan's.
TEST(Engine, PeakTransientBytesEqualThePlansOnASerialDevice) {
  for (const char* schedule : {"gpipe", "1f1b"}) {
    partition::PlanOptions o;
    o.pipeline = 1;
    o.data = 1;
    o.microbatches = 4;
    o.schedule = schedule;
    o.iterations = 2;
    const Plan plan = test_support::planned(model::cpu_cluster(1), test_support::tiny_gpt(), o);
    auto cpu = backend();
    const exec::RunResult r = exec::run_plan(plan, cpu, fast());
    ASSERT_TRUE(r.completed) << r.error;
    const partition::DeviceMemory& m = plan.memory[0];
    EXPECT_GT(m.activations_bytes, 0);
    EXPECT_DOUBLE_EQ(r.memory[0].peak_transient_bytes, m.activations_bytes + m.buffers_bytes) << schedule;
    EXPECT_DOUBLE_EQ(r.memory[0].persistent_bytes, m.weights_bytes + m.gradients_bytes + m.optimizer_bytes);
  }
}

TEST(Engine, RefusesPlansItCannotRun) {
  Plan plan = test_support::empty_plan(model::cpu_cluster(2));
  const int x = test_support::transient(plan, 0, 64);
  const int a = test_support::compute_task(plan, 0, {}, {x});
  test_support::compute_task(plan, 1, {x}, {});  // reads a tensor of another device
  plan.finish();
  (void)a;
  auto cpu = backend();
  EXPECT_THROW(exec::run_plan(plan, cpu, fast()), PlanError);
}

}  // namespace

namespace {

// A back end whose tasks do nothing (dependencies are the engine's), letting through every
// task instance of iteration 0 and the first `pass` of iteration 1; the others block, as a
// receive whose sender never comes does, until stop().
class GateBackend final : public exec::Backend {
 public:
  explicit GateBackend(int pass) : pass_(pass) {}
  std::string name() const override { return "gate"; }
  std::string compute() const override { return "proxy"; }
  void prepare(const partition::Plan&) override {}
  void stop() override {
    {
      std::lock_guard lock(mutex_);
      stopped_ = true;
    }
    wake_.notify_all();
  }
  void run(exec::TaskContext& t) override {
    std::unique_lock lock(mutex_);
    if (t.iteration == 0 || (t.iteration == 1 && passed_ < pass_)) {
      passed_ += t.iteration;
      return;
    }
    t.waiting_for("the gate");
    wake_.wait(lock, [&] { return stopped_; });
    throw exec::Stopped();
  }

 private:
  int pass_;
  std::mutex mutex_;
  std::condition_variable wake_;
  int passed_ = 0;
  bool stopped_ = false;
};

}  // namespace

// While it runs, the engine says which step it is in and how many of that step's task
// instances completed: here all of step 1 and exactly 5 of step 2 (the gate lets no more
// through). A signal then (EngineOptions::interrupt) stops the run, wakes the blocked tasks,
// and leaves a trace of what completed, marked partial.
TEST(Engine, ProgressCountsTheStepsTasksAndAnInterruptStopsTheRun) {
  const Plan plan = test_support::planned(model::cpu_cluster(4), test_support::tiny_gpt(), cases()[0].options);
  const long long tasks = static_cast<long long>(plan.tasks.size());
  constexpr int kPassed = 5;
  GateBackend gate(kPassed);
  std::atomic<int> interrupt{0};
  std::vector<exec::RunProgress> seen;  // (the watching thread only: run_plan's)
  exec::EngineOptions o = fast(30);
  o.progress_every_s = 0.01;
  o.interrupt = &interrupt;
  o.on_progress = [&](const exec::RunProgress& p) {
    seen.push_back(p);
    if (p.iteration == 1 && p.iteration_done == kPassed) interrupt.store(SIGINT);
  };
  const exec::RunResult r = exec::run_plan(plan, gate, o);
  ASSERT_FALSE(seen.empty());
  for (size_t k = 0; k < seen.size(); ++k) {
    const exec::RunProgress& p = seen[k];
    EXPECT_EQ(p.iterations, 3);
    EXPECT_EQ(p.iteration_tasks, tasks);
    EXPECT_LE(p.iteration, 1);  // the gate holds step 2
    EXPECT_LE(p.iteration_done, p.iteration == 0 ? tasks : kPassed);
    EXPECT_GE(p.completed, p.iteration * tasks + p.iteration_done);  // earlier steps are whole
    if (k > 0) {
      EXPECT_GE(p.completed, seen[k - 1].completed);
    }
    if (p.iteration == 1) {
      EXPECT_GT(p.last_iteration_s, 0);
    }
  }
  EXPECT_EQ(seen.back().iteration, 1);
  EXPECT_EQ(seen.back().iteration_done, kPassed);
  EXPECT_EQ(seen.back().completed, tasks + kPassed);
  EXPECT_FALSE(r.completed);
  EXPECT_FALSE(r.stalled);
  EXPECT_EQ(r.interrupted, SIGINT);
  EXPECT_EQ(r.error, "interrupted by SIGINT (Ctrl-C) during step 2 of 3");
  EXPECT_EQ(r.task_instances, tasks + kPassed);
  EXPECT_EQ(static_cast<long long>(r.trace.events.size()), tasks + kPassed);
  EXPECT_EQ(r.trace.partial, r.error);
  EXPECT_EQ(r.trace.planned_iterations, 3);
}

// A complete run's trace is not partial, and nothing interrupts a run whose flag stays 0.
TEST(Engine, ACompleteRunsTraceIsNotPartial) {
  const Plan plan = test_support::planned(model::cpu_cluster(4), test_support::tiny_gpt(), cases()[0].options);
  auto cpu = backend();
  std::atomic<int> interrupt{0};
  exec::EngineOptions o = fast();
  o.interrupt = &interrupt;
  const exec::RunResult r = exec::run_plan(plan, cpu, o);
  expect_complete_trace(plan, r);
  EXPECT_EQ(r.interrupted, 0);
  EXPECT_TRUE(r.trace.partial.empty());
  EXPECT_EQ(r.trace.planned_iterations, 0);
}
