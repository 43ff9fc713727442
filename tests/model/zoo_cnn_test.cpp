// The CNN zoo (ResNet-50/101/152, VGG-19) against published parameter counts and MAC figures.
// Totals are summed from the layers here so that the test checks the builders alone.
#include <string>

#include <gtest/gtest.h>

#include "model/error.hpp"
#include "model/network.hpp"
#include "model/zoo.hpp"

namespace hetflow::model {
namespace {

struct Totals {
  double params = 0;
  double forward = 0;
  double backward = 0;
  double stashed = 0;
};

Totals sum_layers(const Network& net) {
  Totals t;
  for (const Layer& layer : net.layers) {
    t.params += layer.params;
    t.forward += layer.forward_flops;
    t.backward += layer.backward_flops;
    t.stashed += layer.stashed_bytes;
  }
  return t;
}

// Forward MACs = forward FLOPs / 2 (one multiply-accumulate = 2 FLOPs).
double macs(const Network& net) { return sum_layers(net).forward / 2.0; }

void expect_within(double value, double published, double tolerance, const std::string& what) {
  EXPECT_NEAR(value / published, 1.0, tolerance) << what << ": " << value << " vs " << published;
}

TEST(ZooCnn, ResNetParamCountsAreExact) {
  // torchvision: sum(p.numel() for p in resnetN().parameters()).
  EXPECT_EQ(sum_layers(make_resnet(50, Precision::fp16)).params, 25'557'032.0);
  EXPECT_EQ(sum_layers(make_resnet(101, Precision::fp16)).params, 44'549'160.0);
  EXPECT_EQ(sum_layers(make_resnet(152, Precision::fp16)).params, 60'192'808.0);
}

TEST(ZooCnn, Vgg19ParamCountIsExact) {
  EXPECT_EQ(sum_layers(make_vgg19(Precision::fp16)).params, 143'667'240.0);
}

TEST(ZooCnn, ForwardMacsMatchPublishedFigures) {
  expect_within(macs(make_resnet(50, Precision::fp16)), 4.09e9, 0.02, "resnet50");
  expect_within(macs(make_resnet(101, Precision::fp16)), 7.80e9, 0.02, "resnet101");
  expect_within(macs(make_resnet(152, Precision::fp16)), 11.5e9, 0.02, "resnet152");
  expect_within(macs(make_vgg19(Precision::fp16)), 19.6e9, 0.02, "vgg19");
}

TEST(ZooCnn, BackwardIsAboutTwiceForward) {
  for (const Network& net : {make_resnet(50, Precision::fp16), make_resnet(101, Precision::fp16),
                             make_resnet(152, Precision::fp16), make_vgg19(Precision::fp16)}) {
    SCOPED_TRACE(net.name);
    const Totals t = sum_layers(net);
    // The first conv computes no input gradient, so the total is a little under 2x.
    EXPECT_GT(t.backward, 1.9 * t.forward);
    EXPECT_LT(t.backward, 2.0 * t.forward);
    ASSERT_FALSE(net.layers.empty());
    EXPECT_DOUBLE_EQ(net.layers.front().backward_flops, net.layers.front().forward_flops);
    for (size_t i = 1; i < net.layers.size(); ++i) {
      EXPECT_DOUBLE_EQ(net.layers[i].backward_flops, 2.0 * net.layers[i].forward_flops)
          << net.layers[i].name;
    }
  }
}

TEST(ZooCnn, LayerChainIsWellFormed) {
  for (const Network& net : {make_resnet(50, Precision::fp16), make_resnet(152, Precision::fp16),
                             make_vgg19(Precision::fp16)}) {
    SCOPED_TRACE(net.name);
    ASSERT_FALSE(net.layers.empty());
    EXPECT_TRUE(net.layers.front().inputs.empty());
    for (size_t i = 1; i < net.layers.size(); ++i) {
      ASSERT_EQ(net.layers[i].inputs.size(), 1u) << net.layers[i].name;
      EXPECT_EQ(net.layers[i].inputs[0], static_cast<int>(i) - 1) << net.layers[i].name;
    }
    for (const Layer& layer : net.layers) {
      EXPECT_FALSE(layer.name.empty());
      EXPECT_TRUE(layer.kind == "conv" || layer.kind == "fc") << layer.name;
      EXPECT_FALSE(layer.shape.empty()) << layer.name;
      EXPECT_GT(layer.forward_flops, 0) << layer.name;
      EXPECT_GT(layer.params, 0) << layer.name;
      EXPECT_GT(layer.output_elems, 0) << layer.name;
      EXPECT_GT(layer.stashed_bytes, 0) << layer.name;
      EXPECT_EQ(layer.attention_stash_bytes, 0) << layer.name;
      EXPECT_EQ(layer.attention_core_flops, 0) << layer.name;
      EXPECT_EQ(layer.tp_allreduce_elems, 0) << layer.name;
    }
    EXPECT_EQ(net.layers.back().output_elems, 1000.0);
    EXPECT_EQ(net.tokens_per_sample, 1.0);
  }
}

TEST(ZooCnn, ResNetLayout) {
  const Network net = make_resnet(50, Precision::bf16);
  EXPECT_EQ(net.name, "resnet50");
  EXPECT_EQ(net.description, "ResNet-50 (He et al. 2016), 224x224, 1000 classes");
  EXPECT_EQ(net.precision, Precision::bf16);
  ASSERT_EQ(net.layers.size(), 1u + 3 + 4 + 6 + 3 + 1);
  EXPECT_EQ(net.layers.front().name, "stem");
  EXPECT_EQ(net.layers.front().output_elems, 56.0 * 56 * 64);
  EXPECT_EQ(net.layers[1].name, "layer1.block1");
  EXPECT_EQ(net.layers[1].shape, "in=56x56x64 mid=64 out=56x56x256 stride=1");
  EXPECT_EQ(net.layers[8].name, "layer3.block1");
  EXPECT_EQ(net.layers[8].shape, "in=28x28x512 mid=256 out=14x14x1024 stride=2");
  EXPECT_EQ(net.layers.back().name, "fc");
  EXPECT_EQ(net.layers.back().kind, "fc");
  EXPECT_EQ(make_resnet(101, Precision::fp16).layers.size(), 1u + 3 + 4 + 23 + 3 + 1);
  EXPECT_EQ(make_resnet(152, Precision::fp16).name, "resnet152");
  EXPECT_EQ(make_resnet(152, Precision::fp16).layers.size(), 1u + 3 + 8 + 36 + 3 + 1);
}

TEST(ZooCnn, Vgg19Layout) {
  const Network net = make_vgg19(Precision::fp32);
  EXPECT_EQ(net.name, "vgg19");
  ASSERT_EQ(net.layers.size(), 16u + 3);
  int convs = 0, fcs = 0;
  for (const Layer& layer : net.layers) (layer.kind == "conv" ? convs : fcs)++;
  EXPECT_EQ(convs, 16);
  EXPECT_EQ(fcs, 3);
  // conv5_4 folds the last pool: 7x7x512 = 25088 feeds fc6.
  EXPECT_EQ(net.layers[15].output_elems, 7.0 * 7 * 512);
  EXPECT_EQ(net.layers[16].params, 25088.0 * 4096 + 4096);
}

TEST(ZooCnn, StashedBytesHalveFromFp32ToFp16) {
  const Network pairs[][2] = {
      {make_resnet(50, Precision::fp32), make_resnet(50, Precision::fp16)},
      {make_resnet(152, Precision::fp32), make_resnet(152, Precision::bf16)},
      {make_vgg19(Precision::fp32), make_vgg19(Precision::fp16)}};
  for (const auto& pair : pairs) {
    SCOPED_TRACE(pair[0].name);
    ASSERT_EQ(pair[0].layers.size(), pair[1].layers.size());
    for (size_t i = 0; i < pair[0].layers.size(); ++i) {
      EXPECT_DOUBLE_EQ(pair[1].layers[i].stashed_bytes, pair[0].layers[i].stashed_bytes / 2)
          << pair[0].layers[i].name;
      // Precision changes bytes only, not the arithmetic or the shapes.
      EXPECT_EQ(pair[1].layers[i].forward_flops, pair[0].layers[i].forward_flops);
      EXPECT_EQ(pair[1].layers[i].params, pair[0].layers[i].params);
      EXPECT_EQ(pair[1].layers[i].output_elems, pair[0].layers[i].output_elems);
    }
    EXPECT_DOUBLE_EQ(sum_layers(pair[1]).stashed, sum_layers(pair[0]).stashed / 2);
  }
}

TEST(ZooCnn, UnsupportedDepthThrowsInputError) {
  for (int depth : {0, 18, 34, 51, 200}) {
    try {
      make_resnet(depth, Precision::fp16);
      ADD_FAILURE() << "depth " << depth << " accepted";
    } catch (const hetflow::InputError& e) {
      EXPECT_EQ(e.file(), "<spec>");
      EXPECT_EQ(e.line(), 0);
      EXPECT_EQ(e.field(), "depth");
      EXPECT_EQ(e.message(), "expected 50, 101 or 152, found " + std::to_string(depth));
    }
  }
  EXPECT_THROW(make_resnet(18, Precision::fp32), hetflow::InputError);
}

}  // namespace
}  // namespace hetflow::model
