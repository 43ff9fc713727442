#pragma once
// The analytic cost model: how long a compute task, a transfer or a collective takes on a
// cluster with no contention, and what each device's memory holds. Used by the policies
// (to balance stages), by the analytic estimate and by validation.
#include <array>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "model/calibration.hpp"
#include "model/cluster.hpp"
#include "model/network.hpp"
#include "partition/collective.hpp"
#include "partition/expert_shard.hpp"
#include "partition/layout.hpp"
#include "partition/memory.hpp"
#include "partition/plan.hpp"

namespace hetflow::partition {

// A route between two devices, reduced to what the no-contention model needs: the slowest
// link class it crosses and the sum of latencies along it. The path is the one the simulator's
// platform builds (sim/platform_spec.hpp): GPU link, PCIe uplink, NIC (one NIC per flow),
// switch hops (one per switch; a fat tree adds leaf uplinks and the spine), WAN links.
struct Route {
  double bandwidth_bytes_per_s = 0;  // of the slowest link on the way
  double latency_s = 0;              // summed over the links and switch hops
  std::string_view bottleneck;       // link class of the slowest link: pcie, nvlink, nic, wan... (static text)
};

// The bandwidths a collective's or a transfer's point-to-point steps get where concurrent flows
// share links (partition/link_sharing.hpp): per (src, dst), the bandwidth that flow gets in
// place of its route's. A pair not listed keeps its route's.
struct EdgeBandwidths {
  std::vector<std::pair<std::pair<int, int>, double>> of_edge;  // ((src, dst), bytes per second)
  double of(int src, int dst, double route_bytes_per_s) const;
};

class CostModel {
 public:
  CostModel(const model::Cluster& cluster, model::Precision precision, model::Calibration calibration = {});

  // time = overhead + max(flops / (peak * efficiency(flops)), memory_bytes / memory_bandwidth):
  // a roofline with a fixed per-task cost, both from the calibration of the device's GPU type
  // and the task's kind (model/calibration.hpp documents the curve and the defaults).
  double compute_time_s(int device, TaskKind kind, double flops, double memory_bytes = 0) const;
  // A memory-bound kernel moving `bytes` on the device (a collective member's own read before
  // its messages, Task::memory_bytes: the gradient norm's sum of squares): the calibration's
  // "memory" operation cost at the GPU's bandwidth, no task overhead. 0 for no bytes.
  double memory_op_time_s(int device, double bytes) const;
  // A compute task of `plan` (forward, backward, W, optimizer). When the calibration gives
  // operation costs for the device's GPU type (GpuEfficiency::ops) and the network is a
  // decoder with operations (partition/layer_ops.hpp), the sum over its layers of their
  // operations' times (a backward: its data and weight gradients, or the data alone when
  // the schedule splits off W; plus the forward it recomputes), with the task kind's overhead
  // and the type's dispatch; otherwise compute_time_s of its FLOPs and memory bytes.
  double task_compute_time_s(const Plan& plan, const Task& task) const;
  // The same for a task of a plan not built yet: what it reads of the plan is its network
  // and its layout (the search's bounds).
  double task_compute_time_s(const model::Network& network, const Layout& layout, const Task& task) const;
  // The same time in parts that add up to it: one per operation name ("qkv", "softmax", ...,
  // every pass of it, recomputation included) and "overhead" (the kind's overhead and
  // the dispatch) when the operation costs apply; else one part named after the task's kind
  // ("forward", "optimizer", ...).
  std::vector<std::pair<std::string, double>> task_compute_parts_s(const Plan& plan, const Task& task) const;
  std::vector<std::pair<std::string, double>> task_compute_parts_s(const model::Network& network, const Layout& layout,
                                                                   const Task& task) const;
  Route route(int src, int dst) const;
  // The classes of the links a transfer from src to dst crosses, in order (for traffic
  // accounting): e.g. {"nvlink", "pcie", "nic", "fabric", "nic", "pcie", "nvlink"}.
  std::vector<std::string> link_classes(int src, int dst) const;
  double transfer_time_s(int src, int dst, double bytes) const;
  // The same with the flow's bandwidth from `shared` (null: alone on its route).
  double transfer_time_s(int src, int dst, double bytes, const EdgeBandwidths* shared) const;
  // Offload (model::NodeHost of the device's node): a copy of `bytes` between the device and
  // its host memory, alone on its PCIe bridge (latency + bytes / bandwidth); and an optimizer
  // step on the node's CPUs, alone on them: the slower of its FLOPs at the CPUs' peak and its
  // host-memory traffic at their DRAM bandwidth (a roofline).
  double host_copy_time_s(int device, double bytes) const;
  double host_step_time_s(int device, double flops, double memory_bytes) const;
  // The links a flow from src to dst crosses, as the simulator's platform routes it
  // (sim/platform_spec.hpp): each one direction of a split-duplex link, as a dense id (2 x
  // link + 0 going away from the device's side, 1 coming back): its GPU link, its node's PCIe
  // host bridge, the NIC of its rail, fat-tree leaf uplinks, WAN links, and the same down to
  // dst. Links of unlimited bandwidth (an unlimited node fabric, switches) are left out: they
  // share nothing. Appends to `out`.
  void route_links(int src, int dst, std::vector<int>& out) const;
  // The bandwidth of one direction of a link route_links names.
  double link_bandwidth_bytes_per_s(int link) const { return link_bandwidth_[static_cast<size_t>(link / 2)]; }
  // A lone collective's time with no contention, on the participants' real routes, following
  // the steps every back end runs (partition/collective_steps.hpp). A step of x bytes over a
  // set of hops takes the slowest hop's latency + x / bandwidth. n = members, S = bytes,
  // K = kPipelineChunks; the second line of each is its value on a flat network (every route
  // latency a, bandwidth B).
  // With m messages, m times the time of one of S/m bytes.
  //   all_reduce      ring:          2(n-1) steps of S/n between ring neighbours
  //                                  = 2(n-1) a + 2(n-1)/n S/B
  //                   tree:          reduce then broadcast down a binary tree, pipelined, at
  //                                  the slowest tree edge's a and B: 2 ceil(log2 n) a + 2 S/B
  //                                  (NCCL's double-tree bound; the single tree's steps, a
  //                                  parent's children sharing its link, simulate 2-4x slower
  //                                  for n = 3..8 on a flat network)
  //                   hierarchical:  intra-node ring reduce-scatter (k-1 steps of S/k on the
  //                                  slowest node), inter-node ring all-reduce among each local
  //                                  index's peers (2(m-1) steps of S/(k m)), intra-node ring
  //                                  all-gather; k = most members on a node, m = nodes
  //   reduce_scatter  ring:          n-1 steps of S/n = (n-1) a + (n-1)/n S/B
  //   all_gather      hierarchical:  one intra-node ring (k-1 steps of S/k) and one inter-node
  //                                  ring (m-1 steps of S/(k m)), in either order
  //   broadcast       ring:          a chain of n-1 hops (broadcast from the root, reduce from its
  //   reduce                         successor to the root) that K chunks cross one hop a step:
  //                                  n-2+K steps of S/K = (n-2+K) (a + S/(K B))
  //                   tree:          the same pipeline over a binary tree of depth D = floor(log2 n):
  //                                  D+K-1 steps, where a hop from a parent with f children
  //                                  carries f S/K (its children share its link) and one step
  //                                  (a broadcast's last, a reduce's first) only involves the
  //                                  deepest level
  //                                  = (D+K-2) (a + 2S/(K B)) + (a + f S/(K B)) for n >= 3,
  //                                  f = 1 when n is a power of two (the deepest level is one
  //                                  lone child), else 2; K (a + S/(K B)) for n = 2
  //   all_to_all      pairwise:      every pair's part at once: the slowest route's latency +
  //                                  the busiest link's bytes over its bandwidth (no less than
  //                                  any pair's bytes over its route's)
  //                                  = a + (n-1)/n S/B (each member's link carries what it sends)
  //                   hierarchical:  its phases so, one after the other: inside each node (each
  //                                  member m parts to each of its k-1 neighbours), then across
  //                                  (k parts to each of its m-1 peers); pairwise where the
  //                                  members are not node by node, k on each
  // Broadcast trees match the simulator on a flat network; a reduce tree whose leaves sit at
  // different depths gets its shallow leaves' chunks in earlier, so there this is an upper
  // bound (10-20 % above the simulated time for n = 4..9).
  // Throws hetflow::Error for a collective check_collective() refuses.
  double collective_time_s(const CollectiveSpec& c) const { return collective_time_s(c, nullptr); }
  // The same where its steps' flows share links with others: each step between two members
  // at the bandwidth `shared` gives that pair (null: alone).
  double collective_time_s(const CollectiveSpec& c, const EdgeBandwidths* shared) const;

  double peak_flops_per_s(int device) const;
  double memory_capacity_bytes(int device) const;
  int node_of(int device) const { return device_node_[static_cast<size_t>(device)]; }
  int device_count() const { return static_cast<int>(device_node_.size()); }
  // The cluster as modelled: its links scaled by the calibration (model::apply_link_calibration).
  const model::Cluster& cluster() const { return cluster_; }
  // This model of the cluster with a data loader that limits nothing (no input path): what
  // the GPUs alone would do, where an estimate takes the loader as a floor.
  CostModel without_input() const;

  // Free communication (every transfer and collective takes zero time): for tests against
  // closed-form pipeline results.
  void set_free_communication(bool free) { free_communication_ = free; }
  // A straggler: the device's compute takes `factor` times longer (what-if analyses, and the
  // oracle for the simulator's stragglers).
  void set_slowdown(int device, double factor);
  // Whether two devices' compute takes the same time (one GPU type, one slowdown).
  bool same_compute(int a, int b) const;

 private:
  // A route with the bandwidth `shared` gives the pair.
  Route edge(int src, int dst, const EdgeBandwidths* shared) const;
  double ring_time_s(const std::vector<int>& ring, double bytes_per_step, int steps, const EdgeBandwidths* shared) const;
  // A ring reduce-scatter or all-gather of uneven parts (CollectiveSpec::parts).
  double uneven_ring_time_s(const CollectiveSpec& c, const EdgeBandwidths* shared) const;
  double hierarchical_time_s(const CollectiveSpec& c, const EdgeBandwidths* shared) const;
  double chain_time_s(const CollectiveSpec& c, const EdgeBandwidths* shared) const;
  double tree_time_s(const CollectiveSpec& c, const EdgeBandwidths* shared) const;
  double all_to_all_time_s(const CollectiveSpec& c, const EdgeBandwidths* shared) const;

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
  // The links of route_links, numbered GPU links (one per device), host bridges (one per
  // node), NICs (per node, its rails), fat-tree leaf uplinks, WAN links; 0 = unlimited.
  std::vector<double> link_bandwidth_;
  std::vector<int> device_local_;     // per device: its index inside its node
  std::vector<int> node_nic_link_;    // per node: its first NIC's link
  std::vector<int> node_leaf_link_;   // per node: its leaf's uplink (fat trees), else -1
  int wan_link_ = 0;                  // the first WAN link
  std::vector<std::vector<std::vector<int>>> region_hops_;  // per region pair: its WAN route's directed links
  bool free_communication_ = false;
  std::vector<double> slowdown_;  // per device, 1 = nominal
  // Per GPU type, the calibration's terms for the compute kinds (forward, backward,
  // backward_weight, optimizer) resolved once: compute_time_s runs millions of times in a search.
  struct ComputeTerms {
    double peak_flops_per_s = 0, memory_bandwidth_bytes_per_s = 0, dispatch_s = 0;
    std::array<model::Efficiency, 4> of_kind;
  };
  std::vector<ComputeTerms> terms_;
  std::vector<int> device_terms_;  // per device: index into terms_
  // Operation times of one layer kind's passes, per GPU type and tensor-parallel degree:
  // (GPU, layer kind, the layer for a CNN's, -2 for a decoder's MoE layers or -1, what,
  // micro-batch, tensor, sequence parallel, kernel options as bits, context, experts held,
  // expert load) -> seconds. A decoder's dense and MoE layers of one kind have one architecture
  // each, so a plan needs a handful of entries however large; a CNN's one per layer.
  struct OpCache {
    std::mutex mutex;
    std::map<std::tuple<const model::GpuSpec*, std::string, int, int, int, int, bool, int, int, int, double>, double> seconds;
    OpCache() = default;
    OpCache(const OpCache&) {}  // a copy starts empty: its entries are recomputed on demand
    OpCache& operator=(const OpCache&) { return *this; }
  };
  mutable OpCache op_cache_;
  // What a task's device computes of its layers: its rank's tensor-parallel degree and its
  // worker's share of every MoE layer's experts.
  struct TaskShape {
    int tensor = 1;
    ExpertShare experts;
  };
  double layer_ops_time_s(const model::Network& network, const Layout& layout, const model::GpuSpec& gpu, int layer, int what,
                          const TaskShape& shape) const;
  // Calls part(name, seconds) for each operation of `what` of `layer` (no slowdown, no overhead).
  template <class Part>
  void for_each_layer_op(const model::Network& network, const Layout& layout, const model::GpuSpec& gpu, int layer, int what,
                         const TaskShape& shape, Part part) const;
  // The layers' passes a layered task computes (What values), or none when the operation
  // costs do not apply to it; what its device computes of them in *shape.
  std::vector<int> task_passes(const model::Network& network, const Layout& layout, const Task& task, TaskShape* shape) const;
  // The expert split of a layout's experts for a network, computed once per distinct one
  // (a search asks for thousands of tasks' shares of a few layouts).
  struct SplitCache {
    std::mutex mutex;
    std::vector<std::pair<std::tuple<Experts, int, double, int>, ExpertSplit>> splits;
    SplitCache() = default;
    SplitCache(const SplitCache&) {}
    SplitCache& operator=(const SplitCache&) { return *this; }
  };
  mutable SplitCache split_cache_;
  ExpertShare task_expert_share(const model::Network& network, const Layout& layout, int worker) const;
};

}  // namespace hetflow::partition
