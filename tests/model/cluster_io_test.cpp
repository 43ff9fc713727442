// Cluster descriptions: presets, the YAML format, and its lossless round trip.
#include <gtest/gtest.h>

#include "model/error.hpp"
#include "model/io.hpp"

using namespace hetflow::model;

TEST(ClusterIo, EveryPresetRoundTrips) {
  for (const ClusterPreset& p : cluster_presets()) {
    const Cluster c = builtin_cluster(p.name);
    const std::string yaml = write_cluster(c);
    EXPECT_EQ(parse_cluster(yaml, "roundtrip.yaml"), c) << p.name << "\n" << yaml;
  }
}

// A machine's own GPUs as a cluster (hetflow-gpu-probe cluster): for every catalog part, one
// node of that many of it on the part's usual interconnect, which hetflow reads back.
TEST(ClusterIo, OneNodeOfACatalogPartReadsBack) {
  for (const GpuSpec& gpu : builtin_gpus()) {
    const Cluster c = parse_cluster(one_node_cluster_yaml(gpu, 4, "this-machine", "found\nhere"), "m.yaml");
    ASSERT_EQ(c.nodes.size(), 1u) << gpu.name;
    const Node& node = c.nodes.front();
    EXPECT_EQ(c.name, "this-machine");
    EXPECT_EQ(node.gpu, gpu.name);
    EXPECT_EQ(node.gpu_count, 4);
    EXPECT_EQ(node.intra.kind, gpu.usual_link) << gpu.name;
    if (gpu.usual_link_bandwidth_bytes_per_s > 0) {
      EXPECT_DOUBLE_EQ(node.intra.bandwidth_bytes_per_s, gpu.usual_link_bandwidth_bytes_per_s) << gpu.name;
    }
    EXPECT_DOUBLE_EQ(c.device_gpu(c.devices().front()).peak_flops_per_s(Precision::bf16),
                     gpu.peak_flops_per_s(Precision::bf16));
  }
}

TEST(ClusterIo, PresetsHaveTheDocumentedShape) {
  const Cluster hetpipe = builtin_cluster("hetpipe-testbed");
  EXPECT_EQ(hetpipe.device_count(), 16);
  ASSERT_EQ(hetpipe.nodes.size(), 4u);
  EXPECT_EQ(hetpipe.nodes[0].gpu, "TITAN-V");
  EXPECT_EQ(hetpipe.nodes[3].gpu, "Quadro-P4000");
  EXPECT_DOUBLE_EQ(hetpipe.nodes[0].nic.bandwidth_bytes_per_s, 56e9 / 8);
  EXPECT_EQ(hetpipe.nodes[0].intra.kind, LinkKind::pcie);

  const Cluster dgx = builtin_cluster("dgx-a100-x4");
  EXPECT_EQ(dgx.device_count(), 32);
  EXPECT_EQ(dgx.nodes[0].nic.count, 8);
  EXPECT_DOUBLE_EQ(dgx.nodes[0].intra.bandwidth_bytes_per_s * 2, 600e9);  // bidirectional figure

  const Cluster two = builtin_cluster("two-region");
  EXPECT_EQ(two.regions.size(), 2u);
  EXPECT_EQ(two.wan.size(), 1u);
  EXPECT_EQ(two.nodes.back().region, "eu-west");
  EXPECT_EQ(builtin_cluster(default_cluster_name()).name, default_cluster_name());
}

TEST(ClusterIo, CustomGpuTypesFatTreeAndJsonRoundTrip) {
  const std::string json = R"({
    "name": "lab", "description": "custom parts",
    "gpu_types": [{"name": "Blackwell-X", "fp16": "2 PFLOP/s", "bf16": "2 PFLOP/s", "fp32": "80 TFLOP/s",
                   "memory": "192 GiB", "memory_bandwidth": "8 TB/s", "link": "nvswitch", "link_bandwidth": "900 GB/s"}],
    "fabric": {"kind": "fat-tree", "nodes_per_leaf": 2, "oversubscription": 3, "latency": "600 ns"},
    "nodes": [{"name": "bx", "count": 3, "gpu": "Blackwell-X", "gpus": 8,
               "nic": {"count": 8, "bandwidth": "800 Gb/s", "latency": "1 us"}},
              {"name": "old", "gpu": "v100-32", "gpus": 2, "nic": {"bandwidth": "10 Gb/s"}}]})";
  const Cluster c = parse_cluster(json, "lab.json");
  EXPECT_EQ(c.nodes.size(), 4u);
  EXPECT_EQ(c.nodes[2].name, "bx-2");
  EXPECT_EQ(c.nodes[3].gpu, "V100-32");  // canonical spelling of a case-insensitive match
  EXPECT_EQ(c.nodes[0].intra.kind, LinkKind::nvswitch);  // default: the GPU type's usual link
  EXPECT_DOUBLE_EQ(c.nodes[0].intra.bandwidth_bytes_per_s, 900e9);
  EXPECT_EQ(c.regions[0].fabric.kind, FabricKind::fat_tree);
  EXPECT_DOUBLE_EQ(c.regions[0].fabric.oversubscription, 3);
  EXPECT_DOUBLE_EQ(c.gpu("Blackwell-X").peak_flops_per_s(Precision::bf16), 2e15);
  EXPECT_EQ(c.device_count(), 26);
  EXPECT_EQ(parse_cluster(write_cluster(c), "again.yaml"), c);
}

TEST(ClusterIo, DevicesAreNumberedInNodeOrder) {
  const Cluster c = builtin_cluster("mixed-academic");
  const auto devices = c.devices();
  ASSERT_EQ(devices.size(), 20u);
  EXPECT_EQ(devices[0].name, "v100-0/gpu0");
  EXPECT_EQ(devices[4].node, 1);
  EXPECT_EQ(devices[19].local_rank, 7);
  EXPECT_EQ(c.device_gpu(devices[19]).name, "RTX-3090");
}

TEST(ClusterIo, BandwidthOfBf16FallsBackToFp32OnVolta) {
  const GpuSpec* v100 = find_builtin_gpu("v100-16");
  ASSERT_NE(v100, nullptr);
  EXPECT_DOUBLE_EQ(v100->peak_flops_per_s(Precision::bf16), v100->fp32_flops_per_s);
  EXPECT_DOUBLE_EQ(v100->peak_flops_per_s(Precision::fp16), 125e12);
}

// selene-N: the cluster of Narayanan et al.'s measurements, as their section 5.1 describes it.
TEST(ClusterPresets, SeleneNodesAreDgxA100WithEightHdrNics) {
  const hetflow::model::Cluster c = hetflow::model::load_cluster("selene-48");
  EXPECT_EQ(c.devices().size(), 384u);
  ASSERT_EQ(c.nodes.size(), 48u);
  EXPECT_EQ(c.nodes[0].gpu, "A100-80");
  EXPECT_EQ(c.nodes[0].nic.count, 8);
  EXPECT_DOUBLE_EQ(c.nodes[0].nic.bandwidth_bytes_per_s, 200e9 / 8);
  EXPECT_DOUBLE_EQ(c.nodes[0].intra.bandwidth_bytes_per_s, 300e9);
  EXPECT_THROW(hetflow::model::load_cluster("selene-561"), hetflow::InputError);
  EXPECT_THROW(hetflow::model::load_cluster("selene-0"), hetflow::InputError);
}

TEST(ClusterIo, PricesPerGpuHourReadWriteAndSayWhenMissing) {
  const Cluster c = parse_cluster("name: rented\nnodes:\n"
                                  "  - {name: a, count: 2, gpu: A100-80, gpus: 8, nic: {count: 8, bandwidth: 200 Gb/s}, price: 2.1 USD/h}\n"
                                  "  - {name: t, gpu: T4, gpus: 4, nic: {bandwidth: 25 Gb/s}, price: 0.35}\n",
                                  "rented.yaml");
  EXPECT_DOUBLE_EQ(c.nodes[1].price_usd_per_gpu_hour, 2.1);
  EXPECT_DOUBLE_EQ(c.nodes[2].price_usd_per_gpu_hour, 0.35);  // a plain number is USD/h
  EXPECT_TRUE(c.priced());
  EXPECT_EQ(parse_cluster(write_cluster(c), "again.yaml"), c);
  EXPECT_FALSE(load_cluster("hetpipe-testbed").priced());
  try {
    parse_cluster("name: x\nnodes:\n  - {name: a, gpu: T4, gpus: 1, price: 3 EUR/h}\n", "x.yaml");
    FAIL() << "a price in euros was accepted";
  } catch (const hetflow::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("price"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("USD/h"), std::string::npos) << e.what();
  }
}

// A node's host (offload's memory, PCIe bridges and CPUs): what the file gives, the GPU
// type's usual host for the rest, and only the given figures written back.
TEST(ClusterIo, ANodesHostReadsBackAndFillsWhatTheFileLeavesOut) {
  const Cluster c = parse_cluster("name: hosts\nnodes:\n"
                                  "  - {name: v, gpu: V100-16, gpus: 8, nic: {bandwidth: 25 Gb/s}, "
                                  "host: {memory: 256 GiB, pcie: 12 GB/s, gpus_per_bridge: 4}}\n"
                                  "  - {name: h, gpu: H100-SXM, gpus: 8, nic: {count: 8, bandwidth: 400 Gb/s}}\n",
                                  "hosts.yaml");
  EXPECT_EQ(parse_cluster(write_cluster(c), "again.yaml"), c);
  const NodeHost v = c.host(0);
  EXPECT_DOUBLE_EQ(v.memory_bytes, 256.0 * (1 << 30));
  EXPECT_DOUBLE_EQ(v.pcie_bytes_per_s, 12e9);
  EXPECT_EQ(v.gpus_per_bridge, 4);
  // The rest is DGX-1's: 2 x 20 cores x 2.2 GHz x 32 fp32 FLOP per cycle (AVX2, two FMA
  // units); 2 sockets x 4 channels x 2133 MT/s x 8 bytes.
  EXPECT_DOUBLE_EQ(v.cpu_flops_per_s, 2 * 20 * 2.2e9 * 32);
  EXPECT_DOUBLE_EQ(v.cpu_memory_bytes_per_s, 2 * 4 * 2133e6 * 8);
  EXPECT_DOUBLE_EQ(v.pcie_latency_s, 10e-6);
  // DGX H100's whole: PCIe 5.0 x16 (32 GT/s x 16 lanes x 128/130 / 8 = 63 GB/s) less the
  // TLP overhead of 256-byte payloads (24 bytes each), two GPUs per switch, 2 TiB.
  const NodeHost h = c.host(1);
  EXPECT_NEAR(h.pcie_bytes_per_s, 63e9 * 256 / 280, 1);
  EXPECT_EQ(h.gpus_per_bridge, 2);
  EXPECT_DOUBLE_EQ(h.memory_bytes, 2048.0 * (1 << 30));
  EXPECT_EQ(c.nodes[1].host, NodeHost{});  // nothing given, nothing written
  const std::string written = write_cluster(c);
  EXPECT_EQ(written.find("host", written.find("name: h\n")), std::string::npos) << written;
  try {
    parse_cluster("name: x\nnodes:\n  - {name: a, gpu: T4, gpus: 1, host: {pcie: fast}}\n", "x.yaml");
    FAIL() << "a PCIe bandwidth of 'fast' was accepted";
  } catch (const hetflow::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("x.yaml"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("host.pcie"), std::string::npos) << e.what();
  }
  EXPECT_THROW(parse_cluster("name: x\nnodes:\n  - {name: a, gpu: T4, gpus: 1, host: {pci: 1 GB/s}}\n", "x.yaml"),
               hetflow::InputError);  // an unknown key, named with the nearest accepted
}
