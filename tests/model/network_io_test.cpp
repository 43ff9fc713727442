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

// A layer's backward tensor-parallel traffic: the forward's unless given (a file written before
// the two could differ means what it meant then), one collective when only its size is given.
TEST(NetworkIo, BackwardTensorParallelTrafficDefaultsToTheForwards) {
  const auto layer = [](const std::string& fields) {
    return parse_network("layers:\n  - {name: a, forward_flops: 1, output_elems: 1, " + fields + "}\n", "n.yaml")
        .layers[0];
  };
  const Layer same = layer("tp_allreduce_elems: 8, tp_allreduces: 2");
  EXPECT_DOUBLE_EQ(same.tp_backward_allreduce_elems, 8);
  EXPECT_EQ(same.tp_backward_allreduces, 2);
  const Layer head = layer("tp_allreduce_elems: 0, tp_backward_allreduce_elems: 4");
  EXPECT_DOUBLE_EQ(head.tp_backward_allreduce_elems, 4);
  EXPECT_EQ(head.tp_backward_allreduces, 1);
  const Layer embedding = layer("tp_allreduce_elems: 4, tp_backward_allreduce_elems: 0");
  EXPECT_EQ(embedding.tp_backward_allreduces, 0);
  try {
    layer("tp_backward_allreduce_elems: 4, tp_backward_allreduces: 0");
    ADD_FAILURE() << "a backward volume in no collective was accepted";
  } catch (const hetflow::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("n.yaml:2"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("layers[0].tp_backward_allreduces: expected at least 1"), std::string::npos)
        << e.what();
  }
  Network net = parse_network("layers:\n  - {name: a, forward_flops: 1, output_elems: 1}\n", "n.yaml");
  net.layers[0].tp_backward_allreduce_elems = 6;
  net.layers[0].tp_backward_allreduces = 3;
  EXPECT_EQ(parse_network(write_network(net), "rt.yaml"), net);
}

// A layer's CNN operations: read, written back, and checked against its forward_flops.
TEST(NetworkIo, CnnOperationsRoundTripAndMustMakeTheLayersFlops) {
  // A 3x3 convolution of a 8x8x4 map to 8x8x2: 8*8*2*4*9 = 4,608 multiply-adds, 9,216 FLOPs.
  const std::string layer =
      "layers:\n  - name: c\n    forward_flops: F\n    output_elems: 32\n"
      "    ops:\n      - {op: conv, in: [8, 8, 4], out: [8, 8, 2], kernel: 3, input_grad: false}\n"
      "      - {op: batch_norm, out: [8, 8, 2]}\n      - {op: max_pool, in: [8, 8, 2], out: [4, 4, 2]}\n";
  const auto with_flops = [&](const std::string& flops) {
    std::string yaml = layer;
    yaml.replace(yaml.find('F'), 1, flops);
    return yaml;
  };
  const Network net = parse_network(with_flops("9216"), "cnn.yaml");
  ASSERT_EQ(net.layers[0].cnn_ops.size(), 3u);
  const CnnOp& conv = net.layers[0].cnn_ops[0];
  EXPECT_EQ(conv.kind, CnnOp::Kind::conv);
  EXPECT_EQ(conv.kernel, 3);
  EXPECT_FALSE(conv.input_grad);
  EXPECT_EQ(cnn_op_macs(conv), 4608);
  EXPECT_EQ(net.layers[0].cnn_ops[2].in, (std::array<std::int64_t, 3>{8, 8, 2}));
  EXPECT_EQ(parse_network(write_network(net), "rt.yaml"), net);
  const auto error = [&](const std::string& yaml) {
    try {
      parse_network(yaml, "cnn.yaml");
    } catch (const hetflow::InputError& e) {
      return e.field() + ": " + e.what();
    }
    return std::string("no error");
  };
  EXPECT_NE(error(with_flops("9000")).find("layers[0].ops"), std::string::npos) << error(with_flops("9000"));
  std::string unknown = with_flops("9216");
  unknown.replace(unknown.find("batch_norm"), 10, "layer_norm");
  EXPECT_NE(error(unknown).find("layers[0].ops[1].op"), std::string::npos) << error(unknown);
  std::string flat = with_flops("9216");
  flat.replace(flat.find("in: [8, 8, 4]"), 13, "in: [8, 8]");
  EXPECT_NE(error(flat).find("layers[0].ops[0].in"), std::string::npos) << error(flat);
}
