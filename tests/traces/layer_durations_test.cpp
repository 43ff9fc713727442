// Measured durations moved to the layers they computed, and on to another plan. The oracle:
// a trace made by hand from known per-layer times (blocks, and a head that costs more than
// its FLOPs say) must give those times back in any other cut of the same layers.
#include "traces/layer_durations.hpp"

#include <gtest/gtest.h>

#include "model/error.hpp"
#include "partition/plan_builder.hpp"
#include "partition/plan_io.hpp"
#include "partition/policy.hpp"
#include "tests/partition/plan_test_util.hpp"

using namespace hetflow;
using partition::Plan;
using partition::TaskKind;

namespace {

// Four blocks (1 GFLOP forward, 2 backward per sample) and a head of half a block's FLOPs.
model::Network blocks_and_head() {
  model::Network net = test_support::equal_layers(5, 1e9, 2e9);
  net.layers[4].kind = "head";
  net.layers[4].forward_flops = 0.5e9;
  net.layers[4].backward_flops = 1e9;
  return net;
}

Plan plan_with(std::vector<int> stage_layers, int virtual_stages, int micro_batch) {
  const model::Cluster cluster = test_support::identical_cluster(2);
  const model::Network net = blocks_and_head();
  partition::PlanOptions o;
  o.precision = net.precision;
  o.pipeline = 2;
  o.data = 1;
  o.microbatches = 2;
  o.micro_batch = micro_batch;
  o.virtual_stages = virtual_stages;
  o.schedule = virtual_stages > 1 ? "interleaved" : "1f1b";
  o.stage_layers = std::move(stage_layers);
  o.workspace_bytes = 0;
  const partition::CostModel cost(cluster, net.precision);
  Plan plan = partition::build_plan(cluster, net, partition::make_layout(cluster, net, o, cost), cost);
  plan.fingerprint = partition::plan_fingerprint(plan);
  return plan;
}

// Per sample: a block's forward 1 ms, its backward 2 ms; the head's 3 ms and 4 ms (far more
// than its FLOPs' share); an optimizer step 1 ms per 10 MFLOP (its FLOPs count parameters).
double true_s(const Plan& plan, const partition::Task& t) {
  if (t.kind == TaskKind::optimizer) return t.flops * 1e-10;
  double s = 0;
  for (int l = t.layer_begin; l < t.layer_end; ++l) {
    const bool head = l == 4;
    s += t.kind == TaskKind::forward ? (head ? 3e-3 : 1e-3) : (head ? 4e-3 : 2e-3);
  }
  return s * plan.layout.micro_batch_size;
}

traces::Trace trace_of(const Plan& plan) {
  traces::Trace trace;
  trace.fingerprint = plan.fingerprint;
  trace.device_names = plan.device_names;
  double clock = 0;
  for (size_t id = 0; id < plan.tasks.size(); ++id) {
    const partition::Task& t = plan.tasks[id];
    if (t.kind != TaskKind::forward && t.kind != TaskKind::backward && t.kind != TaskKind::optimizer) continue;
    traces::Event e;
    e.task = static_cast<int>(id);
    e.device = t.device;
    e.kind = t.kind;
    e.start_s = clock;
    e.end_s = clock + true_s(plan, t);
    clock = e.end_s;
    trace.events.push_back(e);
  }
  return trace;
}

model::Calibration no_overhead() {
  model::Calibration c;
  c.default_gpu.overhead_s = 0;
  return c;
}

}  // namespace

TEST(LayerDurations, EachLayerKeepsItsOwnTimeInAnotherCut) {
  const Plan a = plan_with({2, 3}, 1, 1);  // blocks 0-1 | blocks 2-3 and the head
  const traces::LayerRates rates = traces::attribute_to_layers(trace_of(a), a, "a.csv");
  EXPECT_GT(rates.measured_tasks, 0);
  for (const Plan& b : {plan_with({1, 1, 1, 2}, 2, 1), plan_with({3, 2}, 1, 1), a}) {
    const partition::CostModel cost(b.cluster, b.layout.precision, no_overhead());
    const traces::TransferredDurations d = traces::transfer_durations(rates, b, cost, no_overhead());
    EXPECT_EQ(d.modelled_tasks, 0);
    for (size_t id = 0; id < b.tasks.size(); ++id) {
      const partition::Task& t = b.tasks[id];
      if (t.kind != TaskKind::forward && t.kind != TaskKind::backward && t.kind != TaskKind::optimizer) {
        EXPECT_EQ(d.task_s[id], -1);
        continue;
      }
      EXPECT_NEAR(d.task_s[id], true_s(b, t), 1e-9) << partition::to_string(t.kind) << " of layers " << t.layer_begin
                                                    << "-" << t.layer_end;
    }
  }
}

// At another micro-batch size a layer's time follows the calibration's time per FLOP: with no
// overhead and a flat efficiency, in proportion to the samples.
TEST(LayerDurations, AnotherMicroBatchSizeScalesAsTheCalibrationSays) {
  const Plan a = plan_with({2, 3}, 1, 1);
  const traces::LayerRates rates = traces::attribute_to_layers(trace_of(a), a, "a.csv");
  const Plan b = plan_with({2, 3}, 1, 2);
  const partition::CostModel cost(b.cluster, b.layout.precision, no_overhead());
  const traces::TransferredDurations d = traces::transfer_durations(rates, b, cost, no_overhead());
  for (size_t id = 0; id < b.tasks.size(); ++id) {
    const partition::Task& t = b.tasks[id];
    if (t.kind == TaskKind::forward || t.kind == TaskKind::backward) {
      EXPECT_NEAR(d.task_s[id], true_s(b, t), 1e-9);
    }
  }
  // A calibrated fixed cost makes small tasks dearer per FLOP: twice the samples, less than
  // twice the time.
  model::Calibration with_overhead;
  with_overhead.default_gpu.overhead_s = 1e-3;
  const traces::TransferredDurations o = traces::transfer_durations(rates, b, cost, with_overhead);
  for (size_t id = 0; id < b.tasks.size(); ++id) {
    const partition::Task& t = b.tasks[id];
    if (t.kind == TaskKind::forward) {
      EXPECT_LT(o.task_s[id], true_s(b, t));
    }
  }
}

TEST(LayerDurations, RefusesAnotherPlansTraceAndAnEmptyOne) {
  const Plan a = plan_with({2, 3}, 1, 1);
  const Plan b = plan_with({3, 2}, 1, 1);
  try {
    traces::attribute_to_layers(trace_of(b), a, "b.csv");
    FAIL() << "another plan's trace was accepted";
  } catch (const InputError& e) {
    EXPECT_EQ(e.file(), "b.csv");
    EXPECT_EQ(e.field(), "fingerprint");
  }
  traces::Trace empty;
  empty.fingerprint = a.fingerprint;
  EXPECT_THROW(traces::attribute_to_layers(empty, a, "empty.csv"), InputError);
}
