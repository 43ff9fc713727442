#include "traces/chakra.hpp"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <span>

#include <nlohmann/json.hpp>

#include "chakra/et_def.pb.h"  // generated from traces/chakra/et_def.proto
#include "model/error.hpp"
#include "model/units.hpp"
#include "partition/task_order.hpp"

namespace hetflow::traces {

namespace {

namespace et = ChakraProtoMsg;
using partition::Plan;
using partition::Task;
using partition::TaskKind;

constexpr const char* kVersion = "0.0.4";

// ------------------------------------------------------------------ attributes

void attr(et::Node& n, const char* name, int64_t v) {
  et::AttributeProto* a = n.add_attr();
  a->set_name(name);
  a->set_int64_val(v);
}
void attr(et::Node& n, const char* name, const std::string& v) {
  et::AttributeProto* a = n.add_attr();
  a->set_name(name);
  a->set_string_val(v);
}
void attr_double(et::Node& n, const char* name, double v) {
  et::AttributeProto* a = n.add_attr();
  a->set_name(name);
  a->set_double_val(v);
}
void attr_bool(et::Node& n, const char* name, bool v) {
  et::AttributeProto* a = n.add_attr();
  a->set_name(name);
  a->set_bool_val(v);
}

// ------------------------------------------------------------------ writing

et::CollectiveCommType comm_type(partition::CollectiveKind k) {
  switch (k) {
    case partition::CollectiveKind::all_reduce: return et::ALL_REDUCE;
    case partition::CollectiveKind::reduce_scatter: return et::REDUCE_SCATTER;
    case partition::CollectiveKind::all_gather: return et::ALL_GATHER;
    case partition::CollectiveKind::broadcast: return et::BROADCAST;
    case partition::CollectiveKind::reduce: return et::REDUCE;
    case partition::CollectiveKind::all_to_all: return et::ALL_TO_ALL;
    case partition::CollectiveKind::sendrecv: break;  // refused by write_chakra
  }
  return et::ALL_REDUCE;
}

void append_delimited(std::string& out, const google::protobuf::MessageLite& m) {
  google::protobuf::io::StringOutputStream stream(&out);
  google::protobuf::io::CodedOutputStream coded(&stream);
  coded.WriteVarint64(m.ByteSizeLong());
  m.SerializeWithCachedSizes(&coded);
}

// A collective's attributes; an in-task one's node carries one of its `messages` messages.
void add_collective_attrs(et::Node& n, const partition::Collective& c, int messages) {
  const double bytes = c.bytes / messages;
  n.set_type(et::COMM_COLL_NODE);
  attr(n, "comm_type", static_cast<int64_t>(comm_type(c.kind)));
  attr(n, "comm_size", static_cast<int64_t>(std::llround(bytes)));
  attr(n, "pg_name", std::to_string(c.communicator));
  et::AttributeProto* dims = n.add_attr();
  dims->set_name("involved_dim");
  dims->mutable_bool_list()->add_values(true);
  attr_double(n, "hetflow_bytes", bytes);
  attr(n, "hetflow_algorithm", std::string(to_string(c.algorithm)));
  attr(n, "hetflow_root", static_cast<int64_t>(c.root));
  if (c.messages != 1 && messages == 1) attr(n, "hetflow_messages", static_cast<int64_t>(c.messages));
  if (!c.parts.empty()) {  // an all_to_all's uneven shares, comma-separated
    std::string parts;
    for (double p : c.parts) parts += (parts.empty() ? "" : ",") + model::units::format_number(p);
    attr(n, "hetflow_parts", parts);
  }
}

// One task's node (no dependencies): `part` of a compute task's work under node id `node`.
et::Node task_node(const Plan& plan, const partition::CostModel& cost, int id, uint64_t node, double part) {
  const Task& t = plan.task(id);
  et::Node n;
  n.set_id(node);
  n.set_name(std::string(to_string(t.kind)) + (t.microbatch >= 0 ? " mb" + std::to_string(t.microbatch) : "") +
             (t.stage >= 0 ? " stage" + std::to_string(t.stage) : ""));
  attr_bool(n, "is_cpu_op", false);
  attr(n, "hetflow_kind", std::string(to_string(t.kind)));
  attr(n, "hetflow_stream", plan.stream_name(t.stream));
  attr(n, "hetflow_purpose", std::string(to_string(t.purpose)));
  if (partition::is_compute(t.kind)) {
    n.set_type(et::COMP_NODE);
    n.set_duration_micros(static_cast<uint64_t>(std::llround(1e6 * part * cost.task_compute_time_s(plan, t))));
    attr(n, "num_ops", static_cast<int64_t>(std::llround(part * t.flops)));
    attr(n, "tensor_size", static_cast<int64_t>(std::llround(part * t.memory_bytes)));
    attr_double(n, "hetflow_flops", part * t.flops);
    attr_double(n, "hetflow_recompute_flops", part * t.recompute_flops);
    attr_double(n, "hetflow_memory_bytes", part * t.memory_bytes);
  } else if (t.kind == TaskKind::load) {  // the host's loader reading a micro-batch from storage
    n.set_type(et::MEM_LOAD_NODE);
    // No duration: a load's time depends on the loads it shares storage and workers with,
    // which the simulator derives from the cluster's input path.
    attr(n, "tensor_size", static_cast<int64_t>(std::llround(t.bytes)));
    attr_double(n, "hetflow_bytes", t.bytes);
  } else if (partition::is_host_copy(t.kind)) {  // offload's copy over PCIe: a store to the host, a load back
    n.set_type(t.kind == TaskKind::to_host ? et::MEM_STORE_NODE : et::MEM_LOAD_NODE);
    // No duration, as a load's: the copies share their node's bridges (the simulator's).
    attr(n, "tensor_size", static_cast<int64_t>(std::llround(t.bytes)));
    attr_double(n, "hetflow_bytes", t.bytes);
  } else if (t.kind == TaskKind::host_optimizer) {  // offload's optimizer step, on the node's CPUs
    n.set_type(et::COMP_NODE);
    n.set_duration_micros(static_cast<uint64_t>(std::llround(1e6 * cost.host_step_time_s(t.device, t.flops, t.memory_bytes))));
    attr(n, "num_ops", static_cast<int64_t>(std::llround(t.flops)));
    attr_double(n, "hetflow_flops", t.flops);
    attr_double(n, "hetflow_memory_bytes", t.memory_bytes);
  } else if (t.kind == TaskKind::send || t.kind == TaskKind::recv) {
    const partition::Channel& c = plan.channel(t.channel);
    n.set_type(t.kind == TaskKind::send ? et::COMM_SEND_NODE : et::COMM_RECV_NODE);
    attr(n, t.kind == TaskKind::send ? "comm_dst" : "comm_src", static_cast<int64_t>(plan.peer(id)));
    attr(n, "comm_size", static_cast<int64_t>(std::llround(t.bytes)));
    attr(n, "comm_tag", static_cast<int64_t>(t.channel));
    attr_double(n, "hetflow_bytes", t.bytes);
    attr(n, "hetflow_tag", c.tag);
  } else {
    add_collective_attrs(n, plan.collective(t.collective), 1);
    // Its member's own read before the messages (the gradient norm's): hetflow's alone.
    if (t.memory_bytes > 0) attr_double(n, "hetflow_memory_bytes", t.memory_bytes);
  }
  return n;
}

// What joins a part of a compute task back into it (the importer's hetflow_part_*): the task's
// node id (its last part's), the part of its work this node does, and on the last part the
// task's own totals, which the parts' sum may miss in the last bit.
void add_part_attrs(et::Node& n, const Task& t, int id, double from, double to) {
  attr(n, "hetflow_part_of", static_cast<int64_t>(id));
  attr_double(n, "hetflow_part_begin", from);
  attr_double(n, "hetflow_part_end", to);
  if (n.id() != static_cast<uint64_t>(id)) return;
  attr_double(n, "hetflow_task_flops", t.flops);
  attr_double(n, "hetflow_task_recompute_flops", t.recompute_flops);
  attr_double(n, "hetflow_task_memory_bytes", t.memory_bytes);
}

// One message of an in-task collective, as a collective node on the task's stream after `after`;
// hetflow_collective (the collective's index in the plan), hetflow_message and hetflow_at say
// which message of which collective it is, and where in the task's work.
et::Node in_task_node(const Plan& plan, const Task& t, const partition::InTaskCall& call, uint64_t node, uint64_t after) {
  const partition::Collective& c = plan.collective(call.collective);
  et::Node n;
  n.set_id(node);
  n.set_name("collective " + std::to_string(call.collective) + " message " + std::to_string(call.message + 1) +
             (t.microbatch >= 0 ? " mb" + std::to_string(t.microbatch) : "") +
             (t.stage >= 0 ? " stage" + std::to_string(t.stage) : ""));
  n.add_ctrl_deps(after);
  attr_bool(n, "is_cpu_op", false);
  attr(n, "hetflow_kind", std::string(to_string(TaskKind::collective)));
  attr(n, "hetflow_stream", plan.stream_name(t.stream));
  attr(n, "hetflow_purpose", std::string(to_string(c.purpose)));
  add_collective_attrs(n, c, std::max(1, c.messages));
  attr(n, "hetflow_collective", static_cast<int64_t>(call.collective));
  attr(n, "hetflow_message", static_cast<int64_t>(call.message));
  attr_double(n, "hetflow_at", call.at);
  return n;
}

}  // namespace

std::vector<ChakraFile> write_chakra(const Plan& plan, const partition::CostModel& cost, const std::string& prefix) {
  if (plan.layout.folded) {
    throw PlanError("the plan is folded (one data-parallel replica's tasks for all): a Chakra trace needs every rank's; "
                    "plan it without --fold to export it");
  }
  // Chakra's collective nodes run one after another on a stream; a message that overlaps its
  // task's work would need the task cut around it, which this writer does not do.
  if (std::any_of(plan.collectives.begin(), plan.collectives.end(),
                  [](const partition::Collective& c) { return !c.until.empty() || c.kind == partition::CollectiveKind::sendrecv; })) {
    throw PlanError("the plan passes keys and values around its context groups' rings (layout.context_comm ring), "
                    "messages overlapped with the attention that a Chakra trace does not hold yet: export the plan "
                    "with --cp-comm allgather");
  }
  const size_t devices = plan.device_names.size();
  // Dependencies within a device: the task before on the stream and order edges (control),
  // the producers of the transient tensors it reads (data).
  std::vector<std::vector<uint64_t>> ctrl(plan.tasks.size()), data(plan.tasks.size());
  for (const auto& device : plan.programs) {
    for (const partition::StreamProgram& s : device) {
      for (size_t k = 1; k < s.tasks.size(); ++k) ctrl[static_cast<size_t>(s.tasks[k])].push_back(static_cast<uint64_t>(s.tasks[k - 1]));
    }
  }
  // Edges across iterations (a parameter server's pull feeding the next iteration, WSP's
  // staleness) mean nothing in one iteration: they go in hetflow_later_deps (node, offset
  // pairs), for hetflow to read back.
  std::vector<std::vector<int64_t>> later(plan.tasks.size());
  for (const partition::OrderEdge& e : plan.order) {
    if (e.offset == 0) {
      ctrl[static_cast<size_t>(e.to)].push_back(static_cast<uint64_t>(e.from));
    } else {
      later[static_cast<size_t>(e.to)].insert(later[static_cast<size_t>(e.to)].end(), {e.from, e.offset});
    }
  }
  for (size_t t = 0; t < plan.tasks.size(); ++t) {
    for (int r : plan.reads(static_cast<int>(t))) {
      const partition::Tensor& tensor = plan.tensor(r);
      if (tensor.producer >= 0 && static_cast<size_t>(tensor.producer) != t) data[t].push_back(static_cast<uint64_t>(tensor.producer));
    }
  }
  const partition::TaskOrder order = partition::order_tasks(plan);
  if (!order.complete()) throw PlanError("the plan deadlocks: no order of its tasks can be written");
  std::vector<std::vector<int>> sequence(devices);
  for (int t : order.task_sequence()) sequence[static_cast<size_t>(plan.task(t).device)].push_back(t);

  std::vector<ChakraFile> files;
  for (size_t d = 0; d < devices; ++d) {
    std::string bytes;
    et::GlobalMetadata meta;
    meta.set_version(kVersion);
    for (const auto& [name, value] :
         {std::pair<const char*, std::string>{"schema", "hetflow"}, {"hetflow_plan", plan.fingerprint},
          {"hetflow_precision", std::string(model::to_string(plan.layout.precision))}}) {
      et::AttributeProto* a = meta.add_attr();
      a->set_name(name);
      a->set_string_val(value);
    }
    append_delimited(bytes, meta);
    // A compute task with in-task collectives is written as its parts of work with one
    // collective node per message between them (what a Chakra consumer runs); the last part
    // keeps the task's id, which other nodes depend on, the others take ids after every task's.
    uint64_t next_id = plan.tasks.size();
    for (int id : sequence[d]) {
      const Task& t = plan.task(id);
      const auto calls = partition::is_compute(t.kind) ? plan.inside(id) : std::span<const partition::InTaskCall>{};
      uint64_t previous = 0;
      for (size_t k = 0; k <= calls.size(); ++k) {
        const double from = k == 0 ? 0 : calls[k - 1].at, to = k < calls.size() ? calls[k].at : 1;
        const uint64_t part_id = k == calls.size() ? static_cast<uint64_t>(id) : next_id++;
        et::Node n = task_node(plan, cost, id, part_id, to - from);
        if (!calls.empty()) add_part_attrs(n, t, id, from, to);
        if (k == 0) {
          for (uint64_t c : ctrl[static_cast<size_t>(id)]) n.add_ctrl_deps(c);
          for (uint64_t c : data[static_cast<size_t>(id)]) n.add_data_deps(c);
          if (!later[static_cast<size_t>(id)].empty()) {
            et::AttributeProto* a = n.add_attr();
            a->set_name("hetflow_later_deps");
            for (int64_t v : later[static_cast<size_t>(id)]) a->mutable_int64_list()->add_values(v);
          }
        } else {
          n.add_ctrl_deps(previous);
        }
        append_delimited(bytes, n);
        previous = part_id;
        if (k == calls.size()) break;
        et::Node m = in_task_node(plan, t, calls[k], next_id++, previous);
        append_delimited(bytes, m);
        previous = m.id();
      }
    }
    files.push_back({prefix + "." + std::to_string(d) + ".et", std::move(bytes)});
  }
  // The process groups the collectives name, with their ranks in ring order.
  nlohmann::ordered_json groups = nlohmann::ordered_json::object();
  std::set<int> used;
  for (const partition::Collective& c : plan.collectives) used.insert(c.communicator);
  for (int c : used) groups[std::to_string(c)] = plan.communicator(c).devices;
  files.push_back({"comm_group.json", groups.dump(1) + "\n"});
  return files;
}
}  // namespace hetflow::traces
