#pragma once
// The analytic cost model: how long a compute task, a transfer or a collective takes on a
// cluster with no contention, and what each device's memory holds. Used by the policies
// (to balance stages), by the analytic estimate and by validation.
#include <string>
#include <vector>

#include "model/calibration.hpp"
#include "model/cluster.hpp"
#include "model/network.hpp"
#include "partition/layout.hpp"
#include "partition/plan.hpp"

namespace hetflow::partition {

// A route between two devices, reduced to what the no-contention model needs: the slowest
// link class it crosses and the sum of latencies along it. The path is the one the simulator's
// platform builds (sim/platform_spec.hpp): GPU link, PCIe uplink, NIC (one NIC per flow),
// switch hops (one per switch; a fat tree adds leaf uplinks and the spine), WAN links.
struct Route {
  double bandwidth_bytes_per_s = 0;  // of the slowest link on the way
  double latency_s = 0;              // summed over the links and switch hops
  std::string bottleneck;            // link class of the slowest link: pcie, nvlink, nic, wan...
};

class CostModel {
 public:
  CostModel(const model::Cluster& cluster, model::Precision precision, model::Calibration calibration = {});

  // time = overhead + max(flops / (peak * max_efficiency), memory_bytes / memory_bandwidth):
  // a roofline with a fixed per-task cost (model/calibration.hpp documents the defaults).
  double compute_time_s(int device, double flops, double memory_bytes = 0) const;
  Route route(int src, int dst) const;
  // The classes of the links a transfer from src to dst crosses, in order (for traffic
  // accounting): e.g. {"nvlink", "pcie", "nic", "fabric", "nic", "pcie", "nvlink"}.
  std::vector<std::string> link_classes(int src, int dst) const;
  double transfer_time_s(int src, int dst, double bytes) const;
  // Closed forms with no contention, on the participants' real routes:
  //   ring:          2(n-1) steps of max over ring neighbours (latency + bytes/(n * bandwidth))
  //                  = 2(n-1)/n * S/B + 2(n-1) a on a flat network
  //   tree:          reduce then broadcast down a binary tree, pipelined:
  //                  2 ceil(log2 n) a + 2 S/B with the slowest route's a and B
  //   hierarchical:  intra-node ring reduce-scatter, inter-node ring all-reduce of S/k among
  //                  the k local ranks' peers in parallel, intra-node ring all-gather
  double allreduce_time_s(const std::vector<int>& devices, double bytes, CollectiveAlgorithm algorithm) const;

  double peak_flops_per_s(int device) const;
  double memory_capacity_bytes(int device) const;
  int node_of(int device) const { return device_node_[static_cast<size_t>(device)]; }
  int device_count() const { return static_cast<int>(device_node_.size()); }
  const model::Cluster& cluster() const { return cluster_; }

  // Free communication (every transfer and collective takes zero time): for tests against
  // closed-form pipeline results.
  void set_free_communication(bool free) { free_communication_ = free; }
  // A straggler: the device's compute takes `factor` times longer (what-if analyses, and the
  // oracle for the simulator's stragglers).
  void set_slowdown(int device, double factor);

 private:
  double ring_time_s(const std::vector<int>& ring, double bytes_per_step, int steps) const;

  model::Cluster cluster_;
  model::Precision precision_;
  model::Calibration calibration_;
  std::vector<int> device_node_;
  std::vector<const model::GpuSpec*> device_gpu_;
  std::vector<int> node_region_;
  std::vector<int> node_leaf_;                  // fat trees: leaf index of each node in its region
  std::vector<double> node_leaf_uplink_;        // fat trees: its leaf's uplink bandwidth
  // WAN routes between regions: widest-then-shortest path bandwidth and latency.
  std::vector<std::vector<Route>> region_route_;
  bool free_communication_ = false;
  std::vector<double> slowdown_;  // per device, 1 = nominal
};

// Memory of one device that runs the given chunks. in_flight[c] is the peak number of
// micro-batches whose activations chunk c holds (from the schedule); hosts_optimizer says
// whether the optimizer state lives here (all-reduce) or on parameter servers.
DeviceMemory device_memory(const model::Network& network, const Layout& layout,
                           const std::vector<Stage>& chunks, const std::vector<int>& in_flight,
                           bool hosts_optimizer, double capacity_bytes);

// Bytes one layer keeps per micro-batch for backward under the layout's recomputation,
// tensor and sequence parallelism (Korthikanti et al. 2022, section 4).
double stashed_bytes_per_microbatch(const model::Layer& layer, const model::Network& network,
                                    const Layout& layout);

// Parameters of layers [begin, end) held by one device of a tensor-parallel group.
double params_per_device(const model::Network& network, int begin, int end, int tensor);

}  // namespace hetflow::partition
