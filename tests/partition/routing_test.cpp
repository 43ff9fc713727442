// The routing model against closed forms: shares, each expert-parallel rank's load, the
// copies a capacity factor drops, and experts placed by speed.
#include "partition/routing.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>

#include "model/error.hpp"

using namespace hetflow::partition;

TEST(Routing, BalancedRoutingLoadsEveryRankEvenly) {
  const std::vector<double> shares = expert_shares(Routing{}, 64);
  for (double s : shares) EXPECT_DOUBLE_EQ(s, 1.0 / 64);
  const ExpertLoads loads = expert_loads(shares, contiguous_placement(64, 8), 0);
  ASSERT_EQ(loads.rank_load.size(), 8u);
  for (double l : loads.rank_load) EXPECT_NEAR(l, 1, 1e-12);
  EXPECT_NEAR(loads.dropped, 0, 1e-12);
  // A capacity factor of 1 drops nothing an even router sends.
  EXPECT_NEAR(expert_loads(shares, contiguous_placement(64, 8), 1).dropped, 0, 1e-12);
}

// Zipf with s = 1 over 4 experts: shares 1, 1/2, 1/3, 1/4 over H = 25/12, so 12/25, 6/25,
// 4/25, 3/25. Two ranks of two experts: loads 2 x 18/25 and 2 x 7/25.
TEST(Routing, ZipfSkewLoadsTheRankOfTheHotExperts) {
  const std::vector<double> shares = expert_shares(Routing{Routing::Kind::zipf, 1, {}}, 4);
  EXPECT_NEAR(shares[0], 12.0 / 25, 1e-15);
  EXPECT_NEAR(shares[3], 3.0 / 25, 1e-15);
  const ExpertLoads loads = expert_loads(shares, contiguous_placement(4, 2), 0);
  EXPECT_NEAR(loads.rank_load[0], 36.0 / 25, 1e-12);
  EXPECT_NEAR(loads.rank_load[1], 14.0 / 25, 1e-12);
  EXPECT_EQ(loads.busiest, 0);
  // Capacity factor 1: each expert takes at most 1/4 of the copies; the first drops 12/25 - 1/4.
  const ExpertLoads capped = expert_loads(shares, contiguous_placement(4, 2), 1);
  EXPECT_NEAR(capped.dropped, 12.0 / 25 - 0.25, 1e-12);
  EXPECT_NEAR(capped.rank_load[0], 2 * (0.25 + 6.0 / 25), 1e-12);
  EXPECT_NEAR(capped.rank_load[1], 2 * (7.0 / 25), 1e-12);
}

// Whatever the shares and placement, the ranks compute every copy not dropped.
TEST(Routing, RanksComputeEveryCopyNotDropped) {
  std::mt19937 random(7);
  std::uniform_real_distribution<double> count(0, 100);
  for (int trial = 0; trial < 50; ++trial) {
    Routing r{Routing::Kind::histogram, 0, {}};
    for (int e = 0; e < 32; ++e) r.histogram.push_back(count(random));
    const std::vector<double> shares = expert_shares(r, 32);
    EXPECT_NEAR(std::accumulate(shares.begin(), shares.end(), 0.0), 1, 1e-12);
    for (double capacity : {0.0, 0.5, 1.0, 1.25, 4.0}) {
      const ExpertLoads loads = expert_loads(shares, contiguous_placement(32, 4), capacity);
      EXPECT_NEAR(std::accumulate(loads.rank_load.begin(), loads.rank_load.end(), 0.0), 4 * (1 - loads.dropped), 1e-9);
      EXPECT_EQ(loads.rank_load[static_cast<size_t>(loads.busiest)],
                *std::max_element(loads.rank_load.begin(), loads.rank_load.end()));
    }
  }
}

// Experts go where they finish first: twice as fast a rank takes twice the experts; a rank
// whose memory holds three takes three; a skewed histogram is spread so the busiest rank
// carries less than under Megatron's consecutive placement, within Graham's 4/3 of the bound.
TEST(Routing, PlacementBySpeedBalancesTheFinish) {
  const std::vector<double> even = expert_shares(Routing{}, 6);
  ExpertPlacement p = placement_by_speed(even, {2, 1}, {8, 8});
  EXPECT_EQ(std::count(p.rank_of.begin(), p.rank_of.end(), 0), 4);
  p = placement_by_speed(even, {2, 1}, {3, 8});
  EXPECT_EQ(std::count(p.rank_of.begin(), p.rank_of.end(), 0), 3);
  p = placement_by_speed(expert_shares(Routing{}, 64), {1, 1, 1, 1}, {64, 64, 64, 64});
  for (int r = 0; r < 4; ++r) EXPECT_EQ(std::count(p.rank_of.begin(), p.rank_of.end(), r), 16);

  const std::vector<double> skew = expert_shares(Routing{Routing::Kind::histogram, 0, {5, 4, 1, 1, 1, 1, 1, 1}}, 8);
  const ExpertLoads consecutive = expert_loads(skew, contiguous_placement(8, 2), 0);
  const ExpertLoads placed = expert_loads(skew, placement_by_speed(skew, {1, 1}, {8, 8}), 0);
  const double worst_consecutive = consecutive.rank_load[static_cast<size_t>(consecutive.busiest)];
  const double worst_placed = placed.rank_load[static_cast<size_t>(placed.busiest)];
  EXPECT_NEAR(worst_consecutive, 2 * 11.0 / 15, 1e-12);
  EXPECT_LT(worst_placed, worst_consecutive);
  EXPECT_LE(worst_placed, 4.0 / 3 * std::max(1.0, 2 * 5.0 / 15));
  EXPECT_THROW(placement_by_speed(even, {1, 1}, {2, 3}), hetflow::InputError);  // 6 experts, room for 5
}

TEST(Routing, SpecsRoundTripAndBadOnesNameTheirField) {
  for (const char* text : {"balanced", "zipf:1.2", "histogram:3,0,7.5,1"}) {
    const Routing r = parse_routing(text, "plan.json", "layout.routing");
    EXPECT_EQ(to_string(r), text);
    EXPECT_EQ(parse_routing(to_string(r), "plan.json", "layout.routing"), r);
  }
  for (const char* bad : {"zipf", "zipf:0", "zipf:-1", "histogram:", "histogram:1,,2", "histogram:0,0", "skewed"}) {
    try {
      parse_routing(bad, "plan.json", "layout.routing");
      ADD_FAILURE() << bad;
    } catch (const hetflow::InputError& e) {
      EXPECT_EQ(e.field(), "layout.routing") << bad;
    }
  }
  EXPECT_THROW(expert_shares(parse_routing("histogram:1,2,3", "f", "r"), 4), hetflow::InputError);
}
