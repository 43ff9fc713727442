#include "partition/plan.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace hetflow::partition {

namespace {
constexpr std::string_view kTaskKinds[] = {"forward", "backward", "backward_weight", "optimizer",
                                           "send", "recv", "collective"};
constexpr std::string_view kPurposes[] = {"compute", "activation", "gradient", "tensor_parallel",
                                          "data_parallel", "ps_push", "ps_pull"};
}  // namespace

std::string_view to_string(TaskKind k) { return kTaskKinds[static_cast<int>(k)]; }
std::string_view to_string(Purpose p) { return kPurposes[static_cast<int>(p)]; }

TaskKind parse_task_kind(std::string_view text) {
  for (size_t i = 0; i < std::size(kTaskKinds); ++i) {
    if (kTaskKinds[i] == text) return static_cast<TaskKind>(i);
  }
  throw std::invalid_argument("expected a task kind (forward, backward, ...), found '" + std::string(text) + "'");
}

Purpose parse_purpose(std::string_view text) {
  for (size_t i = 0; i < std::size(kPurposes); ++i) {
    if (kPurposes[i] == text) return static_cast<Purpose>(i);
  }
  throw std::invalid_argument("expected a purpose (activation, gradient, ...), found '" + std::string(text) + "'");
}

int Plan::add_task(const Task& task) {
  const int id = static_cast<int>(tasks.size());
  tasks.push_back(task);
  boost::add_vertex(graph);
  if (programs.size() <= static_cast<size_t>(task.device)) programs.resize(static_cast<size_t>(task.device) + 1);
  auto& device_streams = programs[static_cast<size_t>(task.device)];
  auto it = std::find_if(device_streams.begin(), device_streams.end(),
                         [&](const StreamProgram& p) { return p.stream == task.stream; });
  if (it == device_streams.end()) it = device_streams.insert(device_streams.end(), StreamProgram{task.stream, {}});
  it->tasks.push_back(id);
  return id;
}

const std::vector<int>& Plan::program(int device, int stream) const {
  static const std::vector<int> kNone;
  if (device < 0 || static_cast<size_t>(device) >= programs.size()) return kNone;
  for (const StreamProgram& p : programs[static_cast<size_t>(device)]) {
    if (p.stream == stream) return p.tasks;
  }
  return kNone;
}

void Plan::add_dependency(int from_task, int to_task) {
  boost::add_edge(static_cast<size_t>(from_task), static_cast<size_t>(to_task), graph);
}

namespace {
std::vector<std::pair<size_t, size_t>> sorted_edges(const TaskGraph& g) {
  std::vector<std::pair<size_t, size_t>> edges;
  for (auto [it, end] = boost::edges(g); it != end; ++it) {
    edges.emplace_back(boost::source(*it, g), boost::target(*it, g));
  }
  std::sort(edges.begin(), edges.end());
  return edges;
}
}  // namespace

bool same_plan(const Plan& a, const Plan& b) {
  return a.cluster_name == b.cluster_name && a.cluster_yaml == b.cluster_yaml &&
         a.network_name == b.network_name && a.network_layers == b.network_layers && a.layout == b.layout &&
         a.device_names == b.device_names && a.streams == b.streams && a.tasks == b.tasks &&
         a.collectives == b.collectives && a.programs == b.programs && a.memory == b.memory &&
         sorted_edges(a.graph) == sorted_edges(b.graph);
}

}  // namespace hetflow::partition
