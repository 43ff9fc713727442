// Network descriptions: YAML format, DAG cuts, and the lossless round trip of every zoo network.
#include <gtest/gtest.h>

#include "model/error.hpp"
#include "model/io.hpp"
#include "model/zoo.hpp"

using namespace hetflow::model;

TEST(NetworkIo, EveryZooNetworkRoundTrips) {
  for (const ZooEntry& e : zoo_entries()) {
    if (e.is_template) continue;  // the gpt:/llama: patterns
    for (Precision p : {Precision::fp16, Precision::fp32}) {
      const Network net = network_from_spec(e.name, p);
      EXPECT_EQ(parse_network(write_network(net), "rt.yaml"), net) << e.name;
    }
  }
}

TEST(NetworkIo, ZooReferenceInAFile) {
  const Network net = parse_network("zoo: resnet50\nprecision: fp32\n", "m.yaml");
  EXPECT_EQ(net, make_resnet(50, Precision::fp32));
  EXPECT_EQ(parse_network("zoo: resnet50\n", "m.yaml", Precision::bf16).precision, Precision::bf16);
}

TEST(NetworkIo, BranchingDagCutsCountEachProducerOnce) {
  // 0 -> 1 -> 3, 0 -> 2 -> 3 (a diamond), then 3 -> 4.
  const std::string yaml = R"(name: diamond
precision: fp32
layers:
  - {name: in, forward_flops: 10, params: 1, output_elems: 100}
  - {name: left, forward_flops: 10, output_elems: 10, inputs: [0]}
  - {name: right, forward_flops: 10, output_elems: 20, inputs: [0]}
  - {name: join, forward_flops: 10, output_elems: 5, inputs: [1, 2]}
  - {name: out, forward_flops: 10, output_elems: 1}
)";
  const Network net = parse_network(yaml, "diamond.yaml");
  EXPECT_DOUBLE_EQ(net.cut_bytes(1), 100 * 4);        // layer 0 feeds both branches: sent once
  EXPECT_DOUBLE_EQ(net.cut_bytes(2), (100 + 10) * 4);  // the left branch result and the input
  EXPECT_DOUBLE_EQ(net.cut_bytes(3), (10 + 20) * 4);
  EXPECT_DOUBLE_EQ(net.cut_bytes(4), 5 * 4);
  EXPECT_DOUBLE_EQ(net.layers[0].backward_flops, 20);  // default: twice the forward
  EXPECT_EQ(net.layers[4].inputs, std::vector<int>{3});
  EXPECT_EQ(parse_network(write_network(net), "rt.yaml"), net);
}

TEST(NetworkIo, OverridingPrecisionScalesExplicitActivationBytes) {
  const std::string yaml =
      "precision: fp32\nlayers:\n  - {name: a, forward_flops: 1, output_elems: 1, stashed_bytes: 400}\n";
  EXPECT_DOUBLE_EQ(parse_network(yaml, "n.yaml", Precision::fp16).layers[0].stashed_bytes, 200);
}
