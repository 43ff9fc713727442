// How the CUDA back end's communicators come from a plan: channels first (one group each, in
// channel order), then collectives grouped by (communicator, member streams) in collective
// order; then every group's collective sequence is read off each member's stream program and
// compared.
#include "exec/cuda_plan.hpp"

#include <algorithm>
#include <array>
#include <map>
#include <set>
#include <utility>

#include "partition/task_order.hpp"

namespace hetflow::exec {

std::vector<int> gpu_ordinals(int devices, int visible, std::span<const int> requested, const std::string& why) {
  return gpu_ordinals(devices, visible, requested, why, {}, 0);
}

std::vector<int> gpu_ordinals(int devices, int visible, std::span<const int> requested, const std::string& why,
                              std::span<const int> owner, int process, int first) {
  const auto mine = [&](int d) { return owner.empty() || owner[static_cast<size_t>(d)] == process; };
  int here = 0;
  for (int d = 0; d < devices; ++d) here += mine(d) ? 1 : 0;
  const std::string of = owner.empty() ? "the plan's " : "this process's ";
  if (visible <= 0) {
    throw Error("no CUDA device visible" + (why.empty() ? std::string() : " (" + why + ")") + ": " + of +
                std::to_string(here) + " device(s) need as many GPUs; the cpu back end runs without one");
  }
  std::vector<int> out(static_cast<size_t>(devices), -1);
  if (requested.empty()) {
    if (first + here > visible) {
      if (owner.empty()) {
        throw PlanError("the plan has " + std::to_string(here) + " devices but only " + std::to_string(visible) +
                        " CUDA device(s) are visible: device d runs on GPU d, so it needs " + std::to_string(here) +
                        " GPUs (or a list of GPUs to run its devices on)");
      }
      throw PlanError("this process (rank " + std::to_string(process) + ") runs " + std::to_string(here) +
                      " devices on GPUs " + std::to_string(first) + " to " + std::to_string(first + here - 1) +
                      " (its node's lower ranks take the GPUs before them), but only " + std::to_string(visible) +
                      " CUDA device(s) are visible here");
    }
    for (int d = 0, next = first; d < devices; ++d) {
      if (mine(d)) out[static_cast<size_t>(d)] = next++;
    }
    return out;
  }
  if (static_cast<int>(requested.size()) != devices) {
    throw InputError("<options>", 0, "gpus", "expected one GPU per plan device (" + std::to_string(devices) + "), found " +
                                                 std::to_string(requested.size()));
  }
  for (int d = 0; d < devices; ++d) {
    if (!mine(d)) continue;
    const int g = requested[static_cast<size_t>(d)];
    if (g < 0 || g >= visible) {
      throw InputError("<options>", 0, "gpus", "GPU " + std::to_string(g) + " is not visible (" + std::to_string(visible) +
                                                   " CUDA device(s): 0 to " + std::to_string(visible - 1) + ")");
    }
    out[static_cast<size_t>(d)] = g;
  }
  return out;
}

std::vector<int> first_gpus(const std::vector<std::string>& hosts, std::span<const int> owner) {
  std::vector<int> devices_of(hosts.size(), 0), out(hosts.size(), 0);
  for (const int p : owner) {
    if (p >= 0 && static_cast<size_t>(p) < hosts.size()) ++devices_of[static_cast<size_t>(p)];
  }
  for (size_t p = 0; p < hosts.size(); ++p) {
    for (size_t q = 0; q < p; ++q) {
      if (hosts[q] == hosts[p]) out[p] += devices_of[q];
    }
  }
  return out;
}

std::vector<int> device_owners(int devices, int processes, const std::function<int(int)>& owner_of) {
  std::vector<int> out(static_cast<size_t>(devices), 0);
  if (processes > 1) {
    for (int d = 0; d < devices; ++d) out[static_cast<size_t>(d)] = owner_of(d);
  }
  return out;
}

std::vector<int> CudaPlan::processes(size_t g) const {
  std::set<int> in;
  for (const int d : groups[g].devices) in.insert(owner[static_cast<size_t>(d)]);
  return {in.begin(), in.end()};
}

namespace {

using partition::Plan;
using partition::Task;
using partition::TaskKind;

// The stream each side of each channel is on (-1: none seen yet); PlanError for two.
void check_channel_streams(const Plan& plan) {
  std::vector<std::pair<int, int>> streams(plan.channels.size(), {-1, -1});
  for (size_t t = 0; t < plan.tasks.size(); ++t) {
    const Task& task = plan.tasks[t];
    if (task.kind != TaskKind::send && task.kind != TaskKind::recv) continue;
    if (task.channel < 0 || static_cast<size_t>(task.channel) >= plan.channels.size()) {
      throw PlanError(partition::describe_task(plan, static_cast<int>(t)) + " names channel " + std::to_string(task.channel) +
                      ", which the plan does not have");
    }
    int& seen = task.kind == TaskKind::send ? streams[static_cast<size_t>(task.channel)].first
                                            : streams[static_cast<size_t>(task.channel)].second;
    if (seen < 0) seen = task.stream;
    if (seen != task.stream) {
      throw PlanError("channel " + std::to_string(task.channel) + ": its " + (task.kind == TaskKind::send ? "sends" : "receives") +
                      " are on several streams (" + plan.stream_name(seen) + ", " + plan.stream_name(task.stream) +
                      "); NCCL needs one thread, so one stream, per side of a channel");
    }
  }
}

}  // namespace

std::vector<int> in_task_communicators(const partition::Plan& plan, bool tensor_parallel_math) {
  std::set<int> in_task;
  for (const partition::Collective& c : plan.collectives) {
    if (c.in_task()) in_task.insert(c.communicator);
  }
  for (size_t c = 0; tensor_parallel_math && c < plan.communicators.size(); ++c) {
    const partition::Communicator& comm = plan.communicators[c];
    if (comm.role == partition::CommRole::tensor && comm.devices.size() > 1) in_task.insert(static_cast<int>(c));
  }
  return {in_task.begin(), in_task.end()};
}

CudaPlan cuda_plan(const Plan& plan, std::vector<int> gpus, std::vector<int> owner, int process,
                   const std::vector<int>& in_task) {
  CudaPlan out;
  out.gpus = std::move(gpus);
  out.owner = owner.empty() ? std::vector<int>(static_cast<size_t>(plan.device_count()), 0) : std::move(owner);
  out.process = process;
  out.group_of_task.assign(plan.tasks.size(), -1);
  out.rank_of_task.assign(plan.tasks.size(), -1);
  check_channel_streams(plan);
  for (size_t c = 0; c < plan.channels.size(); ++c) {
    const partition::Channel& ch = plan.channels[c];
    out.groups.push_back({{ch.src, ch.dst},
                          "channel " + std::to_string(c) + " (" + plan.device_name(ch.src) + " -> " + plan.device_name(ch.dst) +
                              ", " + ch.tag + ")",
                          true});
  }
  for (size_t t = 0; t < plan.tasks.size(); ++t) {
    const Task& task = plan.tasks[t];
    if (task.kind == TaskKind::send || task.kind == TaskKind::recv) {
      out.group_of_task[t] = task.channel;
      out.rank_of_task[t] = task.kind == TaskKind::send ? 0 : 1;
    }
  }
  // Collectives: one group per (communicator, member streams).
  std::map<std::pair<int, std::vector<int>>, int> group_of_key;
  std::vector<int> group_of_collective(plan.collectives.size(), -1);
  for (size_t c = 0; c < plan.collectives.size(); ++c) {
    const partition::Collective& col = plan.collectives[c];
    if (col.in_task()) continue;  // inside compute tasks: the in-task groups below
    const std::vector<int>& members = plan.members(col);
    if (col.tasks.size() != members.size()) {
      throw PlanError("collective " + std::to_string(c) + " has " + std::to_string(col.tasks.size()) + " tasks for " +
                      std::to_string(members.size()) + " members");
    }
    std::vector<int> streams;
    for (const int t : col.tasks) streams.push_back(plan.task(t).stream);
    const auto [it, added] = group_of_key.try_emplace({col.communicator, streams}, static_cast<int>(out.groups.size()));
    if (added) {
      std::string on;
      for (const int s : std::set<int>(streams.begin(), streams.end())) on += (on.empty() ? "" : ", ") + plan.stream_name(s);
      out.groups.push_back({members, "communicator " + std::to_string(col.communicator) + " (" +
                                         plan.communicator(col.communicator).name + ") on stream " + on});
    }
    group_of_collective[c] = it->second;
    for (size_t m = 0; m < col.tasks.size(); ++m) {
      out.group_of_task[static_cast<size_t>(col.tasks[m])] = it->second;
      out.rank_of_task[static_cast<size_t>(col.tasks[m])] = static_cast<int>(m);
    }
  }
  // In-task all-reduces: on each member's compute stream, beside its collectives there. They
  // come inside forward, backward and weight-gradient tasks, so those must all be on that
  // stream (one thread drives the rank), and every member must reach them and the group's
  // collectives in one order: checked as a sequence of (collective) and (kind, worker, stage,
  // micro-batch) per member.
  std::vector<std::pair<int, int>> in_task_checks;  // (communicator, group)
  for (const int c : in_task) {
    const std::vector<int>& members = plan.communicator(c).devices;
    std::vector<int> streams;
    for (const int d : members) {
      int stream = -1;
      for (const partition::StreamProgram& program : plan.programs[static_cast<size_t>(d)]) {
        for (const int t : program.tasks) {
          if (!partition::is_pass(plan.task(t).kind)) continue;
          if (stream >= 0 && stream != program.stream) {
            throw PlanError("device " + plan.device_name(d) + " runs compute tasks on streams " + plan.stream_name(stream) +
                            " and " + plan.stream_name(program.stream) +
                            ": its tensor-parallel all-reduces need one compute stream");
          }
          stream = program.stream;
        }
      }
      if (stream < 0) {
        throw PlanError("device " + plan.device_name(d) + " of communicator " + std::to_string(c) + " (" +
                        plan.communicator(c).name + ") runs no forward task");
      }
      streams.push_back(stream);
    }
    const auto [it, added] = group_of_key.try_emplace({c, streams}, static_cast<int>(out.groups.size()));
    if (added) {
      out.groups.push_back({members, "communicator " + std::to_string(c) + " (" + plan.communicator(c).name +
                                         ") inside compute tasks"});
    }
    out.in_task_group[c] = it->second;
    in_task_checks.emplace_back(c, it->second);
  }
  for (const auto& [c, g] : in_task_checks) {
    const NcclGroup& group = out.groups[static_cast<size_t>(g)];
    std::vector<std::vector<std::array<int, 5>>> sequence(group.devices.size());
    for (size_t r = 0; r < group.devices.size(); ++r) {
      const int d = group.devices[r];
      for (const partition::StreamProgram& program : plan.programs[static_cast<size_t>(d)]) {
        for (const int t : program.tasks) {
          const Task& task = plan.task(t);
          if (task.kind == TaskKind::collective && out.group_of_task[static_cast<size_t>(t)] == g) {
            sequence[r].push_back({-1, task.collective, 0, 0, 0});
          } else if (partition::is_pass(task.kind)) {
            sequence[r].push_back({static_cast<int>(task.kind), task.worker, task.stage, task.microbatch, 0});
          }
        }
      }
      if (sequence[r] != sequence[0]) {
        throw PlanError(group.what + ": " + plan.device_name(group.devices[0]) + " and " + plan.device_name(d) +
                        " reach its tensor-parallel compute tasks and collectives in different orders; NCCL needs the "
                        "same order on every member");
      }
    }
  }
  // Every member reaches its group's collectives in one order.
  std::vector<std::vector<std::vector<int>>> order(out.groups.size());  // [group][rank] -> collectives
  for (size_t g = plan.channels.size(); g < out.groups.size(); ++g) order[g].resize(out.groups[g].devices.size());
  for (const auto& device : plan.programs) {
    for (const partition::StreamProgram& program : device) {
      for (const int t : program.tasks) {
        const Task& task = plan.task(t);
        if (task.kind != TaskKind::collective) continue;
        if (out.group_of_task[static_cast<size_t>(t)] < 0) {
          throw PlanError(partition::describe_task(plan, t) + " is in no collective's task list");
        }
        const auto g = static_cast<size_t>(out.group_of_task[static_cast<size_t>(t)]);
        order[g][static_cast<size_t>(out.rank_of_task[static_cast<size_t>(t)])].push_back(task.collective);
      }
    }
  }
  for (size_t g = plan.channels.size(); g < out.groups.size(); ++g) {
    for (size_t r = 1; r < order[g].size(); ++r) {
      if (order[g][r] == order[g][0]) continue;
      const NcclGroup& group = out.groups[g];
      throw PlanError(group.what + ": " + plan.device_name(group.devices[0]) + " and " + plan.device_name(group.devices[r]) +
                      " reach its collectives in different orders (or one lacks some); NCCL needs the same order on "
                      "every member");
    }
  }
  // NCCL: one GPU per rank of a communicator (this process's GPUs: another's are its own).
  for (const NcclGroup& group : out.groups) {
    for (size_t a = 0; a < group.devices.size(); ++a) {
      for (size_t b = a + 1; b < group.devices.size(); ++b) {
        const int da = group.devices[a], db = group.devices[b];
        if (!out.local(da) || !out.local(db) || out.gpus[static_cast<size_t>(da)] != out.gpus[static_cast<size_t>(db)]) continue;
        throw PlanError(group.what + ": devices " + plan.device_name(da) + " and " + plan.device_name(db) +
                        " would both run on GPU " + std::to_string(out.gpus[static_cast<size_t>(da)]) +
                        "; NCCL cannot put two ranks of one communicator on one GPU");
      }
    }
  }
  return out;
}

bool activation_collective(const partition::Collective& c) {
  return c.purpose == partition::Purpose::tensor_parallel || c.purpose == partition::Purpose::sequence_parallel;
}

void require_cuda_layout(const Plan& plan) {
  for (size_t c = 0; c < plan.collectives.size(); ++c) {
    if (plan.collectives[c].kind == partition::CollectiveKind::sendrecv || !plan.collectives[c].until.empty()) {
      throw PlanError("collective " + std::to_string(c) + " is a sendrecv or overlaps its tasks' work (a ring of " +
                      "layout.context_comm ring), which the cuda back end does not run yet: simulate the plan, run it on "
                      "the cpu back end with --compute proxy, or plan it with --cp-comm allgather");
    }
  }
  if (plan.layout.sync.zero.stage > 0 && plan.layout.workers.size() > 1) {
    throw PlanError("the plan shards data-parallel state (layout.sync.zero.stage " +
                    std::to_string(plan.layout.sync.zero.stage) +
                    "), which the cuda back end does not run yet: run it on the cpu back end, or plan it without "
                    "--zero-stage");
  }
  if (plan.layout.offload.optimizer) {
    throw PlanError("the plan offloads optimizer state to host memory (layout.offload.optimizer), which the cuda "
                    "back end does not run yet: run it on the cpu back end, or plan it without --offload-optimizer");
  }
  if (plan.layout.offload.activations) {
    throw PlanError("the plan offloads stashed activations to host memory (layout.offload.activations), which the "
                    "cuda back end does not run yet: run it on the cpu back end, or plan it without "
                    "--offload-activations");
  }
  if (const int c = plan.layout.size(partition::Axis::context); c > 1) {
    throw PlanError("the plan splits each sequence over context groups of " + std::to_string(c) +
                    " workers (layout.axes: context " + std::to_string(c) +
                    "), which the cuda back end does not run yet: simulate it, or plan it without --context-parallel");
  }
  if (const int ep = plan.layout.experts.parallel; ep > 1) {
    throw PlanError("the plan splits its experts over expert groups of " + std::to_string(ep) +
                    " workers (layout.experts.parallel " + std::to_string(ep) +
                    "), whose all-to-alls the cuda back end has not run on a GPU yet: simulate it, run it on the cpu "
                    "back end, or plan it without --expert-parallel");
  }
}

void require_real_collectives(const Plan& plan, const std::function<size_t(int)>& tensor_bytes) {
  for (size_t i = 0; i < plan.tasks.size(); ++i) {
    const partition::Task& t = plan.tasks[i];
    if (t.kind != TaskKind::collective) continue;
    const partition::Collective& c = plan.collectives[static_cast<size_t>(t.collective)];
    const std::string what =
        "collective " + std::to_string(t.collective) + " (" + std::string(partition::to_string(c.kind)) + ")";
    const auto reads = plan.reads(static_cast<int>(i)), writes = plan.writes(static_cast<int>(i));
    if (!activation_collective(c)) {
      if (c.kind != partition::CollectiveKind::all_reduce) {
        throw PlanError(what +
                        " reduces gradients: real math on the cuda back end reduces gradients by all-reduce only");
      }
      continue;
    }
    if (reads.empty()) continue;  // nothing to move: traffic the compute moves itself
    const size_t in = tensor_bytes(reads[0]);
    const size_t out = tensor_bytes(writes.empty() ? reads[0] : writes[0]);
    const size_t count = std::max(in, out) / sizeof(float), members = plan.members(c).size();
    const bool by_part =
        c.kind == partition::CollectiveKind::reduce_scatter || c.kind == partition::CollectiveKind::all_gather;
    if ((by_part || in != out) && count % members != 0) {
      throw PlanError(what + " of " + std::to_string(count) + " floats over " + std::to_string(members) +
                      " members: NCCL's in-place form needs equal pieces");
    }
  }
}

}  // namespace hetflow::exec
