#pragma once
// Small clusters and networks for plan tests, built in code.
#include <functional>
#include <stdexcept>
#include <string>

#include "model/cluster.hpp"
#include "model/io.hpp"
#include "model/error.hpp"
#include "model/network.hpp"
#include "model/zoo.hpp"
#include "partition/cost_model.hpp"
#include "partition/plan_builder.hpp"
#include "partition/policy.hpp"

namespace hetflow::test_support {

// The plan the options give `net` on `cluster`, at the network's precision and the cluster's
// own speeds, as `hetflow plan` builds it.
inline partition::Plan plan_of(const model::Cluster& cluster, const model::Network& net, partition::PlanOptions o) {
  o.precision = net.precision;
  const partition::CostModel cost(cluster, net.precision);
  return partition::build_plan(cluster, net, partition::make_layout(cluster, net, o, cost), cost);
}

// What `f` throws, as a user reads it: "field: message" of an InputError, or the text of an
// invalid_argument; "no error" when it throws nothing.
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.field() + ": " + e.message();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "no error";
}

// One node of `gpus` identical GPUs (A100-80, NVSwitch), or `nodes` such nodes on a switch.
inline model::Cluster identical_cluster(int gpus, int nodes = 1, const std::string& gpu = "A100-80") {
  std::string yaml = "name: identical\nnodes:\n  - {name: n, count: " + std::to_string(nodes) + ", gpu: " + gpu +
                     ", gpus: " + std::to_string(gpus) +
                     ", intra: {kind: nvswitch, bandwidth: 300 GB/s, latency: 2 us}, nic: {count: 1, bandwidth: 200 Gb/s}}\n";
  return model::parse_cluster(yaml, "identical.yaml");
}

// A small LLaMA with grouped keys and values (8 heads, 4 KV heads) whose 256-token sequence
// splits into 2C chunks for context groups of C up to 8 (the context-parallel tests').
inline const model::Network& context_llama() {
  static const model::Network net = model::network_from_spec(
      "llama:layers=4,hidden=256,heads=8,kv_heads=4,ffn=512,vocab=1000,seq=256", model::Precision::bf16);
  return net;
}

// `layers` identical layers: equal stages whatever the split.
inline model::Network equal_layers(int layers, double forward_flops = 1e12, double backward_flops = 2e12) {
  model::Network net;
  net.name = "equal";
  net.precision = model::Precision::fp16;
  for (int i = 0; i < layers; ++i) {
    model::Layer l;
    l.name = "l" + std::to_string(i);
    l.kind = "block";
    if (i > 0) l.inputs = {i - 1};
    l.forward_flops = forward_flops;
    l.backward_flops = backward_flops;
    l.params = 1e6;
    l.output_elems = 1e6;
    l.stashed_bytes = 1e7;
    net.layers.push_back(l);
  }
  return net;
}

}  // namespace hetflow::test_support
