#include "partition/plan.hpp"

#include <algorithm>
#include <iterator>
#include <limits>
#include <stdexcept>
#include <string>

namespace hetflow::partition {

namespace {
constexpr std::string_view kTaskKinds[] = {"forward", "backward", "backward_weight", "optimizer",
                                           "send", "recv", "collective", "load",
                                           "to_host", "host_optimizer", "to_device"};
constexpr std::string_view kPurposes[] = {"compute",  "activation", "gradient", "tensor_parallel", "sequence_parallel",
                                          "data_parallel", "embedding", "ps_push", "ps_pull", "gradient_norm",
                                          "offload", "context_parallel", "expert_parallel"};
constexpr std::string_view kTensorKinds[] = {"activation", "activation_grad", "stash", "partial_sum",
                                             "weight", "weight_grad", "optimizer_state", "workspace", "pushed_grad",
                                             "gathered_weight", "unsharded_grad", "host_state", "host_stash"};
constexpr std::string_view kCommRoles[] = {"tensor", "pipeline", "data",   "embedding",  "server",
                                           "gradient_norm", "context", "expert", "unspecified"};

template <typename Enum, size_t N>
Enum parse_name(std::string_view text, const std::string_view (&names)[N], const char* what) {
  std::string accepted;
  for (size_t i = 0; i < N; ++i) {
    if (names[i] == text) return static_cast<Enum>(i);
    accepted += (i == 0 ? "" : ", ") + std::string(names[i]);
  }
  throw std::invalid_argument(std::string("expected ") + what + " (" + accepted + "), found '" + std::string(text) + "'");
}
}  // namespace

std::string_view to_string(TaskKind k) { return kTaskKinds[static_cast<size_t>(k)]; }
std::string_view to_string(Purpose p) { return kPurposes[static_cast<size_t>(p)]; }
std::string_view to_string(TensorKind k) { return kTensorKinds[static_cast<size_t>(k)]; }
TaskKind parse_task_kind(std::string_view text) { return parse_name<TaskKind>(text, kTaskKinds, "a task kind"); }
Purpose parse_purpose(std::string_view text) { return parse_name<Purpose>(text, kPurposes, "a purpose"); }
TensorKind parse_tensor_kind(std::string_view text) {
  return parse_name<TensorKind>(text, kTensorKinds, "a tensor kind");
}

std::string_view to_string(CommRole r) { return kCommRoles[static_cast<size_t>(r)]; }
CommRole parse_comm_role(std::string_view text) { return parse_name<CommRole>(text, kCommRoles, "a communicator role"); }

CommRole role_of(Purpose p) {
  switch (p) {
    case Purpose::tensor_parallel:
    case Purpose::sequence_parallel: return CommRole::tensor;
    case Purpose::activation:
    case Purpose::gradient: return CommRole::pipeline;
    case Purpose::data_parallel: return CommRole::data;
    case Purpose::embedding: return CommRole::embedding;
    case Purpose::ps_push:
    case Purpose::ps_pull: return CommRole::server;
    case Purpose::gradient_norm: return CommRole::gradient_norm;
    case Purpose::context_parallel: return CommRole::context;
    case Purpose::expert_parallel: return CommRole::expert;
    case Purpose::compute:
    case Purpose::offload: break;
  }
  return CommRole::unspecified;
}

bool is_pass(TaskKind k) { return k == TaskKind::forward || k == TaskKind::backward || k == TaskKind::backward_weight; }
bool is_compute(TaskKind k) { return is_pass(k) || k == TaskKind::optimizer; }

bool is_host_copy(TaskKind k) { return k == TaskKind::to_host || k == TaskKind::to_device; }

bool is_persistent(TensorKind k) {
  return k == TensorKind::weight || k == TensorKind::weight_grad || k == TensorKind::optimizer_state ||
         k == TensorKind::host_state;
}

int Plan::add_task(const Task& task, std::span<const int> reads_of_task, std::span<const int> writes_of_task) {
  const int id = static_cast<int>(tasks.size());
  tasks.push_back(task);
  ref_begin.push_back(static_cast<std::uint32_t>(refs.size()));
  read_count.push_back(static_cast<std::uint16_t>(reads_of_task.size()));
  write_count.push_back(static_cast<std::uint16_t>(writes_of_task.size()));
  refs.insert(refs.end(), reads_of_task.begin(), reads_of_task.end());
  refs.insert(refs.end(), writes_of_task.begin(), writes_of_task.end());
  for (int w : writes_of_task) {
    Tensor& t = tensors[static_cast<size_t>(w)];
    if (!is_persistent(t.kind) && t.producer < 0) t.producer = id;
  }
  if (task.device >= 0) {
    if (programs.size() <= static_cast<size_t>(task.device)) programs.resize(static_cast<size_t>(task.device) + 1);
    auto& device_streams = programs[static_cast<size_t>(task.device)];
    auto it = std::find_if(device_streams.begin(), device_streams.end(),
                           [&](const StreamProgram& p) { return p.stream == task.stream; });
    if (it == device_streams.end()) it = device_streams.insert(device_streams.end(), StreamProgram{task.stream, {}});
    it->tasks.push_back(id);
  }
  return id;
}

void Plan::finish() {
  std::vector<std::pair<size_t, size_t>> edges;
  std::vector<Dependency> properties;
  edges.reserve(order.size() + refs.size());
  properties.reserve(order.size() + refs.size());
  for (const OrderEdge& e : order) {
    if (e.from < 0 || e.to < 0 || static_cast<size_t>(e.from) >= tasks.size() || static_cast<size_t>(e.to) >= tasks.size()) {
      continue;  // validation names it
    }
    edges.emplace_back(static_cast<size_t>(e.from), static_cast<size_t>(e.to));
    properties.push_back(Dependency{e.offset, false, e.fraction});
  }
  for (size_t task = 0; task < tasks.size(); ++task) {
    for (int r : reads(static_cast<int>(task))) {
      if (r < 0 || static_cast<size_t>(r) >= tensors.size()) continue;
      const Tensor& t = tensors[static_cast<size_t>(r)];
      if (is_persistent(t.kind) || t.producer < 0 || static_cast<size_t>(t.producer) == task ||
          static_cast<size_t>(t.producer) >= tasks.size()) {
        continue;
      }
      edges.emplace_back(static_cast<size_t>(t.producer), task);
      properties.push_back(Dependency{0, true});
    }
  }
  graph = TaskGraph(boost::edges_are_unsorted_multi_pass, edges.begin(), edges.end(), properties.begin(), tasks.size());
  index_in_task_calls();
  finished_ = true;
}

void Plan::index_in_task_calls() {
  inside_begin_.clear();
  inside_.clear();
  if (std::none_of(collectives.begin(), collectives.end(), [](const Collective& c) { return c.in_task(); })) return;
  inside_begin_.assign(tasks.size() + 1, 0);
  const auto valid = [this](int t) { return t >= 0 && static_cast<size_t>(t) < tasks.size(); };
  for (const Collective& c : collectives) {
    if (!c.in_task()) continue;
    for (int t : c.tasks) {
      if (valid(t)) inside_begin_[static_cast<size_t>(t) + 1] += static_cast<std::uint32_t>(c.at.size());
    }
  }
  for (size_t t = 0; t < tasks.size(); ++t) inside_begin_[t + 1] += inside_begin_[t];
  inside_.resize(inside_begin_.back());
  std::vector<std::uint32_t> fill(inside_begin_.begin(), inside_begin_.end() - 1);
  for (size_t c = 0; c < collectives.size(); ++c) {
    const Collective& col = collectives[c];
    if (!col.in_task()) continue;
    for (int t : col.tasks) {
      if (!valid(t)) continue;
      for (size_t m = 0; m < col.at.size(); ++m) {
        const double until = m < col.until.size() ? std::max(col.at[m], col.until[m]) : col.at[m];
        inside_[fill[static_cast<size_t>(t)]++] = InTaskCall{static_cast<int>(c), static_cast<int>(m), col.at[m], until};
      }
    }
  }
  for (size_t t = 0; t < tasks.size(); ++t) {  // (filled by collective then message: a stable sort by point keeps that)
    std::stable_sort(inside_.begin() + inside_begin_[t], inside_.begin() + inside_begin_[t + 1],
                     [](const InTaskCall& a, const InTaskCall& b) { return a.at < b.at; });
  }
}

std::span<const InTaskCall> Plan::inside(int task) const {
  const auto t = static_cast<size_t>(task);
  if (task < 0 || t + 1 >= inside_begin_.size()) return {};
  return {inside_.data() + inside_begin_[t], inside_begin_[t + 1] - inside_begin_[t]};
}

int Plan::add_tensor(const Tensor& tensor) {
  tensors.push_back(tensor);
  return static_cast<int>(tensors.size()) - 1;
}

void Plan::add_order(int from_task, int to_task, int offset, double fraction) {
  order.push_back(OrderEdge{from_task, to_task, offset, fraction});
  if (finished_) finish();  // an edit after the fact (tests, tools): rare, so rebuilt whole
}

int Plan::add_channel(const Channel& channel) {
  channels.push_back(channel);
  return static_cast<int>(channels.size()) - 1;
}

int Plan::add_communicator(const Communicator& communicator) {
  communicators.push_back(communicator);
  return static_cast<int>(communicators.size()) - 1;
}

std::span<const int> Plan::reads(int task) const {
  const auto t = static_cast<size_t>(task);
  return {refs.data() + ref_begin[t], read_count[t]};
}

std::span<const int> Plan::writes(int task) const {
  const auto t = static_cast<size_t>(task);
  return {refs.data() + ref_begin[t] + read_count[t], write_count[t]};
}

std::vector<std::vector<int>> Plan::consumers() const {
  std::vector<std::vector<int>> out(tensors.size());
  for (size_t t = 0; t < tasks.size(); ++t) {
    for (int r : reads(static_cast<int>(t))) {
      if (r >= 0 && static_cast<size_t>(r) < out.size()) out[static_cast<size_t>(r)].push_back(static_cast<int>(t));
    }
  }
  return out;
}

const std::vector<int>& Plan::program(int device, int stream) const {
  static const std::vector<int> kNone;
  if (device < 0 || static_cast<size_t>(device) >= programs.size()) return kNone;
  for (const StreamProgram& p : programs[static_cast<size_t>(device)]) {
    if (p.stream == stream) return p.tasks;
  }
  return kNone;
}

int Plan::peer(int task) const {
  const Task& t = tasks[static_cast<size_t>(task)];
  if (t.channel < 0 || static_cast<size_t>(t.channel) >= channels.size()) return -1;
  const Channel& c = channels[static_cast<size_t>(t.channel)];
  return t.kind == TaskKind::send ? c.dst : c.src;
}

namespace {
std::vector<std::tuple<size_t, size_t, int, bool, double>> sorted_edges(const TaskGraph& g) {
  std::vector<std::tuple<size_t, size_t, int, bool, double>> edges;
  for (auto [it, end] = boost::edges(g); it != end; ++it) {
    edges.emplace_back(boost::source(*it, g), boost::target(*it, g), g[*it].offset, g[*it].data, g[*it].fraction);
  }
  std::sort(edges.begin(), edges.end());
  return edges;
}
}  // namespace

bool same_plan(const Plan& a, const Plan& b) {
  return a.cluster == b.cluster && a.network == b.network && a.layout == b.layout && a.device_names == b.device_names && a.coords == b.coords &&
         a.streams == b.streams && a.communicators == b.communicators && a.channels == b.channels &&
         a.tensors == b.tensors && a.tasks == b.tasks && a.collectives == b.collectives && a.order == b.order &&
         a.programs == b.programs && a.memory == b.memory && a.refs == b.refs && a.ref_begin == b.ref_begin &&
         a.read_count == b.read_count && a.write_count == b.write_count && sorted_edges(a.graph) == sorted_edges(b.graph);
}

}  // namespace hetflow::partition
