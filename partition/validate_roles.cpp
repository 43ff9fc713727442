// Validation's layer of roles and coordinates (partition/validate.hpp runs it with the
// program's other layers).
#include <algorithm>
#include <string>
#include <vector>

#include "model/error.hpp"
#include "partition/plan.hpp"
#include "partition/task_order.hpp"

namespace hetflow::partition::validate_detail {

// Roles and coordinates: every device where the layout places it, every communicator's
// members where its role puts them (a tensor group is one pipeline rank's devices in tensor
// order; a pipeline pair, a worker's norm group and its tied-embedding pair lie in one
// worker; a data group holds one device per worker; a context group one device per worker of
// a context group, at one position; an expert group likewise), and the traffic each communicator
// carries of its role. An unspecified role (a plan imported from a trace) is not checked.
namespace {
std::string coords_text(const AxisCoords& c) {
  std::string text;
  for (const int x : c.at) text += (text.empty() ? "[" : ", ") + std::to_string(x);
  return text + "]";
}
}  // namespace

void check_roles(const Plan& plan, std::vector<std::string>& problems) {
  auto note = [&](const std::string& what) {
    if (problems.size() < 50) problems.push_back(what);
  };
  if (!plan.layout.workers.empty()) {  // the axes sized by the workers
    try {
      check_axes(plan.layout);
    } catch (const InputError& e) {
      note("layout." + e.field() + ": " + e.message());
    }
  }
  const std::vector<AxisCoords> placed = plan.layout.device_coords(plan.device_count());
  if (plan.coords.size() != placed.size()) {
    note("coords: expected one entry per device (" + std::to_string(placed.size()) + "), found " +
         std::to_string(plan.coords.size()));
    return;
  }
  for (size_t d = 0; d < placed.size(); ++d) {
    const AxisCoords& c = plan.coords[d];
    if (c != placed[d]) {
      note("coords[" + std::to_string(d) + "]: expected " + coords_text(placed[d]) + " (where the layout places " +
           plan.device_name(static_cast<int>(d)) + "), found " + coords_text(c));
      break;
    }
  }
  for (size_t i = 0; i < plan.communicators.size(); ++i) {
    const Communicator& c = plan.communicators[i];
    auto where = [&] { return "communicators[" + std::to_string(i) + "] (" + std::string(to_string(c.role)) + ")"; };
    const AxisCoords& first = plan.coords_of(c.devices.front());
    // A worker is a (data, context) pair of coordinates.
    bool placed_all = true, one_worker = true, one_rank = true, one_position = true, one_expert_position = true;
    for (size_t k = 0; k < c.devices.size(); ++k) {
      const AxisCoords& m = plan.coords_of(c.devices[k]);
      placed_all = placed_all && m[Axis::data] >= 0;
      one_worker = one_worker && m[Axis::data] == first[Axis::data] && m[Axis::context] == first[Axis::context];
      one_rank = one_rank && one_worker && m[Axis::pipeline] == first[Axis::pipeline] && m[Axis::tensor] == static_cast<int>(k);
      one_position = one_position && m[Axis::data] == first[Axis::data] && m[Axis::pipeline] == first[Axis::pipeline] &&
                     m[Axis::tensor] == first[Axis::tensor] && m[Axis::context] == static_cast<int>(k);
      one_expert_position = one_expert_position && m[Axis::pipeline] == first[Axis::pipeline] &&
                            m[Axis::tensor] == first[Axis::tensor] && m[Axis::context] == first[Axis::context] &&
                            m[Axis::expert] == static_cast<int>(k) && m[Axis::data] == first[Axis::data] + static_cast<int>(k);
    }
    // The devices of one expert group's workers (data indices of one group of EP, one
    // context rank).
    auto one_expert_group = [&] {
      const int ep = plan.layout.experts.parallel;
      for (const int d : c.devices) {
        const auto& m = plan.coords_of(d);
        if (m[Axis::data] / ep != first[Axis::data] / ep || m[Axis::context] != first[Axis::context]) return false;
      }
      return true;
    };
    auto distinct_workers = [&] {
      std::vector<std::pair<int, int>> workers;
      workers.reserve(c.devices.size());
      for (const int d : c.devices) workers.emplace_back(plan.coords_of(d)[Axis::data], plan.coords_of(d)[Axis::context]);
      std::sort(workers.begin(), workers.end());
      return std::adjacent_find(workers.begin(), workers.end()) == workers.end();
    };
    switch (c.role) {
      case CommRole::tensor:
        if (!placed_all || !one_rank) note(where() + ": expected the devices of one pipeline rank, in tensor-parallel order");
        break;
      case CommRole::gradient_norm:
        // Under ZeRO every replica holds a shard of the gradients: the norm meets over all.
        if (plan.layout.sync.zero.stage > 0 && !plan.layout.folded && placed_all) break;
        // Under expert parallelism an expert group's workers hold its experts between them.
        if (plan.layout.experts.parallel > 1 && !plan.layout.folded && placed_all && one_expert_group()) break;
        [[fallthrough]];
      case CommRole::pipeline:
      case CommRole::embedding:
        if (!placed_all || !one_worker) note(where() + ": expected devices of one virtual worker");
        break;
      case CommRole::data:
        if (!placed_all || !distinct_workers()) note(where() + ": expected one device of each of its virtual workers");
        break;
      case CommRole::context:
        if (!placed_all || !one_position) {
          note(where() + ": expected the devices of one position (data, pipeline and tensor coordinates) of a context "
                         "group, in context order");
        }
        break;
      case CommRole::expert:
        if (!placed_all || !one_expert_position) {
          note(where() + ": expected the devices of one position (pipeline, tensor and context coordinates) of an expert "
                         "group, in expert order");
        }
        break;
      case CommRole::server:
      case CommRole::unspecified:
        break;
    }
  }
  auto carries = [&](int communicator, Purpose purpose, const std::string& what) {
    const CommRole role = plan.communicator(communicator).role;
    if (role != CommRole::unspecified && role != role_of(purpose)) {
      note(what + ": " + std::string(to_string(purpose)) + " traffic on communicator " + std::to_string(communicator) +
           ", whose role is " + std::string(to_string(role)) + " (expected " + std::string(to_string(role_of(purpose))) + ")");
    }
  };
  for (size_t c = 0; c < plan.collectives.size(); ++c) {
    const Collective& col = plan.collectives[c];
    carries(col.communicator, col.purpose, "collective " + std::to_string(c));
  }
  for (size_t t = 0; t < plan.tasks.size(); ++t) {
    const Task& task = plan.tasks[t];
    if (task.kind == TaskKind::send) carries(plan.channel(task.channel).communicator, task.purpose, describe_task(plan, static_cast<int>(t)));
  }
}

}  // namespace hetflow::partition::validate_detail
