// Validation's layer of coverage (partition/validate.hpp runs it with the program's other
// layers): each virtual worker's chunks hold every layer once, in order, each computed once
// per tensor-parallel rank; and a tied embedding's two copies sit where a collective sums them.
#include <algorithm>
#include <string>
#include <vector>

#include "partition/plan.hpp"

namespace hetflow::partition::validate_detail {

namespace {
using Problems = std::vector<std::string>;
bool in_range(int id, size_t size) { return id >= 0 && static_cast<size_t>(id) < size; }
}  // namespace

// Each virtual worker's chunks cover the layers in order, and so do the forward tasks of
// its first micro-batch, once per tensor-parallel rank of the chunk that holds the layer.
void check_coverage(const Plan& plan, Problems& problems) {
  const int layers = static_cast<int>(plan.network.layers.size());
  for (size_t w = 0; w < plan.layout.workers.size(); ++w) {
    if (w >= plan.layout.task_workers()) break;  // a folded plan's replicas have no tasks of their own
    const VirtualWorker& vw = plan.layout.workers[w];
    const std::string where = "virtual worker " + std::to_string(w);
    int next = 0;
    std::vector<int> copies(static_cast<size_t>(layers), 0);
    for (const Stage& s : vw.stages) {
      if (in_range(s.rank, vw.ranks.size())) {
        for (int l = std::max(s.layer_begin, 0); l < std::min(s.layer_end, layers); ++l) {
          copies[static_cast<size_t>(l)] = static_cast<int>(vw.ranks[static_cast<size_t>(s.rank)].size());
        }
      }
      if (s.layer_begin != next) {
        problems.push_back(where + ": its chunks do not cover the layers in order (chunk [" + std::to_string(s.layer_begin) +
                           ", " + std::to_string(s.layer_end) + ") after layer " + std::to_string(next) + ")");
        break;
      }
      next = s.layer_end;
    }
    if (next != layers) problems.push_back(where + ": its chunks end at layer " + std::to_string(next) + " of " + std::to_string(layers));
    std::vector<int> count(static_cast<size_t>(layers), 0);
    for (const Task& t : plan.tasks) {
      if (t.kind != TaskKind::forward || t.worker != static_cast<int>(w) || t.microbatch != 0) continue;
      for (int l = t.layer_begin; l < t.layer_end; ++l) ++count[static_cast<size_t>(l)];
    }
    for (int l = 0; l < layers; ++l) {
      if (count[static_cast<size_t>(l)] != copies[static_cast<size_t>(l)]) {
        problems.push_back(where + ": layer " + std::to_string(l) + " is computed " +
                           std::to_string(count[static_cast<size_t>(l)]) + " times per micro-batch (expected " +
                           std::to_string(copies[static_cast<size_t>(l)]) + ", once per tensor-parallel rank)");
        break;
      }
    }
  }
}

// A tied embedding's two copies (the first chunk's table, a later chunk's head or multi-token
// prediction module) are summed by the plan's embedding all-reduce between their devices; a
// worker whose later copy shares a device with its first chunk would train two copies that
// nothing adds (plan_builder_sync.cpp makes no collective of one device). Parameter servers
// add both copies' pushes themselves.
void check_tied_ends(const Plan& plan, Problems& problems) {
  if (plan.layout.sync.kind != SyncKind::allreduce) return;
  const int layers = static_cast<int>(plan.network.layers.size());
  for (size_t w = 0; w < plan.layout.workers.size() && w < plan.layout.task_workers(); ++w) {
    const VirtualWorker& vw = plan.layout.workers[w];
    if (vw.stages.empty() || !in_range(vw.stages[0].rank, vw.ranks.size())) continue;
    const std::vector<int>& first = vw.ranks[static_cast<size_t>(vw.stages[0].rank)];
    for (size_t k = 1; k < vw.stages.size(); ++k) {
      const Stage& s = vw.stages[k];
      if (!in_range(s.rank, vw.ranks.size())) continue;
      const model::Layer* tied = nullptr;  // the chunk's first layer holding a copy
      for (int l = std::max(s.layer_begin, 0); l < std::min(s.layer_end, layers) && tied == nullptr; ++l) {
        if (plan.network.layers[static_cast<size_t>(l)].tied_params > 0) tied = &plan.network.layers[static_cast<size_t>(l)];
      }
      if (tied == nullptr) continue;
      const std::string what =
          tied->kind == "mtp" ? "the multi-token prediction module " + tied->name + " (its copy of the table)" : "the head";
      for (const int d : vw.ranks[static_cast<size_t>(s.rank)]) {
        if (std::find(first.begin(), first.end(), d) == first.end()) continue;
        problems.push_back("virtual worker " + std::to_string(w) + ": its chunk " + std::to_string(k) +
                           " holds " + what + " tied to the embedding of its first chunk on the same device " +
                           std::to_string(d) + ", where no collective sums the two copies; put it in the "
                           "first chunk or on another device (--virtual-stages needs 2 or more pipeline ranks here)");
        break;
      }
    }
  }
}

}  // namespace hetflow::partition::validate_detail
