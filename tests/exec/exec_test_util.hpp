#pragma once
// Plans for executor tests: built through the partition API on cpu-N clusters, or by hand
// (one collective, one transfer) where a test needs to know every tensor.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <iomanip>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "exec/backend.hpp"
#include "exec/cpu_backend.hpp"
#include "exec/engine.hpp"
#include "model/io.hpp"
#include "model/zoo.hpp"
#include "partition/plan_builder.hpp"
#include "partition/plan_io.hpp"
#include "partition/policy.hpp"
#include "partition/traffic.hpp"
#include "traces/traffic.hpp"

namespace hetflow::test_support {

// Conservation of communication: every communicator of `plan` carried in `trace` (iterations
// of it) what the plan says it carries, in-task messages included; returns what the plan
// says of each, once.
inline std::vector<double> expect_carries_what_the_plan_says(const partition::Plan& plan, const traces::Trace& trace,
                                                             int iterations, const std::string& what) {
  const std::vector<double> planned = partition::planned_bytes_per_communicator(plan);
  const std::vector<double> carried = traces::carried_bytes_per_communicator(plan, trace);
  EXPECT_EQ(carried.size(), planned.size()) << what;
  for (size_t k = 0; k < planned.size() && k < carried.size(); ++k) {
    const partition::Communicator& comm = plan.communicators[k];
    EXPECT_EQ(carried[k], iterations * planned[k])
        << std::setprecision(17) << carried[k] << " vs " << iterations * planned[k] << " " << what << ": communicator "
        << k << " (" << comm.name << ", " << partition::to_string(comm.role) << ")";
  }
  return planned;
}

// A task instance outside the engine, for testing what a seam does with one: it waits on
// nothing and its clock stands still.
class StubTask final : public exec::TaskContext {
 public:
  explicit StubTask(int task_id = -1, int iteration_ = 0, const partition::Task* task_spec = nullptr) {
    task = task_id;
    iteration = iteration_;
    spec = task_spec;
  }
  void waiting_for(std::string) override {}
  double now_s() const override { return 0; }
};

// CPU devices of two memory sizes, one a node, alternating 16 and 24 GiB (`n` of them).
inline model::Cluster cpus_of_two_memories(int n) {
  std::string yaml = "name: cpu-two-memories\ngpu_types:\n";
  for (const char* memory : {"16", "24"}) {
    yaml += std::string("  - {name: CPU-") + memory + ", fp16: 200 GFLOP/s, fp32: 200 GFLOP/s, bf16: 200 GFLOP/s, memory: " +
            memory + " GiB, memory_bandwidth: 20 GB/s, link: pcie, link_bandwidth: 10 GB/s}\n";
  }
  yaml += "fabric: {kind: switch, latency: 1 us}\nnodes:\n";
  for (int i = 0; i < n; ++i) {
    yaml += "  - {name: n" + std::to_string(i) + ", gpu: CPU-" + (i % 2 ? "24" : "16") +
            ", gpus: 1, intra: {kind: pcie, bandwidth: 10 GB/s, latency: 1 us}, nic: {count: 1, bandwidth: 10 GB/s, latency: 1 us}}\n";
  }
  return model::parse_cluster(yaml, "cpu-two-memories.yaml");
}

// A two-layer GPT small enough to run in milliseconds, with attention heads for tensor parallelism.
inline model::Network tiny_gpt() {
  return model::network_from_spec("gpt:layers=2,hidden=64,heads=4,seq=32,vocab=256", model::Precision::fp32);
}

inline partition::Plan planned(const model::Cluster& cluster, const model::Network& net, partition::PlanOptions o) {
  o.precision = net.precision;
  o.workspace_bytes = 0;
  const partition::CostModel cost(cluster, net.precision);
  partition::Plan plan = partition::build_plan(cluster, net, partition::make_layout(cluster, net, o, cost), cost);
  plan.fingerprint = partition::plan_fingerprint(plan);
  return plan;
}

// A plan with no tasks yet: the cluster's devices, a compute and a comm stream.
inline partition::Plan empty_plan(const model::Cluster& cluster) {
  partition::Plan plan;
  plan.cluster = cluster;
  plan.network.name = "none";
  for (const model::Device& d : cluster.devices()) plan.device_names.push_back(d.name);
  plan.programs.resize(plan.device_names.size());
  plan.streams = {"compute", "comm", "send", "recv"};
  plan.layout.workers.clear();
  plan.layout.iterations = 1;
  return plan;
}

inline int transient(partition::Plan& plan, int device, double bytes) {
  partition::Tensor t;
  t.kind = partition::TensorKind::activation;
  t.device = device;
  t.shape = {static_cast<std::int64_t>(bytes / 4)};
  t.dtype = model::Precision::fp32;
  t.bytes = bytes;
  return plan.add_tensor(t);
}

inline int compute_task(partition::Plan& plan, int device, std::vector<int> reads, std::vector<int> writes,
                        partition::TaskKind kind = partition::TaskKind::forward) {
  partition::Task t;
  t.kind = kind;
  t.device = device;
  t.stream = 0;
  t.flops = 1e5;
  t.stage = 0;
  t.microbatch = 0;
  return plan.add_task(t, reads, writes);
}

// Adds `c` (its kind, algorithm and root as given) as one data-parallel collective of `bytes`
// over every device of the plan, on stream 1, each member's input written by a compute task
// before it, and finishes the plan. Returns those producer tasks, by device.
inline std::vector<int> add_collective_over_all(partition::Plan& plan, partition::Collective c, double bytes) {
  const int n = plan.device_count();
  std::vector<int> all;
  for (int d = 0; d < n; ++d) all.push_back(d);
  c.communicator = plan.add_communicator({"all", all});
  c.bytes = bytes;
  std::vector<int> producers;
  for (int d = 0; d < n; ++d) {
    const int x = transient(plan, d, bytes), y = transient(plan, d, bytes);
    producers.push_back(compute_task(plan, d, {}, {x}));
    partition::Task t;
    t.kind = partition::TaskKind::collective;
    t.purpose = partition::Purpose::data_parallel;
    t.device = d;
    t.stream = 1;
    t.bytes = bytes;
    t.collective = static_cast<int>(plan.collectives.size());
    c.tasks.push_back(plan.add_task(t, std::vector<int>{x}, std::vector<int>{y}));
    plan.tensors[static_cast<size_t>(x)].free_after = c.tasks.back();
    plan.tensors[static_cast<size_t>(y)].free_after = c.tasks.back();
  }
  plan.collectives.push_back(c);
  plan.finish();
  return producers;
}

// Pipeline x data-parallel options for training plans: micro-batches of one sequence,
// gradients by all-reduce.
inline partition::PlanOptions pipeline_options(int pipeline, int data, int microbatches, const char* schedule) {
  partition::PlanOptions o;
  o.pipeline = pipeline;
  o.data = data;
  o.microbatches = microbatches;
  o.schedule = schedule;
  o.micro_batch = 1;
  o.sync = partition::SyncKind::allreduce;
  return o;
}

// The CPU back end (proxies, 64 KiB messages), except that `task` throws "injected failure"
// at iteration 1: a failure in the middle of a run.
class ThrowingBackend final : public exec::Backend {
 public:
  explicit ThrowingBackend(int task, const exec::Ranks* ranks = nullptr) : task_(task), inner_({1, 64 * 1024}, nullptr, ranks) {}
  std::string name() const override { return inner_.name(); }
  std::string compute() const override { return inner_.compute(); }
  void prepare(const partition::Plan& plan) override { inner_.prepare(plan); }
  void stop() override { inner_.stop(); }
  void run(exec::TaskContext& t) override {
    if (t.task == task_ && t.iteration == 1) throw Error("injected failure");
    inner_.run(t);
  }

 private:
  int task_;
  exec::CpuBackend inner_;
};

// What finished task instances held: (task, iteration) -> bytes of its first read and write.
struct Captured {
  std::mutex mutex;
  std::map<std::pair<int, int>, std::vector<std::byte>> read, written;
  std::function<void(const exec::TaskView&)> hook() {
    return [this](const exec::TaskView& v) {
      std::lock_guard lock(mutex);
      if (!v.reads.empty()) read[{v.task, v.iteration}].assign(v.reads[0].data, v.reads[0].data + v.reads[0].size_bytes);
      if (!v.writes.empty()) {
        written[{v.task, v.iteration}].assign(v.writes[0].data, v.writes[0].data + v.writes[0].size_bytes);
      }
    };
  }
  static std::vector<float> floats(const std::vector<std::byte>& bytes) {
    std::vector<float> f(bytes.size() / sizeof(float));
    if (!f.empty()) std::memcpy(f.data(), bytes.data(), f.size() * sizeof(float));
    return f;
  }
};

}  // namespace hetflow::test_support
