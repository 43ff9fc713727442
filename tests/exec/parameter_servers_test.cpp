// The parameter servers alone, against AdamW's closed form: two workers' chunks take their
// gradients, each server's update adds every push (its own device's taken, the other's from
// the plan's push) and steps its parameters once; a pull then carries those weights back.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "exec/decoder.hpp"
#include "exec_test_util.hpp"
#include "exec/global_norm.hpp"
#include "exec/optimizer_step.hpp"
#include "exec/parameter_servers.hpp"
#include "exec/step_log.hpp"
#include "model/cluster.hpp"

namespace hetflow {
namespace {

using Key = exec::ParameterServers::ChunkKey;

TEST(ParameterServers, AnUpdateIsOneAdamwStepOnTheSumOfItsPushes) {
  partition::PlanOptions o = test_support::pipeline_options(1, 2, 1, "1f1b");
  o.sync = partition::SyncKind::ps;
  const partition::Plan plan = test_support::planned(model::cpu_cluster(2), test_support::tiny_gpt(), o);
  const exec::DecoderShape shape = exec::decoder_shape(*plan.network.architecture);
  std::map<Key, exec::ChunkParams> chunks;
  for (const partition::Task& t : plan.tasks) {
    if (t.kind == partition::TaskKind::forward) {
      chunks.emplace(Key{t.device, t.worker, t.stage}, exec::chunk_params(shape, t.layer_begin, t.layer_end));
    }
  }
  ASSERT_EQ(chunks.size(), 2u);
  constexpr std::uint64_t kSeed = 5;
  exec::ParameterServers servers(plan, shape, chunks, [](int) { return true; }, kSeed, nullptr);

  // Worker w's gradients: every float (w + 1) / 100. The gradient a server sums for a name is
  // that over every chunk's slot of the name (a tied embedding's two copies both count).
  std::map<std::string, double> want_g;
  for (const auto& [key, p] : chunks) {
    const float g = static_cast<float>(std::get<1>(key) + 1) / 100;
    servers.take(key, 0, std::vector<float>(p.count, g));
    for (const exec::ParamSlot& slot : p.slots) want_g[slot.name] += g;
  }

  exec::OptimizerOptions adam;
  adam.lr = 0.1;
  adam.clip_grad = 0;  // no norm: each update steps alone
  adam.adam_eps = 1;   // the step lr g / (|g| + 1): it tells the gradients' sizes apart, not only their signs
  exec::OptimizerStep step(adam, 2, 0);
  exec::GlobalNorm norm(0, 0, nullptr, {});
  exec::StepLog log({1, 1});
  std::atomic<bool> stop{false};
  int updates = 0;
  for (size_t u = 0; u < plan.tasks.size(); ++u) {
    const partition::Task& update = plan.tasks[u];
    if (update.kind != partition::TaskKind::optimizer || update.worker >= 0) continue;
    ++updates;
    // Its reads, in order: each push the plan delivers to it, as the push's send carries it.
    std::vector<std::vector<float>> pushed;
    std::vector<exec::Buffer> reads;
    for (const int tensor : plan.reads(static_cast<int>(u))) {
      pushed.emplace_back();
      for (size_t r = 0; r < plan.tasks.size(); ++r) {
        const auto writes = plan.writes(static_cast<int>(r));
        if (plan.tasks[r].kind != partition::TaskKind::recv || writes.empty() || writes[0] != tensor) continue;
        for (size_t s = 0; s < plan.tasks.size(); ++s) {
          if (plan.tasks[s].kind == partition::TaskKind::send && plan.tasks[s].channel == plan.tasks[r].channel) {
            pushed.back() = servers.message(static_cast<int>(s), 0).value();
          }
        }
      }
    }
    for (auto& p : pushed) reads.push_back({reinterpret_cast<std::byte*>(p.data()), p.size() * sizeof(float)});
    test_support::StubTask task(static_cast<int>(u), 0, &update);
    task.reads = reads;
    servers.update(task, stop, step, norm, log);
  }
  EXPECT_GT(updates, 0);

  // Step 1 of AdamW: the bias-corrected moments are g and g^2, so p (1 - lr wd) - lr g / (|g| + eps).
  const auto weights = servers.weights();
  int checked = 0;
  for (int layer = 0; layer < shape.layers + 2; ++layer) {
    const exec::ChunkParams p = exec::chunk_params(shape, layer, layer + 1);
    std::vector<float> initial(p.count);
    exec::init_params(p, shape, kSeed, initial.data());
    for (const exec::ParamSlot& slot : p.slots) {
      if (slot.tied_copy) continue;
      ASSERT_TRUE(weights.count(slot.name)) << slot.name;
      const double g = want_g.at(slot.name), wd = slot.decays ? adam.weight_decay : 0.0;
      for (size_t i = 0; i < slot.count; i += 97) {
        const double want = initial[slot.offset + i] * (1 - adam.lr * wd) - adam.lr * g / (std::abs(g) + adam.adam_eps);
        ASSERT_NEAR(weights.at(slot.name)[i], want, 1e-6) << slot.name << "[" << i << "]";
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 10);

  // A pull carries iteration 0's weights of the server's layers, the chunk's slots in order.
  int pulls = 0;
  for (size_t s = 0; s < plan.tasks.size(); ++s) {
    const partition::Task& send = plan.tasks[s];
    if (send.kind != partition::TaskKind::send || send.purpose != partition::Purpose::ps_pull) continue;
    ++pulls;
    const partition::Channel& channel = plan.channel(send.channel);
    const std::vector<float> pulled = servers.message(static_cast<int>(s), 0).value();
    EXPECT_EQ(servers.message_floats(static_cast<int>(s)), pulled.size());
    std::vector<float> want;
    for (const exec::ParamSlot& slot : chunks.at(Key{channel.dst, send.worker, send.stage}).slots) {
      if (plan.layout.sync.layer_server[static_cast<size_t>(slot.layer)] != channel.src) continue;
      want.insert(want.end(), weights.at(slot.name), weights.at(slot.name) + slot.count);
    }
    EXPECT_EQ(pulled, want) << "pull task " << s;
  }
  EXPECT_GT(pulls, 0);
}

}  // namespace
}  // namespace hetflow
