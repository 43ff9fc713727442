// One copy per tensor (the CUDA back end's device copies): the plans the project makes order
// every reader of iteration i before the write of iteration i + 1; a plan that does not is
// named, tensor, producer and reader.
#include <gtest/gtest.h>

#include "exec/copy_reuse.hpp"
#include "partition/task_order.hpp"
#include "tests/exec/exec_test_util.hpp"

using namespace hetflow;
using partition::Plan;

namespace {

// A producer on stream 0 and its reader on stream 1 of one device: nothing stops the
// producer's next iteration from overtaking the reader.
struct Racing {
  Plan plan = test_support::empty_plan(model::cpu_cluster(1));
  int tensor = -1, producer = -1, reader = -1;
  Racing() {
    plan.layout.iterations = 2;
    tensor = test_support::transient(plan, 0, 256);
    producer = test_support::compute_task(plan, 0, {}, {tensor});
    partition::Task read = plan.task(producer);
    read.stream = 1;
    reader = plan.add_task(read, std::vector<int>{tensor}, std::vector<int>{});
    plan.tensor(tensor).free_after = reader;
  }
};

TEST(CopyReuse, AProducerThatMayOvertakeItsReaderIsNamed) {
  Racing r;
  r.plan.finish();
  const auto hazards = exec::copy_reuse_hazards(r.plan);
  ASSERT_EQ(hazards.size(), 1u);
  EXPECT_EQ(hazards[0].tensor, r.tensor);
  EXPECT_EQ(hazards[0].producer, r.producer);
  EXPECT_EQ(hazards[0].reader, r.reader);
  const std::string said = exec::describe(r.plan, hazards[0]);
  EXPECT_NE(said.find("tensor " + std::to_string(r.tensor) + " (activation on "), std::string::npos) << said;
  EXPECT_NE(said.find(partition::describe_task(r.plan, r.reader) + " of iteration i is done"), std::string::npos) << said;
}

TEST(CopyReuse, APlanWithAHazardIsRefusedNamingIt) {
  Racing r;
  r.plan.finish();
  try {
    exec::require_no_copy_reuse_hazards(r.plan, {}, "the test's back end");
    FAIL() << "expected a PlanError";
  } catch (const PlanError& e) {
    const std::string said = e.what();
    EXPECT_NE(said.find("the test's back end keeps one copy of each tensor for every iteration, and the plan does not "
                        "order 1 of its reads"),
              std::string::npos)
        << said;
    EXPECT_NE(said.find(exec::describe(r.plan, exec::copy_reuse_hazards(r.plan)[0])), std::string::npos) << said;
  }
  EXPECT_NO_THROW(exec::require_no_copy_reuse_hazards(r.plan, [](int) { return false; }, "nobody"));
}

TEST(CopyReuse, AnEdgeFromTheReaderToTheNextIterationsProducerOrdersThem) {
  Racing r;
  r.plan.add_order(r.reader, r.producer, 1);
  r.plan.finish();
  EXPECT_TRUE(exec::copy_reuse_hazards(r.plan).empty());
}

// One side of a transfer of 256 bytes on `channel`, on stream `stream` of `device`.
int side(Plan& plan, partition::TaskKind kind, int device, int stream, int channel, std::vector<int> reads,
         std::vector<int> writes) {
  partition::Task t;
  t.kind = kind;
  t.device = device;
  t.stream = stream;
  t.bytes = 256;
  t.channel = channel;
  return plan.add_task(t, reads, writes);
}

// A receive writes once its send has started: ordering the reader before the sender's next
// iteration is enough, though the receive itself may start (and wait) earlier. Device 0
// makes a tensor and sends it; device 1 receives and uses it; with `reply`, device 1 answers
// after the use and device 0's next iteration waits for that answer (as a pipeline's
// backward does): every read is then ordered before the next write.
Plan transfer_plan(bool reply) {
  Plan plan = test_support::empty_plan(model::cpu_cluster(2));
  plan.layout.iterations = 2;
  const int sent = test_support::transient(plan, 0, 256), got = test_support::transient(plan, 1, 256);
  const int make = test_support::compute_task(plan, 0, {}, {sent});
  const int act = plan.add_channel({0, 1, "act", -1});
  const int send_task = side(plan, partition::TaskKind::send, 0, 1, act, {sent}, {});
  side(plan, partition::TaskKind::recv, 1, 1, act, {}, {got});
  const int use = test_support::compute_task(plan, 1, {got}, {});
  plan.tensor(sent).free_after = send_task;
  plan.tensor(got).free_after = use;
  if (reply) {
    const int grad = plan.add_channel({1, 0, "grad", -1});
    plan.add_order(use, side(plan, partition::TaskKind::send, 1, 2, grad, {}, {}));
    plan.add_order(side(plan, partition::TaskKind::recv, 0, 2, grad, {}, {}), make, 1);
  }
  plan.finish();
  return plan;
}

TEST(CopyReuse, AReceiveIsOrderedThroughItsSend) {
  const Plan racing = transfer_plan(false);
  const auto hazards = exec::copy_reuse_hazards(racing);
  ASSERT_EQ(hazards.size(), 2u);  // the sent tensor (make overtakes send) and the received one
  EXPECT_EQ(racing.task(hazards[0].reader).kind, partition::TaskKind::send);
  EXPECT_EQ(racing.task(hazards[1].producer).kind, partition::TaskKind::recv);
  EXPECT_TRUE(exec::copy_reuse_hazards(transfer_plan(true)).empty());
}

// A send may end before its receive is posted (NCCL buffers small messages), so a reader
// ordered before a receive is not thereby ordered before the sender's next message: device
// 1 reads x, then receives y; device 0 sends x, then y. Nothing stops device 0 from sending
// iteration 1's x (which device 1's receive writes as soon as it comes) while device 1
// still reads iteration 0's.
TEST(CopyReuse, ASendMayEndBeforeItsReceiveStarts) {
  Plan plan = test_support::empty_plan(model::cpu_cluster(2));
  plan.layout.iterations = 2;
  const int x = test_support::transient(plan, 1, 256), y = test_support::transient(plan, 1, 256);
  const int to_x = plan.add_channel({0, 1, "x", -1}), to_y = plan.add_channel({0, 1, "y", -1});
  side(plan, partition::TaskKind::send, 0, 1, to_x, {}, {});
  side(plan, partition::TaskKind::send, 0, 1, to_y, {}, {});
  const int receive_x = side(plan, partition::TaskKind::recv, 1, 1, to_x, {}, {x});
  const int read_x = test_support::compute_task(plan, 1, {x}, {});
  side(plan, partition::TaskKind::recv, 1, 0, to_y, {}, {y});  // after the read, on its stream
  plan.tensor(x).free_after = read_x;
  plan.finish();
  const auto hazards = exec::copy_reuse_hazards(plan);
  ASSERT_EQ(hazards.size(), 1u);
  EXPECT_EQ(hazards[0].tensor, x);
  EXPECT_EQ(hazards[0].producer, receive_x);
  EXPECT_EQ(hazards[0].reader, read_x);
}

// A WSP worker runs up to D iterations ahead of its server: its next push may arrive before
// the server's update has read this one. Held once, that is a hazard (which is why the CUDA
// back end hands pushes to the host); its other tensors stay ordered.
TEST(CopyReuse, AWspWorkerRunningAheadWouldOverwriteAPushHeldOnce) {
  partition::PlanOptions o = test_support::pipeline_options(2, 2, 2, "1f1b");
  o.sync = partition::SyncKind::wsp;
  o.staleness = 2;
  const Plan plan = test_support::planned(model::cpu_cluster(4), test_support::tiny_gpt(), o);
  const auto hazards = exec::copy_reuse_hazards(plan);
  ASSERT_FALSE(hazards.empty());
  for (const exec::CopyReuseHazard& h : hazards) {
    EXPECT_EQ(plan.task(h.producer).purpose, partition::Purpose::ps_push) << exec::describe(plan, h);
    EXPECT_FALSE(exec::one_device_copy_under_real_math(plan, h.tensor));
  }
}

// Every schedule, sync and split the planner makes, as the CUDA back end's real math holds
// their tensors.
TEST(CopyReuse, ThePlannersPlansAreSafeForOneCopyPerTensor) {
  struct Variant {
    const char* schedule;
    int virtual_stages;
    partition::SyncKind sync;
    int staleness, tensor;
    bool sequence;
    partition::Recompute recompute;
    int pipeline = 4, data = 2;
  };
  using partition::Recompute;
  using partition::SyncKind;
  const Variant variants[] = {
      {"gpipe", 1, SyncKind::allreduce, 0, 1, false, Recompute::none},
      {"1f1b", 1, SyncKind::allreduce, 0, 1, false, Recompute::selective},
      {"interleaved", 2, SyncKind::allreduce, 0, 1, false, Recompute::full},
      {"1f1b-split-w", 1, SyncKind::allreduce, 0, 1, false, Recompute::none},
      {"1f1b", 1, SyncKind::ps, 0, 1, false, Recompute::none},
      {"gpipe", 1, SyncKind::wsp, 0, 1, false, Recompute::none},
      {"1f1b", 1, SyncKind::wsp, 2, 1, false, Recompute::none},
      {"1f1b", 1, SyncKind::allreduce, 0, 2, false, Recompute::none},
      {"interleaved", 2, SyncKind::allreduce, 0, 2, true, Recompute::selective},
      {"1f1b-split-w", 1, SyncKind::ps, 0, 2, true, Recompute::full},
      // The shapes the CUDA back end's GPU tests train: one or two devices.
      {"1f1b", 1, SyncKind::allreduce, 0, 1, false, Recompute::none, 1, 1},
      {"1f1b-split-w", 1, SyncKind::allreduce, 0, 1, false, Recompute::full, 1, 1},
      {"1f1b", 1, SyncKind::allreduce, 0, 1, false, Recompute::none, 2, 1},
      {"1f1b", 1, SyncKind::ps, 0, 1, false, Recompute::none, 1, 2},
      {"1f1b", 1, SyncKind::wsp, 1, 1, false, Recompute::none, 1, 2},
      {"1f1b", 1, SyncKind::allreduce, 0, 2, true, Recompute::none, 1, 1},
  };
  for (const Variant& v : variants) {
    partition::PlanOptions o = test_support::pipeline_options(v.pipeline, v.data, 4, v.schedule);
    o.virtual_stages = v.virtual_stages;
    o.sync = v.sync;
    o.staleness = v.staleness;
    o.tensor = v.tensor;
    o.sequence_parallel = v.sequence;
    o.recompute = v.recompute;
    const model::Network net = model::network_from_spec("gpt:layers=8,hidden=64,heads=4,seq=32,vocab=256",
                                                        model::Precision::fp32);
    const Plan plan = test_support::planned(model::cpu_cluster(v.pipeline * v.data * v.tensor), net, o);
    const auto hazards = exec::copy_reuse_hazards(
        plan, [&](int tensor) { return exec::one_device_copy_under_real_math(plan, tensor); });
    EXPECT_TRUE(hazards.empty()) << v.pipeline << "x" << v.data << " " << v.schedule << " "
                                 << partition::to_string(v.sync) << " staleness " << v.staleness
                                 << " tensor " << v.tensor << (v.sequence ? " + sequence" : "") << ": "
                                 << hazards.size() << " hazards, first "
                                 << (hazards.empty() ? "" : exec::describe(plan, hazards[0]));
  }
}

}  // namespace
