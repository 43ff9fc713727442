// Expert parallelism's math in the decoder (exec/decoder.hpp's ExpertGroup): ranks that each
// hold their experts and train their own tokens, exchanging the copies through all-to-alls
// (threads here), against one chunk holding every expert that trains each rank's tokens
// alone. Oracle: the same losses and input-side gradients per rank; the router's, the
// attention's and the shared expert's gradients each rank's own; each expert's gradient on
// its holder the sum of every rank's one-chunk gradient of it.
#include <gtest/gtest.h>

#include <barrier>
#include <cmath>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "exec/decoder.hpp"
#include "model/zoo.hpp"
#include "model/error.hpp"

namespace hetflow {
namespace {

// An all-to-all among `ranks` threads: each posts its messages, all meet, each takes its
// parts, all meet again (so no post overwrites one still being read).
class Exchange {
 public:
  explicit Exchange(int ranks) : barrier_(ranks), posted_(static_cast<size_t>(ranks)) {}
  std::vector<float> all_to_all(int rank, std::span<const float> send, std::span<const size_t> parts,
                                std::vector<size_t>& recv_parts) {
    posted_[static_cast<size_t>(rank)] = {std::vector<float>(send.begin(), send.end()),
                                          std::vector<size_t>(parts.begin(), parts.end())};
    barrier_.arrive_and_wait();
    std::vector<float> recv;
    recv_parts = {0};
    for (const auto& [data, at] : posted_) {
      recv.insert(recv.end(), data.begin() + static_cast<std::ptrdiff_t>(at[static_cast<size_t>(rank)]),
                  data.begin() + static_cast<std::ptrdiff_t>(at[static_cast<size_t>(rank) + 1]));
      recv_parts.push_back(recv.size());
    }
    barrier_.arrive_and_wait();
    if (rank == 0) ++calls;
    return recv;
  }
  int calls = 0;  // (rank 0's count is every rank's)

 private:
  std::barrier<> barrier_;
  std::vector<std::pair<std::vector<float>, std::vector<size_t>>> posted_;
};

class ExpertGroupOnThreads final : public exec::TensorParallelGroup {
 public:
  ExpertGroupOnThreads(Exchange& exchange, int rank) : exchange_(exchange), rank_(rank) {}
  void all_reduce(std::span<float>, bool) override { FAIL() << "no all-reduce in an expert group"; }
  void all_gather(std::span<float>, std::span<const size_t>) override { FAIL() << "no all-gather"; }
  void reduce_scatter(std::span<float>, std::span<const size_t>) override { FAIL() << "no reduce-scatter"; }
  std::vector<float> all_to_all(std::span<const float> send, std::span<const size_t> parts,
                                std::vector<size_t>& recv_parts) override {
    return exchange_.all_to_all(rank_, send, parts, recv_parts);
  }

 private:
  Exchange& exchange_;
  int rank_;
};

// A Mixtral-style chunk of every layer: 6 experts, top 2, a load-balancing loss, a capacity
// factor where given.
exec::DecoderShape mixtral_shape(double capacity_factor) {
  model::TransformerConfig c =
      *model::network_from_spec("llama:layers=2,hidden=48,heads=6,kv_heads=2,ffn=100,seq=11,vocab=101",
                                model::Precision::fp32)
           .architecture;
  c.name = "mixtral-odd";
  c.moe.tensor_names = model::MoeConfig::TensorNames::mixtral;
  c.moe.experts = 6;
  c.moe.experts_per_token = 2;
  c.moe.expert_ffn = 29;
  c.moe.aux_loss_coef = 0.02;
  c.moe.capacity_factor = capacity_factor;
  return exec::decoder_shape(c);
}

struct RankRun {
  double loss = 0;
  std::map<std::string, std::vector<float>> grads;  // by slot name
};

// Rank `rank`'s forward and backward on its own 2 sequences (`chunk` holds what the rank holds).
RankRun train_rank(const exec::DecoderChunk& chunk, const exec::DecoderShape& shape, int rank,
                   exec::TensorParallelGroup* group) {
  const exec::ChunkParams& p = chunk.params();
  std::vector<float> params(p.count), grads(p.count, 0.0f);
  exec::init_params(p, shape, 5, params.data());
  const int samples = 2;
  std::vector<int> tokens(static_cast<size_t>(samples * shape.S)), targets(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<int>((i * 37 + 11 * static_cast<size_t>(rank) + 5) % static_cast<size_t>(shape.V));
    targets[i] = static_cast<int>((i * 53 + 7 * static_cast<size_t>(rank) + 2) % static_cast<size_t>(shape.V));
  }
  exec::DecoderChunk::Input in;
  in.samples = samples;
  in.tokens = tokens.data();
  in.targets = targets.data();
  in.loss_scale = 1.0f / static_cast<float>(tokens.size());
  in.expert_group = group;
  RankRun run;
  auto stash = chunk.forward(params.data(), in, run.loss);
  chunk.backward(*stash, params.data(), grads.data(), nullptr, nullptr, false, false, nullptr, false, nullptr, group);
  for (const exec::ParamSlot& slot : p.slots) {
    run.grads[slot.name] = std::vector<float>(grads.begin() + static_cast<std::ptrdiff_t>(slot.offset),
                                              grads.begin() + static_cast<std::ptrdiff_t>(slot.offset + slot.count));
  }
  return run;
}

double relative(const std::vector<float>& got, const std::vector<double>& want) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    diff += (got[i] - want[i]) * (got[i] - want[i]);
    norm += want[i] * want[i];
  }
  return std::sqrt(diff / std::max(norm, 1e-30));
}

void expect_expert_parallel_equals_whole(int G, const std::vector<int>& placement, double capacity_factor,
                                         partition::Recompute recompute) {
  const exec::DecoderShape shape = mixtral_shape(capacity_factor);
  const int layers = shape.layers + 2;
  // Each rank's tokens through one chunk holding every expert.
  std::vector<RankRun> whole;
  for (int r = 0; r < G; ++r) whole.push_back(train_rank(exec::DecoderChunk(shape, 0, layers, recompute), shape, r, nullptr));
  // The expert group on threads.
  Exchange exchange(G);
  std::vector<RankRun> parallel(static_cast<size_t>(G));
  std::vector<std::thread> threads;
  for (int r = 0; r < G; ++r) {
    threads.emplace_back([&, r] {
      const exec::DecoderChunk chunk(shape, 0, layers, recompute, 0, 1, exec::cpu_decoder_ops(), false, {},
                                     exec::ExpertGroup{G, r, placement});
      ExpertGroupOnThreads group(exchange, r);
      parallel[static_cast<size_t>(r)] = train_rank(chunk, shape, r, &group);
    });
  }
  for (std::thread& t : threads) t.join();
  const std::string what = "EP " + std::to_string(G) + (capacity_factor > 0 ? " capacity" : "") + " recompute " +
                           std::string(partition::to_string(recompute));
  // Dispatch and combine a layer forward, both again backward, and the forward again before
  // the backward under full recomputation.
  EXPECT_EQ(exchange.calls, shape.layers * (recompute == partition::Recompute::full ? 6 : 4)) << what;
  size_t experts_seen = 0;
  for (int r = 0; r < G; ++r) {
    const RankRun& got = parallel[static_cast<size_t>(r)];
    EXPECT_NEAR(got.loss, whole[static_cast<size_t>(r)].loss, 1e-6 * std::abs(got.loss)) << what << " rank " << r;
    for (const auto& [name, g] : got.grads) {
      const bool expert = name.find(".experts.") != std::string::npos;
      experts_seen += expert;
      std::vector<double> want(g.size(), 0.0);
      for (int s = 0; s < G; ++s) {
        if (!expert && s != r) continue;  // a replicated parameter: this rank's own tokens' gradient
        const std::vector<float>& w = whole[static_cast<size_t>(s)].grads.at(name);
        for (size_t i = 0; i < w.size(); ++i) want[i] += w[i];
      }
      EXPECT_LT(relative(g, want), 1e-5) << what << " rank " << r << ": " << name;
    }
  }
  EXPECT_EQ(experts_seen, static_cast<size_t>(shape.layers * 6 * 3)) << what << ": every expert held once";
}

TEST(ExpertParallelMath, RanksHoldingTheirExpertsTrainAsOneChunkHoldingThemAll) {
  expect_expert_parallel_equals_whole(2, {}, 0, partition::Recompute::none);
  expect_expert_parallel_equals_whole(3, {}, 0, partition::Recompute::full);
  // Placed by hand, one rank holding four experts and the other two (as by speed).
  expect_expert_parallel_equals_whole(2, {0, 1, 0, 0, 1, 0}, 0, partition::Recompute::none);
  // Capacity drops are each rank's own tokens', as on one chunk.
  expect_expert_parallel_equals_whole(2, {}, 1.0, partition::Recompute::selective);
}

TEST(ExpertParallelMath, AChunkWithoutItsGroupOrWithABadPlacementIsRefused) {
  const exec::DecoderShape shape = mixtral_shape(0);
  EXPECT_THROW(exec::DecoderChunk(shape, 0, 4, partition::Recompute::none, 0, 1, exec::cpu_decoder_ops(), false, {},
                                  exec::ExpertGroup{2, 0, {0, 1, 2, 0, 1, 0}}),
               std::invalid_argument);
  const exec::DecoderChunk chunk(shape, 0, 4, partition::Recompute::none, 0, 1, exec::cpu_decoder_ops(), false, {},
                                 exec::ExpertGroup{2, 1, {}});
  EXPECT_THROW(train_rank(chunk, shape, 1, nullptr), std::invalid_argument);
}

}  // namespace
}  // namespace hetflow

namespace hetflow {
namespace {

// A mixture's tensor names are the config's (MoeConfig::tensor_names: Mixtral's model_type
// gives block_sparse_moe.experts.j.w1, w3, w2), whatever the network is called: a Mixtral
// checkpoint's directory is "Mixtral-8x7B-v0.1", not "mixtral...".
TEST(MoeNames, AChunksExpertTensorsAreNamedAsItsConfigSays) {
  model::TransformerConfig c =
      *model::network_from_spec("llama:layers=1,hidden=32,heads=2,kv_heads=2,ffn=40,seq=8,vocab=64,experts=2,"
                                "experts_per_token=1,expert_ffn=16",
                                model::Precision::fp32)
           .architecture;
  const auto names = [&](model::MoeConfig::TensorNames n, const std::string& name) {
    c.name = name;
    c.moe.tensor_names = n;
    std::vector<std::string> out;
    for (const exec::ParamSlot& s : exec::chunk_params(exec::decoder_shape(c), 0, 3).slots) {
      if (s.expert == 1) out.push_back(s.name);
    }
    return out;
  };
  using Names = model::MoeConfig::TensorNames;
  const std::vector<std::string> mixtral{"model.layers.0.block_sparse_moe.experts.1.w1.weight",
                                         "model.layers.0.block_sparse_moe.experts.1.w2.weight",
                                         "model.layers.0.block_sparse_moe.experts.1.w3.weight"};
  const std::vector<std::string> qwen{"model.layers.0.mlp.experts.1.gate_proj.weight",
                                      "model.layers.0.mlp.experts.1.up_proj.weight",
                                      "model.layers.0.mlp.experts.1.down_proj.weight"};
  EXPECT_EQ(names(Names::mixtral, "Mixtral-8x7B-v0.1"), mixtral);
  EXPECT_EQ(names(Names::qwen, "mixtral-named-but-qwen"), qwen);
}

}  // namespace
}  // namespace hetflow
