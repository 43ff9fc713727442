// The built-in GPU catalog: published peak specs of real NVIDIA parts.
//
// Conventions (apply to every entry below):
//  * Rates are dense peaks (no 2:4 structured sparsity) at the boost clock, as the vendor's
//    data sheet or architecture whitepaper states them. Where a data sheet only gives the
//    sparse figure ("with sparsity", marked *), the dense rate is half of it.
//  * fp16_flops_per_s: tensor-core FP16 where the part has tensor cores. For GeForce parts,
//    whose FP16 tensor rate with FP32 accumulate is half the FP16-accumulate rate, we use the
//    FP32-accumulate figure, since that is what mixed-precision training runs at. Data-center
//    and TITAN parts run FP32 accumulate at full rate, so their single published figure is used.
//  * bf16_flops_per_s: 0 for parts without BF16 arithmetic (Pascal, Volta, Turing).
//  * fp32_flops_per_s: plain FP32 on the CUDA cores (not TF32).
//  * memory_bytes: the marketed capacity "N GB" taken as N * 2^30 bytes, consistently for
//    every part (GPU memory is binary-sized; for H100 80 GB and H200 141 GB this is the same
//    convention, not a claim about usable bytes).
//  * memory_bandwidth_bytes_per_s: decimal, as marketed (900 GB/s = 900e9 B/s).
//  * usual_link_bandwidth_bytes_per_s: per GPU, one direction. NVLink data sheets quote the
//    bidirectional aggregate, so it is halved (V100 300 GB/s -> 150e9). PCIe is taken at its
//    nominal x16 rate per direction: Gen3 16e9 (15.75 GB/s exactly), Gen4 32e9, Gen5 64e9.
//  * Entries are in release order, oldest first. The order is part of the interface
//    (`hetflow list` prints it); append new parts rather than reordering.
#include "model/gpu.hpp"

namespace hetflow::model {

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// Nominal per-direction x16 PCIe rates.
constexpr double kPcieGen3x16 = 16e9;
constexpr double kPcieGen4x16 = 32e9;

// One part as its sources give it, in the units of the conventions above.
struct GpuRow {
  const char* name;                          // catalog key
  const char* description;                   // one line for `hetflow list`
  double fp16_flops_per_s;                   // dense FP16 peak
  double bf16_flops_per_s;                   // dense BF16 peak, 0 without BF16 arithmetic
  double fp32_flops_per_s;                   // plain FP32
  double memory_gb;                          // marketed "N GB", taken as N GiB
  double memory_bandwidth_bytes_per_s;       // decimal, as marketed
  LinkKind usual_link;                       // the interconnect it usually ships with
  double usual_link_bandwidth_bytes_per_s;    // per GPU, one direction
};

// The catalog: one row per part, its sources in the comment above it. Columns: name,
// description; FP16, BF16, FP32 FLOP/s; memory GB; memory B/s; usual link and its B/s.
constexpr GpuRow kCatalog[] = {
    // NVIDIA Tesla P100 datasheet (SXM2 / "NVLink" column): FP16 21.2 TFLOPS, FP32
    // 10.6 TFLOPS, 16 GB CoWoS HBM2 at 732 GB/s, NVLink 160 GB/s bidirectional
    // (4 NVLink 1.0 links x 20 GB/s per direction = 80 GB/s per direction).
    // No tensor cores; FP16 is GP100's native 2x-rate half2 arithmetic. No BF16.
    {"P100", "NVIDIA Tesla P100 SXM2 16 GB (Pascal, 2016)",
     21.2e12, 0, 10.6e12, 16, 732e9, LinkKind::nvlink, 80e9},

    // NVIDIA Tesla P100 datasheet (PCIe column, 16 GB): FP16 18.7 TFLOPS, FP32 9.3 TFLOPS,
    // 16 GB HBM2 at 732 GB/s, PCIe Gen3 x16. FP16 at 2x FP32 is real on GP100 (half2).
    {"P100-PCIE", "NVIDIA Tesla P100 PCIe 16 GB (Pascal, 2016)",
     18.7e12, 0, 9.3e12, 16, 732e9, LinkKind::pcie, kPcieGen3x16},

    // NVIDIA Quadro P4000 datasheet: FP32 5.3 TFLOPS, 8 GB GDDR5 at 243 GB/s, PCIe 3.0 x16.
    // GP104 has no tensor cores and its native FP16 rate is 1/64 of FP32 (~83 GFLOPS,
    // TechPowerUp GPU database). Frameworks do not use that path: mixed-precision kernels
    // on GP104 compute in FP32, so FP16 runs at about the FP32 rate. We therefore set
    // fp16 = fp32 (5.3e12), the realistic figure, rather than the 1/64 native rate.
    {"Quadro-P4000", "NVIDIA Quadro P4000 8 GB (Pascal, 2017)",
     5.3e12, 0, 5.3e12, 8, 243e9, LinkKind::pcie, kPcieGen3x16},

    // NVIDIA Tesla V100 datasheet (2020), SXM2 column: Tensor Performance 125 TFLOPS
    // (FP16 in, FP32 accumulate), single precision 15.7 TFLOPS, 16 GB HBM2 at 900 GB/s,
    // NVLink 300 GB/s (6 NVLink 2.0 links, aggregate both directions -> 150 GB/s each way).
    {"V100-16", "NVIDIA V100 SXM2 16 GB (Volta, 2017)",
     125e12, 0, 15.7e12, 16, 900e9, LinkKind::nvlink, 150e9},

    // NVIDIA TITAN V product page: 640 tensor cores, "110 TFLOPS" deep-learning (tensor)
    // performance, 12 GB HBM2, 3072-bit at 1.7 Gb/s = 652.8 GB/s, PCIe 3.0 x16.
    // FP32: 5120 CUDA cores x 2 x 1455 MHz boost = 14.9 TFLOPS (NVIDIA's launch material
    // quoted 13.8 TFLOPS at a ~1.35 GHz clock, the same clock its 110 TFLOPS tensor figure
    // assumes; we follow the boost-clock convention used for every other part).
    // TITAN V runs FP16 tensor ops with FP32 accumulate at full rate.
    {"TITAN-V", "NVIDIA TITAN V 12 GB (Volta, 2017)",
     110e12, 0, 14.9e12, 12, 652.8e9, LinkKind::pcie, kPcieGen3x16},

    // NVIDIA Tesla V100 datasheet (2020), SXM2 column, 32 GB variant (announced 2018):
    // same rates as V100-16 (125 / 15.7 TFLOPS, 900 GB/s, NVLink 300 GB/s aggregate).
    {"V100-32", "NVIDIA V100 SXM2 32 GB (Volta, 2018)",
     125e12, 0, 15.7e12, 32, 900e9, LinkKind::nvlink, 150e9},

    // NVIDIA T4 Tensor Core GPU datasheet: FP32 8.1 TFLOPS, mixed precision (FP16/FP32)
    // 65 TFLOPS, 16 GB GDDR6, PCIe Gen3 x16. Bandwidth: the product page gives "320+ GB/s"
    // (256-bit x 10 Gb/s = 320 GB/s; a later datasheet revision rounds to 300 GB/s); we use
    // 320e9. Data-center Turing runs FP32 accumulate at full rate.
    {"T4", "NVIDIA T4 16 GB (Turing, 2018)",
     65e12, 0, 8.1e12, 16, 320e9, LinkKind::pcie, kPcieGen3x16},

    // NVIDIA TITAN RTX product page / spec sheet: 130 TFLOPS tensor performance, FP32
    // 16.3 TFLOPS (4608 cores x 2 x 1770 MHz), 24 GB GDDR6 at 672 GB/s, PCIe 3.0 x16
    // (optional 2-way NVLink bridge not assumed). Unlike GeForce Turing, TITAN RTX is not
    // half-rate for FP32 accumulate, so 130 TFLOPS is the FP16-in/FP32-accumulate figure.
    {"TITAN-RTX", "NVIDIA TITAN RTX 24 GB (Turing, 2018)",
     130e12, 0, 16.3e12, 24, 672e9, LinkKind::pcie, kPcieGen3x16},

    // GeForce RTX 2060 (NVIDIA product spec page): 1920 CUDA cores, 240 tensor cores,
    // 1680 MHz boost, 6 GB GDDR6 at 14 Gb/s x 192-bit = 336 GB/s, PCIe 3.0 x16.
    // FP32: 1920 x 2 x 1.68 GHz = 6.45 TFLOPS. Tensor: 240 x 64 FMA x 2 x 1.68 GHz =
    // 51.6 TFLOPS with FP16 accumulate; GeForce Turing runs FP32 accumulate at half rate
    // (NVIDIA Turing GPU Architecture whitepaper, appendix tables for RTX 2080 Ti/2080/2070),
    // so we use 25.8 TFLOPS.
    {"RTX-2060", "NVIDIA GeForce RTX 2060 6 GB (Turing, 2019)",
     25.8e12, 0, 6.45e12, 6, 336e9, LinkKind::pcie, kPcieGen3x16},

    // NVIDIA A100 Tensor Core GPU Architecture whitepaper, table 1, and A100 datasheet
    // (40 GB SXM4): FP16 and BF16 tensor 312 TFLOPS dense (624 sparse), FP32 19.5 TFLOPS,
    // 40 GB HBM2 at 1,555 GB/s, NVLink 3 600 GB/s aggregate (12 links) -> 300 GB/s per
    // direction; HGX A100 boards connect all GPUs through NVSwitch.
    {"A100-40", "NVIDIA A100 SXM4 40 GB (Ampere, 2020)",
     312e12, 312e12, 19.5e12, 40, 1555e9, LinkKind::nvswitch, 300e9},

    // NVIDIA Ampere GA102 GPU Architecture whitepaper, table (GeForce RTX 3090 column):
    // FP32 35.6 TFLOPS; peak FP16 tensor with FP32 accumulate 71 TFLOPS dense (142 with
    // FP16 accumulate); peak BF16 tensor (FP32 accumulate) 71 TFLOPS dense. 24 GB GDDR6X
    // at 936 GB/s, PCIe Gen4 x16 (NVLink bridge optional, not assumed).
    {"RTX-3090", "NVIDIA GeForce RTX 3090 24 GB (Ampere, 2020)",
     71e12, 71e12, 35.6e12, 24, 936e9, LinkKind::pcie, kPcieGen4x16},

    // NVIDIA A100 80GB datasheet (SXM column): FP16/BF16 tensor 312 TFLOPS dense, FP32
    // 19.5 TFLOPS, 80 GB HBM2e at 2,039 GB/s, NVLink 600 GB/s aggregate -> 300 GB/s per
    // direction, NVSwitch on HGX A100.
    {"A100-80", "NVIDIA A100 SXM4 80 GB (Ampere, 2020)",
     312e12, 312e12, 19.5e12, 80, 2039e9, LinkKind::nvswitch, 300e9},

    // NVIDIA A10 Tensor Core GPU datasheet: FP32 31.2 TFLOPS, BF16 tensor 125 | 250*
    // TFLOPS, FP16 tensor 125 | 250* TFLOPS (* = with sparsity), 24 GB GDDR6 at 600 GB/s,
    // PCIe Gen4 x16.
    {"A10", "NVIDIA A10 24 GB (Ampere, 2021)",
     125e12, 125e12, 31.2e12, 24, 600e9, LinkKind::pcie, kPcieGen4x16},

    // NVIDIA H100 Tensor Core GPU datasheet (SXM column): FP32 67 TFLOPS, FP16 and BF16
    // tensor 1,979 TFLOPS with sparsity -> 989.4 dense (NVIDIA H100 Tensor Core GPU
    // Architecture whitepaper gives 989.4 dense for H100 SXM5), 80 GB HBM3 at 3.35 TB/s,
    // NVLink 4 900 GB/s aggregate (18 links) -> 450 GB/s per direction, NVSwitch on HGX.
    {"H100-SXM", "NVIDIA H100 SXM5 80 GB (Hopper, 2022)",
     989.4e12, 989.4e12, 67e12, 80, 3.35e12, LinkKind::nvswitch, 450e9},

    // NVIDIA Ada GPU Architecture whitepaper, appendix table (GeForce RTX 4090 column):
    // FP32 82.6 TFLOPS; peak FP16 tensor with FP32 accumulate 165.2 TFLOPS dense (330.3
    // with FP16 accumulate); peak BF16 tensor 165.2 TFLOPS dense. 24 GB GDDR6X at
    // 1,008 GB/s, PCIe Gen4 x16 (no NVLink on this part).
    {"RTX-4090", "NVIDIA GeForce RTX 4090 24 GB (Ada Lovelace, 2022)",
     165.2e12, 165.2e12, 82.6e12, 24, 1008e9, LinkKind::pcie, kPcieGen4x16},

    // NVIDIA L4 Tensor Core GPU datasheet: FP32 30.3 TFLOPS, FP16 and BF16 tensor 242*
    // TFLOPS (* = with sparsity) -> 121 dense, 24 GB GDDR6 at 300 GB/s, PCIe Gen4 x16
    // (64 GB/s bidirectional).
    {"L4", "NVIDIA L4 24 GB (Ada Lovelace, 2023)",
     121e12, 121e12, 30.3e12, 24, 300e9, LinkKind::pcie, kPcieGen4x16},

    // NVIDIA H200 Tensor Core GPU datasheet (SXM column): FP32 67 TFLOPS, FP16 and BF16
    // tensor 1,979 TFLOPS with sparsity -> 989.4 dense (same GH100 compute as H100 SXM),
    // 141 GB HBM3e at 4.8 TB/s, NVLink 900 GB/s aggregate -> 450 GB/s per direction,
    // NVSwitch on HGX H200.
    {"H200", "NVIDIA H200 SXM 141 GB (Hopper, 2024)",
     989.4e12, 989.4e12, 67e12, 141, 4.8e12, LinkKind::nvswitch, 450e9},
};

}  // namespace

const std::vector<GpuSpec>& builtin_gpus() {
  static const std::vector<GpuSpec> catalog = [] {
    std::vector<GpuSpec> specs;
    for (const GpuRow& r : kCatalog) {
      specs.push_back({.name = r.name,
                       .description = r.description,
                       .fp16_flops_per_s = r.fp16_flops_per_s,
                       .bf16_flops_per_s = r.bf16_flops_per_s,
                       .fp32_flops_per_s = r.fp32_flops_per_s,
                       .memory_bytes = r.memory_gb * kGiB,
                       .memory_bandwidth_bytes_per_s = r.memory_bandwidth_bytes_per_s,
                       .usual_link = r.usual_link,
                       .usual_link_bandwidth_bytes_per_s = r.usual_link_bandwidth_bytes_per_s});
    }
    return specs;
  }();
  return catalog;
}

}  // namespace hetflow::model
