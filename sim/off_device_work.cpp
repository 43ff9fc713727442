#include "sim/off_device_work.hpp"

#include <algorithm>

namespace hetflow::sim {

using partition::TaskKind;

std::vector<OffDeviceWork> off_device_work(const partition::Plan& plan, const partition::Task& t,
                                           const PlatformSpec& spec, const Platform& platform,
                                           const partition::LoadShares& shares) {
  std::vector<OffDeviceWork> work;
  auto add = [&](simgrid::s4u::Host* on, double amount) {
    if (on != nullptr && amount > 0) work.push_back({on, amount});
  };
  const auto device = static_cast<size_t>(t.device);
  const auto node = static_cast<size_t>(spec.hosts[device].node);
  switch (t.kind) {
    case TaskKind::load: {
      // A folded plan's loads stand for every replica's: each resource serves all of them.
      const double share = node < shares.per_node.size() ? shares.per_node[node] : 1;
      add(platform.storage, t.bytes * shares.all);
      if (node < platform.node_read.size()) {
        add(platform.node_read[node], t.bytes * share);
        add(platform.node_loader[node], partition::load_samples(plan, t) * share);
      }
      break;
    }
    case TaskKind::to_host:
    case TaskKind::to_device: {
      // The copy's start-up as bytes the bridge could have moved meanwhile: alone on it, the
      // copy lasts latency + bytes / bandwidth (CostModel::host_copy_time_s).
      const auto& bridges = t.kind == TaskKind::to_host ? platform.bridge_to_host : platform.bridge_to_device;
      const auto b = static_cast<size_t>(spec.bridge[device]);
      if (node < bridges.size() && b < bridges[node].size()) {
        const model::NodeHost& h = spec.node_hosts[node];
        add(bridges[node][b], t.bytes + h.pcie_latency_s * h.pcie_bytes_per_s);
      }
      break;
    }
    case TaskKind::host_optimizer: {
      // The roofline of CostModel::host_step_time_s, in host-memory bytes.
      if (node < platform.node_cpu.size()) {
        const model::NodeHost& h = spec.node_hosts[node];
        add(platform.node_cpu[node], std::max(t.memory_bytes, t.flops / h.cpu_flops_per_s * h.cpu_memory_bytes_per_s));
      }
      break;
    }
    default:
      break;
  }
  return work;
}

}  // namespace hetflow::sim
