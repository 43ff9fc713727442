#include "traces/chakra.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <tuple>
#include <unordered_map>

#include "model/error.hpp"
#include "model/units.hpp"
#include "partition/plan_io.hpp"
#include "partition/validate.hpp"
#include "traces/chakra_reader.hpp"

namespace hetflow::traces {

namespace {

using namespace chakra_reader;
using partition::Plan;
using partition::Task;
using partition::TaskKind;

// A plan of more tasks than the simulator takes is refused before it is built.
constexpr size_t kMaxNodes = 10'000'000;

// The compute task whose parts (hetflow_part_of) a rank's file is in the middle of.
struct Parts {
  int task = -1;           // the joined task; -1 between tasks
  int64_t last_node = 0;   // its node id: its last part's
  double end = 0;          // the part of its work read so far
  std::tuple<double, int64_t, int64_t> last_call{-1, -1, -1};  // (at, collective, message) read last
  int node = 0;            // its first part's place in the file, for messages
};

// One rank's messages of one in-task collective (hetflow_collective).
struct InTaskMessages {
  CollectiveNode fields;  // task: the pass that performs them; messages unused
  std::string pg;
  std::vector<double> at;
  int node = 0;  // its first message's place in the file, for messages
};

// One set of rank files read into one plan, in the order the checks need: every rank's nodes
// become tasks (read_rank; a pass's parts one task, its in-task messages none), then their
// dependencies order edges, then the channels' sends and receives are counted, the process
// groups made and their collectives joined (those with tasks of their own, then the in-task
// ones), and the plan gets the placeholder network and layout validation asks for (finish).
class ChakraAssembly {
 public:
  ChakraAssembly(const std::vector<ChakraFile>& ranks, const model::Cluster& cluster, const std::string& name)
      : ranks_(ranks), rank_count_(static_cast<int>(ranks.size())), devices_(cluster.devices()), name_(name),
        task_of_node_(ranks.size()) {
    if (ranks.empty()) throw InputError(name, 0, "files", "no <prefix>.<rank>.et files");
    if (devices_.size() < ranks.size()) {
      throw InputError(name, 0, "ranks", std::to_string(rank_count_) + " ranks, but the cluster '" + cluster.name + "' has " +
                                             std::to_string(devices_.size()) + " devices: rank r runs on device r");
    }
    plan_.cluster = cluster;
    for (const model::Device& d : devices_) plan_.device_names.push_back(d.name);
    plan_.programs.resize(devices_.size());
  }

  int rank_count() const { return rank_count_; }
  void read_rank(int r);
  void add_order_edges();
  void check_channels() const;
  void add_process_groups(const std::string& comm_group);
  void join_collectives();
  void join_in_task_collectives();
  Plan finish();

 private:
  const std::string& file_name(int r) const { return ranks_[static_cast<size_t>(r)].name; }
  void read_metadata(Reader& file);
  Task read_node(const NodeReader& n, int r, std::string& default_stream);
  int read_part(const NodeReader& n, const Task& t, Parts& parts);
  int read_in_task_message(const NodeReader& n, int r, Parts& parts);
  void read_dependencies(const NodeReader& n, int id);
  int stream(const std::string& s);
  int channel(int src, int dst, const std::string& tag);

  const std::vector<ChakraFile>& ranks_;
  const int rank_count_;
  const std::vector<model::Device> devices_;
  const std::string& name_;
  Plan plan_;
  model::Precision precision_ = model::Precision::fp16;
  std::map<std::string, int> stream_index_;
  std::map<std::tuple<int, int, std::string>, int> channel_of_;  // (src, dst, tag)
  std::map<std::pair<int, int>, int> pair_communicator_;
  // Per process group and rank, its collective nodes in file order.
  std::map<std::string, std::map<int, std::vector<CollectiveNode>>> collectives_;
  // Per in-task collective (hetflow_collective) and rank, its messages.
  std::map<int64_t, std::map<int, InTaskMessages>> in_task_;
  std::map<std::string, std::set<int>> pg_ranks_;  // the ranks with a node naming each process group
  // Per process group: its members and its communicator.
  std::map<std::string, std::pair<std::vector<int>, int>> process_groups_;
  std::vector<std::pair<int, std::vector<std::pair<uint64_t, int>>>> dependencies_;  // task -> (node, offset)
  std::vector<std::unordered_map<uint64_t, int>> task_of_node_;
  size_t nodes_ = 0;
};

int ChakraAssembly::stream(const std::string& s) {
  const auto [it, added] = stream_index_.try_emplace(s, static_cast<int>(plan_.streams.size()));
  if (added) plan_.streams.push_back(s);
  return it->second;
}

int ChakraAssembly::channel(int src, int dst, const std::string& tag) {
  const auto [it, added] = channel_of_.try_emplace({src, dst, tag}, -1);
  if (added) {
    const std::pair<int, int> key{std::min(src, dst), std::max(src, dst)};
    auto c = pair_communicator_.find(key);
    if (c == pair_communicator_.end()) {
      c = pair_communicator_
              .emplace(key, plan_.add_communicator({"p2p " + std::to_string(key.first) + "-" + std::to_string(key.second),
                                                    {key.first, key.second}}))
              .first;
    }
    it->second = plan_.add_channel({src, dst, tag, c->second});
  }
  return it->second;
}

void ChakraAssembly::read_metadata(Reader& file) {
  et::GlobalMetadata meta;
  if (!file.next(meta)) file.fail("version", "empty: not a Chakra trace");
  if (meta.version().empty()) file.fail("version", "missing: not a Chakra trace's metadata");
  for (const et::AttributeProto& a : meta.attr()) {
    if (a.name() == "hetflow_precision" && a.value_case() == et::AttributeProto::kStringVal) {
      try {
        precision_ = model::parse_precision(a.string_val());
      } catch (const std::exception&) {
        file.fail("hetflow_precision", "expected fp32, fp16 or bf16");
      }
    }
  }
}

void ChakraAssembly::read_rank(int r) {
  if (ranks_[static_cast<size_t>(r)].bytes.size() >= static_cast<size_t>(std::numeric_limits<int>::max())) {
    throw InputError(file_name(r), 0, "size", "2 GiB or more: larger than a Chakra reader takes");
  }
  Reader file(ranks_[static_cast<size_t>(r)]);
  read_metadata(file);
  et::Node node;
  Parts parts;
  while (true) {
    ++file.message;
    node.Clear();
    if (!file.next(node)) break;
    if (++nodes_ > kMaxNodes) file.fail("id", "more than " + std::to_string(kMaxNodes) + " nodes in all");
    const NodeReader n{file, node};
    int id = -1;
    if (n.find("hetflow_collective") != nullptr) {
      id = read_in_task_message(n, r, parts);
    } else {
      std::string default_stream = "compute";
      Task t = read_node(n, r, default_stream);
      t.purpose = read_purpose(n, t.purpose);
      t.stream = stream(n.text("hetflow_stream", default_stream));
      if (n.find("hetflow_part_of") != nullptr) {
        id = read_part(n, t, parts);
      } else if (parts.task >= 0) {
        n.fail("hetflow_part_of", "missing: node " + std::to_string(parts.last_node) + "'s parts end at " +
                                      model::units::format_number(parts.end) +
                                      " without its last part (the node of that id), and this node is neither its next part "
                                      "nor an in-task message");
      } else {
        id = plan_.add_task(t);
        if (t.kind == TaskKind::collective) collectives_[n.text("pg_name", "all")][r].back().task = id;
      }
    }
    // A part's or in-task message's node id names the joined task, as the last part's does.
    if (!task_of_node_[static_cast<size_t>(r)].emplace(node.id(), id).second) {
      n.fail("id", "node id " + std::to_string(node.id()) + " is given twice");
    }
    read_dependencies(n, id);
  }
  if (parts.task >= 0) {
    throw InputError(file_name(r), 0, "node " + std::to_string(parts.node) + ".hetflow_part_of",
                     "the file ends inside the parts of node " + std::to_string(parts.last_node) + " (they end at " +
                         model::units::format_number(parts.end) + "): it has no last part, the node with that id");
  }
}

// The node's task as its type and attributes say (its purpose and stream are the caller's);
// a collective's own fields wait in collectives_ until every rank is read.
Task ChakraAssembly::read_node(const NodeReader& n, int r, std::string& default_stream) {
  const et::Node& node = n.node;
  Task t;
  t.device = r;
  switch (node.type()) {
    case et::COMP_NODE:
    case et::METADATA_NODE:
    case et::MEM_LOAD_NODE:
    case et::MEM_STORE_NODE: {
      const std::string kind = n.text("hetflow_kind", "forward");
      try {
        t.kind = partition::parse_task_kind(kind);
      } catch (const std::exception&) {
        n.fail("hetflow_kind", "expected a task kind, found '" + kind.substr(0, 40) + "'");
      }
      if ((t.kind == TaskKind::load || t.kind == TaskKind::to_device) && node.type() == et::MEM_LOAD_NODE) {
        t.bytes = n.size("hetflow_bytes", "tensor_size", true);  // a data loader's read, an offload copy back
        if (t.kind == TaskKind::to_device) t.purpose = partition::Purpose::offload;
        break;
      }
      if (t.kind == TaskKind::to_host && node.type() == et::MEM_STORE_NODE) {  // an offload copy to the host
        t.bytes = n.size("hetflow_bytes", "tensor_size", true);
        t.purpose = partition::Purpose::offload;
        break;
      }
      if (!partition::is_compute(t.kind) && t.kind != TaskKind::host_optimizer) {
        n.fail("hetflow_kind", "a compute node of kind '" + kind + "'");
      }
      t.flops = node.type() == et::COMP_NODE ? n.size("hetflow_flops", "num_ops", false) : 0;
      t.recompute_flops = std::min(t.flops, n.size("hetflow_recompute_flops", "hetflow_recompute_flops", false));
      t.memory_bytes = n.size("hetflow_memory_bytes", "tensor_size", false);
      break;
    }
    case et::COMM_SEND_NODE:
    case et::COMM_RECV_NODE: {
      const bool send = node.type() == et::COMM_SEND_NODE;
      t.kind = send ? TaskKind::send : TaskKind::recv;
      t.purpose = partition::Purpose::activation;
      const int peer = n.rank(send ? "comm_dst" : "comm_src", rank_count_, r);
      int64_t tag = 0;
      n.integer("comm_tag", tag);
      const std::string tag_text = n.text("hetflow_tag", std::to_string(tag));
      t.bytes = n.size("hetflow_bytes", "comm_size", true);
      t.channel = send ? channel(r, peer, std::to_string(tag) + ":" + tag_text) : channel(peer, r, std::to_string(tag) + ":" + tag_text);
      default_stream = (send ? "send>" : "recv<") + std::to_string(peer) + ":" + tag_text;
      break;
    }
    case et::COMM_COLL_NODE: {
      t.kind = TaskKind::collective;
      t.purpose = partition::Purpose::data_parallel;
      CollectiveNode c;
      const std::string pg = read_collective(n, c, rank_count_);
      t.bytes = c.bytes;
      t.memory_bytes = n.size("hetflow_memory_bytes", "hetflow_memory_bytes", false);
      default_stream = "collective:" + pg;
      collectives_[pg][r].push_back(c);
      pg_ranks_[pg].insert(r);
      break;
    }
    default: n.fail("type", "node type " + std::to_string(node.type()) + " is not one hetflow runs");
  }
  return t;
}

// A part of a compute task's work (hetflow_part_of: the task's node id, which its last part
// has; hetflow_part_begin and _end: the part of its work): a task's parts follow one another
// in the file, its in-task messages between them, and join into one task placed where the
// first part is, with their work summed (the last part's hetflow_task_* give it exactly).
int ChakraAssembly::read_part(const NodeReader& n, const Task& t, Parts& parts) {
  if (n.node.type() != et::COMP_NODE) {
    n.fail("type", "a part of a compute task (hetflow_part_of) of node type " + std::to_string(n.node.type()) + ", not COMP_NODE");
  }
  const int64_t of = n.required_integer("hetflow_part_of");
  const double begin = n.fraction("hetflow_part_begin"), end = n.fraction("hetflow_part_end");
  if (of < 0) n.fail("hetflow_part_of", "expected a node id, found " + std::to_string(of));
  if (parts.task < 0) {
    parts = Parts{plan_.add_task(t), of, 0, {-1, -1, -1}, n.file.message};
  } else {
    if (of != parts.last_node) {
      n.fail("hetflow_part_of", "a part of node " + std::to_string(of) + ", but node " + std::to_string(parts.last_node) +
                                    "'s parts end at " + model::units::format_number(parts.end) + ": its next part was expected");
    }
    Task& task = plan_.task(parts.task);
    if (t.kind != task.kind || t.stream != task.stream || t.purpose != task.purpose) {
      n.fail("hetflow_kind", "a part of node " + std::to_string(of) + " of another kind, stream or purpose than its first part");
    }
    task.flops += t.flops;
    task.recompute_flops += t.recompute_flops;
    task.memory_bytes += t.memory_bytes;
    if (!std::isfinite(task.flops) || !std::isfinite(task.memory_bytes)) n.fail("hetflow_flops", "the parts sum past a double's range");
  }
  if (begin != parts.end || end < begin) {
    n.fail("hetflow_part_begin", "the part " + model::units::format_number(begin) + " to " + model::units::format_number(end) + " of node " +
                                     std::to_string(of) + "'s work, but its parts before end at " + model::units::format_number(parts.end) +
                                     " (the first begins at 0)");
  }
  parts.end = end;
  const int id = parts.task;
  if (n.node.id() != static_cast<uint64_t>(of)) return id;
  // The last part: the task is whole.
  if (end != 1) {
    n.fail("hetflow_part_end", "node " + std::to_string(of) + "'s last part ends at " + model::units::format_number(end) +
                                   ": its parts do not add up to its work (1)");
  }
  Task& task = plan_.task(id);
  for (const auto& [name, sum] : {std::pair<const char*, double*>{"hetflow_task_flops", &task.flops},
                                  {"hetflow_task_recompute_flops", &task.recompute_flops},
                                  {"hetflow_task_memory_bytes", &task.memory_bytes}}) {
    if (n.find(name) == nullptr) continue;
    const double total = n.size(name, name, true);
    if (std::abs(total - *sum) > 1e-6 * std::max(total, *sum) + 1) {
      n.fail(name, model::units::format_number(total) + ", but the task's parts sum to " + model::units::format_number(*sum));
    }
    *sum = total;
  }
  task.recompute_flops = std::min(task.recompute_flops, task.flops);
  parts.task = -1;
  return id;
}

// A message of an in-task collective (hetflow_collective: the collective's index in the
// writer's plan; hetflow_message: which of its messages; hetflow_at: the part of the task's
// work before it): a COMM_COLL_NODE between two parts of the pass that performs it, which
// performs its messages by point, then collective, then message (Plan::inside).
int ChakraAssembly::read_in_task_message(const NodeReader& n, int r, Parts& parts) {
  if (n.node.type() != et::COMM_COLL_NODE) {
    n.fail("type", "an in-task message (hetflow_collective) of node type " + std::to_string(n.node.type()) + ", not COMM_COLL_NODE");
  }
  if (parts.task < 0) {
    n.fail("hetflow_collective", "an in-task message outside a compute task: it must come between two of its parts (hetflow_part_of)");
  }
  const TaskKind kind = plan_.task(parts.task).kind;
  if (!partition::is_pass(kind)) {
    n.fail("hetflow_collective", "an in-task message inside a task of kind " + std::string(to_string(kind)) +
                                     ": only forward and backward passes run collectives inside");
  }
  const int64_t collective = n.required_integer("hetflow_collective"), message = n.required_integer("hetflow_message");
  const double at = n.fraction("hetflow_at");
  if (collective < 0) n.fail("hetflow_collective", "expected a collective's index, found " + std::to_string(collective));
  if (at != parts.end) {
    n.fail("hetflow_at", "the point " + model::units::format_number(at) + ", but the parts of node " + std::to_string(parts.last_node) +
                             " before it end at " + model::units::format_number(parts.end));
  }
  const std::tuple<double, int64_t, int64_t> call{at, collective, message};
  if (call <= parts.last_call) {
    n.fail("hetflow_at", "out of order: a task performs its in-task messages by point, then collective, then message");
  }
  parts.last_call = call;
  InTaskMessages mine;
  mine.pg = read_collective(n, mine.fields, rank_count_);
  mine.fields.messages = 1;
  mine.fields.purpose = read_purpose(n, partition::Purpose::tensor_parallel);
  mine.fields.task = parts.task;
  mine.node = n.file.message;
  pg_ranks_[mine.pg].insert(r);
  const auto [it, first] = in_task_[collective].try_emplace(r, mine);
  InTaskMessages& have = it->second;
  const std::string which = "message " + std::to_string(message) + " of in-task collective " + std::to_string(collective);
  if (message != static_cast<int64_t>(have.at.size())) {
    n.fail("hetflow_message", which + ", where its message " + std::to_string(have.at.size()) + " was expected");
  }
  if (!first && (have.fields != mine.fields || have.pg != mine.pg)) {
    n.fail("hetflow_collective", which + " is a " + describe(mine.fields, mine.pg) + " in task node " +
                                     std::to_string(parts.last_node) + ", its message 0 (node " + std::to_string(have.node) +
                                     ") a " + describe(have.fields, have.pg) + (have.fields.task != mine.fields.task ? " in another task" : ""));
  }
  have.at.push_back(at);
  return parts.task;
}

// The node's control and data dependencies, and hetflow's (node, iteration offset) pairs.
void ChakraAssembly::read_dependencies(const NodeReader& n, int id) {
  std::vector<std::pair<uint64_t, int>> deps;  // (node, iteration offset)
  for (uint64_t d : n.node.ctrl_deps()) deps.emplace_back(d, 0);
  for (uint64_t d : n.node.data_deps()) deps.emplace_back(d, 0);
  if (const et::AttributeProto* a = n.find("hetflow_later_deps"); a != nullptr) {
    if (a->value_case() != et::AttributeProto::kInt64List || a->int64_list().values_size() % 2 != 0) {
      n.fail("hetflow_later_deps", "expected a list of (node, iteration offset) pairs");
    }
    for (int i = 0; i < a->int64_list().values_size(); i += 2) {
      const int64_t from = a->int64_list().values(i), offset = a->int64_list().values(i + 1);
      if (from < 0 || offset < 1 || offset > 1'000'000) {
        n.fail("hetflow_later_deps", "expected a node and an offset of 1 to 10^6 iterations");
      }
      deps.emplace_back(static_cast<uint64_t>(from), static_cast<int>(offset));
    }
  }
  dependencies_.emplace_back(id, std::move(deps));
}

// Dependencies -> order edges (the task before on the stream is implied by program order).
void ChakraAssembly::add_order_edges() {
  std::vector<int> previous_on_stream(plan_.tasks.size(), -1);
  for (const auto& device : plan_.programs) {
    for (const partition::StreamProgram& s : device) {
      for (size_t k = 1; k < s.tasks.size(); ++k) previous_on_stream[static_cast<size_t>(s.tasks[k])] = s.tasks[k - 1];
    }
  }
  for (const auto& [task, deps] : dependencies_) {
    const int r = plan_.task(task).device;
    std::set<std::pair<int, int>> seen;
    for (const auto& [dep, offset] : deps) {
      const auto it = task_of_node_[static_cast<size_t>(r)].find(dep);
      if (it == task_of_node_[static_cast<size_t>(r)].end()) {
        throw InputError(file_name(r), 0, "deps",
                         "a node depends on node " + std::to_string(dep) + ", which the file does not have");
      }
      const bool implied = offset == 0 && (it->second == task || it->second == previous_on_stream[static_cast<size_t>(task)]);
      if (implied || !seen.insert({it->second, offset}).second) continue;
      plan_.add_order(it->second, task, offset);
    }
  }
}

// Sends and receives pair up per channel.
void ChakraAssembly::check_channels() const {
  std::vector<int> sends(plan_.channels.size(), 0), recvs(plan_.channels.size(), 0);
  for (const Task& t : plan_.tasks) {
    if (t.kind == TaskKind::send) ++sends[static_cast<size_t>(t.channel)];
    if (t.kind == TaskKind::recv) ++recvs[static_cast<size_t>(t.channel)];
  }
  for (size_t c = 0; c < plan_.channels.size(); ++c) {
    if (sends[c] != recvs[c]) {
      const partition::Channel& ch = plan_.channels[c];
      throw InputError(file_name(sends[c] < recvs[c] ? ch.dst : ch.src), 0, "comm_tag",
                       "rank " + std::to_string(ch.src) + " sends " + std::to_string(sends[c]) + " messages tagged " +
                           ch.tag + " to rank " + std::to_string(ch.dst) + ", which receives " + std::to_string(recvs[c]));
    }
  }
}

// The members of each process group a node names (comm_group.json's list, else every rank
// with a node naming it), and a communicator each.
void ChakraAssembly::add_process_groups(const std::string& comm_group) {
  const std::string group_file = name_ + "/comm_group.json";
  const std::map<std::string, std::vector<int>> groups = read_comm_groups(comm_group, group_file, rank_count_);
  for (const auto& [pg, ranks] : pg_ranks_) {
    std::vector<int> members(ranks.begin(), ranks.end());
    if (const auto g = groups.find(pg); g != groups.end()) {
      for (int r : ranks) {
        if (std::find(g->second.begin(), g->second.end(), r) == g->second.end()) {
          throw InputError(file_name(r), 0, "pg_name",
                           "a collective of process group " + pg + ", which " + group_file + " does not list this rank in");
        }
      }
      members = g->second;
    }
    const int communicator = plan_.add_communicator({"pg " + pg, members});
    process_groups_.emplace(pg, std::pair{std::move(members), communicator});
  }
}

// The k-th collective of a process group on each member is one collective.
void ChakraAssembly::join_collectives() {
  for (const auto& [pg, by_rank] : collectives_) {
    const auto& [members, communicator] = process_groups_.at(pg);
    size_t count = 0;
    for (int m : members) {
      const auto it = by_rank.find(m);
      const size_t n = it == by_rank.end() ? 0 : it->second.size();
      if (m == members.front()) count = n;
      if (n != count) {
        throw InputError(file_name(m), 0, "pg_name",
                         "has " + std::to_string(n) + " collectives of process group " + pg + ", rank " +
                             std::to_string(members.front()) + " has " + std::to_string(count));
      }
    }
    for (size_t k = 0; k < count; ++k) {
      const CollectiveNode& first = by_rank.at(members.front())[k];
      partition::Collective c{first.kind, first.algorithm, first.purpose, communicator, first.bytes,
                              std::min(first.root, static_cast<int>(members.size()) - 1), first.messages, {}, {},
                              {}, first.parts};
      c.purpose = plan_.task(first.task).purpose;
      for (int m : members) {
        const CollectiveNode& mine = by_rank.at(m)[k];
        if (mine.kind != first.kind || mine.bytes != first.bytes || mine.messages != first.messages ||
            mine.parts != first.parts) {
          throw InputError(file_name(m), 0, "comm_size",
                           "collective " + std::to_string(k) + " of process group " + pg + " is a " +
                               std::string(to_string(mine.kind)) + " of " + std::to_string(mine.bytes) + " bytes, on rank " +
                               std::to_string(members.front()) + " a " + std::string(to_string(first.kind)) + " of " +
                               std::to_string(first.bytes));
        }
        c.tasks.push_back(mine.task);
      }
      const int id = static_cast<int>(plan_.collectives.size());
      for (int t : c.tasks) plan_.task(t).collective = id;
      plan_.collectives.push_back(std::move(c));
    }
  }
}

// The messages of one in-task collective on every member of its process group are one
// collective, at the points they agree on; joined in the order of their indices in the
// writer's plan, so that calls at one point keep their order (Plan::inside: by collective).
void ChakraAssembly::join_in_task_collectives() {
  for (const auto& [index, by_rank] : in_task_) {
    const auto& [first_rank, first] = *by_rank.begin();
    const auto& [members, communicator] = process_groups_.at(first.pg);
    const std::string which = "in-task collective " + std::to_string(index);
    const auto at_node = [&](const InTaskMessages& m, const char* field) { return "node " + std::to_string(m.node) + "." + field; };
    for (const auto& [r, mine] : by_rank) {
      if (std::find(members.begin(), members.end(), r) == members.end()) {
        throw InputError(file_name(r), 0, at_node(mine, "pg_name"),
                         which + " on process group " + mine.pg + ", which rank " + std::to_string(first_rank) +
                             " performs on process group " + first.pg + ", whose members do not include this rank");
      }
    }
    partition::Collective c{first.fields.kind, first.fields.algorithm, first.fields.purpose, communicator,
                            first.fields.bytes * static_cast<double>(first.at.size()),
                            std::min(first.fields.root, static_cast<int>(members.size()) - 1),
                            static_cast<int>(first.at.size()), {}, first.at, {}, first.fields.parts};
    for (int m : members) {
      const auto it = by_rank.find(m);
      if (it == by_rank.end()) {
        throw InputError(file_name(m), 0, "hetflow_collective",
                         "no message of " + which + " of process group " + first.pg + ", of which rank " +
                             std::to_string(first_rank) + " performs " + std::to_string(first.at.size()));
      }
      const InTaskMessages& mine = it->second;
      const std::string there = ", on rank " + std::to_string(first_rank) + " ";
      if (mine.at.size() != first.at.size()) {
        throw InputError(file_name(m), 0, at_node(mine, "hetflow_message"),
                         std::to_string(mine.at.size()) + " messages of " + which + there + std::to_string(first.at.size()));
      }
      if (mine.at != first.at) {
        throw InputError(file_name(m), 0, at_node(mine, "hetflow_at"), which + "'s messages at other points than" + there);
      }
      CollectiveNode same = first.fields;
      same.task = mine.fields.task;
      if (mine.fields != same || mine.pg != first.pg) {
        throw InputError(file_name(m), 0, at_node(mine, "hetflow_collective"),
                         which + " is a " + describe(mine.fields, mine.pg) + there + "a " + describe(first.fields, first.pg));
      }
      c.tasks.push_back(mine.fields.task);
    }
    plan_.collectives.push_back(std::move(c));
  }
}

// What validation asks of every plan: a network and a layout, placeholders here.
Plan ChakraAssembly::finish() {
  plan_.network.name = name_;
  plan_.network.precision = precision_;
  model::Layer workload;
  workload.name = "workload";
  workload.kind = "chakra";
  workload.shape = std::to_string(rank_count_) + " ranks";
  // Network files ask every layer for an output and some layer for work: the workload is one
  // "sample" of all its compute.
  workload.output_elems = 1;
  for (const Task& t : plan_.tasks) workload.forward_flops += t.flops;
  workload.forward_flops = std::max(workload.forward_flops, 1.0);
  plan_.network.layers.push_back(workload);
  plan_.layout.policy = partition::kWorkloadPolicy;
  plan_.layout.precision = precision_;
  plan_.layout.workspace_bytes = 0;
  // A workload has no layout to place its devices on, and its process groups do not say
  // which axis they span: every coordinate -1, every communicator's role unspecified.
  plan_.coords = plan_.layout.device_coords(static_cast<int>(devices_.size()));
  plan_.memory.resize(devices_.size());
  for (size_t d = 0; d < devices_.size(); ++d) {
    plan_.memory[d].capacity_bytes = plan_.cluster.device_gpu(devices_[d]).memory_bytes;
  }
  plan_.finish();
  plan_.fingerprint = partition::plan_fingerprint(plan_);
  return std::move(plan_);
}

}  // namespace

Plan read_chakra(const std::vector<ChakraFile>& ranks, const std::string& comm_group, const model::Cluster& cluster,
                 const std::string& name) {
  ChakraAssembly assembly(ranks, cluster, name);
  for (int r = 0; r < assembly.rank_count(); ++r) assembly.read_rank(r);
  assembly.add_order_edges();
  assembly.check_channels();
  assembly.add_process_groups(comm_group);
  assembly.join_collectives();
  assembly.join_in_task_collectives();
  return assembly.finish();
}

}  // namespace hetflow::traces
