// Built-in clusters, written in the same YAML users write, so each one is also an example of
// the format. Bandwidths are per direction.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "model/error.hpp"
#include "model/io.hpp"

namespace hetflow::model {

namespace {

struct Preset {
  const char* name;
  const char* description;
  const char* yaml;
};

const Preset kPresets[] = {
    {"mixed-academic",
     "2 nodes x 4 V100-16 (NVLink) + 1 x 4 A100-40 (NVLink) + 1 x 8 RTX-3090 (PCIe), 25 Gb/s Ethernet",
     R"(name: mixed-academic
description: a university cluster grown over three GPU generations, on 25 Gb/s Ethernet
fabric: {kind: switch, latency: 1 us}
nodes:
  - {name: v100, count: 2, gpu: V100-16, gpus: 4,
     intra: {kind: nvlink, bandwidth: 150 GB/s, latency: 2 us},
     nic: {count: 1, bandwidth: 25 Gb/s, latency: 10 us}}
  - {name: a100, gpu: A100-40, gpus: 4,
     intra: {kind: nvlink, bandwidth: 300 GB/s, latency: 2 us},
     nic: {count: 1, bandwidth: 25 Gb/s, latency: 10 us}}
  - {name: rtx3090, gpu: RTX-3090, gpus: 8,
     intra: {kind: pcie, bandwidth: 32 GB/s, latency: 5 us, uplink: 32 GB/s},
     nic: {count: 1, bandwidth: 25 Gb/s, latency: 10 us}}
)"},
    {"hetpipe-testbed",
     "HetPipe (ATC'20) testbed: 4 nodes x 4 GPUs (TITAN-V, TITAN-RTX, RTX-2060, Quadro-P4000), PCIe, 56 Gb/s InfiniBand",
     R"(name: hetpipe-testbed
description: the HetPipe paper's cluster, one GPU type per node, PCIe 3.0 inside, FDR InfiniBand between
fabric: {kind: switch, latency: 1 us}
nodes:
  - {name: titanv, gpu: TITAN-V, gpus: 4,
     intra: {kind: pcie, bandwidth: 16 GB/s, latency: 5 us, uplink: 16 GB/s},
     nic: {count: 1, bandwidth: 56 Gb/s, latency: 2 us}}
  - {name: titanrtx, gpu: TITAN-RTX, gpus: 4,
     intra: {kind: pcie, bandwidth: 16 GB/s, latency: 5 us, uplink: 16 GB/s},
     nic: {count: 1, bandwidth: 56 Gb/s, latency: 2 us}}
  - {name: rtx2060, gpu: RTX-2060, gpus: 4,
     intra: {kind: pcie, bandwidth: 16 GB/s, latency: 5 us, uplink: 16 GB/s},
     nic: {count: 1, bandwidth: 56 Gb/s, latency: 2 us}}
  - {name: p4000, gpu: Quadro-P4000, gpus: 4,
     intra: {kind: pcie, bandwidth: 16 GB/s, latency: 5 us, uplink: 16 GB/s},
     nic: {count: 1, bandwidth: 56 Gb/s, latency: 2 us}}
)"},
    {"dgx-a100-x4",
     "4 DGX-A100: 8 A100-80 each on NVSwitch (600 GB/s bidirectional), 8 x 200 Gb/s HDR InfiniBand",
     R"(name: dgx-a100-x4
description: four DGX A100 nodes; NVSwitch gives each GPU 300 GB/s each way (600 GB/s bidirectional)
fabric: {kind: switch, latency: 1 us}
nodes:
  - {name: dgx, count: 4, gpu: A100-80, gpus: 8,
     intra: {kind: nvswitch, bandwidth: 300 GB/s, latency: 2 us},
     nic: {count: 8, bandwidth: 200 Gb/s, latency: 2 us}}
)"},
    {"h100-fat-tree",
     "16 nodes x 8 H100-SXM on NVSwitch, 8 x 400 Gb/s NDR each, two-level fat tree 2:1 oversubscribed",
     R"(name: h100-fat-tree
description: 128 H100 in 16 HGX nodes; leaf switches of 4 nodes, uplinks oversubscribed 2:1
fabric: {kind: fat-tree, nodes_per_leaf: 4, oversubscription: 2, latency: 1 us}
nodes:
  - {name: hgx, count: 16, gpu: H100-SXM, gpus: 8,
     intra: {kind: nvswitch, bandwidth: 450 GB/s, latency: 2 us},
     nic: {count: 8, bandwidth: 400 Gb/s, latency: 2 us}}
)"},
    {"cpu-4",
     "4 CPU devices of this host for hetflow run --backend cpu (any cpu-N; cpu-N:probed measures their speed)",
     nullptr},
    {"selene-4",
     "4 DGX A100 nodes of NVIDIA's Selene, where Megatron-LM's SC'21 runs were measured (any selene-N, N <= 560)",
     nullptr},
    {"two-region",
     "2 A100-80 nodes in us-east + 2 V100-32 nodes in eu-west, joined by a 10 Gb/s, 40 ms WAN link",
     R"(name: two-region
description: cross-region training; each region's nodes share a switch, regions share one WAN link
regions:
  - {name: us-east, fabric: {kind: switch, latency: 1 us}}
  - {name: eu-west, fabric: {kind: switch, latency: 1 us}}
nodes:
  - {name: us, count: 2, region: us-east, gpu: A100-80, gpus: 8,
     intra: {kind: nvswitch, bandwidth: 300 GB/s, latency: 2 us},
     nic: {count: 4, bandwidth: 200 Gb/s, latency: 2 us}}
  - {name: eu, count: 2, region: eu-west, gpu: V100-32, gpus: 8,
     intra: {kind: nvlink, bandwidth: 150 GB/s, latency: 2 us},
     nic: {count: 4, bandwidth: 100 Gb/s, latency: 2 us}}
wan:
  - {between: [us-east, eu-west], bandwidth: 10 Gb/s, latency: 40 ms}
)"},
};

}  // namespace

std::vector<ClusterPreset> cluster_presets() {
  std::vector<ClusterPreset> out;
  for (const Preset& p : kPresets) out.push_back({p.name, p.description});
  return out;
}

namespace {
// N of "<prefix>N" (digits only, 1..most); 0 for any other name.
int sized_name(std::string_view name, std::string_view prefix, int most, const char* what) {
  if (name.size() <= prefix.size() || name.substr(0, prefix.size()) != prefix) return 0;
  const std::string_view digits = name.substr(prefix.size());
  if (digits.size() > 6 || !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) return 0;
  const int n = std::stoi(std::string(digits));
  if (n < 1 || n > most) {
    throw InputError(std::string(name), 0, "cluster",
                     std::string(prefix) + "N takes 1 to " + std::to_string(most) + " " + what + ", found " + std::string(digits));
  }
  return n;
}
}  // namespace

int cpu_cluster_devices(std::string_view name) { return sized_name(name, "cpu-", kMaxCpuDevices, "devices"); }
int selene_cluster_nodes(std::string_view name) { return sized_name(name, "selene-", kMaxSeleneNodes, "nodes"); }

Cluster selene_cluster(int nodes) {
  if (nodes < 1 || nodes > kMaxSeleneNodes) {
    throw InputError("selene-" + std::to_string(nodes), 0, "cluster", "expected 1 to " + std::to_string(kMaxSeleneNodes) + " nodes");
  }
  const std::string n = std::to_string(nodes);
  // NVSwitch: 600 GB/s bidirectional per A100 (300 GB/s each way); HDR: 200 Gb/s per HCA.
  const std::string yaml = "name: selene-" + n + "\ndescription: \"" + n +
                           " DGX A100 nodes of NVIDIA's Selene (Narayanan et al., SC'21) - 8 A100 80 GB on NVSwitch, "
                           "8 x 200 Gb/s HDR InfiniBand each, non-blocking fat tree\"\n"
                           "fabric: {kind: fat-tree, nodes_per_leaf: 20, oversubscription: 1, latency: 1 us}\n"
                           "nodes:\n  - {name: dgx, count: " + n + ", gpu: A100-80, gpus: 8, "
                           "intra: {kind: nvswitch, bandwidth: 300 GB/s, latency: 2 us}, "
                           "nic: {count: 8, bandwidth: 200 Gb/s, latency: 2 us}}\n";
  return parse_cluster(yaml, "<built-in cluster selene-" + n + ">");
}

Cluster cpu_cluster(int devices, double flops_per_s) {
  if (devices < 1 || devices > kMaxCpuDevices || !(flops_per_s > 0) || !std::isfinite(flops_per_s)) {
    throw InputError("cpu-" + std::to_string(devices), 0, "cluster", "expected 1 to " + std::to_string(kMaxCpuDevices) +
                     " devices at a positive, finite speed");
  }
  char speed[64];
  std::snprintf(speed, sizeof speed, "%.17g FLOP/s", flops_per_s);
  const std::string n = std::to_string(devices);
  const std::string yaml = "name: cpu-" + n + "\ndescription: " + n + (devices == 1 ? " CPU device" : " CPU devices") +
                           " of this host (threads of one process) for the executor's CPU back end\n"
                           "gpu_types:\n  - {name: CPU, description: a CPU device running OpenBLAS sgemm on one thread, fp16: " +
                           speed + ", fp32: " + speed + ", bf16: " + speed +
                           ", memory: 16 GiB, memory_bandwidth: 20 GB/s, link: pcie, link_bandwidth: 10 GB/s}\n"
                           "fabric: {kind: switch, latency: 1 us}\n"
                           "nodes:\n  - {name: host, gpu: CPU, gpus: " + n +
                           ", intra: {kind: pcie, bandwidth: 10 GB/s, latency: 1 us}, nic: {count: 1, bandwidth: 10 GB/s, latency: 1 us}"
                           // Its host is the same memory and cores: an offloaded step runs on one thread
                           // as a device's would, and a copy is a copy within the memory all devices share.
                           ", host: {memory: 64 GiB, pcie: 20 GB/s, pcie_latency: 1 us, gpus_per_bridge: " + n +
                           ", cpu_flops: " + speed + ", cpu_memory_bandwidth: 20 GB/s}}\n";
  return parse_cluster(yaml, "<built-in cluster cpu-" + n + ">");
}

std::string one_node_cluster_yaml(const GpuSpec& gpu, int gpus, const std::string& name, const std::string& comment) {
  std::string intra = "{kind: " + std::string(to_string(gpu.usual_link));
  if (gpu.usual_link_bandwidth_bytes_per_s > 0) {
    char bandwidth[64];
    std::snprintf(bandwidth, sizeof bandwidth, "%.17g B/s", gpu.usual_link_bandwidth_bytes_per_s);
    intra += std::string(", bandwidth: ") + bandwidth;
  }
  intra += "}";
  std::string line = comment;
  std::replace(line.begin(), line.end(), '\n', ' ');
  return "# " + line + "\nname: " + name + "\nnodes:\n  - {name: host, gpu: " + gpu.name +
         ", gpus: " + std::to_string(gpus) + ", intra: " + intra + "}\n";
}

Cluster builtin_cluster(std::string_view name) {
  if (const int n = cpu_cluster_devices(name); n > 0) return cpu_cluster(n);
  if (const int n = selene_cluster_nodes(name); n > 0) return selene_cluster(n);
  for (const Preset& p : kPresets) {
    if (name == p.name) return parse_cluster(p.yaml, std::string("<built-in cluster ") + p.name + ">");
  }
  std::vector<std::string> names;
  for (const Preset& p : kPresets) names.push_back(p.name);
  std::string hint;
  for (const std::string& n : nearest_names(name, names)) hint += (hint.empty() ? "" : ", ") + n;
  throw InputError(std::string(name), 0, "cluster",
                   "not a built-in cluster nor a readable file; nearest built-in: " + hint);
}

std::string default_cluster_name() { return kPresets[0].name; }
std::string default_model_name() { return "gpt2-xl"; }

}  // namespace hetflow::model
