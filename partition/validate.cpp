// Validation in layers: the references (every id in range, the embedded cluster and network
// agreeing with the plan), then the program (each task once, channels matched in order,
// collectives and communicators consistent, tensors produced before they are read and freed
// after their last reader, roles and coordinates where the layout puts them, dependencies
// local), then the whole (layer coverage, deadlock,
// memory). A layer that finds problems stops the ones after it: they would read out of range.
#include "partition/validate.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <set>
#include <tuple>

#include "model/error.hpp"
#include "model/units.hpp"
#include "partition/memory.hpp"
#include "partition/policy.hpp"
#include "partition/task_order.hpp"

namespace hetflow::partition {

namespace validate_detail {
void check_roles(const Plan& plan, std::vector<std::string>& problems);  // validate_roles.cpp
void check_memory(const Plan& plan, const TaskOrder& order, Validation& v);  // validate_memory.cpp
void check_coverage(const Plan& plan, std::vector<std::string>& problems);  // validate_coverage.cpp
void check_tied_ends(const Plan& plan, std::vector<std::string>& problems);  // validate_coverage.cpp
}  // namespace validate_detail

namespace {

using Problems = std::vector<std::string>;

bool in_range(int id, size_t size) { return id >= 0 && static_cast<size_t>(id) < size; }
bool finite_non_negative(double x) { return std::isfinite(x) && x >= 0; }
std::string task_name(size_t i) { return "tasks[" + std::to_string(i) + "]"; }

// The embedded cluster and network against the plan's devices and layout.
void check_embedded(const Plan& plan, Problems& problems) {
  const std::vector<model::Device> devices = plan.cluster.devices();
  if (devices.size() != plan.device_names.size()) {
    problems.push_back("devices: the plan lists " + std::to_string(plan.device_names.size()) +
                       " devices but its embedded cluster has " + std::to_string(devices.size()) + " GPUs");
  } else {
    for (size_t d = 0; d < devices.size(); ++d) {
      if (devices[d].name != plan.device_names[d]) {
        problems.push_back("devices[" + std::to_string(d) + "]: '" + plan.device_names[d] +
                           "' is not the embedded cluster's device " + std::to_string(d) + " ('" + devices[d].name + "')");
        break;
      }
    }
  }
  try {  // (an unknown GPU type is the cluster reader's to report)
    if (const std::string why = precision_unsupported(plan.cluster, plan.layout.precision); !why.empty()) {
      problems.push_back("layout.precision: " + why);
    }
  } catch (const Error&) {
  }
  const Layout& l = plan.layout;
  const int layers = static_cast<int>(plan.network.layers.size());
  const int n = plan.device_count();
  if (layers == 0) problems.push_back("network: has no layers");
  if (l.iterations < 1) problems.push_back("layout.iterations: expected at least 1, found " + std::to_string(l.iterations));
  const long long instances = static_cast<long long>(plan.tasks.size()) * l.iterations;
  if (instances > kMaxTaskInstances) {
    problems.push_back("layout.iterations: " + std::to_string(l.iterations) + " iterations of " +
                       std::to_string(plan.tasks.size()) + " tasks are " + std::to_string(instances) +
                       " task instances; the estimate and the simulator take at most " + std::to_string(kMaxTaskInstances) +
                       ": run fewer iterations");
  }
  if (l.virtual_stages < 1 || l.micro_batch_size < 1) {
    problems.push_back("layout: virtual_stages and micro_batch_size must be at least 1");
  }
  if (!finite_non_negative(l.workspace_bytes)) problems.push_back("layout.workspace_bytes: expected a size >= 0");
  if (l.workers.empty() && l.policy != kWorkloadPolicy) {
    problems.push_back("layout.workers: expected at least one virtual worker");
  }
  for (size_t w = 0; w < l.workers.size(); ++w) {
    const VirtualWorker& vw = l.workers[w];
    const std::string where = "layout.workers[" + std::to_string(w) + "]";
    if (vw.ranks.empty()) problems.push_back(where + ".ranks: expected at least one pipeline rank");
    if (vw.microbatches < 1) problems.push_back(where + ".microbatches: expected at least 1");
    for (size_t r = 0; r < vw.ranks.size(); ++r) {
      if (vw.ranks[r].empty()) problems.push_back(where + ".ranks[" + std::to_string(r) + "]: has no device");
      for (int d : vw.ranks[r]) {
        if (!in_range(d, static_cast<size_t>(n))) {
          problems.push_back(where + ".ranks[" + std::to_string(r) + "]: device " + std::to_string(d) + " does not exist");
        }
      }
    }
    for (size_t k = 0; k < vw.stages.size(); ++k) {
      const Stage& s = vw.stages[k];
      if (!in_range(s.rank, vw.ranks.size())) {
        problems.push_back(where + ".stages[" + std::to_string(k) + "]: rank " + std::to_string(s.rank) + " does not exist");
      }
      if (s.layer_begin < 0 || s.layer_end > layers || s.layer_begin >= s.layer_end) {
        problems.push_back(where + ".stages[" + std::to_string(k) + "]: layers [" + std::to_string(s.layer_begin) + ", " +
                           std::to_string(s.layer_end) + ") are not a non-empty range of the network's " +
                           std::to_string(layers) + " layers");
      }
    }
  }
  if (l.sync.kind != SyncKind::allreduce) {
    if (l.sync.layer_server.size() != static_cast<size_t>(layers)) {
      problems.push_back("layout.sync.layer_server: expected one server per layer (" + std::to_string(layers) + "), found " +
                         std::to_string(l.sync.layer_server.size()));
    }
    for (int s : l.sync.layer_server) {
      if (!in_range(s, static_cast<size_t>(n))) {
        problems.push_back("layout.sync.layer_server: device " + std::to_string(s) + " does not exist");
        break;
      }
    }
  }
  if (l.sync.staleness < 0) problems.push_back("layout.sync.staleness: expected 0 or more");
  if (l.sync.overlap_grad_reduce && l.sync.kind != SyncKind::allreduce) {
    problems.push_back("layout.sync.overlap_grad_reduce: only applies to sync allreduce");
  }
  if (l.sync.zero.stage > 0 && l.sync.kind != SyncKind::allreduce) {
    problems.push_back("layout.sync.zero.stage: shards data-parallel state under sync allreduce only");
  }
  if (plan.memory.size() != plan.device_names.size()) {
    problems.push_back("memory: expected one entry per device (" + std::to_string(plan.device_names.size()) + "), found " +
                       std::to_string(plan.memory.size()));
  }
}

// A folded plan's collective across replicas: tasks for its members in the workers it holds
// tasks for (Layout::task_workers, the first ones), none for the replicas' devices, which
// stand in its ring only.
bool folded_replicas(const Plan& plan, const Collective& c) {
  if (!plan.layout.folded || plan.layout.workers.empty() || c.tasks.empty() || !in_range(c.communicator, plan.communicators.size())) {
    return false;
  }
  std::set<int> simulated;
  for (size_t w = 0; w < plan.layout.task_workers() && w < plan.layout.workers.size(); ++w) {
    for (const auto& rank : plan.layout.workers[w].ranks) simulated.insert(rank.begin(), rank.end());
  }
  const auto& members = plan.members(c);
  for (size_t i = 0; i < members.size(); ++i) {
    if ((simulated.count(members[i]) > 0) != (i < c.tasks.size())) return false;
  }
  return c.tasks.size() < members.size();
}

// Every id a task, tensor, channel, collective or communicator holds is in range.
void check_references(const Plan& plan, Problems& problems) {
  const auto devices = plan.device_names.size();
  const int layers = static_cast<int>(plan.network.layers.size());
  auto note = [&](const std::string& where, const std::string& what) {
    if (problems.size() < 50) problems.push_back(where + ": " + what);
  };
  for (size_t i = 0; i < plan.communicators.size(); ++i) {
    const Communicator& c = plan.communicators[i];
    const std::string where = "communicators[" + std::to_string(i) + "]";
    std::set<int> seen;
    if (c.devices.empty()) note(where, "has no device");
    for (int d : c.devices) {
      if (!in_range(d, devices)) note(where, "device " + std::to_string(d) + " does not exist");
      if (!seen.insert(d).second) note(where, "lists device " + std::to_string(d) + " twice");
    }
  }
  std::map<std::tuple<int, int, std::string>, size_t> identities;  // channel (src, dst, tag) -> first index
  for (size_t i = 0; i < plan.channels.size(); ++i) {
    const Channel& c = plan.channels[i];
    const std::string where = "channels[" + std::to_string(i) + "]";
    if (!in_range(c.src, devices) || !in_range(c.dst, devices)) {
      note(where, "device " + std::to_string(c.src) + " or " + std::to_string(c.dst) + " does not exist");
    } else if (c.src == c.dst) {
      note(where, "sends from a device to itself");
    }
    if (!in_range(c.communicator, plan.communicators.size())) {
      note(where, "communicator " + std::to_string(c.communicator) + " does not exist");
    } else {
      const auto& members = plan.communicator(c.communicator).devices;
      if (std::find(members.begin(), members.end(), c.src) == members.end() ||
          std::find(members.begin(), members.end(), c.dst) == members.end()) {
        note(where, "its devices are not both in communicator " + std::to_string(c.communicator));
      }
    }
    // Back ends tell channels apart by source, destination and tag: two alike would take
    // each other's messages.
    const auto [first, fresh] = identities.try_emplace(std::make_tuple(c.src, c.dst, c.tag), i);
    if (!fresh) {
      note(where, "has the source, destination and tag of channels[" + std::to_string(first->second) +
                      "]; their messages could not be told apart");
    }
  }
  for (size_t i = 0; i < plan.collectives.size(); ++i) {
    const Collective& c = plan.collectives[i];
    const std::string where = "collectives[" + std::to_string(i) + "]";
    if (!in_range(c.communicator, plan.communicators.size())) {
      note(where, "communicator " + std::to_string(c.communicator) + " does not exist");
      continue;
    }
    const auto& members = plan.members(c);
    if (c.tasks.size() != members.size() && !folded_replicas(plan, c)) {
      note(where, "has " + std::to_string(c.tasks.size()) + " tasks for the " + std::to_string(members.size()) +
                      " devices of its communicator");
    }
    if (!in_range(c.root, members.size())) note(where, "root " + std::to_string(c.root) + " is not a member");
    if (!finite_non_negative(c.bytes)) note(where, "bytes: expected a finite size >= 0");
    for (int t : c.tasks) {
      if (!in_range(t, plan.tasks.size())) note(where, "task " + std::to_string(t) + " does not exist");
    }
  }
  for (size_t i = 0; i < plan.tensors.size(); ++i) {
    const Tensor& t = plan.tensors[i];
    const auto where = [i] { return "tensors[" + std::to_string(i) + "]"; };
    if (!in_range(t.device, devices)) note(where(), "device " + std::to_string(t.device) + " does not exist");
    if (!finite_non_negative(t.bytes)) note(where(), "bytes: expected a finite size >= 0");
    for (std::int64_t e : t.shape) {
      if (e < 0) note(where(), "shape: negative dimension");
    }
    if (t.producer != -1 && !in_range(t.producer, plan.tasks.size())) note(where(), "producer task does not exist");
    if (t.free_after != -1 && !in_range(t.free_after, plan.tasks.size())) note(where(), "free_after task does not exist");
  }
  for (size_t i = 0; i < plan.order.size(); ++i) {
    const OrderEdge& e = plan.order[i];
    if (!in_range(e.from, plan.tasks.size()) || !in_range(e.to, plan.tasks.size())) {
      note("order[" + std::to_string(i) + "]", "task does not exist");
    }
    if (e.offset < 0) note("order[" + std::to_string(i) + "]", "offset: expected 0 or more");
    if (!(e.fraction > 0 && e.fraction <= 1)) {
      note("order[" + std::to_string(i) + "]", "fraction: expected a part of the first task's work in (0, 1]");
    } else if (e.fraction < 1 && in_range(e.from, plan.tasks.size())) {
      const TaskKind k = plan.tasks[static_cast<size_t>(e.from)].kind;
      if (k == TaskKind::send || k == TaskKind::recv || k == TaskKind::collective) {
        note("order[" + std::to_string(i) + "]", "fraction: only a compute task's work can be waited for in part, not a " +
                                                    std::string(to_string(k)) + "'s");
      }
      if (e.offset != 0) note("order[" + std::to_string(i) + "]", "fraction: only within one iteration (offset 0)");
    }
  }
  for (size_t i = 0; i < plan.tasks.size(); ++i) {
    const Task& t = plan.tasks[i];
    const auto where = [&t, i] { return task_name(i) + " (" + std::string(to_string(t.kind)) + ")"; };
    if (!in_range(t.device, devices)) note(where(), "device " + std::to_string(t.device) + " does not exist");
    if (!in_range(t.stream, plan.streams.size())) note(where(), "stream " + std::to_string(t.stream) + " does not exist");
    const bool transfer = t.kind == TaskKind::send || t.kind == TaskKind::recv;
    if (transfer != (t.channel != -1) || (transfer && !in_range(t.channel, plan.channels.size()))) {
      note(where(), transfer ? "channel " + std::to_string(t.channel) + " does not exist" : "only transfers have a channel");
    }
    const bool collective = t.kind == TaskKind::collective;
    if (collective != (t.collective != -1) || (collective && !in_range(t.collective, plan.collectives.size()))) {
      note(where(), collective ? "collective " + std::to_string(t.collective) + " does not exist"
                             : "only collective tasks name a collective");
    }
    if (t.worker != -1) {
      if (!in_range(t.worker, plan.layout.workers.size())) {
        note(where(), "worker " + std::to_string(t.worker) + " does not exist");
      } else if (t.stage != -1 && !in_range(t.stage, plan.layout.workers[static_cast<size_t>(t.worker)].stages.size())) {
        note(where(), "stage " + std::to_string(t.stage) + " does not exist in worker " + std::to_string(t.worker));
      } else if (t.microbatch >= plan.layout.workers[static_cast<size_t>(t.worker)].microbatches) {
        note(where(), "micro-batch " + std::to_string(t.microbatch) + " does not exist in worker " + std::to_string(t.worker));
      }
    } else if (t.stage != -1 || t.microbatch != -1) {
      note(where(), "a stage or micro-batch without a worker");
    }
    if (t.stage < -1 || t.microbatch < -1 || t.layer_begin < 0 || t.layer_end > layers || t.layer_begin > t.layer_end) {
      note(where(), "stage, micro-batch or layers out of range");
    }
    if (!finite_non_negative(t.flops) || !finite_non_negative(t.recompute_flops) || !finite_non_negative(t.memory_bytes) ||
        !finite_non_negative(t.bytes) || t.recompute_flops > t.flops) {
      note(where(), "flops, recompute_flops, memory_bytes and bytes must be finite and >= 0 (recompute_flops <= flops)");
    }
    for (const auto refs : {plan.reads(static_cast<int>(i)), plan.writes(static_cast<int>(i))}) {
      for (int r : refs) {
        if (!in_range(r, plan.tensors.size())) note(where(), "tensor " + std::to_string(r) + " does not exist");
      }
    }
  }
}

// Each task listed exactly once, in the program of the device and stream it names.
void check_programs(const Plan& plan, Problems& problems) {
  std::vector<int> listed(plan.tasks.size(), 0);
  if (plan.programs.size() > plan.device_names.size()) {
    problems.push_back("programs: " + std::to_string(plan.programs.size()) + " device programs for " +
                       std::to_string(plan.device_names.size()) + " devices");
  }
  for (size_t d = 0; d < plan.programs.size(); ++d) {
    std::set<int> streams;
    for (const StreamProgram& program : plan.programs[d]) {
      if (!streams.insert(program.stream).second) {
        problems.push_back("programs[" + std::to_string(d) + "]: stream " + std::to_string(program.stream) + " listed twice");
      }
      for (int id : program.tasks) {
        if (!in_range(id, plan.tasks.size())) {
          problems.push_back("programs[" + std::to_string(d) + "]: task " + std::to_string(id) + " does not exist");
          continue;
        }
        const Task& t = plan.task(id);
        if (static_cast<size_t>(t.device) != d || t.stream != program.stream) {
          problems.push_back(describe_task(plan, id) + " is listed in the program of device " + std::to_string(d) +
                             " stream " + std::to_string(program.stream) + " but runs on device " + std::to_string(t.device) +
                             " stream " + std::to_string(t.stream));
        }
        ++listed[static_cast<size_t>(id)];
      }
    }
  }
  for (size_t i = 0; i < listed.size(); ++i) {
    if (listed[i] != 1 && problems.size() < 50) {
      problems.push_back(describe_task(plan, static_cast<int>(i)) + " appears " + std::to_string(listed[i]) +
                         " times in the device programs (expected once)");
    }
  }
}

// Transfers: on each channel, sends from its source on one stream and receives at its
// destination on one stream, as many of each, the k-th of each moving the same bytes from
// a tensor into a tensor at least that large (a parameter-server pull fills part of a
// chunk's weights).
void check_channels(const Plan& plan, Problems& problems) {
  std::vector<std::vector<int>> sends(plan.channels.size()), recvs(plan.channels.size());
  for (const auto& device : plan.programs) {
    for (const StreamProgram& stream : device) {
      for (int t : stream.tasks) {
        const Task& task = plan.task(t);
        if (task.kind == TaskKind::send) sends[static_cast<size_t>(task.channel)].push_back(t);
        if (task.kind == TaskKind::recv) recvs[static_cast<size_t>(task.channel)].push_back(t);
      }
    }
  }
  auto one_tensor = [&](std::span<const int> refs) { return refs.size() == 1 ? refs[0] : -1; };
  for (size_t c = 0; c < plan.channels.size() && problems.size() < 50; ++c) {
    const Channel& ch = plan.channels[c];
    const auto where = [&] {
      return "channel " + std::to_string(c) + " (" + plan.device_name(ch.src) + " -> " +
             plan.device_name(ch.dst) + ", " + ch.tag + ")";
    };
    for (const auto& [side, device, name] : {std::tuple{&sends[c], ch.src, "send"}, std::tuple{&recvs[c], ch.dst, "receive"}}) {
      for (int t : *side) {
        if (plan.task(t).device != device) {
          problems.push_back(where() + ": " + describe_task(plan, t) + " is a " + name + " on the wrong device");
        }
        if (plan.task(t).stream != plan.task(side->front()).stream) {
          problems.push_back(where() + ": its " + name + "s are on several streams (" + describe_task(plan, side->front()) +
                             ", " + describe_task(plan, t) + "), so their order is not defined");
          break;
        }
      }
    }
    if (sends[c].size() != recvs[c].size()) {
      problems.push_back(where() + ": " + std::to_string(sends[c].size()) + " sends but " + std::to_string(recvs[c].size()) +
                         " receives" +
                         (sends[c].size() > recvs[c].size()
                              ? "; unmatched send: " + describe_task(plan, sends[c][recvs[c].size()])
                              : "; unmatched receive: " + describe_task(plan, recvs[c][sends[c].size()])));
      continue;
    }
    for (size_t k = 0; k < sends[c].size(); ++k) {
      const int s = sends[c][k], r = recvs[c][k];
      const Task& a = plan.task(s);
      const Task& b = plan.task(r);
      if (a.bytes != b.bytes) {
        problems.push_back(where() + ": message " + std::to_string(k) + " is sent as " + model::units::human_bytes(a.bytes) +
                           " (" + describe_task(plan, s) + ") but received as " + model::units::human_bytes(b.bytes) + " (" +
                           describe_task(plan, r) + ")");
        break;
      }
      const int sent = one_tensor(plan.reads(s)), received = one_tensor(plan.writes(r));
      const bool tensors = !plan.reads(s).empty() || !plan.writes(r).empty();
      if (tensors && (sent < 0 || received < 0 || plan.tensor(sent).bytes < a.bytes ||
                      plan.tensor(received).bytes < b.bytes)) {
        problems.push_back(where() + ": message " + std::to_string(k) + " (" + describe_task(plan, s) +
                           ") must read one tensor of at least its bytes and its receive write one of at least its bytes");
        break;
      }
    }
  }
}

// An in-task collective whose messages overlap the work (Collective::until): each waits at
// or after its start, and before the task's next message starts (a pass has one message in
// flight at a time).
void check_overlap(const Plan& plan, int c, Problems& problems) {
  const Collective& col = plan.collective(c);
  if (col.until.empty()) return;
  const std::string name = "collective " + std::to_string(c) + ": ";
  if (col.until.size() != col.at.size()) {
    problems.push_back(name + "expected `until` to give one point per message (" + std::to_string(col.at.size()) +
                       "), found " + std::to_string(col.until.size()));
    return;
  }
  for (size_t m = 0; m < col.at.size(); ++m) {
    if (!(col.until[m] >= col.at[m] && col.until[m] <= 1)) {
      problems.push_back(name + "message " + std::to_string(m) + " is waited for at " + std::to_string(col.until[m]) +
                         ", before it starts (" + std::to_string(col.at[m]) + ") or past the task's end");
      return;
    }
  }
  if (col.tasks.empty()) return;
  const std::span<const InTaskCall> calls = plan.inside(col.tasks.front());
  for (size_t k = 0; k + 1 < calls.size(); ++k) {
    if (calls[k].collective == c && calls[k + 1].at < calls[k].until) {
      problems.push_back(name + "message " + std::to_string(calls[k].message) + " is still in flight where " +
                         describe_task(plan, col.tasks.front()) + " starts its next message (collective " +
                         std::to_string(calls[k + 1].collective) + "): a pass has one message in flight at a time");
      return;
    }
  }
}

void check_collectives(const Plan& plan, Problems& problems) {
  for (size_t c = 0; c < plan.collectives.size(); ++c) {
    const Collective& col = plan.collectives[c];
    const auto& members = plan.members(col);
    for (size_t i = 0; i < col.tasks.size() && i < members.size(); ++i) {
      const Task& t = plan.tasks[static_cast<size_t>(col.tasks[i])];
      if (col.in_task()) {  // runs inside a forward or backward pass of each member
        if (!is_pass(t.kind) || t.device != members[i]) {
          problems.push_back("collective " + std::to_string(c) + ": runs inside " + describe_task(plan, col.tasks[i]) +
                             ", which is not a forward or backward pass of member " + std::to_string(i) +
                             " of its communicator");
          break;
        }
      } else if (t.kind != TaskKind::collective || t.collective != static_cast<int>(c) || t.device != members[i] ||
                 t.bytes != col.bytes) {
        problems.push_back("collective " + std::to_string(c) + ": participant " + describe_task(plan, col.tasks[i]) +
                           " does not match it (kind, collective, device in communicator order, or bytes)");
        break;
      }
    }
    if (col.in_task()) {
      if (col.at.size() != static_cast<size_t>(col.messages) || !std::is_sorted(col.at.begin(), col.at.end()) ||
          col.at.back() > 1) {
        problems.push_back("collective " + std::to_string(c) + ": expected one point in [0, 1] per message (" +
                           std::to_string(col.messages) + "), in ascending order, found " + std::to_string(col.at.size()));
      }
      check_overlap(plan, static_cast<int>(c), problems);
      if (col.tasks.size() != members.size()) {
        problems.push_back("collective " + std::to_string(c) + ": an in-task collective runs in a task of every member (" +
                           std::to_string(members.size()) + "), found " + std::to_string(col.tasks.size()));
      }
      // Every member's task performs the same messages on this communicator in the same
      // order, or they would wait for each other in different collectives (a pass's
      // tensor-parallel calls are on its rank's group; its context group's calls on the
      // group's at its tensor rank, which its rank's other members do not share). Checked
      // once per group of tasks: by the communicator's collective that comes first in them.
      const auto calls_on_communicator = [&](int task) {
        std::vector<std::pair<int, int>> calls;
        for (const InTaskCall& call : plan.inside(task)) {
          if (plan.collective(call.collective).communicator != col.communicator) continue;
          calls.emplace_back(call.collective, call.message);
        }
        return calls;
      };
      const std::vector<std::pair<int, int>> first = calls_on_communicator(col.tasks.front());
      if (!first.empty() && first.front().first == static_cast<int>(c)) {
        for (int t : col.tasks) {
          const bool same = calls_on_communicator(t) == first;
          if (!same) {
            problems.push_back("collective " + std::to_string(c) + ": " + describe_task(plan, t) + " and " +
                               describe_task(plan, col.tasks.front()) +
                               " perform different in-task collectives on communicator " +
                               std::to_string(col.communicator) + ", or in a different order");
            break;
          }
        }
      }
    }
    if (col.messages < 1) {
      problems.push_back("collective " + std::to_string(c) + ": expected at least 1 message, found " + std::to_string(col.messages));
    }
    if (!supports(col.kind, col.algorithm)) {
      problems.push_back("collective " + std::to_string(c) + ": " + std::string(to_string(col.kind)) + " has no " +
                         std::string(to_string(col.algorithm)) + " algorithm");
    }
    const Task& first = plan.task(col.tasks.front());
    for (int t : col.tasks) {
      if (plan.task(t).stream != first.stream) {
        problems.push_back("collective " + std::to_string(c) + ": its participants are on different streams (" +
                           describe_task(plan, col.tasks.front()) + ", " + describe_task(plan, t) + ")");
        break;
      }
    }
  }
  for (size_t i = 0; i < plan.tasks.size(); ++i) {
    const Task& t = plan.tasks[i];
    if (t.kind != TaskKind::collective) continue;
    const auto& tasks = plan.collective(t.collective).tasks;
    if (std::find(tasks.begin(), tasks.end(), static_cast<int>(i)) == tasks.end() && problems.size() < 50) {
      problems.push_back(describe_task(plan, static_cast<int>(i)) + " is not among the tasks of its collective");
    }
  }
}

// Tensors: a transient one written by exactly its producer, read only on its device, freed
// after a task that comes after every reader; a persistent one touched only on its device.
void check_tensors(const Plan& plan, Problems& problems) {
  std::vector<int> writers(plan.tensors.size(), 0);
  // Readers of each tensor in one array: tensor i's are reader_ids[reader_begin[i], reader_begin[i + 1]).
  std::vector<int> reader_begin(plan.tensors.size() + 1, 0), reader_ids(plan.refs.size());
  for (size_t i = 0; i < plan.tasks.size(); ++i) {
    for (int r : plan.reads(static_cast<int>(i))) ++reader_begin[static_cast<size_t>(r) + 1];
  }
  for (size_t i = 0; i < plan.tensors.size(); ++i) reader_begin[i + 1] += reader_begin[i];
  {
    std::vector<int> fill(reader_begin.begin(), reader_begin.end() - 1);
    for (size_t i = 0; i < plan.tasks.size(); ++i) {
      for (int r : plan.reads(static_cast<int>(i))) reader_ids[static_cast<size_t>(fill[static_cast<size_t>(r)]++)] = static_cast<int>(i);
    }
  }
  const auto readers = [&](size_t i) {
    return std::span<const int>(reader_ids.data() + reader_begin[i], static_cast<size_t>(reader_begin[i + 1] - reader_begin[i]));
  };
  for (size_t i = 0; i < plan.tasks.size(); ++i) {
    for (int w : plan.writes(static_cast<int>(i))) {
      const Tensor& t = plan.tensor(w);
      ++writers[static_cast<size_t>(w)];
      if (!is_persistent(t.kind) && t.producer != static_cast<int>(i) && problems.size() < 50) {
        problems.push_back("tensors[" + std::to_string(w) + "]: written by " + describe_task(plan, static_cast<int>(i)) +
                           ", which is not its producer");
      }
    }
  }
  // Position of each task in its stream, to tell "comes before" by program order.
  std::vector<int> position(plan.tasks.size(), -1);
  for (const auto& device : plan.programs) {
    for (const StreamProgram& s : device) {
      for (size_t k = 0; k < s.tasks.size(); ++k) position[static_cast<size_t>(s.tasks[k])] = static_cast<int>(k);
    }
  }
  auto precedes = [&](int a, int b) {  // a is done before b starts, or a == b
    if (a == b) return true;
    const Task& x = plan.task(a);
    const Task& y = plan.task(b);
    if (x.device == y.device && x.stream == y.stream) return position[static_cast<size_t>(a)] < position[static_cast<size_t>(b)];
    for (auto [it, end] = boost::out_edges(static_cast<size_t>(a), plan.graph); it != end; ++it) {
      if (boost::target(*it, plan.graph) == static_cast<size_t>(b) && plan.graph[*it].offset == 0) return true;
    }
    return false;
  };
  for (size_t i = 0; i < plan.tensors.size() && problems.size() < 50; ++i) {
    const Tensor& t = plan.tensors[i];
    const auto where = [&t, i] { return "tensors[" + std::to_string(i) + "] (" + std::string(to_string(t.kind)) + ")"; };
    for (int r : readers(i)) {
      if (plan.task(r).device != t.device) {
        problems.push_back(where() + ": read by " + describe_task(plan, r) + " on another device; devices exchange data "
                                   "only through transfers and collectives");
        break;
      }
    }
    if (is_persistent(t.kind)) {
      if (t.producer != -1 || t.free_after != -1) problems.push_back(where() + ": persistent, so no producer and no free_after");
      continue;
    }
    if (t.producer < 0) {
      if (!readers(i).empty()) problems.push_back(where() + ": read by " + describe_task(plan, readers(i).front()) + " but never written");
      continue;
    }
    if (writers[i] != 1) {
      problems.push_back(where() + ": written by " + std::to_string(writers[i]) + " tasks (expected its producer alone)");
      continue;
    }
    if (plan.task(t.producer).device != t.device) {
      problems.push_back(where() + ": produced on another device than it lives on");
      continue;
    }
    if (t.free_after < 0) {
      problems.push_back(where() + ": has no free_after task");
      continue;
    }
    if (t.free_after != t.producer &&
        std::find(readers(i).begin(), readers(i).end(), t.free_after) == readers(i).end()) {
      problems.push_back(where() + ": freed after " + describe_task(plan, t.free_after) + ", which neither produces nor reads it");
      continue;
    }
    for (int r : readers(i)) {
      if (!precedes(r, t.free_after)) {
        problems.push_back(where() + ": freed after " + describe_task(plan, t.free_after) + " while " + describe_task(plan, r) +
                           " may still read it");
        break;
      }
    }
  }
}

// Devices exchange data only through transfers and collectives: a dependency between tasks
// of different devices has no meaning on real hardware (and back ends rely on it).
void check_local_dependencies(const Plan& plan, Problems& problems) {
  for (auto [it, end] = boost::edges(plan.graph); it != end; ++it) {
    const auto a = static_cast<int>(boost::source(*it, plan.graph));
    const auto b = static_cast<int>(boost::target(*it, plan.graph));
    if (plan.task(a).device != plan.task(b).device) {
      problems.push_back(describe_task(plan, b) + " depends on " + describe_task(plan, a) +
                         " on another device: devices exchange data only through transfers and collectives");
      return;  // one says enough
    }
  }
}

}  // namespace

Validation validate_plan(const Plan& plan) {
  Validation v;
  check_embedded(plan, v.problems);
  if (!v.ok()) return v;  // the rest reads the layout and the device list
  check_references(plan, v.problems);
  if (!v.ok()) return v;
  if (boost::num_vertices(plan.graph) != plan.tasks.size()) {
    v.problems.push_back("the task graph has " + std::to_string(boost::num_vertices(plan.graph)) + " vertices for " +
                         std::to_string(plan.tasks.size()) + " tasks");
    return v;
  }
  check_programs(plan, v.problems);
  if (!v.ok()) return v;
  check_channels(plan, v.problems);
  check_collectives(plan, v.problems);
  validate_detail::check_roles(plan, v.problems);
  check_tensors(plan, v.problems);
  check_local_dependencies(plan, v.problems);
  validate_detail::check_coverage(plan, v.problems);
  validate_detail::check_tied_ends(plan, v.problems);
  if (!v.ok()) return v;
  const TaskOrder order = order_tasks(plan);
  if (!order.complete()) {
    std::string message = "deadlock: these tasks wait for each other in a cycle:";
    for (int t : order.cycle) message += "\n    " + describe_task(plan, t);
    v.problems.push_back(message);
    return v;
  }
  validate_detail::check_memory(plan, order, v);
  return v;
}

void require_valid(const Plan& plan) {
  const Validation v = validate_plan(plan);
  if (v.ok()) return;
  std::string message = std::to_string(v.count()) + (v.count() == 1 ? " problem" : " problems");
  if (v.over_memory > 0 && v.over_memory == v.count()) {
    // What the lines below are: devices, the worst first, and how many of them there are.
    message = std::to_string(v.over_memory) + " of " + std::to_string(v.devices) + " devices " +
              (v.over_memory == 1 ? "is over its memory" : "are over their memory") +
              (v.unlisted > 0 ? ", the " + std::to_string(v.problems.size()) + " worst:" : ":");
  }
  for (const std::string& p : v.problems) message += "\n  - " + p;
  if (v.unlisted > 0) message += "\n  " + v.unlisted_note;
  throw PlanError(message);
}

}  // namespace hetflow::partition
