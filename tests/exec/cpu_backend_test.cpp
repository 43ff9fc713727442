// The CPU back end moves real bytes: transfers deliver exactly what was sent, and every
// collective kind and algorithm computes what its kind promises (oracle: the sums and
// copies computed directly from the inputs).
#include <gtest/gtest.h>

#include "exec/cpu_backend.hpp"
#include "exec/engine.hpp"
#include "partition/collective_steps.hpp"
#include "tests/exec/exec_test_util.hpp"
#include "tests/partition/plan_test_util.hpp"

using namespace hetflow;
using partition::CollectiveAlgorithm;
using partition::CollectiveKind;
using partition::Plan;
using partition::TaskKind;
using test_support::Captured;

namespace {

constexpr double kBytes = 4000 * 4;  // 4000 floats: every part boundary below is a whole float

exec::EngineOptions options(test_support::Captured& captured) {
  exec::EngineOptions o;
  o.watchdog_s = 20;
  o.max_buffer_bytes = 1 << 20;
  o.on_task_end = captured.hook();
  return o;
}

TEST(CpuBackend, TransfersDeliverExactlyTheSendersBytes) {
  Plan plan = test_support::empty_plan(model::cpu_cluster(2));
  plan.layout.iterations = 3;
  const int channel = plan.add_channel({0, 1, "act", -1});
  std::vector<int> sends, recvs;
  for (int mb = 0; mb < 3; ++mb) {
    const int x = test_support::transient(plan, 0, 1000 + 4 * mb);  // sizes that are not powers of two
    const int y = test_support::transient(plan, 1, 1000 + 4 * mb);
    test_support::compute_task(plan, 0, {}, {x});
    partition::Task s;
    s.kind = TaskKind::send;
    s.purpose = partition::Purpose::activation;
    s.device = 0;
    s.stream = 2;
    s.bytes = 1000 + 4 * mb;
    s.channel = channel;
    sends.push_back(plan.add_task(s, std::vector<int>{x}, {}));
    partition::Task r = s;
    r.kind = TaskKind::recv;
    r.device = 1;
    r.stream = 3;
    recvs.push_back(plan.add_task(r, {}, std::vector<int>{y}));
    const int use = test_support::compute_task(plan, 1, {y}, {}, TaskKind::backward);
    plan.tensors[static_cast<size_t>(x)].free_after = sends.back();
    plan.tensors[static_cast<size_t>(y)].free_after = use;
  }
  plan.finish();
  Captured captured;
  exec::CpuBackend cpu;
  const exec::RunResult result = exec::run_plan(plan, cpu, options(captured));
  ASSERT_TRUE(result.completed) << result.error;
  for (int i = 0; i < 3; ++i) {
    for (size_t k = 0; k < sends.size(); ++k) {
      const auto& sent = captured.read.at({sends[k], i});
      const auto& received = captured.written.at({recvs[k], i});
      ASSERT_EQ(sent.size(), 1000 + 4 * k);
      EXPECT_EQ(sent, received) << "message " << k << " iteration " << i;
      // The proxy wrote something that names its task and iteration: a mix-up would show.
      EXPECT_NE(Captured::floats(sent)[0], 0.0f);
    }
  }
  EXPECT_NE(captured.read.at({sends[0], 0}), captured.read.at({sends[1], 0}));
}

// Offload's copies on proxies: each to_host moves its gradients' bytes into the host state and
// each to_device the host state's into the weights (what the capture sees first of each), and
// the trace records the plan's bytes for both.
TEST(CpuBackend, OffloadCopiesMoveTheirBytesOnProxies) {
  partition::PlanOptions o;
  o.data = 2;
  o.microbatches = 2;
  o.offload_optimizer = true;
  o.workspace_bytes = 0;
  const Plan plan = test_support::planned(model::cpu_cluster(2),
      model::network_from_spec("gpt:layers=2,hidden=64,heads=4,seq=32,vocab=256", model::Precision::fp32), o);
  Captured captured;
  exec::CpuBackend cpu;
  exec::EngineOptions e = options(captured);
  e.iterations = 2;
  const exec::RunResult result = exec::run_plan(plan, cpu, e);
  ASSERT_TRUE(result.completed) << result.error;
  int copies = 0;
  for (const traces::Event& ev : result.trace.events) {
    if (!partition::is_host_copy(ev.kind) || ev.message >= 0) continue;
    ++copies;
    EXPECT_EQ(ev.bytes, plan.task(ev.task).bytes);
    const auto& in = captured.read.at({ev.task, ev.iteration});
    const auto& out = captured.written.at({ev.task, ev.iteration});
    const size_t n = std::min({in.size(), out.size(), static_cast<size_t>(plan.task(ev.task).bytes)});
    ASSERT_GT(n, 0u);
    EXPECT_TRUE(std::equal(in.begin(), in.begin() + static_cast<std::ptrdiff_t>(n), out.begin())) << ev.task;
  }
  EXPECT_EQ(copies, 2 * 2 * 2);  // two devices, down and up, two iterations
}

// One collective over every device, each member's input made by a compute task before it.
struct CollectiveRun {
  std::vector<std::vector<float>> in, out;  // per device
};

CollectiveRun run_collective(const model::Cluster& cluster, CollectiveKind kind, CollectiveAlgorithm algorithm,
                             int root) {
  Plan plan = test_support::empty_plan(cluster);
  const int n = plan.device_count();
  partition::Collective c;
  c.kind = kind;
  c.algorithm = algorithm;
  c.root = root;
  const std::vector<int> producers = test_support::add_collective_over_all(plan, c, kBytes);
  Captured captured;
  exec::CpuBackend cpu;
  const exec::RunResult result = exec::run_plan(plan, cpu, options(captured));
  EXPECT_TRUE(result.completed) << result.error;
  CollectiveRun r;
  for (int d = 0; d < n; ++d) {
    r.in.push_back(Captured::floats(captured.written.at({producers[static_cast<size_t>(d)], 0})));
    r.out.push_back(Captured::floats(captured.written.at({plan.collectives[0].tasks[static_cast<size_t>(d)], 0})));
  }
  return r;
}

// Part `index` of `parts` of a buffer of `count` floats.
std::pair<size_t, size_t> part(size_t index, size_t parts, size_t count) {
  return {index * count / parts, (index + 1) * count / parts};
}

std::vector<float> sum(const std::vector<std::vector<float>>& in) {
  std::vector<float> s(in[0].size(), 0.0f);
  for (const auto& v : in) {
    for (size_t i = 0; i < v.size(); ++i) s[i] += v[i];
  }
  return s;
}

// Where a member's reduce_scatter result (all_gather contribution) lies: its ring position
// (ring), or local index l and node q as part l*m + q of k*m (hierarchical, k per node, m nodes).
size_t owned_part(CollectiveAlgorithm algorithm, int device, int per_node, int nodes) {
  if (algorithm != CollectiveAlgorithm::hierarchical) return static_cast<size_t>(device);
  return static_cast<size_t>((device % per_node) * nodes + device / per_node);
}

TEST(CpuBackend, CollectivesComputeWhatTheirKindPromises) {
  const model::Cluster flat = model::cpu_cluster(5);
  const model::Cluster two_nodes = test_support::identical_cluster(2, 2);  // 2 nodes x 2 devices
  for (CollectiveKind kind : {CollectiveKind::all_reduce, CollectiveKind::reduce_scatter, CollectiveKind::all_gather,
                              CollectiveKind::broadcast, CollectiveKind::reduce, CollectiveKind::all_to_all,
                              CollectiveKind::sendrecv}) {
    for (CollectiveAlgorithm algorithm : {CollectiveAlgorithm::ring, CollectiveAlgorithm::tree, CollectiveAlgorithm::hierarchical,
                                          CollectiveAlgorithm::pairwise}) {
      if (!partition::supports(kind, algorithm)) continue;
      const bool hierarchical = algorithm == CollectiveAlgorithm::hierarchical;
      const model::Cluster& cluster = hierarchical ? two_nodes : flat;
      const int n = cluster.device_count(), per_node = hierarchical ? 2 : n, nodes = hierarchical ? 2 : 1;
      const int root = 2 % n;
      SCOPED_TRACE(std::string(partition::to_string(kind)) + " " + std::string(partition::to_string(algorithm)));
      const CollectiveRun r = run_collective(cluster, kind, algorithm, root);
      ASSERT_EQ(r.out.size(), static_cast<size_t>(n));
      const size_t count = r.in[0].size();
      ASSERT_EQ(count, 4000u);
      const std::vector<float> total = sum(r.in);
      for (int d = 0; d < n; ++d) {
        const auto& out = r.out[static_cast<size_t>(d)];
        switch (kind) {
          case CollectiveKind::all_reduce:
            EXPECT_EQ(out, total) << "device " << d;
            break;
          case CollectiveKind::broadcast:
            EXPECT_EQ(out, r.in[static_cast<size_t>(root)]) << "device " << d;
            break;
          case CollectiveKind::reduce:
            if (d == root) {
              EXPECT_EQ(out, total);
            }
            break;
          case CollectiveKind::reduce_scatter: {
            const auto [b, e] = part(owned_part(algorithm, d, per_node, nodes), static_cast<size_t>(n), count);
            EXPECT_TRUE(std::equal(out.begin() + b, out.begin() + e, total.begin() + b)) << "device " << d;
            break;
          }
          case CollectiveKind::all_gather:
            for (int from = 0; from < n; ++from) {
              const auto [b, e] = part(owned_part(algorithm, from, per_node, nodes), static_cast<size_t>(n), count);
              const auto& src = r.in[static_cast<size_t>(from)];
              EXPECT_TRUE(std::equal(out.begin() + b, out.begin() + e, src.begin() + b)) << "device " << d << " part of " << from;
            }
            break;
          case CollectiveKind::sendrecv:  // the previous member's buffer, whole
            EXPECT_EQ(out, r.in[static_cast<size_t>((d + n - 1) % n)]) << "device " << d;
            break;
          case CollectiveKind::all_to_all:  // piece `from` of the output: piece d of member from's buffer
            for (int from = 0; from < n; ++from) {
              const auto [b, e] = part(static_cast<size_t>(from), static_cast<size_t>(n), count);
              const auto [sb, se] = part(static_cast<size_t>(d), static_cast<size_t>(n), count);
              const auto& src = r.in[static_cast<size_t>(from)];
              EXPECT_TRUE(std::equal(out.begin() + b, out.begin() + e, src.begin() + sb)) << "device " << d << " from " << from;
              EXPECT_EQ(e - b, se - sb);
            }
            break;
        }
      }
    }
  }
}

TEST(CpuBackend, ProbeMeasuresAPositiveSpeed) {
  const double flops_per_s = exec::probe_sgemm_flops_per_s(0.02, 64);
  EXPECT_GT(flops_per_s, 1e7);
  EXPECT_LT(flops_per_s, 1e13);
}

TEST(CpuCluster, NamedCpuNWithAFixedDefaultSpeed) {
  const model::Cluster c = model::load_cluster("cpu-3");
  EXPECT_EQ(c.name, "cpu-3");
  EXPECT_EQ(c.device_count(), 3);
  EXPECT_DOUBLE_EQ(c.device_gpu(c.devices()[0]).fp32_flops_per_s, model::kDefaultCpuFlopsPerS);
  EXPECT_THROW(model::load_cluster("cpu-0"), InputError);
  EXPECT_THROW(model::load_cluster("cpu-100000"), InputError);
}

}  // namespace
