// Policies and what they share: parameter servers for ps and wsp under every policy.
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
