// The pipeline axis: a worker's ranks, each running its chunks (contiguous layer ranges) of
// every micro-batch in its schedule's order (schedule*.cpp). Its groups are neighbouring
// ranks, which pass activations forward and their gradients back between passes
// (plan_builder_pipeline.cpp).
#include "partition/axis_registry.hpp"
#include "partition/plan_builder_detail.hpp"

namespace hetflow::partition {

AxisRules pipeline_axis() {
  AxisRules rules;
  rules.axis = Axis::pipeline;
  rules.role = CommRole::pipeline;
  rules.scope = AxisScope::across_ranks;
  rules.group_prefix = "pp";
  rules.build = [](builder::Builder& b) { b.add_pipeline_phase(); };
  return rules;
}

}  // namespace hetflow::partition
