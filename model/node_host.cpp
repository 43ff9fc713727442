// The usual host of each GPU generation, for the figures a cluster file leaves out.
//
// PCIe bandwidth, from first principles (PCI-SIG, PCI Express Base Specification 3.0-5.0):
// one x16 link carries 16 lanes x 8 / 16 / 32 GT/s with 128b/130b encoding, i.e. 15.75 /
// 31.5 / 63.0 GB/s each direction for generations 3 / 4 / 5. A DMA copy moves 256-byte
// payloads (the usual MaxPayloadSize), each with about 24 bytes of TLP header, sequence
// number, LCRC and framing, so at most 256 / 280 = 91.4% of that is data. Measured pinned
// copies (CUDA's bandwidthTest) land 5-15% lower still (flow-control and completion traffic);
// a calibration from measured copies replaces these.
// A copy's start-up (pinned cudaMemcpyAsync, launch and DMA set-up) is about 10 us.
//
// CPU peaks are cores x clock x fp32 FLOP per cycle (two FMA units: 32 with AVX2, 64 with
// AVX-512); DRAM bandwidth is channels x transfer rate x 8 bytes. Each platform's parts:
//   DGX-1 (NVIDIA DGX-1 System Architecture whitepaper, 2017): 2x Xeon E5-2698 v4, 20 cores
//     at 2.2 GHz, AVX2; 512 GB DDR4-2133, 4 channels per socket; PCIe 3.0, two GPUs behind
//     each of four PLX switches.
//   DGX A100 (NVIDIA DGX A100 User Guide; system architecture whitepaper, 2020): 2x AMD EPYC
//     7742, 64 cores at 2.25 GHz, AVX2; 1 TB (320 GB system) or 2 TB (640 GB) DDR4-3200,
//     8 channels per socket; PCIe 4.0, two GPUs behind each of four PCIe switches.
//   DGX H100 (NVIDIA DGX H100 User Guide, 2023): 2x Xeon Platinum 8480C, 56 cores at 2.0 GHz,
//     AVX-512; 2 TB DDR5-4800, 8 channels per socket; PCIe 5.0 (two GPUs per switch assumed,
//     as on DGX A100).
//   PCIe servers: a dual-socket server with a x16 root port per GPU. Gen 3 parts (Pascal,
//     Volta, Turing): 2x Xeon Gold 6248, 20 cores at 2.5 GHz, AVX-512; 384 GB DDR4-2933,
//     6 channels per socket. Gen 4 parts (Ampere, Ada, and types the catalog does not know):
//     2x AMD EPYC 7543, 32 cores at 2.8 GHz, AVX2; 512 GB DDR4-3200, 8 channels per socket.
#include "model/node_host.hpp"

#include <string_view>

#include "model/gpu.hpp"

namespace hetflow::model {
namespace {

constexpr double kGB = 1e9;
constexpr double kGiB = 1024.0 * 1024 * 1024;
constexpr double kTlpEfficiency = 256.0 / (256.0 + 24.0);

double pcie_x16_bytes_per_s(int generation) {
  const double per_direction = generation == 3 ? 15.75 * kGB : generation == 4 ? 31.5 * kGB : 63.0 * kGB;
  return per_direction * kTlpEfficiency;
}

struct UsualHost {
  const char* name;
  NodeHost host;
};

UsualHost dgx1() {
  return {"DGX-1 (2x Xeon E5-2698 v4, PCIe 3.0 x16)",
          {512 * kGiB, pcie_x16_bytes_per_s(3), 10e-6, 2, 2 * 20 * 2.2e9 * 32, 2 * 4 * 2133e6 * 8}};
}
UsualHost dgx_a100(double memory_bytes) {
  return {"DGX A100 (2x EPYC 7742, PCIe 4.0 x16)",
          {memory_bytes, pcie_x16_bytes_per_s(4), 10e-6, 2, 2 * 64 * 2.25e9 * 32, 2 * 8 * 3200e6 * 8}};
}
UsualHost dgx_h100() {
  return {"DGX H100 (2x Xeon Platinum 8480C, PCIe 5.0 x16)",
          {2048 * kGiB, pcie_x16_bytes_per_s(5), 10e-6, 2, 2 * 56 * 2.0e9 * 64, 2 * 8 * 4800e6 * 8}};
}
UsualHost pcie_gen3_server() {
  return {"PCIe server (2x Xeon Gold 6248, PCIe 3.0 x16 per GPU)",
          {384 * kGiB, pcie_x16_bytes_per_s(3), 10e-6, 1, 2 * 20 * 2.5e9 * 64, 2 * 6 * 2933e6 * 8}};
}
UsualHost pcie_gen4_server() {
  return {"PCIe server (2x EPYC 7543, PCIe 4.0 x16 per GPU)",
          {512 * kGiB, pcie_x16_bytes_per_s(4), 10e-6, 1, 2 * 32 * 2.8e9 * 32, 2 * 8 * 3200e6 * 8}};
}

UsualHost usual_host(const GpuSpec& gpu) {
  const std::string_view n = gpu.name;
  if (n == "P100" || n == "V100-16" || n == "V100-32") return dgx1();
  if (n == "A100-40") return dgx_a100(1024 * kGiB);
  if (n == "A100-80") return dgx_a100(2048 * kGiB);
  if (n == "H100-SXM" || n == "H200") return dgx_h100();
  if (n == "P100-PCIE" || n == "Quadro-P4000" || n == "TITAN-V" || n == "T4" || n == "TITAN-RTX" ||
      n == "RTX-2060")
    return pcie_gen3_server();
  return pcie_gen4_server();
}

}  // namespace

NodeHost resolved_host(const NodeHost& given, const GpuSpec& gpu) {
  NodeHost h = usual_host(gpu).host;
  if (given.memory_bytes > 0) h.memory_bytes = given.memory_bytes;
  if (given.pcie_bytes_per_s > 0) h.pcie_bytes_per_s = given.pcie_bytes_per_s;
  if (given.pcie_latency_s > 0) h.pcie_latency_s = given.pcie_latency_s;
  if (given.gpus_per_bridge > 0) h.gpus_per_bridge = given.gpus_per_bridge;
  if (given.cpu_flops_per_s > 0) h.cpu_flops_per_s = given.cpu_flops_per_s;
  if (given.cpu_memory_bytes_per_s > 0) h.cpu_memory_bytes_per_s = given.cpu_memory_bytes_per_s;
  return h;
}

std::string usual_host_name(const GpuSpec& gpu) { return usual_host(gpu).name; }

}  // namespace hetflow::model
