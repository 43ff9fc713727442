// The simulator against closed forms and the analytic critical path.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <tuple>

#include "model/error.hpp"
#include "model/io.hpp"
#include "model/zoo.hpp"
#include "partition/estimate.hpp"
#include "partition/plan_builder.hpp"
#include "partition/policy.hpp"
#include "partition/validate.hpp"
#include "sim/simulator.hpp"
#include "tests/partition/plan_test_util.hpp"
#include "partition/traffic.hpp"
#include "traces/figures.hpp"
#include "traces/metrics.hpp"
#include "traces/traffic.hpp"
#include "traces/trace_io.hpp"

using namespace hetflow;
using partition::Plan;
using partition::Task;
using partition::TaskKind;

namespace {

// n nodes of one GPU on one switch; every route has latency `latency_s` and bandwidth
// `bandwidth` (NIC latency a/2 at each end; GPU links and the switch add nothing).
model::Cluster flat_cluster(int n, double bandwidth, double latency_s) {
  const std::string yaml = "name: flat\nfabric: {kind: switch, latency: 0 s}\nnodes:\n  - {name: n, count: " +
                           std::to_string(n) + ", gpu: A100-80, gpus: 1, intra: {kind: nvswitch, bandwidth: 1000 TB/s, latency: 0 s}, " +
                           "nic: {count: 1, bandwidth: " + std::to_string(bandwidth) + " B/s, latency: " +
                           std::to_string(latency_s / 2) + " s}}\n";
  return model::parse_cluster(yaml, "flat.yaml");
}

// An empty plan for a cluster: devices named, one "comm" stream.
Plan empty_plan(const model::Cluster& cluster) {
  Plan plan;
  plan.cluster = cluster;
  plan.network.name = "none";
  for (const model::Device& d : cluster.devices()) plan.device_names.push_back(d.name);
  plan.programs.resize(plan.device_names.size());
  plan.streams = {"compute", "comm"};
  plan.layout.workers.clear();
  return plan;
}

Plan plan_for(const model::Cluster& cluster, const model::Network& net, partition::PlanOptions o) {
  o.precision = net.precision;
  const partition::CostModel cost(cluster, net.precision);
  return partition::build_plan(cluster, net, partition::make_layout(cluster, net, o, cost), cost);
}

// One pipeline of 4 stages, 8 micro-batches, on 4 single-GPU nodes of a flat network.
partition::PlanOptions four_stages() {
  partition::PlanOptions o;
  o.pipeline = 4;
  o.data = 1;
  o.microbatches = 8;
  return o;
}

model::Network small_gpt() {
  return model::network_from_spec("gpt:layers=8,hidden=2048,heads=16,seq=1024", model::Precision::fp16);
}

double duration_of(const traces::Trace& trace, TaskKind kind) {
  double start = 1e300, end = 0;
  for (const traces::Event& e : trace.events) {
    if (e.kind != kind) continue;
    start = std::min(start, e.start_s);
    end = std::max(end, e.end_s);
  }
  return end - start;
}

// A plan of one collective over every device of the cluster, alone on the comm stream.
Plan lone_collective(const model::Cluster& cluster, partition::CollectiveKind kind,
                     partition::CollectiveAlgorithm algorithm, double bytes) {
  Plan plan = empty_plan(cluster);
  partition::Collective c;
  c.kind = kind;
  c.algorithm = algorithm;
  c.bytes = bytes;
  partition::Communicator everyone{"all", {}};
  for (int d = 0; d < cluster.device_count(); ++d) {
    Task t;
    t.kind = TaskKind::collective;
    t.purpose = partition::Purpose::data_parallel;
    t.device = d;
    t.stream = 1;
    t.bytes = bytes;
    t.collective = 0;
    everyone.devices.push_back(d);
    c.tasks.push_back(plan.add_task(t));
  }
  c.communicator = plan.add_communicator(everyone);
  plan.collectives.push_back(c);
  plan.finish();
  return plan;
}

// On an uncontended flat network, a lone collective simulated as its point-to-point steps
// takes the cost model's closed-form time.
void expect_simulated_as_the_cost_model(partition::CollectiveKind kind, partition::CollectiveAlgorithm algorithm,
                                        const std::vector<int>& sizes) {
  const double bandwidth = 10e9, latency = 5e-6, bytes = 256e6;
  for (int n : sizes) {
    const model::Cluster cluster = flat_cluster(n, bandwidth, latency);
    const Plan plan = lone_collective(cluster, kind, algorithm, bytes);
    const sim::SimResult r = sim::simulate(plan, {});
    ASSERT_TRUE(r.completed);
    const partition::CostModel cost(cluster, plan.layout.precision);
    const double expected = cost.collective_time_s(partition::collective_spec(plan, plan.collectives[0]));
    EXPECT_NEAR(duration_of(r.trace, TaskKind::collective) / expected, 1.0, 0.01)
        << partition::to_string(kind) << "/" << partition::to_string(algorithm) << " n=" << n;
  }
}

}  // namespace

TEST(Simulator, RingAllReduceMatchesTheClosedForm) {
  for (int n : {2, 4, 8}) {
    const double bandwidth = 10e9, latency = 5e-6, bytes = 256e6;
    const model::Cluster cluster = flat_cluster(n, bandwidth, latency);
    const Plan plan =
        lone_collective(cluster, partition::CollectiveKind::all_reduce, partition::CollectiveAlgorithm::ring, bytes);
    const sim::SimResult r = sim::simulate(plan, {});
    ASSERT_TRUE(r.completed);
    const double expected = 2.0 * (n - 1) / n * bytes / bandwidth + 2.0 * (n - 1) * latency;
    EXPECT_NEAR(duration_of(r.trace, TaskKind::collective) / expected, 1.0, 0.01) << "n=" << n;
  }
}

// A collective whose members first read their own data (Task::memory_bytes: the gradient
// norm's sum of squares) lasts the slowest member's read, a memory-bound kernel at 0.8 of the
// GPU's bandwidth (the calibration's default for memory operations), then its steps: in the
// simulator, the steps as they take alone; in the estimate, their closed form. Members of 1
// to 4 GB on A100-80s.
TEST(Simulator, ACollectivesOwnReadsComeBeforeItsSteps) {
  const model::Cluster cluster = flat_cluster(4, 10e9, 5e-6);
  Plan plan = lone_collective(cluster, partition::CollectiveKind::all_reduce, partition::CollectiveAlgorithm::tree, 4);
  const sim::SimResult alone = sim::simulate(plan, {});
  ASSERT_TRUE(alone.completed);
  for (size_t d = 0; d < 4; ++d) plan.tasks[d].memory_bytes = static_cast<double>(d + 1) * 1e9;
  const partition::CostModel cost(cluster, plan.layout.precision);
  const double read_s = 4e9 / (0.8 * cluster.device_gpu(cluster.devices().front()).memory_bandwidth_bytes_per_s);
  const sim::SimResult r = sim::simulate(plan, {});
  ASSERT_TRUE(r.completed);
  EXPECT_NEAR(duration_of(r.trace, TaskKind::collective), read_s + duration_of(alone.trace, TaskKind::collective), 1e-9);
  const double steps_s = cost.collective_time_s(partition::collective_spec(plan, plan.collectives[0]));
  EXPECT_NEAR(partition::estimate_plan(plan, cost).iteration_time_s, read_s + steps_s, 1e-12);
  EXPECT_GT(read_s, 10 * duration_of(alone.trace, TaskKind::collective));  // (the reads decide it)
}

// Messages (a chunk's per-layer tensor-parallel all-reduces as one task): each pays the
// ring's latencies, simulated as the cost model prices them.
TEST(Simulator, AllReduceOfManyMessagesTakesTheCostModelsTime) {
  for (int n : {2, 8}) {
    const model::Cluster cluster = flat_cluster(n, 10e9, 5e-6);
    const double bytes = 32e6;
    Plan plan = lone_collective(cluster, partition::CollectiveKind::all_reduce, partition::CollectiveAlgorithm::ring, bytes);
    plan.collectives[0].messages = 24;
    const sim::SimResult r = sim::simulate(plan, {});
    ASSERT_TRUE(r.completed);
    const partition::CostModel cost(cluster, plan.layout.precision);
    const partition::Route hop = cost.route(0, 1);  // through the switch: its two links' latency
    const double expected =
        24 * (2.0 * (n - 1) / n * (bytes / 24) / hop.bandwidth_bytes_per_s + 2.0 * (n - 1) * hop.latency_s);
    EXPECT_NEAR(duration_of(r.trace, TaskKind::collective) / expected, 1.0, 0.01) << "n=" << n;
    EXPECT_NEAR(cost.collective_time_s(partition::collective_spec(plan, plan.collectives[0])) / expected, 1.0, 1e-12);
  }
}

// An all-to-all's pairs all at once: each member's link carries what it sends, (n-1)/n S
// evenly; a skewed one (half of every buffer to member 0) waits on member 0's link, which
// takes (n-1) S / 2. The cost model's busiest-link time either way.
TEST(Simulator, PairwiseAllToAllTakesTheCostModelsTime) {
  expect_simulated_as_the_cost_model(partition::CollectiveKind::all_to_all, partition::CollectiveAlgorithm::pairwise,
                                     {2, 4, 8});
  for (int n : {3, 6}) {
    const model::Cluster cluster = flat_cluster(n, 10e9, 5e-6);
    Plan plan = lone_collective(cluster, partition::CollectiveKind::all_to_all, partition::CollectiveAlgorithm::pairwise, 64e6);
    plan.collectives[0].parts.assign(static_cast<size_t>(n), 0.5 / (n - 1));
    plan.collectives[0].parts[0] = 0.5;
    const sim::SimResult r = sim::simulate(plan, {});
    ASSERT_TRUE(r.completed);
    const partition::CostModel cost(cluster, plan.layout.precision);
    const double expected = cost.collective_time_s(partition::collective_spec(plan, plan.collectives[0]));
    EXPECT_NEAR(expected, cost.route(1, 0).latency_s + (n - 1) * 0.5 * 64e6 / 10e9, 1e-9) << n;
    EXPECT_NEAR(duration_of(r.trace, TaskKind::collective) / expected, 1.0, 0.01) << "n=" << n;
  }
}

// Hierarchical all-to-all on 3 nodes of 4: inside the node, then one message a peer across,
// simulated as the cost model times its two phases.
TEST(Simulator, HierarchicalAllToAllTakesTheCostModelsTime) {
  const model::Cluster cluster = test_support::identical_cluster(3, 4);
  for (auto algorithm : {partition::CollectiveAlgorithm::hierarchical, partition::CollectiveAlgorithm::pairwise}) {
    const Plan plan = lone_collective(cluster, partition::CollectiveKind::all_to_all, algorithm, 96e6);
    const sim::SimResult r = sim::simulate(plan, {});
    ASSERT_TRUE(r.completed);
    const partition::CostModel cost(cluster, plan.layout.precision);
    const double expected = cost.collective_time_s(partition::collective_spec(plan, plan.collectives[0]));
    EXPECT_NEAR(duration_of(r.trace, TaskKind::collective) / expected, 1.0, 0.02) << partition::to_string(algorithm);
  }
}

// Even all-to-alls as two flows a member (SimOptions::coalesce_all_to_all, the default)
// against every pair's message, pairwise and hierarchical, on one flat switch and on 3 nodes
// of 4: the links carry the same bytes, so alone they take the same time. Skewed parts are
// not coalesced (what a member sends is not what its successor receives).
TEST(Simulator, CoalescedAllToAllsTakeTheirStepsTime) {
  const auto compare = [](const model::Cluster& cluster, partition::CollectiveAlgorithm algorithm, bool skewed) {
    Plan plan = lone_collective(cluster, partition::CollectiveKind::all_to_all, algorithm, 96e6);
    const size_t n = plan.communicators[0].devices.size();
    if (skewed) {
      plan.collectives[0].parts.assign(n, 0.5 / static_cast<double>(n - 1));
      plan.collectives[0].parts[0] = 0.5;
    }
    sim::SimOptions steps;
    steps.coalesce_all_to_all = false;
    const sim::SimResult a = sim::simulate(plan, steps), b = sim::simulate(plan, {});
    ASSERT_TRUE(a.completed);
    ASSERT_TRUE(b.completed);
    const std::string what = cluster.name + " " + std::string(partition::to_string(algorithm)) + (skewed ? " skewed" : "");
    EXPECT_NEAR(duration_of(b.trace, TaskKind::collective) / duration_of(a.trace, TaskKind::collective), 1.0, 0.01) << what;
    if (skewed) {
      EXPECT_EQ(b.activities, a.activities) << what;
    } else {
      EXPECT_LT(b.activities * 2, a.activities) << what;
    }
  };
  for (const bool skewed : {false, true}) {
    compare(flat_cluster(6, 10e9, 5e-6), partition::CollectiveAlgorithm::pairwise, skewed);
    for (auto algorithm : {partition::CollectiveAlgorithm::hierarchical, partition::CollectiveAlgorithm::pairwise}) {
      compare(test_support::identical_cluster(4, 3), algorithm, skewed);
    }
  }
}

TEST(Simulator, RingReduceScatterTakesTheCostModelsTime) {
  expect_simulated_as_the_cost_model(partition::CollectiveKind::reduce_scatter, partition::CollectiveAlgorithm::ring,
                                     {2, 3, 8});
}

TEST(Simulator, RingAllGatherTakesTheCostModelsTime) {
  expect_simulated_as_the_cost_model(partition::CollectiveKind::all_gather, partition::CollectiveAlgorithm::ring,
                                     {2, 3, 8});
}

TEST(Simulator, BroadcastTakesTheCostModelsTime) {
  expect_simulated_as_the_cost_model(partition::CollectiveKind::broadcast, partition::CollectiveAlgorithm::ring,
                                     {2, 3, 8});
  expect_simulated_as_the_cost_model(partition::CollectiveKind::broadcast, partition::CollectiveAlgorithm::tree,
                                     {2, 3, 4, 5, 6, 7, 8, 9});
}

TEST(Simulator, ReduceTakesTheCostModelsTime) {
  expect_simulated_as_the_cost_model(partition::CollectiveKind::reduce, partition::CollectiveAlgorithm::ring,
                                     {2, 3, 8});
  // Trees whose leaves are all on the deepest level; elsewhere the closed form is an upper bound.
  expect_simulated_as_the_cost_model(partition::CollectiveKind::reduce, partition::CollectiveAlgorithm::tree,
                                     {2, 3, 7});
}

TEST(Simulator, TwoFlowsOnOneLinkEachGetHalf) {
  const double bandwidth = 10e9, bytes = 1e9;
  const model::Cluster cluster = flat_cluster(3, bandwidth, 0);
  Plan plan = empty_plan(cluster);
  // Devices 0 and 1 both send to device 2 at once: device 2's NIC is the shared link.
  for (int src : {0, 1}) {
    Task s;
    s.kind = TaskKind::send;
    s.purpose = partition::Purpose::activation;
    s.device = src;
    s.bytes = bytes;
    const int pair = plan.add_communicator({"pair", {src, 2}});
    s.channel = plan.add_channel({src, 2, "t", pair});
    plan.streams.push_back("send>2:t" + std::to_string(src));
    s.stream = static_cast<int>(plan.streams.size()) - 1;
    Task r = s;
    r.kind = TaskKind::recv;
    r.device = 2;
    plan.streams.push_back("recv<" + std::to_string(src) + ":t" + std::to_string(src));
    r.stream = static_cast<int>(plan.streams.size()) - 1;
    plan.add_task(s);
    plan.add_task(r);
  }
  plan.finish();
  const sim::SimResult r = sim::simulate(plan, {});
  ASSERT_TRUE(r.completed);
  for (const traces::Event& e : r.trace.events) {
    EXPECT_NEAR((e.end_s - e.start_s) / (bytes / (bandwidth / 2)), 1.0, 1e-6) << partition::to_string(e.kind) << " " << e.device;
  }
}

// Four equal stages of two layers each, 8 micro-batches, one pipeline.
Plan equal_pipeline(const model::Cluster& cluster, const char* schedule) {
  partition::PlanOptions o;
  o.schedule = schedule;
  o.pipeline = 4;
  o.data = 1;
  o.microbatches = 8;
  o.workspace_bytes = 0;
  return plan_for(cluster, test_support::equal_layers(8), o);
}

TEST(Simulator, EqualStagesWithFreeCommunicationGiveTheAnalyticBubble) {
  for (const char* schedule : {"gpipe", "1f1b"}) {
    const model::Cluster cluster = test_support::identical_cluster(4);
    const Plan plan = equal_pipeline(cluster, schedule);
    sim::SimOptions options;
    options.free_communication = true;
    const sim::SimResult r = sim::simulate(plan, options);
    ASSERT_TRUE(r.completed);
    partition::CostModel cost(cluster, plan.layout.precision);
    const traces::Metrics m = traces::compute_metrics(r.trace, plan, cost);
    EXPECT_NEAR(m.bubble_fraction, 3.0 / 11.0, 1e-9) << schedule;
  }
}

// Replay's durations replace the cost model's: every compute instance given a fixed time,
// communication free, a 4-stage GPipe of equal stages with m micro-batches takes
// (m + p - 1) (F + B) + the optimizer exactly.
TEST(Simulator, ReplayedComputeDurationsReplaceTheCostModels) {
  const model::Cluster cluster = test_support::identical_cluster(4);
  Plan plan = equal_pipeline(cluster, "gpipe");
  plan.layout.iterations = 2;
  sim::SimOptions options;
  options.free_communication = true;
  options.compute_s.assign(plan.tasks.size() * 2, -1);
  for (int i = 0; i < 2; ++i) {
    for (size_t t = 0; t < plan.tasks.size(); ++t) {
      const partition::TaskKind k = plan.tasks[t].kind;
      const double s = k == partition::TaskKind::forward ? 1e-3 : k == partition::TaskKind::backward ? 2e-3 : 0.5e-3;
      if (k != partition::TaskKind::send && k != partition::TaskKind::recv && k != partition::TaskKind::collective) {
        options.compute_s[static_cast<size_t>(i) * plan.tasks.size() + t] = s;
      }
    }
  }
  const sim::SimResult r = sim::simulate(plan, options);
  ASSERT_TRUE(r.completed);
  EXPECT_NEAR(r.simulated_s, 2 * ((8 + 4 - 1) * 3e-3 + 0.5e-3), 1e-9);
  options.compute_s.pop_back();  // a count that does not match the plan: refused
  EXPECT_THROW(sim::simulate(plan, options), Error);
}

// Per-iteration metrics of that replayed GPipe: each iteration takes the closed form, its
// bubble is (p - 1) / (m + p - 1) on every device, and the CSV has a row per iteration.
TEST(Simulator, PerIterationMetricsOfAReplayedGpipeAreItsClosedForm) {
  const model::Cluster cluster = test_support::identical_cluster(4);
  Plan plan = equal_pipeline(cluster, "gpipe");
  const int iterations = 3, p = 4, m = 8;
  plan.layout.iterations = iterations;
  sim::SimOptions options;
  options.free_communication = true;
  options.compute_s.assign(plan.tasks.size() * iterations, -1);
  for (int i = 0; i < iterations; ++i) {
    for (size_t t = 0; t < plan.tasks.size(); ++t) {
      const TaskKind k = plan.tasks[t].kind;
      if (k == TaskKind::forward || k == TaskKind::backward || k == TaskKind::optimizer) {
        options.compute_s[static_cast<size_t>(i) * plan.tasks.size() + t] =
            k == TaskKind::forward ? 1e-3 : k == TaskKind::backward ? 2e-3 : 0.5e-3;
      }
    }
  }
  const sim::SimResult r = sim::simulate(plan, options);
  ASSERT_TRUE(r.completed);
  const partition::CostModel cost(plan.cluster, plan.layout.precision);
  const traces::Metrics metrics = traces::compute_metrics(r.trace, plan, cost);
  ASSERT_EQ(metrics.per_iteration.size(), static_cast<size_t>(iterations));
  const double iteration_s = (m + p - 1) * 3e-3 + 0.5e-3;
  for (const traces::IterationMetrics& it : metrics.per_iteration) {
    SCOPED_TRACE(it.iteration);
    EXPECT_NEAR(it.start_s, it.iteration * iteration_s, 1e-9);
    EXPECT_NEAR(it.time_s, iteration_s, 1e-9);
    EXPECT_NEAR(it.bubble_fraction, double(p - 1) / (m + p - 1), 1e-9);
    EXPECT_NEAR(it.busy_s, m * 3e-3 + 0.5e-3, 1e-9);  // F and B of every micro-batch, one optimizer step
    EXPECT_NEAR(it.samples_per_s, plan.layout.samples_per_iteration() / iteration_s, 1e-6);
    EXPECT_GT(it.comm_bytes, 0);  // the activations and their gradients still move (in no time)
  }
  EXPECT_NEAR(metrics.iteration_time_s, iteration_s, 1e-9);
  const std::string csv = traces::write_metrics_csv(metrics, r.trace);
  EXPECT_EQ(csv.rfind("# hetflow metrics v1\n", 0), 0u) << csv;
  EXPECT_NE(csv.find("\niteration,start_s,end_s,time_s,samples_per_s,tokens_per_s,mfu,bubble_fraction,busy_s,"
                     "exposed_comm_s,comm_bytes\n"),
            std::string::npos);
  EXPECT_NE(csv.find("\n2," + traces::format_double(metrics.per_iteration[2].start_s) + ","), std::string::npos) << csv;
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 4 + iterations) << csv;  // 4 header lines
}

// A factor below 1 is a faster device (what-if --scale-gpu): every device twice as fast,
// communication free, the iteration takes half as long.
TEST(Simulator, FasterDevicesShortenTheIterationInProportion) {
  const model::Cluster cluster = test_support::identical_cluster(4);
  const Plan plan = equal_pipeline(cluster, "1f1b");
  sim::SimOptions options;
  options.free_communication = true;
  const sim::SimResult base = sim::simulate(plan, options);
  for (int d = 0; d < 4; ++d) options.stragglers.push_back({d, 0.5, 0});
  options.stragglers.push_back({3, 3.0, 0});  // and the last three times slower again: 1.5 x its time
  const sim::SimResult faster = sim::simulate(plan, options);
  ASSERT_TRUE(base.completed && faster.completed);
  options.stragglers.pop_back();
  const sim::SimResult half = sim::simulate(plan, options);
  EXPECT_NEAR(half.simulated_s, base.simulated_s / 2, 1e-9 * base.simulated_s);
  EXPECT_GT(faster.simulated_s, half.simulated_s);  // the slowed stage is the bottleneck again
}

TEST(Simulator, WithoutContentionTheIterationIsTheCriticalPath) {
  // One pipeline, one GPU per node: consecutive stages talk over their own NICs only.
  const model::Cluster cluster = flat_cluster(4, 12.5e9, 10e-6);
  const Plan plan = plan_for(cluster, small_gpt(), four_stages());
  const sim::SimResult r = sim::simulate(plan, {});
  ASSERT_TRUE(r.completed);
  const partition::CostModel cost(cluster, plan.layout.precision);
  const double analytic = partition::estimate_plan(plan, cost).iteration_time_s;
  EXPECT_NEAR(r.simulated_s / analytic, 1.0, 0.01);
}

TEST(Simulator, StragglerSlowsTheBottleneckAsTheCriticalPathSays) {
  const model::Cluster cluster = flat_cluster(4, 12.5e9, 10e-6);
  const Plan plan = plan_for(cluster, small_gpt(), four_stages());
  sim::SimOptions options;
  options.stragglers.push_back({3, 2.0, 0.0});  // the last stage (with the LM head) is the bottleneck
  const sim::SimResult r = sim::simulate(plan, options);
  ASSERT_TRUE(r.completed);
  partition::CostModel slowed(cluster, plan.layout.precision);
  slowed.set_slowdown(3, 2.0);
  const double with_straggler = partition::estimate_plan(plan, slowed).iteration_time_s;
  const double without = partition::estimate_plan(plan, partition::CostModel(cluster, plan.layout.precision)).iteration_time_s;
  EXPECT_GT(with_straggler, 1.3 * without);  // the straggler is the bottleneck
  EXPECT_NEAR(r.simulated_s / with_straggler, 1.0, 0.01);
}

TEST(Simulator, SameInputsGiveAByteIdenticalTrace) {
  partition::PlanOptions o;
  o.pipeline = 2;
  o.microbatches = 4;
  o.iterations = 2;
  const model::Cluster cluster = model::builtin_cluster("mixed-academic");
  const Plan plan = plan_for(cluster, model::network_from_spec("gpt2-350m", model::Precision::fp16), o);
  const sim::SimResult a = sim::simulate(plan, {});
  const sim::SimResult b = sim::simulate(plan, {});
  ASSERT_TRUE(a.completed);
  EXPECT_EQ(traces::write_trace_csv(a.trace), traces::write_trace_csv(b.trace));
  EXPECT_EQ(traces::write_chrome_trace(a.trace), traces::write_chrome_trace(b.trace));
}

// Tensor and sequence parallelism's collectives run inside the passes: the trace has an event
// for each message, within its task's and in the plan's order; the communicators carry the
// plan's bytes; and a device's compute is its tasks' time less their messages', which count
// as exposed communication of their purpose.
TEST(Simulator, InTaskMessagesAreEventsWithinTheirTasksCarryingThePlansBytes) {
  partition::PlanOptions o;
  o.tensor = 2;
  o.pipeline = 2;
  o.microbatches = 4;
  o.sequence_parallel = true;
  o.iterations = 2;
  const Plan plan = plan_for(flat_cluster(4, 12.5e9, 10e-6), small_gpt(), o);
  const sim::SimResult r = sim::simulate(plan, {});
  ASSERT_TRUE(r.completed);
  std::map<std::pair<int, int>, const traces::Event*> task_event;
  std::map<std::pair<int, int>, std::vector<const traces::Event*>> messages;  // in start order
  for (const traces::Event& e : r.trace.events) {
    if (e.message >= 0) {
      messages[{e.task, e.iteration}].push_back(&e);
    } else {
      task_event[{e.task, e.iteration}] = &e;
    }
  }
  size_t expected = 0;
  for (size_t t = 0; t < plan.tasks.size(); ++t) expected += plan.inside(static_cast<int>(t)).size();
  ASSERT_GT(expected, 0u);
  size_t seen = 0;
  std::vector<double> own_compute_s(plan.device_names.size(), 0);
  for (const auto& [instance, task] : task_event) {
    const auto calls = plan.inside(instance.first);
    const auto found = messages.find(instance);
    const std::vector<const traces::Event*> mine = found == messages.end() ? std::vector<const traces::Event*>{} : found->second;
    ASSERT_EQ(mine.size(), calls.size()) << "task " << instance.first;
    double after = task->start_s, inside_s = 0;
    for (size_t k = 0; k < mine.size(); ++k) {
      EXPECT_EQ(mine[k]->message, static_cast<int>(k));
      EXPECT_EQ(mine[k]->group, calls[k].collective);
      EXPECT_EQ(mine[k]->purpose, plan.collective(calls[k].collective).purpose);
      EXPECT_GE(mine[k]->start_s, after);
      EXPECT_LE(mine[k]->end_s, task->end_s);
      after = mine[k]->end_s;
      inside_s += mine[k]->end_s - mine[k]->start_s;
    }
    seen += mine.size();
    if (partition::is_compute(task->kind)) own_compute_s[static_cast<size_t>(task->device)] += task->end_s - task->start_s - inside_s;
  }
  EXPECT_EQ(seen, expected * 2);

  const std::vector<double> carried = traces::carried_bytes_per_communicator(plan, r.trace);
  const std::vector<double> planned = partition::planned_bytes_per_communicator(plan);
  ASSERT_EQ(carried.size(), planned.size());
  for (size_t c = 0; c < planned.size(); ++c) EXPECT_NEAR(carried[c], 2 * planned[c], 1e-9 * planned[c]) << plan.communicators[c].name;

  // One compute stream a device: its compute time is its tasks' own time exactly.
  const std::vector<traces::DeviceTime> times = traces::device_times(r.trace, {0, r.simulated_s});
  for (size_t d = 0; d < times.size(); ++d) {
    EXPECT_NEAR(times[d].compute_s, own_compute_s[d], 1e-9 * r.simulated_s) << plan.device_names[d];
    EXPECT_GT(times[d].exposed_comm_by_purpose_s.count("sequence_parallel"), 0u) << plan.device_names[d];
  }
}

TEST(Simulator, FailedDeviceStallsAndIsReportedWithoutHanging) {
  const model::Cluster cluster = flat_cluster(4, 12.5e9, 10e-6);
  const Plan plan = plan_for(cluster, test_support::equal_layers(8), four_stages());
  sim::SimOptions options;
  options.faults.push_back({1, "", 0.02});
  const sim::SimResult r = sim::simulate(plan, options);
  EXPECT_FALSE(r.completed);
  ASSERT_FALSE(r.stalls.empty());
  EXPECT_NE(r.stalls.front().find("n-1/gpu0 failed at 0.02"), std::string::npos) << r.stalls.front();
  bool names_a_stuck_stream = false;
  for (const std::string& s : r.stalls) names_a_stuck_stream |= s.find("stuck at") != std::string::npos;
  EXPECT_TRUE(names_a_stuck_stream);
}

TEST(Simulator, FailedLinkStallsTheTransfersThatCrossIt) {
  const model::Cluster cluster = flat_cluster(4, 12.5e9, 10e-6);
  const Plan plan = plan_for(cluster, test_support::equal_layers(8), four_stages());
  sim::SimOptions options;
  options.faults.push_back({-1, "nic:n-2", 0.02});
  const sim::SimResult r = sim::simulate(plan, options);
  EXPECT_FALSE(r.completed);
  bool link_failure = false;
  for (const std::string& s : r.stalls) link_failure |= s.find("a link on its route failed") != std::string::npos;
  EXPECT_TRUE(link_failure);
}

TEST(Simulator, RejectsADependencyBetweenDevices) {
  // Devices only meet through transfers and collectives; a direct edge would never wake the
  // device waiting on it, so the simulator refuses the plan instead of stalling.
  const model::Cluster cluster = flat_cluster(4, 12.5e9, 10e-6);
  Plan plan = plan_for(cluster, test_support::equal_layers(8), four_stages());
  int on_0 = -1, on_1 = -1;
  for (size_t t = 0; t < plan.tasks.size(); ++t) {
    if (plan.tasks[t].kind != TaskKind::forward) continue;
    if (plan.tasks[t].device == 0 && on_0 < 0) on_0 = static_cast<int>(t);
    if (plan.tasks[t].device == 1 && on_1 < 0) on_1 = static_cast<int>(t);
  }
  ASSERT_GE(on_0, 0);
  ASSERT_GE(on_1, 0);
  plan.add_order(on_0, on_1);
  try {
    sim::simulate(plan, {});
    FAIL() << "expected a PlanError";
  } catch (const PlanError& e) {
    EXPECT_NE(std::string(e.what()).find("devices meet only through transfers"), std::string::npos) << e.what();
  }
}

// Regression (plan mutation test): an order edge whose offset reaches past the last
// iteration only orders nothing; it used to overflow the iteration it pointed at and crash.
TEST(Simulator, AnOrderOffsetBeyondTheRunOrdersNothing) {
  const model::Cluster cluster = flat_cluster(2, 1e9, 1e-6);
  partition::PlanOptions o;
  o.pipeline = 2;
  o.data = 1;
  o.iterations = 2;
  Plan plan = plan_for(cluster, test_support::equal_layers(4), o);
  const auto& program = plan.program(0, 0);
  plan.add_order(program.back(), program.front(), std::numeric_limits<int>::max());
  const sim::SimResult r = sim::simulate(plan, {});
  EXPECT_TRUE(r.completed);
}

// Regression (plan mutation test): quantities as large as a double goes are valid, but a
// compute task whose duration overflows, or a message larger than 2^63 bytes, used to abort
// the engine inside a running actor. The simulator refuses them first, naming the task.
TEST(Simulator, AmountsTheEngineCannotHoldAreRefusedNamingTheTask) {
  const model::Cluster cluster = flat_cluster(2, 1e9, 1e-6);
  partition::PlanOptions o;
  o.pipeline = 2;
  o.data = 1;
  const Plan good = plan_for(cluster, test_support::equal_layers(4), o);
  auto refusal = [](const Plan& plan) {
    try {
      sim::simulate(plan, {});
    } catch (const PlanError& e) {
      return std::string(e.what());
    }
    return std::string("no PlanError");
  };
  Plan slow = good;
  slow.tasks[0].memory_bytes = std::numeric_limits<double>::max();
  EXPECT_NE(refusal(slow).find("take longer than the simulator can count"), std::string::npos) << refusal(slow);
  Plan huge = good;
  for (Task& t : huge.tasks) {
    if (t.kind == TaskKind::send || t.kind == TaskKind::recv) t.bytes = 1e300;
  }
  EXPECT_NE(refusal(huge).find("bytes; the simulator moves at most 2^63"), std::string::npos) << refusal(huge);
}

// A channel's tag is only a name: a transfer tagged like a collective's internal messages
// ("<lane>/<stream>") used to share their mailbox and take a message of the collective.
TEST(Simulator, AChannelTagNeverMeetsACollectivesMessages) {
  auto run_with_tag = [](const std::string& tag) {
    const model::Cluster cluster = flat_cluster(2, 1e9, 1e-6);
    Plan plan = empty_plan(cluster);
    const int pair = plan.add_communicator({"pair", {0, 1}});
    Task send;
    send.kind = TaskKind::send;
    send.purpose = partition::Purpose::activation;
    send.device = 0;
    send.stream = 0;
    send.bytes = 3e8;
    send.channel = plan.add_channel({0, 1, tag, pair});
    plan.add_task(send);  // device 0 posts its send before its part of the all-reduce
    partition::Collective c;
    c.kind = partition::CollectiveKind::all_reduce;
    c.algorithm = partition::CollectiveAlgorithm::ring;
    c.bytes = 1e8;
    c.communicator = pair;
    for (int d : {0, 1}) {
      Task t;
      t.kind = TaskKind::collective;
      t.purpose = partition::Purpose::data_parallel;
      t.device = d;
      t.stream = 1;
      t.bytes = c.bytes;
      t.collective = 0;
      c.tasks.push_back(plan.add_task(t));
    }
    plan.collectives.push_back(c);
    Task recv = send;
    recv.kind = TaskKind::recv;
    recv.device = 1;
    plan.add_task(recv);  // device 1 waits in the all-reduce before its receive
    const sim::SimResult r = sim::simulate(plan, {});
    EXPECT_TRUE(r.completed) << tag << ": " << (r.stalls.empty() ? "" : r.stalls.front());
    return r.trace.events;
  };
  const std::string ring_on_comm =
      std::to_string(static_cast<int>(partition::Lane::ring)) + "/1";  // the all-reduce's own messages
  const auto plain = run_with_tag("act"), clashing = run_with_tag(ring_on_comm);
  ASSERT_EQ(plain.size(), clashing.size());
  for (size_t i = 0; i < plain.size(); ++i) {
    EXPECT_EQ(plain[i].start_s, clashing[i].start_s) << partition::to_string(plain[i].kind);
    EXPECT_EQ(plain[i].end_s, clashing[i].end_s) << partition::to_string(plain[i].kind);
  }
}

TEST(Simulator, ManySimulationsInOneProcess) {
  const model::Cluster cluster = flat_cluster(2, 1e9, 1e-6);
  partition::PlanOptions o;
  o.pipeline = 2;
  o.data = 1;
  const Plan plan = plan_for(cluster, test_support::equal_layers(4), o);
  double first = 0;
  for (int i = 0; i < 5; ++i) {
    const sim::SimResult r = sim::simulate(plan, {});
    ASSERT_TRUE(r.completed);
    if (i == 0) first = r.simulated_s;
    EXPECT_EQ(r.simulated_s, first);  // each run starts from a fresh engine at time 0
  }
}

TEST(Simulator, WaveSynchronousParallelKeepsTheStalenessBound) {
  // HetPipe WSP: a virtual worker starts iteration k only after the servers applied every
  // virtual worker's update of iteration k - D - 1.
  const model::Cluster cluster = model::builtin_cluster("hetpipe-testbed");
  const model::Network net = model::network_from_spec("resnet152", model::Precision::fp16);
  for (int staleness : {0, 1}) {
    partition::PlanOptions o;
    o.policy = "hetpipe-ed-local";
    o.microbatches = 2;
    o.micro_batch = 16;
    o.iterations = 4;
    o.staleness = staleness;
    const Plan plan = plan_for(cluster, net, o);
    const sim::SimResult r = sim::simulate(plan, {});
    ASSERT_TRUE(r.completed);
    // Per (server, iteration): when its update ended; per (worker, stage, iteration): when the
    // stage's first forward started.
    std::map<std::pair<int, int>, double> updated;
    std::map<std::tuple<int, int, int>, double> started;
    for (const traces::Event& e : r.trace.events) {
      const Task& t = plan.tasks[static_cast<size_t>(e.task)];
      if (t.kind == TaskKind::optimizer && t.worker < 0) updated[{t.device, e.iteration}] = e.end_s;
      if (t.kind == TaskKind::forward) {
        auto [it, fresh] = started.try_emplace({t.worker, t.stage, e.iteration}, e.start_s);
        if (!fresh) it->second = std::min(it->second, e.start_s);
      }
    }
    int checked = 0;
    for (const auto& [key, start] : started) {
      const auto [worker, stage, iteration] = key;
      const int due = iteration - staleness - 1;
      if (due < 0) continue;
      const partition::Stage& s = plan.layout.workers[static_cast<size_t>(worker)].stages[static_cast<size_t>(stage)];
      for (int l = s.layer_begin; l < s.layer_end; ++l) {
        const int server = plan.layout.sync.layer_server[static_cast<size_t>(l)];
        ASSERT_TRUE(updated.count({server, due}));
        const double update_end = updated[{server, due}];
        EXPECT_GE(start, update_end) << "D=" << staleness << " worker " << worker << " stage " << stage
                                                 << " iteration " << iteration;
        ++checked;
      }
    }
    EXPECT_GT(checked, 0);
  }
}

TEST(Simulator, ReportsProgressFromTheSimulationProcess) {
  const model::Cluster cluster = flat_cluster(4, 1e9, 1e-6);
  partition::PlanOptions o = four_stages();
  o.iterations = 60;
  const Plan plan = plan_for(cluster, test_support::equal_layers(8), o);
  std::vector<sim::Progress> reports;
  sim::SimOptions options;
  options.progress_interval_s = 0;  // every report the simulator makes (one per 1,024 tasks)
  options.on_progress = [&](const sim::Progress& p) { reports.push_back(p); };
  const sim::SimResult r = sim::simulate(plan, options);
  ASSERT_TRUE(r.completed);
  const auto instances = static_cast<long long>(r.trace.events.size());
  ASSERT_GE(instances, 4096);
  // The child drops a report only when the parent lags; on this small run it does not lag far.
  EXPECT_GE(reports.size(), 2u);
  EXPECT_LE(static_cast<long long>(reports.size()), instances / 1024);
  for (size_t i = 0; i < reports.size(); ++i) {
    EXPECT_GT(reports[i].fraction_done, 0);
    EXPECT_LT(reports[i].fraction_done, 1);
    EXPECT_LE(reports[i].simulated_s, r.simulated_s);
    EXPECT_LE(reports[i].activities, r.activities);
    if (i > 0) {
      EXPECT_GT(reports[i].fraction_done, reports[i - 1].fraction_done);
      EXPECT_GE(reports[i].simulated_s, reports[i - 1].simulated_s);
      EXPECT_GE(reports[i].elapsed_s, reports[i - 1].elapsed_s);
    }
  }
}

// Ring collectives as one transfer per member (SimOptions::coalesce_rings, the default) give
// the iteration time their steps give, within 1 %: data-parallel rings across nodes sharing
// NICs with pipeline traffic, tensor-parallel rings inside a node, sequence parallelism's
// reduce-scatters and all-gathers, rings over unlike hops (mixed-academic's NVLink, PCIe and
// Ethernet; two regions joined by a WAN). A ring two of whose hops cross one link keeps its
// steps, and the HetPipe testbed's parameter servers have no rings: nothing changes there.
TEST(Simulator, CoalescedRingsTakeTheTimeTheirStepsTake) {
  struct Case {
    const char* cluster;
    const char* model;
    partition::PlanOptions options;
    bool coalesces;
  };
  auto options = [](int tensor, int pipeline, int data, int microbatches, bool sp = false) {
    partition::PlanOptions o;
    o.tensor = tensor;
    o.pipeline = pipeline;
    o.data = data;
    o.microbatches = microbatches;
    o.sequence_parallel = sp;
    o.bucket_bytes = 8.0 * 1024 * 1024;
    o.workspace_bytes = 0;
    o.iterations = 2;
    return o;
  };
  std::vector<Case> cases = {
      {"dgx-a100-x4", "gpt3-1.3b", options(8, 2, 2, 4, true), true},
      {"dgx-a100-x4", "gpt3-1.3b", options(4, 1, 8, 2), true},
      {"selene-8", "gpt3-1.3b", options(2, 2, 16, 4), true},
      {"h100-fat-tree", "gpt3-1.3b", options(1, 4, 32, 8), true},
      {"mixed-academic", "gpt2-350m", options(1, 1, 20, 2), false},  // its ring crosses each NIC twice
      {"mixed-academic", "gpt2-350m", options(1, 4, 5, 8), true},
      {"two-region", "gpt2-350m", options(1, 2, 16, 4), true},
  };
  partition::PlanOptions ps = options(1, 0, 0, 4);
  ps.policy = "hetpipe-ed";
  cases.push_back({"hetpipe-testbed", "vgg19", ps, false});
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  // Under the sanitizers SimGrid's actors are threads, and a ring step by step on 32 GPUs or
  // more takes minutes a simulation there: the cases of 20 GPUs at most (three, with and
  // without coalescing; every other build runs them all).
  constexpr int kMaxDevices = 20;
#else
  constexpr int kMaxDevices = std::numeric_limits<int>::max();
#endif
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.cluster) + " " + c.model + " t" + std::to_string(c.options.tensor) + " p" +
                 std::to_string(c.options.pipeline) + " d" + std::to_string(c.options.data));
    const model::Cluster cluster = model::load_cluster(c.cluster);
    Plan plan = plan_for(cluster, model::load_network(c.model), c.options);
    if (plan.device_count() > kMaxDevices) continue;
    plan.layout.iterations = 2;
    sim::SimOptions steps, coalesced;
    steps.coalesce_rings = false;
    const sim::SimResult a = sim::simulate(plan, steps), b = sim::simulate(plan, coalesced);
    ASSERT_TRUE(a.completed && b.completed);
    EXPECT_NEAR(b.simulated_s, a.simulated_s, 0.01 * a.simulated_s);
    if (c.coalesces) {
      EXPECT_LT(b.activities, a.activities);
    } else {
      EXPECT_EQ(b.activities, a.activities);
    }
  }
}

// A folded plan (worker 0's tasks standing for identical data-parallel replicas) simulates
// to the iteration time of the whole plan, within 1 %: replicas one per node and several per
// node (rings over NVSwitch and NIC hops), with pipelines. Its figures of merit count every
// replica. Where replicas would share links besides their own (an oversubscribed fat tree,
// a node's one NIC), folding is refused.
TEST(Simulator, AFoldedPlanTakesTheWholePlansTime) {
  struct Case {
    const char* cluster;
    const char* model;
    int tensor, pipeline, data, microbatches;
  };
  for (const Case& c : {Case{"selene-8", "gpt3-1.3b", 8, 2, 4, 4}, Case{"dgx-a100-x4", "gpt3-1.3b", 4, 1, 8, 2},
                        Case{"selene-16", "gpt3-1.3b", 2, 2, 32, 4}, Case{"selene-24", "gpt2-350m", 1, 4, 48, 4}}) {
    SCOPED_TRACE(std::string(c.cluster) + " t" + std::to_string(c.tensor) + " p" + std::to_string(c.pipeline) + " d" +
                 std::to_string(c.data));
    const model::Cluster cluster = model::load_cluster(c.cluster);
    partition::PlanOptions o;
    o.tensor = c.tensor;
    o.pipeline = c.pipeline;
    o.data = c.data;
    o.microbatches = c.microbatches;
    o.bucket_bytes = 16.0 * 1024 * 1024;
    o.workspace_bytes = 0;
    o.iterations = 2;
    const Plan whole = plan_for(cluster, model::load_network(c.model), o);
    o.fold = true;
    const Plan folded = plan_for(cluster, model::load_network(c.model), o);
    ASSERT_TRUE(folded.layout.folded);
    EXPECT_TRUE(partition::validate_plan(folded).ok()) << partition::validate_plan(folded).problems.front();
    EXPECT_LT(folded.tasks.size() * (c.data / 2), whole.tasks.size());
    const sim::SimResult a = sim::simulate(whole, {}), b = sim::simulate(folded, {});
    ASSERT_TRUE(a.completed && b.completed);
    EXPECT_NEAR(b.simulated_s, a.simulated_s, 0.01 * a.simulated_s);
    const partition::CostModel cost(cluster, whole.layout.precision);
    const traces::Metrics ma = traces::compute_metrics(a.trace, whole, cost), mb = traces::compute_metrics(b.trace, folded, cost);
    EXPECT_NEAR(mb.mfu, ma.mfu, 0.01 * ma.mfu);
    EXPECT_NEAR(mb.samples_per_s, ma.samples_per_s, 0.01 * ma.samples_per_s);
    EXPECT_NEAR(mb.bubble_fraction, ma.bubble_fraction, 0.01);
    // The analytic estimate sees the same collectives.
    // (Replicas under other fat-tree leaves are a hop further: a few microseconds.)
    EXPECT_NEAR(partition::estimate_plan(folded, cost).iteration_time_s, partition::estimate_plan(whole, cost).iteration_time_s,
                1e-3 * partition::estimate_plan(whole, cost).iteration_time_s);
  }
}

TEST(Simulator, FoldingIsRefusedWhereReplicasShareLinks) {
  partition::PlanOptions o;
  o.pipeline = 4;
  o.data = 32;
  o.microbatches = 4;
  o.workspace_bytes = 0;
  o.fold = true;
  for (const auto& [cluster, data] : {std::pair{"h100-fat-tree", 32}, std::pair{"two-region", 8}}) {
    o.data = data;
    try {
      plan_for(model::load_cluster(cluster), model::load_network("gpt2-124m"), o);
      ADD_FAILURE() << cluster << " folded";
    } catch (const InputError& e) {
      EXPECT_EQ(e.field(), "fold") << e.what();
    }
  }
  o.data = 5;
  try {
    plan_for(model::load_cluster("mixed-academic"), model::load_network("gpt2-124m"), o);
    ADD_FAILURE() << "mixed-academic folded";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("fewer NICs than GPUs"), std::string::npos) << e.what();
  }
}

// --overlap-grad-reduce against its closed form: two data-parallel workers of one stage, four
// identical layers whose gradients fill one bucket each. Bucket b (from the last layer down)
// is ready after (b + 1) / 4 of the backward; each all-reduce (C) is shorter than a layer's
// backward (B / 4), so all but the last hide behind the backward: F + B + C + the optimizer,
// against F + B + 4 C without overlap. The simulator and the plan's estimate both.
TEST(Simulator, OverlappedGradientBucketsHideBehindTheBackward) {
  const model::Cluster cluster = flat_cluster(2, 10e9, 10e-6);
  std::string yaml = "name: four\nprecision: fp16\nlayers:\n";
  for (int l = 0; l < 4; ++l) {
    yaml += "  - {name: l" + std::to_string(l) + ", forward_flops: 1e11, params: 1e6, output_elems: 1000}\n";
  }
  const model::Network net = model::parse_network(yaml, "four.yaml");
  partition::PlanOptions o;
  o.pipeline = 1;
  o.data = 2;
  o.microbatches = 1;
  o.workspace_bytes = 0;
  o.bucket_bytes = 2e6;  // one layer's fp16 gradients
  for (const bool overlap : {false, true}) {
    o.overlap_grad_reduce = overlap;
    const Plan plan = plan_for(cluster, net, o);
    ASSERT_TRUE(partition::validate_plan(plan).ok());
    const partition::CostModel cost(cluster, plan.layout.precision);
    std::map<TaskKind, double> s;
    int buckets = 0;
    for (size_t t = 0; t < plan.tasks.size(); ++t) {
      if (plan.tasks[t].device != 0) continue;
      s[plan.tasks[t].kind] = partition::task_duration_s(plan, cost, static_cast<int>(t));
      buckets += plan.tasks[t].kind == TaskKind::collective;
    }
    ASSERT_EQ(buckets, 4);
    const double f = s[TaskKind::forward], b = s[TaskKind::backward], c = s[TaskKind::collective];
    ASSERT_LT(c, b / 4);
    const double expected = f + b + (overlap ? 1 : 4) * c + s[TaskKind::optimizer];
    const sim::SimResult r = sim::simulate(plan, {});
    ASSERT_TRUE(r.completed);
    EXPECT_NEAR(r.simulated_s / expected, 1.0, 0.01) << (overlap ? "overlapped" : "after the backward");
    EXPECT_NEAR(partition::estimate_plan(plan, cost).iteration_time_s / expected, 1.0, 1e-9);
  }
}

// The traffic a report prints counts each in-task message's share once: on one node, a
// tensor-parallel pair of one virtual worker moves only its passes' collectives, each ring
// member sending (n - 1) / n of an all-gather's or reduce-scatter's bytes and twice that of
// an all-reduce's, over the node's switch.
TEST(Simulator, TrafficCountsEachInTaskMessageOnce) {
  const model::Cluster cluster = test_support::identical_cluster(2);
  partition::PlanOptions o;
  o.tensor = 2;
  o.microbatches = 2;
  o.sequence_parallel = true;
  const model::Network net =
      model::network_from_spec("gpt:layers=2,hidden=256,heads=8,seq=128,vocab=1000", model::Precision::fp16);
  const Plan plan = test_support::plan_of(cluster, net, o);
  double expected = 0;
  for (const partition::Collective& c : plan.collectives) {
    const double n = static_cast<double>(plan.members(c).size());
    const double per_member = (c.kind == partition::CollectiveKind::all_reduce ? 2 : 1) * (n - 1) / n * c.bytes;
    expected += per_member * n;
  }
  ASSERT_GT(expected, 0);
  const sim::SimResult r = sim::simulate(plan, {});
  ASSERT_TRUE(r.completed);
  const traces::Metrics m = traces::compute_metrics(r.trace, plan, partition::CostModel(cluster, plan.layout.precision));
  // (A route inside the node crosses two switch links: the sender's and the receiver's.)
  const partition::CostModel cost(cluster, plan.layout.precision);
  ASSERT_EQ(cost.link_classes(0, 1), (std::vector<std::string>{"nvswitch", "nvswitch"}));
  ASSERT_EQ(m.bytes_per_link_class.count("nvswitch"), 1u);
  EXPECT_NEAR(m.bytes_per_link_class.at("nvswitch") / (2 * expected), 1.0, 1e-9);
}
