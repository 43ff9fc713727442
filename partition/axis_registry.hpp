#pragma once
// What each parallel axis adds to a plan: one file per axis (axis_data.cpp, axis_pipeline.cpp,
// axis_tensor.cpp, axis_context.cpp, axis_expert.cpp) and one line per axis in axis_registry.cpp's table,
// as schedules are registered. The plan builder walks the table by scope (the collectives
// inside each pass, then the transfers between ranks, then the synchronisation between
// workers) and the layout estimate takes the in-pass collectives from it too: neither names
// an axis. A new axis is its enumerator in axis.hpp, its file and its line.
#include <span>
#include <string_view>
#include <vector>

#include "model/network.hpp"
#include "partition/axis.hpp"
#include "partition/plan.hpp"
#include "partition/tp_calls.hpp"

namespace hetflow::partition {

namespace builder {
class Builder;
}

// Where an axis's groups lie, which decides when its communication happens.
enum class AxisScope {
  in_rank,         // inside a pipeline rank's device group: collectives inside each pass's compute
  across_ranks,    // between a worker's pipeline ranks: transfers between passes
  across_workers,  // between virtual workers: synchronisation once the passes are done
  // Between the virtual workers of a context group, one group per device position (rank and
  // tensor rank): collectives inside each pass's compute, as in_rank's.
  in_context_group,
  // Between the virtual workers of an expert group, one group per device position (rank,
  // tensor rank and context rank): collectives inside each pass's compute, likewise.
  in_expert_group,
};

struct AxisRules {
  Axis axis = Axis::data;
  CommRole role = CommRole::data;  // the role of the communicators its groups form
  AxisScope scope = AxisScope::across_workers;
  // In-pass axes (in_rank, in_context_group, in_expert_group): the collectives one pass performs on its
  // group, in order, each at its point of the pass's work (the plan's in-task collectives;
  // the estimate times them too).
  std::vector<PassCall> (*pass_calls)(const model::Network& net, const PassShape& pass) = nullptr;
  // The purpose a pass call of `kind` serves on this axis.
  Purpose (*call_purpose)(CollectiveKind kind) = nullptr;
  // In-rank axes: the elements its group all-reduces once a step, at the end of a chunk's
  // last backward (the gains every member holds whole); may be null.
  double (*step_elems)(const model::Network& net, int layer_begin, int layer_end, int degree, bool sequence_parallel) = nullptr;
  std::string_view group_prefix;  // its groups' communicator names start with this
  // Across ranks or workers: the builder phase that adds the axis's tasks to the plan.
  void (*build)(builder::Builder& b) = nullptr;
};

// Every axis, in kAxes's order.
std::span<const AxisRules> axis_table();
const AxisRules& axis_rules(Axis a);

// Each axis's rules, defined in its own file.
AxisRules data_axis();
AxisRules pipeline_axis();
AxisRules tensor_axis();
AxisRules context_axis();
AxisRules expert_axis();

}  // namespace hetflow::partition
