// Policies and what they share: fixed cuts (--stage-layers), parameter servers for ps and
// wsp under every policy.
#include <gtest/gtest.h>

#include <set>

#include "model/error.hpp"
#include "model/io.hpp"
#include "model/zoo.hpp"
#include "partition/plan_builder.hpp"
#include "partition/policy.hpp"
#include "partition/validate.hpp"
#include "tests/partition/plan_test_util.hpp"

using namespace hetflow;
using namespace hetflow::partition;

namespace {

std::vector<int> layer_counts(const VirtualWorker& w) {
  std::vector<int> counts;
  for (const Stage& s : w.stages) counts.push_back(s.layer_end - s.layer_begin);
  return counts;
}

std::string error_field(const model::Cluster& cluster, const model::Network& net, const PlanOptions& o) {
  try {
    make_layout(cluster, net, o, CostModel(cluster, net.precision));
  } catch (const InputError& e) {
    return e.field();
  }
  return "no error";
}

}  // namespace

TEST(StageLayers, UniformAndBalancedKeepTheGivenCuts) {
  const model::Cluster cluster = model::builtin_cluster("hetpipe-testbed");
  const model::Network net = test_support::equal_layers(30);
  for (const char* policy : {"uniform", "balanced"}) {
    PlanOptions o;
    o.policy = policy;
    o.pipeline = 4;
    o.stage_layers = {7, 7, 6, 10};
    const Layout l = make_layout(cluster, net, o, CostModel(cluster, net.precision));
    ASSERT_EQ(l.workers.size(), 4u) << policy;
    for (const VirtualWorker& w : l.workers) {
      EXPECT_EQ(layer_counts(w), (std::vector<int>{7, 7, 6, 10})) << policy;
      EXPECT_EQ(w.stages.back().layer_end, 30);
    }
  }
}

TEST(StageLayers, CountsPerChunkWithVirtualStages) {
  const model::Network net = test_support::equal_layers(12);
  PlanOptions o;
  o.pipeline = 2;
  o.virtual_stages = 2;
  o.schedule = "interleaved";
  o.stage_layers = {1, 2, 3, 6};
  const model::Cluster cluster = test_support::identical_cluster(4);
  const Layout l = make_layout(cluster, net, o, CostModel(cluster, net.precision));
  EXPECT_EQ(l.workers.front().stages,
            (std::vector<Stage>{Stage{0, 1, 0}, Stage{1, 3, 1}, Stage{3, 6, 0}, Stage{6, 12, 1}}));
}

TEST(StageLayers, BadCountsNameTheOption) {
  const model::Cluster cluster = test_support::identical_cluster(8);
  const model::Network net = test_support::equal_layers(16);
  for (const std::vector<int>& counts : std::vector<std::vector<int>>{{8, 8}, {4, 4, 4, 5}, {8, 0, 4, 4}, {9, -1, 4, 4}}) {
    PlanOptions o;
    o.pipeline = 4;
    o.stage_layers = counts;
    EXPECT_EQ(error_field(cluster, net, o), "stage_layers") << counts.size();
  }
  PlanOptions hetpipe;
  hetpipe.policy = "hetpipe-ed";
  hetpipe.stage_layers = {8, 8};
  EXPECT_EQ(error_field(model::builtin_cluster("hetpipe-testbed"), net, hetpipe), "stage_layers");
}

TEST(ParameterServers, PsAndWspWorkWithUniformAndBalanced) {
  const model::Cluster cluster = model::builtin_cluster("hetpipe-testbed");
  const model::Network net = model::network_from_spec("vgg19", model::Precision::fp16);
  const CostModel cost(cluster, net.precision);
  for (const char* policy : {"uniform", "balanced"}) {
    for (SyncKind sync : {SyncKind::ps, SyncKind::wsp}) {
      PlanOptions o;
      o.policy = policy;
      o.pipeline = 4;
      o.data = 2;  // 8 of the 16 GPUs: nodes titanv and titanrtx only
      o.sync = sync;
      o.iterations = 2;
      const Layout l = make_layout(cluster, net, o, cost);
      ASSERT_EQ(l.sync.layer_server.size(), net.layers.size());
      // One server per node the layout runs on, at its first device there.
      std::set<int> used, servers(l.sync.layer_server.begin(), l.sync.layer_server.end());
      for (const VirtualWorker& w : l.workers) {
        for (const auto& rank : w.ranks) used.insert(rank.begin(), rank.end());
      }
      EXPECT_EQ(servers, (std::set<int>{0, 4})) << policy;
      for (int s : servers) EXPECT_TRUE(used.count(s)) << policy;
      const Validation v = validate_plan(build_plan(cluster, net, l, cost));
      EXPECT_TRUE(v.ok()) << policy << " " << to_string(sync) << ": " << (v.ok() ? "" : v.problems.front());
    }
  }
}

TEST(ParameterServers, HetPipeServesFromEveryNodesFirstGpu) {
  const model::Cluster cluster = model::builtin_cluster("hetpipe-testbed");
  const model::Network net = model::network_from_spec("vgg19", model::Precision::fp16);
  PlanOptions o;
  o.policy = "hetpipe-hd";
  const Layout l = make_layout(cluster, net, o, CostModel(cluster, net.precision));
  std::set<int> first_gpus;
  for (const model::Device& d : cluster.devices()) {
    if (d.local_rank == 0) first_gpus.insert(d.id);
  }
  EXPECT_EQ(std::set<int>(l.sync.layer_server.begin(), l.sync.layer_server.end()), first_gpus);
}

TEST(ParameterServers, AllreduceLayoutsHaveNone) {
  const model::Cluster cluster = test_support::identical_cluster(4);
  PlanOptions o;
  o.pipeline = 2;
  const model::Network net = test_support::equal_layers(8);
  EXPECT_TRUE(make_layout(cluster, net, o, CostModel(cluster, net.precision)).sync.layer_server.empty());
}
