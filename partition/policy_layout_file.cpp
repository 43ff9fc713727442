// Policy layout-file: the user's own layout (--layout FILE). The file fixes workers, devices
// and cuts; the options give the rest. Micro-batches per worker: the file's, else
// --microbatches, else --global-batch split by each worker's speed under the cost model,
// else 2 x the worker's pipeline depth.
#include <algorithm>
#include <fstream>
#include <sstream>

#include "model/error.hpp"
#include "partition/layout_file.hpp"
#include "partition/policy.hpp"

namespace hetflow::partition {

namespace {


// The options that the file replaces must be left out.
void refuse_clashes(const PlanOptions& o) {
  if (o.layout_file.empty()) throw InputError(kOptions, 0, "policy", "policy layout-file needs a layout file (`layout_file`)");
  const auto clash = [](const char* option, const std::string& why) {
    throw InputError(kOptions, 0, option, "cannot be combined with `layout_file`: " + why);
  };
  if (o.policy != "uniform" && o.policy != "layout-file") clash("policy", "the layout file is the policy");
  if (o.pipeline != 0) clash("pipeline", "the layout file gives each virtual worker's stages");
  if (o.data != 0) clash("data", "the layout file lists the virtual workers");
  if (o.tensor != 1) clash("tensor", "the devices of each stage give the tensor-parallel degree");
  if (!o.stage_layers.empty()) clash("stage_layers", "the layout file gives each stage's layers");
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw InputError(kOptions, 0, "layout_file", "cannot read '" + path + "'");
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Fills in the micro-batches of the workers the file left at 0.
void fill_microbatches(Layout& layout, const model::Network& network, const PlanOptions& o, const CostModel& cost) {
  if (o.global_batch > 0 && o.microbatches > 0) {
    throw InputError(kOptions, 0, "microbatches", "give either `global_batch` or `microbatches`, not both");
  }
  std::vector<size_t> open;
  int given_samples = 0;
  for (size_t w = 0; w < layout.workers.size(); ++w) {
    if (layout.workers[w].microbatches == 0) {
      open.push_back(w);
    } else {
      given_samples += layout.workers[w].microbatches * layout.micro_batch_size;
    }
  }
  given_samples /= std::max(1, layout.size(Axis::context));  // a context group's workers train the same samples
  if (o.global_batch > 0) {
    if (!open.empty() && layout.size(Axis::context) > 1) {
      throw InputError(kOptions, 0, "global_batch",
                       "splits the batch between workers by their speed, which a context group's workers cannot "
                       "differ in: give every worker's `microbatches` in the layout file under `context_parallel`");
    }
    const int left = o.global_batch - given_samples;
    if (open.empty() && left != 0) {
      throw InputError(kOptions, 0, "global_batch",
                       "the layout file's micro-batches x `micro_batch` make " + std::to_string(given_samples) +
                           " samples per iteration, found " + std::to_string(o.global_batch));
    }
    if (!open.empty() &&
        (left < layout.micro_batch_size * static_cast<int>(open.size()) || left % layout.micro_batch_size != 0)) {
      const std::string given = given_samples > 0 ? "the layout file's " + std::to_string(given_samples) + " samples plus " : "";
      throw InputError(kOptions, 0, "global_batch",
                       "expected " + given + "a multiple of `micro_batch` " + std::to_string(layout.micro_batch_size) +
                           " with at least one micro-batch for each of the " + std::to_string(open.size()) +
                           " virtual workers" + (given_samples > 0 ? " without `microbatches`" : "") + ", found " +
                           std::to_string(o.global_batch));
    }
    if (open.empty()) return;
    std::vector<double> bottlenecks;
    for (size_t w : open) {
      const VirtualWorker& vw = layout.workers[w];
      bottlenecks.push_back(policy_detail::measure_stages(network, layout, vw.ranks, vw.stages, 1, cost).bottleneck_s);
    }
    const std::vector<int> split = policy_detail::split_microbatches(left / layout.micro_batch_size, bottlenecks);
    for (size_t i = 0; i < open.size(); ++i) layout.workers[open[i]].microbatches = split[i];
    return;
  }
  for (size_t w : open) {
    VirtualWorker& vw = layout.workers[w];
    vw.microbatches = o.microbatches > 0 ? o.microbatches : 2 * static_cast<int>(vw.ranks.size());
  }
}

}  // namespace

Layout make_layout_file_layout(const model::Cluster& cluster, const model::Network& network, const PlanOptions& o,
                               const CostModel& cost) {
  refuse_clashes(o);
  PlanOptions common = o;
  common.sequence_parallel = false;  // checked below, once the file gives the tensor degree
  Layout base = policy_detail::base_layout(common, "layout-file", SyncKind::allreduce);
  base.sequence_parallel = o.sequence_parallel;  // the file's stages must then share one degree
  Layout layout = read_layout_file(read_text(o.layout_file), o.layout_file, cluster, network, base);
  if (o.sequence_parallel && layout.size(Axis::tensor) == 1) {
    throw InputError(kOptions, 0, "sequence_parallel", "needs stages of 2 or more devices in the layout file");
  }
  fill_microbatches(layout, network, o, cost);
  policy_detail::place_layer_servers(layout, cluster, network, policy_detail::ServerPlacement::used_nodes);
  return layout;
}

}  // namespace hetflow::partition
