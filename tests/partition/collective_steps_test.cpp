// Collective steps against their algorithms' closed forms: every participant's steps, played
// together with rendezvous semantics, complete with every send matched; and each participant
// sends and receives the bytes the algorithm says.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <tuple>

#include "model/error.hpp"
#include "partition/collective_steps.hpp"
#include "partition/ring_steps.hpp"

using namespace hetflow;
using partition::Lane;
using partition::CollectiveAlgorithm;
using partition::CollectiveKind;
using partition::CollectiveSpec;

namespace {

constexpr CollectiveKind kKinds[] = {CollectiveKind::all_reduce, CollectiveKind::reduce_scatter,
                                     CollectiveKind::all_gather,  CollectiveKind::broadcast,
                                     CollectiveKind::reduce,      CollectiveKind::all_to_all,
                                     CollectiveKind::sendrecv};
constexpr CollectiveAlgorithm kAlgorithms[] = {CollectiveAlgorithm::ring, CollectiveAlgorithm::tree,
                                               CollectiveAlgorithm::hierarchical, CollectiveAlgorithm::pairwise};

CollectiveSpec spec(CollectiveKind kind, CollectiveAlgorithm algorithm, std::vector<int> devices, double bytes,
                    int root = 0) {
  return CollectiveSpec{kind, algorithm, std::move(devices), bytes, root};
}

std::vector<int> first_devices(int n) {
  std::vector<int> devices;
  for (int d = 0; d < n; ++d) devices.push_back(d);
  return devices;
}

int node_of_8(int device) { return device / 8; }
int node_of_3(int device) { return device / 3; }  // n = 2..9 members fill nodes unevenly

std::string describe(const CollectiveSpec& c) {
  return std::string(partition::to_string(c.kind)) + "/" + std::string(partition::to_string(c.algorithm)) +
         " n=" + std::to_string(c.devices.size()) + " root=" + std::to_string(c.root);
}

// What playing a collective gave: whether every participant got through all its steps, and
// the bytes each one sent and received (a receive gets the bytes of the send it matched).
struct Played {
  bool completed = false;
  std::map<int, double> sent, received;
  std::map<int, std::set<int>> senders_to;  // device -> the peers it received bytes from
};

// Plays every participant's steps together: a participant posts its whole current step, a
// send and a receive match when sender, receiver and channel agree and both are posted, and a
// participant moves to its next step when everything in the current one has matched. On
// each (sender, receiver, channel), sends and receives therefore match in order; the play
// completes exactly when nothing is left waiting.
Played play(const CollectiveSpec& c, const std::function<int(int)>& node_of) {
  std::map<int, std::vector<partition::Step>> steps;
  std::map<int, size_t> at;
  std::map<int, partition::Step> posted;  // what is still unmatched of each current step
  for (int d : c.devices) {
    steps[d] = partition::collective_steps(c, d, node_of);
    at[d] = 0;
    if (!steps[d].empty()) posted[d] = steps[d][0];
  }
  Played p;
  for (bool moved = true; moved;) {
    moved = false;
    for (int d : c.devices) {
      auto& sends = posted[d].sends;
      for (size_t i = 0; i < sends.size();) {
        auto& receives = posted[sends[i].peer].receives;
        const auto match = std::find_if(receives.begin(), receives.end(), [&](const partition::Message& r) {
          return r.peer == d && r.lane == sends[i].lane;
        });
        if (match == receives.end() || at[sends[i].peer] >= steps[sends[i].peer].size()) {
          ++i;
          continue;
        }
        p.sent[d] += sends[i].bytes;
        p.received[sends[i].peer] += sends[i].bytes;
        if (sends[i].bytes > 0) p.senders_to[sends[i].peer].insert(d);
        receives.erase(match);
        sends.erase(sends.begin() + static_cast<long>(i));
        moved = true;
      }
    }
    for (int d : c.devices) {
      if (at[d] < steps[d].size() && posted[d].sends.empty() && posted[d].receives.empty()) {
        if (++at[d] < steps[d].size()) posted[d] = steps[d][at[d]];
        moved = true;
      }
    }
  }
  p.completed = true;
  for (int d : c.devices) p.completed = p.completed && at[d] == steps[d].size();
  return p;
}

double bytes_on(const std::vector<partition::Step>& steps, Lane channel) {
  double total = 0;
  for (const partition::Step& step : steps) {
    for (const partition::Message& m : step.sends) total += m.lane == channel ? m.bytes : 0;
  }
  return total;
}

}  // namespace

TEST(CollectiveSteps, EveryKindAndAlgorithmCompletes) {
  // Members in ring order, not sorted, so ring neighbours are not device neighbours.
  for (int n = 2; n <= 9; ++n) {
    std::vector<int> shuffled;
    for (int i = 0; i < n; ++i) shuffled.push_back((5 * i + 3) % 9);  // 5 is coprime with 9
    for (const std::vector<int>& devices : {first_devices(n), shuffled}) {
      for (CollectiveKind kind : kKinds) {
        for (CollectiveAlgorithm algorithm : kAlgorithms) {
          if (!partition::supports(kind, algorithm)) continue;
          for (int root : {0, n / 2, n - 1}) {
            const CollectiveSpec c = spec(kind, algorithm, devices, 1e6, root);
            for (auto node_of : {node_of_8, node_of_3}) EXPECT_TRUE(play(c, node_of).completed) << describe(c);
          }
        }
      }
    }
  }
}

TEST(CollectiveSteps, RingSendsTheRingClosedForms) {
  const double S = 1 << 20;
  for (int n = 2; n <= 9; ++n) {
    std::vector<int> group;
    for (int d = 0; d < n; ++d) group.push_back(100 + 3 * d);
    // all_reduce: 2(n-1) steps of S/n; reduce_scatter and all_gather: n-1 steps of S/n.
    for (auto [kind, steps] : {std::pair{CollectiveKind::all_reduce, 2 * (n - 1)},
                               std::pair{CollectiveKind::reduce_scatter, n - 1},
                               std::pair{CollectiveKind::all_gather, n - 1}}) {
      const CollectiveSpec c = spec(kind, CollectiveAlgorithm::ring, group, S);
      Played p = play(c, node_of_8);
      ASSERT_TRUE(p.completed) << describe(c);
      for (int d : group) {
        ASSERT_EQ(partition::collective_steps(c, d, node_of_8).size(), static_cast<size_t>(steps)) << describe(c);
        EXPECT_DOUBLE_EQ(partition::bytes_sent(c, d, node_of_8), steps * S / n) << describe(c);
        EXPECT_DOUBLE_EQ(p.received.at(d), steps * S / n) << describe(c);
      }
    }
  }
}

// ring_steps is the list collective_steps gives, summarised: every step one send of its
// bytes to `next` and one receive from `previous` on its lane, `count` of them; and nothing
// for the collectives whose steps are not such a ring.
TEST(CollectiveSteps, RingStepsSummariseTheListedRing) {
  for (int n = 1; n <= 9; ++n) {
    std::vector<int> shuffled;
    for (int i = 0; i < n; ++i) shuffled.push_back((5 * i + 3) % 9);
    for (CollectiveKind kind : kKinds) {
      for (CollectiveAlgorithm algorithm : kAlgorithms) {
        if (!partition::supports(kind, algorithm)) continue;
        for (double bytes : {0.0, 3e6}) {
          for (int messages : {1, 3}) {
            CollectiveSpec c = spec(kind, algorithm, shuffled, bytes);
            c.messages = messages;
            // (A sendrecv is one step of its own: listed, not summarised.)
            const bool a_ring = algorithm == CollectiveAlgorithm::ring && kind != CollectiveKind::broadcast &&
                                kind != CollectiveKind::reduce && kind != CollectiveKind::sendrecv && n >= 2 && bytes > 0 &&
                                messages == 1;
            for (int d : shuffled) {
              const auto ring = partition::ring_steps(c, d);
              ASSERT_EQ(ring.has_value(), a_ring) << describe(c);
              if (!ring) continue;
              const auto steps = partition::collective_steps(c, d, node_of_8);
              ASSERT_EQ(steps.size(), static_cast<size_t>(ring->count)) << describe(c);
              for (const auto& step : steps) {
                ASSERT_EQ(step.sends.size(), 1u);
                ASSERT_EQ(step.receives.size(), 1u);
                EXPECT_EQ(step.sends[0].peer, ring->next);
                EXPECT_EQ(step.sends[0].bytes, ring->bytes);
                EXPECT_EQ(step.sends[0].lane, ring->lane);
                EXPECT_EQ(step.receives[0].peer, ring->previous);
                EXPECT_EQ(step.receives[0].lane, ring->lane);
              }
              double listed = 0;
              for (const auto& step : steps) listed += step.sends[0].bytes;
              EXPECT_EQ(partition::bytes_sent(c, d, node_of_8), listed) << describe(c);
            }
          }
        }
      }
    }
  }
  EXPECT_THROW(partition::ring_steps(spec(CollectiveKind::all_reduce, CollectiveAlgorithm::ring, {1, 2}, 1e6), 3), Error);
}

// An all-to-all sends every other member its part at once: S x parts[q] to member q, so a
// member sends S (1 - its own part) and receives (n - 1) S x its part; uneven parts (a skewed
// router) load the members they favour.
TEST(CollectiveSteps, AllToAllSendsEachMemberItsPartAtOnce) {
  for (int n : {2, 4, 7}) {
    CollectiveSpec c = spec(CollectiveKind::all_to_all, CollectiveAlgorithm::pairwise, first_devices(n), 7e6);
    const Played even = play(c, node_of_3);
    ASSERT_TRUE(even.completed) << describe(c);
    for (int d = 0; d < n; ++d) {
      EXPECT_NEAR(even.sent.at(d), 7e6 * (n - 1) / n, 1e-3) << n;
      EXPECT_NEAR(even.received.at(d), 7e6 * (n - 1) / n, 1e-3) << n;
      EXPECT_EQ(partition::collective_steps(c, d, node_of_3).size(), 1u);
      EXPECT_NEAR(partition::bytes_sent(c, d, node_of_3), 7e6 * (n - 1) / n, 1e-3);
    }
    c.parts.assign(static_cast<size_t>(n), 0.5 / (n - 1));
    c.parts[0] = 0.5;
    const Played skewed = play(c, node_of_3);
    ASSERT_TRUE(skewed.completed);
    EXPECT_NEAR(skewed.received.at(0), (n - 1) * 0.5 * 7e6, 1e-3);
    EXPECT_NEAR(skewed.sent.at(0), 0.5 * 7e6, 1e-3);
    for (int d = 1; d < n; ++d) EXPECT_NEAR(skewed.sent.at(d), 7e6 * (1 - 0.5 / (n - 1)), 1e-3);
  }
  CollectiveSpec bad = spec(CollectiveKind::all_to_all, CollectiveAlgorithm::pairwise, first_devices(3), 1e6);
  bad.parts = {0.5, 0.5};
  EXPECT_THROW(partition::check_collective(bad), Error);  // one part per member
  bad.parts = {0.5, 0.5, 0.5};
  EXPECT_THROW(partition::check_collective(bad), Error);  // adding up to 1
  EXPECT_THROW(partition::check_collective(spec(CollectiveKind::all_to_all, CollectiveAlgorithm::ring, first_devices(3), 1)),
               Error);
  EXPECT_THROW(
      partition::check_collective(spec(CollectiveKind::all_reduce, CollectiveAlgorithm::pairwise, first_devices(3), 1)),
      Error);
}

// Hierarchical all-to-all over 3 nodes of 4 (members node by node): inside the node each
// member sends its neighbours the parts bound for their local index, (k-1)/k S in all; across,
// one message of k S/n to each of its m-1 peers, (m-1)/m S. Listed out of node order, it is
// pairwise.
TEST(CollectiveSteps, HierarchicalAllToAllGoesInsideTheNodeThenAcross) {
  const auto node_of = [](int d) { return d / 4; };
  const CollectiveSpec c = spec(CollectiveKind::all_to_all, CollectiveAlgorithm::hierarchical, first_devices(12), 12e6);
  ASSERT_TRUE(play(c, node_of).completed);
  for (int d = 0; d < 12; ++d) {
    const auto steps = partition::collective_steps(c, d, node_of);
    ASSERT_EQ(steps.size(), 2u);
    EXPECT_NEAR(bytes_on(steps, Lane::intra_scatter), 12e6 * 3 / 4, 1e-3);
    EXPECT_NEAR(bytes_on(steps, Lane::inter_ring), 12e6 * 2 / 3, 1e-3);
    EXPECT_EQ(steps[1].sends.size(), 2u);  // one message a peer
    for (const partition::Message& m : steps[1].sends) EXPECT_EQ(m.peer % 4, d % 4);
  }
  std::vector<int> interleaved;
  for (int i = 0; i < 12; ++i) interleaved.push_back((i % 3) * 4 + i / 3);  // nodes 0, 1, 2, 0, ...
  const CollectiveSpec mixed = spec(CollectiveKind::all_to_all, CollectiveAlgorithm::hierarchical, interleaved, 12e6);
  EXPECT_EQ(partition::collective_steps(mixed, 0, node_of).size(), 1u);
  EXPECT_TRUE(play(mixed, node_of).completed);
}

TEST(CollectiveSteps, BroadcastDeliversTheBufferOnceToEveryMember) {
  const double S = 4e6;
  for (int n = 2; n <= 9; ++n) {
    for (int root : {0, 1, n - 1}) {
      for (CollectiveAlgorithm algorithm : {CollectiveAlgorithm::ring, CollectiveAlgorithm::tree}) {
        const CollectiveSpec c = spec(CollectiveKind::broadcast, algorithm, first_devices(n), S, root);
        Played p = play(c, node_of_8);
        ASSERT_TRUE(p.completed) << describe(c);
        for (int d = 0; d < n; ++d) {
          // A chain member forwards to its successor (the last one to nobody); a tree member
          // to its children at heap positions 2q+1, 2q+2 counted from the root.
          const int q = (d - root + n) % n;
          const int successors = algorithm == CollectiveAlgorithm::ring ? (q + 1 < n) : (2 * q + 1 < n) + (2 * q + 2 < n);
          EXPECT_DOUBLE_EQ(partition::bytes_sent(c, d, node_of_8), successors * S) << describe(c) << " d=" << d;
          EXPECT_DOUBLE_EQ(p.received[d], d == root ? 0 : S) << describe(c) << " d=" << d;
          EXPECT_EQ(p.senders_to[d].size(), d == root ? 0u : 1u) << describe(c) << " d=" << d;
        }
      }
    }
  }
}

TEST(CollectiveSteps, ReduceSendsTheBufferOnceFromEveryMember) {
  const double S = 4e6;
  for (int n = 2; n <= 9; ++n) {
    for (int root : {0, 1, n - 1}) {
      for (CollectiveAlgorithm algorithm : {CollectiveAlgorithm::ring, CollectiveAlgorithm::tree}) {
        const CollectiveSpec c = spec(CollectiveKind::reduce, algorithm, first_devices(n), S, root);
        Played p = play(c, node_of_8);
        ASSERT_TRUE(p.completed) << describe(c);
        for (int d = 0; d < n; ++d) {
          // The chain runs from the root's successor to the root, so every member but the
          // first receives from one predecessor; a tree member receives from its children.
          const int q = (d - root + n) % n;
          const int predecessors = algorithm == CollectiveAlgorithm::ring ? (q != 1) : (2 * q + 1 < n) + (2 * q + 2 < n);
          EXPECT_DOUBLE_EQ(partition::bytes_sent(c, d, node_of_8), d == root ? 0 : S) << describe(c) << " d=" << d;
          EXPECT_DOUBLE_EQ(p.received[d], predecessors * S) << describe(c) << " d=" << d;
        }
      }
    }
  }
}

TEST(CollectiveSteps, TreeAllReduceReducesUpAndBroadcastsDown) {
  const double S = 4e6;
  for (int n = 2; n <= 9; ++n) {
    const CollectiveSpec c = spec(CollectiveKind::all_reduce, CollectiveAlgorithm::tree, first_devices(n), S);
    // The root sends S down to each child; every other member sends S up and S to each child.
    for (int me = 0; me < n; ++me) {
      const int children = (2 * me + 1 < n) + (2 * me + 2 < n);
      const double expected = (me == 0 ? 0 : S) + children * S;
      EXPECT_DOUBLE_EQ(partition::bytes_sent(c, me, node_of_8), expected) << n << " " << me;
    }
    EXPECT_TRUE(play(c, node_of_8).completed) << n;
  }
}

TEST(CollectiveSteps, HierarchicalMovesSOverKInsideAndARingAcrossNodes) {
  const double S = 8e6;
  // Three nodes of eight (devices 0-23), all in the group.
  const std::vector<int> group = first_devices(24);
  const int n = 24, k = 8, m = 3;
  // Rounds of each ring: all-reduce goes round twice (scatter and gather), the others once.
  for (auto [kind, rounds] : {std::pair{CollectiveKind::all_reduce, 2}, std::pair{CollectiveKind::reduce_scatter, 1},
                              std::pair{CollectiveKind::all_gather, 1}}) {
    const CollectiveSpec c = spec(kind, CollectiveAlgorithm::hierarchical, group, S);
    const Lane intra = kind == CollectiveKind::all_gather ? Lane::intra_gather : Lane::intra_scatter;
    for (int d : group) {
      const auto steps = partition::collective_steps(c, d, node_of_8);
      EXPECT_DOUBLE_EQ(bytes_on(steps, intra), (k - 1) * S / k);
      EXPECT_DOUBLE_EQ(bytes_on(steps, Lane::inter_ring), rounds * (m - 1.0) / m * S / k);
      // In total as much as the flat ring: rounds (n-1)/n S.
      EXPECT_DOUBLE_EQ(partition::bytes_sent(c, d, node_of_8), rounds * (n - 1.0) / n * S);
      for (const partition::Step& step : steps) {
        for (const partition::Message& msg : step.sends) {
          const bool same_node = node_of_8(msg.peer) == node_of_8(d);
          EXPECT_EQ(same_node, msg.lane != Lane::inter_ring);  // only the middle ring leaves the node
          if (!same_node) {
            EXPECT_EQ(msg.peer % 8, d % 8);  // across nodes, only to the same local index (rail)
          }
        }
      }
    }
    EXPECT_TRUE(play(c, node_of_8).completed);
  }
}

TEST(CollectiveSteps, HierarchicalOnUnevenNodesMovesEachNodesShares) {
  const double S = 6e6;
  for (int n = 2; n <= 9; ++n) {
    const std::vector<int> group = first_devices(n);  // nodes of three: the last one partly filled
    for (auto [kind, rounds] : {std::pair{CollectiveKind::all_reduce, 2}, std::pair{CollectiveKind::reduce_scatter, 1},
                                std::pair{CollectiveKind::all_gather, 1}}) {
      const CollectiveSpec c = spec(kind, CollectiveAlgorithm::hierarchical, group, S);
      ASSERT_TRUE(play(c, node_of_3).completed) << describe(c);
      for (int d : group) {
        // k: members on d's node; m: nodes with a member at d's local index (d % 3).
        const int k = std::min(3, n - d / 3 * 3);
        int m = 0;
        for (int first = 0; first < n; first += 3) m += first + d % 3 < n;
        const double expected = rounds * ((k - 1.0) / k * S + (m - 1.0) / m * S / k);
        EXPECT_DOUBLE_EQ(partition::bytes_sent(c, d, node_of_3), expected) << describe(c) << " d=" << d;
      }
    }
  }
}

TEST(CollectiveSteps, EmptyOrSingleCollectivesAreARendezvousOrNothing) {
  for (CollectiveKind kind : kKinds) {
    const CollectiveAlgorithm algorithm =
        kind == CollectiveKind::all_to_all ? CollectiveAlgorithm::pairwise : CollectiveAlgorithm::ring;
    const CollectiveSpec empty = spec(kind, algorithm, {4, 5, 6}, 0);
    for (int d : empty.devices) {
      const auto steps = partition::collective_steps(empty, d, node_of_8);
      ASSERT_EQ(steps.size(), 1u);
      EXPECT_EQ(steps[0].sends.at(0).lane, Lane::meet);
      EXPECT_EQ(steps[0].sends.at(0).bytes, 0);
    }
    EXPECT_TRUE(play(empty, node_of_8).completed);
    EXPECT_TRUE(partition::collective_steps(spec(kind, algorithm, {4}, 1e6), 4, node_of_8).empty());
    EXPECT_THROW(partition::collective_steps(empty, 7, node_of_8), Error);
  }
}

TEST(CollectiveSteps, RefusesAlgorithmsAKindHasNot) {
  const std::vector<int> group = first_devices(4);
  for (auto [kind, algorithm] : {std::pair{CollectiveKind::reduce_scatter, CollectiveAlgorithm::tree},
                                 std::pair{CollectiveKind::all_gather, CollectiveAlgorithm::tree},
                                 std::pair{CollectiveKind::broadcast, CollectiveAlgorithm::hierarchical},
                                 std::pair{CollectiveKind::reduce, CollectiveAlgorithm::hierarchical}}) {
    EXPECT_FALSE(partition::supports(kind, algorithm));
    EXPECT_THROW(partition::collective_steps(spec(kind, algorithm, group, 1e6), 0, node_of_8), Error);
  }
  for (int root : {-1, 4}) {
    EXPECT_THROW(
        partition::collective_steps(spec(CollectiveKind::broadcast, CollectiveAlgorithm::ring, group, 1e6, root), 0, node_of_8),
        Error);
  }
  try {
    partition::check_collective(spec(CollectiveKind::all_gather, CollectiveAlgorithm::tree, group, 1e6));
    FAIL() << "all_gather/tree accepted";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "all_gather has no tree algorithm; use ring or hierarchical");
  }
}

// The data the steps move: each member starts with its own buffer, and playing the steps
// (a step's sends carry the buffer as the step starts; a receive adds or overwrites its part)
// leaves what the kind promises (collective_steps.hpp). Oracle: the sums computed directly.
namespace {

using Buffers = std::map<int, std::vector<double>>;

// Plays the steps eagerly (a send is queued at once): the same matching order on each
// (sender, receiver, lane) as the rendezvous play above, which the tests above show completes.
Buffers play_data(const CollectiveSpec& c, const std::function<int(int)>& node_of, size_t count) {
  Buffers buffer;
  std::map<int, std::vector<partition::Step>> steps;
  std::map<int, size_t> at;
  for (int d : c.devices) {
    steps[d] = partition::collective_steps(c, d, node_of);
    buffer[d].resize(count);
    for (size_t i = 0; i < count; ++i) buffer[d][i] = static_cast<double>((d + 1) * 1000 + i);
  }
  auto index = [&](double fraction) { return static_cast<size_t>(std::llround(fraction * static_cast<double>(count))); };
  std::map<std::tuple<int, int, Lane>, std::vector<std::vector<double>>> queues;
  std::map<int, bool> posted;
  for (bool moved = true; moved;) {
    moved = false;
    for (int d : c.devices) {
      if (at[d] >= steps[d].size()) continue;
      const partition::Step& step = steps[d][at[d]];
      if (!posted[d]) {
        for (const partition::Message& m : step.sends) {
          queues[{d, m.peer, m.lane}].emplace_back(buffer[d].begin() + static_cast<std::ptrdiff_t>(index(m.begin)),
                                                   buffer[d].begin() + static_cast<std::ptrdiff_t>(index(m.end)));
        }
        posted[d] = true;
      }
      std::map<std::tuple<int, int, Lane>, size_t> needed;
      for (const partition::Message& m : step.receives) ++needed[{m.peer, d, m.lane}];
      bool ready = true;
      for (const auto& [key, n] : needed) ready = ready && queues[key].size() >= n;
      if (!ready) continue;
      for (const partition::Message& m : step.receives) {
        auto& q = queues[{m.peer, d, m.lane}];
        const std::vector<double> data = q.front();
        q.erase(q.begin());
        const size_t b = index(m.begin);
        EXPECT_EQ(data.size(), index(m.end) - b) << describe(c) << ": a message carries the part its receiver expects";
        for (size_t i = 0; i < data.size() && b + i < count; ++i) {
          buffer[d][b + i] = m.reduce ? buffer[d][b + i] + data[i] : data[i];
        }
      }
      ++at[d];
      posted[d] = false;
      moved = true;
    }
  }
  for (int d : c.devices) EXPECT_EQ(at[d], steps[d].size()) << describe(c) << " device " << d;
  return buffer;
}

}  // namespace

TEST(CollectiveStepsData, EveryKindComputesWhatItPromises) {
  constexpr size_t kCount = 2 * 3 * 4 * 5 * 7 * 8;  // every part boundary below is a whole element
  for (CollectiveKind kind : kKinds) {
    for (CollectiveAlgorithm algorithm : kAlgorithms) {
      if (!partition::supports(kind, algorithm)) continue;
      // Hierarchical: 3 nodes of 2 (node_of = d / 2) so parts are l*m + q of k*m.
      for (int n : {2, 3, 5, 6, 8}) {
        if (algorithm == CollectiveAlgorithm::hierarchical && n % 2 != 0) continue;
        const auto node_of = [](int d) { return d / 2; };
        const CollectiveSpec c = spec(kind, algorithm, first_devices(n), static_cast<double>(kCount) * 4, 1);
        const Buffers out = play_data(c, node_of, kCount);
        std::vector<double> total(kCount, 0);
        for (int d = 0; d < n; ++d) {
          for (size_t i = 0; i < kCount; ++i) total[i] += static_cast<double>((d + 1) * 1000 + i);
        }
        auto own_part = [&](int d) {  // reduce_scatter's result, all_gather's contribution
          const size_t parts = static_cast<size_t>(n);
          const size_t p = algorithm == CollectiveAlgorithm::hierarchical
                               ? static_cast<size_t>((d % 2) * (n / 2) + d / 2)
                               : static_cast<size_t>(d);
          return std::pair<size_t, size_t>{p * kCount / parts, (p + 1) * kCount / parts};
        };
        for (int d = 0; d < n; ++d) {
          const std::vector<double>& b = out.at(d);
          if (kind == CollectiveKind::reduce_scatter || kind == CollectiveKind::all_gather) {
            // What an executor reads as a member's shard (ZeRO) is the part the data shows.
            const auto [begin, end] = partition::member_part(c, d, node_of);
            EXPECT_EQ(std::llround(begin * kCount), static_cast<long long>(own_part(d).first)) << describe(c) << " device " << d;
            EXPECT_EQ(std::llround(end * kCount), static_cast<long long>(own_part(d).second)) << describe(c) << " device " << d;
          }
          switch (kind) {
            case CollectiveKind::all_reduce:
              EXPECT_EQ(b, total) << describe(c) << " device " << d;
              break;
            case CollectiveKind::broadcast:
              EXPECT_EQ(b[0], 2000) << describe(c) << " device " << d;  // the root's (device 1)
              EXPECT_EQ(b[kCount - 1], 2000 + static_cast<double>(kCount - 1)) << describe(c) << " device " << d;
              break;
            case CollectiveKind::reduce:
              if (d == 1) {
                EXPECT_EQ(b, total) << describe(c);
              }
              break;
            case CollectiveKind::reduce_scatter: {
              const auto [lo, hi] = own_part(d);
              EXPECT_TRUE(std::equal(b.begin() + static_cast<std::ptrdiff_t>(lo), b.begin() + static_cast<std::ptrdiff_t>(hi),
                                     total.begin() + static_cast<std::ptrdiff_t>(lo)))
                  << describe(c) << " device " << d;
              break;
            }
            case CollectiveKind::all_gather:
              for (int from = 0; from < n; ++from) {
                const auto [lo, hi] = own_part(from);
                EXPECT_EQ(b[lo], static_cast<double>((from + 1) * 1000 + lo)) << describe(c) << " device " << d;
                EXPECT_EQ(b[hi - 1], static_cast<double>((from + 1) * 1000 + hi - 1)) << describe(c) << " device " << d;
              }
              break;
            case CollectiveKind::sendrecv: {  // the previous member's buffer, whole
              const int from = (d + n - 1) % n;
              EXPECT_EQ(b[0], static_cast<double>((from + 1) * 1000)) << describe(c) << " device " << d;
              EXPECT_EQ(b[kCount - 1], static_cast<double>((from + 1) * 1000 + kCount - 1)) << describe(c) << " device " << d;
              EXPECT_NEAR(partition::bytes_sent(c, d, node_of), c.bytes, 1e-6) << describe(c);
              break;
            }
            case CollectiveKind::all_to_all:  // piece `from` of d's output: piece d of member from's buffer
              for (int from = 0; from < n; ++from) {
                const size_t lo = static_cast<size_t>(from) * kCount / static_cast<size_t>(n);
                const size_t theirs = static_cast<size_t>(d) * kCount / static_cast<size_t>(n);
                EXPECT_EQ(b[lo], static_cast<double>((from + 1) * 1000 + theirs)) << describe(c) << " device " << d;
              }
              break;
          }
        }
      }
    }
  }
}

// m messages: m collectives one after another, over consecutive m-ths of the buffer or (a
// reduce-scatter, an all-gather) of every member's part. Every kind computes what one
// message does, and sends the same bytes in m times the steps.
TEST(CollectiveStepsData, MessagesComputeWhatOneCollectiveDoesPartByPart) {
  constexpr size_t kCount = 2 * 3 * 4 * 5 * 7 * 8;
  const auto node_of = [](int d) { return d / 2; };
  for (CollectiveKind kind : kKinds) {
    for (CollectiveAlgorithm algorithm : kAlgorithms) {
      if (!partition::supports(kind, algorithm)) continue;
      for (int n : {2, 4, 5}) {  // every boundary of every third a whole element
        if (algorithm == CollectiveAlgorithm::hierarchical && n % 2 != 0) continue;
        const CollectiveSpec one = spec(kind, algorithm, first_devices(n), static_cast<double>(kCount) * 4, 1);
        CollectiveSpec three = one;
        three.messages = 3;
        for (int d = 0; d < n; ++d) {
          EXPECT_EQ(partition::collective_steps(three, d, node_of).size(), 3 * partition::collective_steps(one, d, node_of).size())
              << describe(one);
          EXPECT_NEAR(partition::bytes_sent(three, d, node_of), partition::bytes_sent(one, d, node_of), 1e-6) << describe(one);
        }
        const Buffers out = play_data(three, node_of, kCount);
        const Buffers expected = play_data(one, node_of, kCount);
        for (int d = 0; d < n; ++d) EXPECT_EQ(out.at(d), expected.at(d)) << describe(one) << " device " << d;
      }
    }
  }
}

// Uneven parts (ZeRO's shares by device memory): a ring reduce-scatter leaves member i the
// sum of its part [c_i, c_(i+1)) (c the parts' cuts) and an all-gather brings every member's
// part, in one message or three; over its n - 1 steps a member sends every part but one (its
// own in a reduce-scatter, its successor's in an all-gather), each S x its share.
TEST(CollectiveStepsData, UnevenPartsLeaveEachMemberItsShare) {
  constexpr size_t kCount = 2 * 3 * 4 * 5 * 7 * 8;
  const auto node_of = [](int d) { return d; };
  const std::vector<double> parts{0.125, 0.375, 0.25, 0.25};  // each cut a whole element of kCount, and of its thirds
  const std::vector<double> cuts = partition::part_cuts(parts, parts.size());
  ASSERT_EQ(cuts, (std::vector<double>{0, 0.125, 0.5, 0.75, 1}));
  for (CollectiveKind kind : {CollectiveKind::reduce_scatter, CollectiveKind::all_gather}) {
    for (int messages : {1, 3}) {
      CollectiveSpec c = spec(kind, CollectiveAlgorithm::ring, first_devices(4), static_cast<double>(kCount) * 4, 0);
      c.parts = parts;
      c.messages = messages;
      const Buffers out = play_data(c, node_of, kCount);
      for (int d = 0; d < 4; ++d) {
        const auto [begin, end] = partition::member_part(c, d, node_of);
        EXPECT_EQ(begin, cuts[static_cast<size_t>(d)]) << describe(c);
        EXPECT_EQ(end, cuts[static_cast<size_t>(d) + 1]) << describe(c);
        const auto lo = static_cast<size_t>(std::llround(begin * kCount)), hi = static_cast<size_t>(std::llround(end * kCount));
        const std::vector<double>& b = out.at(d);
        for (size_t i = lo; i < hi; ++i) {
          if (kind == CollectiveKind::reduce_scatter) {
            ASSERT_EQ(b[i], 4 * static_cast<double>(i) + 10000) << describe(c) << " device " << d << " element " << i;
          }
        }
        if (kind == CollectiveKind::all_gather) {
          for (int from = 0; from < 4; ++from) {
            const auto a = static_cast<size_t>(std::llround(cuts[static_cast<size_t>(from)] * kCount));
            const auto z = static_cast<size_t>(std::llround(cuts[static_cast<size_t>(from) + 1] * kCount));
            for (size_t i = a; i < z; ++i) {
              ASSERT_EQ(b[i], static_cast<double>((from + 1) * 1000 + i)) << describe(c) << " device " << d;
            }
          }
        }
        // A member sends every part but one: its own (all-gather: the one it receives first).
        const size_t skipped = kind == CollectiveKind::reduce_scatter ? static_cast<size_t>(d) : static_cast<size_t>((d + 1) % 4);
        EXPECT_NEAR(partition::bytes_sent(c, d, node_of), c.bytes * (1 - parts[skipped]), 1e-6) << describe(c) << " device " << d;
      }
    }
  }
  // Parts belong to a ring: a hierarchical reduce-scatter, or an all-reduce, with them is refused.
  CollectiveSpec h = spec(CollectiveKind::reduce_scatter, CollectiveAlgorithm::hierarchical, first_devices(4), 64, 0);
  h.parts = parts;
  EXPECT_THROW(partition::check_collective(h), Error);
  CollectiveSpec r = spec(CollectiveKind::all_reduce, CollectiveAlgorithm::ring, first_devices(4), 64, 0);
  r.parts = parts;
  EXPECT_THROW(partition::check_collective(r), Error);
}
