// The CUDA back end. What needs a GPU skips, saying why, where none is visible (or the build
// has no CUDA back end). What does not runs everywhere: prepare() without a GPU is a clear
// error, not a crash; and the NCCL communicators derived from a plan (exec/cuda_plan.hpp) are
// checked on the plans the engine tests run.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>

#include "exec/cuda_backend.hpp"
#include "exec/cuda_plan.hpp"
#include "exec/engine.hpp"
#include "exec/training.hpp"
#include "kernels/matmul.hpp"
#include "partition/task_order.hpp"
#include "tests/exec/compare_weights.hpp"
#include "tests/exec/exec_test_util.hpp"

using namespace hetflow;
using partition::Plan;
using partition::TaskKind;
using test_support::Captured;

namespace {

#define SKIP_WITHOUT_GPUS(n)                                                                                         \
  if (!exec::cuda_backend_built()) GTEST_SKIP() << "this build has no CUDA back end (nvcc, cuBLAS or NCCL not found)"; \
  if (kernels::cuda_device_count() < (n))                                                                            \
  GTEST_SKIP() << "needs " << (n) << " GPU(s), " << kernels::cuda_device_count() << " visible: " << kernels::cuda_status()

exec::EngineOptions options(Captured* captured = nullptr, double watchdog_s = 30) {
  exec::EngineOptions o;
  o.watchdog_s = watchdog_s;
  if (captured != nullptr) o.on_task_end = captured->hook();
  return o;
}

partition::PlanOptions pipeline(int stages, int microbatches) {
  partition::PlanOptions o;
  o.pipeline = stages;
  o.microbatches = microbatches;
  o.iterations = 2;
  return o;
}

// The CPU proxy's pattern, which the CUDA proxy writes too.
float pattern(int task, int iteration, size_t i) {
  return static_cast<float>((static_cast<size_t>(task) * 31 + static_cast<size_t>(iteration) * 7 + i) % 97 + 1);
}

// --- without a GPU ---

TEST(CudaBackend, PrepareWithoutAGpuIsAClearError) {
  if (kernels::cuda_device_count() > 0) GTEST_SKIP() << "a GPU is visible: this test is for machines without one";
  const Plan plan = test_support::planned(model::cpu_cluster(1), test_support::tiny_gpt(), pipeline(1, 2));
  exec::CudaBackend cuda;
  EXPECT_EQ(cuda.name(), "cuda");
  EXPECT_EQ(cuda.compute(), "proxy");
  try {
    exec::run_plan(plan, cuda, options());
    FAIL() << "a run without a GPU did not fail";
  } catch (const Error& e) {
    const std::string what = e.what();
    const bool clear = what.find("no CUDA device visible") != std::string::npos ||
                       what.find("no CUDA back end") != std::string::npos;
    EXPECT_TRUE(clear) << what;
  }
  EXPECT_THROW(cuda.prepare(plan), Error);  // again: still an error, still no crash
  EXPECT_FALSE(cuda.gpu_time_s(0, 0).has_value());
}

TEST(CudaPlan, DevicesMapToGpusInOrderOrByList) {
  EXPECT_EQ(exec::gpu_ordinals(3, 4, {}), (std::vector<int>{0, 1, 2}));
  const std::vector<int> list{3, 1};
  EXPECT_EQ(exec::gpu_ordinals(2, 4, list), list);
  try {
    exec::gpu_ordinals(2, 0, {}, "no driver");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no CUDA device visible (no driver)"), std::string::npos) << e.what();
  }
  try {
    exec::gpu_ordinals(4, 2, {});
    FAIL();
  } catch (const PlanError& e) {
    EXPECT_NE(std::string(e.what()).find("4 devices but only 2 CUDA device(s)"), std::string::npos) << e.what();
  }
  const std::vector<int> short_list{0}, bad{0, 5};
  EXPECT_THROW(exec::gpu_ordinals(2, 4, short_list), InputError);
  EXPECT_THROW(exec::gpu_ordinals(2, 4, bad), InputError);
}

struct Shape {
  const char* name;
  int devices, pipeline, data, tensor;
  partition::SyncKind sync;
};

TEST(CudaPlan, ACommunicatorPerChannelAndPerCollectiveStreamGroup) {
  const Shape shapes[] = {{"pp2 dp2 all-reduce", 4, 2, 2, 1, partition::SyncKind::allreduce},
                          {"pp2 tp2", 4, 2, 1, 2, partition::SyncKind::allreduce},
                          {"pp2 dp2 tp2", 8, 2, 2, 2, partition::SyncKind::allreduce},
                          {"pp2 dp2 parameter server", 4, 2, 2, 1, partition::SyncKind::ps},
                          {"pp2 dp2 wsp", 4, 2, 2, 1, partition::SyncKind::wsp}};
  for (const Shape& shape : shapes) {
    SCOPED_TRACE(shape.name);
    partition::PlanOptions o = pipeline(shape.pipeline, 4);
    o.data = shape.data;
    o.tensor = shape.tensor;
    o.sync = shape.sync;
    o.staleness = shape.sync == partition::SyncKind::wsp ? 1 : 0;
    const Plan plan = test_support::planned(model::cpu_cluster(shape.devices), test_support::tiny_gpt(), o);
    const exec::CudaPlan c = exec::cuda_plan(plan, exec::gpu_ordinals(plan.device_count(), 8, {}));
    ASSERT_GE(c.groups.size(), plan.channels.size());
    int transfers = 0, collectives = 0;
    for (size_t t = 0; t < plan.tasks.size(); ++t) {
      const partition::Task& task = plan.tasks[t];
      const int g = c.group_of_task[t], r = c.rank_of_task[t];
      switch (task.kind) {
        case TaskKind::send:
        case TaskKind::recv:
          ++transfers;
          EXPECT_EQ(g, task.channel);
          EXPECT_EQ(r, task.kind == TaskKind::send ? 0 : 1);
          EXPECT_EQ(c.groups[static_cast<size_t>(g)].devices[static_cast<size_t>(r)], task.device);
          break;
        case TaskKind::collective: {
          ++collectives;
          ASSERT_GE(g, static_cast<int>(plan.channels.size()));
          const auto& members = plan.members(plan.collectives[static_cast<size_t>(task.collective)]);
          EXPECT_EQ(c.groups[static_cast<size_t>(g)].devices, members);
          EXPECT_EQ(members[static_cast<size_t>(r)], task.device);
          break;
        }
        default:
          EXPECT_EQ(g, -1);
      }
    }
    EXPECT_GT(transfers, 0);
    if (shape.tensor > 1 || (shape.data > 1 && shape.sync == partition::SyncKind::allreduce)) {
      EXPECT_GT(collectives, 0);  // parameter servers and WSP move gradients over channels
    }
    // A GPU per rank: every communicator's devices are on different GPUs.
    for (const exec::NcclGroup& group : c.groups) {
      std::set<int> gpus;
      for (const int d : group.devices) gpus.insert(c.gpus[static_cast<size_t>(d)]);
      EXPECT_EQ(gpus.size(), group.devices.size()) << group.what;
    }
  }
}

TEST(CudaPlan, RefusesTwoRanksOfACommunicatorOnOneGpu) {
  const Plan plan = test_support::planned(model::cpu_cluster(2), test_support::tiny_gpt(), pipeline(2, 2));
  const std::vector<int> same{0, 0};
  try {
    exec::cuda_plan(plan, exec::gpu_ordinals(2, 1, same));
    FAIL();
  } catch (const PlanError& e) {
    EXPECT_NE(std::string(e.what()).find("two ranks of one communicator on one GPU"), std::string::npos) << e.what();
  }
  // Devices that never meet may share a GPU.
  const Plan lone = test_support::planned(model::cpu_cluster(1), test_support::tiny_gpt(), pipeline(1, 2));
  EXPECT_NO_THROW(exec::cuda_plan(lone, {0}));
}

// Real math's collectives on NCCL: a gradient collective must be an all-reduce, and a tensor-
// or sequence-parallel one must split into equal pieces; both refused before any GPU is
// touched, as plan faults. Tensor parallelism's collectives that are tasks of their own are
// the all-gathers of boundaries that arrive in slices, each moving its tensors; the rest run
// inside the passes (the plan's in-task collectives), none is traffic without data.
TEST(CudaPlan, RealMathRefusesCollectivesNcclCannotRunInPlace) {
  partition::PlanOptions o = pipeline(2, 2);
  o.tensor = 2;
  o.data = 2;
  Plan plan = test_support::planned(model::cpu_cluster(8), test_support::tiny_gpt(), o);
  const auto floats = [](size_t n) { return [n](int) { return n * sizeof(float); }; };
  EXPECT_NO_THROW(exec::require_real_collectives(plan, floats(64)));
  int empty = 0, moving = 0;  // tensor-parallel collective tasks without tensors, and with
  for (size_t t = 0; t < plan.tasks.size(); ++t) {
    const partition::Task& task = plan.tasks[t];
    if (task.kind != TaskKind::collective || !exec::activation_collective(plan.collective(task.collective))) continue;
    (plan.reads(static_cast<int>(t)).empty() ? empty : moving) += 1;
  }
  EXPECT_EQ(empty, 0);
  EXPECT_GT(moving, 0);  // the boundaries' slices gathered
  try {
    exec::require_real_collectives(plan, floats(63));  // an all-gather or reduce-scatter of 63 floats over 2
    FAIL() << "odd pieces were accepted";
  } catch (const PlanError& e) {
    EXPECT_NE(std::string(e.what()).find("of 63 floats over 2 members: NCCL's in-place form needs equal pieces"),
              std::string::npos)
        << e.what();
  }
  for (partition::Collective& c : plan.collectives) {
    if (c.purpose == partition::Purpose::data_parallel) c.kind = partition::CollectiveKind::reduce_scatter;
  }
  try {
    exec::require_real_collectives(plan, floats(64));
    FAIL() << "a reduce-scatter of gradients was accepted";
  } catch (const PlanError& e) {
    EXPECT_NE(std::string(e.what()).find("(reduce_scatter) reduces gradients: real math on the cuda back end"),
              std::string::npos)
        << e.what();
  }
}

// Under mpirun: each process runs its block of the devices on its node's GPUs after those of
// the node's lower ranks, every process derives the same communicators in the same order, the
// first member's process makes each one's unique id, and only devices of one process are held
// to distinct GPUs. Plain data, so it is tested here without a GPU or MPI.
TEST(CudaPlan, ProcessesRunTheirBlocksOnTheirNodesGpus) {
  const std::vector<int> owner{0, 0, 1, 1};
  // Two processes on two nodes start at GPU 0 each; on one node the second follows the first.
  EXPECT_EQ(exec::first_gpus({"a", "b"}, owner), (std::vector<int>{0, 0}));
  EXPECT_EQ(exec::first_gpus({"a", "a"}, owner), (std::vector<int>{0, 2}));
  EXPECT_EQ(exec::first_gpus({"a", "b", "a"}, std::vector<int>{0, 1, 1, 2, 2, 2}), (std::vector<int>{0, 0, 1}));
  // (prepare() names a process by its host and CUDA_VISIBLE_DEVICES: one launcher showing
  // each process its own GPUs makes them start at 0 each; one list for all, consecutive.)
  EXPECT_EQ(exec::first_gpus({"a\n0,1", "a\n2,3"}, owner), (std::vector<int>{0, 0}));
  EXPECT_EQ(exec::first_gpus({"a\n0,1,2,3", "a\n0,1,2,3"}, owner), (std::vector<int>{0, 2}));
  EXPECT_EQ(exec::gpu_ordinals(4, 2, {}, "", owner, 0), (std::vector<int>{0, 1, -1, -1}));
  EXPECT_EQ(exec::gpu_ordinals(4, 2, {}, "", owner, 1), (std::vector<int>{-1, -1, 0, 1}));
  EXPECT_EQ(exec::gpu_ordinals(4, 4, {}, "", owner, 1, 2), (std::vector<int>{-1, -1, 2, 3}));
  const std::vector<int> list{0, 1, 1, 0};  // one entry per plan device; a process checks its own
  EXPECT_EQ(exec::gpu_ordinals(4, 2, list, "", owner, 1), (std::vector<int>{-1, -1, 1, 0}));
  try {
    exec::gpu_ordinals(4, 2, {}, "", owner, 1, 2);  // after the node's rank 0, on a node of 2 GPUs
    FAIL();
  } catch (const PlanError& e) {
    EXPECT_NE(std::string(e.what()).find("this process (rank 1) runs 2 devices on GPUs 2 to 3"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(exec::device_owners(4, 2, [](int d) { return d / 2; }), owner);
  EXPECT_EQ(exec::device_owners(4, 1, [](int) { return 7; }), (std::vector<int>(4, 0)));

  partition::PlanOptions o = pipeline(2, 4);
  o.data = 2;
  const Plan plan = test_support::planned(model::cpu_cluster(4), test_support::tiny_gpt(), o);
  std::vector<exec::CudaPlan> processes;
  for (int process : {0, 1}) {
    processes.push_back(exec::cuda_plan(plan, exec::gpu_ordinals(4, 2, {}, "", owner, process), owner, process));
  }
  const exec::CudaPlan& a = processes[0];
  const exec::CudaPlan& b = processes[1];
  ASSERT_EQ(a.groups.size(), b.groups.size());
  int across = 0;
  for (size_t g = 0; g < a.groups.size(); ++g) {
    EXPECT_EQ(a.groups[g].devices, b.groups[g].devices) << a.groups[g].what;
    EXPECT_EQ(a.processes(g), b.processes(g));
    EXPECT_EQ(a.id_maker(g), owner[static_cast<size_t>(a.groups[g].devices.front())]);
    if (a.processes(g).size() > 1) ++across;
  }
  EXPECT_GT(across, 0);  // the data-parallel all-reduces join devices 0 and 2 (each GPU 0 of its node)
  EXPECT_TRUE(a.local(1));
  EXPECT_FALSE(a.local(2));
  EXPECT_TRUE(b.local(2));
}

// Two all-reduces on one communicator and stream, which device 1 reaches in the other order.
// Tensor parallelism's all-reduces inside compute tasks get the group of the communicator on
// its members' compute streams: the one the plan's own collectives there use, or a new one.
TEST(CudaPlan, InTaskAllReducesUseTheCommunicatorsComputeStreamGroup) {
  for (const bool sequence : {false, true}) {
    partition::PlanOptions o = test_support::pipeline_options(2, 1, 2, "1f1b");
    o.tensor = 2;
    o.sequence_parallel = sequence;
    const Plan plan = test_support::planned(model::cpu_cluster(4), test_support::tiny_gpt(), o);
    std::vector<int> tp;
    for (size_t c = 0; c < plan.communicators.size(); ++c) {
      if (plan.communicators[c].name.rfind("tp ", 0) == 0) tp.push_back(static_cast<int>(c));
    }
    ASSERT_EQ(tp.size(), 2u) << "one tensor-parallel group per stage";
    const exec::CudaPlan with = exec::cuda_plan(plan, {0, 1, 2, 3}, {}, 0, tp);
    const exec::CudaPlan without = exec::cuda_plan(plan, {0, 1, 2, 3});
    EXPECT_TRUE(without.in_task_group.empty());
    for (const int c : tp) {
      ASSERT_TRUE(with.in_task_group.count(c)) << c;
      const exec::NcclGroup& g = with.groups[static_cast<size_t>(with.in_task_group.at(c))];
      EXPECT_EQ(g.devices, plan.communicators[static_cast<size_t>(c)].devices);
      // A collective of this communicator on the compute stream shares the group.
      for (size_t t = 0; t < plan.tasks.size(); ++t) {
        const partition::Task& task = plan.tasks[t];
        if (task.kind != TaskKind::collective || plan.collectives[static_cast<size_t>(task.collective)].communicator != c) continue;
        if (plan.stream_name(task.stream) != "compute") continue;
        EXPECT_EQ(with.group_of_task[t], with.in_task_group.at(c)) << partition::describe_task(plan, static_cast<int>(t));
      }
    }
    // The plan's own groups are unchanged; at most one group per communicator is added.
    EXPECT_LE(with.groups.size(), without.groups.size() + tp.size());
    EXPECT_EQ(with.group_of_task, without.group_of_task);
    // One member taking its micro-batches' forwards in another order would pair different
    // all-reduces: refused.
    Plan swapped = plan;
    const int d = plan.communicators[static_cast<size_t>(tp[0])].devices[1];
    for (partition::StreamProgram& program : swapped.programs[static_cast<size_t>(d)]) {
      std::vector<size_t> forwards;
      for (size_t i = 0; i < program.tasks.size(); ++i) {
        if (swapped.task(program.tasks[i]).kind == TaskKind::forward) forwards.push_back(i);
      }
      if (forwards.size() >= 2) std::swap(program.tasks[forwards[0]], program.tasks[forwards[1]]);
    }
    try {
      exec::cuda_plan(swapped, {0, 1, 2, 3}, {}, 0, tp);
      FAIL() << "a member with its forwards swapped was accepted";
    } catch (const PlanError& e) {
      EXPECT_NE(std::string(e.what()).find("different orders"), std::string::npos) << e.what();
    }
  }
}

TEST(CudaPlan, RefusesCollectivesThatMembersReachInDifferentOrders) {
  Plan plan = test_support::empty_plan(model::cpu_cluster(2));
  const int comm = plan.add_communicator({"all", {0, 1}});
  for (int k = 0; k < 2; ++k) {
    partition::Collective c;
    c.communicator = comm;
    c.bytes = 1024;
    for (int d = 0; d < 2; ++d) {
      partition::Task t;
      t.kind = TaskKind::collective;
      t.purpose = partition::Purpose::data_parallel;
      t.device = d;
      t.stream = 1;
      t.bytes = 1024;
      t.collective = k;
      c.tasks.push_back(plan.add_task(t));
    }
    plan.collectives.push_back(c);
  }
  plan.finish();
  EXPECT_NO_THROW(exec::cuda_plan(plan, {0, 1}));
  auto& tasks = plan.programs[1][0].tasks;
  std::swap(tasks[0], tasks[1]);
  try {
    exec::cuda_plan(plan, {0, 1});
    FAIL();
  } catch (const PlanError& e) {
    EXPECT_NE(std::string(e.what()).find("different orders"), std::string::npos) << e.what();
  }
}

// --- with GPUs ---

void expect_complete(const Plan& plan, const exec::RunResult& r, const exec::CudaBackend& cuda) {
  ASSERT_TRUE(r.completed) << r.error;
  EXPECT_EQ(r.trace.source, "exec-cuda");
  EXPECT_EQ(r.trace.compute, "proxy");
  EXPECT_EQ(r.trace.fingerprint, plan.fingerprint);
  ASSERT_EQ(r.trace.events.size(), plan.tasks.size() * static_cast<size_t>(plan.iterations()));
  for (const traces::Event& e : r.trace.events) {
    EXPECT_LE(e.start_s, e.end_s);
    const std::optional<double> gpu_s = cuda.gpu_time_s(e.task, e.iteration);
    ASSERT_TRUE(gpu_s.has_value()) << "task " << e.task << " iteration " << e.iteration;
    EXPECT_GE(*gpu_s, 0);
  }
}

// Every compute task instance's first output holds the proxy pattern, where that output is
// transient: proxies leave weights, gradients and optimizer state alone, as the CPU's do.
void expect_pattern(const Plan& plan, const Captured& captured) {
  int checked = 0;
  for (const auto& [key, bytes] : captured.written) {
    const auto [task, iteration] = key;
    const TaskKind kind = plan.task(task).kind;
    if (kind == TaskKind::send || kind == TaskKind::recv || kind == TaskKind::collective) continue;
    const auto writes = plan.writes(task);
    if (writes.empty() || partition::is_persistent(plan.tensor(writes[0]).kind)) continue;
    const std::vector<float> f = Captured::floats(bytes);
    for (size_t i = 0; i < f.size(); i += 1 + f.size() / 64) {
      ASSERT_EQ(f[i], pattern(task, iteration, i)) << "task " << task << " iteration " << iteration << " float " << i;
    }
    checked += !f.empty();
  }
  EXPECT_GT(checked, 0);
}

TEST(CudaBackend, OneDevicePlanCompletesWithTheProxyPattern) {
  SKIP_WITHOUT_GPUS(1);
  const Plan plan = test_support::planned(model::cpu_cluster(1), test_support::tiny_gpt(), pipeline(1, 2));
  exec::CudaBackend cuda({.flop_scale = 1, .max_message_bytes = 1 << 20, .gpus = {}, .copy_outputs_to_host = true});
  Captured captured;
  const exec::RunResult r = exec::run_plan(plan, cuda, options(&captured));
  expect_complete(plan, r, cuda);
  expect_pattern(plan, captured);
}

TEST(CudaBackend, TwoDevicePipelineMovesTheSendersBytes) {
  SKIP_WITHOUT_GPUS(2);
  const Plan plan = test_support::planned(model::cpu_cluster(2), test_support::tiny_gpt(), pipeline(2, 4));
  exec::CudaBackend cuda({.flop_scale = 1, .max_message_bytes = 1 << 20, .gpus = {}, .copy_outputs_to_host = true});
  Captured captured;
  const exec::RunResult r = exec::run_plan(plan, cuda, options(&captured));
  expect_complete(plan, r, cuda);
  expect_pattern(plan, captured);
  // The k-th receive on a channel got the k-th send's bytes: the sender's forward output.
  std::map<int, std::vector<int>> sends, recvs;
  for (const auto& device : plan.programs) {
    for (const auto& program : device) {
      for (const int t : program.tasks) {
        const partition::Task& task = plan.task(t);
        if (task.kind == TaskKind::send) sends[task.channel].push_back(t);
        if (task.kind == TaskKind::recv) recvs[task.channel].push_back(t);
      }
    }
  }
  int checked = 0;
  for (const auto& [channel, s] : sends) {
    for (size_t k = 0; k < s.size(); ++k) {
      for (int i = 0; i < plan.iterations(); ++i) {
        const auto& sent = captured.read.at({s[k], i});
        const auto& received = captured.written.at({recvs.at(channel)[k], i});
        const size_t n = std::min(sent.size(), received.size());
        EXPECT_TRUE(std::equal(sent.begin(), sent.begin() + static_cast<std::ptrdiff_t>(n), received.begin()))
            << "channel " << channel << " message " << k << " iteration " << i;
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 0);
}

TEST(CudaBackend, TwoDeviceAllReduceSumsTheInputs) {
  SKIP_WITHOUT_GPUS(2);
  Plan plan = test_support::empty_plan(model::cpu_cluster(2));
  constexpr double kBytes = 4000 * 4;
  const std::vector<int> producers = test_support::add_collective_over_all(plan, partition::Collective{}, kBytes);
  exec::CudaBackend cuda({.flop_scale = 1, .max_message_bytes = 1 << 20, .gpus = {}, .copy_outputs_to_host = true});
  Captured captured;
  const exec::RunResult r = exec::run_plan(plan, cuda, options(&captured));
  ASSERT_TRUE(r.completed) << r.error;
  const std::vector<float> a = Captured::floats(captured.written.at({producers[0], 0}));
  const std::vector<float> b = Captured::floats(captured.written.at({producers[1], 0}));
  ASSERT_EQ(a.size(), 4000u);
  for (int d = 0; d < 2; ++d) {
    const std::vector<float> out = Captured::floats(captured.written.at({plan.collectives[0].tasks[static_cast<size_t>(d)], 0}));
    ASSERT_EQ(out.size(), a.size());
    for (size_t i = 0; i < out.size(); ++i) ASSERT_EQ(out[i], a[i] + b[i]) << "device " << d << " float " << i;
  }
}

// As the engine's test: a receive removed, so its send waits for ever; the watchdog names it.
TEST(CudaBackend, AStalledPlanEndsWithTheWatchdogsMessage) {
  SKIP_WITHOUT_GPUS(2);
  Plan plan = test_support::planned(model::cpu_cluster(2), test_support::tiny_gpt(), pipeline(2, 2));
  int removed = -1;
  for (auto& device : plan.programs) {
    for (partition::StreamProgram& s : device) {
      for (size_t k = 0; k < s.tasks.size() && removed < 0; ++k) {
        if (plan.task(s.tasks[k]).kind != TaskKind::recv) continue;
        removed = s.tasks[k];
        s.tasks.erase(s.tasks.begin() + static_cast<std::ptrdiff_t>(k));
      }
    }
  }
  ASSERT_GE(removed, 0);
  exec::CudaBackend cuda;
  const auto start = std::chrono::steady_clock::now();
  const exec::RunResult r = exec::run_plan(plan, cuda, options(nullptr, 1));
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_FALSE(r.completed);
  EXPECT_TRUE(r.stalled);
  EXPECT_NE(r.error.find("watchdog"), std::string::npos) << r.error;
  EXPECT_NE(r.error.find("to receive on channel"), std::string::npos) << r.error;  // the sender, in its NCCL send
  EXPECT_LT(took, 20);  // preparing (communicators) + the watchdog's 1 s + aborting
}

// A compute task of 10^18 FLOPs against a 0.5 s watchdog: stop() ends it within moments.
TEST(CudaBackend, StopEndsALongComputeTaskPromptly) {
  SKIP_WITHOUT_GPUS(1);
  Plan plan = test_support::empty_plan(model::cpu_cluster(1));
  const int x = test_support::transient(plan, 0, 4096);
  const int task = test_support::compute_task(plan, 0, {}, {x});
  plan.task(task).flops = 1e18;
  plan.tensors[static_cast<size_t>(x)].free_after = task;
  plan.finish();
  exec::CudaBackend cuda;
  const exec::RunResult r = exec::run_plan(plan, cuda, options(nullptr, 0.5));
  EXPECT_TRUE(r.stalled);
  EXPECT_NE(r.error.find("watchdog"), std::string::npos) << r.error;
  EXPECT_LT(r.wall_s, 5);  // the watchdog's 0.5 s, then at most a few GEMM groups
}

// --- real training math ---

model::Network odd_gpt() {
  return model::network_from_spec("gpt:layers=2,hidden=36,heads=3,seq=13,vocab=97", model::Precision::fp32);
}
model::Network odd_llama() {
  return model::network_from_spec("llama:layers=2,hidden=48,heads=6,kv_heads=2,ffn=100,seq=11,vocab=101",
                                  model::Precision::fp32);
}

// Runs without a GPU: with a training the back end says its compute is real, and a message
// a parameter server's push or pull carries is sized before the run, as the receiving GPU
// needs (the floats message() then gives).
TEST(CudaBackend, RealMathKnowsEveryMessagesSizeBeforeTheRun) {
  for (const partition::SyncKind sync : {partition::SyncKind::ps, partition::SyncKind::wsp}) {
    partition::PlanOptions o = test_support::pipeline_options(2, 2, 2, "1f1b");
    o.sync = sync;
    const Plan plan = test_support::planned(model::cpu_cluster(4), test_support::tiny_gpt(), o);
    exec::Training training(plan, exec::markov_stream(256, 1), {}, 42);
    exec::CudaBackendOptions with_training;
    with_training.training = &training;
    EXPECT_EQ(exec::CudaBackend(with_training).compute(), "real");
    exec::CpuBackend cpu({}, &training);
    std::map<int, size_t> sent;  // send task -> floats its message had
    exec::EngineOptions e = options();
    e.iterations = 2;
    struct Recording final : exec::Backend {
      exec::CpuBackend& inner;
      exec::Training& training;
      std::map<int, size_t>& sent;
      std::mutex mutex;
      Recording(exec::CpuBackend& b, exec::Training& t, std::map<int, size_t>& s) : inner(b), training(t), sent(s) {}
      std::string name() const override { return inner.name(); }
      std::string compute() const override { return inner.compute(); }
      void prepare(const Plan& p) override { inner.prepare(p); }
      std::optional<size_t> buffer_bytes(int t) const override { return inner.buffer_bytes(t); }
      void run(exec::TaskContext& task) override {
        if (task.spec->kind == TaskKind::send) {
          if (const auto m = training.message(task)) {
            std::lock_guard lock(mutex);
            sent[task.task] = m->size();
          }
        }
        inner.run(task);
      }
      void stop() override { inner.stop(); }
    } recording(cpu, training, sent);
    const exec::RunResult r = exec::run_plan(plan, recording, e);
    ASSERT_TRUE(r.completed) << r.error;
    ASSERT_FALSE(sent.empty()) << "no push or pull";
    for (const auto& [task, floats] : sent) {
      ASSERT_TRUE(training.message_floats(task).has_value()) << task;
      EXPECT_EQ(*training.message_floats(task), floats) << partition::describe_task(plan, task);
    }
  }
}

struct RealRun {
  std::vector<double> losses;
  exec::SafetensorsFile before, after;
  int skipped = 0;
};

// `steps` of real training from the seeded weights, on the GPUs or on the CPU back end.
RealRun train(const Plan& plan, bool on_gpus, const exec::OptimizerOptions& optimizer, int steps) {
  exec::Training training(plan, exec::markov_stream(plan.network.architecture->vocab, 7), optimizer, 42);
  RealRun run;
  run.before = training.weights();
  exec::CudaBackendOptions cuda_options;
  cuda_options.training = &training;
  std::unique_ptr<exec::Backend> backend;
  if (on_gpus) {
    backend = std::make_unique<exec::CudaBackend>(cuda_options);
  } else {
    backend = std::make_unique<exec::CpuBackend>(exec::CpuBackendOptions{}, &training);
  }
  exec::EngineOptions e = options();
  e.iterations = steps;
  const exec::RunResult r = exec::run_plan(plan, *backend, e);
  EXPECT_TRUE(r.completed) << r.error;
  EXPECT_EQ(r.trace.compute, "real");
  run.losses = training.losses();
  run.skipped = training.skipped_steps();
  run.after = training.weights();  // while the back end (its GPUs' memory) is alive
  return run;
}

// w_after - w_before of every tensor, as one file.
exec::SafetensorsFile step_of(const RealRun& run) {
  exec::SafetensorsFile d = run.after;
  for (size_t i = 0; i < d.tensors.size(); ++i) {
    for (size_t k = 0; k < d.tensors[i].data.size(); ++k) d.tensors[i].data[k] -= run.before.tensors[i].data[k];
  }
  return d;
}

// The same training on the GPUs as on the CPU back end. One step of Adam with lr 1 and eps 1
// moves each weight by g / (|g| + 1), about its gradient: the steps compared tensor by tensor
// are the gradients (fp32 sums on the GPU, double ones in the reference). Then the losses of
// three steps of the ordinary optimizer.
void expect_trains_as_the_cpu(const Plan& plan, const std::string& what) {
  exec::OptimizerOptions gradient_step;
  gradient_step.lr = 1;
  gradient_step.adam_eps = 1;
  gradient_step.weight_decay = 0;
  gradient_step.clip_grad = 0;
  const auto steps = test_support::compare_weights(step_of(train(plan, true, gradient_step, 1)),
                                                   step_of(train(plan, false, gradient_step, 1)));
  EXPECT_TRUE(steps.same_names) << what;
  EXPECT_LT(steps.whole_relative, 1e-4) << what << ": gradients";
  EXPECT_LT(steps.worst_relative, 1e-3) << what << ": gradients of " << steps.worst;
  exec::OptimizerOptions clipped;
  clipped.lr = 1e-3;
  clipped.clip_grad = 0.5;
  const RealRun gpu = train(plan, true, clipped, 3), cpu = train(plan, false, clipped, 3);
  ASSERT_EQ(gpu.losses.size(), 3u) << what;
  for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(gpu.losses[i], cpu.losses[i], 1e-4 * cpu.losses[i]) << what << " step " << i;
}

TEST(CudaBackend, RealTrainingOnOneGpuMatchesTheCpuBackend) {
  SKIP_WITHOUT_GPUS(1);
  for (const model::Network& net : {odd_gpt(), odd_llama()}) {
    for (const char* schedule : {"1f1b", "1f1b-split-w"}) {
      partition::PlanOptions o = test_support::pipeline_options(1, 1, 2, schedule);
      o.recompute = partition::Recompute::selective;
      expect_trains_as_the_cpu(test_support::planned(model::cpu_cluster(1), net, o), net.name + " " + schedule);
    }
  }
}

// A mixture of experts (5 experts 37 wide, the top 2, and a shared one as wide) on one GPU:
// the router and the copies' permutation and combine run as the CUDA kernels, each expert's
// SwiGLU as cuBLAS GEMMs on its run of rows, the copies' order built on the host from the
// downloaded choices. (The routers' logits differ by GEMM rounding only: on these 22 tokens
// no choice is near enough a tie to flip.)
TEST(CudaBackend, RealTrainingOfAMixtureOfExpertsOnOneGpuMatchesTheCpuBackend) {
  SKIP_WITHOUT_GPUS(1);
  const model::Network net = model::network_from_spec(
      "llama:layers=2,hidden=48,heads=6,kv_heads=2,ffn=100,seq=11,vocab=101,experts=5,experts_per_token=2,"
      "expert_ffn=37,shared_experts=1",
      model::Precision::fp32);
  for (const char* schedule : {"1f1b", "1f1b-split-w"}) {
    partition::PlanOptions o = test_support::pipeline_options(1, 1, 2, schedule);
    o.recompute = partition::Recompute::full;
    expect_trains_as_the_cpu(test_support::planned(model::cpu_cluster(1), net, o), net.name + " " + schedule);
  }
}

// A bf16 plan: the linear layers multiply bf16 operands (fp32 accumulation), the rest is
// fp32; the cpu back end runs it all in fp32. The losses stay within 1 % (bf16 keeps 8 bits).
TEST(CudaBackend, RealTrainingWithBf16GemmsStaysCloseToFp32) {
  SKIP_WITHOUT_GPUS(1);
  for (const char* spec : {"gpt:layers=2,hidden=36,heads=3,seq=13,vocab=97",
                           "llama:layers=2,hidden=48,heads=6,kv_heads=2,ffn=100,seq=11,vocab=101"}) {
    const model::Network net = model::network_from_spec(spec, model::Precision::bf16);
    const Plan plan = test_support::planned(model::cpu_cluster(1), net, test_support::pipeline_options(1, 1, 2, "1f1b"));
    exec::OptimizerOptions o;
    o.lr = 1e-3;
    const RealRun gpu = train(plan, true, o, 3), cpu = train(plan, false, o, 3);
    ASSERT_EQ(gpu.losses.size(), 3u) << spec;
    for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(gpu.losses[i], cpu.losses[i], 1e-2 * cpu.losses[i]) << spec << " step " << i;
  }
}

// An fp16 plan with its loss scaled (dynamic, from 2^12): the linear layers multiply fp16
// operands; the losses stay within 1 % of the cpu back end's fp32, and no step overflows.
TEST(CudaBackend, RealTrainingWithFp16GemmsAndLossScalingStaysCloseToFp32) {
  SKIP_WITHOUT_GPUS(1);
  for (const char* spec : {"gpt:layers=2,hidden=36,heads=3,seq=13,vocab=97",
                           "llama:layers=2,hidden=48,heads=6,kv_heads=2,ffn=100,seq=11,vocab=101"}) {
    const model::Network net = model::network_from_spec(spec, model::Precision::fp16);
    const Plan plan = test_support::planned(model::cpu_cluster(1), net, test_support::pipeline_options(1, 1, 2, "1f1b"));
    exec::OptimizerOptions o;
    o.lr = 1e-3;
    o.loss_scale.dynamic = true;
    o.loss_scale.initial_loss_scale = 4096;
    const RealRun gpu = train(plan, true, o, 3), cpu = train(plan, false, o, 3);
    ASSERT_EQ(gpu.losses.size(), 3u) << spec;
    for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(gpu.losses[i], cpu.losses[i], 1e-2 * cpu.losses[i]) << spec << " step " << i;
    EXPECT_EQ(gpu.skipped, 0) << spec;
  }
}

TEST(CudaBackend, RealTrainingOnTwoGpusMatchesTheCpuBackend) {
  SKIP_WITHOUT_GPUS(2);
  for (const model::Network& net : {odd_gpt(), odd_llama()}) {
    // Data parallel (gradient and norm all-reduces), then a pipeline (activations by NCCL,
    // the tied embedding's all-reduce for GPT-2).
    expect_trains_as_the_cpu(test_support::planned(model::cpu_cluster(2), net,
                                                   test_support::pipeline_options(1, 2, 2, "1f1b")),
                             net.name + " data parallel 2");
    partition::PlanOptions pipelined = test_support::pipeline_options(2, 1, 4, "1f1b");
    pipelined.recompute = partition::Recompute::full;
    expect_trains_as_the_cpu(test_support::planned(model::cpu_cluster(2), net, pipelined), net.name + " pipeline 2");
  }
}

// Parameter servers and WSP over two GPUs: pushes and pulls through the host, the servers'
// updates on the host; D = 0 is synchronous, D = 1 lets a worker run a step ahead.
TEST(CudaBackend, RealTrainingWithParameterServersMatchesTheCpuBackend) {
  SKIP_WITHOUT_GPUS(2);
  for (const model::Network& net : {odd_gpt(), odd_llama()}) {
    for (const auto& [sync, staleness] : {std::pair{partition::SyncKind::ps, 0}, {partition::SyncKind::wsp, 1}}) {
      partition::PlanOptions o = test_support::pipeline_options(1, 2, 2, "1f1b");
      o.sync = sync;
      o.staleness = staleness;
      expect_trains_as_the_cpu(test_support::planned(model::cpu_cluster(2), net, o),
                               net.name + " " + std::string(partition::to_string(sync)) + " D=" + std::to_string(staleness));
    }
  }
}

// Megatron tensor parallelism over two GPUs: the all-reduces inside compute tasks (NCCL on
// the compute streams), the vocabulary-parallel embedding and loss; with sequence
// parallelism also its all-gathers and reduce-scatters there.
TEST(CudaBackend, RealTrainingWithTensorParallelismMatchesTheCpuBackend) {
  SKIP_WITHOUT_GPUS(2);
  // Odd sequences split unevenly between the ranks in the decoder's own exchanges (grouped
  // broadcasts and reduces); the even ones evenly (NCCL's in-place all-gather and
  // reduce-scatter). Sequence parallelism needs equal shards: the even sequences.
  for (const char* spec : {"gpt:layers=2,hidden=36,heads=6,seq=13,vocab=97",
                           "llama:layers=2,hidden=48,heads=6,kv_heads=2,ffn=100,seq=11,vocab=101",
                           "gpt:layers=2,hidden=36,heads=6,seq=16,vocab=97",
                           "llama:layers=2,hidden=48,heads=6,kv_heads=2,ffn=100,seq=10,vocab=101"}) {
    const model::Network net = model::network_from_spec(spec, model::Precision::fp32);
    for (const bool sequence : {false, true}) {
      if (sequence && net.architecture->seq % 2 != 0) continue;
      partition::PlanOptions o = test_support::pipeline_options(1, 1, 2, "1f1b");
      o.tensor = 2;
      o.sequence_parallel = sequence;
      expect_trains_as_the_cpu(test_support::planned(model::cpu_cluster(2), net, o),
                               std::string(spec) + (sequence ? " tensor + sequence parallel" : " tensor parallel"));
    }
  }
}

}  // namespace
