#pragma once
// A PlatformSpec made real inside the running SimGrid engine (SimGrid types stay in sim/).
#include <map>
#include <string>
#include <vector>

#include <simgrid/s4u.hpp>

#include "sim/platform_spec.hpp"

namespace hetflow::sim {

struct Platform {
  std::vector<simgrid::s4u::Host*> hosts;  // index = device id (nullptr: not made)
  std::vector<simgrid::s4u::Link*> links;  // index = PlatformSpec::links index (nullptr: not made)
  // A host of no device, with no routes, that times delays: an execution of d x kTimerRate
  // FLOPs bounded to kTimerRate FLOP/s lasts d seconds however many run at once (up to
  // its speed / kTimerRate of them). Not part of the platform's XML.
  simgrid::s4u::Host* timer = nullptr;
  static constexpr double kTimerRate = 1e6;
  // The shared file system (PlatformSpec::storage_read_bytes_per_s), nullptr when none: a
  // read of b bytes is an execution of b FLOPs on it, so concurrent reads share its speed
  // max-min fairly, each bounded by its node's own read bandwidth.
  simgrid::s4u::Host* storage = nullptr;
  // Per node (HostSpec::node), nullptr when unbounded: its read path (bytes as FLOPs) and its
  // loader workers (samples as FLOPs), shared max-min fairly by the node's loads.
  std::vector<simgrid::s4u::Host*> node_read, node_loader;
  // Per node, made where PlatformSpec::offload is set (else empty): its CPUs, whose speed is
  // their DRAM bandwidth (a step's work is its host-memory bytes, or its FLOPs at that
  // bandwidth's worth when compute bound), and per PCIe bridge its two directions (bytes as
  // FLOPs), each shared max-min fairly by the tasks on it.
  std::vector<simgrid::s4u::Host*> node_cpu;
  std::vector<std::vector<simgrid::s4u::Host*>> bridge_to_host, bridge_to_device;
};

// Creates the SimGrid engine with hetflow's network model settings: CM02 with cross-traffic
// off and an unbounded TCP window, i.e. plain max-min fair sharing of split-duplex links —
// the physics of NCCL streams over GPU fabrics, not TCP's (see README, "Simulator").
// `actors` sizes the context settings: beyond ~30k actors guard pages exhaust the kernel's
// memory-map limit, so they are dropped (stacks keep their default size, which measured
// leaner and faster to set up than small ones), unless an address-space limit (ulimit -v)
// cannot hold them: then they shrink to fit, down to 256 KiB (below that, hetflow::Error).
// Call once per process, before instantiate_platform.
simgrid::s4u::Engine& start_engine(size_t actors);

// `bandwidth_profiles`: link index -> SimGrid profile text ("<time> <factor>" lines), set
// before the links are sealed (SimGrid refuses them afterwards).
// `needed_hosts` (one entry per host; empty = all): only the node zones holding a needed
// host are made, with the zones above them, the links their routes cross and the links
// with a profile; every other host and link is nullptr in the result. The routes between the
// hosts made are the full platform's (same links, latencies and bandwidths, created in the
// same order), so a simulation that uses no other host runs exactly as on the whole
// platform, whose set-up grows faster than linearly with its zones (SimGrid checks each new
// link's name against every zone).
Platform instantiate_platform(const PlatformSpec& spec, const std::map<int, std::string>& bandwidth_profiles = {},
                              const std::vector<bool>& needed_hosts = {});

// The device's host runs `factor` times slower from each `from_s` on (factors of changes at
// the same or earlier times multiply; a factor below 1 is a faster device).
void set_slowdowns(Platform& platform, int device, std::vector<std::pair<double, double>> from_s_factor);

}  // namespace hetflow::sim
