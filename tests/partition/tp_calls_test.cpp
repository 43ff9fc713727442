// A pass's tensor-parallel collectives (partition/tp_calls.hpp) against the sequence the
// decoder math runs, written out here by hand from exec/decoder.cpp (block_forward,
// block_backward, head_forward, parallel_crossentropy, DecoderChunk::forward/backward), and
// the plan's in-task collectives built from them: one per kind and size, their messages at
// points that order every task's calls. (The executor checks the same sequence as it runs:
// exec/training.cpp's Group, in the distributed training tests.)
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "model/io.hpp"
#include "model/zoo.hpp"
#include "partition/plan_builder.hpp"
#include "partition/policy.hpp"
#include "partition/tp_calls.hpp"
#include "partition/validate.hpp"
#include "tests/partition/plan_test_util.hpp"

using namespace hetflow;
using namespace hetflow::partition;

namespace {

constexpr int kSeq = 12, kHidden = 24;

// Embedding, 2 decoder layers, head; per sample s h = 288 elements.
model::Network gpt() {
  return model::network_from_spec("gpt:layers=2,hidden=24,heads=4,seq=12,vocab=50", model::Precision::fp32);
}

// "AR288" for an all-reduce of 288 elements per sample, "AG", "RS" likewise.
std::vector<std::string> spelled(const std::vector<PassCall>& calls) {
  std::vector<std::string> out;
  for (const PassCall& c : calls) {
    const char* kind = c.kind == CollectiveKind::all_reduce ? "AR" : c.kind == CollectiveKind::all_gather ? "AG" : "RS";
    out.push_back(kind + std::to_string(static_cast<long long>(c.elems)));
  }
  return out;
}

std::vector<std::string> calls_of(const model::Network& net, bool backward, bool sp, Recompute recompute = Recompute::none) {
  PassShape pass;
  pass.layer_begin = 0;
  pass.layer_end = static_cast<int>(net.layers.size());
  pass.tensor = 2;
  pass.backward = backward;
  pass.sequence_parallel = sp;
  pass.recompute = recompute;
  const std::vector<PassCall> calls = pass_tp_calls(net, pass);
  for (size_t k = 0; k < calls.size(); ++k) {  // points order the calls, within the pass
    EXPECT_GE(calls[k].at, 0);
    EXPECT_LE(calls[k].at, 1);
    if (k > 0) {
      EXPECT_GT(calls[k].at, calls[k - 1].at) << k;
    }
  }
  return spelled(calls);
}

const std::string SH = std::to_string(kSeq * kHidden), S = std::to_string(kSeq), S2 = std::to_string(2 * kSeq);

}  // namespace

// Forward: the embedding's sum, g after attention and after the MLP of each layer, the loss's
// row maximum and [sum of exponentials | target logit].
TEST(TpCalls, ForwardIsMegatronsSequence) {
  const model::Network net = gpt();
  EXPECT_EQ(calls_of(net, false, false),
            (std::vector<std::string>{"AR" + SH, "AR" + SH, "AR" + SH, "AR" + SH, "AR" + SH, "AR" + S, "AR" + S2}));
  // Sequence parallel: the embedding reduce-scattered; per layer f gathered, g scattered,
  // twice; the head's norm output gathered before the loss.
  EXPECT_EQ(calls_of(net, false, true),
            (std::vector<std::string>{"RS" + SH, "AG" + SH, "RS" + SH, "AG" + SH, "RS" + SH, "AG" + SH, "RS" + SH,
                                      "AG" + SH, "RS" + SH, "AG" + SH, "AR" + S, "AR" + S2}));
}

// Backward, last layer first: the head's input gradient, each layer's two column-parallel
// input gradients; the embedding has none.
TEST(TpCalls, BackwardIsMegatronsSequenceReversed) {
  const model::Network net = gpt();
  EXPECT_EQ(calls_of(net, true, false), (std::vector<std::string>(5, "AR" + SH)));
  // Sequence parallel: per layer the output gradient gathered, the MLP input gathered again
  // and its gradient scattered, the attention output's gradient gathered, the QKV input
  // gathered again and its gradient scattered; the head's norm output again and its
  // gradient; the embedding's output gradient gathered.
  const std::vector<std::string> layer{"AG" + SH, "AG" + SH, "RS" + SH, "AG" + SH, "AG" + SH, "RS" + SH};
  std::vector<std::string> want{"AG" + SH, "RS" + SH};
  want.insert(want.end(), layer.begin(), layer.end());
  want.insert(want.end(), layer.begin(), layer.end());
  want.push_back("AG" + SH);
  EXPECT_EQ(calls_of(net, true, true), want);
}

// Full recomputation runs each layer's forward again before its backward (the head's loss
// included, not the embedding, whose output is the checkpoint); selective recomputation
// redoes attention cores alone, which exchange nothing.
TEST(TpCalls, FullRecomputationRepeatsEachLayersForwardFirst) {
  const model::Network net = gpt();
  EXPECT_EQ(calls_of(net, true, false, Recompute::full),
            (std::vector<std::string>{"AR" + S, "AR" + S2, "AR" + SH, "AR" + SH, "AR" + SH, "AR" + SH, "AR" + SH,
                                      "AR" + SH, "AR" + SH, "AR" + SH, "AR" + SH}));
  EXPECT_EQ(calls_of(net, true, false, Recompute::selective), calls_of(net, true, false));
}

// Without tensor parallelism a pass exchanges nothing; the summed gains are the norms' under
// sequence parallelism only (GPT-2 has no QK-norm): 2 LayerNorms of weight and bias per layer
// and the final one.
TEST(TpCalls, OneDeviceExchangesNothingAndGainsAreTheNorms) {
  const model::Network net = gpt();
  PassShape one;
  one.layer_end = static_cast<int>(net.layers.size());
  EXPECT_TRUE(pass_tp_calls(net, one).empty());
  const int end = static_cast<int>(net.layers.size());
  EXPECT_EQ(summed_gain_elems(net, 0, end, 2, false), 0);
  EXPECT_EQ(summed_gain_elems(net, 0, end, 2, true), 2 * 2 * (2 * kHidden) + 2 * kHidden);
  EXPECT_EQ(summed_gain_elems(net, 0, end, 1, true), 0);
}

// In a plan: no tensor-parallel collective tasks are left but the gathers of arriving
// slices; every forward and backward of a tensor-parallel chunk performs its calls inside,
// and they add up to what the layers say, per pass.
TEST(TpCalls, PlansCarryThemInsideTheirPasses) {
  const model::Network net = gpt();
  for (const bool sp : {false, true}) {
    PlanOptions o;
    o.pipeline = 2;
    o.data = 1;
    o.microbatches = 2;
    o.schedule = "1f1b";
    o.micro_batch = 1;
    o.tensor = 2;
    o.sequence_parallel = sp;
    o.precision = net.precision;
    const model::Cluster cluster = model::cpu_cluster(4);
    const CostModel cost(cluster, net.precision);
    const Plan plan = build_plan(cluster, net, make_layout(cluster, net, o, cost), cost);
    ASSERT_TRUE(validate_plan(plan).ok()) << validate_plan(plan).problems.front();
    for (const Task& t : plan.tasks) {
      if (t.kind == TaskKind::collective) {
        EXPECT_NE(plan.collective(t.collective).purpose, Purpose::sequence_parallel);
      }
      if (t.kind != TaskKind::forward && t.kind != TaskKind::backward) continue;
      const Stage& stage = plan.layout.workers[static_cast<size_t>(t.worker)].stages[static_cast<size_t>(t.stage)];
      PassShape pass;
      pass.layer_begin = stage.layer_begin;
      pass.layer_end = stage.layer_end;
      pass.tensor = 2;
      pass.backward = t.kind == TaskKind::backward;
      pass.sequence_parallel = sp;
      const std::vector<PassCall> want = pass_tp_calls(net, pass);
      const auto inside = plan.inside(static_cast<int>(&t - plan.tasks.data()));
      double gains = 0;  // the last backward's extra all-reduce
      ASSERT_GE(inside.size(), want.size());
      for (size_t k = 0; k < inside.size(); ++k) {
        const Collective& c = plan.collective(inside[k].collective);
        const double elems = c.bytes / c.messages / o.micro_batch / 4;
        if (k >= want.size()) {
          gains += c.bytes / 4;
          continue;
        }
        EXPECT_EQ(c.kind, want[k].kind) << k;
        EXPECT_DOUBLE_EQ(elems, want[k].elems) << k;
        EXPECT_EQ(inside[k].at, want[k].at) << k;
      }
      if (gains > 0) {
        EXPECT_EQ(gains, summed_gain_elems(net, stage.layer_begin, stage.layer_end, 2, sp));
      }
    }
  }
}
