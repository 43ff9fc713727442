// Links shared by concurrent flows against closed forms: k flows through one PCIe host bridge
// of bandwidth B get B/k each, flows weighted by their routes' latencies (SimGrid's CM02), a
// flow that finishes early handing its share to the others; and the layout estimate of
// tensor-parallel layouts behind one bridge equals the contention-free estimate on a cluster
// whose links give every flow that same share.
#include "partition/link_sharing.hpp"

#include <gtest/gtest.h>

#include "model/io.hpp"
#include "model/zoo.hpp"
#include "partition/layout_estimate.hpp"
#include "partition/policy.hpp"

using namespace hetflow;

namespace {

constexpr double kGB = 1e9;

// One node of 8 GPUs behind one host bridge of 32 GB/s, each GPU on a 64 GB/s link.
model::Cluster bridge_box(const char* intra = "{kind: pcie, bandwidth: 64 GB/s, latency: 4 us, uplink: 32 GB/s}") {
  return model::parse_cluster(std::string("name: box\nnodes:\n  - {name: box, gpu: RTX-3090, gpus: 8, intra: ") + intra +
                                  ", nic: {count: 1, bandwidth: 25 Gb/s, latency: 10 us}}\n",
                              "box.yaml");
}

}  // namespace

TEST(LinkSharing, KFlowsThroughOneBridgeGetAKthEach) {
  const partition::CostModel cost(bridge_box(), model::Precision::fp16);
  for (int k = 1; k <= 4; ++k) {
    std::vector<partition::Flow> flows;
    for (int i = 0; i < k; ++i) flows.push_back({i, i + 4});  // distinct GPU links, one bridge
    for (const double rate : partition::fair_shares_bytes_per_s(cost, flows)) EXPECT_DOUBLE_EQ(rate, 32 * kGB / k) << k;
  }
  // Opposite directions of a split-duplex GPU link do not meet; the bridge still joins them.
  const std::vector<double> two = partition::fair_shares_bytes_per_s(cost, {{0, 1}, {1, 0}});
  EXPECT_DOUBLE_EQ(two[0], 16 * kGB);
  EXPECT_DOUBLE_EQ(two[1], 16 * kGB);
  // A flow alone gets its route's bandwidth, the contention-free cost model's.
  EXPECT_DOUBLE_EQ(partition::fair_shares_bytes_per_s(cost, {{2, 5}})[0], cost.route(2, 5).bandwidth_bytes_per_s);
}

TEST(LinkSharing, FlowsShareInInverseProportionToTheirLatency) {
  // Two nodes: a flow inside the first (latency 4 us) and one to the other node (4 us of GPU
  // links, 2 x 10 us of NICs, 1 us of switch: 25 us) share the first node's bridge (4 GB/s,
  // the only link that binds: the NICs carry 12.5 GB/s). CM02: rates in proportion to
  // 1/latency.
  const model::Cluster two = model::parse_cluster(
      "name: two\nfabric: {kind: switch, latency: 1 us}\nnodes:\n  - {name: box, count: 2, gpu: RTX-3090, gpus: 2, intra: "
      "{kind: pcie, bandwidth: 64 GB/s, latency: 4 us, uplink: 4 GB/s}, nic: {count: 1, bandwidth: 100 Gb/s, latency: 10 us}}\n",
      "two.yaml");
  const partition::CostModel cost(two, model::Precision::fp16);
  const double near_s = cost.route(0, 1).latency_s, far_s = cost.route(0, 2).latency_s;
  ASSERT_DOUBLE_EQ(near_s, 4e-6);
  ASSERT_DOUBLE_EQ(far_s, 25e-6);
  const std::vector<double> r = partition::fair_shares_bytes_per_s(cost, {{0, 1}, {0, 2}});
  const double bridge = 4 * kGB;
  EXPECT_NEAR(r[0], bridge * (1 / near_s) / (1 / near_s + 1 / far_s), 1e-6 * bridge);
  EXPECT_NEAR(r[1], bridge * (1 / far_s) / (1 / near_s + 1 / far_s), 1e-6 * bridge);
}

TEST(LinkSharing, AFlowThatFinishesHandsItsShareToTheOthers) {
  // Two flows of a and b > a bytes through one bridge B: both at B/2 until the first ends at
  // 2a/B, then the second alone at B: it ends at (a + b)/B.
  const partition::CostModel cost(bridge_box(), model::Precision::fp16);
  const double a = 1e6, b = 3e6, bridge = 32 * kGB;
  const std::vector<double> mean = partition::mean_rates_bytes_per_s(cost, {{0, 4}, {1, 5}}, {a, b});
  EXPECT_NEAR(mean[0], a / (2 * a / bridge), 1e-9 * bridge);
  EXPECT_NEAR(mean[1], b / ((a + b) / bridge), 1e-9 * bridge);
}

TEST(LinkSharing, ARingOnTheBridgeTakesItsClosedForm) {
  // A ring all-reduce of S bytes over 4 GPUs behind the bridge: its 4 edges all cross the
  // bridge both ways, so each step moves S/4 at B/4: 2(n-1) (latency + S/n / (B/4)).
  const partition::CostModel cost(bridge_box(), model::Precision::fp16);
  partition::CollectiveSpec ring;
  ring.devices = {0, 1, 2, 3};
  ring.bytes = 64e6;
  partition::SharedPhase phase(cost);
  phase.add(ring);
  const double expected = 6 * (4e-6 + ring.bytes / 4 / (32 * kGB / 4));
  EXPECT_NEAR(phase.times_s()[0], expected, 1e-9 * expected);
  // Alone on the contention-free cost model: the route's 32 GB/s.
  EXPECT_NEAR(cost.collective_time_s(ring), 6 * (4e-6 + ring.bytes / 4 / (32 * kGB)), 1e-9 * expected);
  // Two such rings at once (two replicas' tensor groups) halve it again.
  partition::CollectiveSpec other = ring;
  other.devices = {4, 5, 6, 7};
  partition::SharedPhase both(cost);
  both.add(ring);
  both.add(other);
  const double halved = 6 * (4e-6 + ring.bytes / 4 / (32 * kGB / 8));
  for (const double t : both.times_s()) EXPECT_NEAR(t, halved, 1e-9 * halved);
}

// The layout estimate of Megatron tensor parallelism (t 4) behind the bridge, one replica
// (its ring's 4 flows on the bridge) and two (8 flows; the data-parallel pieces' 8 flows too),
// equals the contention-free estimate on a box with no bridge whose GPU links give every
// flow that share: B/4 and B/8.
TEST(LinkSharing, TheEstimateOfTensorParallelismBehindTheBridgeIsTheSharedBandwidths) {
  const model::Network net =
      model::network_from_spec("gpt:layers=4,hidden=1024,heads=16,seq=1024,vocab=8192", model::Precision::fp16);
  const model::Cluster shared = bridge_box();
  const partition::CostModel cost(shared, net.precision);
  for (const int data : {1, 2}) {
    const model::Cluster equivalent =
        bridge_box(data == 1 ? "{kind: pcie, bandwidth: 8 GB/s, latency: 4 us}" : "{kind: pcie, bandwidth: 4 GB/s, latency: 4 us}");
    const partition::CostModel alone(equivalent, net.precision);
    partition::PlanOptions o;
    o.precision = net.precision;
    o.tensor = 4;
    o.pipeline = 1;
    o.data = data;
    o.microbatches = 2;
    const partition::Layout layout = partition::make_layout(shared, net, o, cost);
    const double on_bridge = partition::estimate_layout(net, layout, cost).iteration_time_s;
    const double expected = partition::estimate_layout(net, layout, alone, {.shared_links = false}).iteration_time_s;
    // The gradient norm's 4 bytes are timed alone on each cluster's route: nanoseconds apart.
    EXPECT_NEAR(on_bridge, expected, 1e-6 * expected) << "data " << data;
    // Without sharing the bridge's whole 32 GB/s goes to every flow: faster.
    EXPECT_LT(partition::estimate_layout(net, layout, cost, {.shared_links = false}).iteration_time_s, on_bridge);
  }
}
