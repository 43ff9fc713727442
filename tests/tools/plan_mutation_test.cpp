// Mutation test of plan files. Thousands of field and byte mutations of valid version-3
// plans (1F1B with data parallelism, tensor + sequence parallelism, the interleaved
// schedule, HetPipe's wave-synchronous parallel with parameter servers) each end one of
// three ways: refused while reading (InputError, the CLI's exit 2), refused by validation
// with its problems named (exit 3), or valid. A valid mutant estimates, writes and reads
// back as the same plan without losing or changing a field, and simulates to completion or
// fails with a PlanError or InputError: never a stall without a fault. Nothing throws a
// library's own exception, shows a library's internals in a message, crashes or hangs.
// A subset runs through the `hetflow` binary: validate exits 0, 2 or 3, simulate of a plan
// that validated exits 0, 2 or 3, and every refusal reads "hetflow: ..." naming the file or
// the problem.
//
// Deterministic: every mutant comes from one std::mt19937 seed, and a failure names the
// seed, the mutant's number and what was mutated, with the environment that replays it
// alone (HETFLOW_MUTATION_SEED, HETFLOW_MUTANT). Another seed explores other mutants.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <array>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/error.hpp"
#include "model/io.hpp"
#include "model/zoo.hpp"
#include "partition/estimate.hpp"
#include "partition/plan_builder.hpp"
#include "partition/plan_io.hpp"
#include "partition/policy.hpp"
#include "partition/validate.hpp"
#include "sim/simulator.hpp"
#include "tests/partition/plan_test_util.hpp"
#include "tests/tools/run_hetflow.hpp"
#include "traces/metrics.hpp"

using namespace hetflow;
using namespace hetflow::partition;

namespace {

using Json = nlohmann::ordered_json;
using Pointer = Json::json_pointer;

// Sanitized builds (Debug, instrumented) run each mutant about 20 times slower: there a
// tenth of the mutants keeps the test within CTest's timeout.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr int kShare = 10;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr int kShare = 10;
#else
constexpr int kShare = 1;
#endif
#else
constexpr int kShare = 1;
#endif

constexpr std::mt19937::result_type kSeed = 20240611;  // HETFLOW_MUTATION_SEED=n tries another
constexpr int kFieldMutants = 3000 / kShare;
constexpr int kByteMutants = 1000 / kShare;
constexpr int kSimulateFirstValid = 50;   // valid mutants of each kind; beyond, only those with a new structure
constexpr int kCliEvery = 50;             // every n-th mutant also runs through the binary
constexpr int kCliValidExtra = 20;        // and this many more among the valid ones
constexpr unsigned kHangSeconds = 120;    // far beyond any mutant's checks: only a hang gets there
constexpr int kMaxFailures = 30;          // then the loop stops: one defect, not thousands of lines

// --- the seed plans ---

struct Seed {
  std::string name;
  Plan plan;
  std::string text;  // write_plan_json without its fingerprint line
  Json doc;
  std::vector<Pointer> nodes;                      // every value but the root, depth first
  std::vector<std::pair<size_t, size_t>> sections;  // [begin, end) of nodes under each top-level key
  std::vector<std::string> tokens;                 // per node: its key, or its array's key + "[]"
  std::vector<std::vector<size_t>> nodes_by_token;  // the nodes of each distinct token
};

Plan build(const model::Cluster& cluster, const model::Network& network, PlanOptions o) {
  o.precision = network.precision;
  const CostModel cost(cluster, network.precision);
  return build_plan(cluster, network, make_layout(cluster, network, o, cost), cost);
}

std::string without_fingerprint(const std::string& text) {
  const size_t at = text.find("\"fingerprint\"");
  if (at == std::string::npos) return text;
  const size_t line_begin = text.rfind('\n', at) + 1;
  return text.substr(0, line_begin) + text.substr(text.find('\n', at) + 1);
}

void collect_nodes(const Json& j, const Pointer& at, const std::string& token, Seed& seed) {
  if (!at.empty()) {
    seed.nodes.push_back(at);
    seed.tokens.push_back(token);
  }
  if (j.is_object()) {
    for (auto it = j.begin(); it != j.end(); ++it) {
      const size_t begin = seed.nodes.size();
      collect_nodes(it.value(), at / it.key(), it.key(), seed);
      if (at.empty()) seed.sections.emplace_back(begin, seed.nodes.size());
    }
  } else if (j.is_array()) {
    for (size_t i = 0; i < j.size(); ++i) collect_nodes(j[i], at / i, token + "[]", seed);
  }
}

Seed make_seed(const std::string& name, Plan plan) {
  Seed s;
  s.name = name;
  s.plan = std::move(plan);
  s.text = without_fingerprint(write_plan_json(s.plan));
  s.doc = Json::parse(s.text);
  collect_nodes(s.doc, Pointer(), "", s);
  std::map<std::string, std::vector<size_t>> by_token;
  for (size_t i = 0; i < s.tokens.size(); ++i) by_token[s.tokens[i]].push_back(i);
  for (auto& [token, nodes] : by_token) s.nodes_by_token.push_back(std::move(nodes));
  return s;
}

const std::vector<Seed>& seeds() {
  static const std::vector<Seed> all = [] {
    std::vector<Seed> out;
    const model::Network gpt = model::network_from_spec("gpt:layers=4,hidden=256,heads=4,seq=128", model::Precision::bf16);
    {
      PlanOptions o;
      o.pipeline = 2;
      o.data = 2;
      o.microbatches = 4;
      o.iterations = 2;
      out.push_back(make_seed("1f1b pipeline 2 x data 2",
                              build(test_support::identical_cluster(4), test_support::equal_layers(8), o)));
    }
    {
      PlanOptions o;
      o.tensor = 2;
      o.sequence_parallel = true;
      o.pipeline = 2;
      o.data = 1;
      o.microbatches = 2;
      o.iterations = 2;
      out.push_back(make_seed("tensor 2 + sequence parallel x pipeline 2", build(test_support::identical_cluster(4), gpt, o)));
    }
    {
      PlanOptions o;
      o.schedule = "interleaved";
      o.pipeline = 2;
      o.virtual_stages = 2;
      o.data = 1;
      o.microbatches = 4;
      o.iterations = 2;
      out.push_back(make_seed("interleaved pipeline 2 x 2 chunks",
                              build(test_support::identical_cluster(2), test_support::equal_layers(8), o)));
    }
    {
      PlanOptions o;
      o.policy = "hetpipe-ed";
      o.sync = SyncKind::wsp;
      o.staleness = 1;
      o.microbatches = 2;
      o.iterations = 3;
      // fp16: the testbed's Volta, Turing and Pascal parts have no bf16 (refused).
      const model::Network fp16 = model::network_from_spec("gpt:layers=4,hidden=256,heads=4,seq=128", model::Precision::fp16);
      out.push_back(make_seed("hetpipe-ed wsp staleness 1", build(model::builtin_cluster("hetpipe-testbed"), fp16, o)));
    }
    {
      PlanOptions o;  // stages of one and two devices; the workers hold layers 0-2 and 3-5 at different degrees
      o.layout_file = test_support::write_file("mutation-mixed-degrees.yaml", R"(workers:
  - stages: [{devices: [n-0/gpu0], layers: 0-2}, {devices: [n-0/gpu1, n-0/gpu2], layers: 3-5}]
  - stages: [{devices: [n-1/gpu0, n-1/gpu1], layers: 0-2}, {devices: [n-0/gpu3], layers: 3-5}]
)");
      o.microbatches = 2;
      o.iterations = 2;
      out.push_back(make_seed("layout file, tensor degrees 1 and 2", build(test_support::identical_cluster(4, 2), gpt, o)));
    }
    return out;
  }();
  return all;
}

// --- mutations ---

struct Mutant {
  int number = 0;
  bool field = true;  // a field mutation (else a byte mutation)
  const Seed* seed = nullptr;
  std::string what;   // the mutation, for failure messages
  std::string text;
};

std::mt19937::result_type mutation_seed() {
  const char* n = std::getenv("HETFLOW_MUTATION_SEED");
  return n == nullptr ? kSeed : static_cast<std::mt19937::result_type>(std::strtoul(n, nullptr, 10));
}

std::string describe(const Mutant& m) {
  return "seed " + std::to_string(mutation_seed()) + ", mutant #" + std::to_string(m.number) + " of plan '" +
         m.seed->name + "' (HETFLOW_MUTATION_SEED=" + std::to_string(mutation_seed()) +
         " HETFLOW_MUTANT=" + std::to_string(m.number) + " checks it alone): " + m.what;
}

// HETFLOW_MUTANT=n: check mutant n alone (every mutant is still made, to replay the seed).
int only_mutant() {
  const char* n = std::getenv("HETFLOW_MUTANT");
  return n == nullptr ? -1 : std::atoi(n);
}

template <typename T>
const T& pick(const std::vector<T>& values, std::mt19937& rng) {
  return values[std::uniform_int_distribution<size_t>(0, values.size() - 1)(rng)];
}

size_t below(size_t n, std::mt19937& rng) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng); }

Json nested_array(int depth) {
  Json j = Json::array();
  for (int i = 1; i < depth; ++i) j = Json::array({std::move(j)});
  return j;
}

std::string brief(const Json& j) {
  std::string text = j.dump();
  return text.size() > 60 ? text.substr(0, 57) + "..." : text;
}

// A node of the seed: a third of the time any node (most are tasks and tensors), a third a
// node of a top-level section chosen first, a third a node of a field name chosen first,
// so that the layout, the memory, the embedded cluster and rare fields (iterations,
// staleness, a collective's root) are mutated about as often as the task table.
size_t pick_node(const Seed& seed, std::mt19937& rng) {
  switch (rng() % 3) {
    case 0:
      return below(seed.nodes.size(), rng);
    case 1:
      for (;;) {
        const auto [begin, end] = pick(seed.sections, rng);
        if (end > begin) return begin + below(end - begin, rng);
      }
    default:
      return pick(pick(seed.nodes_by_token, rng), rng);
  }
}

// Edits a string: one of its characters replaced or deleted, or one of its lines deleted
// or doubled (the embedded cluster and network are YAML text).
std::string edit_string(std::string s, std::mt19937& rng, std::string& what) {
  if (s.empty()) {
    what = "appended 'x'";
    return "x";
  }
  std::vector<size_t> line_starts{0};
  for (size_t i = 0; i + 1 < s.size(); ++i) {
    if (s[i] == '\n') line_starts.push_back(i + 1);
  }
  switch (rng() % 4) {
    case 0: {
      const size_t at = below(s.size(), rng);
      const char c = "0-9 :x\"[{\n"[below(10, rng)];
      what = "character " + std::to_string(at) + " replaced";
      s[at] = c;
      return s;
    }
    case 1: {
      const size_t at = below(s.size(), rng);
      what = "character " + std::to_string(at) + " deleted";
      s.erase(at, 1);
      return s;
    }
    default: {
      const size_t line = below(line_starts.size(), rng);
      const size_t begin = line_starts[line];
      const size_t end = line + 1 < line_starts.size() ? line_starts[line + 1] : s.size();
      const bool remove = rng() % 2 == 0;
      what = std::string("line ") + std::to_string(line) + (remove ? " deleted" : " doubled");
      if (remove) {
        s.erase(begin, end - begin);
      } else {
        s.insert(begin, s.substr(begin, end - begin));
      }
      return s;
    }
  }
}

Mutant field_mutant(const Seed& seed, std::mt19937& rng) {
  Mutant m;
  m.seed = &seed;
  Json doc = seed.doc;
  const size_t index = pick_node(seed, rng);
  const Pointer& at = seed.nodes[index];
  Json& node = doc[at];
  Json& parent = doc[at.parent_pointer()];
  const std::string where = at.to_string();
  enum Op { replace_integer, replace_number, replace_other, copy_same_key, edit_text, remove, duplicate, swap };
  std::vector<Op> ops{replace_other, remove};
  if (node.is_number_integer()) ops.insert(ops.end(), {replace_integer, replace_integer, replace_integer});
  if (node.is_number()) ops.push_back(replace_number);
  if (node.is_string()) ops.insert(ops.end(), {edit_text, edit_text});
  if (seed.tokens[index] != "") ops.insert(ops.end(), {copy_same_key, copy_same_key});
  if (parent.is_array()) ops.insert(ops.end(), {duplicate, swap});
  switch (pick(ops, rng)) {
    case replace_integer: {
      const long long x = node.is_number_unsigned() ? static_cast<long long>(node.get<unsigned long long>())
                                                    : node.get<long long>();
      const std::array<Json, 8> values{Json(-1), Json(0), Json(1), Json(std::numeric_limits<int>::max()),
                                       Json(2147483648LL), Json(9223372036854775808ULL), Json(x + 1), Json(x - 1)};
      node = values[below(values.size(), rng)];
      m.what = where + " = " + brief(node) + " (was " + std::to_string(x) + ")";
      break;
    }
    case replace_number: {
      const std::array<Json, 6> values{Json(0.0), Json(-1.0), Json(1e308), Json(1e-320),
                                       Json(std::numeric_limits<double>::max()), Json(-0.0)};
      node = values[below(values.size(), rng)];
      m.what = where + " = " + brief(node);
      break;
    }
    case replace_other: {
      const std::array<Json, 9> values{Json("x"),          Json(""),           Json(nullptr),
                                       Json(true),         Json::array(),      Json::object(),
                                       nested_array(8),    nested_array(60),   nested_array(70)};
      node = values[below(values.size(), rng)];
      m.what = where + " = " + brief(node);
      break;
    }
    case copy_same_key: {
      std::vector<size_t> same;
      for (size_t i = 0; i < seed.tokens.size(); ++i) {
        if (i != index && seed.tokens[i] == seed.tokens[index]) same.push_back(i);
      }
      if (same.empty()) {
        node = Json::object();
        m.what = where + " = {} (no other '" + seed.tokens[index] + "')";
        break;
      }
      const size_t other = pick(same, rng);
      node = seed.doc[seed.nodes[other]];
      m.what = where + " = " + seed.nodes[other].to_string() + " (" + brief(node) + ")";
      break;
    }
    case edit_text: {
      std::string what;
      node = edit_string(node.get<std::string>(), rng, what);
      m.what = where + ": " + what;
      break;
    }
    case remove:
      if (parent.is_array()) {
        parent.erase(std::stoul(at.back()));
      } else {
        parent.erase(at.back());
      }
      m.what = where + " removed";
      break;
    case duplicate: {
      const size_t i = std::stoul(at.back());
      parent.insert(parent.begin() + static_cast<std::ptrdiff_t>(i), parent[i]);
      m.what = where + " duplicated";
      break;
    }
    case swap: {
      const size_t i = std::stoul(at.back()), j = below(parent.size(), rng);
      std::swap(parent[i], parent[j]);
      m.what = where + " swapped with element " + std::to_string(j);
      break;
    }
  }
  m.text = doc.dump(1) + "\n";
  return m;
}

Mutant byte_mutant(const Seed& seed, std::mt19937& rng) {
  Mutant m;
  m.seed = &seed;
  m.field = false;
  std::string text = seed.text;
  const size_t at = below(text.size(), rng);
  static constexpr char kInteresting[] = "0123456789-+.eE\"[]{},:\n \\\x00\xff";
  const char c = rng() % 4 == 0 ? static_cast<char>(rng()) : kInteresting[below(sizeof kInteresting - 1, rng)];
  const std::string here = " at byte " + std::to_string(at);
  switch (rng() % 6) {
    case 0: {
      const int bit = static_cast<int>(rng() % 8);
      text[at] = static_cast<char>(text[at] ^ (1 << bit));
      m.what = "bit " + std::to_string(bit) + " flipped" + here;
      break;
    }
    case 1:
      text[at] = c;
      m.what = "byte " + std::to_string(static_cast<unsigned char>(c)) + " written" + here;
      break;
    case 2:
      text.insert(at, 1, c);
      m.what = "byte " + std::to_string(static_cast<unsigned char>(c)) + " inserted" + here;
      break;
    case 3: {
      const size_t n = 1 + below(16, rng);
      text.erase(at, n);
      m.what = std::to_string(n) + " bytes deleted" + here;
      break;
    }
    case 4:
      text.resize(at);
      m.what = "truncated" + here;
      break;
    case 5: {
      const size_t n = 1 + below(64, rng), to = below(text.size(), rng);
      text.insert(to, text.substr(at, n));
      m.what = std::to_string(n) + " bytes from byte " + std::to_string(at) + " copied to byte " + std::to_string(to);
      break;
    }
  }
  m.text = std::move(text);
  return m;
}

// Every mutant in a fixed order from the seed: the field mutants, then the byte mutants, the
// seed plans taken in turn.
class Mutants {
 public:
  bool done() const { return next_ == kFieldMutants + kByteMutants; }
  Mutant next() {
    const int n = next_++;
    const Seed& seed = seeds()[static_cast<size_t>(n) % seeds().size()];
    Mutant m = n < kFieldMutants ? field_mutant(seed, rng_) : byte_mutant(seed, rng_);
    m.number = n;
    return m;
  }

 private:
  std::mt19937 rng_{mutation_seed()};
  int next_ = 0;
};

// --- the oracle ---

// Text a message must never show: a library's own exception or type names.
std::string raw_library_text(const std::string& message) {
  for (const char* raw : {"std::", "json.exception", "basic_string", "vector::_M", "bad_alloc", "terminate", "YAML::"}) {
    if (message.find(raw) != std::string::npos) return raw;
  }
  return "";
}

// A mutant's checks that take this long are hung: say which mutant, then stop the process
// (a hang would otherwise only show as the test runner's timeout, naming nothing).
class HangGuard {
 public:
  explicit HangGuard(const std::string& what) {
    const std::string line = "\nHANG: no result after " + std::to_string(kHangSeconds) + " s for " + what + "\n";
    std::strncpy(message_, line.c_str(), sizeof message_ - 1);
    std::signal(SIGALRM, on_alarm);
    ::alarm(kHangSeconds);
  }
  ~HangGuard() { ::alarm(0); }
  HangGuard(const HangGuard&) = delete;
  HangGuard& operator=(const HangGuard&) = delete;

 private:
  static void on_alarm(int) {
    const ssize_t ignored = ::write(2, message_, std::strlen(message_));
    (void)ignored;
    ::_exit(70);
  }
  static inline char message_[1024] = {};
};

// What a simulated run depends on: the tasks' kinds, devices, streams, channels,
// collectives and tensors, the programs, the order edges, the channels, collectives and
// communicators, the layout and the cluster. Not names, quantities (flops, bytes, shapes,
// memory), nor the labels tasks carry for traces (worker, stage, micro-batch, layers, purpose).
Plan structure_of(Plan p) {
  for (Task& t : p.tasks) {
    t.flops = t.recompute_flops = t.memory_bytes = t.bytes = 0;
    t.worker = t.stage = t.microbatch = t.layer_begin = t.layer_end = 0;
    t.purpose = Purpose::compute;
  }
  for (Tensor& t : p.tensors) {
    t.bytes = 0;
    t.shape.clear();
  }
  for (Collective& c : p.collectives) {
    c.bytes = 0;
    c.purpose = Purpose::data_parallel;
  }
  for (Communicator& c : p.communicators) c.name.clear();
  for (std::string& s : p.streams) s.clear();
  p.memory.clear();
  p.network = model::Network{};
  p.cluster.description.clear();
  p.layout.workspace_bytes = 0;
  p.layout.sync.bucket_bytes = 0;
  return p;
}

// What a document says: the embedded YAML as the model reads it (a line that states a
// default says nothing, nor does a collective's one message), derived lists whose order carries no meaning sorted.
Json normalized(Json doc) {
  doc.erase("fingerprint");
  try {
    Json& cluster = doc.at("cluster").at("yaml");
    cluster = model::write_cluster(model::parse_cluster(cluster.get<std::string>(), "cluster.yaml"));
    Json& network = doc.at("network").at("yaml");
    network = model::write_network(model::parse_network(network.get<std::string>(), "network.yaml"));
  } catch (const std::exception&) {
    // left as it is: the comparison shows it
  }
  if (doc.contains("collectives") && doc["collectives"].is_array()) {
    for (Json& c : doc["collectives"]) {  // one message, the default, is written as nothing
      if (c.is_object() && c.contains("messages") && c["messages"] == 1) c.erase("messages");
    }
  }
  // Coordinates are by axis name: the order the file lists its axes in says nothing more.
  if (doc.contains("axes") && doc["axes"].is_array() && doc.contains("coords") && doc["coords"].is_array()) {
    const Json axes = doc["axes"];
    std::vector<size_t> order(axes.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return axes[a].dump() < axes[b].dump(); });
    Json sorted = Json::array();
    for (const size_t i : order) sorted.push_back(axes[i]);
    doc["axes"] = sorted;
    for (Json& c : doc["coords"]) {
      if (!c.is_array() || c.size() != order.size()) continue;
      Json by_name = Json::array();
      for (const size_t i : order) by_name.push_back(c[i]);
      c = by_name;
    }
  }
  if (doc.contains("tensors") && doc["tensors"].is_array()) {
    for (Json& t : doc["tensors"]) {
      if (t.is_object() && t.contains("consumers") && t["consumers"].is_array()) {
        std::sort(t["consumers"].begin(), t["consumers"].end());
      }
    }
  }
  return doc;
}

enum class Verdict { refused_reading, refused_validation, valid };

struct Tally {
  int mutants = 0, refused_reading = 0, refused_validation = 0, valid = 0;
  int simulated = 0, completed = 0, refused_by_simulator = 0;
};

struct Checked {
  Verdict verdict = Verdict::refused_reading;
  Plan plan;
};

void expect_clean_message(const std::string& message, const Mutant& m) {
  EXPECT_FALSE(message.empty()) << describe(m);
  const std::string raw = raw_library_text(message);
  EXPECT_EQ(raw, "") << describe(m) << "\nthe message shows library text '" << raw << "': " << message;
}

Checked read_and_validate(const Mutant& m) {
  Checked c;
  try {
    c.plan = read_plan_json(m.text, "mutant.json");
  } catch (const InputError& e) {
    expect_clean_message(e.what(), m);
    return c;
  } catch (const std::exception& e) {
    ADD_FAILURE() << describe(m) << "\nreading threw something other than InputError: " << e.what();
    return c;
  }
  try {
    const Validation v = validate_plan(c.plan);
    c.verdict = v.ok() ? Verdict::valid : Verdict::refused_validation;
    for (const std::string& p : v.problems) expect_clean_message(p, m);
  } catch (const std::exception& e) {
    ADD_FAILURE() << describe(m) << "\nvalidation threw: " << e.what();
    c.verdict = Verdict::refused_validation;
  }
  return c;
}

// A valid mutant estimates, and writes and reads back as itself, keeping every field the
// mutant's file says.
void check_valid_plan(const Plan& plan, const Mutant& m) {
  try {
    const CostModel cost(plan.cluster, plan.layout.precision);
    estimate_plan(plan, cost);
  } catch (const InputError& e) {
    expect_clean_message(e.what(), m);
  } catch (const PlanError& e) {
    expect_clean_message(e.what(), m);
  } catch (const std::exception& e) {
    ADD_FAILURE() << describe(m) << "\nthe estimate of a valid plan threw: " << e.what();
  }
  try {
    const std::string written = write_plan_json(plan);
    const Plan back = read_plan_json(written, "written.json");
    EXPECT_TRUE(same_plan(back, plan)) << describe(m) << "\nthe plan does not read back as itself";
    EXPECT_EQ(write_plan_json(back), written) << describe(m);
    if (m.field) {
      const Json said = normalized(Json::parse(m.text)), kept = normalized(Json::parse(written));
      EXPECT_TRUE(said == kept) << describe(m) << "\nthe reader lost or changed a field: the file says\n"
                                << said.dump().substr(0, 2000) << "\nbut the plan writes\n"
                                << kept.dump().substr(0, 2000);
    }
  } catch (const std::exception& e) {
    ADD_FAILURE() << describe(m) << "\nwriting or reading back a valid plan threw: " << e.what();
  }
}

// A valid plan runs to the end, or the simulator refuses it with a message blaming the plan;
// its trace gives the metrics `hetflow simulate` prints.
void check_simulation(const Plan& plan, const Mutant& m, Tally& tally) {
  ++tally.simulated;
  try {
    const sim::SimResult r = sim::simulate(plan, {});
    std::string stalls;
    for (const std::string& s : r.stalls) stalls += "\n  " + s;
    EXPECT_TRUE(r.completed) << describe(m) << "\na valid plan stalled with no fault injected:" << stalls;
    tally.completed += r.completed;
    try {
      traces::compute_metrics(r.trace, plan, CostModel(plan.cluster, plan.layout.precision));
    } catch (const std::exception& e) {
      ADD_FAILURE() << describe(m) << "\nthe metrics of a simulated valid plan threw: " << e.what();
    }
  } catch (const InputError& e) {
    ++tally.refused_by_simulator;
    expect_clean_message(e.what(), m);
    EXPECT_NE(e.file(), "<simulation>") << describe(m) << "\nthe simulation's own result is inconsistent: " << e.what();
  } catch (const PlanError& e) {
    ++tally.refused_by_simulator;
    expect_clean_message(e.what(), m);
  } catch (const std::exception& e) {
    ADD_FAILURE() << describe(m) << "\nthe simulation of a valid plan failed: " << e.what();
  }
}

int failures() {
  return testing::UnitTest::GetInstance()->current_test_info()->result()->total_part_count();
}

// --- through the binary ---

void expect_cli_refusal(const test_support::RunResult& r, const std::string& file, const Mutant& m,
                        const std::string& command) {
  EXPECT_EQ(r.err.rfind("hetflow: ", 0), 0u) << describe(m) << "\n" << command << " stderr: " << r.err;
  if (r.status == 2) {
    EXPECT_NE(r.err.find(file), std::string::npos) << describe(m) << "\n" << command << " does not name the file: " << r.err;
  } else {
    EXPECT_NE(r.err.find("plan cannot run"), std::string::npos) << describe(m) << "\n" << command << ": " << r.err;
  }
  const std::string raw = raw_library_text(r.err);
  EXPECT_EQ(raw, "") << describe(m) << "\n" << command << " shows library text: " << r.err;
}

void check_cli(const Mutant& m) {
  const std::string file = test_support::write_file("mutant-" + std::to_string(m.number) + ".json", m.text);
  const test_support::RunResult v = test_support::run_hetflow("validate " + file);
  ASSERT_TRUE(v.status == 0 || v.status == 2 || v.status == 3)
      << describe(m) << "\nhetflow validate exited " << v.status << "\n" << v.err;
  if (v.status != 0) {
    expect_cli_refusal(v, file, m, "hetflow validate");
    return;
  }
  const test_support::RunResult s = test_support::run_hetflow("simulate --plan " + file + " --json");
  ASSERT_TRUE(s.status == 0 || s.status == 2 || s.status == 3)
      << describe(m) << "\nhetflow simulate of a plan that validated exited " << s.status << "\n" << s.err << s.out;
  if (s.status != 0) expect_cli_refusal(s, file, m, "hetflow simulate");
}

}  // namespace

TEST(PlanMutation, SeedPlansAreValidWithoutTheirFingerprint) {
  for (const Seed& s : seeds()) {
    const Plan back = read_plan_json(s.text, s.name);
    const Validation v = validate_plan(back);
    EXPECT_TRUE(v.ok()) << s.name << ": " << (v.ok() ? "" : v.problems.front());
    EXPECT_TRUE(same_plan(back, s.plan)) << s.name;
    size_t messages = 0;  // (in-task collectives' messages are as much to mutate as tasks)
    for (size_t t = 0; t < s.plan.tasks.size(); ++t) messages += s.plan.inside(static_cast<int>(t)).size();
    EXPECT_GT(s.plan.tasks.size() + messages, 50u) << s.name;
    EXPECT_LT(s.plan.tasks.size(), 2000u) << s.name << ": keep the seeds small, the test runs thousands of them";
  }
}

TEST(PlanMutation, MutantsAreRefusedWithAMessageOrRunCorrectly) {
  std::array<Tally, 2> tally;  // field, byte
  for (Mutants mutants; !mutants.done();) {
    const Mutant m = mutants.next();
    if (only_mutant() >= 0 && m.number != only_mutant()) continue;
    Tally& t = tally[m.field ? 0 : 1];
    ++t.mutants;
    const HangGuard guard(describe(m));
    const Checked c = read_and_validate(m);
    switch (c.verdict) {
      case Verdict::refused_reading:
        ++t.refused_reading;
        break;
      case Verdict::refused_validation:
        ++t.refused_validation;
        break;
      case Verdict::valid:
        ++t.valid;
        check_valid_plan(c.plan, m);
        if (t.valid <= kSimulateFirstValid || !same_plan(structure_of(c.plan), structure_of(m.seed->plan))) {
          check_simulation(c.plan, m, t);
        }
        break;
    }
    if (failures() > kMaxFailures) {
      ADD_FAILURE() << "stopped after " << kMaxFailures << " failures";
      return;
    }
  }
  const char* kinds[] = {"field", "byte"};
  for (size_t k = 0; k < 2; ++k) {
    const Tally& t = tally[k];
    std::printf("%s mutants: %d; refused reading %d, refused by validation %d, valid %d; simulated %d: %d completed, %d "
                "refused by the simulator\n",
                kinds[k], t.mutants, t.refused_reading, t.refused_validation, t.valid, t.simulated, t.completed,
                t.refused_by_simulator);
  }
  if (only_mutant() >= 0) return;
  // Each outcome is reached, or the mutations test less than they seem to.
  EXPECT_GT(tally[0].refused_reading, 0);
  EXPECT_GT(tally[0].refused_validation, 0);
  EXPECT_GT(tally[0].valid, 0);
  EXPECT_GT(tally[0].simulated, 0);
  EXPECT_GT(tally[1].refused_reading, 0);
}

// Every kCliEvery-th mutant, and the first valid ones beside them, through `hetflow validate`
// and, when it validates, `hetflow simulate --plan`.
TEST(PlanMutation, TheBinaryExits0Or2Or3WithAMessage) {
  int through = 0, valid_extra = 0;
  for (Mutants mutants; !mutants.done();) {
    const Mutant m = mutants.next();
    if (only_mutant() >= 0 && m.number != only_mutant()) continue;
    bool run = m.number % kCliEvery == 0 || only_mutant() >= 0;
    if (!run && valid_extra < kCliValidExtra && read_and_validate(m).verdict == Verdict::valid) {
      ++valid_extra;
      run = true;
    }
    if (!run) continue;
    ++through;
    const HangGuard guard(describe(m));
    check_cli(m);
    if (failures() > kMaxFailures) {
      ADD_FAILURE() << "stopped after " << kMaxFailures << " failures";
      return;
    }
  }
  std::printf("through the binary: %d mutants, %d of them chosen because they validate\n", through, valid_extra);
}
