// The parallel axes by name: their names and placement orders as text, the registry that
// gives each axis its role and phase, layouts sized and checked by their workers, and the
// placement order that decides which devices share a group (against the closed form of
// each order: device = the coordinates read as digits, innermost lowest).
#include <gtest/gtest.h>

#include <functional>
#include <set>
#include <stdexcept>
#include <string>

#include "model/error.hpp"
#include "model/zoo.hpp"
#include "partition/axis_registry.hpp"
#include "partition/plan_builder.hpp"
#include "partition/plan_io.hpp"
#include "partition/policy.hpp"
#include "partition/validate.hpp"
#include "tests/partition/plan_test_util.hpp"

using namespace hetflow;
using namespace hetflow::partition;
using hetflow::test_support::error_of;

namespace {

const model::Network& gpt() {
  static const model::Network net =
      model::network_from_spec("gpt:layers=4,hidden=256,heads=8,seq=128,vocab=1000", model::Precision::fp16);
  return net;
}

Layout layout_of(const model::Cluster& cluster, PlanOptions o) {
  o.precision = gpt().precision;
  const CostModel cost(cluster, gpt().precision);
  return make_layout(cluster, gpt(), o, cost);
}

Plan plan_of(const model::Cluster& cluster, const PlanOptions& o) {
  const CostModel cost(cluster, gpt().precision);
  return build_plan(cluster, gpt(), layout_of(cluster, o), cost);
}

PlanOptions grid(int tensor, int pipeline, int data, const std::string& order) {
  PlanOptions o;
  o.tensor = tensor;
  o.pipeline = pipeline;
  o.data = data;
  o.microbatches = 4;
  o.axis_order = order;
  return o;
}

}  // namespace

TEST(Axis, NamesRoundTripAndUnknownOnesAreRefusedByName) {
  for (const Axis a : kAxes) EXPECT_EQ(parse_axis(to_string(a)), a);
  EXPECT_EQ(error_of([] { parse_axis("sequence"); }),
            "expected an axis (data, pipeline, tensor, context, expert), found 'sequence'");
}

TEST(Axis, PlacementOrdersNameEveryAxisOnce) {
  EXPECT_EQ(axis_order_text(default_axes()), "tensor,data,pipeline");
  EXPECT_EQ(axis_order_text(parse_axis_order("pipeline,tensor,data")), "pipeline,tensor,data");
  EXPECT_EQ(error_of([] { parse_axis_order("tensor,tensor,data"); }),
            "expected each axis once, found 'tensor' twice in 'tensor,tensor,data'");
  EXPECT_EQ(error_of([] { parse_axis_order("tensor,data"); }),
            "expected every placed axis (data, pipeline, tensor, context) once (context may be left out), found 'tensor,data'");
  EXPECT_EQ(error_of([] { parse_axis_order("tensor,,data"); }),
            "expected an axis (data, pipeline, tensor, context, expert), found ''");
  // Context may be listed, anywhere, or left out (size 1).
  EXPECT_EQ(axis_order_text(parse_axis_order("tensor,context,data,pipeline")), "tensor,context,data,pipeline");
  // Expert is never placed: it subdivides data.
  EXPECT_EQ(error_of([] { parse_axis_order("tensor,expert,data,pipeline"); }),
            "expected the placed axes (expert subdivides data: its groups are consecutive data indices, and its size is "
            "experts.parallel), found 'expert' in 'tensor,expert,data,pipeline'");
  EXPECT_EQ(error_of([] { parse_axis_order("tensor,context,data"); }),
            "expected every placed axis (data, pipeline, tensor, context) once (context may be left out), found "
            "'tensor,context,data'");
}

TEST(Axis, TheRegistryHasEveryAxisOnceWithItsRoleAndPhase) {
  ASSERT_EQ(axis_table().size(), kAxisCount);
  for (size_t i = 0; i < kAxisCount; ++i) EXPECT_EQ(axis_table()[i].axis, kAxes[i]);
  EXPECT_EQ(axis_rules(Axis::data).role, CommRole::data);
  EXPECT_EQ(axis_rules(Axis::pipeline).role, CommRole::pipeline);
  EXPECT_EQ(axis_rules(Axis::tensor).role, CommRole::tensor);
  // Each axis contributes at its scope: the tensor axis inside passes, the others by a phase.
  EXPECT_EQ(axis_rules(Axis::tensor).scope, AxisScope::in_rank);
  EXPECT_NE(axis_rules(Axis::tensor).pass_calls, nullptr);
  EXPECT_EQ(axis_rules(Axis::tensor).build, nullptr);
  EXPECT_EQ(axis_rules(Axis::pipeline).scope, AxisScope::across_ranks);
  EXPECT_EQ(axis_rules(Axis::data).scope, AxisScope::across_workers);
  for (const Axis a : {Axis::data, Axis::pipeline}) {
    EXPECT_NE(axis_rules(a).build, nullptr);
    EXPECT_EQ(axis_rules(a).pass_calls, nullptr);
  }
  EXPECT_EQ(axis_rules(Axis::tensor).call_purpose(CollectiveKind::all_reduce), Purpose::tensor_parallel);
  EXPECT_EQ(axis_rules(Axis::tensor).call_purpose(CollectiveKind::all_gather), Purpose::sequence_parallel);
}

TEST(Axis, ALayoutsAxesAreSizedByItsWorkers) {
  const Layout l = layout_of(test_support::identical_cluster(8), grid(2, 2, 2, ""));
  ASSERT_EQ(l.axes.size(), kAxisCount - 2);  // without context parallelism context is left out; expert always is
  EXPECT_EQ(axis_order_text(l.axes), "tensor,data,pipeline");
  EXPECT_EQ(l.size(Axis::tensor), 2);
  EXPECT_EQ(l.size(Axis::data), 2);
  EXPECT_EQ(l.size(Axis::pipeline), 2);
  EXPECT_EQ(l.fitted_axes(), l.axes);
  // A size the workers do not have is refused, naming the axis and what sizes it.
  Layout wrong = l;
  wrong.set_size(Axis::data, 3);
  EXPECT_EQ(error_of([&] { check_axes(wrong); }), "axes[1].size: expected 2 (data: the virtual workers), found 3");
  const CostModel cost(test_support::identical_cluster(8), gpt().precision);
  EXPECT_EQ(error_of([&] { build_plan(test_support::identical_cluster(8), gpt(), wrong, cost); }),
            "axes[1].size: expected 2 (data: the virtual workers), found 3");
  Layout twice = l;
  twice.axes[2].axis = Axis::tensor;
  EXPECT_EQ(error_of([&] { check_axes(twice); }),
            "axes: expected each axis once, found 'tensor' twice in 'tensor,data,tensor'");
}

// Megatron's order and its closed form: device pp*(D*T) + dp*T + tp.
TEST(Placement, MegatronsOrderPutsTensorThenDataThenPipeline) {
  const Layout l = layout_of(test_support::identical_cluster(8), grid(2, 2, 2, ""));
  for (int dp = 0; dp < 2; ++dp) {
    for (int pp = 0; pp < 2; ++pp) {
      for (int tp = 0; tp < 2; ++tp) {
        EXPECT_EQ(l.workers[static_cast<size_t>(dp)].ranks[static_cast<size_t>(pp)][static_cast<size_t>(tp)],
                  pp * 4 + dp * 2 + tp);
      }
    }
  }
}

// Every order of the three axes deals the same grid with its own strides: the device's index
// is the coordinates read as digits, innermost axis the lowest.
TEST(Placement, EveryOrderDealsDevicesAsItsDigits) {
  const int size[] = {3, 2, 2};  // data, pipeline, tensor
  for (const std::string order : {"tensor,data,pipeline", "tensor,pipeline,data", "data,tensor,pipeline",
                                  "data,pipeline,tensor", "pipeline,tensor,data", "pipeline,data,tensor"}) {
    const Layout l = layout_of(test_support::identical_cluster(12), grid(size[2], size[1], size[0], order));
    EXPECT_EQ(axis_order_text(l.axes), order);
    const std::vector<LayoutAxis> axes = parse_axis_order(order);
    for (int dp = 0; dp < size[0]; ++dp) {
      for (int pp = 0; pp < size[1]; ++pp) {
        for (int tp = 0; tp < size[2]; ++tp) {
          const int coord[] = {dp, pp, tp};
          int device = 0, stride = 1;
          for (const LayoutAxis& a : axes) {
            device += coord[static_cast<size_t>(a.axis)] * stride;
            stride *= size[static_cast<size_t>(a.axis)];
          }
          EXPECT_EQ(l.workers[static_cast<size_t>(dp)].ranks[static_cast<size_t>(pp)][static_cast<size_t>(tp)], device)
              << order;
        }
      }
    }
  }
}

// What the order is for: on 2 nodes of 4 GPUs with pipeline 2 x data 4, Megatron's order
// keeps the data-parallel all-reduce inside a node and sends activations between nodes;
// pipeline innermost does the opposite. Each plan validates and its coordinates say so.
TEST(Placement, TheOrderDecidesWhichGroupsStayInsideANode) {
  const model::Cluster cluster = test_support::identical_cluster(4, 2);
  const std::vector<model::Device> devices = cluster.devices();
  for (const std::string order : {"", "pipeline,data,tensor"}) {
    const Plan plan = plan_of(cluster, grid(1, 2, 4, order));
    EXPECT_TRUE(validate_plan(plan).ok()) << validate_plan(plan).problems.front();
    bool data_within_nodes = true, pipeline_within_nodes = true;
    for (const Communicator& c : plan.communicators) {
      std::set<int> nodes;
      for (const int d : c.devices) nodes.insert(devices[static_cast<size_t>(d)].node);
      if (c.role == CommRole::data) data_within_nodes = data_within_nodes && nodes.size() == 1;
      if (c.role == CommRole::pipeline) pipeline_within_nodes = pipeline_within_nodes && nodes.size() == 1;
    }
    EXPECT_EQ(data_within_nodes, order.empty()) << order;
    EXPECT_EQ(pipeline_within_nodes, !order.empty()) << order;
  }
}

// A plan keeps its order through its file; Megatron's order is written as the tensor degree
// alone, so that the plans of before named axes keep their bytes and fingerprints.
TEST(Placement, APlansOrderRoundTripsAndMegatronsKeepsItsBytes) {
  const model::Cluster cluster = test_support::identical_cluster(8);
  const Plan megatron = plan_of(cluster, grid(2, 2, 2, ""));
  const std::string text = write_plan_json(megatron);
  EXPECT_EQ(text.find("\"axes\": [{"), std::string::npos);
  EXPECT_NE(text.find("\"tensor\":2"), std::string::npos);
  const Plan back = read_plan_json(text, "plan.json");
  EXPECT_EQ(back.layout, megatron.layout);
  EXPECT_EQ(plan_fingerprint(back), plan_fingerprint(megatron));

  const Plan spread = plan_of(cluster, grid(2, 2, 2, "tensor,pipeline,data"));
  const std::string spread_text = write_plan_json(spread);
  EXPECT_NE(spread_text.find(R"("axes":[{"axis":"tensor","size":2},{"axis":"pipeline","size":2},{"axis":"data","size":2}])"),
            std::string::npos);
  const Plan spread_back = read_plan_json(spread_text, "plan.json");
  EXPECT_EQ(spread_back.layout, spread.layout);
  EXPECT_EQ(spread_back.coords, spread.coords);
  EXPECT_NE(plan_fingerprint(spread), plan_fingerprint(megatron));
}

TEST(Placement, OnlyTheGridPoliciesTakeAnOrder) {
  const model::Cluster cluster = test_support::identical_cluster(8);
  PlanOptions o = grid(1, 2, 0, "pipeline,tensor,data");
  o.policy = "hetpipe-np";
  EXPECT_EQ(error_of([&] { layout_of(cluster, o); }),
            "axis_order: policy hetpipe-np places its devices its own way; only uniform and balanced take `axis_order`");
  o.policy = "balanced";
  o.data = 4;
  EXPECT_EQ(layout_of(cluster, o).workers[1].ranks[0], std::vector<int>{2});  // pipeline innermost: worker 1 starts at 2
  o.axis_order = "pipeline,expert";
  EXPECT_EQ(error_of([&] { layout_of(cluster, o); }),
            "axis_order: expected the placed axes (expert subdivides data: its groups are consecutive data indices, and "
            "its size is experts.parallel), found 'expert' in 'pipeline,expert'");
  o.axis_order = "pipeline,sequence";
  EXPECT_EQ(error_of([&] { layout_of(cluster, o); }),
            "axis_order: expected an axis (data, pipeline, tensor, context, expert), found 'sequence'");
}
