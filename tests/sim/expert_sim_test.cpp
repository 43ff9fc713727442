// Expert parallelism simulated against closed forms: four single-GPU nodes on a flat network
// form one expert group of four, each holding two of a mixture's eight experts. Every MoE
// layer's forward meets the group twice (dispatch, combine), so every member's forward ends
// when the busiest member's compute and the all-to-alls are done:
//   forward = compute(busiest member's forward) + the in-task all-to-alls' time,
// where the busiest member's routed-expert FLOPs are its load (copies over an even share)
// times an even share's. Balanced routing gives every member the FLOPs of the same layer
// without expert parallelism: the dense-equivalent time plus the all-to-alls.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <tuple>
#include <string>

#include "model/io.hpp"
#include "model/zoo.hpp"
#include "partition/estimate.hpp"
#include "partition/expert_shard.hpp"
#include "partition/plan_builder.hpp"
#include "partition/policy.hpp"
#include "partition/validate.hpp"
#include "sim/simulator.hpp"
#include "tests/partition/plan_test_util.hpp"

using namespace hetflow;

namespace {

using test_support::plan_of;

const model::Cluster& flat_cluster() {
  static const model::Cluster cluster = model::parse_cluster(
      "name: flat\nfabric: {kind: switch, latency: 0 s}\nnodes:\n  - {name: n, count: 4, gpu: A100-80, gpus: 1, "
      "intra: {kind: nvswitch, bandwidth: 1000 TB/s, latency: 0 s}, nic: {count: 1, bandwidth: 10000000000 B/s, "
      "latency: 0.000005 s}}\n",
      "flat.yaml");
  return cluster;
}

const model::Network& moe_network() {
  static const model::Network net = model::network_from_spec(
      "llama:layers=2,hidden=1024,heads=8,kv_heads=8,ffn=2048,vocab=1000,seq=2048,experts=8,experts_per_token=2,"
      "expert_ffn=2048",
      model::Precision::bf16);
  return net;
}

// Each device's first forward, start to end, and its task.
std::map<int, std::pair<double, int>> first_forwards(const sim::SimResult& r) {
  std::map<int, std::pair<double, int>> out;
  for (const traces::Event& e : r.trace.events) {
    if (e.kind != partition::TaskKind::forward || e.message >= 0 || e.iteration != 0 || e.microbatch != 0) continue;
    out.try_emplace(e.device, e.end_s - e.start_s, e.task);
  }
  return out;
}

}  // namespace

TEST(SimulatedExperts, EveryForwardWaitsForTheBusiestRankAndTheAllToAlls) {
  const model::Cluster& cluster = flat_cluster();
  const model::Network& net = moe_network();
  const partition::CostModel cost(cluster, net.precision);
  partition::PlanOptions o;
  o.experts.parallel = 4;
  o.microbatches = 1;
  o.workspace_bytes = 0;
  double dense_equivalent = 0;  // the forward's compute without expert parallelism
  {
    partition::PlanOptions one = o;
    one.experts.parallel = 1;
    const partition::Plan plan = plan_of(cluster, net, one);
    dense_equivalent = cost.task_compute_time_s(plan, plan.task(first_forwards(sim::simulate(plan, {})).at(0).second));
  }
  // Expert 0 takes 5 of every 12 copies: rank 0 (experts 0 and 1) computes 6/12 of them,
  // twice an even share; the others 2/3 of one.
  for (const std::string routing : {"balanced", "histogram:5,1,1,1,1,1,1,1"}) {
    o.experts.routing = partition::parse_routing(routing, "test", "routing");
    const partition::Plan plan = plan_of(cluster, net, o);
    ASSERT_TRUE(partition::validate_plan(plan).ok()) << partition::validate_plan(plan).problems.front();
    const partition::ExpertSplit split = partition::expert_split(net, plan.layout);
    const int busiest = split.loads.busiest;  // worker b is expert rank b here (one group, no context)
    if (routing != "balanced") {
      EXPECT_EQ(busiest, 0);
      EXPECT_NEAR(split.loads.rank_load[0], 2.0, 1e-12);
      EXPECT_NEAR(split.loads.rank_load[1], 2.0 / 3, 1e-12);
    }
    // The group's in-task all-to-alls inside the forwards: one collective of 2 messages a layer.
    double exchanges = 0;
    int collectives = 0;
    for (const partition::Collective& c : plan.collectives) {
      if (c.purpose != partition::Purpose::expert_parallel || !c.in_task()) continue;
      if (plan.task(c.tasks.front()).kind != partition::TaskKind::forward || plan.task(c.tasks.front()).microbatch != 0) continue;
      EXPECT_EQ(c.messages, 4);
      EXPECT_EQ(c.parts, split.dispatch.parts);
      exchanges += cost.collective_time_s(partition::collective_spec(plan, c));
      ++collectives;
    }
    ASSERT_EQ(collectives, 1);
    const sim::SimResult r = sim::simulate(plan, {});
    ASSERT_TRUE(r.completed);
    const auto forwards = first_forwards(r);
    ASSERT_EQ(forwards.size(), 4u);
    const double busiest_compute = cost.task_compute_time_s(plan, plan.task(forwards.at(busiest).second));
    // (Both terms weigh: neither hides the other's error.)
    EXPECT_GT(busiest_compute, 0.2 * exchanges);
    for (const auto& [device, forward] : forwards) {
      EXPECT_NEAR(forward.first / (busiest_compute + exchanges), 1.0, 0.01) << routing << " device " << device;
    }
    if (routing == "balanced") {
      EXPECT_NEAR(busiest_compute / dense_equivalent, 1.0, 1e-9);
    } else {  // the busiest rank's routed FLOPs twice an even share's, the rest as before
      double routed = 0;
      for (const model::Layer& l : net.layers) routed += partition::routed_forward_flops(l, 2048);
      const partition::Plan balanced = plan_of(cluster, net, [&] {
        partition::PlanOptions b = o;
        b.experts.routing = {};
        return b;
      }());
      const double even = balanced.task(first_forwards(sim::simulate(balanced, {})).at(0).second).flops;
      EXPECT_NEAR(plan.task(forwards.at(busiest).second).flops, even + routed, even * 1e-12);
      EXPECT_GT(busiest_compute, dense_equivalent * 1.2);
    }
    EXPECT_NEAR(r.simulated_s / partition::estimate_plan(plan, cost).iteration_time_s, 1.0, 0.02) << routing;
  }
}

// Over tensor-parallel ranks (4 nodes of 2 GPUs, TP 2 with SP, one expert group of 4 across
// the nodes): each device dispatches half of its worker's copies, and its tensor group
// gathers the rank's copies after the dispatch and scatters the experts' outputs before the
// combine, on the node's NVSwitch. Every forward ends when the busiest rank's compute, its
// tensor group's calls and the all-to-alls are done; the copies' gather takes, by hand, half
// its bytes over the NVSwitch (a ring of 2, no latency).
TEST(SimulatedExperts, OverTensorRanksEveryForwardAlsoWaitsForItsTensorGroupsGathers) {
  const model::Cluster cluster = model::parse_cluster(
      "name: four\nfabric: {kind: switch, latency: 0 s}\nnodes:\n  - {name: n, count: 4, gpu: A100-80, gpus: 2, "
      "intra: {kind: nvswitch, bandwidth: 100 GB/s, latency: 0 s}, nic: {count: 2, bandwidth: 10000000000 B/s, "
      "latency: 0.000005 s}}\n",
      "four.yaml");
  const model::Network& net = moe_network();
  const partition::CostModel cost(cluster, net.precision);
  partition::PlanOptions o;
  o.tensor = 2;
  o.sequence_parallel = true;
  o.experts.parallel = 4;
  o.experts.routing = partition::parse_routing("histogram:5,1,1,1,1,1,1,1", "test", "routing");
  o.microbatches = 1;
  o.workspace_bytes = 0;
  const partition::Plan plan = plan_of(cluster, net, o);
  ASSERT_TRUE(partition::validate_plan(plan).ok()) << partition::validate_plan(plan).problems.front();
  const partition::ExpertSplit split = partition::expert_split(net, plan.layout);
  ASSERT_EQ(split.loads.busiest, 0);
  const sim::SimResult r = sim::simulate(plan, {});
  ASSERT_TRUE(r.completed);
  const auto forwards = first_forwards(r);
  ASSERT_EQ(forwards.size(), 8u);
  // The in-task calls of one forward task, timed alone: the all-to-alls, and its tensor
  // group's gathers and scatters (the copies' among them, checked by hand).
  int gathers = 0;
  const auto calls_of = [&](int task, bool all_to_alls) {
    double seconds = 0;
    for (const partition::Collective& c : plan.collectives) {
      if (!c.in_task() || (c.purpose == partition::Purpose::expert_parallel) != all_to_alls) continue;
      if (std::find(c.tasks.begin(), c.tasks.end(), task) == c.tasks.end()) continue;
      const double s = cost.collective_time_s(partition::collective_spec(plan, c));
      seconds += s;
      const double copies = std::round(2048.0 * 2 * split.loads.rank_load[0]) * 1024 * 2;  // bf16
      if (c.kind == partition::CollectiveKind::all_gather && c.bytes == 2 * copies) {  // two layers
        EXPECT_NEAR(s / (2 * copies / 2 / 100e9), 1.0, 1e-6);
        ++gathers;
      }
    }
    return seconds;
  };
  const int busiest_task = forwards.at(0).second;  // device 0: worker 0's tensor rank 0
  ASSERT_EQ(plan.task(busiest_task).worker, 0);
  const double compute = cost.task_compute_time_s(plan, plan.task(busiest_task));
  const double exchanges = calls_of(busiest_task, true);
  const double tensor_calls = calls_of(busiest_task, false);
  EXPECT_EQ(gathers, 1);
  std::printf("busiest forward: compute %.3g s, all-to-alls %.3g s, tensor group's calls %.3g s\n", compute, exchanges,
              tensor_calls);
  // (Every term weighs: none hides another's error.)
  EXPECT_GT(exchanges, 0.05 * compute);
  EXPECT_GT(tensor_calls, 0.01 * compute);
  for (const auto& [device, forward] : forwards) {
    EXPECT_NEAR(forward.first / (compute + exchanges + tensor_calls), 1.0, 0.01) << "device " << device;
  }
  EXPECT_NEAR(r.simulated_s / partition::estimate_plan(plan, cost).iteration_time_s, 1.0, 0.02);
}

TEST(SimulatedExperts, AFoldedPlanSimulatesAsTheWholePlan) {
  // Four nodes of two GPUs, 8 replicas in expert groups of 2 (consecutive replicas, on one
  // node) or 4: the folded plan simulates the first group, standing for the others. Groups
  // of 4 leave each expert's gradients two holders: a ring of one step across replicas. Under
  // ZeRO 3 every pass gathers the dense part over the 8 and its experts over their holders.
  const model::Cluster cluster = model::parse_cluster(
      "name: four\nnodes:\n  - {name: n, count: 4, gpu: A100-80, gpus: 2, intra: {kind: nvswitch, bandwidth: 300 GB/s, "
      "latency: 2 us}, nic: {count: 2, bandwidth: 100 Gb/s}}\n",
      "four.yaml");
  for (const auto& [ep, zero, tensor] :
       {std::tuple{2, 0, 1}, {2, 1, 1}, {4, 0, 1}, {4, 1, 1}, {2, 1, 2}, {2, 3, 1}, {4, 3, 1}}) {
    partition::PlanOptions o;
    o.experts.parallel = ep;
    o.tensor = tensor;
    o.sequence_parallel = tensor > 1;
    o.microbatches = 2;
    o.zero_stage = zero;
    const partition::Plan whole = plan_of(cluster, moe_network(), o);
    o.fold = true;
    const partition::Plan folded = plan_of(cluster, moe_network(), o);
    ASSERT_TRUE(folded.layout.folded);
    ASSERT_TRUE(partition::validate_plan(folded).ok()) << partition::validate_plan(folded).problems.front();
    ASSERT_TRUE(partition::validate_plan(whole).ok()) << partition::validate_plan(whole).problems.front();
    EXPECT_LT(folded.tasks.size() * (8 / tensor / ep), whole.tasks.size() * 5 / 4);  // one group's tasks of 8 / t / ep
    const sim::SimResult a = sim::simulate(whole, {}), b = sim::simulate(folded, {});
    ASSERT_TRUE(a.completed);
    ASSERT_TRUE(b.completed);
    // (Within 2 %: flows between two replicas no simulated member posts are left out, and a
    // replica's link they share with a simulated member's carries less.)
    EXPECT_NEAR(b.simulated_s / a.simulated_s, 1.0, 0.02) << "expert parallel " << ep << ", zero " << zero << ", tensor "
                                                          << tensor;
  }
}
