// Convolutional networks of the zoo: ResNet-50/101/152 (torchvision v1.5 bottlenecks) and
// VGG-19 (configuration E), built from their architecture by arithmetic over tensor shapes.
//
// Conventions shared by both builders:
//  * forward_flops = 2 x the multiply-accumulates of convolutions and fully connected layers.
//    BatchNorm, ReLU, pooling, the residual add and the softmax are left out: they are a
//    fraction of a percent of the arithmetic, and the published figures (ResNet-50 4.1 GMAC,
//    VGG-19 19.6 GMAC) count only conv/FC multiply-accumulates too.
//  * backward_flops = 2 x forward_flops: the gradient w.r.t. the input and the gradient w.r.t.
//    the weights each cost as much as the forward product. The first convolution of the network
//    reads the input image, which has no gradient to compute, so its layer (ResNet "stem",
//    VGG "conv1_1") pays only the weight gradient: 1 x forward_flops.
//  * params: conv weights (no conv bias in ResNet, biases in VGG), BatchNorm gamma and beta
//    (2 per channel; running mean/variance are buffers, not parameters), FC weights + biases.
//  * stashed_bytes: the tensors autograd keeps for the backward pass, at element_bytes(precision)
//    per element, counted once each:
//      - the input of every conv / FC (for the weight gradient),
//      - the input of every BatchNorm (cuDNN BN backward reads x and its saved statistics),
//      - the output of every ReLU (torchvision uses in-place ReLU, whose backward reads its
//        output; that same tensor is then the input of the next conv, so it is counted once),
//      - the input of every max pool (it is the preceding ReLU's output: counted once).
//    A tensor that crosses a layer boundary (a layer's output = the next layer's input) is
//    counted by the layer that reads it, never by the one that writes it, so summing layers
//    counts it once. BN statistics (2 floats per channel), ReLU bitmasks and VGG's dropout
//    masks are left out: they are per-channel or sub-element sized.
//  * cnn_ops: each layer's convolutions, fully connected layers, BatchNorms, ReLUs, pools,
//    bias and residual adds in forward order, with their shapes, for the per-operation cost
//    (partition/layer_ops.hpp). Dropout is identity here, as above.
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "model/error.hpp"
#include "model/zoo.hpp"

namespace hetflow::model {

namespace {

using i64 = std::int64_t;

std::string dims(i64 h, i64 w, i64 c) {
  return std::to_string(h) + "x" + std::to_string(w) + "x" + std::to_string(c);
}

// Spatial size after a conv / pool with kernel k, stride s, padding p.
i64 out_size(i64 in, i64 k, i64 s, i64 p) { return (in + 2 * p - k) / s + 1; }

// Multiply-accumulates of a k x k convolution producing an ho x wo x cout map from cin channels.
i64 conv_macs(i64 ho, i64 wo, i64 cin, i64 cout, i64 k) { return ho * wo * cout * cin * k * k; }

// Weights of a k x k convolution (no bias).
i64 conv_weights(i64 cin, i64 cout, i64 k) { return cin * cout * k * k; }

// BatchNorm learnable parameters: gamma and beta per channel.
i64 bn_params(i64 channels) { return 2 * channels; }

// Fill the arithmetic fields of a layer from integer counts.
void set_counts(Layer& layer, i64 macs, bool first_layer, i64 params, i64 output_elems,
                i64 stashed_elems, Precision precision) {
  layer.forward_flops = 2.0 * static_cast<double>(macs);
  // No input gradient for the layer that reads the network input (see the header comment).
  layer.backward_flops = (first_layer ? 1.0 : 2.0) * layer.forward_flops;
  layer.params = static_cast<double>(params);
  layer.output_elems = static_cast<double>(output_elems);
  layer.stashed_bytes = static_cast<double>(stashed_elems) * element_bytes(precision);
}

// The operations a layer runs (model::CnnOp), in forward order; a map is {h, w, c}.
using Map = std::array<i64, 3>;
CnnOp conv_op(Map in, Map out, int kernel, bool input_grad = true) {
  return {CnnOp::Kind::conv, in, out, kernel, input_grad};
}
CnnOp fc_op(Map in, Map out) { return {CnnOp::Kind::fc, in, out, 1, true}; }
CnnOp pool_op(CnnOp::Kind kind, Map in, Map out) { return {kind, in, out, 1, true}; }
CnnOp on_output(CnnOp::Kind kind, Map out) { return {kind, {}, out, 1, true}; }

void chain(Network& net, Layer layer) {
  if (!net.layers.empty()) layer.inputs = {static_cast<int>(net.layers.size()) - 1};
  net.layers.push_back(std::move(layer));
}

constexpr i64 kImage = 224;
constexpr i64 kImageChannels = 3;
constexpr i64 kClasses = 1000;

}  // namespace

Network make_resnet(int depth, Precision precision) {
  std::vector<int> blocks;
  switch (depth) {
    case 50: blocks = {3, 4, 6, 3}; break;
    case 101: blocks = {3, 4, 23, 3}; break;
    case 152: blocks = {3, 8, 36, 3}; break;
    default:
      throw InputError("<spec>", 0, "depth",
                       "expected 50, 101 or 152, found " + std::to_string(depth));
  }

  Network net;
  net.name = "resnet" + std::to_string(depth);
  net.description = "ResNet-" + std::to_string(depth) +
                    " (He et al. 2016), 224x224, 1000 classes";
  net.precision = precision;
  net.tokens_per_sample = 1;

  // Stem: conv 7x7/2 (pad 3) 3 -> 64, BN, ReLU, max pool 3x3/2 (pad 1).
  {
    const i64 cin = kImageChannels, cout = 64;
    const i64 hc = out_size(kImage, 7, 2, 3);  // 112
    const i64 hp = out_size(hc, 3, 2, 1);      // 56
    const i64 in_elems = kImage * kImage * cin;
    const i64 conv_out = hc * hc * cout;
    Layer stem;
    stem.name = "stem";
    stem.kind = "conv";
    stem.shape = "in=" + dims(kImage, kImage, cin) + " conv7x7/2 out=" + dims(hc, hc, cout) +
                 " maxpool3x3/2 out=" + dims(hp, hp, cout);
    const i64 macs = conv_macs(hc, hc, cin, cout, 7);
    const i64 params = conv_weights(cin, cout, 7) + bn_params(cout);
    // Stashed: the image (conv input), the BN input, the ReLU output (= max pool input).
    const i64 stashed = in_elems + conv_out + conv_out;
    set_counts(stem, macs, /*first_layer=*/true, params, hp * hp * cout, stashed, precision);
    stem.cnn_ops = {conv_op({kImage, kImage, cin}, {hc, hc, cout}, 7, /*input_grad=*/false),
                    on_output(CnnOp::Kind::batch_norm, {hc, hc, cout}), on_output(CnnOp::Kind::relu, {hc, hc, cout}),
                    pool_op(CnnOp::Kind::max_pool, {hc, hc, cout}, {hp, hp, cout})};
    chain(net, std::move(stem));
  }

  // Bottleneck stages: 1x1 (cin -> mid), 3x3 stride s (mid -> mid), 1x1 (mid -> 4 mid), each
  // followed by BN; ReLU after the first two BNs and after the residual add. The first block of
  // each stage has a projection shortcut: 1x1 stride s (cin -> 4 mid) + BN.
  i64 h = 56, c = 64;
  for (int stage = 0; stage < 4; ++stage) {
    const i64 mid = i64{64} << stage;
    const i64 cout = 4 * mid;
    for (int b = 0; b < blocks[static_cast<size_t>(stage)]; ++b) {
      const i64 stride = (b == 0 && stage > 0) ? 2 : 1;
      const bool projection = (b == 0);  // channels change (64 -> 256) or stride 2
      const i64 ho = out_size(h, 3, stride, 1);
      const i64 in_elems = h * h * c;
      const i64 mid_in = h * h * mid;     // conv1 output
      const i64 mid_out = ho * ho * mid;  // conv2 output
      const i64 out_elems = ho * ho * cout;

      i64 macs = conv_macs(h, h, c, mid, 1) + conv_macs(ho, ho, mid, mid, 3) +
                 conv_macs(ho, ho, mid, cout, 1);
      i64 params = conv_weights(c, mid, 1) + conv_weights(mid, mid, 3) +
                   conv_weights(mid, cout, 1) + bn_params(mid) + bn_params(mid) +
                   bn_params(cout);
      // Stashed: block input (conv1 input, also the shortcut conv input); bn1 input; relu1
      // output (= conv2 input); bn2 input; relu2 output (= conv3 input); bn3 input; the final
      // ReLU output is this layer's output and is counted by the next layer, which reads it.
      i64 stashed = in_elems + 2 * mid_in + 2 * mid_out + out_elems;
      if (projection) {
        macs += conv_macs(ho, ho, c, cout, 1);
        params += conv_weights(c, cout, 1) + bn_params(cout);
        stashed += out_elems;  // the shortcut BN input; its conv input is the block input
      }

      Layer layer;
      layer.name = "layer" + std::to_string(stage + 1) + ".block" + std::to_string(b + 1);
      layer.kind = "conv";
      layer.shape = "in=" + dims(h, h, c) + " mid=" + std::to_string(mid) +
                    " out=" + dims(ho, ho, cout) + " stride=" + std::to_string(stride);
      set_counts(layer, macs, /*first_layer=*/false, params, out_elems, stashed, precision);
      layer.cnn_ops = {conv_op({h, h, c}, {h, h, mid}, 1),           on_output(CnnOp::Kind::batch_norm, {h, h, mid}),
                       on_output(CnnOp::Kind::relu, {h, h, mid}),     conv_op({h, h, mid}, {ho, ho, mid}, 3),
                       on_output(CnnOp::Kind::batch_norm, {ho, ho, mid}), on_output(CnnOp::Kind::relu, {ho, ho, mid}),
                       conv_op({ho, ho, mid}, {ho, ho, cout}, 1),     on_output(CnnOp::Kind::batch_norm, {ho, ho, cout})};
      if (projection) {
        layer.cnn_ops.push_back(conv_op({h, h, c}, {ho, ho, cout}, 1));
        layer.cnn_ops.push_back(on_output(CnnOp::Kind::batch_norm, {ho, ho, cout}));
      }
      layer.cnn_ops.push_back(on_output(CnnOp::Kind::add, {ho, ho, cout}));
      layer.cnn_ops.push_back(on_output(CnnOp::Kind::relu, {ho, ho, cout}));
      chain(net, std::move(layer));
      h = ho;
      c = cout;
    }
  }

  // Classifier: global average pool (h x h x c -> c), FC c -> 1000 with bias.
  {
    Layer fc;
    fc.name = "fc";
    fc.kind = "fc";
    fc.shape = "in=" + dims(h, h, c) + " avgpool fc=" + std::to_string(c) + "x" +
               std::to_string(kClasses) + " out=" + std::to_string(kClasses);
    const i64 macs = c * kClasses;
    const i64 params = c * kClasses + kClasses;
    // Stashed: the last block's final ReLU output (this layer's input; that ReLU's backward
    // reads it) and the FC input (the pooled vector).
    const i64 stashed = h * h * c + c;
    set_counts(fc, macs, /*first_layer=*/false, params, kClasses, stashed, precision);
    fc.cnn_ops = {pool_op(CnnOp::Kind::avg_pool, {h, h, c}, {1, 1, c}), fc_op({1, 1, c}, {1, 1, kClasses}),
                  on_output(CnnOp::Kind::bias, {1, 1, kClasses})};
    chain(net, std::move(fc));
  }
  return net;
}

Network make_vgg19(Precision precision) {
  // Configuration E (Simonyan & Zisserman 2015): conv3x3 (pad 1) + ReLU everywhere, 2x2/2 max
  // pool after each group; 0 marks a pool.
  const std::vector<int> config = {64,  64,  0,   128, 128, 0,   256, 256, 256, 256, 0,
                                   512, 512, 512, 512, 0,   512, 512, 512, 512, 0};
  Network net;
  net.name = "vgg19";
  net.description = "VGG-19 (Simonyan & Zisserman 2015), 224x224, 1000 classes";
  net.precision = precision;
  net.tokens_per_sample = 1;

  i64 h = kImage, c = kImageChannels;
  int group = 1, index = 1;
  for (size_t i = 0; i < config.size(); ++i) {
    if (config[i] == 0) continue;  // pools are folded into the conv before them
    const i64 cout = config[i];
    const bool pooled = i + 1 < config.size() && config[i + 1] == 0;
    const i64 ho = pooled ? out_size(h, 2, 2, 0) : h;
    const i64 conv_out = h * h * cout;

    Layer layer;
    layer.name = "conv" + std::to_string(group) + "_" + std::to_string(index);
    layer.kind = "conv";
    layer.shape = "in=" + dims(h, h, c) + " conv3x3 out=" + dims(h, h, cout) +
                  (pooled ? " maxpool2x2/2 out=" + dims(ho, ho, cout) : std::string());
    const i64 macs = conv_macs(h, h, c, cout, 3);
    const i64 params = conv_weights(c, cout, 3) + cout;  // + bias
    // Stashed: the conv input; with a pool, the ReLU output (= pool input) too. Without one,
    // the ReLU output is the next layer's input and is counted there.
    const i64 stashed = h * h * c + (pooled ? conv_out : 0);
    set_counts(layer, macs, /*first_layer=*/net.layers.empty(), params, ho * ho * cout, stashed,
               precision);
    layer.cnn_ops = {conv_op({h, h, c}, {h, h, cout}, 3, /*input_grad=*/!net.layers.empty()),
                     on_output(CnnOp::Kind::bias, {h, h, cout}), on_output(CnnOp::Kind::relu, {h, h, cout})};
    if (pooled) layer.cnn_ops.push_back(pool_op(CnnOp::Kind::max_pool, {h, h, cout}, {ho, ho, cout}));
    chain(net, std::move(layer));

    h = ho;
    c = cout;
    if (pooled) {
      ++group;
      index = 1;
    } else {
      ++index;
    }
  }

  // Classifier: flatten (7x7x512 = 25088) -> fc6 4096 -> ReLU -> fc7 4096 -> ReLU -> fc8 1000.
  // Dropout (training only) is treated as identity; its masks are not counted.
  const std::vector<i64> widths = {4096, 4096, kClasses};
  i64 features = h * h * c;
  for (size_t i = 0; i < widths.size(); ++i) {
    const i64 out = widths[i];
    Layer fc;
    fc.name = "fc" + std::to_string(6 + i);
    fc.kind = "fc";
    fc.shape = "in=" + std::to_string(features) + " out=" + std::to_string(out);
    const i64 macs = features * out;
    const i64 params = features * out + out;
    // Stashed: the FC input (the flattened pool output, or the previous ReLU's output, which
    // that ReLU's backward reads as well). fc8's output feeds the loss, not stashed here.
    const i64 stashed = features;
    set_counts(fc, macs, /*first_layer=*/false, params, out, stashed, precision);
    // fc6 reads the last pool's 7 x 7 x 512 map, flattened.
    const Map in = i == 0 ? Map{h, h, c} : Map{1, 1, features};
    fc.cnn_ops = {fc_op(in, {1, 1, out}), on_output(CnnOp::Kind::bias, {1, 1, out})};
    if (i + 1 < widths.size()) fc.cnn_ops.push_back(on_output(CnnOp::Kind::relu, {1, 1, out}));
    chain(net, std::move(fc));
    features = out;
  }
  return net;
}

}  // namespace hetflow::model
