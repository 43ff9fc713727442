// Plans against closed forms: bubble fractions, schedule orders and in-flight counts as the
// plan builder lays them out, memory terms, and the plan file's round trip.
#include <gtest/gtest.h>

#include "model/zoo.hpp"
#include "partition/estimate.hpp"
#include "partition/plan_builder.hpp"
#include "partition/plan_io.hpp"
#include "partition/policy.hpp"
#include "partition/schedule.hpp"
#include "partition/validate.hpp"
#include "tests/partition/plan_test_util.hpp"

using namespace hetflow;
using namespace hetflow::partition;

namespace {

struct Built {
  model::Cluster cluster;
  model::Network network;
  Plan plan;
};

Built build(const model::Cluster& cluster, const model::Network& net, PlanOptions o, bool free_comm = false,
            model::Calibration calibration = {}) {
  o.precision = net.precision;
  CostModel cost(cluster, net.precision, calibration);
  cost.set_free_communication(free_comm);
  const Layout layout = make_layout(cluster, net, o, cost);
  return Built{cluster, net, build_plan(cluster, net, layout, cost)};
}

// The analytic bubble of an equal-stage pipeline (16 equal layers, 8 identical GPUs, one
// virtual worker, free communication).
double equal_stage_bubble(const char* schedule, int p, int m, int v = 1, model::InputPath input = {}) {
  PlanOptions o;
  o.schedule = schedule;
  o.pipeline = p;
  o.virtual_stages = v;
  o.data = 1;
  o.microbatches = m;
  o.workspace_bytes = 0;
  model::Cluster cluster = test_support::identical_cluster(8);
  cluster.input = input;
  const Built b = build(cluster, test_support::equal_layers(16), o, true);
  const Validation valid = validate_plan(b.plan);
  EXPECT_TRUE(valid.ok()) << (valid.ok() ? "" : valid.problems.front());
  CostModel cost(b.cluster, b.network.precision);
  cost.set_free_communication(true);
  return estimate_plan(b.plan, cost).bubble_fraction;
}

// Compute ops of one device in program order, as schedule ops.
std::vector<ScheduledOp> compute_order(const Plan& plan, int device) {
  std::vector<ScheduledOp> ops;
  const auto& vw = plan.layout.workers.front();
  const int p = static_cast<int>(vw.ranks.size());
  for (int id : plan.program(device, 0)) {
    const Task& t = plan.tasks[static_cast<size_t>(id)];
    if (t.kind == TaskKind::forward) ops.push_back({OpKind::F, t.microbatch, t.stage / p});
    if (t.kind == TaskKind::backward) ops.push_back({OpKind::B, t.microbatch, t.stage / p});
    if (t.kind == TaskKind::backward_weight) ops.push_back({OpKind::W, t.microbatch, t.stage / p});
  }
  return ops;
}

}  // namespace

TEST(PlanBubble, GpipeAnd1f1bMatchClosedForm) {
  for (const char* schedule : {"gpipe", "1f1b"}) {
    for (int p : {1, 2, 4, 8}) {
      for (int m : {1, 3, 8, 16}) {
        EXPECT_NEAR(equal_stage_bubble(schedule, p, m), (p - 1.0) / (m + p - 1.0), 1e-9)
            << schedule << " p=" << p << " m=" << m;
      }
    }
  }
}

// Load tasks on a loader that keeps up leave the pipeline's bubble where it was: the first
// stage's forwards wait for nothing but the stage's own work (the very first load, before
// the span, is outside the bubble).
TEST(PlanBubble, ALoaderThatKeepsUpLeavesTheClosedForm) {
  model::InputPath fast;
  fast.given = true;
  fast.preprocess_s_per_sample = 1e-9;  // a nanosecond a sample: far below any stage's compute
  for (const char* schedule : {"gpipe", "1f1b"}) {
    for (const auto& [p, m] : {std::pair{2, 4}, std::pair{4, 8}, std::pair{8, 3}}) {
      EXPECT_NEAR(equal_stage_bubble(schedule, p, m, 1, fast), (p - 1.0) / (m + p - 1.0), 1e-6)
          << schedule << " p=" << p << " m=" << m;
    }
  }
}

TEST(PlanBubble, InterleavedMatchesClosedForm) {
  for (int p : {2, 4}) {
    for (int v : {2, 4}) {
      for (int m : {p, 2 * p, 4 * p}) {
        EXPECT_NEAR(equal_stage_bubble("interleaved", p, m, v), (p - 1.0) / (v * m + p - 1.0), 1e-9)
            << "p=" << p << " v=" << v << " m=" << m;
      }
    }
  }
}

TEST(PlanBubble, BfsMatchesClosedForm) {
  // Chunks start max(m, p) chunk-times apart on rank 0 (tests/partition/schedule_test.cpp's
  // BfsMakespanClosedForm), in both directions: makespan ((v-1) max(m, p) + m + p - 1)(T_F + T_B)
  // against m v (T_F + T_B) of work per rank. Any m, not only multiples of p.
  for (const auto& [p, v] : {std::pair{2, 1}, std::pair{2, 2}, std::pair{2, 4}, std::pair{4, 1}, std::pair{4, 2}}) {
    for (int m : {1, 3, p, 2 * p + 1}) {  // 16 layers in p v equal chunks
      const double span = (v - 1.0) * std::max(m, p) + m + p - 1.0;
      EXPECT_NEAR(equal_stage_bubble("bfs", p, m, v), 1.0 - m * v / span, 1e-9) << "p=" << p << " v=" << v << " m=" << m;
    }
  }
}

TEST(PlanBubble, SplitBackwardShrinksTheBubble) {
  // F = B = W (backward of 2 units split in two halves): bubble (p-1)(T_F+T_B) over
  // m(T_F+T_B+T_W) + (p-1)(T_F+T_B), i.e. 2(p-1) / (3m + 2(p-1)).
  PlanOptions o;
  o.schedule = "1f1b-split-w";
  o.pipeline = 4;
  o.data = 1;
  o.microbatches = 8;
  o.workspace_bytes = 0;
  model::Calibration no_overhead;
  no_overhead.default_gpu.overhead_s = 0;
  const Built b = build(test_support::identical_cluster(8), test_support::equal_layers(16), o, true);
  CostModel cost(b.cluster, b.network.precision, no_overhead);
  cost.set_free_communication(true);
  const Estimate e = estimate_plan(b.plan, cost);
  EXPECT_NEAR(e.bubble_fraction, 2.0 * 3 / (3.0 * 8 + 2.0 * 3), 1e-9);
}

TEST(PlanOrder, DevicesRunTheScheduleOrder) {
  for (const char* name : {"gpipe", "1f1b", "1f1b-split-w", "interleaved", "bfs"}) {
    PlanOptions o;
    o.schedule = name;
    o.pipeline = 4;
    o.data = 1;
    o.microbatches = 8;
    o.virtual_stages = schedule_by_name(name).interleaved ? 2 : 1;
    const Built b = build(test_support::identical_cluster(8), test_support::equal_layers(16), o);
    const RankPrograms expected = schedule_by_name(name).build(4, 8, o.virtual_stages);
    for (int r = 0; r < 4; ++r) {
      const int device = b.plan.layout.workers[0].ranks[static_cast<size_t>(r)][0];
      EXPECT_EQ(compute_order(b.plan, device), expected[static_cast<size_t>(r)]) << name << " rank " << r;
    }
  }
}

TEST(PlanMemory, InFlightMicrobatchesPerStage) {
  const int p = 4, m = 8;
  for (const char* name : {"gpipe", "1f1b"}) {
    PlanOptions o;
    o.schedule = name;
    o.pipeline = p;
    o.data = 1;
    o.microbatches = m;
    const Built b = build(test_support::identical_cluster(8), test_support::equal_layers(16), o);
    for (int r = 0; r < p; ++r) {
      const int device = b.plan.layout.workers[0].ranks[static_cast<size_t>(r)][0];
      const int expected = std::string(name) == "gpipe" ? m : p - r;
      EXPECT_EQ(b.plan.memory[static_cast<size_t>(device)].peak_in_flight, expected) << name << " rank " << r;
      // Activations are exactly in-flight x the stage's stash per micro-batch (4 layers x 10 MB).
      EXPECT_DOUBLE_EQ(b.plan.memory[static_cast<size_t>(device)].activations_bytes, expected * 4 * 1e7);
    }
  }
}

TEST(PlanMemory, MixedPrecisionAdamIs16BytesPerParameter) {
  const model::Network net = test_support::equal_layers(4);
  Layout layout;
  layout.precision = model::Precision::fp16;
  layout.workspace_bytes = 0;
  const std::vector<Stage> all{{0, 4, 0}};
  const DeviceMemory m = device_memory(net, layout, all, {0}, true, 80e9);
  EXPECT_DOUBLE_EQ(m.total_bytes(), 16 * 4e6);
  EXPECT_DOUBLE_EQ(m.weights_bytes, 2 * 4e6);
  EXPECT_DOUBLE_EQ(m.optimizer_bytes, 12 * 4e6);  // fp32 master copy + two Adam moments
  layout.fp32_grad_accumulation = true;           // Megatron's fp32 main_grad: +2 B/param over fp16 grads
  EXPECT_DOUBLE_EQ(device_memory(net, layout, all, {0}, true, 80e9).total_bytes(), 18 * 4e6);
  layout.precision = model::Precision::fp32;      // fp32 Adam: weights, grads, two moments
  EXPECT_DOUBLE_EQ(device_memory(net, layout, all, {0}, true, 80e9).total_bytes(), 16 * 4e6);
  // Under a parameter server the optimizer state lives on the servers.
  EXPECT_DOUBLE_EQ(device_memory(net, layout, all, {0}, false, 80e9).optimizer_bytes, 0);
}

TEST(PlanMemory, TransformerActivationsMatchKorthikanti) {
  // Korthikanti et al. (2022), table 2, bytes per layer for micro-batch b, 16-bit activations.
  const model::Network net = model::network_from_spec("gpt3-175b", model::Precision::fp16);
  const model::Layer& layer = net.layers.at(1);
  const double s = 2048, h = 12288, a = 96, b = 2;
  Layout l;
  l.micro_batch_size = 2;
  auto bytes = [&](Recompute r, int t, bool sp) {
    l.recompute = r;
    l.set_size(Axis::tensor, t);
    l.sequence_parallel = sp;
    return stashed_bytes_per_microbatch(layer, net, l);
  };
  EXPECT_DOUBLE_EQ(bytes(Recompute::none, 1, false), s * b * h * (34 + 5 * a * s / h));
  EXPECT_DOUBLE_EQ(bytes(Recompute::none, 8, false), s * b * h * (10 + 24.0 / 8 + 5 * a * s / (h * 8)));
  EXPECT_DOUBLE_EQ(bytes(Recompute::none, 8, true), s * b * h / 8 * (34 + 5 * a * s / h));
  EXPECT_DOUBLE_EQ(bytes(Recompute::selective, 1, false), 34 * s * b * h);
  EXPECT_DOUBLE_EQ(bytes(Recompute::selective, 8, false), s * b * h * (10 + 24.0 / 8));
  EXPECT_DOUBLE_EQ(bytes(Recompute::selective, 8, true), 34 * s * b * h / 8);
  EXPECT_DOUBLE_EQ(bytes(Recompute::full, 1, false), 2 * s * b * h);
  EXPECT_DOUBLE_EQ(bytes(Recompute::full, 8, true), 2 * s * b * h / 8);
}

// A mixture of experts: the copies each tensor-parallel rank's experts read and the outputs
// the combine weighs (tokens x top-k x hidden each) are whole on every rank, sequence
// parallel or not; the rest of the layer's stash splits as a dense layer's.
TEST(PlanMemory, AMixturesRoutedCopiesAreWholeOnEveryTensorRank) {
  const model::Network moe = model::network_from_spec("mixtral-8x7b", model::Precision::bf16);
  const model::Network dense = model::network_from_spec(
      "llama:layers=32,hidden=4096,heads=32,kv_heads=8,ffn=14336,vocab=32000,seq=4096", model::Precision::bf16);
  const model::Layer& layer = moe.layers.at(1);
  const double s = 4096, h = 4096, k = 2, e = 2;
  ASSERT_EQ(layer.experts, 8);
  EXPECT_DOUBLE_EQ(layer.tp_whole_bytes, 2 * e * s * k * h);
  Layout l;
  auto bytes = [&](const model::Network& net, Recompute r, int t, bool sp) {
    l.recompute = r;
    l.set_size(Axis::tensor, t);
    l.sequence_parallel = sp;
    return stashed_bytes_per_microbatch(net.layers.at(1), net, l);
  };
  const double whole = layer.tp_whole_bytes, kept = layer.stashed_bytes;
  EXPECT_DOUBLE_EQ(bytes(moe, Recompute::none, 1, false), kept);
  EXPECT_DOUBLE_EQ(bytes(moe, Recompute::none, 4, true), whole + (kept - whole) / 4);
  EXPECT_DOUBLE_EQ(bytes(moe, Recompute::none, 4, false),
                   whole + layer.tp_replicated_bytes + (kept - whole - layer.tp_replicated_bytes) / 4);
  // Full recomputation keeps the layer's input alone, split by sequence parallelism.
  EXPECT_DOUBLE_EQ(bytes(moe, Recompute::full, 4, true), bytes(dense, Recompute::full, 4, true));
  EXPECT_EQ(dense.layers.at(1).tp_whole_bytes, 0);
}

TEST(PlanFile, EveryPolicyRoundTripsLosslessly) {
  const model::Cluster hetpipe = model::builtin_cluster("hetpipe-testbed");
  const model::Network vgg = model::network_from_spec("vgg19", model::Precision::fp16);
  for (const PolicyInfo& policy : policies()) {
    PlanOptions o;
    o.policy = policy.name;
    o.iterations = 2;
    if (policy.name == "uniform" || policy.name == "balanced") o.pipeline = 4;
    // Workers of unequal size, the other TITAN V and the RTX 2060 idle.
    if (policy.name == "grouped") o.groups = "*x2 TITAN-RTX, 1x(1 TITAN-V + 1 Quadro-P4000)";
    const Built b = build(hetpipe, vgg, o);
    const std::string json = write_plan_json(b.plan);
    const Plan back = read_plan_json(json, "plan.json");
    EXPECT_TRUE(same_plan(back, b.plan)) << policy.name;
    EXPECT_EQ(write_plan_json(back), json) << policy.name;
  }
}

// Regression (the plan mutation test's seed, under AddressSanitizer): a tensor-parallel
// collective was given one of the plan's tasks by reference as its model, and adding its
// participants reallocated the task table under it (heap-use-after-free).
TEST(PlanBuilder, TensorParallelCollectivesOutliveTheTaskTableGrowing) {
  PlanOptions o;
  o.tensor = 2;
  o.sequence_parallel = true;
  o.pipeline = 2;
  o.data = 1;
  o.microbatches = 2;
  const model::Network net = model::network_from_spec("gpt:layers=4,hidden=256,heads=4,seq=128", model::Precision::bf16);
  const Built b = build(test_support::identical_cluster(4), net, o);
  EXPECT_TRUE(validate_plan(b.plan).ok());
  for (const Collective& c : b.plan.collectives) {
    for (int t : c.tasks) EXPECT_EQ(b.plan.tasks[static_cast<size_t>(t)].stage, b.plan.tasks[static_cast<size_t>(c.tasks[0])].stage);
  }
}

TEST(PlanFile, TensorParallelInterleavedPlanRoundTrips) {
  PlanOptions o;
  o.tensor = 2;
  o.sequence_parallel = true;
  o.pipeline = 2;
  o.virtual_stages = 2;
  o.schedule = "interleaved";
  o.microbatches = 4;
  o.recompute = Recompute::selective;
  const model::Network net = model::network_from_spec("gpt:layers=8,hidden=1024,heads=16,seq=1024", model::Precision::bf16);
  const Built b = build(test_support::identical_cluster(8, 2), net, o);
  EXPECT_TRUE(validate_plan(b.plan).ok());
  EXPECT_TRUE(same_plan(read_plan_json(write_plan_json(b.plan), "p.json"), b.plan));
}
