// Context parallelism (--context-parallel C): groups of C consecutive virtual workers split
// each sequence, every device computing, stashing and sending 1/C of the tokens; each pass
// all-gathers every attention layer's keys and values over its context group, and a backward
// reduce-scatters their gradients back. The group's gradients are summed, and ZeRO shards,
// over all D x C workers. Checked against the closed forms of the work (the zoo's FLOPs and
// stashes over C), the keys' and values' bytes, and the placement Megatron gives
// (tensor innermost, then context, data, pipeline).
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>

#include "model/io.hpp"
#include "model/zoo.hpp"
#include "partition/layer_ops.hpp"
#include "partition/memory.hpp"
#include "partition/plan_builder.hpp"
#include "partition/plan_io.hpp"
#include "partition/policy.hpp"
#include "partition/validate.hpp"
#include "tests/partition/plan_test_util.hpp"

using namespace hetflow;
using namespace hetflow::partition;

namespace {

using test_support::plan_of;

const model::Network& llama() { return test_support::context_llama(); }

PlanOptions options(int context, int tensor = 1, int pipeline = 1, int data = 0) {
  PlanOptions o;
  o.context = context;
  o.tensor = tensor;
  o.pipeline = pipeline;
  o.data = data;
  o.microbatches = 2 * pipeline;
  o.micro_batch = 2;
  o.workspace_bytes = 0;
  return o;
}

double sum_of(const Plan& plan, TaskKind kind, int device, double Task::*field) {
  double s = 0;
  for (const Task& t : plan.tasks) {
    if (t.kind == kind && t.device == device) s += t.*field;
  }
  return s;
}

}  // namespace

TEST(ContextParallel, MegatronPlacesTensorThenContextThenDataThenPipeline) {
  const model::Cluster cluster = test_support::identical_cluster(8, 2);
  const Plan plan = plan_of(cluster, llama(), options(2, 2, 2, 2));
  ASSERT_TRUE(validate_plan(plan).ok()) << validate_plan(plan).problems.front();
  ASSERT_EQ(plan.layout.workers.size(), 4u);  // D x C
  EXPECT_EQ(plan.layout.size(Axis::data), 2);
  EXPECT_EQ(plan.layout.size(Axis::context), 2);
  EXPECT_EQ(axis_order_text(plan.layout.axes), "tensor,context,data,pipeline");
  EXPECT_EQ(plan.layout.samples_per_iteration(), 2 * 4 * 2);  // D x micro-batches x micro-batch size
  // Device pp*(D*C*T) + dp*(C*T) + cp*T + tp is worker dp*C + cp's rank pp, tensor rank tp.
  for (int dp = 0; dp < 2; ++dp) {
    for (int cp = 0; cp < 2; ++cp) {
      for (int pp = 0; pp < 2; ++pp) {
        for (int tp = 0; tp < 2; ++tp) {
          const int device = pp * 8 + dp * 4 + cp * 2 + tp;
          EXPECT_EQ(plan.layout.workers[static_cast<size_t>(dp * 2 + cp)].ranks[static_cast<size_t>(pp)][static_cast<size_t>(tp)],
                    device);
          const AxisCoords& c = plan.coords_of(device);
          EXPECT_EQ(c[Axis::data], dp);
          EXPECT_EQ(c[Axis::context], cp);
          EXPECT_EQ(c[Axis::pipeline], pp);
          EXPECT_EQ(c[Axis::tensor], tp);
        }
      }
    }
  }
}

TEST(ContextParallel, EachDeviceComputesAndStashesItsShareOfTheTokens) {
  const model::Cluster cluster = test_support::identical_cluster(8);
  for (const Recompute recompute : {Recompute::none, Recompute::selective, Recompute::full}) {
    PlanOptions whole = options(1, 2, 1, 1), split = options(4, 2, 1, 1);
    whole.recompute = split.recompute = recompute;
    const Plan a = plan_of(cluster, llama(), whole), b = plan_of(cluster, llama(), split);
    ASSERT_TRUE(validate_plan(b).ok()) << validate_plan(b).problems.front();
    // The zoo's FLOPs: every operation of a decoder is per token, attention's scores included
    // (each device's queries meet all the sequence's keys).
    for (const TaskKind kind : {TaskKind::forward, TaskKind::backward}) {
      EXPECT_DOUBLE_EQ(sum_of(b, kind, 0, &Task::flops) * 4, sum_of(a, kind, 0, &Task::flops)) << to_string(recompute);
    }
    double stash_a = 0, stash_b = 0;
    for (const Tensor& t : a.tensors) stash_a += t.kind == TensorKind::stash && t.device == 0 ? t.bytes : 0;
    for (const Tensor& t : b.tensors) stash_b += t.kind == TensorKind::stash && t.device == 0 ? t.bytes : 0;
    EXPECT_DOUBLE_EQ(stash_b * 4, stash_a);
    // Weights are whole on every member of a context group.
    EXPECT_EQ(b.memory[0].weights_bytes, a.memory[0].weights_bytes);
  }
  // The operation model agrees: 1/C of every operation's FLOPs and bytes.
  for (int layer = 0; layer < static_cast<int>(llama().layers.size()); ++layer) {
    for (const OpPass pass : {OpPass::forward, OpPass::backward_data, OpPass::backward_weight}) {
      const std::vector<Op> whole = layer_ops(llama(), layer, pass, OpShape{2, 2, false, 2, 1});
      const std::vector<Op> quarter = layer_ops(llama(), layer, pass, OpShape{2, 2, false, 2, 4});
      ASSERT_EQ(whole.size(), quarter.size());
      for (size_t i = 0; i < whole.size(); ++i) {
        EXPECT_NEAR(quarter[i].flops * 4, whole[i].flops, 1e-6 * whole[i].flops) << whole[i].name;
        if (whole[i].cls == OpClass::memory) {
          EXPECT_NEAR(quarter[i].bytes * 4, whole[i].bytes, 1e-6 * whole[i].bytes) << whole[i].name;
        }
      }
    }
  }
}

TEST(ContextParallel, EachAttentionGathersTheSequencesKeysAndValuesAndScattersTheirGradients) {
  const model::Cluster cluster = test_support::identical_cluster(8);
  const Plan plan = plan_of(cluster, llama(), options(4, 2, 1, 1));
  const model::TransformerConfig& c = *llama().architecture;
  // Per message: the whole sequence's keys and values of the rank's 4 / 2 KV heads, for the
  // micro-batch's 2 samples, in bf16.
  const double kv_bytes = 2.0 * c.seq * (4 / 2) * c.head_size() * 2 * 2;
  int attention = 0;
  for (const model::Layer& l : llama().layers) attention += l.attention_core_flops > 0;
  ASSERT_EQ(attention, 4);
  std::map<std::pair<TaskKind, CollectiveKind>, int> messages;
  std::set<int> communicators;
  for (const Collective& col : plan.collectives) {
    if (col.purpose != Purpose::context_parallel) continue;
    ASSERT_TRUE(col.in_task());
    const Communicator& comm = plan.communicator(col.communicator);
    EXPECT_EQ(comm.role, CommRole::context);
    ASSERT_EQ(comm.devices.size(), 4u);
    communicators.insert(col.communicator);
    EXPECT_DOUBLE_EQ(col.bytes / col.messages, kv_bytes);
    // One task per member, each its own worker's pass of the same chunk and micro-batch.
    std::set<int> workers;
    for (size_t i = 0; i < col.tasks.size(); ++i) {
      const Task& t = plan.task(col.tasks[i]);
      EXPECT_EQ(t.device, comm.devices[i]);
      EXPECT_EQ(t.microbatch, plan.task(col.tasks[0]).microbatch);
      EXPECT_EQ(t.kind, plan.task(col.tasks[0]).kind);
      workers.insert(t.worker);
    }
    EXPECT_EQ(workers.size(), 4u);
    messages[{plan.task(col.tasks[0]).kind, col.kind}] += col.messages;
  }
  // Per tensor rank (2) and micro-batch (2): a gather per attention layer in the forward; a
  // gather and a reduce-scatter in the backward.
  EXPECT_EQ(communicators.size(), 2u);
  EXPECT_EQ((messages[{TaskKind::forward, CollectiveKind::all_gather}]), 2 * 2 * attention);
  EXPECT_EQ((messages[{TaskKind::backward, CollectiveKind::all_gather}]), 2 * 2 * attention);
  EXPECT_EQ((messages[{TaskKind::backward, CollectiveKind::reduce_scatter}]), 2 * 2 * attention);
  EXPECT_EQ(messages.size(), 3u);
}

TEST(ContextParallel, GradientsAreSummedAndShardedOverDataTimesContext) {
  const model::Cluster cluster = test_support::identical_cluster(8);
  for (const int zero : {0, 3}) {
    PlanOptions o = options(2, 1, 2, 2);
    o.zero_stage = zero;
    const Plan plan = plan_of(cluster, llama(), o);
    ASSERT_TRUE(validate_plan(plan).ok()) << validate_plan(plan).problems.front();
    for (const Collective& col : plan.collectives) {
      if (col.purpose != Purpose::data_parallel) continue;
      EXPECT_EQ(plan.communicator(col.communicator).devices.size(), 4u) << "zero " << zero;
    }
    // ZeRO 3: each of the 4 replicas holds a quarter of the parameters.
    if (zero == 3) {
      PlanOptions whole = o;
      whole.zero_stage = 0;
      const Plan unsharded = plan_of(cluster, llama(), whole);
      EXPECT_NEAR(plan.memory[0].weights_bytes * 4, unsharded.memory[0].weights_bytes, 4 * 2.0 * 4);
    }
  }
}

TEST(ContextParallel, APlanFileKeepsItsContextGroups) {
  const model::Cluster cluster = test_support::identical_cluster(8);
  PlanOptions o = options(2, 2, 2, 1);
  o.sequence_parallel = true;
  const Plan plan = plan_of(cluster, llama(), o);
  const Plan back = read_plan_json(write_plan_json(plan), "context.json");
  EXPECT_EQ(back.layout, plan.layout);
  EXPECT_EQ(back.coords, plan.coords);
  EXPECT_EQ(back.collectives, plan.collectives);
  EXPECT_TRUE(validate_plan(back).ok()) << validate_plan(back).problems.front();
}

TEST(ContextParallel, RefusesWhatItCannotSplit) {
  const model::Cluster cluster = test_support::identical_cluster(8);
  using test_support::error_of;
  // 2C chunks must divide the sequence of 256 tokens.
  EXPECT_NE(error_of([&] { plan_of(cluster, model::network_from_spec("llama:layers=2,hidden=256,heads=8,vocab=100,seq=100",
                                                                     model::Precision::bf16),
                                   options(4, 1, 1, 1)); })
                .find("context: expected 2 x context (8 load-balanced chunks) to divide the sequence of 100 tokens"),
            std::string::npos);
  EXPECT_NE(error_of([&] { plan_of(cluster, test_support::equal_layers(4), options(2)); })
                .find("context: splits a decoder's sequences"),
            std::string::npos);
  PlanOptions ps = options(2, 1, 1, 2);
  ps.sync = SyncKind::ps;
  EXPECT_NE(error_of([&] { plan_of(cluster, llama(), ps); }).find("context: needs all-reduce synchronisation"),
            std::string::npos);
  PlanOptions grouped = options(2);
  grouped.policy = "hetpipe-np";
  EXPECT_NE(error_of([&] { plan_of(cluster, llama(), grouped); }).find("context: policy hetpipe-np lays no context groups"),
            std::string::npos);
  EXPECT_NE(error_of([&] { plan_of(cluster, llama(), options(16)); }).find("more than the cluster's 8"), std::string::npos);
}
