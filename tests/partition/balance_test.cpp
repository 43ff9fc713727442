// The stage balancer against a brute force: every contiguous cut of a few layers over
// heterogeneous ranks in four nodes, each chunk costed here from the cost model's primitives
// (its layers' forward and backward FLOPs on its rank's device, its boundary activation sent
// to the next rank). The balancer's cut must be a cheapest one and its bottleneck the cut's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>

#include "model/io.hpp"
#include "model/zoo.hpp"
#include "partition/policy.hpp"

using namespace hetflow;
using namespace hetflow::partition;
using policy_detail::Balanced;
using policy_detail::balance_stages;
using policy_detail::measure_stages;

namespace {

// The slowest chunk of the cut `bounds` (ranks.size() + 1 entries), per micro-batch.
double bottleneck_of(const std::vector<int>& bounds, const model::Network& net, const Layout& layout,
                     const std::vector<std::vector<int>>& ranks, const CostModel& cost) {
  double worst = 0;
  const double mbs = layout.micro_batch_size;
  for (size_t r = 0; r + 1 < bounds.size(); ++r) {
    double forward = 0, backward = 0;
    for (int l = bounds[r]; l < bounds[r + 1]; ++l) {
      const model::Layer& layer = net.layers[static_cast<size_t>(l)];
      forward += layer.forward_flops * mbs;
      backward += (layer.backward_flops + (layout.recompute == Recompute::full ? layer.forward_flops : 0)) * mbs;
    }
    const int device = ranks[r].front();
    double t = cost.compute_time_s(device, TaskKind::forward, forward) + cost.compute_time_s(device, TaskKind::backward, backward);
    if (r + 2 < bounds.size()) {
      t += cost.transfer_time_s(device, ranks[r + 1].front(), net.cut_bytes(static_cast<size_t>(bounds[r + 1])) * mbs);
    }
    worst = std::max(worst, t);
  }
  return worst;
}

// Every cut of `layers` layers into `stages` non-empty stages.
void each_cut(int layers, int stages, std::vector<int>& bounds, const std::function<void(const std::vector<int>&)>& f) {
  if (static_cast<int>(bounds.size()) == stages) {
    bounds.push_back(layers);
    f(bounds);
    bounds.pop_back();
    return;
  }
  const int left = stages - static_cast<int>(bounds.size());  // stages still to start, this one included
  for (int b = bounds.back() + 1; b <= layers - left; ++b) {
    bounds.push_back(b);
    each_cut(layers, stages, bounds, f);
    bounds.pop_back();
  }
}

}  // namespace

TEST(Balancer, ChunkCostAndCutMatchABruteForce) {
  // Four GPU types on a 10 Gb/s network: each boundary's send takes about as long as a
  // layer's compute, so the sends weigh in every cut (a send costed at half would move the
  // bottleneck and the cut).
  const model::Cluster cluster = model::parse_cluster(
      "name: four\n"
      "nodes:\n"
      "  - {name: a, gpu: V100-32, gpus: 1, nic: {count: 1, bandwidth: 10 Gb/s, latency: 5 us}}\n"
      "  - {name: b, gpu: T4, gpus: 1, nic: {count: 1, bandwidth: 10 Gb/s, latency: 5 us}}\n"
      "  - {name: c, gpu: RTX-3090, gpus: 1, nic: {count: 1, bandwidth: 10 Gb/s, latency: 5 us}}\n"
      "  - {name: d, gpu: A100-80, gpus: 1, nic: {count: 1, bandwidth: 10 Gb/s, latency: 5 us}}\n",
      "four.yaml");
  // Activations large against the layers' compute: the boundary sends weigh in every cut.
  const model::Network net =
      model::network_from_spec("gpt:layers=8,hidden=1024,heads=16,seq=2048,vocab=8192", model::Precision::fp16);
  const int layers = static_cast<int>(net.layers.size());
  const CostModel cost(cluster, model::Precision::fp16);
  // One GPU of each type, in an order that is not the speed order; the fastest last, so the
  // slowest chunk is one that sends.
  const std::vector<std::vector<int>> ranks = {{0}, {1}, {2}, {3}};
  for (const Recompute recompute : {Recompute::none, Recompute::full}) {
    Layout layout;
    layout.precision = model::Precision::fp16;
    layout.micro_batch_size = 4;
    layout.recompute = recompute;
    layout.workspace_bytes = 0;
    const Balanced got = balance_stages(net, layout, ranks, 8, cost);
    ASSERT_TRUE(got.fits);
    ASSERT_EQ(got.stages.size(), ranks.size());
    std::vector<int> cut{0};
    for (const Stage& s : got.stages) cut.push_back(s.layer_end);
    // The chunk cost: the balancer's bottleneck is its cut's, as costed here.
    const double mine = bottleneck_of(cut, net, layout, ranks, cost);
    EXPECT_NEAR(got.bottleneck_s, mine, 1e-12 * mine) << to_string(recompute);
    // The cut: no other is cheaper.
    double best = std::numeric_limits<double>::infinity();
    int cuts = 0;
    std::vector<int> bounds{0};
    each_cut(layers, static_cast<int>(ranks.size()), bounds, [&](const std::vector<int>& b) {
      ++cuts;
      best = std::min(best, bottleneck_of(b, net, layout, ranks, cost));
    });
    EXPECT_EQ(cuts, (layers - 1) * (layers - 2) * (layers - 3) / 6);  // C(L - 1, 3): every cut was tried
    EXPECT_NEAR(mine, best, 1e-12 * best) << to_string(recompute);
    EXPECT_NEAR(measure_stages(net, layout, ranks, got.stages, 8, cost).bottleneck_s, mine, 1e-12 * mine);
  }
}

// ZeRO's shares by memory (ZeroShares::memory) as the balancer bounds memory: a V100-16 and a
// V100-32 replica of a 1.9B-parameter GPT at stage 1, mixed-precision Adam (Rajbhandari et
// al. 2020: (2 + 2) Psi + K Psi / Nd, K = 12). Shared equally the 16 GB device holds 10 Psi
// bytes and overflows; by memory it holds a third of the optimizer state, 8 Psi, and fits.
TEST(Balancer, ZeroSharesByMemoryBoundEachDevicesPartByItsMemory) {
  const model::Cluster cluster = model::parse_cluster(
      "name: two\n"
      "nodes:\n"
      "  - {name: a, gpu: V100-16, gpus: 1, nic: {count: 1, bandwidth: 100 Gb/s, latency: 5 us}}\n"
      "  - {name: b, gpu: V100-32, gpus: 1, nic: {count: 1, bandwidth: 100 Gb/s, latency: 5 us}}\n",
      "two.yaml");
  const model::Network net =
      model::network_from_spec("gpt:layers=38,hidden=2048,heads=16,seq=128,vocab=8192", model::Precision::fp16);
  const CostModel cost(cluster, model::Precision::fp16);
  Layout layout;
  layout.precision = model::Precision::fp16;
  layout.fp32_grad_accumulation = false;
  layout.micro_batch_size = 1;
  layout.workspace_bytes = 0;
  layout.set_size(Axis::data, 2);
  layout.sync.zero.stage = 1;
  const double psi = net.param_count(), small = cost.memory_capacity_bytes(0), large = cost.memory_capacity_bytes(1);
  ASSERT_GT(10 * psi, small);         // equal shares: 2 + 2 + 12 / 2 bytes a parameter
  ASSERT_LT(8 * psi, 0.97 * small);   // by memory: 2 + 2 + 12 x 16 / 48, with room for the stash
  const std::vector<std::vector<std::vector<int>>> replicas{{{0}}, {{1}}};
  EXPECT_EQ(policy_detail::replicas_memory_bytes(layout, replicas, cost), 0);  // (equal shares)
  EXPECT_FALSE(balance_stages(net, layout, {{0}}, 2, cost).fits);
  layout.sync.zero.shares = ZeroShares::memory;
  const double memory = policy_detail::replicas_memory_bytes(layout, replicas, cost);
  EXPECT_DOUBLE_EQ(memory, small + large);
  EXPECT_TRUE(balance_stages(net, layout, {{0}}, 2, cost, memory).fits);
  EXPECT_TRUE(balance_stages(net, layout, {{1}}, 2, cost, memory).fits);  // 4 + 12 x 32 / 48 = 12 Psi
}
