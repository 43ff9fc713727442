#pragma once
// What the readers accept: every number is checked where it enters hetflow, so no later
// product or sum overflows, and nothing that SimGrid's physics cannot take (a zero or
// denormal bandwidth, an infinite latency) reaches the simulator. The bounds are generous
// (orders of magnitude beyond any real part or model) and documented in model/README.md.
#include <cstdint>

namespace hetflow::model::limits {

// Clusters.
constexpr int kMaxNodes = 100'000;          // nodes in a cluster, after `count` expansion
constexpr int kMaxGpusPerNode = 1'024;
constexpr int kMaxGpus = 1'000'000;         // GPUs in a cluster
constexpr int kMaxNics = 64;                // NICs per node
constexpr double kMinBandwidth = 1;         // B/s; links, NICs, WAN, memory bandwidth
constexpr double kMaxBandwidth = 1e15;      // 1 PB/s
constexpr double kMinLatency = 1e-12;       // a non-zero latency is at least 1 ps (0 is allowed)
constexpr double kMaxLatency = 86'400;      // 1 day
constexpr double kMinFlops = 1e6;           // 1 MFLOP/s per GPU
constexpr double kMaxFlops = 1e18;          // 1 EFLOP/s per GPU
constexpr double kMinMemory = 1 << 20;      // 1 MiB
constexpr double kMaxMemory = 1125899906842624.0;  // 1 PiB (2^50 B)
constexpr double kMaxOversubscription = 1e6;

// Networks: every per-layer, per-sample figure (FLOPs, parameters, elements, bytes), and
// tokens per sample. Sums over layers and products with batch sizes stay far from overflow.
constexpr double kMaxLayerValue = 1e30;
constexpr double kMaxTokensPerSample = 1e9;
constexpr int kMaxLayers = 1'000'000;       // layers listed in a network file
constexpr int kMaxCnnDim = 1 << 24;         // a CNN operation's height, width or channels

// Transformer shapes (zoo specs, network files, HuggingFace config.json).
constexpr int kMaxTransformerLayers = 100'000;
constexpr int kMaxHidden = 1 << 20;         // 1,048,576
constexpr int kMaxHeads = 1 << 20;
constexpr int kMaxFfn = 1 << 24;            // 16,777,216
constexpr int kMaxSeq = 1 << 27;            // 134,217,728 tokens
constexpr int kMaxVocab = 1 << 28;          // 268,435,456 tokens
constexpr int kMaxExperts = 1 << 16;        // routed or shared experts of one MoE layer
constexpr double kMaxCapacityFactor = 1e6;  // MoE capacity factor (and loss coefficients)

// Calibration.
constexpr double kMaxOverhead = 3'600;      // per task: 1 hour
constexpr double kMinLinkFactor = 1e-6;     // bandwidth_factor and non-zero latency_factor
constexpr double kMaxLinkFactor = 1e6;

// JSON (HuggingFace config.json): deeper nesting than this is refused while parsing.
constexpr int kMaxJsonDepth = 64;

}  // namespace hetflow::model::limits
