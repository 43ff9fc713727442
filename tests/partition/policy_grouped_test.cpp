// Policy grouped: its groups spelling (parsed, written back, refused with the group at
// fault), how it deals devices into workers (by type, tensor ranks inside a node, '*' takes
// what is left, the rest idle), and its split of the batch against the brute-force oracle.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <limits>
#include <set>

#include "model/error.hpp"
#include "model/io.hpp"
#include "model/zoo.hpp"
#include "partition/estimate.hpp"
#include "partition/layout_estimate.hpp"
#include "partition/plan_builder.hpp"
#include "partition/policy.hpp"
#include "partition/search.hpp"
#include "partition/validate.hpp"

using namespace hetflow;
using namespace hetflow::partition;

namespace {

// Two nodes of 4 V100, one of 4 T4 (the T4 node comes first, so device order is not type order).
model::Cluster mixed() {
  return model::parse_cluster("name: mixed\nnodes:\n"
                              "  - {name: t4, gpu: T4, gpus: 4, intra: {kind: pcie, bandwidth: 16 GB/s}, "
                              "nic: {count: 1, bandwidth: 25 Gb/s}}\n"
                              "  - {name: v100, count: 2, gpu: V100-16, gpus: 4, intra: {kind: nvlink, bandwidth: 150 GB/s}, "
                              "nic: {count: 1, bandwidth: 25 Gb/s}}\n",
                              "mixed.yaml");
}

model::Network gpt() {
  return model::network_from_spec("gpt:layers=8,hidden=512,heads=8,seq=256,vocab=8000", model::Precision::fp16);
}

PlanOptions grouped(const std::string& groups, int global_batch = 24) {
  PlanOptions o;
  o.policy = "grouped";
  o.groups = groups;
  o.global_batch = global_batch;
  return o;
}

std::string groups_error(const std::string& groups, int tensor = 1) {
  const model::Cluster cluster = mixed();
  PlanOptions o = grouped(groups);
  o.tensor = tensor;
  try {
    make_layout(cluster, gpt(), o, CostModel(cluster, model::Precision::fp16));
  } catch (const InputError& e) {
    EXPECT_EQ(e.field(), "groups") << e.what();
    return e.message();
  }
  ADD_FAILURE() << groups << ": accepted";
  return "";
}

std::string type_of(const model::Cluster& cluster, int device) {
  return cluster.nodes[static_cast<size_t>(cluster.devices()[static_cast<size_t>(device)].node)].gpu;
}

}  // namespace

TEST(GroupedPolicy, GroupsReadBackFromTheirCanonicalSpelling) {
  const model::Cluster cluster = mixed();
  const auto g = parse_groups(" *X4 v100-16 ,2x( 1 t4 + 2 V100-16 ), 1 T4", cluster);
  ASSERT_EQ(g.size(), 3u);
  EXPECT_EQ(g[0], (WorkerGroup{0, {{4, "V100-16"}}}));
  EXPECT_EQ(g[1], (WorkerGroup{2, {{1, "T4"}, {2, "V100-16"}}}));
  EXPECT_EQ(g[2], (WorkerGroup{1, {{1, "T4"}}}));
  const std::string canonical = groups_to_string(g);
  EXPECT_EQ(canonical, "*x4 V100-16, 2x(1 T4 + 2 V100-16), 1x1 T4");
  EXPECT_EQ(parse_groups(canonical, cluster), g);
}

TEST(GroupedPolicy, ATermsTensorDegreeReadsBackAsWritten) {
  const model::Cluster cluster = mixed();
  const auto g = parse_groups("*x4 v100-16 TP2, 2x(2 V100-16 tp2 + 1 T4 tp1), 2 T4", cluster);
  ASSERT_EQ(g.size(), 3u);
  EXPECT_EQ(g[0], (WorkerGroup{0, {{4, "V100-16", 2}}}));
  EXPECT_EQ(g[1], (WorkerGroup{2, {{2, "V100-16", 2}, {1, "T4", 1}}}));
  EXPECT_EQ(g[2], (WorkerGroup{1, {{2, "T4", 0}}}));
  const std::string canonical = groups_to_string(g);
  EXPECT_EQ(canonical, "*x4 V100-16 tp2, 2x(2 V100-16 tp2 + 1 T4 tp1), 1x2 T4");
  EXPECT_EQ(parse_groups(canonical, cluster), g);
}

TEST(GroupedPolicy, BadGroupsNameTheGroupAtFault) {
  EXPECT_NE(groups_error("*x4 V100-16 tpx").find("a tensor-parallel degree like 'tp2', found 'tpx'"), std::string::npos);
  EXPECT_NE(groups_error("*x4 V100-16 tp0").find("found 'tp0'"), std::string::npos);
  EXPECT_NE(groups_error("1x3 V100-16 tp2").find("3 GPUs do not make ranks of tp2"), std::string::npos);
  EXPECT_NE(groups_error("1x8 V100-16 tp8").find("too few free V100-16 in ranks of 8 within one node"), std::string::npos);
  EXPECT_NE(groups_error("2x4 A100-80").find("no GPU of type 'A100-80'"), std::string::npos);
  EXPECT_NE(groups_error("2x4 A100-80").find("T4, V100-16"), std::string::npos);
  EXPECT_NE(groups_error("*x4 V100-16, x T4").find("group 2"), std::string::npos);
  EXPECT_NE(groups_error("4V100-16").find("a count of GPUs, then their type"), std::string::npos);
  EXPECT_NE(groups_error("1x(2 T4 + 1 T4)").find("named twice"), std::string::npos);
  EXPECT_NE(groups_error("2x(1 T4").find("')'"), std::string::npos);
  EXPECT_NE(groups_error("*x4 V100-16,").find("empty"), std::string::npos);
  EXPECT_NE(groups_error("3x4 V100-16").find("worker 3 finds too few free V100-16"), std::string::npos);
  EXPECT_NE(groups_error("*x3 T4", 2).find("ranks of `tensor` 2"), std::string::npos);
  EXPECT_NE(groups_error("1x8 T4").find("too few"), std::string::npos);
  // Only policy grouped takes groups.
  const model::Cluster cluster = mixed();
  PlanOptions o = grouped("*x4 T4");
  o.policy = "balanced";
  EXPECT_THROW(make_layout(cluster, gpt(), o, CostModel(cluster, model::Precision::fp16)), InputError);
  o = grouped("");
  EXPECT_THROW(make_layout(cluster, gpt(), o, CostModel(cluster, model::Precision::fp16)), InputError);
}

TEST(GroupedPolicy, DealsDevicesByTypeInsideNodesAndLeavesTheRestIdle) {
  const model::Cluster cluster = mixed();
  const model::Network net = gpt();
  const CostModel cost(cluster, net.precision);
  PlanOptions o = grouped("*x4 V100-16, 1x(2 T4)");
  o.tensor = 2;
  const Layout l = make_layout(cluster, net, o, cost);
  ASSERT_EQ(l.workers.size(), 3u);  // two workers of 4 V100, one of 2 T4; two T4 idle
  std::set<int> used;
  for (size_t w = 0; w < l.workers.size(); ++w) {
    const VirtualWorker& vw = l.workers[w];
    const std::string type = w < 2 ? "V100-16" : "T4";
    EXPECT_EQ(vw.ranks.size(), w < 2 ? 2u : 1u);
    for (const auto& rank : vw.ranks) {
      ASSERT_EQ(rank.size(), 2u);  // a tensor-parallel rank of one node
      EXPECT_EQ(cluster.devices()[static_cast<size_t>(rank[0])].node, cluster.devices()[static_cast<size_t>(rank[1])].node);
      for (const int d : rank) {
        EXPECT_EQ(type_of(cluster, d), type);
        EXPECT_TRUE(used.insert(d).second) << "device " << d << " twice";
      }
    }
  }
  EXPECT_EQ(used.size(), 10u);
  // A worker of 4 V100 stays on one node.
  for (size_t w = 0; w < 2; ++w) {
    EXPECT_EQ(cluster.devices()[static_cast<size_t>(l.workers[w].ranks[0][0])].node,
              cluster.devices()[static_cast<size_t>(l.workers[w].ranks[1][0])].node);
  }
  EXPECT_EQ(l.samples_per_iteration(), 24);
  // It builds, validates and estimates as any layout.
  const Plan plan = build_plan(cluster, net, l, cost);
  EXPECT_NO_THROW(require_valid(plan));
  EXPECT_GT(estimate_plan(plan, cost).iteration_time_s, 0);
}

// A term's own degree deals exactly what `tensor` would, and degrees may differ between
// workers and between the stages of one worker: each builds, validates and estimates.
TEST(GroupedPolicy, TermsMayTakeTheirOwnTensorDegree) {
  const model::Cluster cluster = mixed();
  const model::Network net = gpt();
  const CostModel cost(cluster, net.precision);
  PlanOptions by_option = grouped("*x4 V100-16");
  by_option.tensor = 2;
  EXPECT_EQ(make_layout(cluster, net, grouped("*x4 V100-16 tp2"), cost), make_layout(cluster, net, by_option, cost));

  struct Case {
    std::string spec;
    std::set<size_t> v100, t4;  // the degrees of the ranks of each type
  };
  for (const Case& c : {Case{"*x4 V100-16 tp2, *x2 T4", {2}, {1}}, Case{"2x(2 V100-16 tp2 + 1 T4)", {2}, {1}},
                        Case{"1x4 V100-16 tp4, 1x(4 V100-16 + 2 T4 tp2)", {1, 4}, {2}}}) {
    const std::string& spec = c.spec;
    const Layout l = make_layout(cluster, net, grouped(spec), cost);
    std::set<size_t> degrees, v100, t4;
    for (const VirtualWorker& vw : l.workers) {
      for (const auto& rank : vw.ranks) {
        degrees.insert(rank.size());
        (type_of(cluster, rank[0]) == "T4" ? t4 : v100).insert(rank.size());
        for (const int d : rank) {
          EXPECT_EQ(cluster.devices()[static_cast<size_t>(d)].node, cluster.devices()[static_cast<size_t>(rank[0])].node);
        }
      }
    }
    EXPECT_EQ(v100, c.v100) << spec;
    EXPECT_EQ(t4, c.t4) << spec;
    EXPECT_EQ(l.size(Axis::tensor), static_cast<int>(*degrees.rbegin())) << spec;
    const Plan plan = build_plan(cluster, net, l, cost);
    EXPECT_NO_THROW(require_valid(plan)) << spec;
    EXPECT_GT(estimate_plan(plan, cost).iteration_time_s, 0) << spec;
  }
}

// The split's oracle: every way of giving `total` micro-batches to the workers (at least one
// each), the least largest finish time (m v + p - 1) x bottleneck.
TEST(GroupedPolicy, TheBatchSplitMinimisesTheSlowestPipelinesFinish) {
  const std::vector<std::vector<double>> bottlenecks = {{1.0, 1.0}, {1.0, 3.0}, {0.7, 1.3, 2.9}, {2.0, 0.5, 0.5}};
  const std::vector<std::vector<int>> depths = {{4, 2}, {1, 4}, {3, 1, 2}, {1, 8, 2}};
  for (size_t c = 0; c < bottlenecks.size(); ++c) {
    for (int v = 1; v <= 2; ++v) {
      for (int total = static_cast<int>(depths[c].size()); total <= 13; ++total) {
        const auto finish = [&](const std::vector<int>& m) {
          double worst = 0;
          for (size_t w = 0; w < m.size(); ++w) worst = std::max(worst, (m[w] * v + depths[c][w] - 1) * bottlenecks[c][w]);
          return worst;
        };
        double best = std::numeric_limits<double>::infinity();
        std::vector<int> m(depths[c].size(), 1);
        const std::function<void(size_t, int)> each = [&](size_t w, int left) {
          if (w + 1 == m.size()) {
            m[w] = left;
            best = std::min(best, finish(m));
            return;
          }
          for (int k = 1; k <= left - static_cast<int>(m.size() - w - 1); ++k) {
            m[w] = k;
            each(w + 1, left - k);
          }
        };
        each(0, total);
        const std::vector<int> split = policy_detail::split_microbatches_by_makespan(total, bottlenecks[c], depths[c], v);
        int sum = 0;
        for (const int k : split) {
          EXPECT_GE(k, 1);
          sum += k;
        }
        EXPECT_EQ(sum, total);
        EXPECT_NEAR(finish(split), best, 1e-12) << "case " << c << ", v " << v << ", " << total << " micro-batches";
      }
    }
  }
}

TEST(GroupedPolicy, FasterWorkersTakeMoreOfTheBatch) {
  const model::Cluster cluster = mixed();
  const model::Network net = gpt();
  const Layout l = make_layout(cluster, net, grouped("*x2 V100-16, *x2 T4", 48), CostModel(cluster, net.precision));
  ASSERT_EQ(l.workers.size(), 6u);
  EXPECT_EQ(l.samples_per_iteration(), 48);
  int v100 = 0, t4 = 0;
  for (const VirtualWorker& w : l.workers) {
    (type_of(cluster, w.ranks[0][0]) == "T4" ? t4 : v100) = w.microbatches;
  }
  EXPECT_GT(v100, t4);
}

TEST(GroupedPolicy, TheSearchsGroupingsDropSlowTypesAndMixThem) {
  const model::Cluster cluster = mixed();
  PlanOptions base;
  const std::vector<Grouping> g = search_groupings(cluster, gpt(), 1, base);
  std::set<std::string> specs;
  for (const Grouping& x : g) {
    specs.insert(x.groups);
    EXPECT_NO_THROW(parse_groups(x.groups, cluster)) << x.groups;
  }
  // The V100 alone (the T4 idle), each type in pipelines of its own, and mixed workers.
  EXPECT_TRUE(specs.count("*x1 V100-16")) << g.size();
  EXPECT_TRUE(specs.count("*x1 V100-16, *x1 T4"));
  EXPECT_TRUE(specs.count("*x2 V100-16, *x2 T4"));
  EXPECT_TRUE(specs.count("4x(2 V100-16 + 1 T4)"));
  EXPECT_TRUE(specs.count("2x(4 V100-16 + 2 T4)"));
  // One GPU type: nothing the uniform and balanced policies do not lay out already.
  EXPECT_TRUE(search_groupings(model::parse_cluster("name: one\nnodes:\n  - {name: a, gpu: A100-80, gpus: 8}\n", "one.yaml"),
                               gpt(), 1, base)
                  .empty());
}

// Per-type tensor degrees. Every grouping the search adds names two or more degrees and lays
// out. The oracle: every V100 and every T4 in pipelines of their own type, each at every
// degree and depth (54 groupings), estimated alike; the best of the search's by-type
// groupings (its descent's and those of one degree) is the best of them. Here, on a model
// wide enough for tensor parallelism to pay on NVLink and less so on PCIe, a mixed-degree
// grouping beats every grouping of one degree the search tries at batch 64. At batch 24 it
// does not: one worker of all 12 GPUs at degree 4 (`1x(8 V100-16 + 4 T4)`) is faster, which
// the simulation confirms (`hetflow search --policies grouped` on this cluster: 492 ms
// simulated, against 680 ms for the best mixed degrees, `*x8 V100-16 tp2, *x4 T4 tp1`, and
// 688 ms for `*x8 V100-16 tp4, *x4 T4 tp2`, which the estimate without shared links had
// first: the two by-type workers' data-parallel pieces share the nodes' NICs).
TEST(GroupedPolicy, TheSearchGivesEachTypeItsOwnTensorDegree) {
  const model::Cluster cluster = model::parse_cluster(
      "name: fast\nnodes:\n"
      "  - {name: t4, gpu: T4, gpus: 4, intra: {kind: pcie, bandwidth: 16 GB/s}, nic: {count: 1, bandwidth: 100 Gb/s}}\n"
      "  - {name: v100, count: 2, gpu: V100-16, gpus: 4, intra: {kind: nvlink, bandwidth: 150 GB/s}, "
      "nic: {count: 1, bandwidth: 100 Gb/s}}\n",
      "fast.yaml");
  const model::Network net = model::network_from_spec("gpt:layers=8,hidden=4096,heads=32,seq=1024,vocab=8000", model::Precision::fp16);
  const CostModel cost(cluster, net.precision);
  PlanOptions base;
  base.precision = net.precision;
  const std::vector<int> tensors = {1, 2, 4};
  const auto both_by_type = [](const std::string& groups) {  // "*x.. V100-16.., *x.. T4.."
    return groups.front() == '*' && groups.find(',') != std::string::npos && groups.find('(') == std::string::npos;
  };
  for (const int batch : {24, 64}) {
    const auto time_of = [&](const std::string& groups, int tensor) {
      PlanOptions o = grouped(groups, batch);
      o.tensor = tensor;
      return estimate_layout(net, make_layout(cluster, net, o, cost), cost).iteration_time_s;
    };
    const std::vector<Grouping> mixes = search_tensor_mixes(cluster, net, tensors, batch, base, cost);
    ASSERT_FALSE(mixes.empty());
    double by_type = std::numeric_limits<double>::infinity(), mixed = by_type, one_degree = by_type;
    for (const Grouping& g : mixes) {
      std::set<int> degrees;
      for (const WorkerGroup& group : parse_groups(g.groups, cluster)) {
        for (const GroupTerm& t : group.terms) degrees.insert(t.tensor > 0 ? t.tensor : g.tensor);
      }
      EXPECT_GE(degrees.size(), 2u) << g.groups;
      const double time = time_of(g.groups, g.tensor);
      mixed = std::min(mixed, time);
      if (both_by_type(g.groups)) by_type = std::min(by_type, time);
    }
    for (const int t : tensors) {
      for (const Grouping& g : search_groupings(cluster, net, t, base)) {
        const double time = time_of(g.groups, g.tensor);
        one_degree = std::min(one_degree, time);
        if (both_by_type(g.groups)) by_type = std::min(by_type, time);
      }
    }
    double best = std::numeric_limits<double>::infinity();
    std::string best_groups;
    for (const int tv : tensors) {
      for (const int dv : {1, 2, 4, 8}) {
        for (const int tt : tensors) {
          for (const int dt : {1, 2, 4}) {
            if (8 % (dv * tv) != 0 || 4 % (dt * tt) != 0) continue;
            const std::string groups = "*x" + std::to_string(dv * tv) + " V100-16 tp" + std::to_string(tv) + ", *x" +
                                       std::to_string(dt * tt) + " T4 tp" + std::to_string(tt);
            const double time = time_of(groups, 1);
            if (time < best) best = time, best_groups = groups;
          }
        }
      }
    }
    std::printf("batch %d: exhaustive best by type %s, %.4g s; the search's by type %.4g s; mixed degrees %.4g s, one "
                "degree %.4g s\n",
                batch, best_groups.c_str(), best, by_type, mixed, one_degree);
    EXPECT_NEAR(by_type, best, best * 1e-9) << batch;
    if (batch == 64) {
      EXPECT_LT(mixed, one_degree) << batch;
    } else {
      EXPECT_GT(mixed, one_degree) << batch;
    }
  }
}

// Mutated spellings (bytes replaced, inserted, cut; seeded) are read or refused with an
// InputError naming `groups`: nothing else escapes, and what is read writes back as read.
TEST(GroupedPolicy, MutatedGroupsAreReadOrRefusedNeverAnythingElse) {
  const model::Cluster cluster = mixed();
  const std::vector<std::string> seeds = {"*x4 V100-16, 2x(1 T4 + 2 V100-16)", "1x1 T4", "3x(2 V100-16)+",
                                          "*X2 t4,*x2 v100-16", "2x(2 V100-16 tp2 + 1 T4)"};
  const std::string alphabet = "0123456789*xX()+, \tTV-16abcpP\x01\xff";
  std::uint64_t state = 20261202;
  const auto next = [&state] {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<size_t>(state >> 33);
  };
  int read = 0, refused = 0;
  for (int i = 0; i < 20000; ++i) {
    std::string text = seeds[next() % seeds.size()];
    for (size_t edits = 1 + next() % 4; edits > 0; --edits) {
      const size_t at = text.empty() ? 0 : next() % text.size();
      const char c = alphabet[next() % alphabet.size()];
      switch (next() % 3) {
        case 0: if (!text.empty()) text[at] = c; break;
        case 1: text.insert(text.begin() + static_cast<std::ptrdiff_t>(at), c); break;
        default: if (!text.empty()) text.erase(at, 1 + next() % 3); break;
      }
    }
    try {
      const auto groups = parse_groups(text, cluster);
      EXPECT_EQ(parse_groups(groups_to_string(groups), cluster), groups) << text;
      ++read;
    } catch (const InputError& e) {
      EXPECT_EQ(e.field(), "groups") << text;
      ++refused;
    }
  }
  EXPECT_GT(read, 100);
  EXPECT_GT(refused, 100);
}
