#pragma once
// A node's host: its memory and CPUs, and the PCIe bridges between them and the node's GPUs.
// Offloading (partition::Offload) keeps optimizer state in that memory, steps the optimizer
// on those CPUs and copies over those bridges. A cluster file may give any of it per node
// (`host:`); what it leaves out comes from the node's GPU type (node_host.cpp cites each
// figure).
#include <string>

namespace hetflow::model {

struct GpuSpec;

struct NodeHost {
  double memory_bytes = 0;            // the host's DRAM
  double pcie_bytes_per_s = 0;        // one host bridge, each direction, as DMA copies achieve
  double pcie_latency_s = 0;          // one copy's start-up
  int gpus_per_bridge = 0;            // GPUs sharing one bridge (a PCIe switch's uplink)
  double cpu_flops_per_s = 0;         // all CPU cores, fp32 vector peak
  double cpu_memory_bytes_per_s = 0;  // all sockets' DRAM bandwidth
  bool operator==(const NodeHost&) const = default;
};

// The host of a node of `gpu`s: each field of `given` that is positive, the GPU type's usual
// host (a DGX of its generation, or a PCIe workstation) for the rest.
NodeHost resolved_host(const NodeHost& given, const GpuSpec& gpu);

// Where the defaults come from, for `describe`: "DGX A100 (2x EPYC 7742, PCIe 4.0 x16)".
std::string usual_host_name(const GpuSpec& gpu);

}  // namespace hetflow::model
