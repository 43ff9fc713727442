// Expert parallelism's split against hand counts: groups along the data axis, a rank's
// parameters and FLOPs, and the dispatch all-to-all's parts under a routing model.
#include "partition/expert_shard.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <set>

#include "model/zoo.hpp"

using namespace hetflow;
using namespace hetflow::partition;

// 8 data indices x 2 context ranks, experts over 4: worker 5 is d = 2, c = 1; its group the
// data indices 0-3 at c = 1, its expert rank 2; its experts' other holder d = 6.
TEST(ExpertShard, GroupsLieAlongTheDataAxis) {
  EXPECT_EQ(expert_group(5, 8, 2, 4), (std::vector<int>{1, 3, 5, 7}));
  EXPECT_EQ(expert_rank(5, 2, 4), 2);
  EXPECT_EQ(expert_data_group(5, 8, 2, 4), (std::vector<int>{5, 13}));
  EXPECT_EQ(expert_group(5, 8, 2, 1), (std::vector<int>{5}));
  // Every worker in exactly one group, at its expert rank; the data groups of one rank hold
  // the same experts, one per group.
  std::multiset<int> seen;
  for (int w = 0; w < 16; ++w) {
    const std::vector<int> g = expert_group(w, 8, 2, 4);
    ASSERT_EQ(g.size(), 4u);
    EXPECT_EQ(g[static_cast<size_t>(expert_rank(w, 2, 4))], w);
    if (g.front() == w) seen.insert(g.begin(), g.end());
    for (int other : expert_data_group(w, 8, 2, 4)) EXPECT_EQ(expert_rank(other, 2, 4), expert_rank(w, 2, 4));
  }
  EXPECT_EQ(seen.size(), 16u);
  EXPECT_EQ(std::set<int>(seen.begin(), seen.end()).size(), 16u);
}

// Mixtral's layer over 4 expert ranks of 2 experts each: each rank holds the dense part and a
// quarter of the experts; together they hold the layer once and the dense part 4 times.
TEST(ExpertShard, ARankHoldsTheDensePartAndItsExperts) {
  const model::Network net = model::network_from_spec("mixtral-8x7b", model::Precision::bf16);
  const model::Layer& l = net.layers[1];
  const double expert = 3.0 * 4096 * 14336;
  EXPECT_DOUBLE_EQ(expert_rank_params(l, 2), l.params - 6 * expert);
  EXPECT_DOUBLE_EQ(4 * expert_rank_params(l, 2) - 3 * expert_rank_params(l, 0), l.params);
  EXPECT_DOUBLE_EQ(expert_rank_params(net.layers[0], 0), net.layers[0].params);  // the embedding has none
  // Forward FLOPs: attention (QKV, output, scores and context) and the router whatever the
  // load; the two experts a token meets, times the load.
  const double s = 4096, h = 4096;
  const double attention = 2 * s * h * (4096 + 2 * 1024) + 2 * s * 4096 * h + 4 * s * s * 4096;
  const double router = 2 * s * h * 8, routed = 2 * 2 * s * expert;
  EXPECT_DOUBLE_EQ(routed_forward_flops(l, s), routed);
  EXPECT_DOUBLE_EQ(rank_forward_flops(l, s, 0), attention + router);
  EXPECT_DOUBLE_EQ(rank_forward_flops(l, s, 1), l.forward_flops);
  EXPECT_DOUBLE_EQ(rank_forward_flops(l, s, 1.5), attention + router + 1.5 * routed);
}

// The dispatch's parts: even for an even router; for Zipf s = 1 over 4 experts on 2 ranks with
// capacity factor 1 (routing_test's case), 0.49 and 0.28 of the copies kept, 0.77 in all.
TEST(ExpertShard, DispatchPartsFollowTheRouting) {
  const Dispatch even = dispatch_parts(expert_shares(Routing{}, 64), contiguous_placement(64, 8), 0);
  EXPECT_DOUBLE_EQ(even.kept, 1);
  for (double p : even.parts) EXPECT_NEAR(p, 1.0 / 8, 1e-12);
  const Dispatch skewed =
      dispatch_parts(expert_shares(Routing{Routing::Kind::zipf, 1, {}}, 4), contiguous_placement(4, 2), 1);
  EXPECT_NEAR(skewed.kept, 0.77, 1e-12);
  EXPECT_NEAR(skewed.parts[0], 0.49 / 0.77, 1e-12);
  EXPECT_NEAR(skewed.parts[1], 0.28 / 0.77, 1e-12);
  EXPECT_NEAR(std::accumulate(skewed.parts.begin(), skewed.parts.end(), 0.0), 1, 1e-12);
}
