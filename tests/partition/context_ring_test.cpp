// Context parallelism by a ring (--cp-comm ring, Megatron's p2p): no rank holds the whole
// sequence's keys and values. Each attention layer runs in C steps, one per rank's block;
// while a rank computes on one block, the next arrives from its predecessor (a sendrecv of
// 1/C of the keys and values, overlapped with that step: Collective::until). Checked against
// the closed forms: C - 1 blocks forward; backward C - 1 blocks and C gradient-sum hops (the
// last one home, not overlapped); each overlap one step, 1/C of the layer's attention work;
// the memory of two blocks where the all-gather holds the whole sequence.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "model/zoo.hpp"
#include "partition/memory.hpp"
#include "partition/plan_io.hpp"
#include "partition/tp_calls.hpp"
#include "partition/validate.hpp"
#include "tests/partition/plan_test_util.hpp"

using namespace hetflow;
using namespace hetflow::partition;

namespace {

using test_support::plan_of;

const model::Network& llama() { return test_support::context_llama(); }

PlanOptions ring(int context, int tensor = 1) {
  PlanOptions o;
  o.context = context;
  o.context_comm = ContextComm::ring;
  o.tensor = tensor;
  o.microbatches = 2;
  o.micro_batch = 2;
  o.workspace_bytes = 0;
  return o;
}

// Keys and values of the whole sequence on one tensor rank of `tensor`, for the micro-batch's
// 2 samples, in bf16.
double kv_bytes(int tensor) {
  const model::TransformerConfig& c = *llama().architecture;
  return 2.0 * c.seq * (4.0 / tensor) * c.head_size() * 2 * 2;
}

// A pass's in-task messages of the context group, in the order the pass performs them.
std::vector<InTaskCall> context_calls(const Plan& plan, int task) {
  std::vector<InTaskCall> out;
  for (const InTaskCall& call : plan.inside(task)) {
    if (plan.collective(call.collective).purpose == Purpose::context_parallel) out.push_back(call);
  }
  return out;
}

double message_bytes(const Plan& plan, const InTaskCall& call) {
  const Collective& c = plan.collective(call.collective);
  return c.bytes / c.messages;
}

int first_task(const Plan& plan, TaskKind kind, int device) {
  for (size_t t = 0; t < plan.tasks.size(); ++t) {
    if (plan.tasks[t].kind == kind && plan.tasks[t].device == device) return static_cast<int>(t);
  }
  return -1;
}

}  // namespace

TEST(ContextRing, EachAttentionPassesItsBlocksAroundTheGroup) {
  const model::Cluster cluster = test_support::identical_cluster(8);
  for (const int C : {2, 4}) {
    const Plan plan = plan_of(cluster, llama(), ring(C, 2));
    ASSERT_TRUE(validate_plan(plan).ok()) << validate_plan(plan).problems.front();
    EXPECT_EQ(plan.layout.context_comm, ContextComm::ring);
    const double block = kv_bytes(2) / C;
    for (const Collective& col : plan.collectives) {
      if (col.purpose != Purpose::context_parallel) continue;
      EXPECT_EQ(col.kind, CollectiveKind::sendrecv);
      EXPECT_EQ(plan.communicator(col.communicator).devices.size(), static_cast<size_t>(C));
    }
    // Forward, per attention layer (4): C - 1 blocks, each overlapped with a step.
    const std::vector<InTaskCall> forward = context_calls(plan, first_task(plan, TaskKind::forward, 0));
    ASSERT_EQ(forward.size(), 4u * (C - 1)) << "C " << C;
    for (const InTaskCall& call : forward) {
      EXPECT_DOUBLE_EQ(message_bytes(plan, call), block);
      EXPECT_TRUE(call.overlaps());
    }
    // Backward, per layer: the blocks again, with each after the first the gradient sums of
    // the step before (2 blocks a message), the sums of the last step but one alone, and the
    // last sums' hop home, which holds the pass.
    const std::vector<InTaskCall> backward = context_calls(plan, first_task(plan, TaskKind::backward, 0));
    ASSERT_EQ(backward.size(), 4u * (C + 1)) << "C " << C;
    for (size_t layer = 0; layer < 4; ++layer) {
      for (int j = 0; j <= C; ++j) {
        const InTaskCall& call = backward[layer * static_cast<size_t>(C + 1) + static_cast<size_t>(j)];
        const double blocks = j == 0 || j >= C - 1 ? 1 : 2;
        EXPECT_DOUBLE_EQ(message_bytes(plan, call), blocks * block) << "C " << C << " message " << j;
        EXPECT_EQ(call.overlaps(), j < C) << "C " << C << " message " << j;
      }
    }
    // What a device sends a pass: (C - 1) / C of the keys and values forward, as the gather;
    // (2 C - 1) / C backward, one block more than the gather and scatter, the last hop.
    double sent_forward = 0, sent_backward = 0;
    for (const InTaskCall& call : forward) sent_forward += message_bytes(plan, call);
    for (const InTaskCall& call : backward) sent_backward += message_bytes(plan, call);
    EXPECT_DOUBLE_EQ(sent_forward, 4 * (C - 1.0) / C * kv_bytes(2));
    EXPECT_DOUBLE_EQ(sent_backward, 4 * (2.0 * C - 1) / C * kv_bytes(2));
  }
}

TEST(ContextRing, EachMessageOverlapsOneStepOfItsLayersAttention) {
  const model::Cluster cluster = test_support::identical_cluster(8);
  const int C = 4;
  const Plan plan = plan_of(cluster, llama(), ring(C));
  const int task = first_task(plan, TaskKind::forward, 0);
  // The pass's work is its layers' forward FLOPs (one device a rank); one step is 1/C of a
  // layer's attention core.
  double pass_flops = 0, attention = 0;
  for (int i = plan.task(task).layer_begin; i < plan.task(task).layer_end; ++i) {
    const model::Layer& l = llama().layers[static_cast<size_t>(i)];
    pass_flops += l.forward_flops;
    if (l.attention_core_flops > 0) attention = l.attention_core_flops;
  }
  const std::vector<InTaskCall> calls = context_calls(plan, task);
  ASSERT_EQ(calls.size(), 4u * (C - 1));
  for (size_t k = 0; k < calls.size(); ++k) {
    EXPECT_NEAR(calls[k].until - calls[k].at, attention / C / pass_flops, 1e-12) << k;
    // A layer's steps follow one another: the next block leaves where the last one arrived.
    if (k % (C - 1) != C - 2) {
      EXPECT_NEAR(calls[k + 1].at, calls[k].until, 1e-12) << k;
    }
  }
  // Beside every other message of the pass, none in flight (validation holds the plan to it).
  const std::span<const InTaskCall> all = plan.inside(task);
  for (size_t k = 0; k + 1 < all.size(); ++k) EXPECT_LE(all[k].until, all[k + 1].at) << k;
}

TEST(ContextRing, HoldsTwoBlocksWhereTheGatherHoldsTheSequence) {
  const model::Cluster cluster = test_support::identical_cluster(8);
  for (const int C : {2, 4, 8}) {
    PlanOptions gathered = ring(C);
    gathered.context_comm = ContextComm::all_gather;
    const Plan a = plan_of(cluster, llama(), gathered), b = plan_of(cluster, llama(), ring(C));
    const int layers = static_cast<int>(llama().layers.size());
    EXPECT_DOUBLE_EQ(context_gathered_bytes(llama(), b.layout, 0, layers, 1) * C / 2,
                     context_gathered_bytes(llama(), a.layout, 0, layers, 1)) << C;
    EXPECT_DOUBLE_EQ(context_gathered_bytes(llama(), a.layout, 0, layers, 1), kv_bytes(1));
    EXPECT_LE(b.memory[0].total_bytes(), a.memory[0].total_bytes()) << C;
  }
}

TEST(ContextRing, APlanFileKeepsItsRingAndItsOverlaps) {
  const model::Cluster cluster = test_support::identical_cluster(8);
  const Plan plan = plan_of(cluster, llama(), ring(2, 2));
  const std::string json = write_plan_json(plan);
  EXPECT_NE(json.find("\"context_comm\":\"ring\""), std::string::npos);
  EXPECT_NE(json.find("\"until\": ["), std::string::npos);
  const Plan back = read_plan_json(json, "ring.json");
  EXPECT_EQ(back.layout, plan.layout);
  EXPECT_EQ(back.collectives, plan.collectives);
  EXPECT_TRUE(validate_plan(back).ok()) << validate_plan(back).problems.front();
  // An all-gather plan writes neither: its file and fingerprint are as before the ring.
  PlanOptions gathered = ring(2, 2);
  gathered.context_comm = ContextComm::all_gather;
  const std::string before = write_plan_json(plan_of(cluster, llama(), gathered));
  EXPECT_EQ(before.find("context_comm"), std::string::npos);
  EXPECT_EQ(before.find("\"until\""), std::string::npos);
}

TEST(ContextRing, ValidationBlamesAnOverlapThatCannotRun) {
  const model::Cluster cluster = test_support::identical_cluster(8);
  const Plan plan = plan_of(cluster, llama(), ring(2));
  size_t c = 0;
  while (plan.collectives[c].until.empty()) ++c;
  const auto problem = [&](const std::function<void(Collective&)>& edit) {
    Plan broken = read_plan_json(write_plan_json(plan), "ring.json");
    edit(broken.collectives[c]);
    broken.finish();
    const Validation v = validate_plan(broken);
    return v.ok() ? std::string("valid") : v.problems.front();
  };
  EXPECT_NE(problem([](Collective& col) { col.until.pop_back(); }).find("one point per message"), std::string::npos);
  EXPECT_NE(problem([](Collective& col) { col.until[0] = col.at[0] / 2; }).find("before it starts"), std::string::npos);
  // Waited for past the pass's next message: two messages in flight at once.
  EXPECT_NE(problem([](Collective& col) { col.until[0] = 1; }).find("one message in flight"), std::string::npos);
}

TEST(ContextRing, NeedsAContextGroup) {
  const model::Cluster cluster = test_support::identical_cluster(8);
  EXPECT_NE(test_support::error_of([&] { plan_of(cluster, llama(), ring(1)); }).find("context_comm: "), std::string::npos);
  Plan plan = plan_of(cluster, llama(), ring(2));
  std::string json = write_plan_json(plan);
  // A ring without a context axis: the file's field is blamed.
  PlanOptions flat = ring(2);
  flat.context = 1;
  flat.context_comm = ContextComm::all_gather;
  std::string flat_json = write_plan_json(plan_of(cluster, llama(), flat));
  const std::string key = "\"layout\": {";
  flat_json.replace(flat_json.find(key), key.size(), key + "\"context_comm\":\"ring\",");
  try {
    read_plan_json(flat_json, "flat.json");
    ADD_FAILURE() << "read a ring without context groups";
  } catch (const InputError& e) {
    EXPECT_EQ(e.field(), "layout.context_comm");
  }
}
