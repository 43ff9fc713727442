// Plan format 3 against what it promises: every policy and schedule with tensor and sequence
// parallelism, recomputation, parameter servers and WSP round-trips; one iteration however
// many are run; the real collective kinds and the tied-embedding all-reduce are there; device
// memory from tensor lifetimes equals Korthikanti et al.'s closed form on its activation term.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include <nlohmann/json.hpp>

#include "model/error.hpp"
#include "model/io.hpp"
#include "model/zoo.hpp"
#include "partition/estimate.hpp"
#include "partition/memory.hpp"
#include "partition/plan_builder.hpp"
#include "partition/plan_io.hpp"
#include "partition/shard.hpp"
#include "partition/policy.hpp"
#include "partition/schedule.hpp"
#include "partition/validate.hpp"
#include "tests/partition/plan_test_util.hpp"
#include "tests/scratch.hpp"

using namespace hetflow;
using namespace hetflow::partition;

namespace {

using test_support::plan_of;

model::Network small_gpt(model::Precision precision = model::Precision::fp16) {
  return model::network_from_spec("gpt:layers=8,hidden=1024,heads=16,seq=1024", precision);
}

std::string first_problem(const Plan& plan) {
  const Validation v = validate_plan(plan);
  return v.ok() ? "valid" : v.problems.front();
}

void expect_round_trip(const Plan& plan, const std::string& what) {
  EXPECT_EQ(first_problem(plan), "valid") << what;
  const std::string json = write_plan_json(plan);
  const Plan back = read_plan_json(json, "plan.json");
  EXPECT_TRUE(same_plan(back, plan)) << what;
  EXPECT_EQ(write_plan_json(back), json) << what;
}

}  // namespace

TEST(PlanFormat, EveryScheduleAndParallelismRoundTrips) {
  const model::Cluster cluster = test_support::identical_cluster(8, 2);
  for (const Schedule& schedule : schedules()) {
    for (const int tensor : {1, 2}) {
      for (const bool sp : {false, true}) {
        if (sp && tensor == 1) continue;
        for (const Recompute recompute : {Recompute::none, Recompute::selective, Recompute::full}) {
          PlanOptions o;
          o.schedule = schedule.name;
          o.tensor = tensor;
          o.sequence_parallel = sp;
          o.recompute = recompute;
          o.pipeline = 2;
          o.virtual_stages = schedule.interleaved ? 2 : 1;
          o.microbatches = 4;
          o.iterations = 2;
          const Plan plan = plan_of(cluster, small_gpt(), o);
          expect_round_trip(plan, schedule.name + " t" + std::to_string(tensor) + (sp ? " sp " : " ") +
                                      std::string(to_string(recompute)));
        }
      }
    }
  }
}

TEST(PlanFormat, EveryPolicyWithEverySyncRoundTrips) {
  const model::Cluster hetpipe = model::builtin_cluster("hetpipe-testbed");
  const model::Network vgg = model::network_from_spec("vgg19", model::Precision::fp16);
  for (const PolicyInfo& policy : policies()) {
    for (const SyncKind sync : {SyncKind::allreduce, SyncKind::ps, SyncKind::wsp}) {
      PlanOptions o;
      o.policy = policy.name;
      o.sync = sync;
      o.staleness = sync == SyncKind::wsp ? 1 : 0;
      o.iterations = 3;
      o.microbatches = 2;
      o.micro_batch = 8;
      if (policy.name == "uniform" || policy.name == "balanced") o.pipeline = 4;
      // Workers of unequal size, the other TITAN V and the RTX 2060 idle.
      if (policy.name == "grouped") o.groups = "*x2 TITAN-RTX, 1x(1 TITAN-V + 1 Quadro-P4000)";
      const Plan plan = plan_of(hetpipe, vgg, o);
      expect_round_trip(plan, policy.name + " " + std::string(to_string(sync)));
      if (sync == SyncKind::wsp) {  // staleness is an order edge one iteration further out
        EXPECT_TRUE(std::any_of(plan.order.begin(), plan.order.end(), [](const OrderEdge& e) { return e.offset == 2; }));
      }
    }
  }
}

// Kernel options travel in the plan, and only when they differ from Megatron's defaults, so
// plans made before them keep their fingerprints.
TEST(PlanFormat, KernelOptionsRoundTripAndDefaultsAreNotWritten) {
  PlanOptions o;
  o.pipeline = 2;
  o.microbatches = 2;
  const model::Cluster cluster = model::builtin_cluster("dgx-a100-x4");
  const model::Network gpt = model::network_from_spec("gpt:layers=4,hidden=256,heads=4,seq=128", model::Precision::bf16);
  const Plan plain = plan_of(cluster, gpt, o);
  EXPECT_EQ(write_plan_json(plain).find("\"kernels\""), std::string::npos);
  o.kernels.flash_attention = true;
  o.kernels.fused_bias_dropout_add = false;
  const Plan flash = plan_of(cluster, gpt, o);
  const std::string json = write_plan_json(flash);
  EXPECT_NE(json.find("\"kernels\""), std::string::npos);
  expect_round_trip(flash, "kernels");
  EXPECT_EQ(read_plan_json(json, "p.json").layout.kernels, o.kernels);
  EXPECT_NE(plan_fingerprint(flash), plan_fingerprint(plain));
  std::string bad = json;
  bad.replace(bad.find("\"flash_attention\":true"), 22, "\"flash_attention\":1   ");
  try {
    read_plan_json(bad, "bad.json");
    ADD_FAILURE() << "accepted";
  } catch (const InputError& e) {
    EXPECT_EQ(e.field(), "layout.kernels.flash_attention") << e.what();
  }
  // fused_adam is written only when off (kernels objects written before it lack it), and an
  // unfused step moves PyTorch's 22 fp32 accesses per parameter instead of 7: 60 bytes more.
  EXPECT_EQ(json.find("fused_adam"), std::string::npos);
  o.kernels.fused_adam = false;
  const Plan unfused = plan_of(cluster, gpt, o);
  EXPECT_NE(write_plan_json(unfused).find("\"fused_adam\":false"), std::string::npos);
  expect_round_trip(unfused, "unfused Adam");
  for (size_t t = 0; t < unfused.tasks.size(); ++t) {
    if (unfused.tasks[t].kind != TaskKind::optimizer) continue;
    EXPECT_DOUBLE_EQ(unfused.tasks[t].memory_bytes, flash.tasks[t].memory_bytes * (32.0 + 60) / 32);
  }
}

TEST(PlanFormat, OneIterationWhateverTheRunLength) {
  PlanOptions o;
  o.pipeline = 2;
  o.microbatches = 4;
  o.iterations = 1;
  const model::Cluster cluster = test_support::identical_cluster(4);
  const Plan one = plan_of(cluster, small_gpt(), o);
  o.iterations = 10;
  const Plan ten = plan_of(cluster, small_gpt(), o);
  EXPECT_EQ(ten.tasks.size(), one.tasks.size());
  EXPECT_EQ(ten.iterations(), 10);
  const double one_bytes = static_cast<double>(write_plan_json(one).size());
  EXPECT_LT(static_cast<double>(write_plan_json(ten).size()) / one_bytes, 1.10);
  // The back ends unroll: ten iterations take ten steady iterations' time, no more.
  const CostModel cost(cluster, model::Precision::fp16);
  const Estimate e1 = estimate_plan(one, cost), e10 = estimate_plan(ten, cost);
  EXPECT_LE(e10.makespan_s, 10 * e1.makespan_s * (1 + 1e-12));
  EXPECT_GT(e10.makespan_s, 9 * e10.iteration_time_s);
}

TEST(PlanFormat, APlanEmbedsWhatAnExecutorNeeds) {
  PlanOptions o;
  o.pipeline = 2;
  o.microbatches = 2;
  const model::Network net = model::network_from_spec("llama2-7b", model::Precision::bf16);
  const Plan plan = plan_of(test_support::identical_cluster(4), net, o);
  const Plan back = read_plan_json(write_plan_json(plan), "p.json");
  ASSERT_TRUE(back.network.architecture.has_value());
  const model::TransformerConfig& a = *back.network.architecture;
  EXPECT_EQ(a.layers, 32);
  EXPECT_EQ(a.hidden, 4096);
  EXPECT_EQ(a.heads, 32);
  EXPECT_TRUE(a.gated_mlp);
  EXPECT_TRUE(a.rms_norm);
  EXPECT_EQ(back.network.tokens_per_sample, 4096);
  EXPECT_EQ(back.network, net);
  EXPECT_EQ(back.fingerprint, plan_fingerprint(plan));
  // A plan made again from the same inputs has the same fingerprint; another does not.
  EXPECT_EQ(plan_fingerprint(plan_of(test_support::identical_cluster(4), net, o)), back.fingerprint);
  o.microbatches = 3;
  EXPECT_NE(plan_fingerprint(plan_of(test_support::identical_cluster(4), net, o)), back.fingerprint);
}

// An all-to-all (the expert axis's dispatch and combine) keeps its uneven parts: written,
// read, written again the same.
TEST(PlanFormat, AnAllToAllsPartsRoundTrip) {
  PlanOptions o;
  o.tensor = 2;
  o.pipeline = 2;
  o.data = 1;
  o.microbatches = 2;
  Plan plan = plan_of(test_support::identical_cluster(4), small_gpt(), o);
  for (Collective& c : plan.collectives) {
    if (!c.in_task()) continue;
    c.kind = CollectiveKind::all_to_all;
    c.algorithm = CollectiveAlgorithm::pairwise;
    c.parts = {0.75, 0.25};
    break;
  }
  const std::string json = write_plan_json(plan);
  EXPECT_NE(json.find("\"kind\": \"all_to_all\", \"algorithm\": \"pairwise\""), std::string::npos);
  EXPECT_NE(json.find("\"parts\": [0.75,0.25]"), std::string::npos);
  const Plan back = read_plan_json(json, "plan.json");
  EXPECT_TRUE(same_plan(back, plan));
  EXPECT_EQ(write_plan_json(back), json);
}

TEST(PlanFormat, CollectivesHaveTheirRealKinds) {
  const model::Network net = small_gpt();
  // (kind, purpose, in-task) -> messages
  auto kinds = [&](bool sp) {
    PlanOptions o;
    o.tensor = 2;
    o.sequence_parallel = sp;
    o.pipeline = 2;
    o.data = 1;
    o.microbatches = 2;
    const Plan plan = plan_of(test_support::identical_cluster(4), net, o);
    std::map<std::tuple<CollectiveKind, Purpose, bool>, int> count;
    for (const Collective& c : plan.collectives) {
      if (c.purpose == Purpose::tensor_parallel || c.purpose == Purpose::sequence_parallel) {
        count[{c.kind, c.purpose, c.in_task()}] += c.messages;
      }
    }
    return count;
  };
  // Tensor parallel: all-reduces inside the passes; the scattered boundary rebuilt by an
  // all-gather task on the receiving stage (2 micro-batches x (forward into stage 1 +
  // backward into stage 0)).
  const auto tp = kinds(false);
  EXPECT_GT((tp.at({CollectiveKind::all_reduce, Purpose::tensor_parallel, true})), 0);
  EXPECT_EQ((tp.at({CollectiveKind::all_gather, Purpose::tensor_parallel, false})), 2 * 2);
  EXPECT_EQ(tp.size(), 2U);
  // Sequence parallel: all-gathers and reduce-scatters inside the passes, the loss's and the
  // norms' all-reduces; shards need no rebuild, and no collective is a task of its own.
  const auto sp = kinds(true);
  EXPECT_GT((sp.at({CollectiveKind::reduce_scatter, Purpose::sequence_parallel, true})), 0);
  EXPECT_GT((sp.at({CollectiveKind::all_gather, Purpose::sequence_parallel, true})), 0);
  EXPECT_GT((sp.at({CollectiveKind::all_reduce, Purpose::tensor_parallel, true})), 0);
  for (const auto& [key, messages] : sp) EXPECT_TRUE(std::get<2>(key)) << to_string(std::get<0>(key));
}

// Megatron's tensor-parallel operators, per layer and pass, from the layer's kind and sizes
// (not from the network's tp_ fields): g, the all-reduce of a row-parallel output in the
// forward (two s h per decoder layer, s h for the vocab-parallel embedding), and f, the
// all-reduce of a column-parallel input's gradient in the backward (two s h per decoder
// layer, s h for the LM head). Elements per sample, and how many collectives.
struct MegatronOperators {
  double g_elems = 0, f_elems = 0;
  int g_count = 0, f_count = 0;
  double rerun_g_elems = 0;  // g of the layers full recomputation runs again: not the embedding
  int rerun_g_count = 0;
  double loss_elems = 0;  // under sequence parallelism: the loss's all-reduces
  double gain_elems = 0;  // under sequence parallelism: LayerNorm weights and biases, summed once a step
};
MegatronOperators megatron_operators(const model::Network& net, int layer_begin, int layer_end,
                                     bool sequence_parallel = false) {
  MegatronOperators m;
  for (int l = layer_begin; l < layer_end; ++l) {
    const model::Layer& layer = net.layers[static_cast<size_t>(l)];
    const double sh = layer.kind == "head" ? net.layers[static_cast<size_t>(l) - 1].output_elems : layer.output_elems;
    if (sequence_parallel && layer.kind != "embedding") m.gain_elems += 2 * (layer.kind == "head" ? 1 : 2) * (sh / net.architecture->seq);
    if (layer.kind == "transformer") {
      m.g_elems += 2 * sh;
      m.f_elems += 2 * sh;
      m.g_count += 2;
      m.f_count += 2;
      m.rerun_g_elems += 2 * sh;
      m.rerun_g_count += 2;
    } else if (layer.kind == "embedding") {
      m.g_elems += sh;
      m.g_count += 1;
    } else if (layer.kind == "head") {
      m.f_elems += sh;
      m.f_count += 1;
      // The vocab-parallel cross-entropy: each token's maximum, then its sum of exponentials
      // and target logit (3 values) in two all-reduces; rerun with the head's forward. Under
      // sequence parallelism still all-reduces, apart (loss_elems).
      const double tokens = net.architecture->seq;
      (sequence_parallel ? m.loss_elems : m.g_elems) += 3 * tokens;
      m.g_count += sequence_parallel ? 0 : 2;
      if (!sequence_parallel) {
        m.rerun_g_elems += 3 * tokens;
        m.rerun_g_count += 2;
      }
    }
  }
  return m;
}

// Each tensor-parallel pass performs Megatron's all-reduces of that pass inside its compute
// task: g in a forward, f in a backward, under full recomputation the rerun layers' g again
// (the transformer layers'; the embedding's output is the checkpoint); one message per
// collective, read back as written.
TEST(PlanFormat, TensorParallelCollectivesCarryMegatronsAllReducesOfEachPass) {
  const model::Network net = small_gpt();
  const double mbs = 1, e = 2;  // one sample per micro-batch, fp16
  for (const Recompute r : {Recompute::none, Recompute::full}) {
    PlanOptions o;
    o.tensor = 2;
    o.pipeline = 2;
    o.data = 1;
    o.microbatches = 2;
    o.micro_batch = 1;
    o.recompute = r;
    const Plan plan = plan_of(test_support::identical_cluster(4), net, o);
    const Plan back = read_plan_json(write_plan_json(plan), "p.json");
    EXPECT_EQ(back.collectives, plan.collectives);
    std::map<TaskKind, int> checked;
    for (size_t i = 0; i < plan.tasks.size(); ++i) {
      const Task& t = plan.tasks[i];
      if (t.kind != TaskKind::forward && t.kind != TaskKind::backward) continue;
      const Stage& s = plan.layout.workers[0].stages[static_cast<size_t>(t.stage)];
      const MegatronOperators m = megatron_operators(net, s.layer_begin, s.layer_end);
      double elems = m.g_elems;
      int count = m.g_count;
      if (t.kind == TaskKind::backward) {
        elems = m.f_elems + (r == Recompute::full ? m.rerun_g_elems : 0);
        count = m.f_count + (r == Recompute::full ? m.rerun_g_count : 0);
      }
      double bytes = 0;
      int messages = 0;
      for (const InTaskCall& call : plan.inside(static_cast<int>(i))) {
        const Collective& c = plan.collective(call.collective);
        EXPECT_EQ(c.kind, CollectiveKind::all_reduce);
        bytes += c.bytes / c.messages;
        ++messages;
      }
      EXPECT_DOUBLE_EQ(bytes, elems * mbs * e) << describe_task(plan, static_cast<int>(i));
      EXPECT_EQ(messages, count) << describe_task(plan, static_cast<int>(i));
      ++checked[t.kind];
    }
    EXPECT_EQ(checked[TaskKind::forward], 2 * 2 * 2);  // 2 chunks x 2 micro-batches x 2 ranks
    EXPECT_EQ(checked[TaskKind::backward], 2 * 2 * 2);
  }
}

// Korthikanti et al. (2022), section 4.2.2: a reduce-scatter and an all-gather move what one
// all-reduce moves, 2 (t-1)/t S per rank, except that the backward gathers the sequence-
// sharded inputs of the column-parallel GEMMs again for their weight gradients (only the shard
// is stashed), (t-1)/t F more. Over one pass each way of the whole model on t = 2 ranks.
TEST(PlanFormat, SequenceParallelMovesWhatTheAllReduceMovedAndGathersAgain) {
  const model::Network net = small_gpt();
  const int t = 2;
  const double mbs = 1, e = 2;
  auto tp_bytes = [&](bool sp, Recompute r) {
    PlanOptions o;
    o.tensor = t;
    o.sequence_parallel = sp;
    o.pipeline = 1;
    o.data = 1;
    o.microbatches = 1;
    o.micro_batch = 1;
    o.recompute = r;
    const Plan plan = plan_of(test_support::identical_cluster(t), net, o);
    double sent = 0;
    for (const Collective& c : plan.collectives) {
      if (c.purpose == Purpose::tensor_parallel || c.purpose == Purpose::sequence_parallel) {
        sent += bytes_sent(collective_spec(plan, c), plan.members(c).front(), [](int) { return 0; });
      }
    }
    return sent;
  };
  const MegatronOperators m = megatron_operators(net, 0, static_cast<int>(net.layers.size()));
  const MegatronOperators m_sp = megatron_operators(net, 0, static_cast<int>(net.layers.size()), true);
  const double G = m.g_elems * mbs * e, F = m.f_elems * mbs * e, share = (t - 1.0) / t;
  const double G_sp = m_sp.g_elems * mbs * e;
  // Under sequence parallelism the loss is still all-reduced, and once a step the LayerNorms'
  // gains (each rank saw its own rows) are summed.
  const double L = m_sp.loss_elems * mbs * e, gains = m_sp.gain_elems * e;
  EXPECT_DOUBLE_EQ(tp_bytes(false, Recompute::none), 2 * share * (G + F));
  EXPECT_DOUBLE_EQ(tp_bytes(true, Recompute::none), share * (2 * G_sp + 3 * F + 2 * L + 2 * gains));
  // Full recomputation runs the rerun layers' forward collectives again inside the backward:
  // the transformer layers' g, and every f (the LM head's forward is rerun too).
  const double rerun_G = m.rerun_g_elems * mbs * e, rerun_G_sp = m_sp.rerun_g_elems * mbs * e;
  EXPECT_DOUBLE_EQ(tp_bytes(false, Recompute::full), 2 * share * (G + F + rerun_G));
  EXPECT_DOUBLE_EQ(tp_bytes(true, Recompute::full), share * (2 * G_sp + 4 * F + rerun_G_sp + 4 * L + 2 * gains));
}

// Under sequence parallelism a chunk's compute reads its rank's shard of the boundary and
// writes its shard of the input gradient: no whole boundary is gathered into memory. The
// all-gathers the compute needs between its layers run inside it. A chunk of the LM head
// alone runs them too: its f (the norm's output, gathered before the vocabulary-parallel
// logits, and again in the backward for the weight gradient) is the only traffic of its passes.
TEST(PlanFormat, SequenceParallelChunksComputeOnTheirShards) {
  const model::Network net = model::network_from_spec("gpt:layers=4,hidden=1024,heads=16,seq=1024", model::Precision::fp16);
  PlanOptions o;
  o.tensor = 2;
  o.sequence_parallel = true;
  o.pipeline = 3;
  o.stage_layers = {1, 4, 1};  // the embedding, the blocks, the head
  o.data = 1;
  o.microbatches = 3;
  o.recompute = Recompute::full;
  const Plan plan = plan_of(test_support::identical_cluster(6), net, o);
  EXPECT_EQ(first_problem(plan), "valid");
  const double whole = net.cut_bytes(1);  // a boundary's bytes (micro-batch 1)
  std::map<std::pair<int, TaskKind>, int> gathers;  // (stage, pass) -> all-gather messages, over the micro-batches
  for (size_t i = 0; i < plan.tasks.size(); ++i) {
    const int id = static_cast<int>(i);
    const Task& t = plan.tasks[i];
    EXPECT_FALSE(t.kind == TaskKind::collective && t.purpose == Purpose::sequence_parallel) << describe_task(plan, id);
    if (t.kind != TaskKind::forward && t.kind != TaskKind::backward) continue;
    for (const int r : plan.reads(id)) {
      const Tensor& x = plan.tensor(r);
      if (x.kind == TensorKind::activation || x.kind == TensorKind::activation_grad) {
        EXPECT_DOUBLE_EQ(x.bytes, whole / 2) << describe_task(plan, id);
      }
    }
    for (const int w : plan.writes(id)) {
      const Tensor& x = plan.tensor(w);
      EXPECT_NE(x.kind, TensorKind::partial_sum) << describe_task(plan, id);
      if (x.kind == TensorKind::activation_grad) {
        EXPECT_DOUBLE_EQ(x.bytes, whole / 2) << describe_task(plan, id);
      }
    }
    if (plan.coords_of(t.device)[Axis::tensor] != 0) continue;
    for (const InTaskCall& call : plan.inside(id)) {
      if (plan.collective(call.collective).kind == CollectiveKind::all_gather) ++gathers[{t.stage, t.kind}];
    }
  }
  // Per micro-batch (x 3): the embedding's forward gathers nothing (its f is 0), its backward
  // the output gradient; each block 2 forward and, rerun first, 2 + 4 backward; the head 1
  // forward and 1 + 1 backward.
  const std::map<std::pair<int, TaskKind>, int> want{{{0, TaskKind::backward}, 3 * 1}, {{1, TaskKind::forward}, 3 * 8},
                                                     {{1, TaskKind::backward}, 3 * 24}, {{2, TaskKind::forward}, 3 * 1},
                                                     {{2, TaskKind::backward}, 3 * 2}};
  EXPECT_EQ(gathers, want);
}

TEST(PlanFormat, TiedEmbeddingsAreAllReducedBetweenFirstAndLastStage) {
  PlanOptions o;
  o.pipeline = 4;
  o.data = 2;
  o.microbatches = 4;
  const model::Network net = small_gpt();  // GPT: the LM head reuses the word embedding
  const Plan plan = plan_of(test_support::identical_cluster(8), net, o);
  std::vector<const Collective*> tied;
  for (const Collective& c : plan.collectives) {
    if (c.purpose == Purpose::embedding) tied.push_back(&c);
  }
  ASSERT_EQ(tied.size(), 2U);  // one per virtual worker
  for (size_t w = 0; w < 2; ++w) {
    const VirtualWorker& vw = plan.layout.workers[w];
    EXPECT_EQ(plan.members(*tied[w]), (std::vector<int>{vw.ranks.front()[0], vw.ranks.back()[0]}));
    EXPECT_EQ(tied[w]->kind, CollectiveKind::all_reduce);
    EXPECT_DOUBLE_EQ(tied[w]->bytes, net.layers.back().tied_params * 2);  // fp16 gradients of the word embedding
  }
  // Each tensor-parallel group and data-parallel group is one communicator, used by all its collectives.
  std::set<std::vector<int>> groups;
  for (const Communicator& c : plan.communicators) EXPECT_TRUE(groups.insert(c.devices).second) << c.name;
}

// A chunk holding both ends of a GPT holds its tied word embedding once, and pushes its
// gradient once: the pushes of a device add up to its gradient buffer (they were one copy
// more, and validation refused the plan with the server on another device).
TEST(PlanFormat, ParameterServerPushesEachChunksGradientsOnce) {
  PlanOptions o;
  o.pipeline = 1;
  o.data = 2;
  o.sync = SyncKind::ps;
  const model::Network net = small_gpt();
  const Plan plan = plan_of(model::builtin_cluster("hetpipe-testbed"), net, o);
  EXPECT_EQ(first_problem(plan), "valid");
  std::map<int, double> pushed;
  for (const Task& t : plan.tasks) {
    if (t.kind == TaskKind::send && t.purpose == Purpose::ps_push) pushed[t.device] += t.bytes;
  }
  ASSERT_FALSE(pushed.empty());
  double params = 0;  // the whole network once: its embedding and LM head share one matrix
  for (const model::Layer& l : net.layers) params += l.params;
  for (const auto& [device, bytes] : pushed) EXPECT_DOUBLE_EQ(bytes, params * 2) << plan.device_name(device);
  // A server's next update waits for every pull of this one to be sent: the weights are never
  // overwritten while they travel (a race the executor's sanitizer found under WSP).
  int pulls = 0;
  for (size_t t = 0; t < plan.tasks.size(); ++t) {
    if (plan.tasks[t].kind != TaskKind::send || plan.tasks[t].purpose != Purpose::ps_pull) continue;
    ++pulls;
    bool guarded = false;
    for (const OrderEdge& e : plan.order) {
      guarded = guarded || (e.from == static_cast<int>(t) && e.offset == 1 && plan.task(e.to).kind == TaskKind::optimizer &&
                            plan.task(e.to).device == plan.tasks[t].device);
    }
    EXPECT_TRUE(guarded) << "pull " << t;
  }
  EXPECT_GT(pulls, 0);
}

TEST(PlanFormat, ActivationMemoryFromLifetimesIsKorthikantis) {
  // 1F1B on p stages: rank r holds p - r micro-batches' stashes at its peak, each the sum of
  // its layers' s b h (34 + 5 a s / h) (Korthikanti et al. 2022, table 2); tensor and sequence
  // parallelism divide it by t. What lifetimes add on top are boundary buffers.
  const model::Network net = model::network_from_spec("gpt:layers=8,hidden=1024,heads=16,seq=1024", model::Precision::fp16);
  const double s = 1024, h = 1024, a = 16, b = 1;
  for (const int t : {1, 2}) {
    PlanOptions o;
    o.pipeline = 4;
    o.tensor = t;
    o.sequence_parallel = t > 1;
    o.data = 1;
    o.microbatches = 8;
    const Plan plan = plan_of(test_support::identical_cluster(8), net, o);
    ASSERT_EQ(first_problem(plan), "valid");
    for (int r = 1; r < 3; ++r) {  // middle stages: two transformer layers each, no embedding or head
      const int d = plan.layout.workers[0].ranks[static_cast<size_t>(r)][0];
      const DeviceMemory& m = plan.memory[static_cast<size_t>(d)];
      const double per_layer = s * b * h * (34 + 5 * a * s / h) / t;
      EXPECT_EQ(m.peak_in_flight, 4 - r) << "t=" << t << " rank " << r;
      EXPECT_DOUBLE_EQ(m.activations_bytes, (4 - r) * 2 * per_layer) << "t=" << t << " rank " << r;
      // Buffers: boundary activations and gradients alive then (a sequence-parallel rank
      // holds their shards, and the whole partial sums of a forward): a few boundaries.
      const double boundary = s * b * h * 2;
      EXPECT_GT(m.buffers_bytes, 0);
      EXPECT_LE(m.buffers_bytes, 3 * boundary) << "t=" << t << " rank " << r;
    }
  }
}

namespace {

// Worker 0 runs stages of tensor-parallel degrees 1, 2, 4 and 2; worker 1 of degrees 2 and 1.
// Layers 0-1 are held at degrees 1 (worker 0) and 2 (worker 1), layer 2 at 2 and 2, layer 3
// at 2 and 1, layer 4 at 4 and 1, the head (layer 5, tied to the embedding) at 2 and 1.
const char* kMixedDegrees = R"(workers:
  - microbatches: 4
    stages:
      - {devices: [n-0/gpu0], layers: 0-1}
      - {devices: [n-0/gpu1, n-0/gpu2], layers: 2-3}
      - {devices: [n-1/gpu0, n-1/gpu1, n-1/gpu2, n-1/gpu3], layers: 4}
      - {devices: [n-0/gpu3, n-2/gpu3], layers: 5}
  - microbatches: 3
    stages:
      - {devices: [n-2/gpu0, n-2/gpu1], layers: 0-2}
      - {devices: [n-2/gpu2], layers: 3-5}
)";

Plan mixed_degree_plan(PlanOptions o = {}) {
  static const model::Cluster cluster = test_support::identical_cluster(4, 3);
  static const model::Network net =
      model::network_from_spec("gpt:layers=4,hidden=256,heads=8,seq=128", model::Precision::fp16);
  o.layout_file = test_support::write_file("mixed-degrees.yaml", kMixedDegrees);
  return plan_of(cluster, net, o);
}

}  // namespace

TEST(PlanFormat, StagesOfDifferentTensorDegreesRoundTrip) {
  for (const std::string schedule : {"gpipe", "1f1b", "1f1b-split-w"}) {
    for (const SyncKind sync : {SyncKind::allreduce, SyncKind::ps, SyncKind::wsp}) {
      for (const Recompute recompute : {Recompute::none, Recompute::full}) {
        PlanOptions o;
        o.schedule = schedule;
        o.sync = sync;
        o.recompute = recompute;
        o.micro_batch = 2;
        const Plan plan = mixed_degree_plan(o);
        const std::string what = schedule + " " + std::string(to_string(sync)) + " " + std::string(to_string(recompute));
        EXPECT_EQ(plan.layout.size(Axis::tensor), 4) << what;  // the largest stage's
        expect_round_trip(plan, what);
        const Estimate e = estimate_plan(plan, CostModel(plan.cluster, plan.network.precision));
        EXPECT_GT(e.iteration_time_s, 0) << what;
      }
    }
  }
}

TEST(PlanFormat, EveryRankOfTheNextStageGetsTheWholeBoundary) {
  const Plan plan = mixed_degree_plan();
  const double mbs = plan.layout.micro_batch_size;
  const std::vector<std::vector<int>> readers = plan.consumers();
  // What reaches each receiving device, per direction, worker and micro-batch: its receive,
  // plus what the all-gather of its group brings from the other t - 1 ranks.
  std::map<std::tuple<Purpose, int, int, int>, double> reached;
  std::map<std::tuple<Purpose, int, int, int>, double> whole;
  for (size_t i = 0; i < plan.tasks.size(); ++i) {
    const Task& r = plan.tasks[i];
    if (r.kind != TaskKind::recv || (r.purpose != Purpose::activation && r.purpose != Purpose::gradient)) continue;
    const auto key = std::make_tuple(r.purpose, r.worker, r.microbatch, r.device);
    EXPECT_EQ(reached.count(key), 0U) << "two receives into one device for one micro-batch";
    double bytes = r.bytes;
    const int received = plan.writes(static_cast<int>(i)).front();
    for (int reader : readers[static_cast<size_t>(received)]) {
      const Task& g = plan.tasks[static_cast<size_t>(reader)];
      if (g.kind != TaskKind::collective) continue;
      const Collective& c = plan.collectives[static_cast<size_t>(g.collective)];
      ASSERT_EQ(c.kind, CollectiveKind::all_gather);
      const double t = static_cast<double>(plan.members(c).size());
      bytes += c.bytes * (t - 1) / t;  // all_gather bytes: the output each ends with
    }
    reached[key] = bytes;
    // The boundary after the sending chunk (forward) or before it (backward), from the network.
    whole[key] = plan.network.cut_bytes(static_cast<size_t>(r.purpose == Purpose::activation ? r.layer_end : r.layer_begin)) * mbs;
  }
  for (const auto& [key, bytes] : reached) EXPECT_NEAR(bytes, whole.at(key), 1e-9 * bytes);
  // Every device of every receiving stage, for every micro-batch and direction.
  size_t expected = 0;
  for (const VirtualWorker& w : plan.layout.workers) {
    for (size_t k = 0; k < w.stages.size(); ++k) {
      const size_t directions = (k > 0 ? 1 : 0) + (k + 1 < w.stages.size() ? 1 : 0);
      expected += directions * static_cast<size_t>(w.tensor_of(k) * w.microbatches);
    }
  }
  EXPECT_EQ(reached.size(), expected);
  EXPECT_EQ(expected, (1 + 2 * 2 + 2 * 4 + 2) * 4 + (2 + 1) * 3U);
}

TEST(PlanFormat, DataParallelPiecesAddUpToEachLayersParameters) {
  const Plan plan = mixed_degree_plan();
  const model::Network& net = plan.network;
  const double e = model::element_bytes(plan.layout.precision);
  std::map<std::pair<int, int>, double> by_range;  // all-reduced bytes per layer range
  std::map<std::pair<int, int>, int> collectives;
  std::map<int, double> by_device, tied_by_device;
  std::map<int, double> tied_by_worker;
  std::map<std::pair<int, std::pair<int, int>>, int> pieces_of;  // (device, layer range): pieces it is in
  for (const Collective& c : plan.collectives) {
    const Task& first = plan.tasks[static_cast<size_t>(c.tasks.front())];
    if (c.purpose == Purpose::data_parallel) {
      by_range[{first.layer_begin, first.layer_end}] += c.bytes;
      ++collectives[{first.layer_begin, first.layer_end}];
      for (int task : c.tasks) {
        by_device[plan.tasks[static_cast<size_t>(task)].device] += c.bytes;
        ++pieces_of[{plan.tasks[static_cast<size_t>(task)].device, {first.layer_begin, first.layer_end}}];
      }
    } else if (c.purpose == Purpose::embedding) {
      EXPECT_EQ(c.tasks.size(), 2U);
      tied_by_worker[first.worker] += c.bytes;
      for (int task : c.tasks) tied_by_device[plan.tasks[static_cast<size_t>(task)].device] += c.bytes;
    }
  }
  // The oracle, from the network: a range's parameters (a range without layer 0 keeps its own
  // copy of the tied embedding), each layer in one range; the parameters every rank holds
  // whole (norms, biases after a row-parallel sum, positions: the empty part of the split)
  // go with every piece.
  std::vector<int> covered(net.layers.size(), 0);
  std::map<std::pair<int, int>, double> replicated_of;  // per range
  for (const auto& [range, bytes] : by_range) {
    double params = 0, replicated = 0;
    for (int l = range.first; l < range.second; ++l) {
      const model::Layer& layer = net.layers[static_cast<size_t>(l)];
      params += layer.params + (range.first > 0 ? layer.tied_params : 0);
      replicated += shard_params(net, l, range.first, SplitPart{0, 1, 0, 1}).value();
      ++covered[static_cast<size_t>(l)];
    }
    replicated_of[range] = replicated;
    const int pieces = collectives[range];  // (one bucket a piece here)
    EXPECT_NEAR(bytes, (params + (pieces - 1) * replicated) * e, 1e-9 * bytes)
        << "layers " << range.first << "-" << range.second - 1;
  }
  EXPECT_EQ(covered, std::vector<int>(net.layers.size(), 1));
  // Degrees 1 and 2 (layers 0-1): two halves; 2 and 2 (layer 2): two; 2 and 1 (layer 3): two;
  // 4 and 1 (layer 4): four quarters; 2 and 1 (head): two. Buckets of 25 MiB hold each.
  EXPECT_EQ(collectives, (std::map<std::pair<int, int>, int>{{{0, 2}, 2}, {{2, 3}, 2}, {{3, 4}, 2}, {{4, 5}, 4}, {{5, 6}, 2}}));
  // Each device all-reduces exactly its gradient buffer, and its replicated parameters once
  // more for each further piece of a range it is in.
  std::map<int, double> grads;
  for (const Tensor& t : plan.tensors) {
    if (t.kind == TensorKind::weight_grad) grads[t.device] += t.bytes;
  }
  for (const auto& [key, pieces] : pieces_of) grads[key.first] += (pieces - 1) * replicated_of[key.second] * e;
  ASSERT_EQ(by_device.size(), grads.size());
  for (const auto& [device, bytes] : grads) EXPECT_NEAR(by_device[device], bytes, 1e-9 * bytes) << plan.device_names[static_cast<size_t>(device)];
  // The tied embedding: all of it between each worker's first and last stage, each device its
  // share: rank j of 2 holds vocabulary rows [V j / 2, V (j + 1) / 2) (Megatron's split).
  const double tied = net.layers.back().tied_params * e;
  EXPECT_EQ(tied_by_worker, (std::map<int, double>{{0, tied}, {1, tied}}));
  const std::int64_t V = net.architecture->vocab;
  const double row_bytes = net.architecture->hidden * e;
  const double half0 = static_cast<double>(V / 2) * row_bytes, half1 = static_cast<double>(V - V / 2) * row_bytes;
  ASSERT_NE(half0, half1);  // an odd vocabulary: the halves differ
  const std::map<int, double> tied_share{{0, tied}, {3, half0}, {11, half1},   // worker 0: 1 device, then 2
                                         {8, half0}, {9, half1}, {10, tied}};  // worker 1: 2, then 1
  EXPECT_EQ(tied_by_device, tied_share);
}

TEST(PlanFormat, EachDeviceHoldsItsStagesShareOfTheWeights) {
  const Plan plan = mixed_degree_plan();
  const model::Network& net = plan.network;
  const double e = model::element_bytes(plan.layout.precision);
  const auto params = [&](int begin, int end) {
    double p = 0;
    for (int l = begin; l < end; ++l) p += net.layers[static_cast<size_t>(l)].params + (begin > 0 ? net.layers[static_cast<size_t>(l)].tied_params : 0);
    return p;
  };
  // What every rank holds whole: norms, biases added after a row-parallel sum (the empty part
  // of the split). Blocks split evenly here (heads, MLP columns divide by 2 and 4).
  const auto replicated = [&](int begin, int end) {
    double p = 0;
    for (int l = begin; l < end; ++l) p += shard_params(net, l, begin, SplitPart{0, 1, 0, 1}).value();
    return p;
  };
  const auto share = [&](int begin, int end, int t) { return (params(begin, end) - replicated(begin, end)) / t + replicated(begin, end); };
  // n-1/gpu0 (device 4) holds a quarter of layer 4; n-2/gpu2 (10) all of layers 3-5; n-0/gpu1 (1) half of 2-3.
  EXPECT_DOUBLE_EQ(plan.memory[4].weights_bytes, share(4, 5, 4) * e);
  EXPECT_DOUBLE_EQ(plan.memory[10].weights_bytes, params(3, 6) * e);
  EXPECT_NEAR(plan.memory[1].weights_bytes, share(2, 4, 2) * e, 1e-9 * plan.memory[1].weights_bytes);
  // The closed form at each stage's own degree agrees with the plan's tensors: persistent
  // state exactly, stashed activations for the micro-batches the lifetimes found in flight.
  for (const VirtualWorker& w : plan.layout.workers) {
    for (size_t k = 0; k < w.stages.size(); ++k) {
      const auto& rank = w.ranks[static_cast<size_t>(w.stages[k].rank)];
      for (size_t j = 0; j < rank.size(); ++j) {
        const int d = rank[j];
        const DeviceMemory& m = plan.memory[static_cast<size_t>(d)];
        const DeviceMemory closed = device_memory(net, plan.layout, {w.stages[k]}, {m.peak_in_flight}, true,
                                                  m.capacity_bytes, w.tensor_of(k), static_cast<int>(j));
        const std::string where = plan.device_names[static_cast<size_t>(d)];
        EXPECT_DOUBLE_EQ(closed.weights_bytes, m.weights_bytes) << where;
        EXPECT_DOUBLE_EQ(closed.gradients_bytes, m.gradients_bytes) << where;
        EXPECT_DOUBLE_EQ(closed.optimizer_bytes, m.optimizer_bytes) << where;
        EXPECT_NEAR(closed.activations_bytes, m.activations_bytes, 1e-9 * m.activations_bytes) << where;
      }
    }
  }
  // Forward work too: each device of a stage computes 1/t of its layers.
  for (const Task& t : plan.tasks) {
    if (t.kind != TaskKind::forward || t.microbatch != 0) continue;
    const VirtualWorker& w = plan.layout.workers[static_cast<size_t>(t.worker)];
    double flops = 0;
    for (int l = t.layer_begin; l < t.layer_end; ++l) flops += net.layers[static_cast<size_t>(l)].forward_flops;
    EXPECT_NEAR(t.flops, flops * plan.layout.micro_batch_size / w.tensor_of(static_cast<size_t>(t.stage)), 1e-9 * t.flops);
  }
}

// Full recomputation keeps each layer's input and rebuilds one layer's activations during a
// backward: the closed form adds that one-layer scratch (the largest layer's activations) to
// the stashes in flight, and the plan's tensors hold exactly that at their peak (1F1B: the
// first backward finds every stash of the warm-up still alive).
TEST(PlanFormat, FullRecomputationsScratchIsInTheClosedFormAndThePlan) {
  PlanOptions o;
  o.pipeline = 2;
  o.data = 1;
  o.microbatches = 4;
  o.recompute = Recompute::full;
  const model::Network net = small_gpt();
  const Plan plan = plan_of(test_support::identical_cluster(2), net, o);
  ASSERT_EQ(plan.layout.recompute, Recompute::full);
  const VirtualWorker& w = plan.layout.workers.front();
  for (size_t k = 0; k < w.stages.size(); ++k) {
    const int d = w.ranks[static_cast<size_t>(w.stages[k].rank)].front();
    const DeviceMemory& m = plan.memory[static_cast<size_t>(d)];
    const DeviceMemory closed = device_memory(net, plan.layout, {w.stages[k]}, {m.peak_in_flight}, true, m.capacity_bytes, 1);
    // The scratch alone: the largest layer's activations, as without recomputation.
    double scratch = 0, inputs = 0;
    for (int l = w.stages[k].layer_begin; l < w.stages[k].layer_end; ++l) {
      const model::Layer& layer = net.layers[static_cast<size_t>(l)];
      scratch = std::max(scratch, layer_activation_bytes(layer, plan.layout) * plan.layout.micro_batch_size);
      inputs += stashed_bytes_per_microbatch(layer, net, plan.layout, 1);
    }
    ASSERT_GT(scratch, 0);
    EXPECT_DOUBLE_EQ(closed.activations_bytes, m.peak_in_flight * inputs + scratch) << plan.device_names[static_cast<size_t>(d)];
    EXPECT_NEAR(closed.activations_bytes, m.activations_bytes, 1e-9 * m.activations_bytes)
        << plan.device_names[static_cast<size_t>(d)];
  }
}

// The large tables are converted while the file is read: a file may list them in any order,
// and an error in one of their elements names its line.
TEST(PlanFormat, TablesReadInAnyOrderAndErrorsNameTheirLine) {
  PlanOptions o;
  o.pipeline = 2;
  o.data = 2;
  const Plan plan = plan_of(model::builtin_cluster("dgx-a100-x4"), small_gpt(), o);
  const std::string text = write_plan_json(plan);

  nlohmann::ordered_json j = nlohmann::ordered_json::parse(text);
  nlohmann::ordered_json reordered;
  reordered["format"] = j["format"];
  reordered["version"] = j["version"];
  for (const char* key : {"programs", "order", "tasks", "tensors"}) reordered[key] = j[key];
  for (const auto& [key, value] : j.items()) {
    if (!reordered.contains(key) && key != "fingerprint") reordered[key] = value;
  }
  EXPECT_TRUE(same_plan(read_plan_json(reordered.dump(1), "reordered.json"), plan));

  // The line of tasks[3] in the written file, and an error planted there.
  size_t at = text.find("\n \"tasks\": [\n");
  for (int k = 0; k <= 3; ++k) at = text.find("\n  {", at + 1);
  const int line = 1 + static_cast<int>(std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(at) + 1, '\n'));
  std::string broken = text;
  const size_t kind = broken.find("\"kind\": \"", at) + 9;
  broken.replace(kind, broken.find('"', kind) - kind, "bogus");
  try {
    read_plan_json(broken, "p.json");
    ADD_FAILURE() << "a task of kind 'bogus' was read";
  } catch (const InputError& e) {
    EXPECT_EQ(e.field(), "tasks[3].kind") << e.what();
    EXPECT_EQ(e.line(), line) << e.what();
  }
}

// A folded plan (Layout::folded) round-trips and says so; a plan that is not folded writes
// no `folded` key, so its fingerprint is what it was before folding existed. Its replicas'
// devices hold what worker 0's do; a collective across replicas missing worker 0's member
// is refused.
TEST(PlanFormat, AFoldedPlanRoundTripsAndValidates) {
  const model::Cluster cluster = model::load_cluster("selene-4");
  PlanOptions o;
  o.tensor = 2;
  o.pipeline = 2;
  o.data = 8;
  o.microbatches = 2;
  const Plan whole = plan_of(cluster, small_gpt(), o);
  EXPECT_EQ(write_plan_json(whole).find("\"folded\""), std::string::npos);
  o.fold = true;
  Plan folded = plan_of(cluster, small_gpt(), o);
  ASSERT_TRUE(folded.layout.folded);
  expect_round_trip(folded, "folded");
  EXPECT_NE(plan_fingerprint(folded), plan_fingerprint(whole));
  for (size_t d = 0; d < whole.memory.size(); ++d) {
    EXPECT_NEAR(folded.memory[d].total_bytes(), whole.memory[d].total_bytes(), 1e-6 * whole.memory[d].total_bytes()) << d;
  }
  for (Collective& c : folded.collectives) {
    if (c.tasks.size() < folded.members(c).size()) {
      c.tasks.clear();  // no member at all
      break;
    }
  }
  EXPECT_NE(first_problem(folded), "valid");
}

// --overlap-grad-reduce: each bucket's order edge carries the part of the last backward it
// waits for, written as a fourth number only where there is one; read back exactly, and
// bad fractions are refused naming the edge.
TEST(PlanFormat, OverlappedGradientReductionRoundTripsWithItsFractions) {
  PlanOptions o;
  o.pipeline = 2;
  o.data = 2;
  o.microbatches = 2;
  o.bucket_bytes = 1 << 20;
  const model::Cluster cluster = model::builtin_cluster("dgx-a100-x4");
  const model::Network gpt = model::network_from_spec("gpt:layers=4,hidden=256,heads=4,seq=128", model::Precision::bf16);
  const Plan plain = plan_of(cluster, gpt, o);
  const std::string plain_json = write_plan_json(plain);
  EXPECT_EQ(plain_json.find("overlap_grad_reduce"), std::string::npos);
  for (const OrderEdge& e : plain.order) EXPECT_EQ(e.fraction, 1);
  o.overlap_grad_reduce = true;
  const Plan overlapped = plan_of(cluster, gpt, o);
  int parts = 0;
  for (const OrderEdge& e : overlapped.order) {
    if (e.fraction == 1) continue;
    ++parts;
    EXPECT_GT(e.fraction, 0);
    EXPECT_LT(e.fraction, 1);
    EXPECT_EQ(overlapped.task(e.from).kind, TaskKind::backward);
    EXPECT_EQ(overlapped.task(e.to).purpose, Purpose::data_parallel);
  }
  EXPECT_GT(parts, 4);
  expect_round_trip(overlapped, "overlap");
  const std::string json = write_plan_json(overlapped);
  EXPECT_TRUE(read_plan_json(json, "p.json").layout.sync.overlap_grad_reduce);
  // A fraction out of (0, 1), and one on an edge from a collective.
  const size_t at = json.find("\"order\"");
  const size_t edge = json.find(", 0.", at);  // the first fraction
  ASSERT_NE(edge, std::string::npos);
  std::string bad = json;
  bad.replace(edge, 4, ", 1.");
  try {
    read_plan_json(bad, "bad.json");
    ADD_FAILURE() << "accepted";
  } catch (const InputError& e) {
    EXPECT_NE(e.field().find("][3]"), std::string::npos) << e.what();
  }
  Plan from_collective = overlapped;
  for (OrderEdge& e : from_collective.order) {
    if (e.fraction < 1) {
      e.from = e.to;  // a data-parallel collective waiting for part of itself
      break;
    }
  }
  from_collective.finish();
  EXPECT_NE(first_problem(from_collective).find("only a compute task's work"), std::string::npos)
      << first_problem(from_collective);
}
