// Context parallelism simulated against hand-computed transfers: two single-GPU nodes on a
// flat network, one context group of two splitting each sequence. Every message of a
// context group's in-task collectives is a ring all-gather or reduce-scatter of S bytes over
// n = 2: (n - 1) / n S over the route plus (n - 1) latencies, and both members reach it
// together (their passes are alike), so its simulated time is exactly that. The iteration
// agrees with the analytic estimate, and folding a plan of several context groups simulates
// what the whole plan does. Under a ring (--cp-comm ring) each message is a sendrecv of 1/C
// of the keys and values, S/C over the route plus one latency, and a pass waits only for what
// outlasts the part of its work the message overlaps.
#include <gtest/gtest.h>

#include <string>

#include "model/io.hpp"
#include "model/zoo.hpp"
#include "partition/estimate.hpp"
#include "partition/plan_builder.hpp"
#include "partition/policy.hpp"
#include "partition/validate.hpp"
#include "sim/simulator.hpp"
#include "traces/event_index.hpp"

using namespace hetflow;

namespace {

partition::Plan plan_of(const model::Cluster& cluster, const model::Network& net, partition::PlanOptions o) {
  o.precision = net.precision;
  const partition::CostModel cost(cluster, net.precision);
  return partition::build_plan(cluster, net, partition::make_layout(cluster, net, o, cost), cost);
}

}  // namespace

TEST(SimulatedContext, EachGatherAndScatterTakesItsHandComputedTransfer) {
  const model::Cluster cluster = model::parse_cluster(
      "name: flat\nfabric: {kind: switch, latency: 0 s}\nnodes:\n  - {name: n, count: 2, gpu: A100-80, gpus: 1, "
      "intra: {kind: nvswitch, bandwidth: 1000 TB/s, latency: 0 s}, nic: {count: 1, bandwidth: 10000000000 B/s, "
      "latency: 0.000005 s}}\n",
      "flat.yaml");
  const model::Network net = model::network_from_spec(
      "llama:layers=2,hidden=512,heads=8,kv_heads=8,ffn=1024,vocab=1000,seq=4096", model::Precision::bf16);
  partition::PlanOptions o;
  o.context = 2;
  o.microbatches = 2;
  o.workspace_bytes = 0;
  const partition::Plan plan = plan_of(cluster, net, o);
  ASSERT_TRUE(partition::validate_plan(plan).ok()) << partition::validate_plan(plan).problems.front();
  const partition::CostModel cost(cluster, net.precision);
  const partition::Route route = cost.route(0, 1);
  // Keys and values of 4,096 tokens x 512 wide, in bf16: 8 MiB, of which each member sends half.
  const double bytes = 2.0 * 4096 * 512 * 2;
  const double transfer = (2 - 1) / 2.0 * bytes / route.bandwidth_bytes_per_s + (2 - 1) * route.latency_s;
  const sim::SimResult r = sim::simulate(plan, {});
  ASSERT_TRUE(r.completed);
  int messages = 0;
  for (const traces::Event& e : r.trace.events) {
    if (e.purpose != partition::Purpose::context_parallel) continue;
    ASSERT_GE(e.message, 0);
    EXPECT_NEAR((e.end_s - e.start_s) / transfer, 1.0, 0.01) << e.start_s;
    ++messages;
  }
  // Per device and micro-batch: a gather per layer forward, a gather and a scatter backward.
  EXPECT_EQ(messages, 2 * 2 * 3 * 2);
  EXPECT_NEAR(r.simulated_s / partition::estimate_plan(plan, cost).iteration_time_s, 1.0, 0.01);
}

TEST(SimulatedContext, AFoldedPlanSimulatesAsTheWholePlan) {
  // Four nodes of two GPUs, 4 replicas of context groups of 2 placed data-innermost, so that
  // a group's two workers sit on different nodes and the replicas' ring crosses NICs: the
  // folded plan simulates the first group's two workers, whose ring flows to each other
  // each posts once (a member standing for its replicas posts the flow from a predecessor
  // without a task of its own, never one from a simulated predecessor).
  const model::Cluster cluster = model::parse_cluster(
      "name: four\nnodes:\n  - {name: n, count: 4, gpu: A100-80, gpus: 2, intra: {kind: nvswitch, bandwidth: 300 GB/s, "
      "latency: 2 us}, nic: {count: 2, bandwidth: 100 Gb/s}}\n",
      "four.yaml");
  const model::Network net = model::network_from_spec(
      "llama:layers=4,hidden=2048,heads=16,kv_heads=8,ffn=8192,vocab=32000,seq=4096", model::Precision::bf16);
  for (const auto& [zero, comm] : {std::pair{0, partition::ContextComm::all_gather}, {1, partition::ContextComm::all_gather},
                                   {3, partition::ContextComm::all_gather}, {0, partition::ContextComm::ring},
                                   {3, partition::ContextComm::ring}}) {
    partition::PlanOptions o;
    o.context = 2;
    o.context_comm = comm;
    o.axis_order = "tensor,data,context,pipeline";
    o.microbatches = 2;
    o.zero_stage = zero;
    const partition::Plan whole = plan_of(cluster, net, o);
    o.fold = true;
    const partition::Plan folded = plan_of(cluster, net, o);
    ASSERT_TRUE(folded.layout.folded);
    ASSERT_EQ(folded.layout.workers[1].ranks[0][0], 4);  // the group's second worker, on another node
    ASSERT_TRUE(partition::validate_plan(folded).ok()) << partition::validate_plan(folded).problems.front();
    EXPECT_LT(folded.tasks.size() * 3, whole.tasks.size());
    const sim::SimResult a = sim::simulate(whole, {}), b = sim::simulate(folded, {});
    ASSERT_TRUE(a.completed);
    ASSERT_TRUE(b.completed);
    EXPECT_NEAR(b.simulated_s / a.simulated_s, 1.0, 0.01) << "zero " << zero << ", " << partition::to_string(comm);
  }
}

TEST(SimulatedContext, ARingWaitsOnlyForWhatOutlastsTheWorkItOverlaps) {
  const model::Network net = model::network_from_spec(
      "llama:layers=2,hidden=512,heads=8,kv_heads=8,ffn=1024,vocab=1000,seq=4096", model::Precision::bf16);
  // A NIC slow enough that a block outlasts its step of attention, and one fast enough that
  // it hides behind it.
  for (const char* nic : {"10000000000 B/s", "10000000000000 B/s"}) {
    const model::Cluster cluster = model::parse_cluster(
        std::string("name: flat\nfabric: {kind: switch, latency: 0 s}\nnodes:\n  - {name: n, count: 2, gpu: A100-80, gpus: 1, "
                    "intra: {kind: nvswitch, bandwidth: 1000 TB/s, latency: 0 s}, nic: {count: 1, bandwidth: ") +
            nic + ", latency: 0.000005 s}}\n",
        "flat.yaml");
    partition::PlanOptions o;
    o.context = 2;
    o.context_comm = partition::ContextComm::ring;
    o.microbatches = 2;
    o.workspace_bytes = 0;
    const partition::Plan plan = plan_of(cluster, net, o);
    ASSERT_TRUE(partition::validate_plan(plan).ok()) << partition::validate_plan(plan).problems.front();
    const partition::CostModel cost(cluster, net.precision);
    const partition::Route route = cost.route(0, 1);
    const sim::SimResult r = sim::simulate(plan, {});
    ASSERT_TRUE(r.completed);
    // A message of b bytes: b over the route plus one latency, both members at once.
    const auto transfer = [&](double bytes) { return bytes / route.bandwidth_bytes_per_s + route.latency_s; };
    int messages = 0;
    for (const traces::Event& e : r.trace.events) {
      if (e.purpose != partition::Purpose::context_parallel) continue;
      const partition::Collective& c = plan.collective(plan.inside(e.task)[static_cast<size_t>(e.message)].collective);
      EXPECT_NEAR((e.end_s - e.start_s) / transfer(c.bytes / c.messages), 1.0, 0.01) << e.start_s;
      ++messages;
    }
    // Per device and micro-batch: a block per layer forward; two blocks and a hop home backward.
    EXPECT_EQ(messages, 2 * 2 * (2 * 1 + 2 * 3));
    // Each pass lasts its compute and what its messages outlast of the work they overlap; the
    // trace's reading of its own time (what calibration fits) inverts that.
    const traces::EventIndex index(r.trace, plan);
    for (const traces::Event& e : r.trace.events) {
      if (e.message >= 0 || !partition::is_pass(e.kind)) continue;
      const partition::Task& t = plan.task(e.task);
      const double compute_s = cost.task_compute_time_s(plan, t);
      double expected = compute_s;
      for (const partition::InTaskCall& call : plan.inside(e.task)) {
        const partition::Collective& c = plan.collective(call.collective);
        expected += std::max(0.0, transfer(c.bytes / c.messages) - (call.until - call.at) * compute_s);
      }
      EXPECT_NEAR((e.end_s - e.start_s) / expected, 1.0, 0.01) << nic << " task " << e.task;
      EXPECT_NEAR(index.own_s(r.trace, e.task, e.iteration) / compute_s, 1.0, 0.01) << nic << " task " << e.task;
    }
    EXPECT_NEAR(r.simulated_s / partition::estimate_plan(plan, cost).iteration_time_s, 1.0, 0.01) << nic;
  }
}
