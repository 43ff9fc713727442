// What would fit: every suggestion, built again, fits; nothing is suggested where the user
// fixed the layout.
#include <gtest/gtest.h>

#include "model/io.hpp"
#include "model/zoo.hpp"
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
