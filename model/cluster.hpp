#pragma once
// A cluster: regions of nodes, each node a set of identical GPUs behind one intra-node
// fabric, NICs into the region's fabric (a switch or a two-level fat tree), and WAN links
// joining regions. Pure description: no routing, no behaviour beyond lookups.
#include <string>
#include <vector>

#include "model/gpu.hpp"
#include "model/node_host.hpp"

namespace hetflow::model {

// The fabric inside a node. Each GPU has a link of `bandwidth` to the node's fabric; on PCIe
// the GPUs also share the host bridge uplink (`uplink_bandwidth`, 0 = not shared).
struct IntraNodeLink {
  LinkKind kind = LinkKind::pcie;
  double bandwidth_bytes_per_s = 0;
  double latency_s = 0;
  double uplink_bandwidth_bytes_per_s = 0;
  bool operator==(const IntraNodeLink&) const = default;
};

// Network interfaces of a node into its region's fabric.
struct Nic {
  int count = 1;
  double bandwidth_bytes_per_s = 0;  // per NIC, one direction
  double latency_s = 0;
  bool operator==(const Nic&) const = default;
};

struct Node {
  std::string name;
  std::string region;  // name of a Region of the cluster
  std::string gpu;     // GPU type name (built-in catalog or the cluster's own gpu_types)
  int gpu_count = 0;
  IntraNodeLink intra;
  Nic nic;
  double price_usd_per_gpu_hour = 0;  // what one of its GPUs costs to rent per hour; 0: not given
  NodeHost host;  // as the file gives it (zeros: not given); Cluster::host resolves the rest
  bool operator==(const Node&) const = default;
};

enum class FabricKind { single_switch, fat_tree };

// How a region's nodes are connected. A single non-blocking switch, or a two-level fat tree:
// `nodes_per_leaf` nodes under each leaf switch, leaf uplinks oversubscribed by
// `oversubscription` (1 = full bisection bandwidth).
struct Fabric {
  FabricKind kind = FabricKind::single_switch;
  double latency_s = 0;  // per switch hop
  int nodes_per_leaf = 0;
  double oversubscription = 1;
  bool operator==(const Fabric&) const = default;
};

struct Region {
  std::string name;
  Fabric fabric;
  bool operator==(const Region&) const = default;
};

struct WanLink {
  std::string region_a, region_b;
  double bandwidth_bytes_per_s = 0;
  double latency_s = 0;
  bool operator==(const WanLink&) const = default;
};

// Where training samples come from before a step can use them: a shared file system all
// nodes read from, each node's own read path, and loader workers that decode, tokenise or
// augment on the host. A cluster without the section (`given` false) has an unbounded
// loader: no load tasks, every figure as without it.
struct InputPath {
  bool given = false;                  // the cluster file has an `input:` section
  double shared_read_bytes_per_s = 0;  // the shared file system, all nodes together; 0: unbounded
  double node_read_bytes_per_s = 0;    // one node's read bandwidth from storage; 0: unbounded
  double preprocess_s_per_sample = 0;  // host CPU seconds one loader worker spends on a sample
  int workers_per_node = 1;            // loader workers per node, each preprocessing its own samples
  int prefetch_batches = 2;            // micro-batches the loader may run ahead of the first forward
  bool operator==(const InputPath&) const = default;
};

// One GPU of the cluster, numbered densely in node order.
struct Device {
  int id = 0;
  int node = 0;        // index into Cluster::nodes
  int local_rank = 0;  // index inside its node
  std::string name;    // "<node>/gpu<local_rank>"
};

struct Cluster {
  std::string name;
  std::string description;
  std::vector<GpuSpec> gpu_types;  // the file's own GPU types, beside the built-in catalog
  std::vector<Region> regions;
  std::vector<Node> nodes;
  std::vector<WanLink> wan;
  InputPath input;  // the data loader's path; unbounded unless the file gives one

  // All devices in node order. Cheap; recomputed on each call.
  std::vector<Device> devices() const;
  int device_count() const;
  // The spec of a GPU type: the cluster's own types first, then the built-in catalog.
  // Throws hetflow::Error if the type is unknown (validate() reports it with a location).
  const GpuSpec& gpu(const std::string& type) const;
  const GpuSpec& device_gpu(const Device& d) const { return gpu(nodes.at(d.node).gpu); }
  // A node's host, its file's figures completed from its GPU type's usual host.
  NodeHost host(int node) const;
  // Whether every node has a price (the cost objective needs them all).
  bool priced() const;

  bool operator==(const Cluster&) const = default;
};

}  // namespace hetflow::model
