// Minimum-bottleneck partitioning: the DP against brute force over every composition, on
// random heterogeneous instances, plus hand-made cases and edge cases.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <tuple>
#include <vector>

#include "partition/partitioner.hpp"

using namespace hetflow::partition;

namespace {

struct Instance {
  std::vector<double> cost;      // per layer
  std::vector<int> mem;          // per layer
  std::vector<double> speed;     // per stage
  std::vector<int> mem_limit;    // per stage
  std::vector<double> transfer;  // per boundary j (1..L-1), added to the stage ending at j

  PartitionProblem problem() const {
    PartitionProblem p;
    p.layers = static_cast<int>(cost.size());
    p.stages = static_cast<int>(speed.size());
    p.stage_time_s = [this](int s, int first, int last) {
      double c = 0;
      for (int l = first; l < last; ++l) c += cost[l];
      const double t = c / speed[s];
      return last < static_cast<int>(cost.size()) ? t + transfer[last] : t;
    };
    p.fits = [this](int s, int first, int last) {
      int m = 0;
      for (int l = first; l < last; ++l) m += mem[l];
      return m <= mem_limit[s];
    };
    return p;
  }
};

// Every composition of L into S non-empty parts; smallest (bottleneck, sum, boundaries), the
// sum accumulated from stage 0 onwards.
std::optional<Partition> brute_force(const PartitionProblem& p) {
  if (p.layers < 1 || p.stages < 1 || p.stages > p.layers) return std::nullopt;
  std::optional<std::tuple<double, double, std::vector<int>>> best;
  std::vector<int> b{0};
  auto rec = [&](auto&& self) -> void {
    const int s = static_cast<int>(b.size()) - 1;  // stages placed so far
    if (s == p.stages) {
      if (b.back() != p.layers) return;
      double bottleneck = -INFINITY, sum = 0;
      for (int k = 0; k < p.stages; ++k) {
        if (!p.fits(k, b[k], b[k + 1])) return;
        const double t = p.stage_time_s(k, b[k], b[k + 1]);
        bottleneck = std::max(bottleneck, t);
        sum += t;
      }
      auto cand = std::make_tuple(bottleneck, sum, b);
      if (!best || cand < *best) best = cand;
      return;
    }
    for (int j = b.back() + 1; j <= p.layers; ++j) {
      b.push_back(j);
      self(self);
      b.pop_back();
    }
  };
  rec(rec);
  if (!best) return std::nullopt;
  return Partition{std::get<2>(*best), std::get<0>(*best)};
}

// The result is a valid partition: boundaries 0 = b0 < ... < bS = L, every stage fits, and the
// bottleneck is the slowest stage.
void expect_valid(const PartitionProblem& p, const Partition& r) {
  ASSERT_EQ(r.boundaries.size(), static_cast<size_t>(p.stages + 1));
  EXPECT_EQ(r.boundaries.front(), 0);
  EXPECT_EQ(r.boundaries.back(), p.layers);
  double bottleneck = -INFINITY;
  for (int s = 0; s < p.stages; ++s) {
    EXPECT_LT(r.boundaries[s], r.boundaries[s + 1]);
    EXPECT_TRUE(p.fits(s, r.boundaries[s], r.boundaries[s + 1])) << "stage " << s;
    bottleneck = std::max(bottleneck, p.stage_time_s(s, r.boundaries[s], r.boundaries[s + 1]));
  }
  EXPECT_EQ(r.bottleneck_s, bottleneck);
}

enum class Flavor { real, dyadic, rounding };

// real: random doubles (few ties). dyadic: small integers over powers of two, exact arithmetic
// and many ties. rounding: magnitudes far apart, so sums round and prefixes collapse.
Instance random_instance(std::mt19937& rng, Flavor flavor) {
  auto uniform_int = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  auto uniform = [&](double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(rng); };
  const int L = uniform_int(1, 9);
  const int S = uniform_int(1, std::min(L, 5));
  Instance in;
  for (int l = 0; l < L; ++l) {
    switch (flavor) {
      case Flavor::real: in.cost.push_back(uniform(0.1, 3.0)); break;
      case Flavor::dyadic: in.cost.push_back(uniform_int(1, 3)); break;
      case Flavor::rounding: in.cost.push_back(std::vector{0.1, 1.0, 3.0, 0x1p53}[uniform_int(0, 3)]); break;
    }
    in.mem.push_back(uniform_int(1, 4));
  }
  for (int s = 0; s < S; ++s) {
    switch (flavor) {
      case Flavor::real: in.speed.push_back(uniform(0.3, 4.0)); break;
      case Flavor::dyadic: in.speed.push_back(std::vector{1.0, 2.0, 4.0}[uniform_int(0, 2)]); break;
      case Flavor::rounding: in.speed.push_back(std::vector{1.0, 3.0}[uniform_int(0, 1)]); break;
    }
    // Sometimes too small for everything, so some instances have no fitting partition.
    in.mem_limit.push_back(uniform_int(2, 4 * L / S + 4));
  }
  const bool with_transfer = uniform_int(0, 1) == 1;
  in.transfer.assign(L + 1, 0.0);
  for (int j = 1; j < L && with_transfer; ++j) {
    in.transfer[j] = flavor == Flavor::real ? uniform(0.0, 1.0) : uniform_int(0, 2) / 4.0;
  }
  return in;
}

}  // namespace

TEST(Partitioner, MatchesBruteForceOnRandomInstances) {
  std::map<Flavor, int> feasible, infeasible;
  for (const Flavor flavor : {Flavor::real, Flavor::dyadic, Flavor::rounding}) {
    std::mt19937 rng(1234 + static_cast<int>(flavor));
    for (int n = 0; n < 400; ++n) {
      const Instance in = random_instance(rng, flavor);
      const PartitionProblem p = in.problem();
      SCOPED_TRACE(testing::Message() << "flavor " << static_cast<int>(flavor) << " instance " << n
                                      << " L=" << p.layers << " S=" << p.stages);
      const auto expected = brute_force(p);
      const auto got = partition_min_bottleneck(p);
      ASSERT_EQ(got.has_value(), expected.has_value());
      if (!expected) {
        ++infeasible[flavor];
        continue;
      }
      ++feasible[flavor];
      expect_valid(p, *got);
      EXPECT_EQ(got->boundaries, expected->boundaries);
      EXPECT_EQ(got->bottleneck_s, expected->bottleneck_s);
    }
    // Both outcomes are exercised.
    EXPECT_GT(feasible[flavor], 100);
    EXPECT_GT(infeasible[flavor], 10);
  }
}

TEST(Partitioner, FasterDeviceGetsProportionallyMoreLayers) {
  Instance in{std::vector<double>(8, 1.0), std::vector<int>(8, 1), {3.0, 1.0}, {8, 8},
              std::vector<double>(9, 0.0)};
  const auto r = partition_min_bottleneck(in.problem());
  ASSERT_TRUE(r);
  EXPECT_EQ(r->boundaries, (std::vector<int>{0, 6, 8}));
  EXPECT_EQ(r->bottleneck_s, 2.0);
  // The other way round: the slow device first.
  in.speed = {1.0, 3.0};
  EXPECT_EQ(partition_min_bottleneck(in.problem())->boundaries, (std::vector<int>{0, 2, 8}));
}

TEST(Partitioner, MemoryLimitOverridesSpeed) {
  // The fast device only holds 4 layers, so the split is 4/4 despite the 3x speed.
  Instance in{std::vector<double>(8, 1.0), std::vector<int>(8, 1), {3.0, 1.0}, {4, 8},
              std::vector<double>(9, 0.0)};
  const auto r = partition_min_bottleneck(in.problem());
  ASSERT_TRUE(r);
  EXPECT_EQ(r->boundaries, (std::vector<int>{0, 4, 8}));
  EXPECT_EQ(r->bottleneck_s, 4.0);
  in.mem_limit = {4, 3};  // 7 layers of room for 8
  EXPECT_FALSE(partition_min_bottleneck(in.problem()));
}

namespace {

// Stage times from a table of (stage, first, last); anything else takes `other`.
PartitionProblem table_problem(int layers, int stages, std::map<std::tuple<int, int, int>, double> t,
                               double other) {
  return {layers, stages,
          [t, other](int s, int i, int j) {
            const auto it = t.find({s, i, j});
            return it == t.end() ? other : it->second;
          },
          [](int, int, int) { return true; }};
}

}  // namespace

TEST(Partitioner, SmallerSumWinsWhenALaterStageSetsTheBottleneck) {
  // [0,1,3,4]: stages 5, 3, 6 -> (6, 14). [0,2,3,4]: stages 4.5, 4.5, 6 -> (6, 15): its prefix
  // has the smaller bottleneck, but the larger sum.
  const auto p = table_problem(4, 3,
                               {{{0, 0, 1}, 5.0}, {{1, 1, 3}, 3.0}, {{0, 0, 2}, 4.5},
                                {{1, 2, 3}, 4.5}, {{2, 3, 4}, 6.0}},
                               100.0);
  const auto r = partition_min_bottleneck(p);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->boundaries, (std::vector<int>{0, 1, 3, 4}));
  EXPECT_EQ(r->bottleneck_s, 6.0);
  EXPECT_EQ(r->boundaries, brute_force(p)->boundaries);
}

TEST(Partitioner, RoundingTiesStillBreakTowardsSmallestBoundaries) {
  // Prefix sums 1 ([0,1,3]) and 0.5 ([0,2,3]) both vanish next to 2^53: equal sums, so the
  // lexicographically smaller boundaries win even though their prefix sum was larger.
  const auto p = table_problem(4, 3,
                               {{{0, 0, 1}, 0.5}, {{1, 1, 3}, 0.5}, {{0, 0, 2}, 0.25},
                                {{1, 2, 3}, 0.25}, {{2, 3, 4}, 0x1p53}},
                               0x1p54);
  const auto r = partition_min_bottleneck(p);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->boundaries, (std::vector<int>{0, 1, 3, 4}));
  EXPECT_EQ(r->boundaries, brute_force(p)->boundaries);
}

TEST(Partitioner, EqualCostsTieTowardsSmallestBoundaries) {
  // 4 equal layers on 2 equal devices with a cost-free split: 2/2 is the only best bottleneck;
  // with 3 stages, 1/1/2 < 1/2/1 < 2/1/1 all have bottleneck 2 and sum 4.
  Instance in{std::vector<double>(4, 1.0), std::vector<int>(4, 1), {1.0, 1.0, 1.0}, {4, 4, 4},
              std::vector<double>(5, 0.0)};
  EXPECT_EQ(partition_min_bottleneck(in.problem())->boundaries, (std::vector<int>{0, 1, 2, 4}));
  in.speed = {1.0, 1.0};
  in.mem_limit = {4, 4};
  EXPECT_EQ(partition_min_bottleneck(in.problem())->boundaries, (std::vector<int>{0, 2, 4}));
}

TEST(Partitioner, OneLayerPerStageWhenStagesEqualLayers) {
  Instance in{{1.0, 2.0, 3.0, 4.0}, {1, 1, 1, 1}, {1.0, 2.0, 1.0, 4.0}, {1, 1, 1, 1},
              std::vector<double>(5, 0.0)};
  const auto r = partition_min_bottleneck(in.problem());
  ASSERT_TRUE(r);
  EXPECT_EQ(r->boundaries, (std::vector<int>{0, 1, 2, 3, 4}));
  EXPECT_EQ(r->bottleneck_s, 3.0);
  in.mem_limit[2] = 0;  // one stage cannot hold its layer
  EXPECT_FALSE(partition_min_bottleneck(in.problem()));
}

TEST(Partitioner, OneStageTakesEverything) {
  Instance in{{1.0, 2.0, 3.0}, {1, 1, 1}, {2.0}, {3}, std::vector<double>(4, 0.0)};
  const auto r = partition_min_bottleneck(in.problem());
  ASSERT_TRUE(r);
  EXPECT_EQ(r->boundaries, (std::vector<int>{0, 3}));
  EXPECT_EQ(r->bottleneck_s, 3.0);
  in.mem_limit = {2};
  EXPECT_FALSE(partition_min_bottleneck(in.problem()));
}

TEST(Partitioner, DegenerateSizesGiveNullopt) {
  const Instance in{{1.0, 1.0}, {1, 1}, {1.0, 1.0, 1.0}, {9, 9, 9}, std::vector<double>(3, 0.0)};
  EXPECT_FALSE(partition_min_bottleneck(in.problem()));  // 3 stages > 2 layers
  PartitionProblem p = in.problem();
  p.layers = 0;
  p.stages = 0;
  EXPECT_FALSE(partition_min_bottleneck(p));
  p.layers = 2;
  EXPECT_FALSE(partition_min_bottleneck(p));  // no stages
}

TEST(Partitioner, NonFiniteStageTimesCountAsNotFitting) {
  auto p = table_problem(2, 2, {{{0, 0, 1}, INFINITY}}, 1.0);
  EXPECT_FALSE(partition_min_bottleneck(p));
  p = table_problem(3, 2, {{{0, 0, 1}, NAN}}, 1.0);
  EXPECT_EQ(partition_min_bottleneck(p)->boundaries, (std::vector<int>{0, 2, 3}));
}
