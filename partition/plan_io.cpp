// The plan file, version 3 (partition/plan.schema.json describes it), read: every field's
// type and range is checked as it streams in, naming its path; the program's meaning
// (matching, lifetimes, deadlock) is left to validate_plan. plan_write.cpp writes it.
#include "partition/plan_io.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <iterator>
#include <limits>
#include <string_view>
#include <tuple>

#include <nlohmann/json.hpp>
#include <xxhash.h>

#include "model/error.hpp"
#include "model/json_util.hpp"
#include "model/io.hpp"
#include "model/precision.hpp"

namespace hetflow::partition {

using Json = nlohmann::ordered_json;

namespace {

using model::json_util::brief;

// Reading: every access names its field path, so a broken file says where it is broken.
class Reader {
 public:
  explicit Reader(std::string file) : file_(std::move(file)) {}

  const Json& at(const Json& j, const std::string& key, const std::string& path) const {
    if (!j.is_object()) fail(path.empty() ? "(top level)" : path, "expected an object, found " + brief(j));
    const auto it = j.find(key);
    if (it == j.end()) fail(join(path, key), "is required but missing");
    return *it;
  }
  const Json& array(const Json& j, const std::string& key, const std::string& path) const {
    const Json& a = at(j, key, path);
    if (!a.is_array()) fail(join(path, key), "expected an array, found " + brief(a));
    return a;
  }
  // A JSON integer that fits `int` and lies in [lo, hi]; nothing is silently wrapped.
  int integer(const Json& v, const std::string& path, long long lo = std::numeric_limits<int>::min(),
              long long hi = std::numeric_limits<int>::max()) const {
    if (!v.is_number_integer()) fail(path, "expected an integer, found " + brief(v));
    const bool too_big = v.is_number_unsigned() && v.get<unsigned long long>() > static_cast<unsigned long long>(hi);
    const long long x = too_big ? hi : v.get<long long>();
    if (too_big || x < lo || x > hi) {
      fail(path, "expected an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], found " + brief(v));
    }
    return static_cast<int>(x);
  }
  int integer(const Json& j, const std::string& key, const std::string& path, long long lo = std::numeric_limits<int>::min(),
              long long hi = std::numeric_limits<int>::max()) const {
    return integer(at(j, key, path), join(path, key), lo, hi);
  }
  // A 64-bit count in [0, 2^53] (exact in a double, as JSON readers elsewhere hold it).
  std::int64_t count64(const Json& v, const std::string& path) const {
    constexpr std::int64_t kMax = std::int64_t{1} << 53;
    if (!v.is_number_integer()) fail(path, "expected an integer, found " + brief(v));
    const bool too_big = v.is_number_unsigned() && v.get<unsigned long long>() > static_cast<unsigned long long>(kMax);
    const long long x = too_big ? kMax + 1 : v.get<long long>();
    if (x < 0 || x > kMax) fail(path, "expected an integer in [0, 2^53], found " + brief(v));
    return x;
  }
  // A finite number >= 0 (every quantity in a plan is a size, a count or a rate).
  double number(const Json& j, const std::string& key, const std::string& path) const {
    const Json& v = at(j, key, path);
    if (!v.is_number()) fail(join(path, key), "expected a number, found " + brief(v));
    const double x = v.get<double>();
    if (!std::isfinite(x) || x < 0) fail(join(path, key), "expected a finite number >= 0, found " + brief(v));
    return x + 0.0;  // -0 is 0: the plan and its fingerprint have one zero
  }
  // Element i of an array: a finite number >= 0.
  double number(const Json& array, size_t i, const std::string& path) const {
    const Json& v = array[i];
    const std::string where = path + "[" + std::to_string(i) + "]";
    if (!v.is_number()) fail(where, "expected a number, found " + brief(v));
    const double x = v.get<double>();
    if (!std::isfinite(x) || x < 0) fail(where, "expected a finite number >= 0, found " + brief(v));
    return x + 0.0;
  }
  std::string string(const Json& j, const std::string& key, const std::string& path) const {
    const Json& v = at(j, key, path);
    if (!v.is_string()) fail(join(path, key), "expected a string, found " + brief(v));
    return v.get<std::string>();
  }
  bool boolean(const Json& j, const std::string& key, const std::string& path) const {
    const Json& v = at(j, key, path);
    if (!v.is_boolean()) fail(join(path, key), "expected true or false, found " + brief(v));
    return v.get<bool>();
  }
  std::vector<int> integers(const Json& v, const std::string& path, long long lo = std::numeric_limits<int>::min(),
                            long long hi = std::numeric_limits<int>::max()) const {
    if (!v.is_array()) fail(path, "expected an array of integers, found " + brief(v));
    std::vector<int> out;
    out.reserve(v.size());
    for (size_t i = 0; i < v.size(); ++i) out.push_back(integer(v[i], path + "[" + std::to_string(i) + "]", lo, hi));
    return out;
  }
  std::vector<int> integers(const Json& j, const std::string& key, const std::string& path, long long lo = -1,
                            long long hi = std::numeric_limits<int>::max()) const {
    return integers(at(j, key, path), join(path, key), lo, hi);
  }
  // The "name" beside an embedded YAML repeats the name inside it: an edit to one alone
  // would otherwise be silently undone.
  void same_name(const Json& j, const std::string& path, const std::string& embedded) const {
    const std::string name = string(j, "name", path);
    if (name != embedded) {
      fail(path + ".name", "'" + name + "' is not the name in " + path + ".yaml ('" + embedded + "'); change both or neither");
    }
  }
  template <typename Parse>
  auto parsed(const Json& j, const std::string& key, const std::string& path, Parse parse) const {
    const std::string text = string(j, key, path);
    try {
      return parse(text);
    } catch (const std::invalid_argument& e) {
      fail(join(path, key), e.what());
    }
  }
  [[noreturn]] void fail(const std::string& field, const std::string& message) const {
    throw InputError(file_, line_, field, message);
  }
  // The line errors name: the element being read while a table streams in, else 0 (the
  // field's path names the place).
  void at_line(int line) { line_ = line; }
  static std::string join(const std::string& path, const std::string& key) { return path.empty() ? key : path + "." + key; }
  const std::string& file() const { return file_; }

 private:
  std::string file_;
  int line_ = 0;
};

constexpr long long kMaxCount = std::numeric_limits<int>::max();

// The layout's axes: "axes" (each {axis, size}, in placement order) or, in Megatron's order,
// "tensor" alone; the sizes of data and pipeline then come from the workers (read_layout).
void read_axes(const Reader& r, const Json& j, Layout& l) {
  const std::string p = "layout";
  if (!j.contains("axes")) {
    l.axes = default_axes();
    l.set_size(Axis::tensor, r.integer(j, "tensor", p, 1, 1 << 20));
    return;
  }
  const Json& axes = r.array(j, "axes", p);
  l.axes.clear();
  std::string order;
  for (size_t i = 0; i < axes.size(); ++i) {
    const std::string pa = p + ".axes[" + std::to_string(i) + "]";
    const Axis a = r.parsed(axes[i], "axis", pa, parse_axis);
    l.axes.push_back({a, r.integer(axes[i], "size", pa, 1, kMaxCount)});
    order += (order.empty() ? "" : ",") + std::string(to_string(a));
  }
  try {
    parse_axis_order(order);
  } catch (const std::invalid_argument& e) {
    r.fail(p + ".axes", e.what());
  }
}

Layout read_layout(const Reader& r, const Json& j) {
  const std::string p = "layout";
  Layout l;
  l.policy = r.string(j, "policy", p);
  l.schedule = r.string(j, "schedule", p);
  read_axes(r, j, l);
  l.virtual_stages = r.integer(j, "virtual_stages", p, 1, 1 << 20);
  l.micro_batch_size = r.integer(j, "micro_batch_size", p, 1, kMaxCount);
  l.precision = r.parsed(j, "precision", p, model::parse_precision);
  l.recompute = r.parsed(j, "recompute", p, parse_recompute);
  l.sequence_parallel = r.boolean(j, "sequence_parallel", p);
  l.fp32_grad_accumulation = r.boolean(j, "fp32_grad_accumulation", p);
  l.workspace_bytes = r.number(j, "workspace_bytes", p);
  l.iterations = r.integer(j, "iterations", p, 1, kMaxCount);
  l.folded = j.contains("folded") && r.boolean(j, "folded", p);
  if (j.contains("context_comm")) {
    l.context_comm = r.parsed(j, "context_comm", p, parse_context_comm);
    if (l.context_comm == ContextComm::ring && l.size(Axis::context) <= 1) {
      r.fail(p + ".context_comm", "a ring passes keys and values around a context group; the layout has none");
    }
  }
  if (j.contains("offload")) {
    const Json& offload = r.at(j, "offload", p);
    l.offload.optimizer = r.boolean(offload, "optimizer", p + ".offload");
    l.offload.activations = offload.contains("activations") && r.boolean(offload, "activations", p + ".offload");
  }
  if (j.contains("kernels")) {
    const Json& k = r.at(j, "kernels", p);
    const std::string pk = p + ".kernels";
    l.kernels.flash_attention = r.boolean(k, "flash_attention", pk);
    l.kernels.fused_softmax = r.boolean(k, "fused_softmax", pk);
    l.kernels.fused_bias_gelu = r.boolean(k, "fused_bias_gelu", pk);
    l.kernels.fused_bias_dropout_add = r.boolean(k, "fused_bias_dropout_add", pk);
    l.kernels.fused_adam = !k.contains("fused_adam") || r.boolean(k, "fused_adam", pk);
  }
  const Json& sync = r.at(j, "sync", p);
  const std::string ps = p + ".sync";
  l.sync.kind = r.parsed(sync, "kind", ps, parse_sync);
  l.sync.algorithm = r.parsed(sync, "algorithm", ps, parse_collective_algorithm);
  l.sync.bucket_bytes = r.number(sync, "bucket_bytes", ps);
  l.sync.staleness = r.integer(sync, "staleness", ps, 0, 1 << 20);
  l.sync.layer_server = r.integers(sync, "layer_server", ps, 0);
  if (sync.is_object() && sync.contains("overlap_grad_reduce")) {
    l.sync.overlap_grad_reduce = r.boolean(sync, "overlap_grad_reduce", ps);
  }
  if (sync.is_object() && sync.contains("zero")) {
    const Json& zero = r.at(sync, "zero", ps);
    l.sync.zero.stage = r.integer(zero, "stage", ps + ".zero", 0, 3);
    l.sync.zero.reshard_after_forward = r.boolean(zero, "reshard_after_forward", ps + ".zero");
    if (zero.is_object() && zero.contains("shares")) {
      l.sync.zero.shares = r.parsed(zero, "shares", ps + ".zero", parse_zero_shares);
    }
  }
  if (j.contains("experts")) {
    const Json& experts = r.at(j, "experts", p);
    const std::string pe = p + ".experts";
    l.experts.parallel = r.integer(experts, "parallel", pe, 1, 1 << 20);
    l.experts.routing = r.parsed(experts, "routing", pe, [](const std::string& text) {
      try {
        return parse_routing(text, "", "");
      } catch (const InputError& e) {
        throw std::invalid_argument(e.message());
      }
    });
    l.experts.dispatch = r.parsed(experts, "dispatch", pe, parse_collective_algorithm);
    if (experts.contains("placement")) l.experts.placement = r.integers(experts, "placement", pe, 0, 1 << 20);
  }
  const Json& workers = r.array(j, "workers", p);
  for (size_t w = 0; w < workers.size(); ++w) {
    const std::string wp = p + ".workers[" + std::to_string(w) + "]";
    VirtualWorker vw;
    const Json& ranks = r.array(workers[w], "ranks", wp);
    for (size_t k = 0; k < ranks.size(); ++k) {
      vw.ranks.push_back(r.integers(ranks[k], wp + ".ranks[" + std::to_string(k) + "]", 0, kMaxCount));
    }
    const Json& stages = r.array(workers[w], "stages", wp);
    for (size_t k = 0; k < stages.size(); ++k) {
      const std::string sp = wp + ".stages[" + std::to_string(k) + "]";
      const std::vector<int> s = r.integers(stages[k], sp, 0, kMaxCount);
      if (s.size() != 3) r.fail(sp, "expected [layer_begin, layer_end, rank]");
      vw.stages.push_back(Stage{s[0], s[1], s[2]});
    }
    vw.microbatches = r.integer(workers[w], "microbatches", wp, 1, kMaxCount);
    l.workers.push_back(std::move(vw));
  }
  if (!j.contains("axes")) l.fit_outer_axes();  // Megatron's order, written as the tensor degree alone
  return l;
}

std::vector<std::string> strings(const Reader& r, const Json& j, const std::string& key) {
  std::vector<std::string> out;
  const Json& a = r.array(j, key, "");
  out.reserve(a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    if (!a[i].is_string()) r.fail(key + "[" + std::to_string(i) + "]", "expected a string, found " + brief(a[i]));
    out.push_back(a[i].get<std::string>());
  }
  return out;
}

}  // namespace

namespace {

// The format and version, checked before anything else is read. While the file streams in,
// `document` holds the members read so far and only those are checked (`complete` false);
// at the end, both must be there.
void check_header(const Reader& r, const Json& document, bool complete) {
  if (!document.is_object()) r.fail("(top level)", "expected a plan object, found " + brief(document));
  if ((complete || document.contains("format")) && r.string(document, "format", "") != "hetflow-plan") {
    r.fail("format", "expected \"hetflow-plan\"");
  }
  if (!complete && !document.contains("version")) return;
  const int version = r.integer(document, "version", "");
  if (version != Plan::kFormatVersion) {
    r.fail("version", "this is a version-" + std::to_string(version) + " plan; hetflow reads version " +
                          std::to_string(Plan::kFormatVersion) + " only. Make the plan again with `hetflow plan ... --out " +
                          r.file() + "` (the options are in its \"layout\")");
  }
}

// The large tables of a plan, converted element by element while the file is parsed (see
// json_util::parse_streamed); what an element refers to in another table is checked once
// every table is read, since a file may list its tables in any order.
struct Tables {
  Plan& plan;
  Reader& r;
  std::vector<std::vector<int>> consumers;      // per tensor, as listed
  std::vector<OrderEdge> order;                 // as listed
  std::vector<int> order_line;
  bool header_checked = false;

  static bool streamed(const std::string& key) {
    return key == "tensors" || key == "tasks" || key == "order" || key == "programs";
  }

  void element(const std::string& key, size_t i, int line, const Json& e, const Json& document) {
    if (!header_checked) {
      check_header(r, document, false);  // a file of another format or version is not read as this one
      header_checked = true;
    }
    r.at_line(line);
    if (key == "tensors") tensor(i, e);
    if (key == "tasks") task(i, e);
    if (key == "order") edge(i, e, line);
    if (key == "programs") program(i, e);
    r.at_line(0);
  }

  void tensor(size_t i, const Json& tj) {
    const std::string p = "tensors[" + std::to_string(i) + "]";
    Tensor t;
    t.kind = r.parsed(tj, "kind", p, parse_tensor_kind);
    t.device = r.integer(tj, "device", p, 0);
    const Json& shape = r.array(tj, "shape", p);
    for (size_t k = 0; k < shape.size(); ++k) {
      t.shape.push_back(r.count64(shape[k], p + ".shape[" + std::to_string(k) + "]"));
    }
    t.dtype = r.parsed(tj, "dtype", p, model::parse_precision);
    t.bytes = r.number(tj, "bytes", p);
    t.producer = r.integer(tj, "producer", p, -1);
    consumers.push_back(r.integers(tj, "consumers", p, 0));
    t.free_after = r.integer(tj, "free_after", p, -1);
    plan.tensors.push_back(std::move(t));
  }

  void task(size_t i, const Json& tj) {
    const std::string p = "tasks[" + std::to_string(i) + "]";
    Task t;
    t.kind = r.parsed(tj, "kind", p, parse_task_kind);
    t.purpose = r.parsed(tj, "purpose", p, parse_purpose);
    t.device = r.integer(tj, "device", p, 0);
    t.stream = r.integer(tj, "stream", p, 0);
    t.worker = r.integer(tj, "worker", p, -1);
    t.stage = r.integer(tj, "stage", p, -1);
    t.microbatch = r.integer(tj, "microbatch", p, -1);
    const std::vector<int> layers = r.integers(tj, "layers", p, 0);
    if (layers.size() != 2) r.fail(p + ".layers", "expected [layer_begin, layer_end]");
    t.layer_begin = layers[0];
    t.layer_end = layers[1];
    t.flops = r.number(tj, "flops", p);
    t.recompute_flops = r.number(tj, "recompute_flops", p);
    t.memory_bytes = r.number(tj, "memory_bytes", p);
    t.bytes = r.number(tj, "bytes", p);
    t.channel = r.integer(tj, "channel", p, -1);
    t.collective = r.integer(tj, "collective", p, -1);
    // Tensor ids are checked against the tensor table in check_references(): add_task keeps
    // them in 16-bit counts and dereferences them.
    const std::vector<int> reads = r.integers(tj, "reads", p, 0);
    const std::vector<int> writes = r.integers(tj, "writes", p, 0);
    if (reads.size() > 65535 || writes.size() > 65535) r.fail(p, "reads or writes more than 65535 tensors");
    plan.tasks.push_back(t);
    plan.ref_begin.push_back(static_cast<std::uint32_t>(plan.refs.size()));
    plan.read_count.push_back(static_cast<std::uint16_t>(reads.size()));
    plan.write_count.push_back(static_cast<std::uint16_t>(writes.size()));
    plan.refs.insert(plan.refs.end(), reads.begin(), reads.end());
    plan.refs.insert(plan.refs.end(), writes.begin(), writes.end());
  }

  void edge(size_t i, const Json& e, int line) {
    const std::string p = "order[" + std::to_string(i) + "]";
    const char* form = "expected [from_task, to_task, iteration_offset] or [from_task, to_task, iteration_offset, fraction]";
    if (!e.is_array() || (e.size() != 3 && e.size() != 4)) r.fail(p, form);
    OrderEdge edge;
    edge.from = r.integer(e[0], p + "[0]", 0);
    edge.to = r.integer(e[1], p + "[1]", 0);
    edge.offset = r.integer(e[2], p + "[2]", 0);
    if (e.size() == 4) {
      const Json& f = e[3];
      const double x = f.is_number() ? f.get<double>() : -1;
      if (!(x > 0 && x < 1)) r.fail(p + "[3]", "expected a fraction in (0, 1) of the first task's work, found " + brief(f));
      edge.fraction = x;
    }
    order.push_back(edge);
    order_line.push_back(line);
  }

  void program(size_t d, const Json& e) {
    const std::string p = "programs[" + std::to_string(d) + "]";
    if (!e.is_array()) r.fail(p, "expected an array of {stream, tasks} per device, found " + brief(e));
    std::vector<StreamProgram> streams;
    for (size_t s = 0; s < e.size(); ++s) {
      const std::string ps = p + "[" + std::to_string(s) + "]";
      streams.push_back(StreamProgram{r.integer(e[s], "stream", ps, 0), r.integers(e[s], "tasks", ps, 0)});
    }
    plan.programs.push_back(std::move(streams));
  }

  // What the streamed tables refer to across tables: tensor ids in tasks, task ids in order
  // edges, and each tensor's consumers against the tasks that read it.
  void check_references() {
    const auto tensor_count = static_cast<long long>(plan.tensors.size());
    for (size_t i = 0; i < plan.tasks.size(); ++i) {
      const std::uint32_t begin = plan.ref_begin[i];
      const std::uint32_t reads = plan.read_count[i], writes = plan.write_count[i];
      for (std::uint32_t k = 0; k < reads + writes; ++k) {
        const int id = plan.refs[begin + k];
        if (id >= tensor_count) {
          const bool read = k < reads;
          r.fail("tasks[" + std::to_string(i) + "]." + (read ? "reads" : "writes") + "[" +
                     std::to_string(read ? k : k - reads) + "]",
                 "expected an integer in [0, " + std::to_string(tensor_count - 1) + "], found " + std::to_string(id));
        }
      }
    }
    for (size_t i = 0; i < order.size(); ++i) {
      for (int t : {order[i].from, order[i].to}) {
        if (static_cast<size_t>(t) >= plan.tasks.size()) {
          r.at_line(order_line[i]);
          r.fail("order[" + std::to_string(i) + "]", "task " + std::to_string(t) + " does not exist");
        }
      }
    }
    for (const OrderEdge& e : order) plan.add_order(e.from, e.to, e.offset, e.fraction);
    const std::vector<std::vector<int>> derived = plan.consumers();
    for (size_t i = 0; i < consumers.size(); ++i) {
      std::vector<int> listed = consumers[i];
      std::sort(listed.begin(), listed.end());
      if (listed != derived[i]) {
        r.fail("tensors[" + std::to_string(i) + "].consumers", "does not list exactly the tasks that read the tensor");
      }
    }
  }
};

}  // namespace

Plan read_plan_json(const std::string& text, const std::string& file) {
  Plan plan;
  Reader r(file);
  Tables tables{plan, r, {}, {}, {}};
  const Json j = model::json_util::parse_streamed<Json>(
      text, file, &Tables::streamed,
      [&](const std::string& key, size_t i, int line, Json& e, const Json& document) {
        tables.element(key, i, line, e, document);
      });
  check_header(r, j, true);
  const Json& cluster = r.at(j, "cluster", "");
  plan.cluster = model::parse_cluster(r.string(cluster, "yaml", "cluster"), file + " (cluster.yaml)");
  r.same_name(cluster, "cluster", plan.cluster.name);
  const Json& network = r.at(j, "network", "");
  plan.network = model::parse_network(r.string(network, "yaml", "network"), file + " (network.yaml)");
  r.same_name(network, "network", plan.network.name);
  plan.layout = read_layout(r, r.at(j, "layout", ""));
  plan.device_names = strings(r, j, "devices");
  plan.streams = strings(r, j, "streams");
  // Coordinates list the axes named, each once; an axis not named is -1 for every device.
  const std::vector<std::string> axes = strings(r, j, "axes");
  std::vector<Axis> listed;
  for (size_t a = 0; a < axes.size(); ++a) {
    try {
      listed.push_back(parse_axis(axes[a]));
    } catch (const std::invalid_argument& e) {
      r.fail("axes[" + std::to_string(a) + "]", e.what());
    }
    if (std::count(listed.begin(), listed.end(), listed.back()) > 1) {
      r.fail("axes[" + std::to_string(a) + "]", "expected each axis once, found '" + axes[a] + "' again");
    }
  }
  const Json& coords = r.array(j, "coords", "");
  for (size_t d = 0; d < coords.size(); ++d) {
    const std::string p = "coords[" + std::to_string(d) + "]";
    const std::vector<int> c = r.integers(coords[d], p, -1, kMaxCount);
    if (c.size() != listed.size()) r.fail(p, "expected one coordinate per axis, -1 off an axis");
    AxisCoords at;
    for (size_t a = 0; a < listed.size(); ++a) at[listed[a]] = c[a];
    // Plans written before the expert axis: every placed device is expert rank 0.
    if (std::find(listed.begin(), listed.end(), Axis::expert) == listed.end()) at[Axis::expert] = at[Axis::data] >= 0 ? 0 : -1;
    plan.coords.push_back(at);
  }
  const Json& communicators = r.array(j, "communicators", "");
  for (size_t i = 0; i < communicators.size(); ++i) {
    const std::string p = "communicators[" + std::to_string(i) + "]";
    plan.communicators.push_back(Communicator{r.string(communicators[i], "name", p),
                                              r.integers(communicators[i], "devices", p, 0),
                                              r.parsed(communicators[i], "role", p, parse_comm_role)});
  }
  const Json& channels = r.array(j, "channels", "");
  for (size_t i = 0; i < channels.size(); ++i) {
    const std::string p = "channels[" + std::to_string(i) + "]";
    const Json& c = channels[i];
    plan.channels.push_back(Channel{r.integer(c, "src", p, 0), r.integer(c, "dst", p, 0), r.string(c, "tag", p),
                                    r.integer(c, "communicator", p, 0)});
  }
  const Json& collectives = r.array(j, "collectives", "");
  for (size_t i = 0; i < collectives.size(); ++i) {
    const std::string p = "collectives[" + std::to_string(i) + "]";
    const Json& cj = collectives[i];
    Collective c;
    c.kind = r.parsed(cj, "kind", p, parse_collective_kind);
    c.algorithm = r.parsed(cj, "algorithm", p, parse_collective_algorithm);
    c.purpose = r.parsed(cj, "purpose", p, parse_purpose);
    c.communicator = r.integer(cj, "communicator", p, 0);
    c.bytes = r.number(cj, "bytes", p);
    c.root = r.integer(cj, "root", p, 0);
    if (cj.contains("messages")) c.messages = r.integer(cj, "messages", p, 1, 1 << 20);
    // In-task: one point per message, and where messages overlap the work, one more each
    // (validation checks their number and order); an
    // all_to_all's shares (validation checks their number and sum).
    const auto fractions = [&](const char* key, const std::string& what, std::vector<double>& out) {
      if (!cj.contains(key)) return;
      const Json& list = cj[key];
      const std::string field = p + "." + key;
      if (!list.is_array() || list.empty()) {
        r.fail(field, "expected a non-empty array of " + what + "s in [0, 1], found " + brief(list));
      }
      for (size_t m = 0; m < list.size(); ++m) {
        const double x = r.number(list, m, field);
        if (x > 1) r.fail(field + "[" + std::to_string(m) + "]", "expected a " + what + " in [0, 1], found " + brief(list[m]));
        out.push_back(x);
      }
    };
    fractions("at", "point", c.at);
    fractions("until", "point", c.until);
    fractions("parts", "share", c.parts);
    c.tasks = r.integers(cj, "tasks", p, 0);
    plan.collectives.push_back(std::move(c));
  }
  // The streamed tables: present as arrays (their elements were read as they came).
  for (const char* key : {"tensors", "tasks", "order", "programs"}) r.array(j, key, "");
  tables.check_references();
  const Json& memory = r.array(j, "memory", "");
  for (size_t d = 0; d < memory.size(); ++d) {
    const std::string p = "memory[" + std::to_string(d) + "]";
    DeviceMemory m;
    m.weights_bytes = r.number(memory[d], "weights_bytes", p);
    m.gradients_bytes = r.number(memory[d], "gradients_bytes", p);
    m.optimizer_bytes = r.number(memory[d], "optimizer_bytes", p);
    m.activations_bytes = r.number(memory[d], "activations_bytes", p);
    m.buffers_bytes = r.number(memory[d], "buffers_bytes", p);
    m.workspace_bytes = r.number(memory[d], "workspace_bytes", p);
    m.capacity_bytes = r.number(memory[d], "capacity_bytes", p);
    if (memory[d].is_object() && memory[d].contains("gathered_bytes")) m.gathered_bytes = r.number(memory[d], "gathered_bytes", p);
    if (memory[d].is_object() && memory[d].contains("host_bytes")) m.host_bytes = r.number(memory[d], "host_bytes", p);
    m.peak_in_flight = r.integer(memory[d], "peak_in_flight", p, 0);
    plan.memory.push_back(m);
  }
  plan.finish();
  plan.fingerprint = plan_fingerprint(plan);
  if (j.contains("fingerprint")) {
    const Json& stored = j["fingerprint"];
    if (!stored.is_string() || stored.get<std::string>() != plan.fingerprint) {
      r.fail("fingerprint", "the file says " + brief(stored) + " but its content hashes to \"" + plan.fingerprint +
                                "\": it was changed after it was written. To keep the change, delete the "
                                "\"fingerprint\" line and validate it again");
    }
  }
  return plan;
}

}  // namespace hetflow::partition
