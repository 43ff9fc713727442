// Collective steps against their algorithms' closed forms: every send has its receive, and
// each participant moves the bytes the algorithm says.
#include <gtest/gtest.h>

#include <map>
#include <tuple>

#include "model/error.hpp"
#include "partition/collective_steps.hpp"

using namespace hetflow;
using partition::CollectiveAlgorithm;
using partition::Channel;

namespace {

partition::Collective allreduce(CollectiveAlgorithm algorithm, std::vector<int> devices, double bytes) {
  partition::Collective c;
  c.algorithm = algorithm;
  c.devices = std::move(devices);
  c.bytes = bytes;
  return c;
}

int node_of_8(int device) { return device / 8; }

// Each (sender, receiver, channel) channel's sends, in order, must equal its receives in
// order: then every message matches one on the other side and nothing is left waiting.
void expect_all_messages_match(const partition::Collective& c) {
  using Key = std::tuple<int, int, Channel>;
  std::map<Key, int> sent, received;
  for (int d : c.devices) {
    for (const partition::Step& step : partition::collective_steps(c, d, node_of_8)) {
      for (const partition::Message& m : step.sends) ++sent[{d, m.peer, m.channel}];
      for (const partition::Message& m : step.receives) ++received[{m.peer, d, m.channel}];
    }
  }
  EXPECT_EQ(sent, received);
}

double bytes_sent(const std::vector<partition::Step>& steps, Channel channel) {
  double total = 0;
  for (const partition::Step& step : steps) {
    for (const partition::Message& m : step.sends) total += m.channel == channel ? m.bytes : 0;
  }
  return total;
}

}  // namespace

TEST(CollectiveSteps, RingSendsTwoNMinusOneChunksOfSOverN) {
  const double S = 1 << 20;
  for (int n : {2, 3, 4, 8, 13}) {
    std::vector<int> group;
    for (int d = 0; d < n; ++d) group.push_back(100 + 3 * d);
    const auto c = allreduce(CollectiveAlgorithm::ring, group, S);
    for (int d : group) {
      const auto steps = partition::collective_steps(c, d, node_of_8);
      ASSERT_EQ(steps.size(), static_cast<size_t>(2 * (n - 1))) << n;
      EXPECT_DOUBLE_EQ(bytes_sent(steps, Channel::ring), 2.0 * (n - 1) / n * S);
    }
    expect_all_messages_match(c);
  }
}

TEST(CollectiveSteps, TreeReducesUpAndBroadcastsDown) {
  const double S = 4e6;
  for (int n : {2, 3, 7, 10}) {
    std::vector<int> group;
    for (int d = 0; d < n; ++d) group.push_back(d);
    const auto c = allreduce(CollectiveAlgorithm::tree, group, S);
    // The root sends S down to each child; every other member sends S up and S to each child.
    for (int me = 0; me < n; ++me) {
      const int children = (2 * me + 1 < n) + (2 * me + 2 < n);
      const double expected = (me == 0 ? 0 : S) + children * S;
      EXPECT_DOUBLE_EQ(bytes_sent(partition::collective_steps(c, me, node_of_8), Channel::tree), expected) << n << " " << me;
    }
    expect_all_messages_match(c);
  }
}

TEST(CollectiveSteps, HierarchicalMovesSOverKInsideAndARingAcrossNodes) {
  const double S = 8e6;
  // Three nodes of eight (devices 0-23), all in the group.
  std::vector<int> group;
  for (int d = 0; d < 24; ++d) group.push_back(d);
  const auto c = allreduce(CollectiveAlgorithm::hierarchical, group, S);
  const int k = 8, m = 3;
  for (int d : group) {
    const auto steps = partition::collective_steps(c, d, node_of_8);
    EXPECT_DOUBLE_EQ(bytes_sent(steps, Channel::intra_scatter), (k - 1) * S / k);
    EXPECT_DOUBLE_EQ(bytes_sent(steps, Channel::intra_gather), (k - 1) * S / k);
    EXPECT_DOUBLE_EQ(bytes_sent(steps, Channel::inter_ring), 2.0 * (m - 1) / m * S / k);
    for (const partition::Step& step : steps) {
      for (const partition::Message& msg : step.sends) {
        const bool same_node = node_of_8(msg.peer) == node_of_8(d);
        EXPECT_EQ(same_node, msg.channel != Channel::inter_ring);  // only the middle ring leaves the node
        if (!same_node) {
          EXPECT_EQ(msg.peer % 8, d % 8);  // across nodes, only to the same local index (rail)
        }
      }
    }
  }
  expect_all_messages_match(c);
}

TEST(CollectiveSteps, UnevenNodesStillMatch) {
  // Nodes holding 3, 1 and 2 members: the inter-node rings have different sizes.
  const auto c = allreduce(CollectiveAlgorithm::hierarchical, {0, 1, 2, 9, 16, 17}, 6e6);
  expect_all_messages_match(c);
}

TEST(CollectiveSteps, EmptyOrSingleCollectivesAreARendezvousOrNothing) {
  const auto empty = allreduce(CollectiveAlgorithm::ring, {4, 5, 6}, 0);
  for (int d : empty.devices) {
    const auto steps = partition::collective_steps(empty, d, node_of_8);
    ASSERT_EQ(steps.size(), 1u);
    EXPECT_EQ(steps[0].sends.at(0).channel, Channel::meet);
    EXPECT_EQ(steps[0].sends.at(0).bytes, 0);
  }
  expect_all_messages_match(empty);
  EXPECT_TRUE(partition::collective_steps(allreduce(CollectiveAlgorithm::ring, {4}, 1e6), 4, node_of_8).empty());
  EXPECT_THROW(partition::collective_steps(empty, 7, node_of_8), Error);
}
