#include "traces/chakra.hpp"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/stubs/logging.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "chakra/et_def.pb.h"  // generated from traces/chakra/et_def.proto
#include "model/error.hpp"
#include "partition/plan_io.hpp"
#include "partition/task_order.hpp"
#include "partition/validate.hpp"

namespace hetflow::traces {

namespace {

namespace et = ChakraProtoMsg;
using partition::Plan;
using partition::Task;
using partition::TaskKind;

constexpr const char* kVersion = "0.0.4";
// Bounds on what a reader accepts: a message larger than this is corruption, and a plan of
// more tasks than the simulator takes is refused before it is built.
constexpr uint64_t kMaxMessageBytes = 64u << 20;
constexpr size_t kMaxNodes = 10'000'000;

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

const et::AttributeProto* find_attr(const et::Node& n, const std::string& name) {
  for (const et::AttributeProto& a : n.attr()) {
    if (a.name() == name) return &a;
  }
  return nullptr;
}

// ------------------------------------------------------------------ writing

et::CollectiveCommType comm_type(partition::CollectiveKind k) {
  switch (k) {
    case partition::CollectiveKind::all_reduce: return et::ALL_REDUCE;
    case partition::CollectiveKind::reduce_scatter: return et::REDUCE_SCATTER;
    case partition::CollectiveKind::all_gather: return et::ALL_GATHER;
    case partition::CollectiveKind::broadcast: return et::BROADCAST;
    case partition::CollectiveKind::reduce: return et::REDUCE;
  }
  return et::ALL_REDUCE;
}

void append_delimited(std::string& out, const google::protobuf::MessageLite& m) {
  google::protobuf::io::StringOutputStream stream(&out);
  google::protobuf::io::CodedOutputStream coded(&stream);
  coded.WriteVarint64(m.ByteSizeLong());
  m.SerializeWithCachedSizes(&coded);
}

// ------------------------------------------------------------------ reading

struct Reader {
  const ChakraFile& file;
  google::protobuf::io::ArrayInputStream array;
  google::protobuf::io::CodedInputStream coded;
  int message = 0;

  explicit Reader(const ChakraFile& f)
      : file(f), array(f.bytes.data(), static_cast<int>(f.bytes.size())), coded(&array) {
    // A malformed message is this reader's to report (naming the file); protobuf would also
    // print its own complaint (invalid UTF-8 in a string) to stderr.
    static const bool quiet = [] {
      google::protobuf::SetLogHandler(nullptr);
      return true;
    }();
    (void)quiet;
    coded.SetTotalBytesLimit(std::numeric_limits<int>::max());
  }

  [[noreturn]] void fail(const std::string& field, const std::string& what) const {
    throw InputError(file.name, 0, (message == 0 ? std::string("metadata") : "node " + std::to_string(message)) + "." + field,
                     what);
  }

  // The next length-delimited message; false at the end of the file.
  template <class Message>
  bool next(Message& m) {
    if (coded.CurrentPosition() >= static_cast<int>(file.bytes.size())) return false;
    uint64_t size = 0;
    if (!coded.ReadVarint64(&size)) fail("size", "truncated: the file ends inside a message's length");
    if (size > kMaxMessageBytes) fail("size", "a message of " + std::to_string(size) + " bytes: not a Chakra trace");
    if (size > file.bytes.size() - static_cast<size_t>(coded.CurrentPosition())) {
      fail("size", "truncated: the message says " + std::to_string(size) + " bytes, the file has " +
                       std::to_string(file.bytes.size() - static_cast<size_t>(coded.CurrentPosition())));
    }
    const auto limit = coded.PushLimit(static_cast<int>(size));
    if (!m.ParseFromCodedStream(&coded) || !coded.ConsumedEntireMessage()) fail("bytes", "not a Chakra message");
    coded.PopLimit(limit);
    return true;
  }
};

struct NodeReader {
  const Reader& file;
  const et::Node& node;

  [[noreturn]] void fail(const std::string& field, const std::string& what) const { file.fail(field, what); }
  const et::AttributeProto* find(const char* name) const { return find_attr(node, name); }

  // An integer attribute in any of the integer encodings writers use.
  bool integer(const char* name, int64_t& out) const {
    const et::AttributeProto* a = find(name);
    if (a == nullptr) return false;
    switch (a->value_case()) {
      case et::AttributeProto::kInt32Val: out = a->int32_val(); return true;
      case et::AttributeProto::kInt64Val: out = a->int64_val(); return true;
      case et::AttributeProto::kUint32Val: out = a->uint32_val(); return true;
      case et::AttributeProto::kUint64Val:
        if (a->uint64_val() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) fail(name, "out of range");
        out = static_cast<int64_t>(a->uint64_val());
        return true;
      default: fail(name, "expected an integer");
    }
  }
  int64_t required_integer(const char* name) const {
    int64_t v = 0;
    if (!integer(name, v)) fail(name, "missing");
    return v;
  }
  // A size: `exact` (hetflow's double) when present, else the integer attribute, >= 0.
  double size(const char* exact, const char* name, bool required) const {
    if (const et::AttributeProto* a = find(exact); a != nullptr) {
      if (a->value_case() != et::AttributeProto::kDoubleVal || !std::isfinite(a->double_val()) || a->double_val() < 0) {
        fail(exact, "expected a finite number >= 0");
      }
      return a->double_val();
    }
    int64_t v = 0;
    if (!integer(name, v)) {
      if (required) fail(name, "missing");
      return 0;
    }
    if (v < 0) fail(name, "expected a size >= 0, found " + std::to_string(v));
    return static_cast<double>(v);
  }
  std::string text(const char* name, const std::string& otherwise) const {
    const et::AttributeProto* a = find(name);
    if (a == nullptr) return otherwise;
    if (a->value_case() != et::AttributeProto::kStringVal) fail(name, "expected a string");
    return a->string_val();
  }
  int rank(const char* name, int ranks, int self) const {
    const int64_t r = required_integer(name);
    if (r < 0 || r >= ranks) fail(name, "rank " + std::to_string(r) + " does not exist (" + std::to_string(ranks) + " files)");
    if (r == self) fail(name, "a transfer to its own rank");
    return static_cast<int>(r);
  }
};

partition::CollectiveKind collective_kind(const NodeReader& r) {
  const int64_t t = r.required_integer("comm_type");
  switch (t) {
    case et::ALL_REDUCE: return partition::CollectiveKind::all_reduce;
    case et::ALL_GATHER: return partition::CollectiveKind::all_gather;
    case et::REDUCE_SCATTER: return partition::CollectiveKind::reduce_scatter;
    case et::BROADCAST: return partition::CollectiveKind::broadcast;
    case et::REDUCE: return partition::CollectiveKind::reduce;
    default:
      r.fail("comm_type", "collective type " + std::to_string(t) +
                              " is not one hetflow runs (ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, BROADCAST, REDUCE)");
  }
}

// comm_group.json: {"<pg_name>": [ranks]}.
std::map<std::string, std::vector<int>> read_comm_groups(const std::string& text, const std::string& file, int ranks) {
  std::map<std::string, std::vector<int>> groups;
  if (text.empty()) return groups;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    throw InputError(file, 0, "comm_group", "not JSON (at byte " + std::to_string(e.byte) + ")");
  }
  if (!j.is_object()) throw InputError(file, 0, "comm_group", "expected an object {\"<pg_name>\": [ranks]}");
  for (const auto& [pg, members] : j.items()) {
    if (!members.is_array() || members.empty()) throw InputError(file, 0, pg, "expected a non-empty list of ranks");
    std::set<int> seen;
    for (const auto& m : members) {
      if (!m.is_number_integer() || m.get<int64_t>() < 0 || m.get<int64_t>() >= ranks) {
        throw InputError(file, 0, pg, "expected ranks 0 to " + std::to_string(ranks - 1) + ", found " + m.dump());
      }
      if (!seen.insert(m.get<int>()).second) throw InputError(file, 0, pg, "lists rank " + m.dump() + " twice");
      groups[pg].push_back(m.get<int>());
    }
  }
  return groups;
}

struct CollectiveNode {
  int task = -1;
  partition::CollectiveKind kind{};
  double bytes = 0;
  partition::CollectiveAlgorithm algorithm{};
  int root = 0;
  int messages = 1;
  partition::Purpose purpose{};
};

}  // namespace

std::vector<ChakraFile> write_chakra(const Plan& plan, const partition::CostModel& cost, const std::string& prefix) {
  if (plan.layout.folded) {
    throw PlanError("the plan is folded (one data-parallel replica's tasks for all): a Chakra trace needs every rank's; "
                    "plan it without --fold to export it");
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
    for (int id : sequence[d]) {
      const Task& t = plan.task(id);
      et::Node n;
      n.set_id(static_cast<uint64_t>(id));
      n.set_name(std::string(to_string(t.kind)) + (t.microbatch >= 0 ? " mb" + std::to_string(t.microbatch) : "") +
                 (t.stage >= 0 ? " stage" + std::to_string(t.stage) : ""));
      for (uint64_t c : ctrl[static_cast<size_t>(id)]) n.add_ctrl_deps(c);
      for (uint64_t c : data[static_cast<size_t>(id)]) n.add_data_deps(c);
      attr_bool(n, "is_cpu_op", false);
      attr(n, "hetflow_kind", std::string(to_string(t.kind)));
      attr(n, "hetflow_stream", plan.stream_name(t.stream));
      attr(n, "hetflow_purpose", std::string(to_string(t.purpose)));
      if (!later[static_cast<size_t>(id)].empty()) {
        et::AttributeProto* a = n.add_attr();
        a->set_name("hetflow_later_deps");
        for (int64_t v : later[static_cast<size_t>(id)]) a->mutable_int64_list()->add_values(v);
      }
      if (partition::is_compute(t.kind)) {
        n.set_type(et::COMP_NODE);
        n.set_duration_micros(
            static_cast<uint64_t>(std::llround(1e6 * cost.task_compute_time_s(plan, t))));
        attr(n, "num_ops", static_cast<int64_t>(std::llround(t.flops)));
        attr(n, "tensor_size", static_cast<int64_t>(std::llround(t.memory_bytes)));
        attr_double(n, "hetflow_flops", t.flops);
        attr_double(n, "hetflow_recompute_flops", t.recompute_flops);
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
        const partition::Collective& c = plan.collective(t.collective);
        n.set_type(et::COMM_COLL_NODE);
        attr(n, "comm_type", static_cast<int64_t>(comm_type(c.kind)));
        attr(n, "comm_size", static_cast<int64_t>(std::llround(c.bytes)));
        attr(n, "pg_name", std::to_string(c.communicator));
        et::AttributeProto* dims = n.add_attr();
        dims->set_name("involved_dim");
        dims->mutable_bool_list()->add_values(true);
        attr_double(n, "hetflow_bytes", c.bytes);
        attr(n, "hetflow_algorithm", std::string(to_string(c.algorithm)));
        attr(n, "hetflow_root", static_cast<int64_t>(c.root));
        if (c.messages != 1) attr(n, "hetflow_messages", static_cast<int64_t>(c.messages));
      }
      append_delimited(bytes, n);
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

namespace {

// One set of rank files read into one plan, in the order the checks need: every rank's nodes
// become tasks (read_rank), then their dependencies order edges, then the channels' sends and
// receives are counted and the process groups' collectives joined, and the plan gets the
// placeholder network and layout validation asks for (finish).
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
  void join_collectives(const std::string& comm_group);
  Plan finish();

 private:
  const std::string& file_name(int r) const { return ranks_[static_cast<size_t>(r)].name; }
  void read_metadata(Reader& file);
  Task read_node(const NodeReader& n, int r, std::string& default_stream);
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
  while (true) {
    ++file.message;
    node.Clear();
    if (!file.next(node)) break;
    if (++nodes_ > kMaxNodes) file.fail("id", "more than " + std::to_string(kMaxNodes) + " nodes in all");
    const NodeReader n{file, node};
    std::string default_stream = "compute";
    Task t = read_node(n, r, default_stream);
    const std::string purpose = n.text("hetflow_purpose", std::string(to_string(t.purpose)));
    try {
      t.purpose = partition::parse_purpose(purpose);
    } catch (const std::exception&) {
      n.fail("hetflow_purpose", "expected a purpose, found '" + purpose.substr(0, 40) + "'");
    }
    t.stream = stream(n.text("hetflow_stream", default_stream));
    const int id = plan_.add_task(t);
    if (t.kind == TaskKind::collective) collectives_[n.text("pg_name", "all")][r].back().task = id;
    if (!task_of_node_[static_cast<size_t>(r)].emplace(node.id(), id).second) {
      n.fail("id", "node id " + std::to_string(node.id()) + " is given twice");
    }
    read_dependencies(n, id);
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
      if (!partition::is_compute(t.kind)) n.fail("hetflow_kind", "a compute node of kind '" + kind + "'");
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
      c.kind = collective_kind(n);
      c.bytes = n.size("hetflow_bytes", "comm_size", true);
      const std::string algorithm = n.text("hetflow_algorithm", "ring");
      try {
        c.algorithm = partition::parse_collective_algorithm(algorithm);
      } catch (const std::exception&) {
        n.fail("hetflow_algorithm", "expected ring, tree or hierarchical, found '" + algorithm.substr(0, 40) + "'");
      }
      int64_t root = 0;
      n.integer("hetflow_root", root);
      c.root = static_cast<int>(std::clamp<int64_t>(root, 0, rank_count_));
      int64_t messages = 1;
      n.integer("hetflow_messages", messages);
      if (messages < 1 || messages > (1 << 20)) n.fail("hetflow_messages", "expected 1 to 1048576 back-to-back collectives");
      c.messages = static_cast<int>(messages);
      const std::string pg = n.text("pg_name", "all");
      t.bytes = c.bytes;
      default_stream = "collective:" + pg;
      collectives_[pg][r].push_back(c);
      break;
    }
    default: n.fail("type", "node type " + std::to_string(node.type()) + " is not one hetflow runs");
  }
  return t;
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

// The k-th collective of a process group on each member is one collective.
void ChakraAssembly::join_collectives(const std::string& comm_group) {
  const std::string group_file = name_ + "/comm_group.json";
  const std::map<std::string, std::vector<int>> groups = read_comm_groups(comm_group, group_file, rank_count_);
  for (const auto& [pg, by_rank] : collectives_) {
    std::vector<int> members;
    if (const auto g = groups.find(pg); g != groups.end()) {
      members = g->second;
    } else {
      for (const auto& [r, list] : by_rank) members.push_back(r);
    }
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
    for (const auto& [r, list] : by_rank) {
      if (std::find(members.begin(), members.end(), r) == members.end()) {
        throw InputError(file_name(r), 0, "pg_name",
                         "a collective of process group " + pg + ", which " + group_file + " does not list this rank in");
      }
    }
    const int communicator = plan_.add_communicator({"pg " + pg, members});
    for (size_t k = 0; k < count; ++k) {
      const CollectiveNode& first = by_rank.at(members.front())[k];
      partition::Collective c{first.kind, first.algorithm, first.purpose, communicator, first.bytes,
                              std::min(first.root, static_cast<int>(members.size()) - 1), first.messages, {}};
      c.purpose = plan_.task(first.task).purpose;
      for (int m : members) {
        const CollectiveNode& mine = by_rank.at(m)[k];
        if (mine.kind != first.kind || mine.bytes != first.bytes || mine.messages != first.messages) {
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
  assembly.join_collectives(comm_group);
  return assembly.finish();
}

}  // namespace hetflow::traces
