// estimate_layout against its oracle, estimate_plan of the built plan, over the search's own
// space: iteration times agree to rounding, the bubble closely, and memory is a close lower
// bound of the plan's lifetime peak.
#include "partition/layout_estimate.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "model/error.hpp"
#include "model/io.hpp"
#include "model/zoo.hpp"
#include "partition/estimate.hpp"
#include "partition/plan_builder.hpp"
#include "partition/search.hpp"
#include "tests/partition/plan_test_util.hpp"

using namespace hetflow;

namespace {

model::Cluster mixed_cluster() {
  return model::parse_cluster("name: mixed\nnodes:\n"
                              "  - {name: v100, count: 2, gpu: V100-16, gpus: 4, intra: {kind: nvlink, bandwidth: 150 GB/s}, "
                              "nic: {count: 1, bandwidth: 25 Gb/s}}\n"
                              "  - {name: t4, count: 1, gpu: T4, gpus: 4, intra: {kind: pcie, bandwidth: 16 GB/s}, "
                              "nic: {count: 1, bandwidth: 25 Gb/s}}\n",
                              "mixed.yaml");
}

struct Agreement {
  std::vector<double> time_error;    // |layout - plan| / plan
  std::vector<double> memory_error;  // (layout's headroom - plan's) / capacity
  int compared = 0;
};

// One layout's estimate against its plan's, into `a` (nothing when it cannot be planned); its
// memory within `close` of capacity below the plan's.
void compare_one(const model::Cluster& cluster, const model::Network& net, const partition::PlanOptions& o,
                 const partition::CostModel& cost, Agreement& a, double close = 0.02) {
  {
    partition::Layout layout;
    partition::Plan plan;
    try {
      layout = partition::make_layout(cluster, net, o, cost);
      plan = partition::build_plan(cluster, net, layout, cost);
    } catch (const Error&) {
      return;
    }
    const partition::Estimate full = partition::estimate_plan(plan, cost);
    // Alone on its routes, as estimate_plan times every transfer and collective.
    const partition::LayoutEstimate quick = partition::estimate_layout(net, layout, cost, {.shared_links = false});
    const double err = std::abs(quick.iteration_time_s - full.iteration_time_s) / full.iteration_time_s;
    double headroom = std::numeric_limits<double>::infinity(), capacity = 0;
    for (const partition::DeviceMemory& m : plan.memory) {
      if (m.capacity_bytes > 0 && m.total_bytes() > m.workspace_bytes) headroom = std::min(headroom, m.capacity_bytes - m.total_bytes());
      capacity = std::max(capacity, m.capacity_bytes);
    }
    a.memory_error.push_back((quick.headroom_bytes - headroom) / capacity);
    a.time_error.push_back(err);
    const std::string what = partition::candidate_summary(o, static_cast<int>(layout.workers.size()));
    EXPECT_LT(err, 1e-6) << what << ": " << quick.iteration_time_s << " s, the plan's " << full.iteration_time_s << " s";
    // Memory: a lower bound of the plan's peak (never more used), and a close one.
    EXPECT_GE(a.memory_error.back(), -1e-9) << what;
    EXPECT_LT(a.memory_error.back(), close) << what;
    const double bubble = std::abs(quick.bubble_fraction - full.bubble_fraction);
    EXPECT_LT(bubble, 0.02) << what << ": bubble " << quick.bubble_fraction << ", the plan's " << full.bubble_fraction;
    ++a.compared;
  }
}

Agreement compare(const model::Cluster& cluster, const model::Network& net, int global_batch,
                  const partition::SearchSpace& space, const partition::PlanOptions& base,
                  const partition::CostModel& cost, double close = 0.02) {
  Agreement a;
  for (const partition::PlanOptions& o : partition::search_candidates(cluster, net, global_batch, space, base, cost)) {
    compare_one(cluster, net, o, cost, a, close);
  }
  std::sort(a.time_error.begin(), a.time_error.end());
  std::sort(a.memory_error.begin(), a.memory_error.end());
  return a;
}

}  // namespace

TEST(LayoutEstimate, AgreesWithThePlansEstimateOverTheSearchSpace) {
  const model::Cluster cluster = mixed_cluster();
  const model::Network net = model::network_from_spec("gpt:layers=8,hidden=512,heads=8,seq=512,vocab=8192", model::Precision::fp16);
  partition::SearchSpace space;
  space.micro_batches = {1, 4};
  partition::PlanOptions base;
  base.precision = net.precision;
  const partition::CostModel cost(cluster, net.precision);
  const Agreement a = compare(cluster, net, 16, space, base, cost);
  ASSERT_GT(a.compared, 250);
  std::printf("%d layouts: iteration time off by at most %.2g; headroom above the plan's by %.4f to %.4f of capacity\n",
              a.compared, a.time_error.back(), a.memory_error.front(), a.memory_error.back());
}

namespace {

// A small GPT over every schedule, three policies (grouped's unequal workers among them) and
// two micro-batch sizes, all-reduce only: where ZeRO and offload act.
const model::Network& small_gpt() {
  static const model::Network net =
      model::network_from_spec("gpt:layers=8,hidden=512,heads=8,seq=512,vocab=8192", model::Precision::fp16);
  return net;
}
partition::SearchSpace every_schedule() {
  partition::SearchSpace space;
  space.policies = {"uniform", "balanced", "grouped"};
  space.micro_batches = {1, 4};
  space.schedules = {"1f1b", "gpipe", "interleaved", "1f1b-split-w"};
  space.syncs = {partition::SyncKind::allreduce};
  return space;
}

// Two nodes of 4 A100-40 and a wide GPT in bf16, over pipelines of split backward,
// interleaving and GPipe under all-reduce and WSP: where sequence parallelism's gathers and
// WSP's pulls meet the pipelines.
struct WideCase {
  model::Cluster cluster = test_support::identical_cluster(4, 2, "A100-40");
  model::Network net = model::network_from_spec("gpt:layers=8,hidden=1024,heads=16,seq=1024,vocab=8192", model::Precision::bf16);
  partition::SearchSpace space;
  WideCase() {
    space.policies = {"uniform", "hetpipe-hd"};
    space.micro_batches = {2};
    space.schedules = {"1f1b-split-w", "interleaved", "gpipe"};
    space.syncs = {partition::SyncKind::allreduce, partition::SyncKind::wsp};
  }
};

}  // namespace

TEST(LayoutEstimate, AgreesUnderOperationCostsFlashAttentionSequenceParallelismSplitBackwardAndWsp) {
  const WideCase w;
  const model::Cluster& cluster = w.cluster;
  const model::Network& net = w.net;
  const partition::SearchSpace& space = w.space;
  partition::PlanOptions base;
  base.precision = net.precision;
  base.sequence_parallel = true;
  base.fp32_grad_accumulation = true;
  base.kernels.flash_attention = true;  // its operations and its smaller stash
  base.kernels.fused_bias_gelu = false;
  base.kernels.fused_adam = false;  // the optimizer's unfused bytes, on servers too
  const partition::CostModel cost(cluster, net.precision, model::load_calibration("published:a100"));
  const Agreement a = compare(cluster, net, 32, space, base, cost);
  ASSERT_GT(a.compared, 50);
  std::printf("%d layouts: iteration time off by at most %.2g; headroom above the plan's by %.4f to %.4f of capacity\n",
              a.compared, a.time_error.back(), a.memory_error.front(), a.memory_error.back());
}

// ZeRO under sequence parallelism: the tensor ranks sum their norm gains' gradients in every
// backward where ZeRO scatters each pass's gradients (stages 2 and 3 resharded), once a step
// where it scatters a chunk's once (3 kept gathered), as the plan does.
TEST(LayoutEstimate, AgreesUnderZeroWithSequenceParallelism) {
  WideCase w;
  w.space.syncs = {partition::SyncKind::allreduce};
  const partition::CostModel cost(w.cluster, w.net.precision);
  for (const auto& [stage, reshard] : {std::pair{2, true}, std::pair{3, true}, std::pair{3, false}}) {
    partition::PlanOptions base;
    base.precision = w.net.precision;
    base.sequence_parallel = true;
    base.zero_stage = stage;
    base.reshard_after_forward = reshard;
    base.bucket_bytes = 1 << 20;
    const Agreement a = compare(w.cluster, w.net, 32, w.space, base, cost);
    EXPECT_GT(a.compared, 10) << "stage " << stage;
    std::printf("stage %d%s, %d layouts: iteration time off by at most %.2g\n", stage, reshard ? "" : " kept gathered",
                a.compared, a.time_error.empty() ? 0.0 : a.time_error.back());
  }
}

// Chunks of the embedding alone and of the LM head alone under tensor parallelism: the head's
// forward has no collective and its backward one (f), the embedding's the reverse; with and
// without sequence parallelism and full recomputation, on 1F1B and GPipe.
TEST(LayoutEstimate, AgreesOnChunksOfTheModelsEnds) {
  const model::Cluster cluster = test_support::identical_cluster(4, 2, "A100-40");
  const model::Network net = model::network_from_spec("gpt:layers=6,hidden=1024,heads=16,seq=1024,vocab=8192", model::Precision::bf16);
  const partition::CostModel cost(cluster, net.precision, model::load_calibration("published:a100"));
  Agreement a;
  for (const std::vector<int>& cut : {std::vector<int>{1, 3, 3, 1}, std::vector<int>{2, 2, 3, 1}, std::vector<int>{1, 3, 2, 2}}) {
    for (const bool sequence : {false, true}) {
      for (const partition::Recompute recompute : {partition::Recompute::none, partition::Recompute::full}) {
        for (const char* schedule : {"1f1b", "gpipe"}) {
          partition::PlanOptions o;
          o.precision = net.precision;
          o.tensor = 2;
          o.pipeline = 4;
          o.data = 1;
          o.stage_layers = cut;
          o.microbatches = 4;
          o.micro_batch = 2;
          o.sequence_parallel = sequence;
          o.recompute = recompute;
          o.schedule = schedule;
          const int before = a.compared;
          compare_one(cluster, net, o, cost, a);
          EXPECT_EQ(a.compared, before + 1) << "not planned: " << partition::candidate_summary(o, 1);
        }
      }
    }
  }
}

// Several iterations: each stream carries on from where the last iteration left it, and under
// WSP a chunk's first forward waits for its pull D + 1 iterations back, as the plan's order
// edges say; the steady state is the plan's (end of the last iteration - end of the first) /
// (iterations - 1). Workers of unequal speed (grouped, HetPipe) are where D acts.
TEST(LayoutEstimate, AgreesOverSeveralIterationsWithWspStaleness) {
  const model::Cluster cluster = mixed_cluster();
  const model::Network net = model::network_from_spec("gpt:layers=8,hidden=512,heads=8,seq=512,vocab=8192", model::Precision::fp16);
  partition::SearchSpace space;
  space.policies = {"balanced", "hetpipe-np", "hetpipe-hd", "grouped"};
  space.micro_batches = {2};
  space.recomputes = {partition::Recompute::none};
  space.syncs = {partition::SyncKind::allreduce, partition::SyncKind::ps, partition::SyncKind::wsp};
  partition::PlanOptions base;
  base.precision = net.precision;
  base.iterations = 3;
  const partition::CostModel cost(cluster, net.precision);
  int faster = 0;
  for (const int d : {1, 2}) {
    space.staleness = d;
    const Agreement a = compare(cluster, net, 16, space, base, cost);
    ASSERT_GT(a.compared, 60);
    std::printf("D %d, %d layouts: iteration time off by at most %.2g\n", d, a.compared, a.time_error.back());
  }
  // Staleness pays where workers differ: some WSP candidate beats its synchronous twin.
  space.staleness = 2;
  for (const partition::PlanOptions& o : partition::search_candidates(cluster, net, 16, space, base, cost)) {
    if (o.sync != partition::SyncKind::wsp) continue;
    partition::PlanOptions sync = o;
    sync.staleness = 0;
    try {
      const double stale = partition::estimate_layout(net, partition::make_layout(cluster, net, o, cost), cost).iteration_time_s;
      const double wave = partition::estimate_layout(net, partition::make_layout(cluster, net, sync, cost), cost).iteration_time_s;
      EXPECT_LE(stale, wave * (1 + 1e-9)) << partition::candidate_summary(o, 0);
      faster += stale < 0.99 * wave;
    } catch (const Error&) {
    }
  }
  EXPECT_GT(faster, 0);
}

// --overlap-grad-reduce: each bucket waits for the part of its chunk's last backward that
// makes its gradients (small buckets: several per chunk), over pipelines, interleaving, split
// backward, unequal workers and several iterations.
TEST(LayoutEstimate, AgreesWithOverlappedGradientReduction) {
  const model::Cluster cluster = mixed_cluster();
  const model::Network net = model::network_from_spec("gpt:layers=8,hidden=512,heads=8,seq=512,vocab=8192", model::Precision::fp16);
  partition::SearchSpace space;
  space.policies = {"uniform", "balanced", "grouped"};
  space.micro_batches = {2};
  space.schedules = {"1f1b", "interleaved", "1f1b-split-w"};
  space.syncs = {partition::SyncKind::allreduce};
  partition::PlanOptions base;
  base.precision = net.precision;
  base.overlap_grad_reduce = true;
  base.bucket_bytes = 1 << 20;
  base.iterations = 2;
  const partition::CostModel cost(cluster, net.precision);
  const Agreement a = compare(cluster, net, 16, space, base, cost);
  ASSERT_GT(a.compared, 30);
  std::printf("%d layouts: iteration time off by at most %.2g\n", a.compared, a.time_error.back());
}

// ZeRO over the data axis (plan_builder_zero.cpp): stage 1's reduce-scattered buckets
// (overlapped with the last backward or not) and the all-gather after the optimizer that the
// next iteration waits for; stage 2's reduce-scatter per backward on the comm stream; stage
// 3's all-gathers before every pass on the gather stream, prefetched one ahead and spanning
// the replicas (workers of different GPU types wait for each other), or once per chunk
// without resharding. Over pipelines, interleaving, split backward, unequal workers and two
// iterations.
TEST(LayoutEstimate, AgreesUnderZeroStagesAndOffload) {
  const model::Cluster cluster = mixed_cluster();
  const model::Network& net = small_gpt();
  partition::SearchSpace space = every_schedule();
  space.recomputes = {partition::Recompute::none};
  const partition::CostModel cost(cluster, net.precision);
  struct Case {
    int stage;
    bool reshard, overlap, offload = false;
  };
  for (const Case c : {Case{1, true, false}, Case{1, true, true}, Case{2, true, false}, Case{3, true, false},
                       Case{3, false, false}, Case{0, true, false, true}, Case{1, true, true, true},
                       Case{3, true, false, true}}) {
    partition::PlanOptions base;
    base.precision = net.precision;
    base.zero_stage = c.stage;
    base.reshard_after_forward = c.reshard;
    base.overlap_grad_reduce = c.overlap;
    base.offload_optimizer = c.offload;
    base.bucket_bytes = 1 << 20;  // several buckets and messages a chunk
    base.iterations = 2;
    const Agreement a = compare(cluster, net, 16, space, base, cost);
    EXPECT_GT(a.compared, 30) << "stage " << c.stage;
    std::printf("stage %d%s%s%s, %d layouts: iteration time off by at most %.2g; headroom above the plan's by %.4f to %.4f of capacity\n",
                c.stage, c.reshard ? "" : " kept gathered", c.overlap ? " overlapped" : "", c.offload ? " offloaded" : "", a.compared,
                a.time_error.empty() ? 0.0 : a.time_error.back(), a.memory_error.empty() ? 0.0 : a.memory_error.front(),
                a.memory_error.empty() ? 0.0 : a.memory_error.back());
  }
}

// ZeRO's shares by device memory (V100-16 and V100-32 replicas): the estimate's uneven rings
// and each replica's optimizer share are the plan's.
TEST(LayoutEstimate, AgreesUnderZeroSharesByMemory) {
  const model::Cluster cluster = model::parse_cluster(
      "name: two-memories\nnodes:\n"
      "  - {name: small, gpu: V100-16, gpus: 4, intra: {kind: nvlink, bandwidth: 150 GB/s}, nic: {count: 1, bandwidth: 25 Gb/s}}\n"
      "  - {name: large, gpu: V100-32, gpus: 4, intra: {kind: nvlink, bandwidth: 150 GB/s}, nic: {count: 1, bandwidth: 25 Gb/s}}\n",
      "two-memories.yaml");
  const model::Network& net = small_gpt();
  partition::SearchSpace space = every_schedule();
  space.recomputes = {partition::Recompute::none};
  const partition::CostModel cost(cluster, net.precision);
  for (const int stage : {1, 2, 3}) {
    partition::PlanOptions base;
    base.precision = net.precision;
    base.zero_stage = stage;
    base.zero_shares = partition::ZeroShares::memory;
    base.bucket_bytes = 1 << 20;
    base.iterations = 2;
    const Agreement a = compare(cluster, net, 16, space, base, cost);
    EXPECT_GT(a.compared, 10) << "stage " << stage;
    std::printf("stage %d by memory, %d layouts: iteration time off by at most %.2g; headroom above the plan's by %.4f to %.4f\n",
                stage, a.compared, a.time_error.empty() ? 0.0 : a.time_error.back(),
                a.memory_error.empty() ? 0.0 : a.memory_error.front(), a.memory_error.empty() ? 0.0 : a.memory_error.back());
  }
}

// Activation offload (Builder::offload_stash, prefetch_stash): each stash out on its device's
// to_host stream when its forward ends, back on its to_device stream once it is out and the
// compute-stream task two before its backward's compute is done (the previous pass where the
// backward has a gather of its own), the backward's compute waiting for it; the optimizer's
// offloaded copies queue behind them on the same streams. Under ZeRO and optimizer offload,
// full recomputation, every schedule and unequal workers; then sequence parallelism (the
// passes' own gathers) and WSP.
TEST(LayoutEstimate, AgreesUnderActivationOffload) {
  const model::Cluster cluster = mixed_cluster();
  const model::Network& net = small_gpt();
  partition::SearchSpace space = every_schedule();
  const partition::CostModel cost(cluster, net.precision);
  struct Case {
    int stage;
    bool optimizer;
    partition::Recompute recompute;
  };
  for (const Case c : {Case{0, false, partition::Recompute::none}, Case{1, true, partition::Recompute::none},
                       Case{3, false, partition::Recompute::full}}) {
    partition::PlanOptions base;
    base.precision = net.precision;
    base.zero_stage = c.stage;
    base.offload_optimizer = c.optimizer;
    base.offload_activations = true;
    base.bucket_bytes = 1 << 20;
    base.iterations = 2;
    space.recomputes = {c.recompute};
    const Agreement a = compare(cluster, net, 16, space, base, cost);
    EXPECT_GT(a.compared, 30) << "stage " << c.stage;
    std::printf("stashes offloaded, stage %d%s, recompute %s, %d layouts: iteration time off by at most %.2g; headroom above "
                "the plan's by %.4f to %.4f of capacity\n",
                c.stage, c.optimizer ? ", optimizer offloaded" : "", std::string(partition::to_string(c.recompute)).c_str(),
                a.compared, a.time_error.empty() ? 0.0 : a.time_error.back(), a.memory_error.empty() ? 0.0 : a.memory_error.front(),
                a.memory_error.empty() ? 0.0 : a.memory_error.back());
  }
  const WideCase w;
  partition::PlanOptions base;
  base.precision = w.net.precision;
  base.sequence_parallel = true;
  base.offload_activations = true;
  const partition::CostModel a100_cost(w.cluster, w.net.precision);
  // Its memory bound holds a pass's own stash, not those in a copy (up to two more), which
  // are large here: 1 GB a micro-batch against 40 GiB.
  const Agreement a = compare(w.cluster, w.net, 32, w.space, base, a100_cost, 0.06);
  EXPECT_GT(a.compared, 30);
  std::printf("stashes offloaded under sequence parallelism and WSP, %d layouts: iteration time off by at most %.2g\n", a.compared,
              a.time_error.empty() ? 0.0 : a.time_error.back());
}

// Context parallelism: each pass's gathers and scatters over its context group, timed on the
// group's routes, and the gathered keys and values in the memory bound; with tensor and
// sequence parallelism, pipelines, every ZeRO stage, full recomputation, on one GPU type and
// on the mixed cluster (balanced: a group cut as its first worker).
TEST(LayoutEstimate, AgreesUnderContextParallelism) {
  const model::Network net = model::network_from_spec(
      "llama:layers=8,hidden=512,heads=8,kv_heads=4,ffn=1024,vocab=8192,seq=1024", model::Precision::fp16);
  int compared = 0;
  double worst = 0;
  for (const model::Cluster& cluster : {test_support::identical_cluster(4, 2, "A100-40"), mixed_cluster()}) {
    const partition::CostModel cost(cluster, net.precision);
    Agreement a;
    for (const char* policy : {"uniform", "balanced"}) {
      for (const int context : {2, 4}) {
        for (const int tensor : {1, 2}) {
            for (const int pipeline : {1, 2}) {
              for (const int zero : {0, 1, 3}) {
                for (const partition::Recompute r : {partition::Recompute::none, partition::Recompute::full}) {
                  partition::PlanOptions o;
                  o.policy = policy;
                  o.precision = net.precision;
                  o.context = context;
                  o.tensor = tensor;
                  o.pipeline = pipeline;
                  o.global_batch = 24;
                  o.zero_stage = zero;
                  o.recompute = r;
                  o.sequence_parallel = tensor > 1;
                  o.schedule = pipeline > 1 ? "1f1b" : "gpipe";
                  o.bucket_bytes = 1 << 20;
                  o.iterations = 2;
                  compare_one(cluster, net, o, cost, a);
                }
            }
          }
        }
      }
    }
    compared += a.compared;
    for (const double e : a.time_error) worst = std::max(worst, e);
  }
  EXPECT_GT(compared, 150);
  std::printf("context parallelism, %d layouts: iteration time off by at most %.2g\n", compared, worst);
}

// Mixtures of experts beside context groups and over tensor ranks, as the plan has them:
// under context parallelism every MoE layer's forward (and its full rerun) all-reduces the
// router's statistics over the group, a micro-batch's 2 E floats whatever its samples, with
// and without expert groups; over tensor ranks without expert groups the MLP's calls, and in
// every MoE layer's backward the all-reduce of the combine weights' (and the shared gate's)
// gradients.
TEST(LayoutEstimate, AgreesForMixturesUnderContextAndTensorParallelism) {
  const model::Network net = model::network_from_spec(
      "llama:layers=4,hidden=256,heads=8,kv_heads=4,ffn=512,vocab=1000,seq=256,experts=8,experts_per_token=2,"
      "expert_ffn=512,shared_experts=1",
      model::Precision::fp16);
  const model::Cluster cluster = test_support::identical_cluster(4, 2, "A100-40");
  const partition::CostModel cost(cluster, net.precision);
  Agreement a;
  for (const partition::Recompute r : {partition::Recompute::none, partition::Recompute::full}) {
    for (const int first : {1, 2}) {  // expert groups beside the context groups; pipeline stages
      for (const int second : {1, 3}) {  // samples a micro-batch; ZeRO stage (3: on)
        for (const bool third : {false, true}) {  // the ring; sequence parallelism
          partition::PlanOptions o;
          o.precision = net.precision;
          o.context = 2;
          o.experts.parallel = first;
          o.micro_batch = second;
          o.context_comm = third ? partition::ContextComm::ring : partition::ContextComm::all_gather;
          o.global_batch = 24;
          o.recompute = r;
          o.schedule = "gpipe";
          o.iterations = 2;
          compare_one(cluster, net, o, cost, a);
          partition::PlanOptions t;
          t.precision = net.precision;
          t.tensor = 2;
          t.sequence_parallel = third;
          t.pipeline = first;
          t.zero_stage = second == 3 ? 3 : 0;
          t.recompute = r;
          t.global_batch = 24;
          t.schedule = first > 1 ? "1f1b" : "gpipe";
          t.iterations = 2;
          compare_one(cluster, net, t, cost, a);
        }
      }
    }
  }
  EXPECT_EQ(a.compared, 32);
  double worst = 0;
  for (const double e : a.time_error) worst = std::max(worst, e);
  std::printf("mixtures beside context groups and over tensor ranks, %d layouts: iteration time off by at most %.2g\n",
              a.compared, worst);
}

// Expert parallelism (ZeRO 0 to 3, one or two tensor-parallel devices a rank): the dense part's
// rings over every replica and each expert rank's over its holders, the all-to-alls and the
// tensor group's gathers of what they bring in the passes, as the plan has them.
TEST(LayoutEstimate, AgreesUnderExpertParallelismAndZero) {
  const model::Network net = model::network_from_spec(
      "llama:layers=4,hidden=256,heads=8,kv_heads=4,ffn=512,vocab=1000,seq=256,experts=8,experts_per_token=2,"
      "expert_ffn=512",
      model::Precision::fp16);
  int compared = 0;
  double worst = 0;
  for (const model::Cluster& cluster : {test_support::identical_cluster(4, 2, "A100-40"), mixed_cluster()}) {
    const partition::CostModel cost(cluster, net.precision);
    Agreement a;
    for (const int ep : {2, 4}) {
      for (const int pipeline : {1, 2}) {
        for (const int zero : {0, 1, 2, 3}) {
          for (const bool overlap : {false, true}) {
            for (const int tensor : {1, 2}) {
              partition::PlanOptions o;
              o.precision = net.precision;
              o.tensor = tensor;
              o.sequence_parallel = tensor > 1;
              o.experts.parallel = ep;
              o.pipeline = pipeline;
              o.global_batch = 24;
              o.zero_stage = zero;
              o.overlap_grad_reduce = overlap;
              o.schedule = pipeline > 1 ? "1f1b" : "gpipe";
              o.bucket_bytes = 1 << 18;
              o.iterations = 2;
              compare_one(cluster, net, o, cost, a);
            }
          }
        }
        // Parameter servers: each chunk pushes its dense part and its rank's experts.
        for (const partition::SyncKind sync : {partition::SyncKind::ps, partition::SyncKind::wsp}) {
          partition::PlanOptions o;
          o.precision = net.precision;
          o.experts.parallel = ep;
          o.pipeline = pipeline;
          o.global_batch = 24;
          o.sync = sync;
          o.staleness = sync == partition::SyncKind::wsp ? 1 : 0;
          o.schedule = pipeline > 1 ? "1f1b" : "gpipe";
          o.iterations = 2;
          compare_one(cluster, net, o, cost, a);
        }
      }
    }
    compared += a.compared;
    for (const double e : a.time_error) worst = std::max(worst, e);
  }
  EXPECT_GT(compared, 50);
  std::printf("expert parallelism, %d layouts: iteration time off by at most %.2g\n", compared, worst);
}
