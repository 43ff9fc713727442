// Validation's last layer: memory. The recorded per-device memory must be what the plan's
// tensors give (memory_from_lifetimes), each device must fit its GPU, and under offload
// each node's devices' host state must fit the node's host memory.
#include <algorithm>
#include <cmath>
#include <map>

#include "model/units.hpp"
#include "partition/memory.hpp"
#include "partition/task_order.hpp"
#include "partition/validate.hpp"

namespace hetflow::partition::validate_detail {

namespace {
bool close(double a, double b) { return std::abs(a - b) <= 1e-9 * std::max({1.0, std::abs(a), std::abs(b)}); }

// Offload: the host state of a node's devices against the node's host memory (offloaded
// plans are never folded, so every device's state is in the plan).
void check_host_memory(const Plan& plan, const std::vector<model::Device>& devices, std::vector<std::string>& problems) {
  namespace u = model::units;
  std::map<int, std::pair<double, int>> per_node;  // node -> (host bytes, devices using it)
  for (size_t d = 0; d < plan.memory.size() && d < devices.size(); ++d) {
    if (!(plan.memory[d].host_bytes > 0)) continue;
    auto& [bytes, count] = per_node[devices[d].node];
    bytes += plan.memory[d].host_bytes;
    ++count;
  }
  for (const auto& [node, use] : per_node) {
    const double capacity = plan.cluster.host(node).memory_bytes;
    if (use.first <= capacity) continue;
    problems.push_back("node " + plan.cluster.nodes[static_cast<size_t>(node)].name + "'s host memory holds " +
                       u::human_bytes(capacity) + " but its " + std::to_string(use.second) +
                       " devices offload " + u::human_bytes(use.first) +
                       " to it (set the node's `host: memory` if it has more)");
  }
}
}  // namespace

void check_memory(const Plan& plan, const TaskOrder& order, Validation& v) {
  std::vector<std::string>& problems = v.problems;
  namespace u = model::units;
  // The recorded memory must be what the tensors say (a hand edit would otherwise go unseen).
  const std::vector<int> tasks = order.task_sequence();
  const std::vector<model::Device> devices = plan.cluster.devices();
  const std::vector<DeviceMemory> expected = memory_from_lifetimes(
      plan, tasks, [&](int d) { return plan.cluster.device_gpu(devices[static_cast<size_t>(d)]).memory_bytes; });
  for (size_t d = 0; d < plan.memory.size(); ++d) {
    const DeviceMemory& m = plan.memory[d];
    const DeviceMemory& e = expected[d];
    if (!close(m.total_bytes(), e.total_bytes()) || !close(m.capacity_bytes, e.capacity_bytes) ||
        !close(m.host_bytes, e.host_bytes) || m.peak_in_flight != e.peak_in_flight) {
      problems.push_back("memory[" + std::to_string(d) + "]: records " + u::human_bytes(m.total_bytes()) + " of " +
                         u::human_bytes(m.capacity_bytes) + " but the tensors' lifetimes give " +
                         u::human_bytes(e.total_bytes()) + " of " + u::human_bytes(e.capacity_bytes) +
                         " (edited by hand, or made by an earlier hetflow whose memory model differs: make it again "
                         "with `hetflow plan ... --out`)");
      return;
    }
  }
  check_host_memory(plan, devices, problems);
  // Devices over their memory, the worst (largest overrun) first; on thousands of devices
  // the few worst and a count, not a line per device.
  constexpr size_t kWorstShown = 5;
  std::vector<size_t> over;
  for (size_t d = 0; d < plan.memory.size(); ++d) {
    const DeviceMemory& m = plan.memory[d];
    if (m.capacity_bytes > 0 && m.total_bytes() > m.capacity_bytes) over.push_back(d);
  }
  auto overrun = [&](size_t d) { return plan.memory[d].total_bytes() - plan.memory[d].capacity_bytes; };
  std::stable_sort(over.begin(), over.end(), [&](size_t a, size_t b) { return overrun(a) > overrun(b); });
  for (size_t i = 0; i < over.size() && i < kWorstShown; ++i) {
    const size_t d = over[i];
    const DeviceMemory& m = plan.memory[d];
    const double total = m.total_bytes();
    const std::pair<const char*, double> terms[] = {
        {"weights", m.weights_bytes},     {"gradients", m.gradients_bytes}, {"optimizer state", m.optimizer_bytes},
        {"activations", m.activations_bytes}, {"buffers", m.buffers_bytes},  {"workspace", m.workspace_bytes},
        {"gathered", m.gathered_bytes}};
    const auto largest = *std::max_element(std::begin(terms), std::end(terms),
                                           [](const auto& a, const auto& b) { return a.second < b.second; });
    std::string message = plan.device_names[d] + " needs " + u::human_bytes(total) + " but has " +
                          u::human_bytes(m.capacity_bytes) + ": over by " + u::human_bytes(total - m.capacity_bytes) +
                          "; largest term: " + largest.first + " " + u::human_bytes(largest.second);
    if (std::string(largest.first) == "activations") {
      message += " (" + std::to_string(m.peak_in_flight) + " micro-batches in flight)";
    }
    message += " [weights " + u::human_bytes(m.weights_bytes) + ", gradients " + u::human_bytes(m.gradients_bytes) +
               ", optimizer " + u::human_bytes(m.optimizer_bytes) + ", activations " + u::human_bytes(m.activations_bytes) +
               ", buffers " + u::human_bytes(m.buffers_bytes) + ", workspace " + u::human_bytes(m.workspace_bytes) +
               (m.gathered_bytes > 0 ? ", gathered " + u::human_bytes(m.gathered_bytes) : "") + "]";
    problems.push_back(message);
  }
  v.over_memory = over.size();
  v.devices = plan.memory.size();
  if (over.size() > kWorstShown) {
    v.unlisted = over.size() - kWorstShown;
    v.unlisted_note = "and " + std::to_string(v.unlisted) + " more";
  }
}

}  // namespace hetflow::partition::validate_detail
