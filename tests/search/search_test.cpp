// The search, whole, without the command line. Oracles: an exhaustive simulation of the same
// space (every distinct plan simulated), from which the stop rule's count and best are
// computed independently; the best of the 30 best estimates simulated directly with sim/;
// and the plan that the written layout file plans, against the search's best plan.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <set>

#include "model/io.hpp"
#include "model/zoo.hpp"
#include "partition/layout_file.hpp"
#include "partition/plan_builder.hpp"
#include "partition/plan_io.hpp"
#include "partition/validate.hpp"
#include "search/search.hpp"
#include "sim/simulator.hpp"
#include "tests/scratch.hpp"
#include "traces/metrics.hpp"

using namespace hetflow;

namespace {

// The issue's cluster: 2 nodes of 4 V100-16 on NVLink and 8 RTX 3090 behind one PCIe host
// bridge (the mixed-academic preset without its A100 node).
model::Cluster v100_3090() {
  return model::parse_cluster(R"(name: v100-3090
fabric: {kind: switch, latency: 1 us}
nodes:
  - {name: v100, count: 2, gpu: V100-16, gpus: 4,
     intra: {kind: nvlink, bandwidth: 150 GB/s, latency: 2 us},
     nic: {count: 1, bandwidth: 25 Gb/s, latency: 10 us}}
  - {name: rtx3090, gpu: RTX-3090, gpus: 8,
     intra: {kind: pcie, bandwidth: 32 GB/s, latency: 5 us, uplink: 32 GB/s},
     nic: {count: 1, bandwidth: 25 Gb/s, latency: 10 us}}
)", "v100-3090.yaml");
}

// Two nodes of two V100 and one of two T4, on 25 Gb/s NICs: small enough to simulate every plan.
model::Cluster mixed_6() {
  return model::parse_cluster("name: mixed-6\nnodes:\n"
                              "  - {name: v100, count: 2, gpu: V100-16, gpus: 2, intra: {kind: nvlink, bandwidth: 150 GB/s}, "
                              "nic: {count: 1, bandwidth: 25 Gb/s}}\n"
                              "  - {name: t4, count: 1, gpu: T4, gpus: 2, intra: {kind: pcie, bandwidth: 16 GB/s}, "
                              "nic: {count: 1, bandwidth: 25 Gb/s}}\n",
                              "mixed-6.yaml");
}

search::Request small_request(int top) {
  search::Request r;
  r.global_batch = 24;
  r.top = top;
  r.space.policies = {"uniform", "balanced", "hetpipe-ed", "grouped"};
  r.space.recomputes = {partition::Recompute::none};
  r.space.syncs = {partition::SyncKind::allreduce, partition::SyncKind::ps};
  return r;
}

const char* kSmallModel = "gpt:layers=6,hidden=512,heads=8,seq=256,vocab=8000";

int candidates_accounted(const search::Dropped& d) {
  return d.refused + d.over_memory + d.simulated + d.not_completed + d.same_plan + d.estimate_above_best +
         d.over_budget + d.estimate_only;
}

// Every candidate not simulated is listed once in Dropped::candidates, with its reason, as
// many of each reason as counted; refusals carry the error's words, over-memory candidates
// the device and a positive overflow.
void expect_each_dropped_listed(const search::Dropped& d, int candidates) {
  EXPECT_EQ(static_cast<int>(d.candidates.size()) + d.simulated, candidates);
  std::map<search::DropReason, int> n;
  for (const search::DroppedCandidate& c : d.candidates) {
    ++n[c.reason];
    EXPECT_FALSE(c.detail.summary.empty());
    if (c.reason == search::DropReason::refused) {
      EXPECT_FALSE(c.detail.message.empty()) << c.detail.summary;
    }
    if (c.reason == search::DropReason::over_memory) {
      EXPECT_FALSE(c.detail.device.empty()) << c.detail.summary;
      EXPECT_GT(c.detail.over_bytes, 0) << c.detail.summary;
    }
  }
  EXPECT_EQ(n[search::DropReason::refused], d.refused);
  EXPECT_EQ(n[search::DropReason::over_memory], d.over_memory);
  EXPECT_EQ(n[search::DropReason::same_plan], d.same_plan);
  EXPECT_EQ(n[search::DropReason::not_completed], d.not_completed);
  EXPECT_EQ(n[search::DropReason::estimate_above_best], d.estimate_above_best);
  EXPECT_EQ(n[search::DropReason::over_budget], d.over_budget);
  EXPECT_EQ(n[search::DropReason::estimate_only], d.estimate_only);
}

// The best plan's layout file, read back as `hetflow plan --layout` reads it, plans the
// same plan (but for the policy's name, which the file replaces).
void expect_layout_file_plans_back(const model::Cluster& cluster, const model::Network& network,
                                   const partition::PlanOptions& best, const std::string& name) {
  const partition::CostModel cost(cluster, network.precision);
  partition::Plan searched = search::build_candidate_plan(cluster, network, best, cost);
  const std::string path = test_support::write_file(name, partition::write_layout_file(searched.layout, cluster));
  partition::PlanOptions o;  // nothing from the search but the file
  o.precision = network.precision;
  o.policy = "layout-file";
  o.layout_file = path;
  partition::apply_layout_file_options(test_support::slurp(path), path, o, [](std::string_view) { return false; });
  partition::Plan planned = search::build_candidate_plan(cluster, network, o, cost);
  EXPECT_EQ(planned.layout.policy, "layout-file");
  planned.layout.policy = searched.layout.policy;
  EXPECT_TRUE(planned.layout == searched.layout) << partition::write_layout_file(planned.layout, cluster);
  EXPECT_EQ(partition::plan_fingerprint(planned), partition::plan_fingerprint(searched));
}

}  // namespace

// The walk simulates in estimate order and stops where the next estimate exceeds the best
// simulated: computed here from an exhaustive simulation of the same candidates.
TEST(SearchWalk, StopsWhereTheNextEstimateExceedsTheBestSimulated) {
  const model::Cluster cluster = mixed_6();
  const model::Network network = model::network_from_spec(kSmallModel, model::Precision::fp16);
  const search::Outcome walked = search::search_cluster(cluster, network, small_request(3));
  const search::Outcome all = search::search_cluster(cluster, network, small_request(1000));
  ASSERT_EQ(all.finalists.stop, search::Stop::exhausted);
  // The exhaustive rows, in estimate order: the stop rule applied by hand.
  std::vector<search::PlanRow> rows = all.ranked;
  std::stable_sort(rows.begin(), rows.end(), [](const search::PlanRow& a, const search::PlanRow& b) {
    return a.candidate.estimate.iteration_time_s < b.candidate.estimate.iteration_time_s;
  });
  double best = std::numeric_limits<double>::infinity(), true_best = best;
  int expected = 0;
  for (const search::PlanRow& r : rows) {
    ASSERT_TRUE(r.simulated) << r.candidate.summary;
    true_best = std::min(true_best, r.simulated_s);
  }
  for (const search::PlanRow& r : rows) {
    if (expected >= 3 && r.candidate.estimate.iteration_time_s > best) break;
    ++expected;
    best = std::min(best, r.simulated_s);
  }
  EXPECT_EQ(walked.finalists.simulated, expected);
  EXPECT_EQ(walked.finalists.stop, search::Stop::estimate_above_best);
  EXPECT_GT(walked.finalists.next_estimate, walked.finalists.best);
  EXPECT_DOUBLE_EQ(walked.finalists.best, best);
  EXPECT_DOUBLE_EQ(walked.ranked.front().simulated_s, true_best);
  // Every plan estimated at or below the best was simulated.
  std::set<std::string> simulated;
  for (const search::PlanRow& r : walked.ranked) simulated.insert(r.fingerprint);
  for (const search::PlanRow& r : rows) {
    if (r.candidate.estimate.iteration_time_s <= best) {
      EXPECT_TRUE(simulated.count(r.fingerprint)) << r.candidate.summary;
    }
  }
  // Every candidate is accounted for, once.
  EXPECT_EQ(candidates_accounted(walked.dropped), walked.scoring.candidates);
  EXPECT_EQ(candidates_accounted(all.dropped), all.scoring.candidates);
  expect_each_dropped_listed(walked.dropped, walked.scoring.candidates);
  expect_each_dropped_listed(all.dropped, all.scoring.candidates);
  for (const search::DroppedCandidate& c : walked.dropped.candidates) {
    if (c.reason == search::DropReason::estimate_above_best) {
      EXPECT_GT(c.estimate_s, walked.finalists.best) << c.detail.summary;
    }
  }
  EXPECT_EQ(walked.dropped.simulated, static_cast<int>(walked.ranked.size()));
  EXPECT_GT(walked.dropped.estimate_above_best, 0);
  EXPECT_EQ(all.dropped.estimate_above_best, 0);
}

// A budget of nothing: the first simulation runs (the best needs one), no other starts.
TEST(SearchWalk, TheBudgetStopsEverySimulationButTheFirst) {
  const model::Cluster cluster = mixed_6();
  const model::Network network = model::network_from_spec(kSmallModel, model::Precision::fp16);
  search::Request r = small_request(3);
  r.budget_s = 0;
  int started = 0;
  r.on_simulation = [&](const search::SimulationProgress& p) {
    if (p.simulation.elapsed_s == 0) ++started;
  };
  const search::Outcome o = search::search_cluster(cluster, network, r);
  EXPECT_EQ(o.finalists.simulated, 1);
  EXPECT_EQ(o.finalists.stop, search::Stop::budget);
  EXPECT_EQ(started, 1);
  EXPECT_EQ(o.ranked.size(), 1u);
  EXPECT_GT(o.dropped.over_budget, 0);
  EXPECT_EQ(candidates_accounted(o.dropped), o.scoring.candidates);
  expect_each_dropped_listed(o.dropped, o.scoring.candidates);
  for (const search::Baseline& b : o.baselines) {
    if (!b.found && b.why_none.rfind("not searched", 0) != 0) {
      EXPECT_EQ(b.why_none, "not simulated: the time budget was spent before its turn") << b.name;
    }
  }
}

// Baseline families the space leaves out or where nothing fits are named with the reason.
TEST(SearchWalk, NamesTheBaselinesItDropped) {
  const model::Cluster cluster = mixed_6();
  const model::Network network = model::network_from_spec(kSmallModel, model::Precision::fp16);
  search::Request r = small_request(1);
  r.space.policies = {"balanced", "hetpipe-ed"};
  const search::Outcome o = search::search_cluster(cluster, network, r);
  std::map<std::string, std::string> why;
  for (const search::Baseline& b : o.baselines) {
    if (!b.found) why[b.name] = b.why_none;
  }
  EXPECT_EQ(why["uniform (Megatron)"], "not searched: --policies leaves out uniform");
  EXPECT_EQ(why["data parallel"], "not searched: --policies leaves out uniform");
  EXPECT_EQ(why["hetpipe-np"], "not searched: --policies leaves out hetpipe-np");
  EXPECT_EQ(why.count("hetpipe-ed"), 0u);
}

// Interleaved plans (virtual stages) plan back from their layout file too.
TEST(SearchWalk, TheBestPlansBackFromItsLayoutFile) {
  const model::Cluster cluster = mixed_6();
  const model::Network network = model::network_from_spec(kSmallModel, model::Precision::fp16);
  for (const char* schedule : {"1f1b", "interleaved"}) {
    search::Request r = small_request(1);
    r.space.policies = {"balanced"};
    r.space.schedules = {schedule};
    r.space.syncs = {partition::SyncKind::allreduce};
    const search::Outcome o = search::search_cluster(cluster, network, r);
    SCOPED_TRACE(o.ranked.front().candidate.summary);
    EXPECT_EQ(o.ranked.front().candidate.options.schedule, schedule);
    expect_layout_file_plans_back(cluster, network, o.ranked.front().candidate.options, std::string(schedule) + ".yaml");
  }
}

// The issue's case: Llama 3 8B at 4,096 tokens, global batch 64, on 2 x 4 V100 + 8 RTX 3090
// behind one PCIe bridge. Simulating only the 3 best estimates returned 30.6 s per iteration;
// simulating the 30 best, 24.7 s. The default search (best 3, then on in estimate order) must
// do as well as the 30 best estimates simulated, here each simulated directly with sim/.
TEST(SearchIssueCase, Llama3OnV100AndRtx3090DoesAsWellAsTheThirtyBestEstimatesSimulated) {
  const model::Cluster cluster = v100_3090();
  model::TransformerConfig config = *model::load_network("llama3-8b").architecture;
  config.seq = 4096;
  const model::Network network = model::make_transformer(config, model::Precision::fp16);
  search::Request r;
  r.global_batch = 64;
  const search::Outcome o = search::search_cluster(cluster, network, r);

  // The oracle: the 30 best estimates of every candidate that fits, simulated.
  const partition::CostModel cost(cluster, network.precision);
  partition::PlanOptions base;
  base.precision = network.precision;
  const partition::SearchResult scored = partition::search_plans(cluster, network, 64, partition::SearchSpace{}, base, cost, 0, 30);
  std::vector<partition::Candidate> best30 = scored.ranked;
  ASSERT_GE(best30.size(), 30u);
  best30.resize(30);
  double oracle = std::numeric_limits<double>::infinity();
  for (const partition::Candidate& c : best30) {
    partition::PlanOptions options = c.options;
    options.iterations = 3;
    const partition::Plan plan = search::build_candidate_plan(cluster, network, options, cost);
    const sim::SimResult s = sim::simulate(plan, sim::SimOptions{});
    ASSERT_TRUE(s.completed) << c.summary;
    oracle = std::min(oracle, traces::compute_metrics(s.trace, plan, cost).iteration_time_s);
  }
  EXPECT_LE(o.ranked.front().simulated_s, oracle * (1 + 1e-12)) << o.ranked.front().candidate.summary;
  EXPECT_EQ(o.finalists.stop, search::Stop::estimate_above_best);
  EXPECT_EQ(candidates_accounted(o.dropped), o.scoring.candidates);
  expect_layout_file_plans_back(cluster, network, o.ranked.front().candidate.options, "llama3.yaml");
}

// A mixture of experts on a group of 2 A100 and 2 T4: the search tries expert groups of 4
// placed contiguously and by speed, and ranks by speed first (the A100 ranks take more of the
// experts); its simulated time beats the contiguous placement's, simulated alike.
TEST(Search, OnAMixedClusterExpertsArePlacedBySpeed) {
  const model::Cluster cluster = model::parse_cluster(
      "name: mixed\nnodes:\n  - {name: a, count: 1, gpu: A100-80, gpus: 2, intra: {kind: nvswitch, bandwidth: 300 GB/s}, "
      "nic: {count: 1, bandwidth: 200 Gb/s}}\n  - {name: t, count: 1, gpu: T4, gpus: 2, intra: {kind: pcie, bandwidth: "
      "16 GB/s}, nic: {count: 1, bandwidth: 100 Gb/s}}\n",
      "mixed.yaml");
  const model::Network network = model::network_from_spec(
      "llama:layers=2,hidden=2048,heads=16,kv_heads=8,ffn=4096,vocab=1000,seq=2048,experts=8,experts_per_token=2,"
      "expert_ffn=4096",
      model::Precision::fp16);
  search::Request r;
  r.global_batch = 8;
  r.base.precision = network.precision;
  r.space.policies = {"uniform"};
  r.space.tensors = {1};
  r.space.pipelines = {1};
  r.space.micro_batches = {1};
  r.space.schedules = {"1f1b"};
  r.space.recomputes = {partition::Recompute::none};
  r.space.syncs = {partition::SyncKind::allreduce};
  r.space.experts = {4};
  r.top = 3;
  r.sim_iterations = 2;
  const search::Outcome o = search::search_cluster(cluster, network, r);
  ASSERT_FALSE(o.ranked.empty());
  const search::PlanRow& best = o.ranked.front();
  ASSERT_TRUE(best.simulated);
  EXPECT_EQ(best.candidate.options.experts.parallel, 4);
  EXPECT_TRUE(best.candidate.options.experts_by_speed) << best.candidate.summary;
  // The contiguous placement of the same candidate, simulated as the search simulates.
  partition::PlanOptions contiguous = best.candidate.options;
  contiguous.experts_by_speed = false;
  contiguous.experts.placement.clear();
  contiguous.iterations = 2;
  const partition::CostModel cost(cluster, network.precision);
  const partition::Plan plan = search::build_candidate_plan(cluster, network, contiguous, cost);
  const sim::SimResult s = sim::simulate(plan, {});
  ASSERT_TRUE(s.completed);
  EXPECT_LT(best.simulated_s, traces::compute_metrics(s.trace, plan, cost).iteration_time_s * 0.9);
}
