// The search's candidates and their scores: the space it enumerates, what it refuses, the
// memory it prunes by, the ranking by estimate, and the layout file of a result read back.
#include "partition/search.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "model/io.hpp"
#include "model/zoo.hpp"
#include "partition/layout_estimate.hpp"
#include "partition/layout_file.hpp"
#include "partition/plan_builder.hpp"
#include "tests/partition/plan_test_util.hpp"

using namespace hetflow;
using partition::PlanOptions;

TEST(Search, TheSpaceUsesEveryDeviceAndLeavesHetPipeItsOwnWorkers) {
  const model::Cluster cluster = test_support::identical_cluster(4, 2);  // 2 nodes of 4
  const model::Network net = test_support::equal_layers(6);
  const std::vector<PlanOptions> all = partition::search_candidates(cluster, net, 16, {}, PlanOptions{}, partition::CostModel(cluster, net.precision));
  std::set<std::string> policies;
  for (const PlanOptions& o : all) {
    policies.insert(o.policy);
    EXPECT_EQ(o.global_batch, 16);
    EXPECT_EQ(16 % o.micro_batch, 0);
    if (o.policy.rfind("hetpipe", 0) == 0) {
      EXPECT_EQ(o.tensor, 1);
      EXPECT_EQ(o.pipeline, 0);  // the policy forms its workers
    } else {
      EXPECT_EQ(8 % (o.tensor * o.pipeline), 0) << o.policy << " t" << o.tensor << " p" << o.pipeline;
      EXPECT_LE(o.tensor, 4);  // within a node
      EXPECT_LE(o.pipeline, 6);  // at most a layer per stage
    }
    if (o.schedule == "interleaved") {
      EXPECT_EQ(o.virtual_stages, 2);
    }
  }
  EXPECT_EQ(policies.size(), 5u);  // grouped has no candidates here
  partition::SearchSpace with_wsp;
  with_wsp.syncs = {partition::SyncKind::wsp};
  for (const PlanOptions& o : partition::search_candidates(cluster, net, 16, with_wsp, PlanOptions{}, partition::CostModel(cluster, net.precision))) {
    // WSP at the default staleness 1, estimated over its steady state.
    EXPECT_EQ(o.staleness, 1);
    EXPECT_EQ(o.iterations, 6);
  }
  // Tensor 1, 2, 4 x pipeline 1, 2, 4 (8 exceeds the layers) where t x p divides 8: all but
  // t4 p4, for each of the two layout policies; 5 micro-batch sizes, 3 recomputations, 2
  // syncs (allreduce, ps; wsp only when asked); schedules: 1f1b and gpipe everywhere, interleaved from 2 stages on. One GPU type:
  // no groupings for policy grouped.
  const int grids = 8, deep = 5;  // (t, p) pairs, and those with p >= 2
  const int layout_policies = 2 * (grids * 2 + deep) * 5 * 3 * 2;
  const int hetpipe = 3 * 3 * 5 * 3 * 2;
  EXPECT_EQ(static_cast<int>(all.size()), layout_policies + hetpipe);
}

TEST(Search, RanksFittingCandidatesByEstimateAndPrunesTheOverflowing) {
  const model::Cluster cluster = test_support::identical_cluster(4);
  const model::Network net = model::load_network("gpt2-350m");
  partition::SearchSpace space;
  space.policies = {"uniform"};
  space.schedules = {"1f1b"};
  space.syncs = {partition::SyncKind::allreduce};
  PlanOptions base;
  base.precision = net.precision;
  const partition::CostModel cost(cluster, net.precision);
  const partition::SearchResult r = partition::search_plans(cluster, net, 32, space, base, cost, 2);
  EXPECT_EQ(r.candidates, static_cast<int>(r.ranked.size()) + r.refused + r.over_memory);
  ASSERT_FALSE(r.ranked.empty());
  for (size_t i = 1; i < r.ranked.size(); ++i) {
    EXPECT_LE(r.ranked[i - 1].estimate.iteration_time_s, r.ranked[i].estimate.iteration_time_s);
  }
  for (const partition::Candidate& c : r.ranked) EXPECT_GE(c.headroom_bytes, 0) << c.summary;
  // The same candidate evaluated alone scores the same.
  partition::Candidate again;
  partition::Rejected why;
  ASSERT_TRUE(partition::evaluate_candidate(cluster, net, r.ranked.front().options, cost, &again, &why)) << why.message;
  EXPECT_DOUBLE_EQ(again.estimate.iteration_time_s, r.ranked.front().estimate.iteration_time_s);
  // One thread finds what two find.
  const partition::SearchResult one = partition::search_plans(cluster, net, 32, space, base, cost, 1);
  ASSERT_EQ(one.ranked.size(), r.ranked.size());
  EXPECT_EQ(one.ranked.front().summary, r.ranked.front().summary);
}

TEST(Search, AModelTooLargeForEveryCandidateIsOverMemoryNotRanked) {
  const model::Cluster cluster = test_support::identical_cluster(2, 1, "T4");
  const model::Network net = model::load_network("gpt3-175b");
  partition::SearchSpace space;
  space.policies = {"uniform"};
  space.schedules = {"1f1b"};
  space.recomputes = {partition::Recompute::full};
  space.syncs = {partition::SyncKind::allreduce};
  space.micro_batches = {1};
  PlanOptions base;
  base.precision = net.precision;
  const partition::CostModel cost(cluster, net.precision);
  const partition::SearchResult r = partition::search_plans(cluster, net, 2, space, base, cost, 2);
  EXPECT_TRUE(r.ranked.empty());
  EXPECT_GT(r.over_memory, 0);
}

TEST(Search, TheLayoutFileOfAPlanReadsBackIntoTheSameWorkers) {
  const model::Cluster cluster = model::builtin_cluster("hetpipe-testbed");
  const model::Network net = model::load_network("vgg19");
  PlanOptions o;
  o.policy = "hetpipe-ed";
  o.global_batch = 64;
  o.micro_batch = 4;
  o.precision = net.precision;
  const partition::CostModel cost(cluster, net.precision);
  const partition::Layout layout = partition::make_layout(cluster, net, o, cost);
  const std::string text = partition::write_layout_file(layout, cluster);
  const partition::Layout back = partition::read_layout_file(text, "search.yaml", cluster, net, layout);
  ASSERT_EQ(back.workers.size(), layout.workers.size());
  for (size_t w = 0; w < layout.workers.size(); ++w) {
    EXPECT_EQ(back.workers[w].ranks, layout.workers[w].ranks);
    EXPECT_EQ(back.workers[w].stages, layout.workers[w].stages);
    EXPECT_EQ(back.workers[w].microbatches, layout.workers[w].microbatches);
  }
}

// Building only the best of each family by the layout's estimate keeps the same best
// candidates as building every one, in every family, with the FLOPs model and with
// operation costs, on a mixed cluster; what it screens by memory overflows when built.
TEST(Search, BuildingTheBestByTheLayoutsEstimateKeepsTheBestOfEveryFamily) {
  // 3 nodes of 4 V100 and one of 4 T4, a GPT of 1.3B parameters: data parallelism overflows.
  const model::Cluster cluster = model::parse_cluster(
      "name: v100-t4\nnodes:\n"
      "  - {name: v100, count: 3, gpu: V100-16, gpus: 4, intra: {kind: nvlink, bandwidth: 150 GB/s}, nic: {count: 1, bandwidth: 25 Gb/s}}\n"
      "  - {name: t4, count: 1, gpu: T4, gpus: 4, intra: {kind: pcie, bandwidth: 16 GB/s}, nic: {count: 1, bandwidth: 25 Gb/s}}\n",
      "v100-t4.yaml");
  const model::Network net = model::load_network("gpt:layers=24,hidden=2048,heads=16,seq=1024,vocab=50257");
  model::Calibration ops;
  ops.default_gpu.ops["gemm"] = {0.7, 1e9, 5e-6};
  ops.default_gpu.ops["memory"] = {0.8, 0, 2e-6};
  partition::SearchSpace space;
  space.policies = {"uniform", "balanced", "hetpipe-ed"};
  space.micro_batches = {1, 4, 16};
  space.zero = false;  // the oracle builds each candidate as it is
  space.offload = false;
  PlanOptions base;
  base.precision = net.precision;
  for (const model::Calibration& calibration : {model::Calibration{}, ops}) {
    const partition::CostModel cost(cluster, net.precision, calibration);
    // The oracle: every candidate built and estimated.
    std::vector<partition::Candidate> every;
    int overflowing = 0;
    for (const PlanOptions& o : partition::search_candidates(cluster, net, 32, space, base, cost)) {
      partition::Candidate c;
      if (!partition::evaluate_candidate(cluster, net, o, cost, &c, nullptr)) continue;
      if (c.headroom_bytes < 0) {
        ++overflowing;
      } else {
        every.push_back(c);
      }
    }
    std::stable_sort(every.begin(), every.end(), [](const auto& a, const auto& b) {
      return a.estimate.iteration_time_s < b.estimate.iteration_time_s;
    });
    const partition::SearchResult all = partition::search_plans(cluster, net, 32, space, base, cost, 2);
    const partition::SearchResult kept = partition::search_plans(cluster, net, 32, space, base, cost, 2, 3);
    EXPECT_EQ(all.pruned, 0);
    EXPECT_EQ(all.ranked.size(), every.size());
    EXPECT_GT(kept.pruned, static_cast<int>(every.size()) / 2);  // most were never built
    EXPECT_GT(kept.screened, 0) << overflowing << " overflow; " << kept.over_memory << " over memory, " << kept.refused << " refused, " << kept.ranked.size() << " ranked of " << kept.candidates;
    EXPECT_LE(kept.screened, overflowing);  // screened only what overflows
    EXPECT_EQ(all.over_memory, overflowing);  // built, every overflow is found
    EXPECT_EQ(kept.screened, all.screened);
    auto best3 = [](const std::vector<partition::Candidate>& ranked, const std::string& family) {
      std::vector<std::pair<double, std::string>> out;
      for (const partition::Candidate& c : ranked) {
        const auto f = partition::candidate_families(c.options);
        if (std::find(f.begin(), f.end(), family) != f.end() && out.size() < 3) {
          out.emplace_back(c.estimate.iteration_time_s, c.summary);
        }
      }
      return out;
    };
    for (const char* family : {"all", "uniform/allreduce", "balanced/allreduce", "hetpipe-ed/allreduce", "uniform/ps",
                               "balanced/ps", "hetpipe-ed/ps", "data-parallel"}) {
      EXPECT_EQ(best3(kept.ranked, family), best3(every, family)) << family;
      EXPECT_EQ(best3(all.ranked, family), best3(every, family)) << family;
    }
    if (calibration == ops) continue;  // once is enough
    // Sharding what overflows (SearchSpace::zero): building the best of each family still
    // keeps what building every candidate ranks first, and data parallelism now fits.
    partition::SearchSpace sharded = space;
    sharded.zero = true;
    const partition::SearchResult all_sharded = partition::search_plans(cluster, net, 32, sharded, base, cost, 2);
    const partition::SearchResult kept_sharded = partition::search_plans(cluster, net, 32, sharded, base, cost, 2, 3);
    EXPECT_EQ(all_sharded.pruned, 0);
    EXPECT_FALSE(best3(all_sharded.ranked, "data-parallel").empty());
    for (const char* family : {"all", "uniform/allreduce", "balanced/allreduce", "hetpipe-ed/allreduce", "data-parallel"}) {
      EXPECT_EQ(best3(kept_sharded.ranked, family), best3(all_sharded.ranked, family)) << family;
    }
  }
}

// The search's order by its stated rule: the lower score first; among candidates whose scores
// tie with an input-bound one's (one loader's floor, to a relative 1e-9) the cheaper per hour,
// then the one of fewer GPUs, then the faster on its GPUs alone; otherwise the given order.
// The oracle is the rule applied by hand to keys chosen so that each step decides one pair.
TEST(Search, InputBoundTiesGoToTheCheapestThenTheSmallestThenTheFastestGpus) {
  using partition::RankKey;
  const double floor_s = 0.5;
  const std::vector<RankKey> keys = {
      {floor_s, true, 10, 32, 0.02},               // 0: tied, dearer
      {floor_s * (1 + 1e-12), true, 8, 32, 0.03},  // 1: tied (rounding), cheaper
      {floor_s, true, 8, 16, 0.04},                // 2: tied, as cheap, fewer GPUs
      {floor_s, true, 8, 16, 0.01},                // 3: as 2, faster GPUs alone
      {0.4, false, 50, 64, 0.4},                   // 4: faster than the loader's floor: first whatever its price
      {floor_s, false, 1, 1, floor_s},             // 5: GPUs alone just at the loader's rate, cheapest: tied, first
      {0.6, true, 0, 1, 0.01},                     // 6: a slower loader's floor: last
      {floor_s * (1 + 1e-6), true, 1, 1, 0.01},    // 7: a loader floor apart, not tied
  };
  const std::vector<size_t> order = partition::search_order(keys.size(), [&](size_t i) { return keys[i]; });
  EXPECT_EQ(order, (std::vector<size_t>{4, 5, 3, 2, 1, 0, 7, 6}));
  // Without ties, the scores' order (stable).
  const std::vector<RankKey> plain = {{3, false, 0, 1, 3}, {1, false, 9, 9, 1}, {2, false, 0, 1, 2}, {1, false, 0, 1, 1}};
  EXPECT_EQ(partition::search_order(plain.size(), [&](size_t i) { return plain[i]; }), (std::vector<size_t>{1, 3, 2, 0}));
}

namespace {

// Data parallelism and the given tensor degrees alone: the uniform policy, no pipeline,
// micro-batches of 1, 1F1B under full recomputation, all-reduce.
partition::SearchSpace data_parallel_space(std::vector<int> tensors) {
  partition::SearchSpace space;
  space.policies = {"uniform"};
  space.tensors = std::move(tensors);
  space.pipelines = {1};
  space.micro_batches = {1};
  space.schedules = {"1f1b"};
  space.recomputes = {partition::Recompute::full};
  space.syncs = {partition::SyncKind::allreduce};
  return space;
}

}  // namespace

// ZeRO and offload in the search (SearchSpace::zero, SearchSpace::offload): data parallelism
// over 4 V100-16 overflows unsharded (16 bytes a parameter of 1.3 B), so the search tries the
// shardings, each with and without its optimizer offloaded, and keeps the fastest that fits
// by the layout's estimate, which an independent walk of every placement confirms; a
// candidate that fits as it is stays so, and without either nothing is sharded or offloaded
// and the overflowing candidate is screened.
TEST(Search, AnOverflowingDataParallelCandidateTakesTheFastestPlacementThatFits) {
  const model::Cluster cluster = test_support::identical_cluster(4, 1, "V100-16");
  const model::Network net = model::network_from_spec("gpt:layers=16,hidden=2560,heads=20,seq=1024,vocab=50257", model::Precision::fp16);
  partition::SearchSpace space = data_parallel_space({1, 4});
  PlanOptions base;
  base.precision = net.precision;
  const partition::CostModel cost(cluster, net.precision);
  const partition::SearchResult r = partition::search_plans(cluster, net, 8, space, base, cost, 2);
  // The oracle: every sharding of the data-parallel candidate, with and without its optimizer
  // offloaded, laid out and estimated.
  PlanOptions dp = partition::search_candidates(cluster, net, 8, space, base, cost).front();
  ASSERT_EQ(dp.tensor, 1);
  struct Choice {
    int stage;
    bool reshard;
    bool offload;
  };
  double best_s = 0;
  Choice best{-1, true, false};
  std::vector<std::pair<int, bool>> fit_on_gpus;  // not tried again offloaded
  for (const bool offload : {false, true}) {  // in the search's order of placements
    for (const Choice c : {Choice{0, true, offload}, Choice{1, true, offload}, Choice{2, true, offload},
                           Choice{3, false, offload}, Choice{3, true, offload}}) {
      dp.zero_stage = c.stage;
      dp.reshard_after_forward = c.reshard;
      dp.offload_optimizer = c.offload;
      if (c.offload && std::count(fit_on_gpus.begin(), fit_on_gpus.end(), std::pair{c.stage, c.reshard})) continue;
      const partition::LayoutEstimate e =
          partition::estimate_layout(net, partition::make_layout(cluster, net, dp, cost), cost);
      if (c.stage == 0 && !c.offload) {
        EXPECT_LT(e.headroom_bytes, 0) << "unsharded data parallelism should overflow";
        continue;
      }
      if (e.headroom_bytes >= 0 && !c.offload) fit_on_gpus.emplace_back(c.stage, c.reshard);
      if (e.headroom_bytes >= 0 && (best.stage < 0 || e.iteration_time_s < best_s)) {
        best = c;
        best_s = e.iteration_time_s;
      }
    }
  }
  ASSERT_GE(best.stage, 0);
  bool sharded = false, tensor = false;
  for (const partition::Candidate& c : r.ranked) {
    if (c.options.tensor == 1) {
      sharded = true;
      EXPECT_EQ(c.options.zero_stage, best.stage) << c.summary;
      EXPECT_EQ(c.options.reshard_after_forward, best.reshard) << c.summary;
      EXPECT_EQ(c.options.offload_optimizer, best.offload) << c.summary;
      EXPECT_DOUBLE_EQ(c.estimate.iteration_time_s, best_s) << c.summary;
      if (best.stage > 0) {
        EXPECT_NE(c.summary.find(", zero " + std::to_string(best.stage)), std::string::npos) << c.summary;
      }
      EXPECT_EQ(c.summary.find(", optimizer offloaded") != std::string::npos, best.offload) << c.summary;
      EXPECT_GE(c.headroom_bytes, 0) << c.summary;  // the built plan fits
    } else {
      tensor = true;  // one worker: nothing to shard over
      EXPECT_EQ(c.options.zero_stage, 0) << c.summary;
    }
  }
  EXPECT_TRUE(sharded);
  EXPECT_TRUE(tensor);
  space.zero = false;
  space.offload = false;
  const partition::SearchResult plain = partition::search_plans(cluster, net, 8, space, base, cost, 2);
  for (const partition::Candidate& c : plain.ranked) {
    EXPECT_EQ(c.options.zero_stage, 0) << c.summary;
    EXPECT_FALSE(c.options.offload_optimizer) << c.summary;
  }
  EXPECT_EQ(plain.screened, 1);
}

// ZeRO's shares by memory in the search: data parallelism over two V100-16 and two V100-32
// shards a 2.4B-parameter GPT's state; the search lays each sharding out with equal shares,
// then with shares by memory (each replica m / 96 GB of it), and keeps the fastest that fits
// by the layout's estimate, as an independent walk of the same placements finds. Stage 1
// with equal shares overflows the 16 GB devices (4 + 12 / 4 bytes a parameter) where by
// memory it fits (4 + 12 / 6), so the choice is a real one.
TEST(Search, ShardsByMemoryAreAPlacementTheSearchChooses) {
  const model::Cluster cluster = model::parse_cluster(
      "name: mixed\n"
      "nodes:\n"
      "  - {name: small, gpu: V100-16, gpus: 2, nic: {count: 1, bandwidth: 100 Gb/s, latency: 5 us}}\n"
      "  - {name: large, gpu: V100-32, gpus: 2, nic: {count: 1, bandwidth: 100 Gb/s, latency: 5 us}}\n",
      "mixed.yaml");
  const model::Network net =
      model::network_from_spec("gpt:layers=46,hidden=2048,heads=16,seq=1024,vocab=50257", model::Precision::fp16);
  partition::SearchSpace space = data_parallel_space({1});
  space.offload = false;
  PlanOptions base;
  base.precision = net.precision;
  const partition::CostModel cost(cluster, net.precision);
  const partition::SearchResult r = partition::search_plans(cluster, net, 8, space, base, cost, 2);
  PlanOptions dp = partition::search_candidates(cluster, net, 8, space, base, cost).front();
  ASSERT_EQ(dp.tensor, 1);
  ASSERT_EQ(dp.zero_stage, 0);
  double best_s = 0;
  PlanOptions best;
  best.zero_stage = -1;
  std::map<std::pair<int, bool>, bool> fits_equal, fits_memory;  // (stage, reshard) -> fits
  for (const partition::ZeroShares shares : {partition::ZeroShares::equal, partition::ZeroShares::memory}) {
    for (const auto& [stage, reshard] : {std::pair{0, true}, {1, true}, {2, true}, {3, false}, {3, true}}) {
      if (stage == 0 && shares == partition::ZeroShares::memory) continue;
      dp.zero_stage = stage;
      dp.reshard_after_forward = reshard;
      dp.zero_shares = shares;
      const partition::LayoutEstimate e =
          partition::estimate_layout(net, partition::make_layout(cluster, net, dp, cost), cost);
      (shares == partition::ZeroShares::equal ? fits_equal : fits_memory)[{stage, reshard}] = e.headroom_bytes >= 0;
      if (e.headroom_bytes >= 0 && (best.zero_stage < 0 || e.iteration_time_s < best_s)) {
        best = dp;
        best_s = e.iteration_time_s;
      }
    }
  }
  ASSERT_FALSE((fits_equal[{1, true}])) << "stage 1 with equal shares should overflow the V100-16";
  ASSERT_TRUE((fits_memory[{1, true}])) << "stage 1 with shares by memory should fit";
  ASSERT_GE(best.zero_stage, 1);
  ASSERT_EQ(r.ranked.size(), 1u);
  const partition::Candidate& c = r.ranked.front();
  EXPECT_EQ(c.options.zero_stage, best.zero_stage) << c.summary;
  EXPECT_EQ(c.options.reshard_after_forward, best.reshard_after_forward) << c.summary;
  EXPECT_EQ(c.options.zero_shares, best.zero_shares) << c.summary;
  EXPECT_DOUBLE_EQ(c.estimate.iteration_time_s, best_s) << c.summary;
  EXPECT_EQ(c.summary.find(" by memory") != std::string::npos, best.zero_shares == partition::ZeroShares::memory)
      << c.summary;
  // Without ZeRO in the space, nothing is sharded and the candidate overflows.
  space.zero = false;
  EXPECT_EQ(partition::search_plans(cluster, net, 8, space, base, cost, 2).screened, 1);
}

// Expert groups over tensor-parallel ranks need sequence parallelism (check_experts): with a
// sequence-parallel base the search tries them at tensor 2, and each such candidate plans;
// without one, expert groups come at tensor 1 alone.
TEST(Search, ExpertGroupsOverTensorRanksAreTriedWhenTheBaseIsSequenceParallel) {
  const model::Cluster cluster = test_support::identical_cluster(8);
  const model::Network net = model::network_from_spec(
      "llama:layers=4,hidden=256,heads=8,kv_heads=4,ffn=512,vocab=1000,seq=256,experts=8,experts_per_token=2,"
      "expert_ffn=512",
      model::Precision::bf16);
  const partition::CostModel cost(cluster, net.precision);
  partition::SearchSpace space;
  space.policies = {"uniform"};
  space.tensors = {1, 2};
  space.pipelines = {1, 2};
  space.experts = {2};
  space.micro_batches = {1};
  space.schedules = {"1f1b"};
  space.syncs = {partition::SyncKind::allreduce};
  for (const bool sp : {false, true}) {
    PlanOptions base;
    base.sequence_parallel = sp;
    int over_tensor_ranks = 0, at_tensor_1 = 0, planned = 0;
    for (const PlanOptions& o : partition::search_candidates(cluster, net, 16, space, base, cost)) {
      if (o.experts.parallel < 2) continue;
      (o.tensor > 1 ? over_tensor_ranks : at_tensor_1) += 1;
      if (o.tensor == 1) continue;
      const partition::Plan plan = test_support::plan_of(cluster, net, o);
      EXPECT_EQ(plan.layout.experts.parallel, 2) << partition::candidate_summary(o, 0);
      ++planned;
    }
    EXPECT_GT(at_tensor_1, 0);
    EXPECT_EQ(over_tensor_ranks > 0, sp) << over_tensor_ranks;
    EXPECT_EQ(planned > 0, sp) << planned;
  }
}
