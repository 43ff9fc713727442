// Plan format 3's roles and coordinates against the layout they come from: every device's
// coordinates are its place in the layout (walked here independently), every communicator
// has the role of the traffic it carries and its members lie where that role puts them,
// groups of different roles over the same devices stay apart, and validation blames a plan
// whose roles or coordinates disagree with its layout.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "model/io.hpp"
#include "model/zoo.hpp"
#include "partition/plan_builder.hpp"
#include "partition/plan_io.hpp"
#include "partition/policy.hpp"
#include "partition/validate.hpp"
#include "tests/partition/plan_test_util.hpp"
#include "tests/scratch.hpp"

using namespace hetflow;
using namespace hetflow::partition;

namespace {

using test_support::plan_of;

std::string first_problem(const Plan& plan) {
  const Validation v = validate_plan(plan);
  return v.ok() ? "valid" : v.problems.front();
}

// The families the roles must cover: tensor and sequence parallelism with tied embeddings and
// clipping, parameter servers, WSP, a folded plan, stages of different tensor degrees.
std::vector<std::pair<std::string, Plan>> families() {
  const model::Network gpt = model::network_from_spec("gpt:layers=4,hidden=256,heads=8,seq=128,vocab=1000",
                                                      model::Precision::fp16);
  std::vector<std::pair<std::string, Plan>> out;
  auto add = [&](const std::string& name, PlanOptions o, const model::Cluster& cluster = test_support::identical_cluster(8)) {
    out.emplace_back(name, plan_of(cluster, gpt, o));
  };
  PlanOptions o;
  o.pipeline = 2;
  o.tensor = 2;
  o.data = 2;
  o.microbatches = 4;
  add("tp2 pp2 dp2", o);
  o.sequence_parallel = true;
  o.schedule = "interleaved";
  o.virtual_stages = 2;
  add("tp2 sp pp2 dp2 interleaved", o);
  o.sequence_parallel = false;
  o.schedule = "bfs";
  o.sync = SyncKind::ps;
  add("tp2 pp2 dp2 bfs ps", o);
  o.schedule = "gpipe";
  o.virtual_stages = 1;
  o.sync = SyncKind::wsp;
  o.staleness = 1;
  add("tp2 pp2 dp2 wsp", o);
  PlanOptions folded;  // replicas alike on nodes of a NIC per GPU
  folded.pipeline = 2;
  folded.tensor = 2;
  folded.data = 4;
  folded.microbatches = 2;
  folded.fold = true;
  add("folded tp2 pp2 dp4", folded, model::builtin_cluster("selene-2"));
  // Worker 0's stages at tensor-parallel degrees 2 and 1, worker 1's at 1 and 2: its layers
  // are all-reduced in pieces between ranks of different degrees.
  PlanOptions mixed;
  mixed.layout_file = test_support::write_file("roles-mixed-degrees.yaml", R"(workers:
  - microbatches: 2
    stages:
      - {devices: [n-0/gpu0, n-0/gpu1], layers: 0-2}
      - {devices: [n-0/gpu2], layers: 3-5}
  - microbatches: 2
    stages:
      - {devices: [n-1/gpu0], layers: 0-3}
      - {devices: [n-1/gpu1, n-1/gpu2], layers: 4-5}
)");
  add("stages of degrees 2 and 1", mixed, test_support::identical_cluster(4, 2));
  return out;
}

}  // namespace

TEST(PlanRoles, CoordinatesAreEachDevicesPlaceInTheLayout) {
  for (const auto& [name, plan] : families()) {
    ASSERT_EQ(plan.coords.size(), plan.device_names.size()) << name;
    std::vector<AxisCoords> expected(plan.device_names.size());
    for (size_t w = 0; w < plan.layout.workers.size(); ++w) {
      const auto& ranks = plan.layout.workers[w].ranks;
      for (size_t r = 0; r < ranks.size(); ++r) {
        for (size_t j = 0; j < ranks[r].size(); ++j) {
          expected[static_cast<size_t>(ranks[r][j])] = {static_cast<int>(w), static_cast<int>(r), static_cast<int>(j)};
        }
      }
    }
    EXPECT_EQ(plan.coords, expected) << name;
    EXPECT_EQ(first_problem(plan), "valid") << name;
  }
}

TEST(PlanRoles, EveryCommunicatorHasTheRoleOfWhatItCarries) {
  for (const auto& [name, plan] : families()) {
    std::set<int> used;
    for (const Collective& c : plan.collectives) {
      EXPECT_EQ(plan.communicator(c.communicator).role, role_of(c.purpose)) << name << ": " << to_string(c.purpose);
      used.insert(c.communicator);
    }
    for (const Task& t : plan.tasks) {
      if (t.kind != TaskKind::send && t.kind != TaskKind::recv) continue;
      const int comm = plan.channel(t.channel).communicator;
      EXPECT_EQ(plan.communicator(comm).role, role_of(t.purpose)) << name << ": " << to_string(t.purpose);
      used.insert(comm);
    }
    for (size_t i = 0; i < plan.communicators.size(); ++i) {
      EXPECT_NE(plan.communicators[i].role, CommRole::unspecified) << name << ": " << plan.communicators[i].name;
      EXPECT_TRUE(used.count(static_cast<int>(i))) << name << ": communicator " << i << " carries nothing";
    }
  }
}

// A back end finds a chunk's tensor-parallel group by role: exactly the ranks of more than one
// device (built worker by worker: worker 0's alone when folded), each once, in rank order.
TEST(PlanRoles, TensorGroupsAreExactlyTheLayoutsRanks) {
  for (const auto& [name, plan] : families()) {
    std::set<std::vector<int>> ranks, groups;
    const size_t built = plan.layout.folded ? 1 : plan.layout.workers.size();
    for (size_t w = 0; w < built; ++w) {
      for (const auto& rank : plan.layout.workers[w].ranks) {
        if (rank.size() > 1) ranks.insert(rank);
      }
    }
    for (const Communicator& c : plan.communicators) {
      if (c.role != CommRole::tensor) continue;
      EXPECT_TRUE(groups.insert(c.devices).second) << name << ": " << c.name << " twice";
    }
    EXPECT_EQ(groups, ranks) << name;
  }
}

// Two neighbouring pipeline ranks of one device each: their activation pair and their
// worker's clipping-norm group hold the same two devices. In format 2 they were one
// communicator (whichever was made first); a back end that runs them at once on different
// streams needs two.
TEST(PlanRoles, GroupsOfDifferentRolesOverTheSameDevicesStayApart) {
  PlanOptions o;
  o.pipeline = 2;
  o.data = 1;
  o.microbatches = 2;
  const Plan plan = plan_of(test_support::identical_cluster(2),
                            model::network_from_spec("gpt:layers=2,hidden=128,heads=4,seq=64,vocab=500", model::Precision::fp16), o);
  std::multiset<CommRole> roles;
  for (const Communicator& c : plan.communicators) {
    if (c.devices == std::vector<int>{0, 1}) roles.insert(c.role);
  }
  EXPECT_EQ(roles, (std::multiset<CommRole>{CommRole::pipeline, CommRole::embedding, CommRole::gradient_norm}));
}

TEST(PlanRoles, ValidationBlamesRolesAndCoordinatesThatDisagreeWithTheLayout) {
  const Plan good = families().front().second;
  ASSERT_EQ(first_problem(good), "valid");
  auto problem = [&](auto&& edit) {
    Plan plan = good;
    edit(plan);
    return first_problem(plan);
  };
  auto first_of = [&](const Plan& plan, CommRole role) {
    for (size_t i = 0; i < plan.communicators.size(); ++i) {
      if (plan.communicators[i].role == role) return i;
    }
    ADD_FAILURE() << "no " << to_string(role) << " communicator";
    return size_t{0};
  };
  const AxisCoords& placed = good.coords[3];
  const std::string moved = problem([](Plan& p) { p.coords[3][Axis::tensor] = 5; });
  EXPECT_NE(moved.find("coords[3]: expected [" + std::to_string(placed[Axis::data]) + ", " +
                       std::to_string(placed[Axis::pipeline]) + ", " + std::to_string(placed[Axis::tensor]) + ", " +
                       std::to_string(placed[Axis::context]) + ", " + std::to_string(placed[Axis::expert]) +
                       "] (where the layout places " + good.device_name(3) +
                       "), found [" + std::to_string(placed[Axis::data]) + ", " + std::to_string(placed[Axis::pipeline]) +
                       ", 5, " + std::to_string(placed[Axis::context]) + ", " + std::to_string(placed[Axis::expert]) + "]"),
            std::string::npos)
      << moved;
  EXPECT_NE(problem([](Plan& p) { p.coords.pop_back(); }).find("coords: expected one entry per device"), std::string::npos);
  const size_t tensor = first_of(good, CommRole::tensor), data = first_of(good, CommRole::data);
  auto mentions = [](const Plan& plan, const std::string& text) {
    const Validation v = validate_plan(plan);
    return std::any_of(v.problems.begin(), v.problems.end(), [&](const std::string& p) { return p.find(text) != std::string::npos; });
  };
  Plan reordered = good;  // (its collectives' participants are then out of order too)
  std::reverse(reordered.communicators[tensor].devices.begin(), reordered.communicators[tensor].devices.end());
  EXPECT_TRUE(mentions(reordered, "(tensor): expected the devices of one pipeline rank, in tensor-parallel order"))
      << first_problem(reordered);
  const std::string relabelled = problem([&](Plan& p) { p.communicators[data].role = CommRole::pipeline; });
  EXPECT_NE(relabelled.find("expected devices of one virtual worker"), std::string::npos) << relabelled;
  // Traffic of another role: the data group's gradients on a communicator called tensor.
  Plan carried = good;
  carried.communicators[data].role = CommRole::unspecified;
  EXPECT_EQ(first_problem(carried), "valid");  // an imported plan's groups say nothing
  carried.communicators[tensor].role = CommRole::data;
  EXPECT_TRUE(mentions(carried, "traffic on communicator " + std::to_string(tensor) + ", whose role is data (expected tensor)"))
      << first_problem(carried);
}

TEST(PlanRoles, RolesAndCoordinatesRoundTrip) {
  for (const auto& [name, plan] : families()) {
    const std::string json = write_plan_json(plan);
    const Plan back = read_plan_json(json, "plan.json");
    EXPECT_TRUE(same_plan(back, plan)) << name;
    EXPECT_EQ(back.coords, plan.coords) << name;
    for (size_t i = 0; i < plan.communicators.size(); ++i) EXPECT_EQ(back.communicators[i].role, plan.communicators[i].role);
  }
}
