// The expert axis: EP consecutive data-parallel replicas (an expert group, expert_shard.hpp)
// split each MoE layer's routed experts between them, Megatron-Core's expert parallelism
// with its all-to-all token dispatcher. Inside a layer's forward every member sends each of
// its tokens' top-k copies to the member holding the chosen expert (the dispatch), the
// holders run their experts on what arrives, and the results go back to the tokens' owners
// (the combine), both all-to-alls over the group, one group per position (pipeline rank,
// tensor rank, context rank). Under tensor parallelism each device dispatches its sequence-
// parallel share of the tokens, and its tensor group gathers what arrived before the experts
// (pass_tp_calls). A backward exchanges the gradients the same two ways, in
// reverse order. The routing model decides each holder's part of every member's copies
// (Collective::parts, ExpertSplit::dispatch); the combine sends back what the dispatch
// brought, and is planned with the dispatch's parts: on links alike both ways, the busiest
// link carries as much. Everything else a member does is its own tokens' (chunk_work scales
// the routed experts' FLOPs by its rank's load).
#include "partition/axis_registry.hpp"
#include "partition/expert_shard.hpp"

namespace hetflow::partition {

std::vector<PassCall> pass_expert_calls(const model::Network& net, const PassShape& pass) {
  if (pass.experts <= 1 || !net.architecture || net.architecture->moe.experts <= 0) return {};
  const model::TransformerConfig& c = *net.architecture;
  // A device's tokens' kept copies: its 1/context of the sequence (under tensor parallelism
  // its sequence-parallel 1/t of that), top-k each, hidden wide.
  const double copies = static_cast<double>(c.seq) / pass.context / pass.tensor * c.moe.experts_per_token * c.hidden *
                        pass.expert_kept;
  return place_pass_calls(net, pass, [&](const model::Layer& l, LayerPart part, std::vector<PassCall>& out) {
    if (l.experts <= 0 || l.forward_flops <= 0) return;
    const ExchangePoints x = exchange_points(c, l);
    if (part == LayerPart::forward || (part == LayerPart::rerun && pass.recompute == Recompute::full)) {
      out.push_back({CollectiveKind::all_to_all, copies, x.dispatch});
      out.push_back({CollectiveKind::all_to_all, copies, x.combine});
    } else if (part == LayerPart::backward) {
      // The backward mirrors the forward: the combine's gradient first, then the dispatch's.
      out.push_back({CollectiveKind::all_to_all, copies, 1 - x.combine});
      out.push_back({CollectiveKind::all_to_all, copies, 1 - x.dispatch});
    }
  });
}

AxisRules expert_axis() {
  AxisRules rules;
  rules.axis = Axis::expert;
  rules.role = CommRole::expert;
  rules.scope = AxisScope::in_expert_group;
  rules.pass_calls = pass_expert_calls;
  rules.group_prefix = "ep";
  rules.call_purpose = [](CollectiveKind) { return Purpose::expert_parallel; };
  return rules;
}

}  // namespace hetflow::partition
