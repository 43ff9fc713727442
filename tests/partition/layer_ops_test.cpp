// The operations of a layer against hand computation, and their GEMM FLOPs against the zoo's
// layer totals (which the zoo tests hold to Narayanan et al.'s formula).
#include "partition/layer_ops.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>
#include <string>

#include "model/io.hpp"

using namespace hetflow;
using partition::Op;
using partition::OpClass;
using partition::OpPass;

namespace {

double flops_of(const std::vector<Op>& ops) {
  double f = 0;
  for (const Op& o : ops) f += o.flops;
  return f;
}

std::map<std::string, Op> by_name(const std::vector<Op>& ops) {
  std::map<std::string, Op> m;
  for (const Op& o : ops) m.emplace(std::string(o.name), o);
  return m;
}

int first_of_kind(const model::Network& net, const std::string& kind) {
  for (size_t i = 0; i < net.layers.size(); ++i) {
    if (net.layers[i].kind == kind) return static_cast<int>(i);
  }
  return -1;
}

// Calls `check(layer, forward, backward, t)` for every layer of `net` at tensor-parallel
// degrees t = 1 and 8, flash attention off and on, a micro-batch of 2: its forward operations
// and its backward's (data and weight gradients together).
using PassCheck = std::function<void(const model::Layer&, const std::vector<Op>&, const std::vector<Op>&, int)>;
void each_layers_passes(const model::Network& net, const PassCheck& check) {
  for (int t : {1, 8}) {
    for (bool flash : {false, true}) {
      partition::OpOptions o;
      o.flash_attention = flash;
      for (size_t l = 0; l < net.layers.size(); ++l) {
        const partition::OpShape shape{2, t, false, 2};
        auto backward = partition::layer_ops(net, static_cast<int>(l), OpPass::backward_data, shape, o);
        const auto weight = partition::layer_ops(net, static_cast<int>(l), OpPass::backward_weight, shape, o);
        backward.insert(backward.end(), weight.begin(), weight.end());
        check(net.layers[l], partition::layer_ops(net, static_cast<int>(l), OpPass::forward, shape, o), backward, t);
      }
    }
  }
}

}  // namespace

// A GPT-3 2.7B-like layer (h 2560, 32 heads, s 2048), micro-batch 4, by hand.
TEST(LayerOps, ATransformerLayersForwardByHand) {
  const model::Network net = model::load_network("gpt:layers=2,hidden=2560,heads=32,seq=2048,vocab=50304");
  const int layer = first_of_kind(net, "transformer");
  const auto ops = by_name(partition::layer_ops(net, layer, OpPass::forward, {4, 1, false, 2}));
  const double T = 4 * 2048.0, h = 2560, s = 2048, b = 4, a = 32, d = 80;
  ASSERT_TRUE(ops.count("qkv"));
  EXPECT_EQ(ops.at("qkv").cls, OpClass::gemm);
  EXPECT_EQ(ops.at("qkv").m, T);
  EXPECT_EQ(ops.at("qkv").n, 3 * h);
  EXPECT_EQ(ops.at("qkv").k, h);
  EXPECT_DOUBLE_EQ(ops.at("qkv").flops, 2 * T * 3 * h * h);
  EXPECT_DOUBLE_EQ(ops.at("qkv").bytes, 2 * (T * h + h * 3 * h + T * 3 * h));
  EXPECT_DOUBLE_EQ(ops.at("scores").flops, 2 * b * a * s * s * d);
  EXPECT_EQ(ops.at("scores").batch, b * a);
  EXPECT_DOUBLE_EQ(ops.at("context").flops, 2 * b * a * s * s * d);
  EXPECT_DOUBLE_EQ(ops.at("attention projection").flops, 2 * T * h * h);
  EXPECT_DOUBLE_EQ(ops.at("mlp up").flops, 2 * T * 4 * h * h);
  EXPECT_DOUBLE_EQ(ops.at("mlp down").flops, 2 * T * 4 * h * h);
  // Memory-bound: a fused softmax reads and writes the scores once (fp16), dropout adds a mask byte.
  EXPECT_EQ(ops.at("softmax").cls, OpClass::memory);
  EXPECT_DOUBLE_EQ(ops.at("softmax").bytes, 2 * 2 * b * a * s * s);
  EXPECT_DOUBLE_EQ(ops.at("attention dropout").bytes, (2 * 2 + 1) * b * a * s * s);
  EXPECT_DOUBLE_EQ(ops.at("input norm").bytes, 2 * 2 * T * h);
  EXPECT_DOUBLE_EQ(ops.at("bias dropout add").bytes, (3 * 2 + 1) * T * h);
  EXPECT_DOUBLE_EQ(ops.at("bias gelu").bytes, 2 * 2 * T * 4 * h);
  EXPECT_EQ(ops.count("rotary"), 0u);  // learned positions
}

// Tensor parallelism divides the column- and row-parallel GEMMs and the heads by t; sequence
// parallelism divides the norms and residual adds' tokens.
TEST(LayerOps, TensorAndSequenceParallelismSplitWhatMegatronSplits) {
  const model::Network net = model::load_network("gpt:layers=2,hidden=2560,heads=32,seq=2048,vocab=50304");
  const int layer = first_of_kind(net, "transformer");
  const auto one = by_name(partition::layer_ops(net, layer, OpPass::forward, {4, 1, false, 2}));
  const auto tp = by_name(partition::layer_ops(net, layer, OpPass::forward, {4, 4, false, 2}));
  const auto sp = by_name(partition::layer_ops(net, layer, OpPass::forward, {4, 4, true, 2}));
  EXPECT_EQ(tp.at("qkv").n, one.at("qkv").n / 4);
  EXPECT_EQ(tp.at("attention projection").k, one.at("attention projection").k / 4);
  EXPECT_EQ(tp.at("scores").batch, one.at("scores").batch / 4);
  EXPECT_DOUBLE_EQ(tp.at("softmax").bytes, one.at("softmax").bytes / 4);
  EXPECT_DOUBLE_EQ(tp.at("input norm").bytes, one.at("input norm").bytes);  // replicated
  EXPECT_DOUBLE_EQ(sp.at("input norm").bytes, one.at("input norm").bytes / 4);
  EXPECT_DOUBLE_EQ(sp.at("bias dropout add").bytes, one.at("bias dropout add").bytes / 4);
}

// Every layer's GEMM FLOPs are the zoo's: forward = forward_flops x b / t, and backward data +
// backward weight = backward_flops x b / t, for GPT and LLaMA shapes (GQA, SwiGLU, rotary), and
// Mistral's sliding window (each query's 4096 keys of 8192).
TEST(LayerOps, GemmFlopsAddUpToTheZoosLayerTotals) {
  for (const char* spec : {"gpt:layers=4,hidden=2304,heads=24,seq=2048,vocab=51200",
                           "llama:layers=4,hidden=4096,heads=32,kv_heads=8,ffn=14336,seq=4096,vocab=128256",
                           "mistral-7b", "qwen3-8b", "llama:layers=2,hidden=640,heads=10,kv_heads=2,head_dim=96,seq=512"}) {
    SCOPED_TRACE(spec);
    const model::Network net = model::load_network(spec);
    ASSERT_TRUE(partition::has_layer_ops(net));
    each_layers_passes(net, [](const model::Layer& layer, const std::vector<Op>& forward, const std::vector<Op>& backward, int t) {
      EXPECT_NEAR(flops_of(forward), layer.forward_flops * 2 / t, 1e-9 * layer.forward_flops) << layer.name;
      EXPECT_NEAR(flops_of(backward), layer.backward_flops * 2 / t, 1e-9 * layer.backward_flops) << layer.name;
    });
  }
}

// An MoE layer's GEMMs add up to the zoo's FLOPs, and so do latent attention's, but for
// what every tensor-parallel rank runs whole: the router (and Qwen2-MoE's shared gate), and
// MLA's down projections (Megatron duplicates them). The routed experts run as grouped
// GEMMs, one per expert, of T x top-k / experts rows each.
TEST(LayerOps, MoeAndLatentAttentionGemmsAddUpToTheZoos) {
  const auto whole = [](const std::vector<Op>& ops) {
    double f = 0;
    for (const Op& o : ops) {
      const std::string n(o.name);
      if (n.rfind("router", 0) == 0 || n.rfind("shared gate", 0) == 0 || n.rfind("q down", 0) == 0 ||
          n.rfind("kv down", 0) == 0) {
        f += o.flops;
      }
    }
    return f;
  };
  for (const char* spec : {"mixtral-8x7b", "qwen1.5-moe-a2.7b", "deepseek-v2-lite", "deepseek-v3"}) {
    SCOPED_TRACE(spec);
    const model::Network net = model::load_network(spec);
    ASSERT_TRUE(partition::has_layer_ops(net));
    each_layers_passes(net, [&](const model::Layer& layer, const std::vector<Op>& forward, const std::vector<Op>& backward, int t) {
      const double fw = whole(forward), bw = whole(backward);
      EXPECT_NEAR(flops_of(forward), fw + (layer.forward_flops * 2 - fw) / t, 1e-9 * layer.forward_flops) << layer.name;
      EXPECT_NEAR(flops_of(backward), bw + (layer.backward_flops * 2 - bw) / t, 1e-9 * layer.backward_flops) << layer.name;
      if (layer.experts > 0) {
        const auto ops = by_name(forward);
        ASSERT_EQ(ops.count("experts up"), 1u);
        EXPECT_DOUBLE_EQ(ops.at("experts up").batch, layer.experts);
        EXPECT_DOUBLE_EQ(ops.at("experts up").m, 2.0 * net.tokens_per_sample * layer.experts_per_token / layer.experts);
      }
    });
  }
}

// Under expert parallelism over tensor ranks (sequence parallel) each device routes and
// permutes its own 1/t of the tokens, which its all-to-all dispatches; the experts run on all
// the rank's copies (gathered over the tensor group), their widths split by t. Without
// expert parallelism the router scores every token of the rank.
TEST(LayerOps, UnderExpertParallelismADeviceRoutesItsOwnTokens) {
  const model::Network net = model::load_network("mixtral-8x7b");
  const int l = 1;  // the first decoder layer
  const double T = 2.0 * net.tokens_per_sample, E = 8, h = 4096;
  for (const int experts : {1, 4}) {
    partition::OpShape shape{2, 2, true, 2};
    shape.experts = experts;
    shape.experts_held = experts > 1 ? 2 : -1;
    const auto ops = by_name(partition::layer_ops(net, l, OpPass::forward, shape, {}));
    const double routed_tokens = experts > 1 ? T / 2 : T;
    EXPECT_DOUBLE_EQ(ops.at("router").flops, 2 * routed_tokens * E * h) << experts;
    EXPECT_DOUBLE_EQ(ops.at("router").m, routed_tokens);
    // The experts: every copy of the rank, 1/2 of each expert's width.
    EXPECT_DOUBLE_EQ(ops.at("experts up").m * ops.at("experts up").batch, T * 2);
    EXPECT_DOUBLE_EQ(ops.at("experts up").n, 2 * 14336.0 / 2);
    const auto weight = by_name(partition::layer_ops(net, l, OpPass::backward_weight, shape, {}));
    EXPECT_DOUBLE_EQ(weight.at("router (weight)").flops, 2 * routed_tokens * E * h);
  }
}

// Qwen3's QK-norm: a memory-bound operation over this rank's q and k (heads x head_dim wide,
// not hidden) in each direction; a model without it has none.
TEST(LayerOps, QkNormReadsAndWritesTheRanksQueriesAndKeys) {
  const model::Network qwen = model::load_network("qwen3-0.6b");
  const int layer = first_of_kind(qwen, "transformer");
  const partition::OpShape shape{2, 2, false, 2};
  const auto bytes_of = [&](OpPass pass, std::string_view name) {
    double bytes = -1;
    for (const partition::Op& op : partition::layer_ops(qwen, layer, pass, shape)) {
      if (op.name == name) bytes = op.bytes;
    }
    return bytes;
  };
  const double T = 2 * 4096, q = 16 * 128, kv = 8 * 128;
  EXPECT_DOUBLE_EQ(bytes_of(OpPass::forward, "qk norm"), 2 * 2 * T * (q + kv) / 2);
  EXPECT_DOUBLE_EQ(bytes_of(OpPass::backward_data, "qk norm (backward)"), 3 * 2 * T * (q + kv) / 2);
  // The projections' GEMMs are q wide: qkv (T, (q + 2kv) / t, h), output (T, h, q / t).
  for (const partition::Op& op : partition::layer_ops(qwen, layer, OpPass::forward, shape)) {
    if (op.name == "qkv") {
      EXPECT_DOUBLE_EQ(op.n, (q + 2 * kv) / 2);
    } else if (op.name == "attention projection") {
      EXPECT_DOUBLE_EQ(op.k, q / 2);
    }
  }
  const model::Network llama = model::load_network("llama2-7b");
  for (const partition::Op& op : partition::layer_ops(llama, first_of_kind(llama, "transformer"), OpPass::forward, shape)) {
    EXPECT_NE(op.name, "qk norm");
  }
}

// Flash attention: one operation in place of scores, softmax, dropout and context, whose
// bytes are Q, K, V and the output only (the s^2 scores never reach memory).
TEST(LayerOps, FlashAttentionNeverWritesTheScores) {
  const model::Network net = model::load_network("gpt:layers=2,hidden=2560,heads=32,seq=2048,vocab=50304");
  const int layer = first_of_kind(net, "transformer");
  partition::OpOptions o;
  o.flash_attention = true;
  const auto ops = by_name(partition::layer_ops(net, layer, OpPass::forward, {4, 1, false, 2}, o));
  EXPECT_EQ(ops.count("scores") + ops.count("softmax") + ops.count("context"), 0u);
  const Op& fa = ops.at("flash attention");
  EXPECT_EQ(fa.cls, OpClass::attention);
  const double T = 4 * 2048.0, h = 2560;
  EXPECT_DOUBLE_EQ(fa.bytes, 2 * T * 4 * h);
  EXPECT_DOUBLE_EQ(fa.flops, 4 * 4 * 32 * 2048.0 * 2048 * 80);
}

// LLaMA: SwiGLU reads gate and up and writes their product; rotary embeddings touch Q and K;
// no biases, so no bias gradients.
TEST(LayerOps, LlamaHasSwigluRotaryAndNoBiases) {
  const model::Network net = model::load_network("llama:layers=2,hidden=4096,heads=32,kv_heads=8,ffn=14336,seq=4096,vocab=128256");
  const int layer = first_of_kind(net, "transformer");
  const auto fwd = by_name(partition::layer_ops(net, layer, OpPass::forward, {1, 1, false, 2}));
  const double T = 4096, h = 4096, kv = 8 * 128, f = 14336;
  EXPECT_DOUBLE_EQ(fwd.at("swiglu").bytes, 3 * 2 * T * f);
  EXPECT_DOUBLE_EQ(fwd.at("rotary").bytes, 2 * 2 * T * (h + kv));
  EXPECT_EQ(fwd.at("mlp up").n, 2 * f);
  EXPECT_EQ(fwd.at("qkv").n, h + 2 * kv);
  const auto weight = by_name(partition::layer_ops(net, layer, OpPass::backward_weight, {1, 1, false, 2}));
  EXPECT_EQ(weight.count("bias gradients"), 0u);
}

// Qwen2.5: its q, k and v biases' gradients, each a sum over the tokens of its output's, on
// this rank's heads; no output or MLP bias.
TEST(LayerOps, Qwen2SumsItsAttentionBiasGradientsOnly) {
  const model::Network net = model::load_network("qwen2.5-7b");
  const int layer = first_of_kind(net, "transformer");
  const double T = 4096, h = 3584, kv = 4 * 128;
  for (int t : {1, 2}) {
    const auto weight = by_name(partition::layer_ops(net, layer, OpPass::backward_weight, {1, t, false, 2}));
    EXPECT_DOUBLE_EQ(weight.at("bias gradients").bytes, 2 * T * (h + 2 * kv) / t);
  }
  const auto fwd = by_name(partition::layer_ops(net, layer, OpPass::forward, {1, 1, false, 2}));
  EXPECT_EQ(fwd.count("bias"), 0u);  // the output projection has none
}

// The head: logits GEMM over the vocabulary shard, the cross-entropy over fp32 logits.
TEST(LayerOps, TheHeadsLogitsAndCrossEntropy) {
  const model::Network net = model::load_network("gpt:layers=2,hidden=2560,heads=32,seq=2048,vocab=50304");
  const int head = first_of_kind(net, "head");
  const auto ops = by_name(partition::layer_ops(net, head, OpPass::forward, {2, 2, false, 2}));
  const double T = 2 * 2048.0;
  EXPECT_EQ(ops.at("logits").n, 50304 / 2);
  EXPECT_DOUBLE_EQ(ops.at("cross entropy").bytes, (2 + 20) * T * 50304 / 2);
  const auto emb = partition::layer_ops(net, first_of_kind(net, "embedding"), OpPass::forward, {2, 2, false, 2});
  EXPECT_EQ(flops_of(emb), 0);
  EXPECT_FALSE(emb.empty());
}

// Networks that are neither decoders built from an architecture nor CNNs listing their
// operations keep the FLOPs-only model.
TEST(LayerOps, OtherNetworksHaveNoOperations) {
  model::Network bert = model::load_network("bert-large");
  EXPECT_FALSE(partition::has_layer_ops(bert));
  EXPECT_TRUE(partition::layer_ops(bert, 1, OpPass::forward, {1, 1, false, 2}).empty());
  model::Network bare = model::load_network("resnet50");
  bare.layers[3].cnn_ops.clear();  // a computing layer without its operations
  EXPECT_FALSE(partition::has_layer_ops(bare));
  EXPECT_TRUE(partition::has_layer_ops(model::load_network("resnet50")));
  EXPECT_TRUE(partition::has_layer_ops(model::load_network("vgg19")));
}

// ResNet-50's stem and the strided block that opens its second stage, micro-batch 8 in fp16,
// by hand: convolutions as implicit GEMMs, the memory-bound operations' bytes.
TEST(LayerOps, AConvolutionalLayersOperationsByHand) {
  const model::Network net = model::load_network("resnet50");
  const partition::OpShape shape{8, 1, false, 2};
  const double b = 8, e = 2;
  // Stem: conv 7x7/2 of 224x224x3 to 112x112x64, BN, ReLU, max pool to 56x56x64.
  auto f = partition::layer_ops(net, 0, OpPass::forward, shape);
  ASSERT_EQ(f.size(), 4u);
  EXPECT_EQ(f[0].name, "convolution");
  EXPECT_EQ(f[0].m, b * 112 * 112);
  EXPECT_EQ(f[0].n, 64);
  EXPECT_EQ(f[0].k, 3 * 49);
  EXPECT_DOUBLE_EQ(f[0].flops, 2 * b * 112 * 112 * 64 * 3 * 49);
  EXPECT_DOUBLE_EQ(f[1].bytes, 2 * e * b * 112 * 112 * 64);             // batch norm: x in, y out
  EXPECT_DOUBLE_EQ(f[2].bytes, 2 * e * b * 112 * 112 * 64);             // relu
  EXPECT_DOUBLE_EQ(f[3].bytes, e * b * 112 * 112 * 64 + (e + 8) * b * 56 * 56 * 64);  // max pool and its indices
  const auto data = partition::layer_ops(net, 0, OpPass::backward_data, shape);
  EXPECT_EQ(flops_of(data), 0) << "the stem reads the image: no input gradient";
  EXPECT_DOUBLE_EQ(by_name(data).at("batch norm (backward)").bytes, 3 * e * b * 112 * 112 * 64);
  const auto weight = partition::layer_ops(net, 0, OpPass::backward_weight, shape);
  ASSERT_EQ(weight.size(), 1u);
  EXPECT_EQ(weight[0].m, 64);
  EXPECT_EQ(weight[0].n, 3 * 49);
  EXPECT_EQ(weight[0].k, b * 112 * 112);
  // layer2.block1: 56x56x256 in; 1x1 to 128, 3x3 stride 2 to 28x28x128, 1x1 to 512, and
  // the 1x1 stride-2 projection; three BNs and the projection's, two ReLUs, add, ReLU.
  const int block = 4;  // stem, three blocks of stage 1
  ASSERT_EQ(net.layers[block].name, "layer2.block1");
  f = partition::layer_ops(net, block, OpPass::forward, shape);
  int gemms = 0;
  for (const Op& op : f) gemms += op.cls == OpClass::gemm;
  EXPECT_EQ(gemms, 4);
  EXPECT_EQ(f[3].m, b * 28 * 28);  // the 3x3 stride 2
  EXPECT_EQ(f[3].k, 128 * 9);
  const auto strided_data = partition::layer_ops(net, block, OpPass::backward_data, shape);
  std::vector<Op> data_gemms;
  for (const Op& op : strided_data) {
    if (op.cls == OpClass::gemm) data_gemms.push_back(op);
  }
  ASSERT_EQ(data_gemms.size(), 4u);
  // The data gradient of the 3x3 stride 2 runs over its input's 56x56 pixels and 128
  // channels with the forward's multiply-adds.
  EXPECT_EQ(data_gemms[1].m, b * 56 * 56);
  EXPECT_EQ(data_gemms[1].n, 128);
  EXPECT_DOUBLE_EQ(data_gemms[1].flops, f[3].flops);
  EXPECT_DOUBLE_EQ(by_name(f).at("residual add").bytes, 3 * e * b * 28 * 28 * 512);
}

// A CNN's GEMM FLOPs are the zoo's layer totals too (forward, and data + weight gradients).
TEST(LayerOps, ConvolutionFlopsAddUpToTheZoosLayerTotals) {
  for (const char* name : {"resnet50", "resnet152", "vgg19"}) {
    const model::Network net = model::load_network(name);
    const partition::OpShape shape{4, 1, false, 2};
    for (size_t l = 0; l < net.layers.size(); ++l) {
      const model::Layer& layer = net.layers[l];
      const int i = static_cast<int>(l);
      const double forward = flops_of(partition::layer_ops(net, i, OpPass::forward, shape));
      const double backward = flops_of(partition::layer_ops(net, i, OpPass::backward_data, shape)) +
                              flops_of(partition::layer_ops(net, i, OpPass::backward_weight, shape));
      EXPECT_NEAR(forward, 4 * layer.forward_flops, 1e-9 * layer.forward_flops) << name << " " << layer.name;
      EXPECT_NEAR(backward, 4 * layer.backward_flops, 1e-9 * layer.backward_flops) << name << " " << layer.name;
    }
  }
}

// ---------------------------------------------------------------- in the cost model

#include "partition/cost_model.hpp"
#include "partition/plan_builder.hpp"
#include "partition/policy.hpp"

namespace {

partition::Plan gpt_plan(partition::PlanOptions o, const model::Cluster& cluster) {
  const model::Network net = model::load_network("gpt:layers=4,hidden=1024,heads=16,seq=1024,vocab=32000");
  o.precision = net.precision;
  o.workspace_bytes = 0;
  const partition::CostModel cost(cluster, net.precision);
  return partition::build_plan(cluster, net, partition::make_layout(cluster, net, o, cost), cost);
}

// Tensor 2 x pipeline 2, one worker, 2 micro-batches of 2.
partition::PlanOptions two_by_two() {
  partition::PlanOptions o;
  o.tensor = 2;
  o.pipeline = 2;
  o.data = 1;
  o.microbatches = 2;
  o.micro_batch = 2;
  return o;
}

model::Calibration with_ops() {
  return model::parse_calibration(
      "gpus: {A100-80: {overhead: 10 us, ops: {gemm: {max_efficiency: 0.75, saturation: 2e10, launch: 5 us},"
      " memory: {max_efficiency: 0.9, launch: 3 us}}}}\n",
      "ops.yaml");
}

// A layer's operations timed by hand: each GEMM at 312 TFLOP/s x 0.75 x (1 - e^(-F / 2e10))
// plus 5 us, each memory-bound one at 2039 GB/s x 0.9 plus 3 us (the A100 80 GB's fp16 peak
// and bandwidth, as the catalog gives them).
double by_hand_s(const std::vector<Op>& ops) {
  double s = 0;
  for (const Op& o : ops) {
    if (o.cls == OpClass::memory) {
      s += 3e-6 + o.bytes / (2039e9 * 0.9);
    } else {
      s += 5e-6 + o.flops / (312e12 * 0.75 * (1 - std::exp(-o.flops / 2e10)));
    }
  }
  return s;
}

}  // namespace

TEST(LayerOpsCost, ATasksTimeIsItsLayersOperations) {
  const model::Cluster cluster = model::load_cluster("dgx-a100-x4");
  partition::PlanOptions o = two_by_two();
  o.recompute = partition::Recompute::full;
  const partition::Plan plan = gpt_plan(o, cluster);
  const partition::CostModel cost(cluster, plan.layout.precision, model::resolve_calibration(with_ops(), cluster, "ops.yaml"));
  const partition::OpShape shape{2, 2, false, 2};
  int checked = 0;
  for (const partition::Task& t : plan.tasks) {
    if (t.kind != partition::TaskKind::forward && t.kind != partition::TaskKind::backward) continue;
    double want = 10e-6;  // the task's overhead
    for (int l = t.layer_begin; l < t.layer_end; ++l) {
      if (t.kind == partition::TaskKind::forward) {
        want += by_hand_s(partition::layer_ops(plan.network, l, OpPass::forward, shape));
      } else {  // data and weight gradients, and the forward it recomputes (full)
        for (OpPass p : {OpPass::backward_data, OpPass::backward_weight, OpPass::forward}) {
          want += by_hand_s(partition::layer_ops(plan.network, l, p, shape));
        }
      }
    }
    EXPECT_NEAR(cost.task_compute_time_s(plan, t), want, 1e-12) << partition::to_string(t.kind);
    ++checked;
  }
  EXPECT_EQ(checked, 2 * 2 * 2 * 2);  // F and B, 2 micro-batches, 2 stages, 2 tensor ranks
  // The optimizer keeps its roofline of FLOPs and bytes.
  for (const partition::Task& t : plan.tasks) {
    if (t.kind == partition::TaskKind::optimizer) {
      EXPECT_EQ(cost.task_compute_time_s(plan, t), cost.compute_time_s(t.device, t.kind, t.flops, t.memory_bytes));
    }
  }
}

// With wave quantization each GEMM runs at its utilization of the device (OpEfficiency's,
// checked by hand in tests/model/calibration_test.cpp): the hand sum with every GEMM's rate
// scaled by it, memory-bound operations unchanged.
TEST(LayerOpsCost, WaveQuantizationScalesEachGemmByItsUtilization) {
  const model::Cluster cluster = model::load_cluster("dgx-a100-x4");
  const partition::Plan plan = gpt_plan(two_by_two(), cluster);
  const model::Calibration waves = model::parse_calibration(
      "gpus: {A100-80: {overhead: 10 us, ops: {gemm: {max_efficiency: 0.75, saturation: 2e10, launch: 5 us,"
      " waves: {sms: 108, tile_m: 256, tile_n: 128}}, memory: {max_efficiency: 0.9, launch: 3 us}}}}\n",
      "waves.yaml");
  const model::OpEfficiency gemm = waves.gpus.at("A100-80").ops.at("gemm");
  const partition::CostModel cost(cluster, plan.layout.precision, model::resolve_calibration(waves, cluster, "waves.yaml"));
  const partition::OpShape shape{2, 2, false, 2};
  int checked = 0, quantized = 0;
  for (const partition::Task& t : plan.tasks) {
    if (t.kind != partition::TaskKind::forward) continue;
    double want = 10e-6;
    for (int l = t.layer_begin; l < t.layer_end; ++l) {
      for (const Op& o : partition::layer_ops(plan.network, l, OpPass::forward, shape)) {
        if (o.cls == OpClass::memory) {
          want += 3e-6 + o.bytes / (2039e9 * 0.9);
          continue;
        }
        const double u = gemm.utilization(o.m, o.n, o.batch);
        quantized += u < 0.999 ? 1 : 0;
        want += 5e-6 + o.flops / (312e12 * u * 0.75 * (1 - std::exp(-o.flops / 2e10)));
      }
    }
    EXPECT_NEAR(cost.task_compute_time_s(plan, t), want, 1e-12);
    ++checked;
  }
  EXPECT_GT(checked, 0);
  EXPECT_GT(quantized, 0);  // this small GPT's GEMMs leave waves part-empty
}

// Without operation costs in the calibration nothing changes: the FLOPs at one efficiency.
TEST(LayerOpsCost, WithoutOperationCostsATaskKeepsItsFlopsModel) {
  const model::Cluster cluster = model::load_cluster("dgx-a100-x4");
  partition::PlanOptions o;
  o.pipeline = 2;
  o.data = 1;
  o.microbatches = 2;
  const partition::Plan plan = gpt_plan(o, cluster);
  const partition::CostModel cost(cluster, plan.layout.precision);
  for (const partition::Task& t : plan.tasks) {
    if (t.kind == partition::TaskKind::forward || t.kind == partition::TaskKind::backward) {
      EXPECT_EQ(cost.task_compute_time_s(plan, t), cost.compute_time_s(t.device, t.kind, t.flops, t.memory_bytes));
    }
  }
}

// A split backward (1F1B-split-W): B gets the data gradients, W the weight gradients, and
// together they take what one unsplit backward takes (less one task overhead).
TEST(LayerOpsCost, ASplitBackwardSharesTheOperationsBetweenBAndW) {
  const model::Cluster cluster = model::load_cluster("dgx-a100-x4");
  partition::PlanOptions o;
  o.pipeline = 2;
  o.data = 1;
  o.microbatches = 2;
  const model::Calibration calibration = model::resolve_calibration(with_ops(), cluster, "ops.yaml");
  const partition::Plan whole = gpt_plan(o, cluster);
  o.schedule = "1f1b-split-w";
  const partition::Plan split = gpt_plan(o, cluster);
  const partition::CostModel cost(cluster, whole.layout.precision, calibration);
  auto first = [](const partition::Plan& p, partition::TaskKind k) {
    for (const partition::Task& t : p.tasks) {
      if (t.kind == k && t.stage == 0 && t.microbatch == 0) return t;
    }
    return partition::Task{};
  };
  const double b = cost.task_compute_time_s(split, first(split, partition::TaskKind::backward));
  const double w = cost.task_compute_time_s(split, first(split, partition::TaskKind::backward_weight));
  const double both = cost.task_compute_time_s(whole, first(whole, partition::TaskKind::backward));
  EXPECT_NEAR(b + w - 10e-6, both, 1e-12);
  EXPECT_GT(b, w);  // the attention core's gradients are data gradients only
}

// The plan's kernel options reach the cost of every task (Megatron's flags), and flash
// attention's memory: the same operations by hand with those options, and the scores gone
// from the stash.
TEST(LayerOpsCost, ThePlansKernelOptionsCostItsTasksAndItsMemory) {
  const model::Cluster cluster = model::load_cluster("dgx-a100-x4");
  partition::PlanOptions o = two_by_two();
  const partition::Plan fused = gpt_plan(o, cluster);
  o.kernels.flash_attention = true;
  o.kernels.fused_softmax = false;
  o.kernels.fused_bias_dropout_add = false;
  const partition::Plan flash = gpt_plan(o, cluster);
  const partition::CostModel cost(cluster, flash.layout.precision, model::resolve_calibration(with_ops(), cluster, "ops.yaml"));
  const partition::OpShape shape{2, 2, false, 2};
  int checked = 0;
  for (size_t i = 0; i < flash.tasks.size(); ++i) {
    const partition::Task& t = flash.tasks[i];
    if (t.kind != partition::TaskKind::forward) continue;
    double want = 10e-6;
    for (int l = t.layer_begin; l < t.layer_end; ++l) want += by_hand_s(partition::layer_ops(flash.network, l, OpPass::forward, shape, o.kernels));
    EXPECT_NEAR(cost.task_compute_time_s(flash, t), want, 1e-12);
    EXPECT_NE(cost.task_compute_time_s(flash, t), cost.task_compute_time_s(fused, fused.tasks[i]));
    ++checked;
  }
  EXPECT_EQ(checked, 2 * 2 * 2);
  // Flash attention keeps no s x s scores: every stage's activations shrink by them.
  for (size_t d = 0; d < flash.memory.size(); ++d) {
    if (fused.memory[d].activations_bytes == 0) continue;
    EXPECT_LT(flash.memory[d].activations_bytes, fused.memory[d].activations_bytes) << d;
  }
  o.kernels = {};
  o.recompute = partition::Recompute::selective;  // drops the same scores, recomputing them
  const partition::Plan selective = gpt_plan(o, cluster);
  o.recompute = partition::Recompute::none;
  o.kernels.flash_attention = true;
  const partition::Plan flash_only = gpt_plan(o, cluster);
  for (size_t d = 0; d < flash.memory.size(); ++d) {
    EXPECT_DOUBLE_EQ(flash_only.memory[d].activations_bytes, selective.memory[d].activations_bytes) << d;
  }
}
