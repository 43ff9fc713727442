#include "partition/layout_file.hpp"

#include <cctype>
#include <charconv>
#include <map>
#include <stdexcept>
#include <string>
#include <tuple>
#include <string_view>
#include <utility>
#include <vector>

#include "model/error.hpp"
#include "model/gpu.hpp"
#include "model/units.hpp"
#include "model/yaml_util.hpp"

namespace hetflow::partition {

namespace {

namespace yu = model::yaml_util;

// "FIRST-LAST" or "N" (spaces allowed around the dash) -> {first, last}; false otherwise.
bool parse_range(std::string text, int& first, int& last) {
  std::erase_if(text, [](unsigned char c) { return std::isspace(c); });
  const auto number = [](std::string_view s, int& out) {
    auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
    return !s.empty() && ec == std::errc() && end == s.data() + s.size();
  };
  const size_t dash = text.find('-', 1);
  if (dash == std::string::npos) return number(text, first) && number(text, last);
  return number(std::string_view(text).substr(0, dash), first) && number(std::string_view(text).substr(dash + 1), last);
}

class FileReader {
 public:
  FileReader(const std::string& file, const model::Cluster& cluster, const model::Network& network, const Layout& base)
      : file_(file), network_(network), layers_(static_cast<int>(network.layers.size())),
        sequence_parallel_(base.sequence_parallel), virtual_stages_(std::max(1, base.virtual_stages)),
        data_parallel_(base.sync.kind == SyncKind::allreduce),
        replicated_(network.layers.size()) {
    for (const model::Device& d : cluster.devices()) {
      names_.push_back(d.name);
      ids_.emplace(d.name, d.id);
    }
  }

  void read(const YAML::Node& root, Layout& layout) {
    const yu::MapReader top(root, file_, "");
    const YAML::Node workers = top.get("workers");
    top.get("options");  // apply_layout_file_options'
    top.finish();
    top.required("workers");
    if (!workers.IsSequence() || workers.size() == 0) {
      top.fail("workers", "expected a list of virtual workers, each with its stages");
    }
    for (size_t w = 0; w < workers.size(); ++w) layout.workers.push_back(read_worker(workers[w], w));
    layout.fit_axes();
  }

 private:
  VirtualWorker read_worker(const YAML::Node& node, size_t w) {
    const std::string path = "workers[" + std::to_string(w) + "]";
    const yu::MapReader r(node, file_, path);
    const YAML::Node stages = r.get("stages");
    r.get("microbatches");
    r.finish();
    r.required("stages");
    if (!stages.IsSequence() || stages.size() == 0) r.fail("stages", "expected a list of stages in model order");
    VirtualWorker vw;
    vw.microbatches = r.int_or("microbatches", 0, 1);  // 0: the policy decides
    const size_t v = static_cast<size_t>(virtual_stages_), ranks = stages.size() / v;
    if (stages.size() % v != 0) {
      r.fail("stages", "expected a multiple of `virtual_stages` " + std::to_string(v) + " stages (each rank's " +
                           std::to_string(v) + " chunks), found " + std::to_string(stages.size()));
    }
    int next = 0;  // first layer not yet covered
    for (size_t k = 0; k < stages.size(); ++k) {
      const std::string stage_path = path + ".stages[" + std::to_string(k) + "]";
      const yu::MapReader s(stages[k], file_, stage_path);
      s.get("devices");
      s.get("layers");
      s.finish();
      if (k < ranks) {
        vw.ranks.push_back(read_devices(s, stage_path));
      } else {
        check_again(s, vw.ranks[k % ranks], path + ".stages[" + std::to_string(k % ranks) + "]");
      }
      const auto [first, last] = read_layers(s, next);
      vw.stages.push_back(Stage{first, last + 1, static_cast<int>(k % ranks)});
      check_replicated(s, stage_path, w, first, last + 1, static_cast<int>(vw.ranks.back().size()));
      next = last + 1;
    }
    if (next != layers_) {
      const YAML::Node last = stages[stages.size() - 1];
      throw InputError(file_, yu::line_of(last["layers"]), path + ".stages[" + std::to_string(stages.size() - 1) + "].layers",
                       range_text(next, layers_ - 1) + " covered by no stage: the last stage ends at " +
                           std::to_string(next - 1) + ", but " + network_.name + " has " + std::to_string(layers_) +
                           " layers (0-" + std::to_string(layers_ - 1) + ")");
    }
    return vw;
  }

  std::vector<int> read_devices(const yu::MapReader& s, const std::string& stage_path) {
    const YAML::Node list = s.required("devices");
    const std::string field = s.field("devices");
    std::vector<YAML::Node> items;
    if (list.IsScalar()) {
      items.push_back(list);  // one device, written without brackets
    } else if (list.IsSequence()) {
      for (const YAML::Node& item : list) items.push_back(item);
    }
    if (items.empty()) {
      s.fail("devices", std::string("expected a list of device names (as `hetflow describe` prints them), found ") +
                            (list.IsSequence() ? "an empty list" : "a mapping"));
    }
    std::vector<int> ids;
    for (size_t j = 0; j < items.size(); ++j) {
      const std::string item_field = list.IsScalar() ? field : field + "[" + std::to_string(j) + "]";
      const std::string name = yu::scalar(items[j], file_, item_field);
      const int line = yu::line_of(items[j]);
      const auto it = ids_.find(name);
      if (it == ids_.end()) {
        std::string hint;
        for (const std::string& n : model::nearest_names(name, names_)) hint += (hint.empty() ? "" : ", ") + n;
        throw InputError(file_, line, item_field, "unknown device '" + name + "'; nearest known: " + hint);
      }
      const auto [seen, fresh] = used_.emplace(it->second, stage_path + " (line " + std::to_string(line) + ")");
      if (!fresh) throw InputError(file_, line, item_field, "device " + name + " is used twice: also in " + seen->second);
      ids.push_back(it->second);
    }
    check_tensor(static_cast<int>(ids.size()), s, stage_path);
    return ids;
  }

  // A later chunk of a rank (virtual stages) lists that rank's devices again, in order.
  void check_again(const yu::MapReader& s, const std::vector<int>& rank, const std::string& first) const {
    const YAML::Node list = s.required("devices");
    std::vector<std::string> names;
    if (list.IsScalar()) names.push_back(yu::scalar(list, file_, s.field("devices")));
    if (list.IsSequence()) {
      for (size_t j = 0; j < list.size(); ++j) names.push_back(yu::scalar(list[j], file_, s.field("devices")));
    }
    std::vector<std::string> expected;
    for (const int d : rank) expected.push_back(names_[static_cast<size_t>(d)]);
    if (names != expected) {
      std::string text;
      for (const std::string& n : expected) text += (text.empty() ? "" : ", ") + n;
      s.fail("devices", "expected the devices of " + first + " again ([" + text + "]): with `virtual_stages` " +
                            std::to_string(virtual_stages_) + ", chunk k runs on the rank of chunk k % the ranks");
    }
  }

  // Each stage's tensor-parallel degree (its device count) divides the heads; under sequence
  // parallelism every stage has the first stage's degree.
  void check_tensor(int t, const yu::MapReader& s, const std::string& stage_path) {
    const int line = yu::line_of(s.get("devices"));
    for (const model::Layer& l : network_.layers) {
      if (l.tp_splittable && l.tp_units > 0 && l.tp_units % t != 0) {
        throw InputError(file_, line, s.field("devices"),
                         std::to_string(t) + " devices per stage (tensor parallel) must divide the " +
                             std::to_string(l.tp_units) + " attention heads (or KV groups) of " + l.name);
      }
    }
    if (tensor_ == 0) {
      tensor_ = t;
      first_stage_ = stage_path;
    } else if (t != tensor_ && sequence_parallel_) {
      throw InputError(file_, line, s.field("devices"),
                       std::to_string(t) + " device" + (t == 1 ? "" : "s") + ", but " + first_stage_ + " has " +
                           std::to_string(tensor_) +
                           ": sequence parallelism (`sequence_parallel`) needs the same tensor-parallel degree in every "
                           "stage, since sequence shards would differ between neighbouring stages");
    }
  }

  // A layer with parameters that is not tensor parallel is replicated on every device of its
  // stage; its data-parallel all-reduce (and the tied-embedding one, for a copy of layer 0's
  // parameters) needs the same degree wherever it is held.
  void check_replicated(const yu::MapReader& s, const std::string& stage_path, size_t w, int begin, int end, int t) {
    if (!data_parallel_) return;
    const int line = yu::line_of(s.get("devices"));
    for (int l = begin; l < end; ++l) {
      const model::Layer& layer = network_.layers[static_cast<size_t>(l)];
      if (layer.tp_splittable || layer.params + layer.tied_params <= 0) continue;
      const auto refuse = [&](const std::string& other, int degree, const std::string& why) {
        throw InputError(file_, line, s.field("devices"),
                         std::to_string(t) + " device" + (t == 1 ? "" : "s") + ", but " + other + " has " +
                             std::to_string(degree) + ": " + layer.name +
                             " is not tensor parallel (every device of a stage holds all of it), so " + why +
                             " needs the same number of devices in both stages");
      };
      auto& [degree, where] = replicated_[static_cast<size_t>(l)];
      if (degree > 0 && degree != t) refuse(where, degree, "its data-parallel all-reduce");
      if (degree == 0) std::tie(degree, where) = std::pair{t, stage_path};
      if (layer.tied_params > 0 && begin > 0 && t != first_degree_) {
        refuse("workers[" + std::to_string(w) + "].stages[0]", first_degree_, "the all-reduce of its copy of layer 0");
      }
    }
    if (begin == 0) first_degree_ = t;
  }

  // Reads "FIRST-LAST" and checks that it continues the coverage at layer `next`.
  std::pair<int, int> read_layers(const yu::MapReader& s, int next) const {
    const std::string text = yu::scalar(s.required("layers"), file_, s.field("layers"));
    int first = 0, last = 0;
    if (!parse_range(text, first, last) || first < 0 || first > last) {
      s.fail("layers", "expected a layer range FIRST-LAST (inclusive, FIRST <= LAST) or one layer N, found '" + text + "'");
    }
    if (last >= layers_) {
      s.fail("layers", "layer " + std::to_string(last) + " is out of range: " + network_.name + " has " +
                           std::to_string(layers_) + " layers, 0-" + std::to_string(layers_ - 1));
    }
    if (first > next) {
      s.fail("layers", range_text(next, first - 1) + " covered by no stage: this stage starts at " + std::to_string(first) +
                           (next == 0 ? ", the first must start at 0" : ", the one before ends at " + std::to_string(next - 1)));
    }
    if (first < next) {
      s.fail("layers", "overlaps the stage before: it starts at " + std::to_string(first) + ", but layers up to " +
                           std::to_string(next - 1) + " are already covered");
    }
    return {first, last};
  }

  static std::string range_text(int first, int last) {
    return first == last ? "layer " + std::to_string(first) + " is"
                         : "layers " + std::to_string(first) + "-" + std::to_string(last) + " are";
  }

  const std::string& file_;
  const model::Network& network_;
  int layers_;
  std::vector<std::string> names_;
  std::map<std::string, int> ids_;
  std::map<int, std::string> used_;  // device -> where it was first used
  int tensor_ = 0;                   // devices of the first stage
  std::string first_stage_;
  bool sequence_parallel_;
  int virtual_stages_;
  bool data_parallel_;
  std::vector<std::pair<int, std::string>> replicated_;  // per layer: degree and stage it was first held at
  int first_degree_ = 0;                                 // this worker's first stage's devices
};

}  // namespace

Layout read_layout_file(const std::string& text, const std::string& file, const model::Cluster& cluster,
                        const model::Network& network, Layout base) {
  base.workers.clear();
  FileReader(file, cluster, network, base).read(model::yaml_util::load(text, file), base);
  return base;
}

namespace {

// Reads the `options:` mapping's keys, each into its PlanOptions member.
void read_options(const yu::MapReader& m, PlanOptions& o, const std::function<bool(std::string_view)>& keep) {
  const auto set = [&](const char* key, const char* member, auto read) {
    if (m.has(key) && !keep(member)) read();
  };
  const auto parsed = [&](const char* key, auto parse) {
    const std::string text = yu::scalar(m.get(key), m.file(), m.field(key));
    try {
      return parse(text);
    } catch (const std::invalid_argument& e) {
      m.fail(key, e.what());
    }
  };
  set("micro_batch", "micro_batch", [&] { o.micro_batch = m.positive_int("micro_batch"); });
  set("schedule", "schedule", [&] { o.schedule = m.string("schedule"); });
  set("virtual_stages", "virtual_stages", [&] { o.virtual_stages = m.positive_int("virtual_stages"); });
  set("recompute", "recompute", [&] { o.recompute = parsed("recompute", parse_recompute); });
  set("sequence_parallel", "sequence_parallel", [&] { o.sequence_parallel = m.boolean_or("sequence_parallel", false); });
  set("fp32_grad_accumulation", "fp32_grad_accumulation",
      [&] { o.fp32_grad_accumulation = m.boolean_or("fp32_grad_accumulation", false); });
  set("workspace", "workspace_bytes", [&] { o.workspace_bytes = m.quantity("workspace", model::units::parse_bytes, {}, true); });
  set("sync", "sync", [&] { o.sync = parsed("sync", parse_sync); });
  set("staleness", "staleness", [&] { o.staleness = m.int_or("staleness", 0, 0); });
  set("allreduce", "allreduce", [&] { o.allreduce = parsed("allreduce", parse_collective_algorithm); });
  set("bucket_size", "bucket_bytes", [&] { o.bucket_bytes = m.quantity("bucket_size", model::units::parse_bytes); });
  set("overlap_grad_reduce", "overlap_grad_reduce",
      [&] { o.overlap_grad_reduce = m.boolean_or("overlap_grad_reduce", false); });
  set("zero_stage", "zero_stage", [&] { o.zero_stage = m.int_or("zero_stage", 0, 0, 3); });
  set("reshard_after_forward", "reshard_after_forward",
      [&] { o.reshard_after_forward = m.boolean_or("reshard_after_forward", true); });
  set("zero_shares", "zero_shares", [&] { o.zero_shares = parsed("zero_shares", parse_zero_shares); });
  set("offload_optimizer", "offload_optimizer", [&] { o.offload_optimizer = m.boolean_or("offload_optimizer", false); });
  set("offload_activations", "offload_activations",
      [&] { o.offload_activations = m.boolean_or("offload_activations", false); });
  set("context_parallel", "context", [&] { o.context = m.positive_int("context_parallel"); });
  set("context_comm", "context_comm", [&] { o.context_comm = parsed("context_comm", parse_context_comm); });
  set("expert_parallel", "expert_parallel", [&] { o.experts.parallel = m.positive_int("expert_parallel"); });
  set("routing", "routing", [&] { o.experts.routing = parse_routing(m.string("routing"), m.file(), m.field("routing")); });
  set("expert_dispatch", "expert_dispatch", [&] { o.experts.dispatch = parsed("expert_dispatch", parse_collective_algorithm); });
  set("expert_placement", "expert_placement", [&] {
    const std::string text = m.string("expert_placement");
    o.experts_by_speed = text == "speed";
    o.experts.placement.clear();
    if (text == "speed" || text == "contiguous") return;
    std::string_view rest = text;
    while (true) {  // "0,0,1,1": the rank of each expert
      const size_t comma = rest.find(',');
      const std::string item(rest.substr(0, comma));
      size_t used = 0;
      int rank = -1;
      try {
        rank = std::stoi(item, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used == 0 || used != item.size() || rank < 0) {
        m.fail("expert_placement", "expected contiguous, speed or expert ranks separated by commas, found '" + text + "'");
      }
      o.experts.placement.push_back(rank);
      if (comma == std::string_view::npos) break;
      rest = rest.substr(comma + 1);
    }
  });
  KernelOptions& k = o.kernels;
  set("flash_attention", "kernels", [&] { k.flash_attention = m.boolean_or("flash_attention", false); });
  set("fused_softmax", "kernels", [&] { k.fused_softmax = m.boolean_or("fused_softmax", true); });
  set("fused_bias_gelu", "kernels", [&] { k.fused_bias_gelu = m.boolean_or("fused_bias_gelu", true); });
  set("fused_bias_dropout_add", "kernels", [&] { k.fused_bias_dropout_add = m.boolean_or("fused_bias_dropout_add", true); });
  set("fused_adam", "kernels", [&] { k.fused_adam = m.boolean_or("fused_adam", true); });
  for (const char* key : {"micro_batch", "schedule", "virtual_stages", "recompute", "sequence_parallel",
                          "fp32_grad_accumulation", "workspace", "sync", "staleness", "allreduce", "bucket_size",
                          "overlap_grad_reduce", "zero_stage", "reshard_after_forward", "zero_shares", "offload_optimizer",
                          "offload_activations", "context_parallel", "context_comm", "expert_parallel", "routing", "expert_dispatch", "expert_placement",
                          "flash_attention",
                          "fused_softmax", "fused_bias_gelu", "fused_bias_dropout_add", "fused_adam"}) {
    m.get(key);  // known, whether kept or not
  }
  m.finish();
}

std::string flag(bool on) { return on ? "true" : "false"; }

}  // namespace

void apply_layout_file_options(const std::string& text, const std::string& file, PlanOptions& options,
                               const std::function<bool(std::string_view member)>& keep) {
  const YAML::Node root = model::yaml_util::load(text, file);
  if (!root.IsMap() || !root["options"]) return;
  read_options(yu::MapReader(root["options"], file, "options"), options, keep);
}

std::string write_layout_file(const Layout& layout, const model::Cluster& cluster) {
  const auto& devices = cluster.devices();
  namespace u = model::units;
  const Sync& sync = layout.sync;
  const KernelOptions& k = layout.kernels;
  std::string out = "options:\n  micro_batch: " + std::to_string(layout.micro_batch_size) +
                    "\n  schedule: " + layout.schedule + "\n  virtual_stages: " + std::to_string(layout.virtual_stages) +
                    "\n  recompute: " + std::string(to_string(layout.recompute)) +
                    "\n  sequence_parallel: " + flag(layout.sequence_parallel) +
                    "\n  fp32_grad_accumulation: " + flag(layout.fp32_grad_accumulation) +
                    "\n  workspace: " + u::format_bytes(layout.workspace_bytes) +
                    "\n  sync: " + std::string(to_string(sync.kind)) + "\n  staleness: " + std::to_string(sync.staleness) +
                    "\n  allreduce: " + std::string(to_string(sync.algorithm)) +
                    "\n  bucket_size: " + u::format_bytes(sync.bucket_bytes) +
                    "\n  overlap_grad_reduce: " + flag(sync.overlap_grad_reduce) +
                    "\n  flash_attention: " + flag(k.flash_attention) + "\n  fused_softmax: " + flag(k.fused_softmax) +
                    "\n  fused_bias_gelu: " + flag(k.fused_bias_gelu) +
                    "\n  fused_bias_dropout_add: " + flag(k.fused_bias_dropout_add) +
                    "\n  fused_adam: " + flag(k.fused_adam) + "\n";
  if (sync.zero.stage > 0) {  // only when sharded: other layouts keep their text
    out += "  zero_stage: " + std::to_string(sync.zero.stage) +
           "\n  reshard_after_forward: " + flag(sync.zero.reshard_after_forward) + "\n";
    if (sync.zero.shares != ZeroShares::equal) out += "  zero_shares: " + std::string(to_string(sync.zero.shares)) + "\n";
  }
  if (layout.offload.optimizer) out += "  offload_optimizer: true\n";  // likewise
  if (layout.offload.activations) out += "  offload_activations: true\n";
  // Context groups: consecutive workers, as written below.
  if (layout.size(Axis::context) > 1) out += "  context_parallel: " + std::to_string(layout.size(Axis::context)) + "\n";
  if (layout.context_comm != ContextComm::all_gather) out += "  context_comm: " + std::string(to_string(layout.context_comm)) + "\n";
  if (layout.experts != Experts{}) {  // expert groups: consecutive replicas, likewise
    out += "  expert_parallel: " + std::to_string(layout.experts.parallel) + "\n  routing: \"" +
           to_string(layout.experts.routing) + "\"\n  expert_dispatch: " + std::string(to_string(layout.experts.dispatch)) + "\n";
    if (!layout.experts.placement.empty()) {
      std::string ranks;
      for (const int r : layout.experts.placement) ranks += (ranks.empty() ? "" : ",") + std::to_string(r);
      out += "  expert_placement: \"" + ranks + "\"\n";
    }
  }
  out += "workers:\n";
  for (const VirtualWorker& vw : layout.workers) {
    out += "  - microbatches: " + std::to_string(vw.microbatches) + "\n    stages:\n";
    for (const Stage& s : vw.stages) {
      out += "      - {devices: [";
      const auto& rank = vw.ranks[static_cast<size_t>(s.rank)];  // again for each of its chunks
      for (size_t i = 0; i < rank.size(); ++i) {
        out += (i > 0 ? ", " : "") + devices[static_cast<size_t>(rank[i])].name;
      }
      out += "], layers: " + std::to_string(s.layer_begin) + "-" + std::to_string(s.layer_end - 1) + "}\n";
    }
  }
  return out;
}

}  // namespace hetflow::partition
