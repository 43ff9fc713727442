// What would fit: every suggestion, built again, fits; nothing is suggested where the user
// fixed the layout.
#include <gtest/gtest.h>

#include <algorithm>

#include "model/io.hpp"
#include "model/zoo.hpp"
#include "partition/estimate.hpp"
#include "partition/fit_advice.hpp"
#include "partition/plan_builder.hpp"

using namespace hetflow;
using namespace hetflow::partition;

namespace {

Plan plan_with(const model::Cluster& cluster, const model::Network& net, const PlanOptions& o, const CostModel& cost) {
  return build_plan(cluster, net, make_layout(cluster, net, o, cost), cost);
}

}  // namespace

TEST(FitAdvice, EverySuggestionFitsAndTheFastestComesFirst) {
  const model::Cluster cluster = model::builtin_cluster("mixed-academic");
  const model::Network net = model::network_from_spec("gpt2-xl", model::Precision::fp16);
  const CostModel cost(cluster, net.precision);
  PlanOptions o;  // one stage per device group: the optimizer state alone overflows a V100
  const Plan failed = plan_with(cluster, net, o, cost);
  ASSERT_FALSE(fits_in_memory(failed));
  const std::vector<FitAdvice> advice = what_would_fit(failed, o, cost);
  ASSERT_FALSE(advice.empty());
  for (size_t i = 0; i < advice.size(); ++i) {
    EXPECT_FALSE(advice[i].changes.empty());
    const Plan plan = plan_with(cluster, net, advice[i].options, cost);
    EXPECT_TRUE(fits_in_memory(plan)) << i;
    EXPECT_GT(advice[i].peak_fraction, 0);
    EXPECT_LE(advice[i].peak_fraction, 1);
    if (i > 0) {
      EXPECT_LE(advice[i - 1].iteration_time_s, advice[i].iteration_time_s);
    }
  }
}

// The places the fewest changes leave go to the fastest of the next, not the first built: on
// GPT-2 XL over 8 V100s three single changes fit (ZeRO 2 and 3, offload), slower than a pair,
// and against every pair of recomputation, a ZeRO stage and optimizer offload (built and
// estimated here, a brute force over those three), the first answer is the fastest that fits.
TEST(FitAdvice, TheFirstAnswerIsTheFastestOfAsFewChanges) {
  const model::Cluster cluster = model::builtin_cluster("mixed-academic");
  const model::Network net = model::network_from_spec("gpt2-xl", model::Precision::fp16);
  const CostModel cost(cluster, net.precision);
  PlanOptions o;
  o.data = 8;
  const Plan failed = plan_with(cluster, net, o, cost);
  ASSERT_FALSE(fits_in_memory(failed));
  const std::vector<FitAdvice> advice = what_would_fit(failed, o, cost);
  ASSERT_FALSE(advice.empty());
  ASSERT_EQ(advice.front().changes.size(), 2u);
  EXPECT_EQ(std::count_if(advice.begin(), advice.end(), [](const FitAdvice& a) { return a.changes.size() == 1; }), 3);
  int pairs = 0;
  for (const Recompute r : {Recompute::none, Recompute::selective, Recompute::full}) {
    for (const int zero : {0, 1, 2, 3}) {
      for (const bool offload : {false, true}) {
        if ((r != Recompute::none) + (zero != 0) + offload != 2) continue;
        PlanOptions pair = o;
        pair.recompute = r;
        pair.zero_stage = zero;
        pair.offload_optimizer = offload;
        const Plan plan = plan_with(cluster, net, pair, cost);
        if (!fits_in_memory(plan)) continue;
        ++pairs;
        EXPECT_LE(advice.front().iteration_time_s, estimate_plan(plan, cost).iteration_time_s * (1 + 1e-12))
            << to_string(r) << ", zero " << zero << (offload ? ", offloaded" : "");
      }
    }
  }
  EXPECT_GE(pairs, 3);
}

TEST(FitAdvice, NothingIsSuggestedForAFixedLayoutOrAPlanThatFits) {
  const model::Cluster cluster = model::builtin_cluster("mixed-academic");
  const model::Network net = model::network_from_spec("gpt2-xl", model::Precision::fp16);
  const CostModel cost(cluster, net.precision);
  PlanOptions o;
  const Plan failed = plan_with(cluster, net, o, cost);
  PlanOptions from_file = o;
  from_file.layout_file = "layout.yaml";
  EXPECT_TRUE(what_would_fit(failed, from_file, cost).empty());
  // Fixed cuts leave only recomputation, ZeRO sharding and offload (optimizer, activations) to vary.
  PlanOptions cut = o;
  cut.stage_layers = {static_cast<int>(net.layers.size())};
  for (const FitAdvice& a : what_would_fit(failed, cut, cost)) {
    for (const auto& [member, value] : a.changes) {
      EXPECT_TRUE(member == "recompute" || member == "zero_stage" || member == "offload_optimizer" ||
                  member == "offload_activations")
          << member;
    }
  }
  // The budget bounds the work: no task may be built, nothing is found.
  EXPECT_TRUE(what_would_fit(failed, o, cost, 3, 0).empty());
}
