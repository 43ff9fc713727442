// Expert parallelism (--expert-parallel EP): groups of EP consecutive data-parallel replicas
// split each MoE layer's routed experts, exchange tokens by in-task all-to-alls, and sum
// gradients in two parts: the dense parameters over every replica, each expert rank's
// experts over the replicas holding them. Checked against hand counts of a small mixture:
// what each device holds, what the syncs carry, what ZeRO-1 shards, the all-to-alls' bytes
// and parts, the plan file's round trip, and the errors that name the option at fault.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <set>
#include <string>

#include "model/io.hpp"
#include "model/zoo.hpp"
#include "partition/expert_placement.hpp"
#include "partition/expert_shard.hpp"
#include "partition/layout_file.hpp"
#include "partition/plan_builder.hpp"
#include "partition/plan_io.hpp"
#include "partition/policy.hpp"
#include "partition/task_order.hpp"
#include "partition/validate.hpp"
#include "tests/partition/plan_test_util.hpp"

using namespace hetflow;
using namespace hetflow::partition;

namespace {

using test_support::error_of;
using test_support::plan_of;

// Two MoE layers of 8 experts (top-2), each expert 3 x 256 x 512 parameters.
const model::Network& mixture() {
  static const model::Network net = model::network_from_spec(
      "llama:layers=2,hidden=256,heads=8,kv_heads=4,ffn=512,vocab=1000,seq=256,experts=8,experts_per_token=2,"
      "expert_ffn=512",
      model::Precision::bf16);
  return net;
}

constexpr double kExpert = 3.0 * 256 * 512;

// Bytes each gradient sync carries (all-reduces, or ZeRO's reduce-scatters), by its members.
std::map<std::vector<int>, double> synced_bytes(const Plan& plan, int zero) {
  std::map<std::vector<int>, double> synced;
  for (const Collective& c : plan.collectives) {
    if (c.purpose != Purpose::data_parallel || c.in_task()) continue;
    if (c.kind != (zero ? CollectiveKind::reduce_scatter : CollectiveKind::all_reduce)) continue;
    synced[plan.communicator(c.communicator).devices] += c.bytes;
  }
  return synced;
}

PlanOptions options(int ep, int pipeline = 1) {
  PlanOptions o;
  o.experts.parallel = ep;
  o.pipeline = pipeline;
  o.microbatches = 2;
  return o;
}

}  // namespace

TEST(ExpertParallel, EachDeviceHoldsTheDensePartAndItsRanksExperts) {
  const model::Cluster cluster = test_support::identical_cluster(8);
  const Plan plan = plan_of(cluster, mixture(), options(4));
  ASSERT_TRUE(validate_plan(plan).ok()) << validate_plan(plan).problems.front();
  EXPECT_EQ(plan.layout.size(Axis::expert), 4);
  EXPECT_EQ(plan.layout.size(Axis::data), 8);
  const double routed = 2 * 8 * kExpert, whole = mixture().param_count();
  for (int d = 0; d < 8; ++d) {
    EXPECT_EQ(plan.coords[static_cast<size_t>(d)][Axis::expert], d % 4);
    double held = 0;
    for (const Tensor& t : plan.tensors) {
      if (t.kind == TensorKind::weight && t.device == d) held += t.bytes / 2;
    }
    EXPECT_DOUBLE_EQ(held, whole - routed + 2 * 2 * kExpert) << d;  // 2 of the 8 experts of each layer
  }
}

TEST(ExpertParallel, DenseGradientsSumOverEveryReplicaAndExpertsOverTheirHolders) {
  const model::Cluster cluster = test_support::identical_cluster(8);
  const double routed = 2 * 8 * kExpert, whole = mixture().param_count(), g = 2;
  for (const int zero : {0, 1}) {
    PlanOptions o = options(4);
    o.zero_stage = zero;
    const Plan plan = plan_of(cluster, mixture(), o);
    ASSERT_TRUE(validate_plan(plan).ok()) << validate_plan(plan).problems.front();
    const std::map<std::vector<int>, double> synced = synced_bytes(plan, zero);
    ASSERT_EQ(synced.size(), 5u) << "zero " << zero;
    EXPECT_DOUBLE_EQ(synced.at({0, 1, 2, 3, 4, 5, 6, 7}), (whole - routed) * g);
    for (int r = 0; r < 4; ++r) EXPECT_DOUBLE_EQ(synced.at({r, r + 4}), 2 * 2 * kExpert * g) << r;
    // ZeRO-1: every parameter is stepped once, on the replica whose shard holds it.
    if (zero == 1) {
      double stepped = 0;
      for (const Task& t : plan.tasks) {
        if (t.kind == TaskKind::optimizer) stepped += t.flops / 12;  // Adam: 12 FLOPs a parameter
      }
      EXPECT_NEAR(stepped, whole, 8);
    }
  }
}

TEST(ExpertParallel, EachMoeLayerExchangesItsTokensCopiesInTheRoutingsParts) {
  const model::Cluster cluster = test_support::identical_cluster(8);
  PlanOptions o = options(4);
  o.experts.routing = parse_routing("zipf:1", "test", "routing");
  const Plan plan = plan_of(cluster, mixture(), o);
  ASSERT_TRUE(validate_plan(plan).ok()) << validate_plan(plan).problems.front();
  const ExpertSplit split = expert_split(mixture(), plan.layout);
  std::map<TaskKind, int> exchanges;
  std::set<std::vector<int>> groups;
  for (const Collective& c : plan.collectives) {
    if (c.purpose != Purpose::expert_parallel) continue;
    ASSERT_TRUE(c.in_task());
    EXPECT_EQ(c.kind, CollectiveKind::all_to_all);
    EXPECT_EQ(c.algorithm, CollectiveAlgorithm::pairwise);
    EXPECT_EQ(c.parts, split.dispatch.parts);
    EXPECT_EQ(plan.communicator(c.communicator).role, CommRole::expert);
    groups.insert(plan.communicator(c.communicator).devices);
    // Two layers, dispatch and combine each: a sample's 256 tokens x 2 copies x 256 wide, bf16.
    EXPECT_EQ(c.messages, 4);
    EXPECT_DOUBLE_EQ(c.bytes, 4 * 256.0 * 2 * 256 * 2);
    exchanges[plan.task(c.tasks.front()).kind] += 1;
  }
  EXPECT_EQ(groups, (std::set<std::vector<int>>{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  // Per group and micro-batch, one in its forwards and one in its backwards.
  EXPECT_EQ(exchanges[TaskKind::forward], 2 * 2);
  EXPECT_EQ(exchanges[TaskKind::backward], 2 * 2);
  // The busiest rank's forwards compute its load's routed FLOPs.
  double even = 0, busiest = 0;
  for (const Task& t : plan.tasks) {
    if (t.kind != TaskKind::forward || t.microbatch != 0) continue;
    if (t.worker == 4 + 1) even = t.flops;  // rank 1 of the second group
    if (t.worker == split.loads.busiest) busiest = t.flops;
  }
  double routed = 0;
  for (const model::Layer& l : mixture().layers) routed += routed_forward_flops(l, 256);
  const double r0 = split.loads.rank_load[static_cast<size_t>(split.loads.busiest)], r1 = split.loads.rank_load[1];
  EXPECT_NEAR(busiest - even, routed * (r0 - r1), routed * 1e-12);
}

// What every tensor rank of mixture() holds whole: two RMSNorm gains a block and the final
// one, and each block's router (8 x 256).
constexpr double kReplicated = 2 * 2 * 256 + 256 + 2 * 8 * 256;

// Expert parallelism over tensor-parallel ranks (TP 2, SP, EP 2, DP 4 on 8 devices): each
// device holds half of the dense layers and half of each expert its rank holds (expert tensor
// parallelism is the rank's degree, Megatron-Core's default).
PlanOptions tensor_options(int zero = 0) {
  PlanOptions o = options(2);
  o.tensor = 2;
  o.sequence_parallel = true;
  o.zero_stage = zero;
  return o;
}

TEST(ExpertParallel, EachDeviceHoldsItsTensorPartOfTheDenseLayersAndOfItsRanksExperts) {
  const Plan plan = plan_of(test_support::identical_cluster(8), mixture(), tensor_options());
  ASSERT_TRUE(validate_plan(plan).ok()) << validate_plan(plan).problems.front();
  EXPECT_EQ(plan.layout.size(Axis::data), 4);
  const double routed = 2 * 8 * kExpert, whole = mixture().param_count();
  for (int d = 0; d < 8; ++d) {
    double held = 0;
    for (const Tensor& t : plan.tensors) {
      if (t.kind == TensorKind::weight && t.device == d) held += t.bytes / 2;
    }
    // Megatron's split: the norms and the routers whole on each rank, the rest halved; 4 of
    // the 8 experts of each layer.
    EXPECT_DOUBLE_EQ(held, (whole - routed + 2 * 4 * kExpert + kReplicated) / 2) << d;
  }
}

// Dense gradients sum over the 4 replicas' devices of one tensor rank; each expert rank's
// half-experts over the 2 replicas holding them, per tensor rank: 2 + 2 x 2 groups.
TEST(ExpertParallel, OverTensorRanksEachExpertRanksGradientsSumPerTensorRank) {
  const double routed = 2 * 8 * kExpert, whole = mixture().param_count(), g = 2;
  for (const int zero : {0, 1}) {
    const Plan plan = plan_of(test_support::identical_cluster(8), mixture(), tensor_options(zero));
    ASSERT_TRUE(validate_plan(plan).ok()) << validate_plan(plan).problems.front();
    const std::map<std::vector<int>, double> synced = synced_bytes(plan, zero);
    ASSERT_EQ(synced.size(), 6u) << "zero " << zero;
    int dense = 0, experts = 0;
    for (const auto& [devices, bytes] : synced) {
      const auto& first = plan.coords_of(devices.front());
      for (const int d : devices) EXPECT_EQ(plan.coords_of(d)[Axis::tensor], first[Axis::tensor]);
      if (devices.size() == 4) {
        ++dense;
        EXPECT_DOUBLE_EQ(bytes, (whole - routed + kReplicated) / 2 * g);
      } else {
        ++experts;
        ASSERT_EQ(devices.size(), 2u);
        EXPECT_EQ(plan.coords_of(devices[1])[Axis::expert], first[Axis::expert]);
        EXPECT_DOUBLE_EQ(bytes, 2 * 4 * kExpert / 2 * g);
      }
    }
    EXPECT_EQ(dense, 2);
    EXPECT_EQ(experts, 4);
  }
}

// Megatron-Core's all-to-all dispatcher under TP + SP: each device dispatches its half of the
// tokens' copies to the same tensor rank of its group's other member, its tensor group
// all-gathers what arrived (all the rank's copies) just after, and reduce-scatters the
// experts' outputs just before the combine; no MLP gather of the hidden states is left (the
// mixture has no shared expert).
TEST(ExpertParallel, OverTensorRanksTheTensorGroupGathersWhatTheDispatchBrought) {
  const Plan plan = plan_of(test_support::identical_cluster(8), mixture(), tensor_options());
  ASSERT_TRUE(validate_plan(plan).ok()) << validate_plan(plan).problems.front();
  const double copies = 256.0 * 2 * 256 * 2;  // a sample's tokens x top-2 x hidden, bf16
  for (const Collective& c : plan.collectives) {
    if (c.purpose != Purpose::expert_parallel) continue;
    const std::vector<int>& devices = plan.communicator(c.communicator).devices;
    ASSERT_EQ(devices.size(), 2u);
    EXPECT_EQ(plan.coords_of(devices[0])[Axis::tensor], plan.coords_of(devices[1])[Axis::tensor]);
    EXPECT_DOUBLE_EQ(c.bytes, 4 * copies / 2);  // two layers' dispatch and combine, half the tokens each
  }
  // The calls inside worker 0's first forward, in order, by kind and bytes a message.
  int forward = -1, backward = -1;
  for (size_t t = 0; t < plan.tasks.size(); ++t) {
    const Task& task = plan.tasks[t];
    if (task.worker != 0 || task.microbatch != 0 || plan.coords_of(task.device)[Axis::tensor] != 0) continue;
    if (task.kind == TaskKind::forward) forward = static_cast<int>(t);
    if (task.kind == TaskKind::backward) backward = static_cast<int>(t);
  }
  ASSERT_GE(forward, 0);
  ASSERT_GE(backward, 0);
  const auto calls = [&](int task) {
    std::string out;
    for (const InTaskCall& call : plan.inside(task)) {
      const Collective& c = plan.collectives[static_cast<size_t>(call.collective)];
      const double bytes = c.bytes / c.messages;
      out += std::string(out.empty() ? "" : " ") +
             (c.kind == CollectiveKind::all_to_all       ? "a2a"
              : c.kind == CollectiveKind::all_gather     ? "ag"
              : c.kind == CollectiveKind::reduce_scatter ? "rs"
                                                         : "ar") +
             (bytes == copies ? "*" : "");
    }
    return out;
  };
  // The embedding's scatter; each layer: the attention's gather and scatter, dispatch, the
  // copies' gather, their scatter, combine; the head's gather and loss sums.
  EXPECT_EQ(calls(forward), "rs ag rs a2a ag* rs* a2a ag rs a2a ag* rs* a2a ag ar ar");
  // The backward mirrors it: the head's, then each layer's from the combine's gradient down.
  EXPECT_EQ(calls(backward), "ag rs a2a ag* rs* a2a ag ag rs a2a ag* rs* a2a ag ag rs ag");
}

// A rank computing twice an even share of the copies keeps twice their stash: the copies in
// and out (tokens x top-2 x 256) and the SwiGLU's four 512-wide tensors, at bf16, a layer.
TEST(ExpertParallel, ABusierRankStashesTheCopiesItComputes) {
  PlanOptions o = options(4);
  o.experts.routing = parse_routing("histogram:5,1,1,1,1,1,1,1", "test", "routing");
  for (const Recompute recompute : {Recompute::none, Recompute::full}) {
    o.recompute = recompute;
    const Plan plan = plan_of(test_support::identical_cluster(8), mixture(), o);
    ASSERT_TRUE(validate_plan(plan).ok()) << validate_plan(plan).problems.front();
    const ExpertSplit split = expert_split(mixture(), plan.layout);
    std::map<int, double> stash;  // per worker: its first stash
    for (const Tensor& t : plan.tensors) {
      if (t.kind != TensorKind::stash) continue;
      for (size_t k = 0; k < plan.tasks.size(); ++k) {
        const auto writes = plan.writes(static_cast<int>(k));
        if (std::find(writes.begin(), writes.end(), static_cast<int>(&t - plan.tensors.data())) != writes.end()) {
          stash.try_emplace(plan.tasks[k].worker, t.bytes);
        }
      }
    }
    ASSERT_EQ(stash.size(), 8u);
    const double routed = 2 * (256.0 * 2 * (2 * 256 + 4 * 512) * 2);  // two layers, bf16, a sample
    const double difference = recompute == Recompute::full ? 0 : (split.loads.rank_load[0] - split.loads.rank_load[1]) * routed;
    EXPECT_DOUBLE_EQ(stash.at(0) - stash.at(1), difference);
    EXPECT_DOUBLE_EQ(stash.at(1), stash.at(2));
  }
}

// ZeRO 3 (FSDP) with expert groups of 4 over 8 replicas: each device keeps 1/8 of the dense
// part and 1/2 of its rank's experts (their 2 holders shard them), and every pass gathers two
// pieces: the dense part over all 8 replicas, its rank's experts over their 2 holders.
TEST(ExpertParallel, ZeroThreeGathersTheDensePartFromEveryReplicaAndTheExpertsFromTheirHolders) {
  const double routed = 2 * 8 * kExpert, whole = mixture().param_count(), e = 2;
  for (const bool reshard : {true, false}) {
    PlanOptions o = options(4);
    o.zero_stage = 3;
    o.reshard_after_forward = reshard;
    const Plan plan = plan_of(test_support::identical_cluster(8), mixture(), o);
    ASSERT_TRUE(validate_plan(plan).ok()) << validate_plan(plan).problems.front();
    for (int d = 0; d < 8; ++d) {
      double held = 0;
      for (const Tensor& t : plan.tensors) {
        if (t.kind == TensorKind::weight && t.device == d) held += t.bytes / e;
      }
      EXPECT_NEAR(held, (whole - routed) / 8 + 2 * 2 * kExpert / 2, 1) << d;
    }
    // Bytes each pass's gathers carry, by their members; and what a pass reads gathered.
    std::map<std::vector<int>, double> gathered;
    for (const Collective& c : plan.collectives) {
      if (c.purpose != Purpose::data_parallel || c.kind != CollectiveKind::all_gather) continue;
      gathered[plan.communicator(c.communicator).devices] = c.bytes;
    }
    ASSERT_EQ(gathered.size(), 5u) << "reshard " << reshard;
    EXPECT_DOUBLE_EQ(gathered.at({0, 1, 2, 3, 4, 5, 6, 7}), (whole - routed) * e);
    for (int r = 0; r < 4; ++r) EXPECT_DOUBLE_EQ(gathered.at({r, r + 4}), 2 * 2 * kExpert * e) << r;
    int passes = 0;
    for (size_t t = 0; t < plan.tasks.size(); ++t) {
      if (plan.tasks[t].kind != TaskKind::forward && plan.tasks[t].kind != TaskKind::backward) continue;
      int copies = 0;
      for (const int id : plan.reads(static_cast<int>(t))) copies += plan.tensor(id).kind == TensorKind::gathered_weight;
      EXPECT_EQ(copies, 2) << describe_task(plan, static_cast<int>(t));
      ++passes;
    }
    EXPECT_EQ(passes, 8 * 2 * 2);  // 8 replicas, 2 micro-batches, forward and backward
  }
}

TEST(ExpertParallel, ThePlanFileSaysWhereEachExpertLives) {
  const model::Cluster cluster = test_support::identical_cluster(8);
  PlanOptions o = options(4);
  o.experts.placement = {3, 3, 2, 2, 1, 1, 0, 0};
  o.experts.routing = parse_routing("histogram:9,1,1,1,1,1,1,1", "test", "routing");
  o.experts.dispatch = CollectiveAlgorithm::hierarchical;
  const Plan plan = plan_of(cluster, mixture(), o);
  ASSERT_TRUE(validate_plan(plan).ok()) << validate_plan(plan).problems.front();
  const std::string text = write_plan_json(plan);
  const Plan back = read_plan_json(text, "plan.json");
  EXPECT_EQ(back.layout.experts, plan.layout.experts);
  EXPECT_EQ(back.coords, plan.coords);
  EXPECT_EQ(write_plan_json(back), text);
  // Expert 0 (9 of 16 copies) lives on rank 3: its load 4 x 10/16.
  EXPECT_EQ(expert_split(mixture(), back.layout).loads.busiest, 3);
  // A layout file keeps it too.
  PlanOptions again;
  apply_layout_file_options(write_layout_file(plan.layout, cluster), "layout.yaml", again,
                            [](std::string_view) { return false; });
  EXPECT_EQ(again.experts, plan.layout.experts);
  // A plan that moves an expert group's device is refused by validation, naming the group.
  Plan moved = plan;
  for (Communicator& c : moved.communicators) {
    if (c.role == CommRole::expert) std::swap(c.devices[0], c.devices[1]);
  }
  const std::vector<std::string> problems = validate_plan(moved).problems;
  EXPECT_TRUE(std::any_of(problems.begin(), problems.end(), [](const std::string& p) {
    return p.find("(expert): expected the devices of one position (pipeline, tensor and context coordinates) of an expert "
                  "group, in expert order") != std::string::npos;
  })) << problems.front();
}

TEST(ExpertParallel, LayoutsItCannotPlanAreRefusedNamingTheOption) {
  const model::Cluster cluster = test_support::identical_cluster(8);
  const auto error = [&](PlanOptions o, const model::Network& net) {
    return error_of([&] { plan_of(cluster, net, o); });
  };
  const model::Network dense = model::network_from_spec("llama:layers=2,hidden=256,heads=8,ffn=512,vocab=1000,seq=256",
                                                        model::Precision::bf16);
  EXPECT_EQ(error(options(2), dense),
            "expert_parallel: expected a network with a mixture of experts (architecture.moe) for expert parallelism 2; " +
                dense.name + " has none");
  EXPECT_EQ(error(options(3), mixture()),
            "expert_parallel: expected a divisor of the data axis (8 replicas: expert groups are consecutive replicas), "
            "found 3");
  PlanOptions o = options(2);
  o.pipeline = 2;
  o.data = 2;
  o.tensor = 2;
  EXPECT_EQ(error(o, mixture()),
            "sequence_parallel: expected sequence parallelism with tensor and expert parallelism: chunk 0 of worker 0 "
            "holds MoE layers on 2 tensor-parallel devices, and each dispatches its share of the tokens (Megatron-Core "
            "requires it too)");
  o = options(4);
  o.experts.placement = {0, 0, 1, 1, 2, 2, 3, 4};
  EXPECT_EQ(error(o, mixture()), "expert_placement[7]: expected an expert rank below expert_parallel (4), found 4");
  o.experts.placement = {0, 0, 1, 1, 2, 2, 0, 0};
  EXPECT_EQ(error(o, mixture()), "expert_placement: expected every expert rank to hold an expert; rank 3 holds none");
  o = options(4);
  o.experts.routing = parse_routing("histogram:1,2,3", "test", "routing");
  EXPECT_EQ(error(o, mixture()), "routing: expected one token count per expert (8), found 3");
  o = options(4);
  o.experts.dispatch = CollectiveAlgorithm::ring;
  EXPECT_EQ(error(o, mixture()), "expert_dispatch: expected pairwise or hierarchical, found ring");
}

// A mixed group: two fast and two slow GPUs per expert group. Placement by speed puts more
// experts on the fast ranks, within the memory each has, and the busiest rank's time (its
// experts' copies over its speed) drops below the contiguous placement's.
TEST(ExpertParallel, PlacementBySpeedGivesFasterRanksMoreExperts) {
  const model::Cluster cluster = model::parse_cluster(
      "name: mixed\nnodes:\n  - {name: a, count: 1, gpu: A100-80, gpus: 2, intra: {kind: nvswitch, bandwidth: 300 GB/s}, "
      "nic: {count: 1, bandwidth: 200 Gb/s}}\n  - {name: t, count: 1, gpu: T4, gpus: 2, intra: {kind: pcie, bandwidth: "
      "16 GB/s}, nic: {count: 1, bandwidth: 100 Gb/s}}\n",
      "mixed.yaml");
  PlanOptions o = options(4);
  o.precision = model::Precision::fp16;
  const CostModel cost(cluster, model::Precision::fp16);
  // Experts of 3 x 2048 x 4096 parameters: GEMMs large enough to run near each GPU's peak.
  const model::Network net = model::network_from_spec(
      "llama:layers=2,hidden=2048,heads=16,kv_heads=8,ffn=4096,vocab=1000,seq=2048,experts=8,experts_per_token=2,"
      "expert_ffn=4096",
      model::Precision::fp16);
  Layout layout = make_layout(cluster, net, o, cost);
  const ExpertRanks ranks = expert_ranks(net, layout, cost);
  ASSERT_EQ(ranks.speeds.size(), 4u);
  EXPECT_GT(ranks.speeds[0], 3 * ranks.speeds[2]);  // an A100 against a T4, at an expert's GEMM size
  EXPECT_DOUBLE_EQ(ranks.speeds[0], ranks.speeds[1]);
  o.experts_by_speed = true;
  layout = make_layout(cluster, net, o, cost);
  std::vector<int> held(4, 0);
  for (const int r : layout.experts.placement) ++held[static_cast<size_t>(r)];
  EXPECT_EQ(std::accumulate(held.begin(), held.end(), 0), 8);
  EXPECT_GT(held[0], held[2]);
  EXPECT_GE(held[2], 1);
  const Plan plan = build_plan(cluster, net, layout, cost);
  ASSERT_TRUE(validate_plan(plan).ok()) << validate_plan(plan).problems.front();
  const auto slowest = [&](const Layout& l) {
    const ExpertSplit split = expert_split(net, l);
    double worst = 0;
    for (size_t r = 0; r < 4; ++r) worst = std::max(worst, split.loads.rank_load[r] / ranks.speeds[r]);
    return worst;
  };
  Layout contiguous = layout;
  contiguous.experts.placement.clear();
  EXPECT_LT(slowest(layout), slowest(contiguous) * 0.8);
}
