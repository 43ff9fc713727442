#include "sim/platform_spec.hpp"

#include <map>

#include "model/error.hpp"

namespace hetflow::sim {

namespace {

// The bandwidth of a link that only carries latency (or of an unlimited node fabric).
constexpr double kUnlimitedBandwidth = 1e18;

class SpecBuilder {
 public:
  SpecBuilder(const model::Cluster& cluster, const std::vector<double>& speeds) : cluster_(cluster), speeds_(speeds) {}

  PlatformSpec build() {
    const bool multi_region = cluster_.regions.size() > 1;
    int root = -1;
    if (multi_region) root = add_zone("cluster", true, -1);
    std::map<std::string, int> region_zone;
    for (const model::Region& r : cluster_.regions) {
      region_zone[r.name] = add_region(r, root);
    }
    if (multi_region) add_wan_routes(root, region_zone);
    return std::move(spec_);
  }

 private:
  int add_zone(const std::string& name, bool full, int parent) {
    ZoneSpec z;
    z.name = name;
    z.full = full;
    z.parent = parent;
    spec_.zones.push_back(z);
    return static_cast<int>(spec_.zones.size()) - 1;
  }

  int add_link(int zone, const std::string& name, double bandwidth, double latency, const std::string& cls) {
    spec_.links.push_back(LinkSpec{name, bandwidth, latency, cls, zone});
    return static_cast<int>(spec_.links.size()) - 1;
  }

  // A zone of zones reaches its parent through a router kept in a child zone of its own.
  // The route to it crosses nothing: switch latencies live on the links that reach a switch.
  void add_gateway_zone(int zone, const std::string& name) {
    const int gw = add_zone("gwzone:" + name, false, zone);
    spec_.zones[static_cast<size_t>(gw)].router = "gw:" + name;
    spec_.zones[static_cast<size_t>(gw)].gateway = "gw:" + name;
    spec_.zones[static_cast<size_t>(zone)].gateway = "gw:" + name;
    spec_.zones[static_cast<size_t>(zone)].star_routes.push_back(StarRoute{true, gw, {}});
  }

  // Switches are not links: a link every flow crosses would join all flows into one
  // max-min system, which SimGrid re-solves whole at every flow event (quadratic in the
  // number of concurrent flows). A non-blocking switch only adds latency, so it goes on the
  // links on either side: half on each NIC (one switch between two nodes), one on each
  // leaf uplink (leaf, spine, leaf between two leaves), half on each region's gateway link
  // (crossed on the way out of one region and into the other).
  int add_region(const model::Region& region, int root) {
    const int zone = add_zone("region:" + region.name, false, root);
    const model::Fabric& f = region.fabric;
    std::vector<size_t> nodes;
    for (size_t n = 0; n < cluster_.nodes.size(); ++n) {
      if (cluster_.nodes[n].region == region.name) nodes.push_back(n);
    }
    if (f.kind != model::FabricKind::fat_tree) {
      for (size_t n : nodes) add_node(n, zone, f.latency_s / 2);
    } else {
      const auto per_leaf = static_cast<size_t>(f.nodes_per_leaf);
      for (size_t first = 0; first < nodes.size(); first += per_leaf) {
        const std::string leaf_name = "leaf:" + region.name + "." + std::to_string(first / per_leaf);
        const int leaf = add_zone(leaf_name, false, zone);
        double leaf_nic_bandwidth = 0;
        for (size_t i = first; i < nodes.size() && i < first + per_leaf; ++i) {
          const model::Node& node = cluster_.nodes[nodes[i]];
          leaf_nic_bandwidth += node.nic.count * node.nic.bandwidth_bytes_per_s;
          add_node(nodes[i], leaf, f.latency_s / 2);
        }
        add_gateway_zone(leaf, leaf_name);
        const int uplink = add_link(zone, "uplink:" + leaf_name, leaf_nic_bandwidth / f.oversubscription, f.latency_s,
                                    "fabric");
        spec_.zones[static_cast<size_t>(zone)].star_routes.push_back(StarRoute{true, leaf, {Hop{uplink, true}}});
      }
    }
    if (root >= 0) {
      add_gateway_zone(zone, "region:" + region.name);
      region_gateway_[region.name] = add_link(root, "gateway:" + region.name, kUnlimitedBandwidth, f.latency_s / 2, "fabric");
    }
    return zone;
  }

  // `switch_latency_s`: the share of the switch's latency this node's NICs carry.
  void add_node(size_t n, int parent, double switch_latency_s) {
    const model::Node& node = cluster_.nodes[n];
    const int zone = add_zone("node:" + node.name, true, parent);
    spec_.zones[static_cast<size_t>(zone)].router = "gw:node:" + node.name;
    spec_.zones[static_cast<size_t>(zone)].gateway = "gw:node:" + node.name;
    int uplink = -1;
    if (node.intra.uplink_bandwidth_bytes_per_s > 0) {
      uplink = add_link(zone, "pcie-uplink:" + node.name, node.intra.uplink_bandwidth_bytes_per_s, 0, "pcie");
    }
    const double gpu_bandwidth = node.intra.bandwidth_bytes_per_s > 0 ? node.intra.bandwidth_bytes_per_s : kUnlimitedBandwidth;
    std::vector<int> nics;
    for (int r = 0; r < node.nic.count; ++r) {
      const std::string name = node.nic.count == 1 ? "nic:" + node.name : "nic:" + node.name + "." + std::to_string(r);
      nics.push_back(add_link(zone, name, node.nic.bandwidth_bytes_per_s, node.nic.latency_s + switch_latency_s, "nic"));
    }
    // Up from GPU g to the node fabric (and through the host bridge on PCIe nodes).
    std::vector<std::vector<Hop>> up;
    std::vector<int> devices;
    for (int g = 0; g < node.gpu_count; ++g) {
      const int device = static_cast<int>(spec_.hosts.size());
      const std::string name = node.name + "/gpu" + std::to_string(g);
      spec_.hosts.push_back(HostSpec{name, speeds_.at(static_cast<size_t>(device)), zone, static_cast<int>(n)});
      spec_.zones[static_cast<size_t>(zone)].hosts.push_back(device);
      const int link =
          add_link(zone, "gpu:" + name, gpu_bandwidth, node.intra.latency_s / 2, std::string(model::to_string(node.intra.kind)));
      up.push_back({Hop{link, true}});
      if (uplink >= 0) up.back().push_back(Hop{uplink, true});
      devices.push_back(device);
    }
    auto down = [](const std::vector<Hop>& hops) {
      std::vector<Hop> out(hops.rbegin(), hops.rend());
      for (Hop& h : out) h.up = !h.up;
      return out;
    };
    ZoneSpec& z = spec_.zones[static_cast<size_t>(zone)];
    for (size_t a = 0; a < devices.size(); ++a) {
      for (size_t b = 0; b < devices.size(); ++b) {
        if (a == b) continue;
        PairRoute r{devices[a], devices[b], up[a]};
        for (const Hop& h : down(up[b])) r.hops.push_back(h);
        z.pair_routes.push_back(std::move(r));
      }
      if (!nics.empty()) {
        std::vector<Hop> out = up[a];
        out.push_back(Hop{nics[a % nics.size()], true});
        z.pair_routes.push_back(PairRoute{devices[a], -1, out});
        z.pair_routes.push_back(PairRoute{-1, devices[a], down(out)});
      }
    }
    spec_.zones[static_cast<size_t>(parent)].star_routes.push_back(StarRoute{true, zone, {}});
  }

  // Region pairs joined by the widest WAN path (max of the narrowest link), then the
  // shortest latency: the same rule as the cost model.
  void add_wan_routes(int root, const std::map<std::string, int>& region_zone) {
    std::map<std::pair<std::string, std::string>, int> wan_link;
    for (const model::WanLink& w : cluster_.wan) {
      const int link =
          add_link(root, "wan:" + w.region_a + "-" + w.region_b, w.bandwidth_bytes_per_s, w.latency_s, "wan");
      wan_link[{w.region_a, w.region_b}] = link;
    }
    struct Path {
      double bandwidth = 0, latency = 0;
      std::vector<Hop> hops;
    };
    const auto& regions = cluster_.regions;
    for (const model::Region& src : regions) {
      std::map<std::string, Path> best;
      best[src.name] = Path{1e300, 0, {}};
      bool changed = true;
      while (changed) {
        changed = false;
        for (const model::WanLink& w : cluster_.wan) {
          for (bool forward : {true, false}) {
            const std::string& from = forward ? w.region_a : w.region_b;
            const std::string& to = forward ? w.region_b : w.region_a;
            if (best.count(from) == 0) continue;
            Path candidate = best[from];
            candidate.bandwidth = std::min(candidate.bandwidth, w.bandwidth_bytes_per_s);
            candidate.latency += w.latency_s;
            candidate.hops.push_back(Hop{wan_link.at({w.region_a, w.region_b}), forward});
            auto it = best.find(to);
            if (it == best.end() || candidate.bandwidth > it->second.bandwidth ||
                (candidate.bandwidth == it->second.bandwidth && candidate.latency < it->second.latency)) {
              best[to] = candidate;
              changed = true;
            }
          }
        }
      }
      for (const model::Region& dst : regions) {
        if (dst.name == src.name || best.count(dst.name) == 0) continue;
        std::vector<Hop> hops{Hop{region_gateway_.at(src.name), true}};
        hops.insert(hops.end(), best[dst.name].hops.begin(), best[dst.name].hops.end());
        hops.push_back(Hop{region_gateway_.at(dst.name), false});
        spec_.zones[static_cast<size_t>(root)].zone_routes.push_back(
            ZoneRoute{region_zone.at(src.name), region_zone.at(dst.name), std::move(hops)});
      }
    }
  }

  const model::Cluster& cluster_;
  const std::vector<double>& speeds_;
  PlatformSpec spec_;
  std::map<std::string, int> region_gateway_;  // region -> its gateway link
};

}  // namespace

int PlatformSpec::link_index(const std::string& name) const {
  for (size_t i = 0; i < links.size(); ++i) {
    if (links[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

PlatformSpec platform_spec(const model::Cluster& cluster, const std::vector<double>& speed_flops_per_s) {
  if (speed_flops_per_s.size() != static_cast<size_t>(cluster.device_count())) {
    throw Error("platform_spec: one speed per device expected");
  }
  PlatformSpec spec = SpecBuilder(cluster, speed_flops_per_s).build();
  const model::InputPath& in = cluster.input;
  if (in.given) {
    spec.storage_read_bytes_per_s = in.shared_read_bytes_per_s;
    spec.node_read_bytes_per_s = in.node_read_bytes_per_s;
    if (in.preprocess_s_per_sample > 0) spec.node_loader_samples_per_s = in.workers_per_node / in.preprocess_s_per_sample;
  }
  for (int n = 0; n < static_cast<int>(cluster.nodes.size()); ++n) spec.node_hosts.push_back(cluster.host(n));
  for (const model::Device& d : cluster.devices()) {
    spec.bridge.push_back(d.local_rank / spec.node_hosts[static_cast<size_t>(d.node)].gpus_per_bridge);
  }
  return spec;
}

}  // namespace hetflow::sim
