#include "partition/plan_io.hpp"

#include <nlohmann/json.hpp>

#include "model/error.hpp"
#include "model/precision.hpp"

namespace hetflow::partition {

using Json = nlohmann::ordered_json;

namespace {

Json layout_json(const Layout& l) {
  Json j;
  j["policy"] = l.policy;
  j["schedule"] = l.schedule;
  j["tensor"] = l.tensor;
  j["virtual_stages"] = l.virtual_stages;
  j["micro_batch_size"] = l.micro_batch_size;
  j["precision"] = std::string(model::to_string(l.precision));
  j["recompute"] = std::string(to_string(l.recompute));
  j["sequence_parallel"] = l.sequence_parallel;
  j["fp32_grad_accumulation"] = l.fp32_grad_accumulation;
  j["workspace_bytes"] = l.workspace_bytes;
  j["iterations"] = l.iterations;
  j["sync"] = {{"kind", std::string(to_string(l.sync.kind))},
               {"algorithm", std::string(to_string(l.sync.algorithm))},
               {"bucket_bytes", l.sync.bucket_bytes},
               {"staleness", l.sync.staleness},
               {"layer_server", l.sync.layer_server}};
  j["workers"] = Json::array();
  for (const VirtualWorker& w : l.workers) {
    Json stages = Json::array();
    for (const Stage& s : w.stages) stages.push_back({s.layer_begin, s.layer_end, s.rank});
    j["workers"].push_back({{"ranks", w.ranks}, {"stages", stages}, {"microbatches", w.microbatches}});
  }
  return j;
}

Json task_json(const Task& t) {
  Json j;
  j["kind"] = std::string(to_string(t.kind));
  j["purpose"] = std::string(to_string(t.purpose));
  j["device"] = t.device;
  j["stream"] = t.stream;
  j["iteration"] = t.iteration;
  j["worker"] = t.worker;
  j["stage"] = t.stage;
  j["microbatch"] = t.microbatch;
  j["layers"] = {t.layer_begin, t.layer_end};
  j["flops"] = t.flops;
  j["recompute_flops"] = t.recompute_flops;
  j["memory_bytes"] = t.memory_bytes;
  j["bytes"] = t.bytes;
  j["peer"] = t.peer;
  j["group"] = t.group;
  return j;
}

// Reading: every access names its field path, so a broken file says where it is broken.
class Reader {
 public:
  explicit Reader(std::string file) : file_(std::move(file)) {}

  const Json& at(const Json& j, const std::string& key, const std::string& path) const {
    if (!j.is_object()) fail(path, "expected an object");
    const auto it = j.find(key);
    if (it == j.end()) fail(path.empty() ? key : path + "." + key, "is required but missing");
    return *it;
  }
  const Json& array(const Json& j, const std::string& key, const std::string& path) const {
    const Json& a = at(j, key, path);
    if (!a.is_array()) fail(join(path, key), "expected an array");
    return a;
  }
  int integer(const Json& j, const std::string& key, const std::string& path) const {
    const Json& v = at(j, key, path);
    if (!v.is_number_integer()) fail(join(path, key), "expected an integer, found " + v.dump());
    return v.get<int>();
  }
  int integer(const Json& v, const std::string& path) const {
    if (!v.is_number_integer()) fail(path, "expected an integer, found " + v.dump());
    return v.get<int>();
  }
  double number(const Json& j, const std::string& key, const std::string& path) const {
    const Json& v = at(j, key, path);
    if (!v.is_number()) fail(join(path, key), "expected a number, found " + v.dump());
    return v.get<double>();
  }
  std::string string(const Json& j, const std::string& key, const std::string& path) const {
    const Json& v = at(j, key, path);
    if (!v.is_string()) fail(join(path, key), "expected a string, found " + v.dump());
    return v.get<std::string>();
  }
  bool boolean(const Json& j, const std::string& key, const std::string& path) const {
    const Json& v = at(j, key, path);
    if (!v.is_boolean()) fail(join(path, key), "expected true or false, found " + v.dump());
    return v.get<bool>();
  }
  std::vector<int> integers(const Json& v, const std::string& path) const {
    if (!v.is_array()) fail(path, "expected an array of integers");
    std::vector<int> out;
    for (size_t i = 0; i < v.size(); ++i) out.push_back(integer(v[i], path + "[" + std::to_string(i) + "]"));
    return out;
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
    throw InputError(file_, 0, field, message);
  }
  static std::string join(const std::string& path, const std::string& key) { return path.empty() ? key : path + "." + key; }

 private:
  std::string file_;
};

Layout read_layout(const Reader& r, const Json& j) {
  const std::string p = "layout";
  Layout l;
  l.policy = r.string(j, "policy", p);
  l.schedule = r.string(j, "schedule", p);
  l.tensor = r.integer(j, "tensor", p);
  l.virtual_stages = r.integer(j, "virtual_stages", p);
  l.micro_batch_size = r.integer(j, "micro_batch_size", p);
  l.precision = r.parsed(j, "precision", p, model::parse_precision);
  l.recompute = r.parsed(j, "recompute", p, parse_recompute);
  l.sequence_parallel = r.boolean(j, "sequence_parallel", p);
  l.fp32_grad_accumulation = r.boolean(j, "fp32_grad_accumulation", p);
  l.workspace_bytes = r.number(j, "workspace_bytes", p);
  l.iterations = r.integer(j, "iterations", p);
  const Json& sync = r.at(j, "sync", p);
  l.sync.kind = r.parsed(sync, "kind", p + ".sync", parse_sync);
  l.sync.algorithm = r.parsed(sync, "algorithm", p + ".sync", parse_collective_algorithm);
  l.sync.bucket_bytes = r.number(sync, "bucket_bytes", p + ".sync");
  l.sync.staleness = r.integer(sync, "staleness", p + ".sync");
  l.sync.layer_server = r.integers(r.at(sync, "layer_server", p + ".sync"), p + ".sync.layer_server");
  const Json& workers = r.array(j, "workers", p);
  for (size_t w = 0; w < workers.size(); ++w) {
    const std::string wp = p + ".workers[" + std::to_string(w) + "]";
    VirtualWorker vw;
    const Json& ranks = r.array(workers[w], "ranks", wp);
    for (size_t k = 0; k < ranks.size(); ++k) vw.ranks.push_back(r.integers(ranks[k], wp + ".ranks[" + std::to_string(k) + "]"));
    const Json& stages = r.array(workers[w], "stages", wp);
    for (size_t k = 0; k < stages.size(); ++k) {
      const std::vector<int> s = r.integers(stages[k], wp + ".stages[" + std::to_string(k) + "]");
      if (s.size() != 3) r.fail(wp + ".stages[" + std::to_string(k) + "]", "expected [layer_begin, layer_end, rank]");
      vw.stages.push_back(Stage{s[0], s[1], s[2]});
    }
    vw.microbatches = r.integer(workers[w], "microbatches", wp);
    l.workers.push_back(std::move(vw));
  }
  return l;
}

}  // namespace

std::string write_plan_json(const Plan& plan) {
  Json j;
  j["format"] = "hetflow-plan";
  j["version"] = Plan::kFormatVersion;
  j["cluster"] = {{"name", plan.cluster_name}, {"yaml", plan.cluster_yaml}};
  j["network"] = {{"name", plan.network_name}, {"layers", plan.network_layers}};
  j["layout"] = layout_json(plan.layout);
  j["devices"] = plan.device_names;
  j["streams"] = plan.streams;
  Json tasks = Json::array();
  for (const Task& t : plan.tasks) tasks.push_back(task_json(t));
  j["tasks"] = std::move(tasks);
  Json deps = Json::array();
  for (auto [it, end] = boost::edges(plan.graph); it != end; ++it) {
    deps.push_back({boost::source(*it, plan.graph), boost::target(*it, plan.graph)});
  }
  j["dependencies"] = std::move(deps);
  Json collectives = Json::array();
  for (const Collective& c : plan.collectives) {
    collectives.push_back({{"kind", "allreduce"},
                           {"algorithm", std::string(to_string(c.algorithm))},
                           {"purpose", std::string(to_string(c.purpose))},
                           {"bytes", c.bytes},
                           {"devices", c.devices},
                           {"tasks", c.tasks}});
  }
  j["collectives"] = std::move(collectives);
  Json programs = Json::array();
  for (const auto& device : plan.programs) {
    Json streams = Json::array();
    for (const StreamProgram& p : device) streams.push_back({{"stream", p.stream}, {"tasks", p.tasks}});
    programs.push_back(std::move(streams));
  }
  j["programs"] = std::move(programs);
  Json memory = Json::array();
  for (const DeviceMemory& m : plan.memory) {
    memory.push_back({{"weights_bytes", m.weights_bytes},
                      {"gradients_bytes", m.gradients_bytes},
                      {"optimizer_bytes", m.optimizer_bytes},
                      {"activations_bytes", m.activations_bytes},
                      {"workspace_bytes", m.workspace_bytes},
                      {"capacity_bytes", m.capacity_bytes},
                      {"peak_in_flight", m.peak_in_flight}});
  }
  j["memory"] = std::move(memory);
  return j.dump(1) + "\n";
}

Plan read_plan_json(const std::string& text, const std::string& file) {
  Json j;
  try {
    j = Json::parse(text);
  } catch (const Json::parse_error& e) {
    int line = 1;
    for (size_t i = 0; i < e.byte && i < text.size(); ++i) line += text[i] == '\n';
    throw InputError(file, line, "json", std::string("not valid JSON: ") + e.what());
  }
  const Reader r(file);
  if (r.string(j, "format", "") != "hetflow-plan") r.fail("format", "expected \"hetflow-plan\"");
  const int version = r.integer(j, "version", "");
  if (version != Plan::kFormatVersion) {
    r.fail("version", "expected " + std::to_string(Plan::kFormatVersion) + ", found " + std::to_string(version));
  }
  Plan plan;
  const Json& cluster = r.at(j, "cluster", "");
  plan.cluster_name = r.string(cluster, "name", "cluster");
  plan.cluster_yaml = r.string(cluster, "yaml", "cluster");
  const Json& network = r.at(j, "network", "");
  plan.network_name = r.string(network, "name", "network");
  plan.network_layers = r.integer(network, "layers", "network");
  plan.layout = read_layout(r, r.at(j, "layout", ""));
  for (const Json& d : r.array(j, "devices", "")) {
    if (!d.is_string()) r.fail("devices", "expected device names");
    plan.device_names.push_back(d.get<std::string>());
  }
  for (const Json& s : r.array(j, "streams", "")) {
    if (!s.is_string()) r.fail("streams", "expected stream names");
    plan.streams.push_back(s.get<std::string>());
  }
  const Json& tasks = r.array(j, "tasks", "");
  plan.tasks.reserve(tasks.size());
  for (size_t i = 0; i < tasks.size(); ++i) {
    const std::string p = "tasks[" + std::to_string(i) + "]";
    const Json& tj = tasks[i];
    Task t;
    t.kind = r.parsed(tj, "kind", p, parse_task_kind);
    t.purpose = r.parsed(tj, "purpose", p, parse_purpose);
    t.device = r.integer(tj, "device", p);
    t.stream = r.integer(tj, "stream", p);
    t.iteration = r.integer(tj, "iteration", p);
    t.worker = r.integer(tj, "worker", p);
    t.stage = r.integer(tj, "stage", p);
    t.microbatch = r.integer(tj, "microbatch", p);
    const std::vector<int> layers = r.integers(r.at(tj, "layers", p), p + ".layers");
    if (layers.size() != 2) r.fail(p + ".layers", "expected [layer_begin, layer_end]");
    t.layer_begin = layers[0];
    t.layer_end = layers[1];
    t.flops = r.number(tj, "flops", p);
    t.recompute_flops = r.number(tj, "recompute_flops", p);
    t.memory_bytes = r.number(tj, "memory_bytes", p);
    t.bytes = r.number(tj, "bytes", p);
    t.peer = r.integer(tj, "peer", p);
    t.group = r.integer(tj, "group", p);
    plan.tasks.push_back(t);
    boost::add_vertex(plan.graph);
  }
  const Json& deps = r.array(j, "dependencies", "");
  for (size_t i = 0; i < deps.size(); ++i) {
    const std::string p = "dependencies[" + std::to_string(i) + "]";
    const std::vector<int> e = r.integers(deps[i], p);
    if (e.size() != 2) r.fail(p, "expected [from_task, to_task]");
    for (int t : e) {
      if (t < 0 || static_cast<size_t>(t) >= plan.tasks.size()) r.fail(p, "task " + std::to_string(t) + " does not exist");
    }
    plan.add_dependency(e[0], e[1]);
  }
  const Json& collectives = r.array(j, "collectives", "");
  for (size_t i = 0; i < collectives.size(); ++i) {
    const std::string p = "collectives[" + std::to_string(i) + "]";
    Collective c;
    if (r.string(collectives[i], "kind", p) != "allreduce") r.fail(p + ".kind", "expected allreduce");
    c.algorithm = r.parsed(collectives[i], "algorithm", p, parse_collective_algorithm);
    c.purpose = r.parsed(collectives[i], "purpose", p, parse_purpose);
    c.bytes = r.number(collectives[i], "bytes", p);
    c.devices = r.integers(r.at(collectives[i], "devices", p), p + ".devices");
    c.tasks = r.integers(r.at(collectives[i], "tasks", p), p + ".tasks");
    plan.collectives.push_back(std::move(c));
  }
  const Json& programs = r.array(j, "programs", "");
  for (size_t d = 0; d < programs.size(); ++d) {
    const std::string p = "programs[" + std::to_string(d) + "]";
    if (!programs[d].is_array()) r.fail(p, "expected an array of {stream, tasks} per device");
    std::vector<StreamProgram> streams;
    for (size_t s = 0; s < programs[d].size(); ++s) {
      const std::string ps = p + "[" + std::to_string(s) + "]";
      streams.push_back(StreamProgram{r.integer(programs[d][s], "stream", ps),
                                      r.integers(r.at(programs[d][s], "tasks", ps), ps + ".tasks")});
    }
    plan.programs.push_back(std::move(streams));
  }
  const Json& memory = r.array(j, "memory", "");
  for (size_t d = 0; d < memory.size(); ++d) {
    const std::string p = "memory[" + std::to_string(d) + "]";
    DeviceMemory m;
    m.weights_bytes = r.number(memory[d], "weights_bytes", p);
    m.gradients_bytes = r.number(memory[d], "gradients_bytes", p);
    m.optimizer_bytes = r.number(memory[d], "optimizer_bytes", p);
    m.activations_bytes = r.number(memory[d], "activations_bytes", p);
    m.workspace_bytes = r.number(memory[d], "workspace_bytes", p);
    m.capacity_bytes = r.number(memory[d], "capacity_bytes", p);
    m.peak_in_flight = r.integer(memory[d], "peak_in_flight", p);
    plan.memory.push_back(m);
  }
  return plan;
}

std::string plan_grid(const Plan& plan) {
  std::string out;
  const bool chunks = plan.layout.virtual_stages > 1;
  for (size_t d = 0; d < plan.programs.size(); ++d) {
    std::string line;
    int iteration = -1;
    for (const StreamProgram& program : plan.programs[d]) {
      for (int id : program.tasks) {
        const Task& t = plan.tasks[static_cast<size_t>(id)];
        char letter = 0;
        if (t.kind == TaskKind::forward) letter = 'F';
        if (t.kind == TaskKind::backward) letter = 'B';
        if (t.kind == TaskKind::backward_weight) letter = 'W';
        if (letter == 0) continue;
        if (iteration >= 0 && t.iteration != iteration) line += " |";
        iteration = t.iteration;
        line += ' ';
        line += letter;
        line += std::to_string(t.microbatch);
        if (chunks) {
          const auto& vw = plan.layout.workers[static_cast<size_t>(t.worker)];
          line += "." + std::to_string(t.stage / static_cast<int>(vw.ranks.size()));
        }
      }
    }
    if (!line.empty()) out += plan.device_names[d] + ":" + line + "\n";
  }
  return out;
}

}  // namespace hetflow::partition
