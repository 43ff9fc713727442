// The NCCL communicators the CUDA back end derives from a plan (exec/cuda_plan.hpp), checked
// on the plans the engine tests run: no GPU needed.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "exec/cuda_plan.hpp"
#include "tests/exec/exec_test_util.hpp"

using namespace hetflow;
using partition::Plan;
using partition::TaskKind;

namespace {

partition::PlanOptions pipeline(int stages, int microbatches) {
  partition::PlanOptions o;
  o.pipeline = stages;
  o.microbatches = microbatches;
  o.iterations = 2;
  return o;
}

TEST(CudaPlan, DevicesMapToGpusInOrderOrByList) {
  EXPECT_EQ(exec::gpu_ordinals(3, 4, {}), (std::vector<int>{0, 1, 2}));
  const std::vector<int> list{3, 1};
  EXPECT_EQ(exec::gpu_ordinals(2, 4, list), list);
  try {
    exec::gpu_ordinals(2, 0, {}, "no driver");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no CUDA device visible (no driver)"), std::string::npos) << e.what();
  }
  try {
    exec::gpu_ordinals(4, 2, {});
    FAIL();
  } catch (const PlanError& e) {
    EXPECT_NE(std::string(e.what()).find("4 devices but only 2 CUDA device(s)"), std::string::npos) << e.what();
  }
  const std::vector<int> short_list{0}, bad{0, 5};
  EXPECT_THROW(exec::gpu_ordinals(2, 4, short_list), InputError);
  EXPECT_THROW(exec::gpu_ordinals(2, 4, bad), InputError);
}

struct Shape {
  const char* name;
  int devices, pipeline, data, tensor;
  partition::SyncKind sync;
};

TEST(CudaPlan, ACommunicatorPerChannelAndPerCollectiveStreamGroup) {
  const Shape shapes[] = {{"pp2 dp2 all-reduce", 4, 2, 2, 1, partition::SyncKind::allreduce},
                          {"pp2 tp2", 4, 2, 1, 2, partition::SyncKind::allreduce},
                          {"pp2 dp2 tp2", 8, 2, 2, 2, partition::SyncKind::allreduce},
                          {"pp2 dp2 parameter server", 4, 2, 2, 1, partition::SyncKind::ps},
                          {"pp2 dp2 wsp", 4, 2, 2, 1, partition::SyncKind::wsp}};
  for (const Shape& shape : shapes) {
    SCOPED_TRACE(shape.name);
    partition::PlanOptions o = pipeline(shape.pipeline, 4);
    o.data = shape.data;
    o.tensor = shape.tensor;
    o.sync = shape.sync;
    o.staleness = shape.sync == partition::SyncKind::wsp ? 1 : 0;
    const Plan plan = test_support::planned(model::cpu_cluster(shape.devices), test_support::tiny_gpt(), o);
    const exec::CudaPlan c = exec::cuda_plan(plan, exec::gpu_ordinals(plan.device_count(), 8, {}));
    ASSERT_GE(c.groups.size(), plan.channels.size());
    int transfers = 0, collectives = 0;
    for (size_t t = 0; t < plan.tasks.size(); ++t) {
      const partition::Task& task = plan.tasks[t];
      const int g = c.group_of_task[t], r = c.rank_of_task[t];
      switch (task.kind) {
        case TaskKind::send:
        case TaskKind::recv:
          ++transfers;
          EXPECT_EQ(g, task.channel);
          EXPECT_EQ(r, task.kind == TaskKind::send ? 0 : 1);
          EXPECT_EQ(c.groups[static_cast<size_t>(g)].devices[static_cast<size_t>(r)], task.device);
          break;
        case TaskKind::collective: {
          ++collectives;
          ASSERT_GE(g, static_cast<int>(plan.channels.size()));
          const auto& members = plan.members(plan.collectives[static_cast<size_t>(task.collective)]);
          EXPECT_EQ(c.groups[static_cast<size_t>(g)].devices, members);
          EXPECT_EQ(members[static_cast<size_t>(r)], task.device);
          break;
        }
        default:
          EXPECT_EQ(g, -1);
      }
    }
    EXPECT_GT(transfers, 0);
    if (shape.tensor > 1 || (shape.data > 1 && shape.sync == partition::SyncKind::allreduce)) {
      EXPECT_GT(collectives, 0);  // parameter servers and WSP move gradients over channels
    }
    // A GPU per rank: every communicator's devices are on different GPUs.
    for (const exec::NcclGroup& group : c.groups) {
      std::set<int> gpus;
      for (const int d : group.devices) gpus.insert(c.gpus[static_cast<size_t>(d)]);
      EXPECT_EQ(gpus.size(), group.devices.size()) << group.what;
    }
  }
}

TEST(CudaPlan, RefusesTwoRanksOfACommunicatorOnOneGpu) {
  const Plan plan = test_support::planned(model::cpu_cluster(2), test_support::tiny_gpt(), pipeline(2, 2));
  const std::vector<int> same{0, 0};
  try {
    exec::cuda_plan(plan, exec::gpu_ordinals(2, 1, same));
    FAIL();
  } catch (const PlanError& e) {
    EXPECT_NE(std::string(e.what()).find("two ranks of one communicator on one GPU"), std::string::npos) << e.what();
  }
  // Devices that never meet may share a GPU.
  const Plan lone = test_support::planned(model::cpu_cluster(1), test_support::tiny_gpt(), pipeline(1, 2));
  EXPECT_NO_THROW(exec::cuda_plan(lone, {0}));
}

// Two all-reduces on one communicator and stream, which device 1 reaches in the other order.
TEST(CudaPlan, RefusesCollectivesThatMembersReachInDifferentOrders) {
  Plan plan = test_support::empty_plan(model::cpu_cluster(2));
  const int comm = plan.add_communicator({"all", {0, 1}});
  for (int k = 0; k < 2; ++k) {
    partition::Collective c;
    c.communicator = comm;
    c.bytes = 1024;
    for (int d = 0; d < 2; ++d) {
      partition::Task t;
      t.kind = TaskKind::collective;
      t.purpose = partition::Purpose::data_parallel;
      t.device = d;
      t.stream = 1;
      t.bytes = 1024;
      t.collective = k;
      c.tasks.push_back(plan.add_task(t));
    }
    plan.collectives.push_back(c);
  }
  plan.finish();
  EXPECT_NO_THROW(exec::cuda_plan(plan, {0, 1}));
  auto& tasks = plan.programs[1][0].tasks;
  std::swap(tasks[0], tasks[1]);
  try {
    exec::cuda_plan(plan, {0, 1});
    FAIL();
  } catch (const PlanError& e) {
    EXPECT_NE(std::string(e.what()).find("different orders"), std::string::npos) << e.what();
  }
}

}  // namespace
