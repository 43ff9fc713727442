// The tensor axis: a rank's device group, each device holding a 1/t shard of every
// tensor-parallel layer (Megatron's column and row splits, partition/shard.hpp). Its group
// exchanges inside each pass: the calls tp_calls.hpp lists (Megatron's f and g all-reduces,
// or sequence parallelism's all-gathers and reduce-scatters) as in-task collectives.
#include "partition/axis_registry.hpp"

namespace hetflow::partition {

AxisRules tensor_axis() {
  AxisRules rules;
  rules.axis = Axis::tensor;
  rules.role = CommRole::tensor;
  rules.scope = AxisScope::in_rank;
  rules.pass_calls = pass_tp_calls;
  rules.step_elems = summed_gain_elems;
  rules.group_prefix = "tp";
  // All-reduces are tensor parallelism's own; gathers and reduce-scatters sequence parallelism's.
  rules.call_purpose = [](CollectiveKind kind) {
    return kind == CollectiveKind::all_reduce ? Purpose::tensor_parallel : Purpose::sequence_parallel;
  };
  return rules;
}

}  // namespace hetflow::partition
