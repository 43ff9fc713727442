#include "sim/platform.hpp"

#include <simgrid/kernel/ProfileBuilder.hpp>
#include <xbt/log.h>

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <string>

#include "model/error.hpp"

namespace hetflow::sim {

namespace sg = simgrid::s4u;
using Direction = sg::LinkInRoute::Direction;

namespace {

// Address space this process may still map under `ulimit -v` (RLIMIT_AS); < 0 when unlimited.
double address_space_left() {
  struct rlimit limit {};
  if (::getrlimit(RLIMIT_AS, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return -1;
  double used = 0;
  if (std::FILE* f = std::fopen("/proc/self/statm", "r")) {
    unsigned long pages = 0;
    if (std::fscanf(f, "%lu", &pages) == 1) used = static_cast<double>(pages) * static_cast<double>(::sysconf(_SC_PAGESIZE));
    std::fclose(f);
  }
  return static_cast<double>(limit.rlim_cur) - used;
}

// SimGrid's default actor stack, and the smallest one hetflow's actors are run with.
constexpr double kDefaultStackKiB = 8192;
constexpr double kMinStackKiB = 256;

}  // namespace

sg::Engine& start_engine(size_t actors) {
  static char name[] = "hetflow-sim";
#ifdef HETFLOW_SIMGRID_THREAD_CONTEXTS
  // Sanitizer builds: AddressSanitizer cannot follow SimGrid's hand-switched stacks (it
  // reports an exception unwinding on one as a stack underflow); threads it understands. The
  // context factory is read when the engine starts, so it goes on the command line.
  // (Its log category first: setting a value prints an INFO line that would reach stderr.)
  static char quiet[] = "--log=xbt_cfg.thres:warning";
  static char threads[] = "--cfg=contexts/factory:thread";
  static int argc = 3;
  static char* argv[] = {name, quiet, threads, nullptr};
#else
  static int argc = 1;
  static char* argv[] = {name, nullptr};
#endif
  static std::unique_ptr<sg::Engine> engine;
  if (!engine) {
    // SimGrid takes SIGINT over (it prints the actors' status and exits 1, even where the
    // signal was ignored, as in a background job); hetflow keeps the process's own handling.
    struct sigaction interrupt {};
    const bool saved = ::sigaction(SIGINT, nullptr, &interrupt) == 0;
    engine = std::make_unique<sg::Engine>(&argc, argv);
    if (saved) ::sigaction(SIGINT, &interrupt, nullptr);
    // Quiet: hetflow reports stalls itself (SimGrid's deadlock banner is a critical message).
    xbt_log_control_set("root.thres:critical");
    xbt_log_control_set("ker_engine.app:file:/dev/null ker_engine.add:no");
    sg::Engine::set_config("network/model:CM02");
    sg::Engine::set_config("network/crosstraffic:0");
    sg::Engine::set_config("network/TCP-gamma:1e15");
    if (actors > 30000) sg::Engine::set_config("contexts/guard-size:0");
    // Each actor reserves its whole stack as address space: under `ulimit -v` the default
    // 8 MiB stacks run out at a few hundred devices. Shrink them to fit half of what is left
    // (the other half is for the simulation itself), down to 256 KiB.
    const double left = address_space_left();
    const double fit_kib = left / 2 / static_cast<double>(actors + 1) / 1024;
    if (left >= 0 && fit_kib < kDefaultStackKiB) {
      if (fit_kib < kMinStackKiB) {
        throw hetflow::Error("cannot simulate " + std::to_string(actors) + " devices under the address-space limit " +
                             "(ulimit -v) of this process: each device's actor needs at least 256 KiB of stack, and " +
                             std::to_string(static_cast<long long>(left / (1 << 20))) +
                             " MiB are left; raise the limit or simulate fewer devices");
      }
      const int kib = static_cast<int>(std::exp2(std::floor(std::log2(fit_kib))));  // a power of two
      sg::Engine::set_config("contexts/stack-size:" + std::to_string(kib));
    }
  }
  return *engine;
}

namespace {

// The zones a platform of only the needed hosts keeps: the root, every zone holding a needed
// host, the zones above them, and the gateway zone of each (whose router the parent's route
// to it names). All of them when `needed_hosts` is empty.
std::vector<bool> zones_kept(const PlatformSpec& spec, const std::vector<bool>& needed_hosts) {
  std::vector<bool> kept(spec.zones.size(), needed_hosts.empty());
  if (needed_hosts.empty()) return kept;
  kept[0] = true;
  for (size_t h = 0; h < spec.hosts.size(); ++h) {
    if (!needed_hosts[h]) continue;
    for (int z = spec.hosts[h].zone; z >= 0 && !kept[static_cast<size_t>(z)]; z = spec.zones[static_cast<size_t>(z)].parent) {
      kept[static_cast<size_t>(z)] = true;
    }
  }
  for (size_t z = 1; z < spec.zones.size(); ++z) {
    const ZoneSpec& zone = spec.zones[z];
    const auto parent = static_cast<size_t>(zone.parent);
    if (kept[parent] && !zone.router.empty() && zone.router == spec.zones[parent].gateway) kept[z] = true;
  }
  return kept;
}

}  // namespace

Platform instantiate_platform(const PlatformSpec& spec, const std::map<int, std::string>& bandwidth_profiles,
                              const std::vector<bool>& needed_hosts) {
  if (!needed_hosts.empty() && needed_hosts.size() != spec.hosts.size()) {
    throw hetflow::Error("instantiate_platform: one entry per host expected in needed_hosts");
  }
  const std::vector<bool> kept = zones_kept(spec, needed_hosts);
  // The routes of the kept zones to kept members, and the links they cross (with those that
  // have a profile), in the spec's order, so a smaller platform's common part is made alike.
  const auto star_kept = [&](const StarRoute& r) {
    return r.is_zone ? kept[static_cast<size_t>(r.member)] : kept[static_cast<size_t>(spec.hosts[static_cast<size_t>(r.member)].zone)];
  };
  std::vector<bool> link_used(spec.links.size(), needed_hosts.empty());
  for (const auto& [index, text] : bandwidth_profiles) link_used.at(static_cast<size_t>(index)) = true;
  for (size_t i = 0; i < spec.zones.size() && !needed_hosts.empty(); ++i) {
    if (!kept[i]) continue;
    const ZoneSpec& z = spec.zones[i];
    const auto use = [&](const std::vector<Hop>& hops) {
      for (const Hop& hop : hops) link_used[static_cast<size_t>(hop.link)] = true;
    };
    for (const StarRoute& r : z.star_routes) {
      if (star_kept(r)) use(r.hops);
    }
    for (const PairRoute& r : z.pair_routes) use(r.hops);
    for (const ZoneRoute& r : z.zone_routes) {
      if (kept[static_cast<size_t>(r.from_zone)] && kept[static_cast<size_t>(r.to_zone)]) use(r.hops);
    }
  }

  Platform p;
  std::vector<sg::NetZone*> zones(spec.zones.size(), nullptr);
  std::vector<simgrid::kernel::routing::NetPoint*> routers(spec.zones.size(), nullptr);
  std::map<std::string, simgrid::kernel::routing::NetPoint*> router_by_name;
  for (size_t i = 0; i < spec.zones.size(); ++i) {
    if (!kept[i]) continue;
    const ZoneSpec& z = spec.zones[i];
    sg::NetZone* zone = z.full ? sg::create_full_zone(z.name) : sg::create_star_zone(z.name);
    if (z.parent >= 0) zone->set_parent(zones[static_cast<size_t>(z.parent)]);
    zones[i] = zone;
  }
  for (size_t i = 0; i < spec.zones.size(); ++i) {
    if (kept[i] && !spec.zones[i].router.empty()) {
      routers[i] = zones[i]->create_router(spec.zones[i].router);
      router_by_name[spec.zones[i].router] = routers[i];
    }
  }
  p.timer = zones.front()->create_host("hetflow-timer", 1e18);
  if (spec.storage_read_bytes_per_s > 0) {
    p.storage = zones.front()->create_host("hetflow-storage", spec.storage_read_bytes_per_s);
  }
  if (spec.node_read_bytes_per_s > 0 || spec.node_loader_samples_per_s > 0) {
    int nodes = 0;
    for (const HostSpec& h : spec.hosts) nodes = std::max(nodes, h.node + 1);
    p.node_read.assign(static_cast<size_t>(nodes), nullptr);
    p.node_loader.assign(static_cast<size_t>(nodes), nullptr);
    for (int n = 0; n < nodes; ++n) {
      const std::string at = std::to_string(n);
      if (spec.node_read_bytes_per_s > 0) {
        p.node_read[static_cast<size_t>(n)] = zones.front()->create_host("hetflow-read-" + at, spec.node_read_bytes_per_s);
      }
      if (spec.node_loader_samples_per_s > 0) {
        p.node_loader[static_cast<size_t>(n)] =
            zones.front()->create_host("hetflow-loader-" + at, spec.node_loader_samples_per_s);
      }
    }
  }
  if (spec.offload) {
    std::vector<int> bridges(spec.node_hosts.size(), 0);
    for (size_t h = 0; h < spec.hosts.size() && h < spec.bridge.size(); ++h) {
      int& b = bridges[static_cast<size_t>(spec.hosts[h].node)];
      b = std::max(b, spec.bridge[h] + 1);
    }
    p.node_cpu.assign(spec.node_hosts.size(), nullptr);
    p.bridge_to_host.resize(spec.node_hosts.size());
    p.bridge_to_device.resize(spec.node_hosts.size());
    for (size_t n = 0; n < spec.node_hosts.size(); ++n) {
      if (bridges[n] == 0) continue;  // a node of no device made
      const model::NodeHost& h = spec.node_hosts[n];
      const std::string at = std::to_string(n);
      p.node_cpu[n] = zones.front()->create_host("hetflow-cpu-" + at, h.cpu_memory_bytes_per_s);
      for (int b = 0; b < bridges[n]; ++b) {
        const std::string bridge = at + "." + std::to_string(b);
        p.bridge_to_host[n].push_back(zones.front()->create_host("hetflow-pcie-up-" + bridge, h.pcie_bytes_per_s));
        p.bridge_to_device[n].push_back(zones.front()->create_host("hetflow-pcie-down-" + bridge, h.pcie_bytes_per_s));
      }
    }
  }
  p.hosts.resize(spec.hosts.size(), nullptr);
  for (size_t h = 0; h < spec.hosts.size(); ++h) {
    const HostSpec& host = spec.hosts[h];
    if (!kept[static_cast<size_t>(host.zone)]) continue;
    p.hosts[h] = zones[static_cast<size_t>(host.zone)]->create_host(host.name, host.speed_flops_per_s);
  }
  p.links.resize(spec.links.size(), nullptr);
  for (size_t i = 0; i < spec.links.size(); ++i) {
    const LinkSpec& l = spec.links[i];
    if (!link_used[i] || !kept[static_cast<size_t>(l.zone)]) continue;
    sg::Link* link = zones[static_cast<size_t>(l.zone)]->create_split_duplex_link(l.name, l.bandwidth_bytes_per_s);
    link->set_latency(l.latency_s);
    const auto profile = bandwidth_profiles.find(static_cast<int>(i));
    if (profile != bandwidth_profiles.end()) {
      link->set_bandwidth_profile(
          simgrid::kernel::profile::ProfileBuilder::from_string("bandwidth:" + l.name, profile->second, -1));
    }
    p.links[i] = link->seal();
  }
  auto hops_of = [&](const std::vector<Hop>& hops) {
    std::vector<sg::LinkInRoute> out;
    for (const Hop& hop : hops) {
      out.emplace_back(p.links[static_cast<size_t>(hop.link)], hop.up ? Direction::UP : Direction::DOWN);
    }
    return out;
  };
  // Routes and sealing bottom-up: a zone's children are sealed before its own routes.
  for (size_t i = spec.zones.size(); i-- > 0;) {
    if (!kept[i]) continue;
    const ZoneSpec& z = spec.zones[i];
    for (const StarRoute& r : z.star_routes) {
      if (!star_kept(r)) continue;
      if (r.is_zone) {
        const ZoneSpec& child = spec.zones[static_cast<size_t>(r.member)];
        zones[i]->add_route(zones[static_cast<size_t>(r.member)]->get_netpoint(), nullptr,
                            router_by_name.at(child.gateway), nullptr, hops_of(r.hops), true);
      } else {
        zones[i]->add_route(p.hosts[static_cast<size_t>(r.member)]->get_netpoint(), nullptr, nullptr, nullptr,
                            hops_of(r.hops), true);
      }
    }
    for (const PairRoute& r : z.pair_routes) {
      auto point = [&](int host) { return host >= 0 ? p.hosts[static_cast<size_t>(host)]->get_netpoint() : routers[i]; };
      zones[i]->add_route(point(r.from), point(r.to), nullptr, nullptr, hops_of(r.hops), false);
    }
    for (const ZoneRoute& r : z.zone_routes) {
      if (!kept[static_cast<size_t>(r.from_zone)] || !kept[static_cast<size_t>(r.to_zone)]) continue;
      const ZoneSpec& from = spec.zones[static_cast<size_t>(r.from_zone)];
      const ZoneSpec& to = spec.zones[static_cast<size_t>(r.to_zone)];
      zones[i]->add_route(zones[static_cast<size_t>(r.from_zone)]->get_netpoint(),
                          zones[static_cast<size_t>(r.to_zone)]->get_netpoint(), router_by_name.at(from.gateway),
                          router_by_name.at(to.gateway), hops_of(r.hops), false);
    }
    zones[i]->seal();
  }
  return p;
}

void set_slowdowns(Platform& platform, int device, std::vector<std::pair<double, double>> from_s_factor) {
  std::sort(from_s_factor.begin(), from_s_factor.end());
  std::vector<std::pair<double, double>> speed{{0.0, 1.0}};  // (from, speed relative to nominal), times increasing
  for (const auto& [from_s, factor] : from_s_factor) {
    const double next = speed.back().second / factor;
    if (from_s <= speed.back().first) {
      speed.back().second = next;  // changes at one time: their product
    } else {
      speed.emplace_back(from_s, next);
    }
  }
  std::string text;
  char line[64];
  for (const auto& [from_s, value] : speed) {
    std::snprintf(line, sizeof line, "%.17g %.17g\n", from_s, value);
    text += line;
  }
  platform.hosts.at(static_cast<size_t>(device))
      ->set_speed_profile(simgrid::kernel::profile::ProfileBuilder::from_string("speed:" + std::to_string(device), text, -1));
}

}  // namespace hetflow::sim
