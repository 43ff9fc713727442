// The plan file, version 3, written: one JSON document, built as text in one pass (a plan
// of a million tasks is written in seconds); its canonical form without the fingerprint is
// what the fingerprint hashes. And the grid view of a plan's programs.
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

Json layout_json(const Layout& l) {
  Json j;
  j["policy"] = l.policy;
  j["schedule"] = l.schedule;
  if (axis_order_text(l.axes) == axis_order_text(default_axes())) {
    j["tensor"] = l.size(Axis::tensor);  // Megatron's order: the plans of before named axes keep their bytes
  } else {
    j["axes"] = Json::array();
    for (const LayoutAxis& a : l.axes) j["axes"].push_back({{"axis", std::string(to_string(a.axis))}, {"size", a.size}});
  }
  j["virtual_stages"] = l.virtual_stages;
  j["micro_batch_size"] = l.micro_batch_size;
  j["precision"] = std::string(model::to_string(l.precision));
  j["recompute"] = std::string(to_string(l.recompute));
  j["sequence_parallel"] = l.sequence_parallel;
  j["fp32_grad_accumulation"] = l.fp32_grad_accumulation;
  j["workspace_bytes"] = l.workspace_bytes;
  j["iterations"] = l.iterations;
  if (l.folded) j["folded"] = true;  // written only when set: unfolded plans keep their fingerprints
  if (l.context_comm != ContextComm::all_gather) j["context_comm"] = std::string(to_string(l.context_comm));  // likewise
  if (l.kernels != KernelOptions{}) {  // likewise: plans with Megatron's default kernels keep theirs
    j["kernels"] = {{"flash_attention", l.kernels.flash_attention},
                    {"fused_softmax", l.kernels.fused_softmax},
                    {"fused_bias_gelu", l.kernels.fused_bias_gelu},
                    {"fused_bias_dropout_add", l.kernels.fused_bias_dropout_add}};
    if (!l.kernels.fused_adam) j["kernels"]["fused_adam"] = false;  // only when off: older files keep their bytes
  }
  j["sync"] = {{"kind", std::string(to_string(l.sync.kind))},
               {"algorithm", std::string(to_string(l.sync.algorithm))},
               {"bucket_bytes", l.sync.bucket_bytes},
               {"staleness", l.sync.staleness},
               {"layer_server", l.sync.layer_server}};
  if (l.sync.overlap_grad_reduce) j["sync"]["overlap_grad_reduce"] = true;  // only when set: older plans keep their bytes
  if (l.sync.zero.stage > 0) {  // likewise
    j["sync"]["zero"] = {{"stage", l.sync.zero.stage}, {"reshard_after_forward", l.sync.zero.reshard_after_forward}};
    // (Written when not equal, so that earlier plans keep their bytes.)
    if (l.sync.zero.shares != ZeroShares::equal) j["sync"]["zero"]["shares"] = to_string(l.sync.zero.shares);
  }
  if (l.offload.any()) {  // only when set, likewise
    j["offload"] = {{"optimizer", l.offload.optimizer}};
    if (l.offload.activations) j["offload"]["activations"] = true;
  }
  if (l.experts != Experts{}) {  // only when set, likewise
    j["experts"] = {{"parallel", l.experts.parallel}, {"routing", to_string(l.experts.routing)},
                    {"dispatch", std::string(to_string(l.experts.dispatch))}};
    if (!l.experts.placement.empty()) j["experts"]["placement"] = l.experts.placement;
  }
  j["workers"] = Json::array();
  for (const VirtualWorker& w : l.workers) {
    Json stages = Json::array();
    for (const Stage& s : w.stages) stages.push_back({s.layer_begin, s.layer_end, s.rank});
    j["workers"].push_back({{"ranks", w.ranks}, {"stages", stages}, {"microbatches", w.microbatches}});
  }
  return j;
}

// --- writing: straight to text, one array element per line. A plan can hold millions of
// tasks; a JSON document tree of them would take gigabytes and most of the time.

void append_string(std::string& out, std::string_view text) {
  out += '"';
  for (const char c : text) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
          out += buf;
        } else {
          out += c;
        }
    }
  }
  out += '"';
}

// Shortest text that reads back to exactly the same double (whole numbers without ".0";
// -0 as 0, which is what a reader gets back from "-0").
void append_number(std::string& out, double v) {
  if (v == 0) v = 0;
  char buf[40];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, r.ptr);
}

void append_number(std::string& out, long long v) {
  char buf[24];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, r.ptr);
}

template <typename Ints>
void append_ints(std::string& out, const Ints& values) {
  out += '[';
  bool first = true;
  for (const auto v : values) {
    if (!first) out += ',';
    first = false;
    append_number(out, static_cast<long long>(v));
  }
  out += ']';
}

void append_numbers(std::string& out, const std::vector<double>& values) {
  out += '[';
  for (size_t i = 0; i < values.size(); ++i) {
    if (i > 0) out += ',';
    append_number(out, values[i]);
  }
  out += ']';
}

// "key": (after a comma unless first in its object)
void append_key(std::string& out, std::string_view key, bool first = false) {
  if (!first) out += ", ";
  append_string(out, key);
  out += ": ";
}

// A top-level array with one element per line, each written by `element(out, i)`.
template <typename Element>
void append_lines(std::string& out, std::string_view key, size_t count, Element element) {
  out += ",\n ";
  append_string(out, key);
  out += ": [";
  for (size_t i = 0; i < count; ++i) {
    out += i == 0 ? "\n  " : ",\n  ";
    element(out, i);
  }
  out += count == 0 ? "]" : "\n ]";
}

void append_task(std::string& out, const Plan& plan, size_t i) {
  const Task& t = plan.tasks[i];
  out += '{';
  append_key(out, "kind", true);
  append_string(out, to_string(t.kind));
  append_key(out, "purpose");
  append_string(out, to_string(t.purpose));
  for (const auto& [key, value] : {std::pair<const char*, int>{"device", t.device}, {"stream", t.stream},
                                   {"worker", t.worker}, {"stage", t.stage}, {"microbatch", t.microbatch}}) {
    append_key(out, key);
    append_number(out, static_cast<long long>(value));
  }
  append_key(out, "layers");
  append_ints(out, std::initializer_list<int>{t.layer_begin, t.layer_end});
  for (const auto& [key, value] : {std::pair<const char*, double>{"flops", t.flops}, {"recompute_flops", t.recompute_flops},
                                   {"memory_bytes", t.memory_bytes}, {"bytes", t.bytes}}) {
    append_key(out, key);
    append_number(out, value);
  }
  append_key(out, "channel");
  append_number(out, static_cast<long long>(t.channel));
  append_key(out, "collective");
  append_number(out, static_cast<long long>(t.collective));
  append_key(out, "reads");
  append_ints(out, plan.reads(static_cast<int>(i)));
  append_key(out, "writes");
  append_ints(out, plan.writes(static_cast<int>(i)));
  out += '}';
}

// One collective's line of the plan file.
void append_collective(std::string& o, const Collective& c) {
  o += "{\"kind\": ";
  append_string(o, to_string(c.kind));
  o += ", \"algorithm\": ";
  append_string(o, to_string(c.algorithm));
  o += ", \"purpose\": ";
  append_string(o, to_string(c.purpose));
  o += ", \"communicator\": ";
  append_number(o, static_cast<long long>(c.communicator));
  o += ", \"bytes\": ";
  append_number(o, c.bytes);
  o += ", \"root\": ";
  append_number(o, static_cast<long long>(c.root));
  if (c.messages != 1) {  // written only where it says something: older plans keep their fingerprints
    o += ", \"messages\": ";
    append_number(o, static_cast<long long>(c.messages));
  }
  if (!c.parts.empty()) {  // an all_to_all's uneven shares
    o += ", \"parts\": ";
    append_numbers(o, c.parts);
  }
  if (c.in_task()) {  // runs inside its tasks, message m at point at[m] of their work
    o += ", \"at\": ";
    append_numbers(o, c.at);
  }
  if (!c.until.empty()) {  // messages that overlap the work: where it waits for each
    o += ", \"until\": ";
    append_numbers(o, c.until);
  }
  o += ", \"tasks\": ";
  append_ints(o, c.tasks);
  o += '}';
}

// The whole plan; with a fingerprint, it goes after "version". Without, this is the
// canonical text the fingerprint hashes.
std::string plan_text(const Plan& plan, const std::string& fingerprint) {
  std::string out;
  out.reserve(256 * plan.tasks.size() + 64 * plan.tensors.size() + 65536);
  out += "{\"format\": \"hetflow-plan\",\n \"version\": ";
  append_number(out, static_cast<long long>(Plan::kFormatVersion));
  if (!fingerprint.empty()) {
    out += ",\n \"fingerprint\": ";
    append_string(out, fingerprint);
  }
  for (const auto& [key, name, yaml] : {std::tuple{"cluster", plan.cluster.name, model::write_cluster(plan.cluster)},
                                        std::tuple{"network", plan.network.name, model::write_network(plan.network)}}) {
    out += ",\n ";
    append_string(out, key);
    out += ": {\"name\": ";
    append_string(out, name);
    out += ", \"yaml\": ";
    append_string(out, yaml);
    out += '}';
  }
  out += ",\n \"layout\": " + layout_json(plan.layout).dump();
  append_lines(out, "devices", plan.device_names.size(), [&](std::string& o, size_t i) { append_string(o, plan.device_names[i]); });
  out += ",\n \"axes\": [";
  for (size_t a = 0; a < kAxisCount; ++a) {
    if (a > 0) out += ", ";
    append_string(out, to_string(kAxes[a]));
  }
  out += ']';
  append_lines(out, "coords", plan.coords.size(), [&](std::string& o, size_t i) {
    append_ints(o, plan.coords[i].at);
  });
  append_lines(out, "streams", plan.streams.size(), [&](std::string& o, size_t i) { append_string(o, plan.streams[i]); });
  append_lines(out, "communicators", plan.communicators.size(), [&](std::string& o, size_t i) {
    o += "{\"name\": ";
    append_string(o, plan.communicators[i].name);
    o += ", \"role\": ";
    append_string(o, to_string(plan.communicators[i].role));
    o += ", \"devices\": ";
    append_ints(o, plan.communicators[i].devices);
    o += '}';
  });
  append_lines(out, "channels", plan.channels.size(), [&](std::string& o, size_t i) {
    const Channel& c = plan.channels[i];
    o += "{\"src\": ";
    append_number(o, static_cast<long long>(c.src));
    o += ", \"dst\": ";
    append_number(o, static_cast<long long>(c.dst));
    o += ", \"tag\": ";
    append_string(o, c.tag);
    o += ", \"communicator\": ";
    append_number(o, static_cast<long long>(c.communicator));
    o += '}';
  });
  append_lines(out, "collectives", plan.collectives.size(),
               [&](std::string& o, size_t i) { append_collective(o, plan.collectives[i]); });
  const std::vector<std::vector<int>> consumers = plan.consumers();
  append_lines(out, "tensors", plan.tensors.size(), [&](std::string& o, size_t i) {
    const Tensor& t = plan.tensors[i];
    o += "{\"kind\": ";
    append_string(o, to_string(t.kind));
    o += ", \"device\": ";
    append_number(o, static_cast<long long>(t.device));
    o += ", \"shape\": ";
    append_ints(o, t.shape);
    o += ", \"dtype\": ";
    append_string(o, model::to_string(t.dtype));
    o += ", \"bytes\": ";
    append_number(o, t.bytes);
    o += ", \"producer\": ";
    append_number(o, static_cast<long long>(t.producer));
    o += ", \"consumers\": ";
    append_ints(o, consumers[i]);
    o += ", \"free_after\": ";
    append_number(o, static_cast<long long>(t.free_after));
    o += '}';
  });
  append_lines(out, "tasks", plan.tasks.size(), [&](std::string& o, size_t i) { append_task(o, plan, i); });
  append_lines(out, "order", plan.order.size(), [&](std::string& o, size_t i) {
    const OrderEdge& e = plan.order[i];
    append_ints(o, std::initializer_list<int>{e.from, e.to, e.offset});
    if (e.fraction != 1) {  // [from, to, offset, fraction]: only where the edge has one
      o.pop_back();
      o += ", ";
      append_number(o, e.fraction);
      o += ']';
    }
  });
  append_lines(out, "programs", plan.programs.size(), [&](std::string& o, size_t d) {
    o += '[';
    for (size_t k = 0; k < plan.programs[d].size(); ++k) {
      o += k == 0 ? "{\"stream\": " : ", {\"stream\": ";
      append_number(o, static_cast<long long>(plan.programs[d][k].stream));
      o += ", \"tasks\": ";
      append_ints(o, plan.programs[d][k].tasks);
      o += '}';
    }
    o += ']';
  });
  append_lines(out, "memory", plan.memory.size(), [&](std::string& o, size_t d) {
    const DeviceMemory& m = plan.memory[d];
    bool first = true;
    for (const auto& [key, value] : {std::pair<const char*, double>{"weights_bytes", m.weights_bytes},
                                     {"gradients_bytes", m.gradients_bytes}, {"optimizer_bytes", m.optimizer_bytes},
                                     {"activations_bytes", m.activations_bytes}, {"buffers_bytes", m.buffers_bytes},
                                     {"workspace_bytes", m.workspace_bytes}, {"capacity_bytes", m.capacity_bytes},
                                     {"gathered_bytes", m.gathered_bytes}, {"host_bytes", m.host_bytes}}) {
      if (value == 0 && (key == std::string_view("gathered_bytes") || key == std::string_view("host_bytes"))) {
        continue;  // ZeRO's and offload's alone: other plans keep their bytes
      }
      o += first ? "{" : ", ";
      first = false;
      append_string(o, key);
      o += ": ";
      append_number(o, value);
    }
    o += ", \"peak_in_flight\": ";
    append_number(o, static_cast<long long>(m.peak_in_flight));
    o += '}';
  });
  out += "}\n";
  return out;
}

std::string hash_of(const std::string& canonical) {
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(XXH3_64bits(canonical.data(), canonical.size())));
  return std::string("xxh3:") + hex;
}

}  // namespace

std::string plan_fingerprint(const Plan& plan) { return hash_of(plan_text(plan, "")); }

std::string write_plan_json(const Plan& plan) {
  return plan_text(plan, plan_fingerprint(plan));
}


std::string plan_grid(const Plan& plan) {
  std::string out;
  const bool chunks = plan.layout.virtual_stages > 1;
  for (size_t d = 0; d < plan.programs.size(); ++d) {
    std::string line;
    for (const StreamProgram& program : plan.programs[d]) {
      for (int id : program.tasks) {
        const Task& t = plan.task(id);
        char letter = 0;
        if (t.kind == TaskKind::forward) letter = 'F';
        if (t.kind == TaskKind::backward) letter = 'B';
        if (t.kind == TaskKind::backward_weight) letter = 'W';
        if (letter == 0) continue;
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
