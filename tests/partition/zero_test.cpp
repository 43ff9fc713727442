// ZeRO over the data axis: the memory of each stage against the ZeRO paper's arithmetic,
// the collectives each stage adds (counted against the schedule), plans that validate under
// every schedule, and the layouts a stage cannot shard refused naming the option.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>
#include <string>

#include "model/error.hpp"
#include "model/zoo.hpp"
#include "partition/estimate.hpp"
#include "partition/memory.hpp"
#include "partition/plan_builder.hpp"
#include "partition/plan_io.hpp"
#include "partition/policy.hpp"
#include "partition/validate.hpp"
#include "tests/partition/plan_test_util.hpp"

using namespace hetflow;
using namespace hetflow::partition;
using hetflow::test_support::error_of;

namespace {

using test_support::plan_of;

PlanOptions zero(int stage, int data, int pipeline = 1, int tensor = 1) {
  PlanOptions o;
  o.zero_stage = stage;
  o.data = data;
  o.pipeline = pipeline;
  o.tensor = tensor;
  o.microbatches = 4;
  return o;
}

const model::Network& gpt() {
  static const model::Network net =
      model::network_from_spec("gpt:layers=4,hidden=256,heads=8,seq=128,vocab=1000", model::Precision::fp16);
  return net;
}

int count(const Plan& plan, int device, CollectiveKind kind) {
  int n = 0;
  for (const Task& t : plan.tasks) {
    n += t.device == device && t.kind == TaskKind::collective && t.purpose == Purpose::data_parallel &&
         plan.collective(t.collective).kind == kind;
  }
  return n;
}

}  // namespace

// Rajbhandari et al. 2020, section 5.1 and figure 1: Psi = 7.5 B parameters, Nd = 64,
// mixed-precision Adam (K = 12): 120 GB, 31.4 GB, 16.6 GB and 1.9 GB of model state per
// device for stages 0 to 3. A model of 4 M parameters on 64 devices gives the same bytes per
// parameter (its shards are whole: 4 M / 64 each), scaled here to 7.5 B.
TEST(Zero, ModelStateFollowsThePapersArithmetic) {
  const model::Cluster cluster = test_support::identical_cluster(8, 8);
  const model::Network net = test_support::equal_layers(4);
  double psi = 0;
  for (const model::Layer& l : net.layers) psi += l.params;
  const double paper_gb[] = {120, 31.4, 16.6, 1.9};
  for (int stage = 0; stage <= 3; ++stage) {
    const Plan plan = plan_of(cluster, net, zero(stage, 64));
    for (int d : {0, 37, 63}) {
      const DeviceMemory& m = plan.memory[static_cast<size_t>(d)];
      const double state = m.weights_bytes + m.gradients_bytes + m.optimizer_bytes;
      const double gb = state / psi * 7.5e9 / 1e9;
      EXPECT_NEAR(gb, paper_gb[stage], 0.05) << "stage " << stage << " device " << d;
    }
    // The closed form the policies size stages with agrees.
    const Sharded by = sharded_by(plan.layout);
    const double closed = psi * (2 / by.weights + 2 / by.gradients + 12 / by.optimizer);
    const DeviceMemory& m = plan.memory[0];
    EXPECT_NEAR(m.weights_bytes + m.gradients_bytes + m.optimizer_bytes, closed, 1e-9 * closed) << "stage " << stage;
  }
}

// What each stage adds per device and iteration, on 2 pipeline ranks x 2 replicas with 4
// micro-batches: stage 1, the all-reduce's buckets reduce-scattered and one all-gather after
// the optimizer; stage 2, a reduce-scatter per backward; stage 3, an all-gather per pass (8)
// and a reduce-scatter per backward (4), or once each per iteration without resharding.
TEST(Zero, EachStageAddsItsCollectives) {
  const model::Cluster cluster = test_support::identical_cluster(4);
  const Plan plain = plan_of(cluster, gpt(), zero(0, 2, 2));
  struct Case {
    int stage;
    bool reshard;
    int reduce_scatters, all_gathers;  // reduce-scatters -1: the all-reduce's buckets
  };
  for (const Case& c : {Case{1, true, -1, 1}, Case{2, true, 4, 1}, Case{3, true, 4, 8}, Case{3, false, 1, 1}}) {
    PlanOptions o = zero(c.stage, 2, 2);
    o.reshard_after_forward = c.reshard;
    const Plan plan = plan_of(cluster, gpt(), o);
    const Validation v = validate_plan(plan);
    EXPECT_TRUE(v.ok()) << "stage " << c.stage << ": " << (v.problems.empty() ? "" : v.problems.front());
    for (int d = 0; d < 4; ++d) {
      EXPECT_EQ(count(plan, d, CollectiveKind::all_reduce), 0) << "stage " << c.stage;
      const int buckets = count(plain, d, CollectiveKind::all_reduce);
      ASSERT_GT(buckets, 0);
      EXPECT_EQ(count(plan, d, CollectiveKind::reduce_scatter), c.reduce_scatters < 0 ? buckets : c.reduce_scatters)
          << "stage " << c.stage;
      EXPECT_EQ(count(plan, d, CollectiveKind::all_gather), c.all_gathers) << "stage " << c.stage;
    }
    // A reduce-scatter moves the gradients of the device's piece; an all-gather its parameters.
    for (const Collective& col : plan.collectives) {
      if (col.purpose != Purpose::data_parallel || col.kind == CollectiveKind::reduce_scatter) continue;
      const Task& t = plan.task(col.tasks.front());
      const double params = params_per_device(gpt(), t.layer_begin, t.layer_end, 1);
      EXPECT_NEAR(col.bytes, 2 * params, 1e-9 * col.bytes) << "stage " << c.stage;
    }
  }
}

// Under sequence parallelism each tensor rank has its rows' part of every norm gain's
// gradient; the ranks sum them (an all-reduce at the end of a backward) before the gradients
// leave: once a step where they leave once (stages 1 and 3 kept gathered), in every backward
// where ZeRO scatters each pass's (stage 2, and 3 resharded): 4 micro-batches, one chunk a
// device. (Under sequence parallelism a backward's own calls are gathers and scatters: every
// all-reduce inside one is the gains'; the vocabulary-parallel loss's are in the forward.)
TEST(Zero, TensorRanksSumTheirGainsBeforeEachScatter) {
  const model::Cluster cluster = test_support::identical_cluster(8);
  struct Case {
    int stage;
    bool reshard;
    int sums;  // per device and iteration
  };
  for (const Case& c : {Case{0, true, 1}, Case{1, true, 1}, Case{2, true, 4}, Case{3, true, 4}, Case{3, false, 1}}) {
    PlanOptions o = zero(c.stage, 2, 2, 2);
    o.reshard_after_forward = c.reshard;
    o.sequence_parallel = true;
    const Plan plan = plan_of(cluster, gpt(), o);
    ASSERT_TRUE(validate_plan(plan).ok()) << "stage " << c.stage;
    std::vector<int> sums(8, 0);
    for (const Collective& col : plan.collectives) {
      if (!col.in_task() || col.kind != CollectiveKind::all_reduce) continue;
      if (plan.task(col.tasks.front()).kind != TaskKind::backward) continue;
      EXPECT_EQ(col.at, std::vector<double>{1}) << "stage " << c.stage;
      for (const int t : col.tasks) ++sums[static_cast<size_t>(plan.task(t).device)];
    }
    EXPECT_EQ(sums, std::vector<int>(8, c.sums)) << "stage " << c.stage << (c.reshard ? "" : " kept gathered");
  }
}

// The optimizer steps its replica's shard alone, and the persistent terms shrink by the data
// degree where the stage shards them; stage 3's gathered copies appear in the peak.
TEST(Zero, ShardsShrinkTheOptimizerAndTheStateItShards) {
  const model::Cluster cluster = test_support::identical_cluster(4);
  const Plan plain = plan_of(cluster, gpt(), zero(0, 4));
  const Plan third = plan_of(cluster, gpt(), zero(3, 4));
  double plain_flops = 0, third_flops = 0;
  for (const Task& t : plain.tasks) plain_flops += t.kind == TaskKind::optimizer ? t.flops : 0;
  for (const Task& t : third.tasks) third_flops += t.kind == TaskKind::optimizer ? t.flops : 0;
  EXPECT_NEAR(third_flops, plain_flops / 4, 12 * 4);  // to a parameter per replica
  const DeviceMemory &a = plain.memory[0], &b = third.memory[0];
  EXPECT_NEAR(b.weights_bytes, a.weights_bytes / 4, 2 * 4);
  EXPECT_NEAR(b.gradients_bytes, a.gradients_bytes / 4, 2 * 4);
  EXPECT_NEAR(b.optimizer_bytes, a.optimizer_bytes / 4, 12 * 4);
  EXPECT_EQ(a.gathered_bytes, 0);
  // At the peak: a layer's parameters whole (FSDP's unit) and its neighbour's, prefetched or
  // being reduce-scattered: between one unit and the closed form's two of each.
  double largest = 0;
  for (int l = 0; l < static_cast<int>(gpt().layers.size()); ++l) largest = std::max(largest, layer_params_per_device(gpt(), l, 0, 1));
  EXPECT_GE(b.gathered_bytes, 2 * largest);
  EXPECT_LE(b.gathered_bytes, gathered_bytes(third.layout, {params_per_device(gpt(), 0, 4, 1)}, largest) + 1);
  EXPECT_EQ(gathered_bytes(third.layout, {params_per_device(gpt(), 0, 4, 1)}, largest), 2 * largest * 4);
}

// Every schedule, with tensor parallelism and interleaving: plans validate (no deadlock: the
// replicas meet their collectives in the same order) and the estimate runs.
TEST(Zero, PlansValidateUnderEverySchedule) {
  const model::Cluster cluster = test_support::identical_cluster(8);
  for (const std::string schedule : {"gpipe", "1f1b", "1f1b-split-w", "interleaved"}) {
    for (int stage = 1; stage <= 3; ++stage) {
      for (const bool reshard : {true, false}) {
        if (stage < 3 && !reshard) continue;
        PlanOptions o = zero(stage, 2, 2, 2);
        o.schedule = schedule;
        o.virtual_stages = schedule == "interleaved" ? 2 : 1;
        o.reshard_after_forward = reshard;
        const Plan plan = plan_of(cluster, gpt(), o);
        const Validation v = validate_plan(plan);
        ASSERT_TRUE(v.ok()) << schedule << " stage " << stage << " reshard " << reshard << ": " << v.problems.front();
        const CostModel cost(cluster, gpt().precision);
        EXPECT_GT(estimate_plan(plan, cost).iteration_time_s, 0);
      }
    }
  }
}

TEST(Zero, AShardedPlanRoundTripsThroughItsFile) {
  const model::Cluster cluster = test_support::identical_cluster(4);
  PlanOptions o = zero(3, 2, 2);
  o.reshard_after_forward = false;
  const Plan plan = plan_of(cluster, gpt(), o);
  const Plan back = read_plan_json(write_plan_json(plan), "zero.json");
  EXPECT_TRUE(same_plan(plan, back));
  EXPECT_EQ(back.layout.sync.zero.stage, 3);
  EXPECT_FALSE(back.layout.sync.zero.reshard_after_forward);
  EXPECT_GT(back.memory[0].gathered_bytes, 0);
  EXPECT_EQ(plan_fingerprint(back), plan_fingerprint(plan));
}

TEST(Zero, WhatCannotBeShardedIsRefusedNamingTheOption) {
  const model::Cluster cluster = test_support::identical_cluster(4);
  EXPECT_EQ(error_of([&] { plan_of(cluster, gpt(), zero(4, 2)); }), "zero_stage: expected 0, 1, 2 or 3, found 4");
  PlanOptions ps = zero(1, 2);
  ps.sync = SyncKind::ps;
  EXPECT_EQ(error_of([&] { plan_of(cluster, gpt(), ps); }),
            "zero_stage: shards data-parallel state under `sync` allreduce only");
  PlanOptions keep = zero(2, 2);
  keep.reshard_after_forward = false;
  EXPECT_EQ(error_of([&] { plan_of(cluster, gpt(), keep); }), "reshard_after_forward: applies to `zero_stage` 3 only");
  // Replicas cut differently cannot shard a chunk element by element.
  const CostModel cost(cluster, gpt().precision);
  PlanOptions o = zero(1, 2, 2);
  o.precision = gpt().precision;
  Layout layout = make_layout(cluster, gpt(), o, cost);
  layout.workers[1].stages[0].layer_end += 1;
  layout.workers[1].stages[1].layer_begin += 1;
  EXPECT_EQ(error_of([&] { build_plan(cluster, gpt(), layout, cost); }).substr(0, 76),
            "zero_stage: shards each chunk over its replicas, but virtual worker 1 cuts t");
}

// --zero-shares memory: on 2 V100-16 and 2 V100-32 each replica keeps its device's memory
// over the replicas' (1/6, 1/6, 1/3, 1/3), its reduce-scatters and all-gathers carry those
// parts, the optimizer state follows them (a 32 GB device holds twice a 16 GB one's), and
// the plan says so through its file. On devices of one memory size the shares are equal.
TEST(Zero, SharesByMemoryFollowTheDevicesMemory) {
  const model::Cluster mixed = model::parse_cluster(
      "name: mixed-memory\nnodes:\n"
      "  - {name: small, gpu: V100-16, gpus: 2, intra: {kind: nvlink, bandwidth: 150 GB/s, latency: 2 us}, nic: {count: 1, bandwidth: 100 Gb/s}}\n"
      "  - {name: large, gpu: V100-32, gpus: 2, intra: {kind: nvlink, bandwidth: 150 GB/s, latency: 2 us}, nic: {count: 1, bandwidth: 100 Gb/s}}\n",
      "mixed-memory.yaml");
  const std::vector<double> want{1.0 / 6, 1.0 / 6, 1.0 / 3, 1.0 / 3};
  for (int stage = 1; stage <= 3; ++stage) {
    PlanOptions o = zero(stage, 4);
    o.zero_shares = ZeroShares::memory;
    const Plan plan = plan_of(mixed, gpt(), o);
    ASSERT_TRUE(validate_plan(plan).ok()) << "stage " << stage << ": " << validate_plan(plan).problems.front();
    int sharded = 0;
    for (const Collective& c : plan.collectives) {
      if (c.purpose != Purpose::data_parallel) continue;
      ASSERT_EQ(plan.members(c), (std::vector<int>{0, 1, 2, 3})) << "stage " << stage;
      ASSERT_EQ(c.parts.size(), 4u) << "stage " << stage;
      for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(c.parts[i], want[i], 1e-15) << "stage " << stage;
      ++sharded;
    }
    EXPECT_GT(sharded, 0);
    const double small = plan.memory[0].optimizer_bytes, large = plan.memory[2].optimizer_bytes;
    EXPECT_NEAR(large, 2 * small, 12 * 2) << "stage " << stage;  // to a parameter's state
    EXPECT_NEAR(plan.memory[0].optimizer_bytes + plan.memory[1].optimizer_bytes + 2 * large,
                plan_of(mixed, gpt(), zero(stage, 4)).memory[0].optimizer_bytes * 4, 12 * 4)
        << "stage " << stage << ": the shards add up to the state equal shares hold";
    const CostModel cost(mixed, gpt().precision);
    EXPECT_GT(estimate_plan(plan, cost).iteration_time_s, 0);
    const Plan back = read_plan_json(write_plan_json(plan), "zero.json");
    EXPECT_TRUE(same_plan(plan, back));
    EXPECT_EQ(back.layout.sync.zero.shares, ZeroShares::memory);
    EXPECT_EQ(plan_fingerprint(back), plan_fingerprint(plan));
  }
  // Equal shares carry no parts; memory shares on one memory size neither.
  for (const Collective& c : plan_of(mixed, gpt(), zero(1, 4)).collectives) EXPECT_TRUE(c.parts.empty());
  PlanOptions same = zero(2, 4);
  same.zero_shares = ZeroShares::memory;
  for (const Collective& c : plan_of(test_support::identical_cluster(4), gpt(), same).collectives) EXPECT_TRUE(c.parts.empty());
  // Refused: without ZeRO, and where the reduce-scatters are not rings.
  PlanOptions none = zero(0, 4);
  none.zero_shares = ZeroShares::memory;
  EXPECT_EQ(error_of([&] { plan_of(mixed, gpt(), none); }), "zero_shares: divides ZeRO's shards: give `zero_stage` 1, 2 or 3");
  PlanOptions hierarchical = zero(1, 4);
  hierarchical.zero_shares = ZeroShares::memory;
  hierarchical.allreduce = CollectiveAlgorithm::hierarchical;
  EXPECT_NE(error_of([&] { plan_of(mixed, gpt(), hierarchical); }).find("zero_shares: divides shards unevenly"), std::string::npos);
}

// An uneven ring reduce-scatter's estimate: each of its n - 1 steps lasts as its slowest
// member's part over its link (every step moves every part once). Two members on one link:
// one step of the larger part.
TEST(Zero, AnUnevenRingTakesItsLargestPartEachStep) {
  const model::Cluster cluster = test_support::identical_cluster(2);
  const CostModel cost(cluster, model::Precision::fp16);
  CollectiveSpec even{CollectiveKind::reduce_scatter, CollectiveAlgorithm::ring, {0, 1}, 1e9};
  CollectiveSpec uneven = even;
  uneven.parts = {0.25, 0.75};
  // even: one step of S/2; uneven: one step of 3S/4 (the member sending part 1's three quarters).
  const double latency_s = cost.transfer_time_s(0, 1, 1) - 1 / (300e9);
  EXPECT_NEAR(cost.collective_time_s(even), latency_s + 0.5e9 / 300e9, 1e-9);
  EXPECT_NEAR(cost.collective_time_s(uneven), latency_s + 0.75e9 / 300e9, 1e-9);
}
