#include "partition/validate.hpp"

#include <algorithm>
#include <set>

#include "model/error.hpp"
#include "model/units.hpp"
#include "partition/task_order.hpp"

namespace hetflow::partition {

namespace {

std::string device_name(const Plan& plan, int d) {
  return d >= 0 && d < plan.device_count() ? plan.device_names[static_cast<size_t>(d)] : "device " + std::to_string(d);
}

// Task fields in range and programs listing each task exactly once, where it says it runs.
bool check_structure(const Plan& plan, std::vector<std::string>& problems) {
  const size_t before = problems.size();
  const int devices = plan.device_count();
  for (size_t i = 0; i < plan.tasks.size(); ++i) {
    const Task& t = plan.tasks[i];
    const std::string where = "task #" + std::to_string(i) + " (" + std::string(to_string(t.kind)) + ")";
    if (t.device < 0 || t.device >= devices) problems.push_back(where + ": device " + std::to_string(t.device) + " does not exist");
    if (t.stream < 0 || static_cast<size_t>(t.stream) >= plan.streams.size()) problems.push_back(where + ": unknown stream");
    if ((t.kind == TaskKind::send || t.kind == TaskKind::recv) && (t.peer < 0 || t.peer >= devices)) {
      problems.push_back(where + ": peer " + std::to_string(t.peer) + " does not exist");
    }
    if (t.kind == TaskKind::collective && (t.group < 0 || static_cast<size_t>(t.group) >= plan.collectives.size())) {
      problems.push_back(where + ": collective " + std::to_string(t.group) + " does not exist");
    }
    if (t.flops < 0 || t.bytes < 0 || t.memory_bytes < 0) problems.push_back(where + ": negative flops or bytes");
  }
  if (boost::num_vertices(plan.graph) != plan.tasks.size()) {
    problems.push_back("the task graph has " + std::to_string(boost::num_vertices(plan.graph)) + " vertices for " +
                       std::to_string(plan.tasks.size()) + " tasks");
  }
  if (!problems.empty()) return false;
  std::vector<int> listed(plan.tasks.size(), 0);
  for (size_t d = 0; d < plan.programs.size(); ++d) {
    for (const StreamProgram& program : plan.programs[d]) {
      const auto s = static_cast<size_t>(program.stream);
      for (int id : program.tasks) {
        if (id < 0 || static_cast<size_t>(id) >= plan.tasks.size()) {
          problems.push_back("program of " + device_name(plan, static_cast<int>(d)) + " lists unknown task #" + std::to_string(id));
          continue;
        }
        const Task& t = plan.tasks[static_cast<size_t>(id)];
        if (static_cast<size_t>(t.device) != d || static_cast<size_t>(t.stream) != s) {
          problems.push_back("task #" + std::to_string(id) + " is listed in the program of " +
                             device_name(plan, static_cast<int>(d)) + " but runs on " + device_name(plan, t.device));
        }
        ++listed[static_cast<size_t>(id)];
      }
    }
  }
  for (size_t i = 0; i < listed.size(); ++i) {
    if (listed[i] != 1) {
      problems.push_back("task #" + std::to_string(i) + " appears " + std::to_string(listed[i]) +
                         " times in the device programs (expected once)");
    }
  }
  return problems.size() == before;
}

void check_transfers(const Plan& plan, std::vector<std::string>& problems) {
  std::vector<int> send_of, recv_of;
  auto slot = [](std::vector<int>& v, int g) -> int& {
    if (v.size() <= static_cast<size_t>(g)) v.resize(static_cast<size_t>(g) + 1, -1);
    return v[static_cast<size_t>(g)];
  };
  for (size_t i = 0; i < plan.tasks.size(); ++i) {
    const Task& t = plan.tasks[i];
    if (t.kind != TaskKind::send && t.kind != TaskKind::recv) continue;
    if (t.group < 0) {
      problems.push_back(describe_task(plan, static_cast<int>(i)) + " has no transfer id");
      continue;
    }
    int& seen = slot(t.kind == TaskKind::send ? send_of : recv_of, t.group);
    if (seen >= 0) {
      problems.push_back("transfer " + std::to_string(t.group) + " has more than one " + std::string(to_string(t.kind)) +
                         ": " + describe_task(plan, seen) + " and " + describe_task(plan, static_cast<int>(i)));
    }
    seen = static_cast<int>(i);
  }
  const size_t groups = std::max(send_of.size(), recv_of.size());
  send_of.resize(groups, -1);
  recv_of.resize(groups, -1);
  for (size_t g = 0; g < groups; ++g) {
    const int s = send_of[g], r = recv_of[g];
    if (s < 0 && r < 0) continue;
    if (r < 0) {
      problems.push_back("unmatched send: " + describe_task(plan, s) + " has no matching receive");
      continue;
    }
    if (s < 0) {
      problems.push_back("unmatched receive: " + describe_task(plan, r) + " has no matching send");
      continue;
    }
    const Task& a = plan.tasks[static_cast<size_t>(s)];
    const Task& b = plan.tasks[static_cast<size_t>(r)];
    if (a.peer != b.device || b.peer != a.device) {
      problems.push_back("transfer " + std::to_string(g) + ": " + describe_task(plan, s) + " and " + describe_task(plan, r) +
                         " do not name each other as peers");
    }
    if (a.bytes != b.bytes) {
      problems.push_back("transfer " + std::to_string(g) + ": send of " + model::units::format_bytes(a.bytes) +
                         " but receive of " + model::units::format_bytes(b.bytes));
    }
  }
}

// Devices exchange data only through transfers and collectives: a data dependency between
// two tasks of different devices has no meaning on real hardware (and back ends rely on it).
void check_local_dependencies(const Plan& plan, std::vector<std::string>& problems) {
  for (auto [it, end] = boost::edges(plan.graph); it != end; ++it) {
    const auto a = static_cast<int>(boost::source(*it, plan.graph));
    const auto b = static_cast<int>(boost::target(*it, plan.graph));
    if (plan.tasks[static_cast<size_t>(a)].device != plan.tasks[static_cast<size_t>(b)].device) {
      problems.push_back(describe_task(plan, b) + " depends on " + describe_task(plan, a) +
                         " on another device: devices exchange data only through transfers and collectives");
      return;  // one says enough
    }
  }
}

void check_collectives(const Plan& plan, std::vector<std::string>& problems) {
  for (size_t c = 0; c < plan.collectives.size(); ++c) {
    const Collective& col = plan.collectives[c];
    if (col.tasks.size() != col.devices.size()) {
      problems.push_back("collective " + std::to_string(c) + " lists " + std::to_string(col.devices.size()) +
                         " devices but " + std::to_string(col.tasks.size()) + " tasks");
      continue;
    }
    for (size_t i = 0; i < col.tasks.size(); ++i) {
      const int id = col.tasks[i];
      if (id < 0 || static_cast<size_t>(id) >= plan.tasks.size()) {
        problems.push_back("collective " + std::to_string(c) + " lists unknown task #" + std::to_string(id));
        continue;
      }
      const Task& t = plan.tasks[static_cast<size_t>(id)];
      if (t.kind != TaskKind::collective || t.group != static_cast<int>(c) || t.device != col.devices[i] ||
          t.bytes != col.bytes) {
        problems.push_back("collective " + std::to_string(c) + ": participant " + describe_task(plan, id) +
                           " does not match it (kind, group, device or bytes)");
      }
    }
  }
}

// Each virtual worker's chunks cover the layers in order, and so do the forward tasks of
// its first micro-batch in the first iteration, once per tensor-parallel rank.
void check_coverage(const Plan& plan, std::vector<std::string>& problems) {
  const int layers = plan.network_layers;
  for (size_t w = 0; w < plan.layout.workers.size(); ++w) {
    const VirtualWorker& vw = plan.layout.workers[w];
    const std::string where = "virtual worker " + std::to_string(w);
    int next = 0;
    for (const Stage& s : vw.stages) {
      if (s.layer_begin != next || s.layer_end <= s.layer_begin) {
        problems.push_back(where + ": its chunks do not cover the layers in order (chunk [" + std::to_string(s.layer_begin) +
                           ", " + std::to_string(s.layer_end) + ") after layer " + std::to_string(next) + ")");
        break;
      }
      next = s.layer_end;
    }
    if (next != layers) problems.push_back(where + ": its chunks end at layer " + std::to_string(next) + " of " + std::to_string(layers));
    std::vector<int> count(static_cast<size_t>(std::max(layers, 0)), 0);
    for (const Task& t : plan.tasks) {
      if (t.kind != TaskKind::forward || t.worker != static_cast<int>(w) || t.iteration != 0 || t.microbatch != 0) continue;
      for (int l = std::max(t.layer_begin, 0); l < std::min(t.layer_end, layers); ++l) ++count[static_cast<size_t>(l)];
    }
    const int copies = plan.layout.tensor;
    for (int l = 0; l < layers; ++l) {
      if (count[static_cast<size_t>(l)] != copies) {
        problems.push_back(where + ": layer " + std::to_string(l) + " is computed " +
                           std::to_string(count[static_cast<size_t>(l)] / std::max(copies, 1)) +
                           " times per micro-batch (expected exactly once)");
        break;
      }
    }
  }
}

void check_memory(const Plan& plan, std::vector<std::string>& problems) {
  namespace u = model::units;
  for (size_t d = 0; d < plan.memory.size(); ++d) {
    const DeviceMemory& m = plan.memory[d];
    const double total = m.total_bytes();
    if (m.capacity_bytes <= 0 || total <= m.capacity_bytes) continue;
    const std::pair<const char*, double> terms[] = {{"weights", m.weights_bytes},
                                                     {"gradients", m.gradients_bytes},
                                                     {"optimizer state", m.optimizer_bytes},
                                                     {"activations", m.activations_bytes},
                                                     {"workspace", m.workspace_bytes}};
    const auto largest = *std::max_element(std::begin(terms), std::end(terms),
                                           [](const auto& a, const auto& b) { return a.second < b.second; });
    std::string message = device_name(plan, static_cast<int>(d)) + " needs " + u::human_bytes(total) + " but has " +
                          u::human_bytes(m.capacity_bytes) + ": over by " + u::human_bytes(total - m.capacity_bytes) +
                          "; largest term: " + largest.first + " " + u::human_bytes(largest.second);
    if (std::string(largest.first) == "activations") {
      message += " (" + std::to_string(m.peak_in_flight) + " micro-batches in flight)";
    }
    message += " [weights " + u::human_bytes(m.weights_bytes) + ", gradients " + u::human_bytes(m.gradients_bytes) +
               ", optimizer " + u::human_bytes(m.optimizer_bytes) + ", activations " + u::human_bytes(m.activations_bytes) +
               ", workspace " + u::human_bytes(m.workspace_bytes) + "]";
    problems.push_back(message);
  }
}

}  // namespace

Validation validate_plan(const Plan& plan) {
  Validation v;
  if (!check_structure(plan, v.problems)) return v;  // the rest would read out of range
  check_transfers(plan, v.problems);
  check_local_dependencies(plan, v.problems);
  check_collectives(plan, v.problems);
  check_coverage(plan, v.problems);
  if (v.ok()) {
    const TaskOrder order = order_tasks(plan);
    if (!order.complete()) {
      std::string message = "deadlock: these tasks wait for each other in a cycle:";
      for (int t : order.cycle) message += "\n    " + describe_task(plan, t);
      v.problems.push_back(message);
    }
  }
  check_memory(plan, v.problems);
  return v;
}

void require_valid(const Plan& plan) {
  const Validation v = validate_plan(plan);
  if (v.ok()) return;
  std::string message = std::to_string(v.problems.size()) + (v.problems.size() == 1 ? " problem" : " problems");
  for (const std::string& p : v.problems) message += "\n  - " + p;
  throw PlanError(message);
}

}  // namespace hetflow::partition
