#include "sim/needed_hosts.hpp"

#include <algorithm>

#include "partition/collective.hpp"

namespace hetflow::sim {

std::vector<bool> needed_hosts(const partition::Plan& plan, const SimOptions& options) {
  for (const Fault& f : options.faults) {
    if (f.device < 0) return {};
  }
  const size_t devices = static_cast<size_t>(plan.cluster.device_count());
  std::vector<bool> needed(devices, false);
  const auto need = [&](int device) {
    if (device >= 0 && static_cast<size_t>(device) < devices) needed[static_cast<size_t>(device)] = true;
  };
  need(0);
  for (size_t d = 0; d < plan.programs.size(); ++d) {
    if (std::any_of(plan.programs[d].begin(), plan.programs[d].end(),
                    [](const partition::StreamProgram& p) { return !p.tasks.empty(); })) {
      need(static_cast<int>(d));
    }
  }
  for (const partition::Collective& c : plan.collectives) {
    const std::vector<int>& members = plan.members(c);
    if (c.tasks.size() >= members.size() || members.size() < 2) continue;
    // Folded: each member with a task sends to its successor and receives from its predecessor.
    for (int task : c.tasks) {
      const auto at = static_cast<size_t>(
          std::find(members.begin(), members.end(), plan.tasks[static_cast<size_t>(task)].device) - members.begin());
      if (at == members.size()) continue;
      need(members[(at + 1) % members.size()]);
      need(members[(at + members.size() - 1) % members.size()]);
    }
  }
  for (const Straggler& s : options.stragglers) need(s.device);
  for (const Fault& f : options.faults) need(f.device);
  return needed;
}

}  // namespace hetflow::sim
