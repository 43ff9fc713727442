// The data axis: virtual workers, each a replica of the model that trains on its own share of
// the batch. Its groups are a layer range's shards across the workers (partition/shard.hpp),
// synchronised once the passes are done: the bucketed gradient all-reduce, or the parameter
// servers' pushes and pulls (ps, wsp) (plan_builder_sync.cpp).
#include "partition/axis_registry.hpp"
#include "partition/plan_builder_detail.hpp"

namespace hetflow::partition {

AxisRules data_axis() {
  AxisRules rules;
  rules.axis = Axis::data;
  rules.role = CommRole::data;
  rules.scope = AxisScope::across_workers;
  rules.group_prefix = "dp";
  rules.build = [](builder::Builder& b) { b.add_data_parallel_sync(); };
  return rules;
}

}  // namespace hetflow::partition
