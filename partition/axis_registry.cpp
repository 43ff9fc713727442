#include "partition/axis_registry.hpp"

#include <array>

namespace hetflow::partition {

std::span<const AxisRules> axis_table() {
  // One line per axis, in kAxes's order.
  static const std::array<AxisRules, kAxisCount> table{
      data_axis(),
      pipeline_axis(),
      tensor_axis(),
      context_axis(),
      expert_axis(),
  };
  return table;
}

const AxisRules& axis_rules(Axis a) { return axis_table()[static_cast<size_t>(a)]; }

}  // namespace hetflow::partition
