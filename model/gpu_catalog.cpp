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

}  // namespace

const std::vector<GpuSpec>& builtin_gpus() {
  static const std::vector<GpuSpec> catalog = {
      // NVIDIA Tesla P100 datasheet (SXM2 / "NVLink" column): FP16 21.2 TFLOPS, FP32
      // 10.6 TFLOPS, 16 GB CoWoS HBM2 at 732 GB/s, NVLink 160 GB/s bidirectional
      // (4 NVLink 1.0 links x 20 GB/s per direction = 80 GB/s per direction).
      // No tensor cores; FP16 is GP100's native 2x-rate half2 arithmetic. No BF16.
      {.name = "P100",
       .description = "NVIDIA Tesla P100 SXM2 16 GB (Pascal, 2016)",
       .fp16_flops_per_s = 21.2e12,
       .bf16_flops_per_s = 0,
       .fp32_flops_per_s = 10.6e12,
       .memory_bytes = 16 * kGiB,
       .memory_bandwidth_bytes_per_s = 732e9,
       .usual_link = LinkKind::nvlink,
       .usual_link_bandwidth_bytes_per_s = 80e9},

      // NVIDIA Tesla P100 datasheet (PCIe column, 16 GB): FP16 18.7 TFLOPS, FP32 9.3 TFLOPS,
      // 16 GB HBM2 at 732 GB/s, PCIe Gen3 x16. FP16 at 2x FP32 is real on GP100 (half2).
      {.name = "P100-PCIE",
       .description = "NVIDIA Tesla P100 PCIe 16 GB (Pascal, 2016)",
       .fp16_flops_per_s = 18.7e12,
       .bf16_flops_per_s = 0,
       .fp32_flops_per_s = 9.3e12,
       .memory_bytes = 16 * kGiB,
       .memory_bandwidth_bytes_per_s = 732e9,
       .usual_link = LinkKind::pcie,
       .usual_link_bandwidth_bytes_per_s = kPcieGen3x16},

      // NVIDIA Quadro P4000 datasheet: FP32 5.3 TFLOPS, 8 GB GDDR5 at 243 GB/s, PCIe 3.0 x16.
      // GP104 has no tensor cores and its native FP16 rate is 1/64 of FP32 (~83 GFLOPS,
      // TechPowerUp GPU database). Frameworks do not use that path: mixed-precision kernels
      // on GP104 compute in FP32, so FP16 runs at about the FP32 rate. We therefore set
      // fp16 = fp32 (5.3e12), the realistic figure, rather than the 1/64 native rate.
      {.name = "Quadro-P4000",
       .description = "NVIDIA Quadro P4000 8 GB (Pascal, 2017)",
       .fp16_flops_per_s = 5.3e12,
       .bf16_flops_per_s = 0,
       .fp32_flops_per_s = 5.3e12,
       .memory_bytes = 8 * kGiB,
       .memory_bandwidth_bytes_per_s = 243e9,
       .usual_link = LinkKind::pcie,
       .usual_link_bandwidth_bytes_per_s = kPcieGen3x16},

      // NVIDIA Tesla V100 datasheet (2020), SXM2 column: Tensor Performance 125 TFLOPS
      // (FP16 in, FP32 accumulate), single precision 15.7 TFLOPS, 16 GB HBM2 at 900 GB/s,
      // NVLink 300 GB/s (6 NVLink 2.0 links, aggregate both directions -> 150 GB/s each way).
      {.name = "V100-16",
       .description = "NVIDIA V100 SXM2 16 GB (Volta, 2017)",
       .fp16_flops_per_s = 125e12,
       .bf16_flops_per_s = 0,
       .fp32_flops_per_s = 15.7e12,
       .memory_bytes = 16 * kGiB,
       .memory_bandwidth_bytes_per_s = 900e9,
       .usual_link = LinkKind::nvlink,
       .usual_link_bandwidth_bytes_per_s = 150e9},

      // NVIDIA TITAN V product page: 640 tensor cores, "110 TFLOPS" deep-learning (tensor)
      // performance, 12 GB HBM2, 3072-bit at 1.7 Gb/s = 652.8 GB/s, PCIe 3.0 x16.
      // FP32: 5120 CUDA cores x 2 x 1455 MHz boost = 14.9 TFLOPS (NVIDIA's launch material
      // quoted 13.8 TFLOPS at a ~1.35 GHz clock, the same clock its 110 TFLOPS tensor figure
      // assumes; we follow the boost-clock convention used for every other part).
      // TITAN V runs FP16 tensor ops with FP32 accumulate at full rate.
      {.name = "TITAN-V",
       .description = "NVIDIA TITAN V 12 GB (Volta, 2017)",
       .fp16_flops_per_s = 110e12,
       .bf16_flops_per_s = 0,
       .fp32_flops_per_s = 14.9e12,
       .memory_bytes = 12 * kGiB,
       .memory_bandwidth_bytes_per_s = 652.8e9,
       .usual_link = LinkKind::pcie,
       .usual_link_bandwidth_bytes_per_s = kPcieGen3x16},

      // NVIDIA Tesla V100 datasheet (2020), SXM2 column, 32 GB variant (announced 2018):
      // same rates as V100-16 (125 / 15.7 TFLOPS, 900 GB/s, NVLink 300 GB/s aggregate).
      {.name = "V100-32",
       .description = "NVIDIA V100 SXM2 32 GB (Volta, 2018)",
       .fp16_flops_per_s = 125e12,
       .bf16_flops_per_s = 0,
       .fp32_flops_per_s = 15.7e12,
       .memory_bytes = 32 * kGiB,
       .memory_bandwidth_bytes_per_s = 900e9,
       .usual_link = LinkKind::nvlink,
       .usual_link_bandwidth_bytes_per_s = 150e9},

      // NVIDIA T4 Tensor Core GPU datasheet: FP32 8.1 TFLOPS, mixed precision (FP16/FP32)
      // 65 TFLOPS, 16 GB GDDR6, PCIe Gen3 x16. Bandwidth: the product page gives "320+ GB/s"
      // (256-bit x 10 Gb/s = 320 GB/s; a later datasheet revision rounds to 300 GB/s); we use
      // 320e9. Data-center Turing runs FP32 accumulate at full rate.
      {.name = "T4",
       .description = "NVIDIA T4 16 GB (Turing, 2018)",
       .fp16_flops_per_s = 65e12,
       .bf16_flops_per_s = 0,
       .fp32_flops_per_s = 8.1e12,
       .memory_bytes = 16 * kGiB,
       .memory_bandwidth_bytes_per_s = 320e9,
       .usual_link = LinkKind::pcie,
       .usual_link_bandwidth_bytes_per_s = kPcieGen3x16},

      // NVIDIA TITAN RTX product page / spec sheet: 130 TFLOPS tensor performance, FP32
      // 16.3 TFLOPS (4608 cores x 2 x 1770 MHz), 24 GB GDDR6 at 672 GB/s, PCIe 3.0 x16
      // (optional 2-way NVLink bridge not assumed). Unlike GeForce Turing, TITAN RTX is not
      // half-rate for FP32 accumulate, so 130 TFLOPS is the FP16-in/FP32-accumulate figure.
      {.name = "TITAN-RTX",
       .description = "NVIDIA TITAN RTX 24 GB (Turing, 2018)",
       .fp16_flops_per_s = 130e12,
       .bf16_flops_per_s = 0,
       .fp32_flops_per_s = 16.3e12,
       .memory_bytes = 24 * kGiB,
       .memory_bandwidth_bytes_per_s = 672e9,
       .usual_link = LinkKind::pcie,
       .usual_link_bandwidth_bytes_per_s = kPcieGen3x16},

      // GeForce RTX 2060 (NVIDIA product spec page): 1920 CUDA cores, 240 tensor cores,
      // 1680 MHz boost, 6 GB GDDR6 at 14 Gb/s x 192-bit = 336 GB/s, PCIe 3.0 x16.
      // FP32: 1920 x 2 x 1.68 GHz = 6.45 TFLOPS. Tensor: 240 x 64 FMA x 2 x 1.68 GHz =
      // 51.6 TFLOPS with FP16 accumulate; GeForce Turing runs FP32 accumulate at half rate
      // (NVIDIA Turing GPU Architecture whitepaper, appendix tables for RTX 2080 Ti/2080/2070),
      // so we use 25.8 TFLOPS.
      {.name = "RTX-2060",
       .description = "NVIDIA GeForce RTX 2060 6 GB (Turing, 2019)",
       .fp16_flops_per_s = 25.8e12,
       .bf16_flops_per_s = 0,
       .fp32_flops_per_s = 6.45e12,
       .memory_bytes = 6 * kGiB,
       .memory_bandwidth_bytes_per_s = 336e9,
       .usual_link = LinkKind::pcie,
       .usual_link_bandwidth_bytes_per_s = kPcieGen3x16},

      // NVIDIA A100 Tensor Core GPU Architecture whitepaper, table 1, and A100 datasheet
      // (40 GB SXM4): FP16 and BF16 tensor 312 TFLOPS dense (624 sparse), FP32 19.5 TFLOPS,
      // 40 GB HBM2 at 1,555 GB/s, NVLink 3 600 GB/s aggregate (12 links) -> 300 GB/s per
      // direction; HGX A100 boards connect all GPUs through NVSwitch.
      {.name = "A100-40",
       .description = "NVIDIA A100 SXM4 40 GB (Ampere, 2020)",
       .fp16_flops_per_s = 312e12,
       .bf16_flops_per_s = 312e12,
       .fp32_flops_per_s = 19.5e12,
       .memory_bytes = 40 * kGiB,
       .memory_bandwidth_bytes_per_s = 1555e9,
       .usual_link = LinkKind::nvswitch,
       .usual_link_bandwidth_bytes_per_s = 300e9},

      // NVIDIA Ampere GA102 GPU Architecture whitepaper, table (GeForce RTX 3090 column):
      // FP32 35.6 TFLOPS; peak FP16 tensor with FP32 accumulate 71 TFLOPS dense (142 with
      // FP16 accumulate); peak BF16 tensor (FP32 accumulate) 71 TFLOPS dense. 24 GB GDDR6X
      // at 936 GB/s, PCIe Gen4 x16 (NVLink bridge optional, not assumed).
      {.name = "RTX-3090",
       .description = "NVIDIA GeForce RTX 3090 24 GB (Ampere, 2020)",
       .fp16_flops_per_s = 71e12,
       .bf16_flops_per_s = 71e12,
       .fp32_flops_per_s = 35.6e12,
       .memory_bytes = 24 * kGiB,
       .memory_bandwidth_bytes_per_s = 936e9,
       .usual_link = LinkKind::pcie,
       .usual_link_bandwidth_bytes_per_s = kPcieGen4x16},

      // NVIDIA A100 80GB datasheet (SXM column): FP16/BF16 tensor 312 TFLOPS dense, FP32
      // 19.5 TFLOPS, 80 GB HBM2e at 2,039 GB/s, NVLink 600 GB/s aggregate -> 300 GB/s per
      // direction, NVSwitch on HGX A100.
      {.name = "A100-80",
       .description = "NVIDIA A100 SXM4 80 GB (Ampere, 2020)",
       .fp16_flops_per_s = 312e12,
       .bf16_flops_per_s = 312e12,
       .fp32_flops_per_s = 19.5e12,
       .memory_bytes = 80 * kGiB,
       .memory_bandwidth_bytes_per_s = 2039e9,
       .usual_link = LinkKind::nvswitch,
       .usual_link_bandwidth_bytes_per_s = 300e9},

      // NVIDIA A10 Tensor Core GPU datasheet: FP32 31.2 TFLOPS, BF16 tensor 125 | 250*
      // TFLOPS, FP16 tensor 125 | 250* TFLOPS (* = with sparsity), 24 GB GDDR6 at 600 GB/s,
      // PCIe Gen4 x16.
      {.name = "A10",
       .description = "NVIDIA A10 24 GB (Ampere, 2021)",
       .fp16_flops_per_s = 125e12,
       .bf16_flops_per_s = 125e12,
       .fp32_flops_per_s = 31.2e12,
       .memory_bytes = 24 * kGiB,
       .memory_bandwidth_bytes_per_s = 600e9,
       .usual_link = LinkKind::pcie,
       .usual_link_bandwidth_bytes_per_s = kPcieGen4x16},

      // NVIDIA H100 Tensor Core GPU datasheet (SXM column): FP32 67 TFLOPS, FP16 and BF16
      // tensor 1,979 TFLOPS with sparsity -> 989.4 dense (NVIDIA H100 Tensor Core GPU
      // Architecture whitepaper gives 989.4 dense for H100 SXM5), 80 GB HBM3 at 3.35 TB/s,
      // NVLink 4 900 GB/s aggregate (18 links) -> 450 GB/s per direction, NVSwitch on HGX.
      {.name = "H100-SXM",
       .description = "NVIDIA H100 SXM5 80 GB (Hopper, 2022)",
       .fp16_flops_per_s = 989.4e12,
       .bf16_flops_per_s = 989.4e12,
       .fp32_flops_per_s = 67e12,
       .memory_bytes = 80 * kGiB,
       .memory_bandwidth_bytes_per_s = 3.35e12,
       .usual_link = LinkKind::nvswitch,
       .usual_link_bandwidth_bytes_per_s = 450e9},

      // NVIDIA Ada GPU Architecture whitepaper, appendix table (GeForce RTX 4090 column):
      // FP32 82.6 TFLOPS; peak FP16 tensor with FP32 accumulate 165.2 TFLOPS dense (330.3
      // with FP16 accumulate); peak BF16 tensor 165.2 TFLOPS dense. 24 GB GDDR6X at
      // 1,008 GB/s, PCIe Gen4 x16 (no NVLink on this part).
      {.name = "RTX-4090",
       .description = "NVIDIA GeForce RTX 4090 24 GB (Ada Lovelace, 2022)",
       .fp16_flops_per_s = 165.2e12,
       .bf16_flops_per_s = 165.2e12,
       .fp32_flops_per_s = 82.6e12,
       .memory_bytes = 24 * kGiB,
       .memory_bandwidth_bytes_per_s = 1008e9,
       .usual_link = LinkKind::pcie,
       .usual_link_bandwidth_bytes_per_s = kPcieGen4x16},

      // NVIDIA L4 Tensor Core GPU datasheet: FP32 30.3 TFLOPS, FP16 and BF16 tensor 242*
      // TFLOPS (* = with sparsity) -> 121 dense, 24 GB GDDR6 at 300 GB/s, PCIe Gen4 x16
      // (64 GB/s bidirectional).
      {.name = "L4",
       .description = "NVIDIA L4 24 GB (Ada Lovelace, 2023)",
       .fp16_flops_per_s = 121e12,
       .bf16_flops_per_s = 121e12,
       .fp32_flops_per_s = 30.3e12,
       .memory_bytes = 24 * kGiB,
       .memory_bandwidth_bytes_per_s = 300e9,
       .usual_link = LinkKind::pcie,
       .usual_link_bandwidth_bytes_per_s = kPcieGen4x16},

      // NVIDIA H200 Tensor Core GPU datasheet (SXM column): FP32 67 TFLOPS, FP16 and BF16
      // tensor 1,979 TFLOPS with sparsity -> 989.4 dense (same GH100 compute as H100 SXM),
      // 141 GB HBM3e at 4.8 TB/s, NVLink 900 GB/s aggregate -> 450 GB/s per direction,
      // NVSwitch on HGX H200.
      {.name = "H200",
       .description = "NVIDIA H200 SXM 141 GB (Hopper, 2024)",
       .fp16_flops_per_s = 989.4e12,
       .bf16_flops_per_s = 989.4e12,
       .fp32_flops_per_s = 67e12,
       .memory_bytes = 141 * kGiB,
       .memory_bandwidth_bytes_per_s = 4.8e12,
       .usual_link = LinkKind::nvswitch,
       .usual_link_bandwidth_bytes_per_s = 450e9},
  };
  return catalog;
}

}  // namespace hetflow::model
