// Gradient synchronisation alone, on two replicas of a tiny GPT: without ZeRO each all-reduce
// bucket is its share of the chunk's gradients, in order, covering them once; under ZeRO
// each replica owns the half of every bucket its reduce-scatter leaves it (ring of two,
// even shares: member r's part is [r/2, (r+1)/2) of the bucket), so the two replicas own
// disjoint halves that cover the chunk.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <vector>

#include "exec/chunk_state.hpp"
#include "exec/decoder_ops.hpp"
#include "exec/gradient_sync.hpp"
#include "exec/plan_tensors.hpp"
#include "exec_test_util.hpp"
#include "model/cluster.hpp"

namespace hetflow {
namespace {

// The chunks of a data-parallel plan without tensor parallelism, as Training makes them.
struct Chunks {
  explicit Chunks(const partition::Plan& plan) : shape(exec::decoder_shape(*plan.network.architecture)) {
    for (size_t t = 0; t < plan.tasks.size(); ++t) {
      const partition::Task& task = plan.tasks[t];
      if (task.kind != partition::TaskKind::forward) continue;
      const int weight = exec::tensor_of_kind(plan, plan.reads(static_cast<int>(t)), partition::TensorKind::weight);
      if (of_tensor.count(weight)) continue;
      auto c = std::make_unique<exec::ChunkState>(shape, task.layer_begin, task.layer_end, plan.layout.recompute, 0, 1,
                                                  ops, false);
      c->device = task.device;
      c->worker = task.worker;
      c->stage = task.stage;
      c->params = ops.zeros(c->math.params().count);
      c->grads = ops.zeros(c->math.params().count);
      of_tensor[weight] = c.get();
      all.push_back(std::move(c));
    }
    // Gradients: what a backward of the chunk writes (from ZeRO stage 2 its reduce-scatters,
    // of the whole buffers the passes wrote).
    for (size_t t = 0; t < plan.tasks.size(); ++t) {
      const partition::Task& task = plan.tasks[t];
      const int grad = exec::tensor_of_kind(plan, plan.writes(static_cast<int>(t)), partition::TensorKind::weight_grad);
      if (grad < 0 || of_tensor.count(grad)) continue;
      for (const auto& c : all) {
        if (c->device == task.device && c->worker == task.worker && c->stage == task.stage) of_tensor[grad] = c.get();
      }
    }
  }
  exec::DecoderShape shape;
  exec::CpuDecoderOps ops;
  std::vector<std::unique_ptr<exec::ChunkState>> all;
  std::map<int, exec::ChunkState*> of_tensor;
};

partition::Plan two_replicas(int zero_stage) {
  partition::PlanOptions o = test_support::pipeline_options(1, 2, 2, "1f1b");
  o.bucket_bytes = 16384;  // several buckets a chunk
  o.zero_stage = zero_stage;
  return test_support::planned(model::cpu_cluster(2), test_support::tiny_gpt(), o);
}

TEST(GradientSync, AllReduceBucketsAreTheChunksGradientsInOrderOnce) {
  const partition::Plan plan = two_replicas(0);
  Chunks chunks(plan);
  ASSERT_EQ(chunks.all.size(), 2u);
  const std::map<int, std::pair<int, int>> untensored;
  exec::GradientSync sync(plan, chunks.shape, chunks.of_tensor, untensored, [](int) { return true; }, 0);
  for (const auto& c : chunks.all) {
    std::vector<std::pair<const float*, size_t>> spans;
    for (size_t t = 0; t < plan.tasks.size(); ++t) {
      const partition::Task& task = plan.tasks[t];
      if (task.kind != partition::TaskKind::collective || task.device != c->device ||
          task.purpose != partition::Purpose::data_parallel) {
        continue;
      }
      test_support::StubTask ctx(static_cast<int>(t), 0, &task);
      const auto data = sync.data(ctx);
      spans.emplace_back(data.data(), data.size());
    }
    ASSERT_GT(spans.size(), 1u) << "device " << c->device;  // the buckets
    std::sort(spans.begin(), spans.end());
    const float* at = c->grads.data();
    for (const auto& [p, n] : spans) {
      EXPECT_EQ(p, at);
      at = p + n;
    }
    EXPECT_EQ(at, c->grads.data() + c->grads.size());
  }
}

TEST(GradientSync, UnderZeroEachReplicaOwnsItsHalfOfEveryBucket) {
  for (const int stage : {1, 2}) {
    const partition::Plan plan = two_replicas(stage);
    Chunks chunks(plan);
    const std::map<int, std::pair<int, int>> untensored;
    exec::GradientSync sync(plan, chunks.shape, chunks.of_tensor, untensored, [](int) { return true; }, stage);
    ASSERT_EQ(chunks.all.size(), 2u);
    const size_t n = chunks.all[0]->params.size();
    std::vector<int> owners(n, 0);
    for (const auto& c : chunks.all) {
      ASSERT_FALSE(c->owned.empty()) << "stage " << stage;
      for (const auto& [a, b] : c->owned) {
        for (size_t i = a; i < b; ++i) ++owners[i];
      }
    }
    EXPECT_TRUE(std::all_of(owners.begin(), owners.end(), [](int k) { return k == 1; }))
        << "stage " << stage << ": every parameter owned by exactly one replica";
    // Replica r's part of each piece is [r/2, (r+1)/2) of it: device 0 owns the lower half.
    EXPECT_EQ(chunks.all[0]->owned.front().first, 0u) << "stage " << stage;
  }
}

}  // namespace
}  // namespace hetflow
