#pragma once
// The SimGrid platform of a cluster, as plain data: hosts, links and zones with their
// routes. Built from a model::Cluster without SimGrid, so it can be tested, written as a
// platform XML file, and instantiated in a simulation from the same description.
//
// Shape (one region; several regions add a Full root zone joining region zones by WAN links):
//   region zone (star) ── node zones (full): between two GPUs, their split-duplex links to
//        │                the node fabric (NVLink/NVSwitch/PCIe), plus the shared PCIe uplink
//        │                where the node has one; to the node's gateway, the GPU's link and
//        │                its rail's NIC (GPU i uses NIC i mod count, as rail-optimised
//        │                nodes do, so one flow never gets more than one NIC)
//        └─ a node zone's route in its parent star: nothing (the switch is non-blocking)
//   fat tree: region zone (star) ── leaf zones (star) ── node zones; a leaf's route in the
//           region is its oversubscribed uplink.
// Every link is split-duplex. A switch is not a link: its latency is carried by the links
// that reach it (half on each NIC, one on each leaf uplink, half on each region's gateway
// link), so every route's latency equals partition::CostModel::route() and flows meet in
// SimGrid's max-min system only where they really share bandwidth.
// A zone of zones keeps its gateway router in a child zone of its own with an empty route.
#include <string>
#include <vector>

#include "model/cluster.hpp"

namespace hetflow::sim {

struct LinkSpec {
  std::string name;                  // "gpu:<device>", "pcie-uplink:<node>", "nic:<node>[.<rail>]",
                                     // "uplink:leaf:<region>.<i>", "gateway:<region>", "wan:<a>-<b>"
  double bandwidth_bytes_per_s = 0;
  double latency_s = 0;              // each direction
  std::string link_class;            // pcie, nvlink, nvswitch, nic, fabric, wan
  int zone = -1;                     // the zone whose routes use it (where it is created)
  bool operator==(const LinkSpec&) const = default;
};

struct Hop {
  int link = -1;
  bool up = true;  // direction on the split-duplex link: up = away from the member
  bool operator==(const Hop&) const = default;
};

// A member of a star zone (a host or a child zone) and its route "to anyone".
struct StarRoute {
  bool is_zone = false;
  int member = -1;  // host index or zone index
  std::vector<Hop> hops;
  bool operator==(const StarRoute&) const = default;
};

// A route inside a Full node zone, between two of its hosts or a host and the zone's router.
struct PairRoute {
  int from = -1, to = -1;  // host index, or -1 for the zone's router
  std::vector<Hop> hops;
  bool operator==(const PairRoute&) const = default;
};

// A route between two child zones of a Full zone (regions joined by WAN links).
struct ZoneRoute {
  int from_zone = -1, to_zone = -1;
  std::vector<Hop> hops;
  bool operator==(const ZoneRoute&) const = default;
};

struct ZoneSpec {
  std::string name;
  bool full = false;   // Full routing (region level) instead of Star
  int parent = -1;     // -1 for the root
  std::string router;  // a router created in this zone ("" = none)
  std::string gateway; // the router through which the parent routes to this zone
  std::vector<int> hosts;
  std::vector<StarRoute> star_routes;
  std::vector<PairRoute> pair_routes;  // Full node zones
  std::vector<ZoneRoute> zone_routes;  // Full zones of zones (regions)
  bool operator==(const ZoneSpec&) const = default;
};

struct HostSpec {
  std::string name;   // the device name, e.g. "v100-0/gpu3"
  double speed_flops_per_s = 0;
  int zone = -1;
  int node = -1;
  bool operator==(const HostSpec&) const = default;
};

struct PlatformSpec {
  std::vector<HostSpec> hosts;  // index = device id
  std::vector<LinkSpec> links;
  std::vector<ZoneSpec> zones;  // parents before children; zones[0] is the root
  // The shared file system's read rate (model::InputPath); 0: none is modelled. Not part of
  // the platform's XML: like the timer, a host of its own that no route reaches.
  double storage_read_bytes_per_s = 0;
  // Each node's loader (the same model): its read bandwidth from storage and the samples its
  // workers preprocess per second; 0: unbounded. Hosts of their own, like the file system's.
  double node_read_bytes_per_s = 0;
  double node_loader_samples_per_s = 0;
  // Offload (partition::Offload): each node's host (model::Cluster::host) and each device's
  // PCIe bridge within its node (local rank / gpus_per_bridge). Hosts of their own, made
  // where `offload` is set (a plan that offloads): the node's CPUs and each bridge's two
  // directions.
  bool offload = false;
  std::vector<model::NodeHost> node_hosts;  // index = node
  std::vector<int> bridge;                  // index = device id
  int link_index(const std::string& name) const;  // -1 when unknown
  bool operator==(const PlatformSpec&) const = default;
};

// Host speeds are `speed_flops_per_s[device]` (the simulator uses nominal speeds and sizes
// each execution from the cost model's duration, so stragglers scale it).
PlatformSpec platform_spec(const model::Cluster& cluster, const std::vector<double>& speed_flops_per_s);

// SimGrid platform XML (DTD 4.1) describing the same platform.
std::string platform_xml(const PlatformSpec& spec);

}  // namespace hetflow::sim
